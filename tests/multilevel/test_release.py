"""release_hierarchies: a dropped hierarchy's reference cycles freed at once (what the adaptive
loops call between steps), only for hierarchies of RELEASE_DOFS DoFs or more."""
import gc
import weakref

import numpy as np
import pytest

import adaptmg.multilevel.release as release
from adaptmg import Mesh, Space, assemble, multigrid


def _space():
    mesh = Mesh.box([0, 0], [1, 1], [4, 4]).refine().refine()
    return Space(mesh.refine(mesh.points[mesh.cells].mean(1)[:, 0] < 0.3), 1)


def test_a_dropped_distributed_hierarchy_is_freed_by_release(monkeypatch):
    """The distributed solve's hierarchy (one rank, the local set-up) holds reference cycles:
    dropped, it stays until a collection -- release_hierarchies is that collection."""
    pytest.importorskip("mpi4py")
    from adaptmg.distributed import solve
    space = _space()
    gc.disable()
    try:
        res = solve(space, assemble.stiffness, assemble.load(space, 1.0), rtol=1e-8, local_setup=True)
        ref = weakref.ref(res.ml)
        del res
        assert ref() is not None, "no reference cycle left: release_hierarchies may no longer be needed"
        monkeypatch.setattr(release, "RELEASE_DOFS", space.num_dofs)
        assert release.release_hierarchies(space.num_dofs)
        assert ref() is None
    finally:
        gc.enable()


def test_the_serial_hierarchy_needs_no_collection():
    space = _space()
    gc.disable()
    try:
        ml = multigrid(space, assemble.stiffness)
        ml.solve(assemble.load(space, 1.0), rtol=1e-8)
        ref = weakref.ref(ml)
        del ml
        assert ref() is None
    finally:
        gc.enable()


def test_small_hierarchies_are_left_to_the_collector():
    assert release.RELEASE_DOFS == 1 << 20
    assert not release.release_hierarchies(release.RELEASE_DOFS - 1)
    assert not release.release_hierarchies(np.int64(10))
