"""adaptmg.threads: the order-keeping parallel map of the host assembly, and that assembly
with worker threads equals assembly without them."""
import threading
import time

import numpy as np
import pytest

from adaptmg import Mesh, Space, assemble
from adaptmg.threads import ordered_map


def test_ordered_map_keeps_items_and_order():
    def slow_square(i):
        time.sleep(0.001 * (i % 3))          # later items may finish first
        return i * i
    assert list(ordered_map(slow_square, range(200), workers=3)) == [i * i for i in range(200)]
    assert list(ordered_map(slow_square, [], workers=2)) == []
    with pytest.raises(ValueError, match="workers"):
        ordered_map(slow_square, range(3), workers=0)


def test_ordered_map_raises_at_the_failing_item():
    def f(i):
        if i == 5:
            raise KeyError("item 5 failed")
        return i
    seen = []
    with pytest.raises(KeyError, match="item 5 failed"):
        for v in ordered_map(f, range(100), workers=2):
            seen.append(v)
    assert seen == [0, 1, 2, 3, 4]


def test_ordered_map_early_close_stops_the_workers():
    started = []

    def f(i):
        started.append(i)
        return i
    before = threading.active_count()
    it = ordered_map(f, range(10 ** 6), workers=2, ahead=3)
    assert next(it) == 0
    it.close()
    assert threading.active_count() == before
    assert len(started) <= 5           # at most `ahead` + 1 items were ever submitted


def _twisted_mesh():
    """64x64 cells, most of them distorted (the general, non-affine geometry path)."""
    m = Mesh.box([0.0, 0.0], [1.0, 1.0], [64, 64],
                 map=lambda X: X + 0.02 * np.sin(7 * X[:, ::-1]))
    return m


@pytest.mark.parametrize("degree", [1, 2])
def test_assembly_with_and_without_worker_threads_is_identical(monkeypatch, degree):
    """The worker threads only compute the chunks' geometry: the assembled matrices are the
    same arrays, bit for bit, as with ADAPTMG_THREADS=1 (affine and distorted meshes)."""
    import adaptmg.assemble.forms as F
    monkeypatch.setattr(F, "_CHUNK_BYTES", 1 << 14)       # many chunks on a small mesh
    monkeypatch.setattr(F, "PREFETCH_MAX_NLOC", 27)
    for mesh in (Mesh.box([0.0, 0.0], [1.0, 1.0], [64, 64]), _twisted_mesh()):
        sp = Space(mesh, degree)
        monkeypatch.setenv("ADAPTMG_THREADS", "1")
        ref = [assemble.stiffness(sp), assemble.mass(sp),
               assemble.scalar_form(sp, mass=1.0, diffusion=0.1, convection=np.array([0.3, -1.0]))]
        for threads in ("2",):
            monkeypatch.setenv("ADAPTMG_THREADS", threads)
            got = [assemble.stiffness(sp), assemble.mass(sp),
                   assemble.scalar_form(sp, mass=1.0, diffusion=0.1, convection=np.array([0.3, -1.0]))]
            for a, b in zip(ref, got):
                assert np.array_equal(a.indptr, b.indptr) and np.array_equal(a.indices, b.indices)
                assert np.array_equal(a.data, b.data)


def test_inverted_cells_still_reported_through_prefetch(monkeypatch):
    import adaptmg.assemble.forms as F
    monkeypatch.setattr(F, "_CHUNK_BYTES", 1 << 14)
    monkeypatch.setenv("ADAPTMG_THREADS", "4")
    m = Mesh.box([0.0, 0.0], [1.0, 1.0], [64, 64])
    # mirror the strip x > 0.9 (Mesh.map would refuse it: built from the forest directly)
    P = m._forest.X
    P = np.where(P[:, :1] > 0.9, P * [[-1.0, 1.0]] + [[1.9, 0.0]], P)
    bad = Mesh(m._forest.with_points(P), m.cell_ids)
    with pytest.raises(ValueError, match="(?i)jacobian"):
        assemble.stiffness(Space(bad, 1))
