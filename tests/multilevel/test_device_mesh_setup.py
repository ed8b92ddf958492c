"""Mesh -> solution with the mesh on the device: ``multigrid(Space(Mesh.box(..., backend="gpu")
...), backend="gpu")`` builds the same levels as the host mesh's GPU set-up and reads back
O(levels) bytes (issue 36, item 1: the set-up's consumers of a device mesh).

For each case the mesh is built twice -- on the host and on the device, the same refinements
(the local marks from the cell centres, exact dyadic means on both) -- and the two GPU set-ups
compared level by level: index arrays (A's, P's and R's patterns, H's, the free masks and
Dirichlet DoFs) exactly, values within 64 eps of each matrix's largest entry; then
``ml.constrain(assemble.load(...))`` and CG: the same iteration count, the solutions within
rtol 1e-10.  The device mesh's set-up, load and constrain read back O(levels) bytes
(:mod:`adaptmg.device.host_reads`, as in test_setup_host_reads.py).  CPU stand-in of the same
code: tests/fe/test_space_on_device_mesh.py.

    python -m pytest -m gpu -q tests/multilevel/test_device_mesh_setup.py
"""
import numpy as np
import pytest

import adaptmg
from adaptmg import Mesh, Space, assemble
from adaptmg.backend import get_backend, to_host
from adaptmg.device.host_reads import available, count_host_reads

pytestmark = pytest.mark.gpu

EPS = np.finfo(np.float64).eps
#: bytes a level may read back during the set-up, and besides (as test_setup_host_reads.py)
PER_LEVEL, BASE = 16 * 1024, 16 * 1024


def _mesh(dim, refine, radii, backend):
    """A box refined ``refine`` times, then in balls of ``radii`` around (0.3, ...) -- the marks
    computed with the mesh's own array module."""
    m = Mesh.box([0.0] * dim, [1.0] * dim, [2] * dim, backend=backend)
    for _ in range(refine):
        m = m.refine()
    xp = m.backend.xp
    for r in radii:
        c = m.points[m.cells].mean(axis=1)
        m = m.refine(xp.linalg.norm(c - 0.3, axis=1) < r)
    return m


CASES = {"uniform-3d": (3, 4, (), 1), "local-2d": (2, 6, (0.3, 0.15), 1),
         "local-3d": (3, 3, (0.35, 0.15), 1), "local-3d-c3": (3, 3, (0.35, 0.15), 3)}


def _f(x):
    return 1.0 + x[..., 0] * x[..., 1]


def _run(space, load_device):
    be = get_backend("gpu")
    ml = adaptmg.multigrid(space, assemble.stiffness, dirichlet="all", backend=be)
    c = space.components
    f = _f if c == 1 else (lambda x: be.xp.stack([_f(x)] * c, axis=-1))
    b = ml.constrain(assemble.load(space, f, device=load_device))
    x = ml.solve(b, rtol=1e-8, accel="cg")
    return ml, b, x, int(np.max(ml.last_iterations))


def _exact(a, b, what):
    a, b = to_host(a), to_host(b)
    assert a.shape == b.shape and np.array_equal(a, b), what


def _same_matrix(A, B, what, exact_pattern=True):
    """Equal patterns (``exact_pattern``) and values within 64 eps of the largest entry; else
    the difference within 64 eps and the entries above that in the same places -- for the
    constrained matrices, whose congruence sums cancel to exactly 0 on one path (an entry
    then dropped) and to ~1e-16 on the other (H200: 21 such entries of 6,460 on the 2-D
    local case's coarsest level)."""
    A, B = to_host(A).tocsr(), to_host(B).tocsr()
    A.sort_indices()
    B.sort_indices()
    assert A.shape == B.shape, what
    scale = max(np.max(np.abs(A.data)), 1e-300) if A.nnz else 1.0
    tol = 64 * EPS * scale
    if not exact_pattern:
        assert np.max(np.abs((A - B).data), initial=0.0) <= tol, what
        A, B = A.copy(), B.copy()
        A.data[np.abs(A.data) <= tol] = 0
        B.data[np.abs(B.data) <= tol] = 0
        A.eliminate_zeros()
        B.eliminate_zeros()
    _exact(A.indptr, B.indptr, f"{what}: indptr")
    _exact(A.indices, B.indices, f"{what}: indices")
    assert np.max(np.abs(A.data - B.data), initial=0.0) <= tol, what


def same_levels(ml_h, ml_d):
    """The two hierarchies' levels: A (:func:`_same_matrix` with tiny entries dropped), P, R,
    H, the free masks and Dirichlet DoFs (exact patterns / exact)."""
    assert len(ml_h.levels) == len(ml_d.levels)
    for l, (lh, ld) in enumerate(zip(ml_h.levels, ml_d.levels)):
        _same_matrix(lh.A, ld.A, f"A level {l}", exact_pattern=False)
        if lh.P is not None:
            _same_matrix(lh.P, ld.P, f"P level {l}")
            _same_matrix(lh.R, ld.R, f"R level {l}")
    for l, (ch, cd) in enumerate(zip(ml_h.constraints, ml_d.constraints)):
        _exact(ch.free, cd.free, f"free level {l}")
        _exact(ch.dirichlet, cd.dirichlet, f"dirichlet level {l}")
        _same_matrix(ch.H, cd.H, f"H level {l}")


@pytest.mark.parametrize("case", list(CASES))
def test_device_mesh_gives_the_host_mesh_levels_and_solution(case):
    dim, refine, radii, c = CASES[case]
    mh, md = _mesh(dim, refine, radii, "cpu"), _mesh(dim, refine, radii, "gpu")
    assert md.backend.is_gpu and not mh.backend.is_gpu
    _exact(mh.cells, md.cells, "cells")
    assert (mh.num_hanging_nodes > 0) == bool(radii)
    sh, sd = Space(mh, 1, c), Space(md, 1, c)
    ml_h, b_h, x_h, it_h = _run(sh, "gpu")
    ml_d, b_d, x_d, it_d = _run(sd, None)                  # load on the mesh's device by default
    assert type(b_d).__module__.startswith("cupy") and type(sd.H).__module__.startswith("cupyx")
    assert len(ml_h.levels) == len(ml_d.levels) >= 3
    same_levels(ml_h, ml_d)
    assert np.max(np.abs(to_host(b_h) - to_host(b_d))) <= 64 * EPS * np.max(np.abs(to_host(b_h)))
    assert it_h == it_d and 0 < it_d <= 30
    xh, xd = to_host(x_h), to_host(x_d)
    assert np.linalg.norm(xh - xd) <= 1e-10 * np.linalg.norm(xh)
    u = to_host(ml_d.expand(x_d))
    assert np.linalg.norm(u - to_host(ml_h.expand(x_h))) <= 1e-10 * np.linalg.norm(u)


@pytest.mark.skipif(not available(), reason="needs sys.monitoring (Python 3.12+)")
def test_device_mesh_setup_reads_back_o_levels_bytes():
    """The set-up from a device mesh (mesh arrays, Space, H, masks, P, matrices) and its load +
    constrain read back O(levels) bytes; refined once more (8x the cells), no more per level."""
    be = get_backend("gpu")
    sizes = []
    for refine in (3, 4):
        mesh = _mesh(3, refine, (0.35, 0.15), "gpu")
        space = Space(mesh, 1, 1)
        with count_host_reads() as setup:
            ml = adaptmg.multigrid(space, assemble.stiffness, dirichlet="all", backend=be)
            be.synchronize()
        with count_host_reads() as load:
            ml.constrain(assemble.load(space, _f))
            be.synchronize()
        bound = PER_LEVEL * len(ml.levels) + BASE
        assert setup.calls >= len(ml.levels), setup.report()          # the instrument saw it
        assert setup.bytes <= bound, f"{space.num_dofs} DoFs:\n{setup.report()}"
        assert load.bytes <= BASE, load.report()
        sizes.append((space.num_dofs, len(ml.levels), setup.bytes))
    (n0, l0, b0), (n1, l1, b1) = sizes
    assert n1 > 4 * n0 and 8 * n1 > 2 * (PER_LEVEL * l1 + BASE)      # a fine vector would not fit
    assert b1 <= b0 + PER_LEVEL * max(l1 - l0, 1), sizes


def test_device_mesh_with_a_host_backend_is_a_clear_error():
    md = _mesh(2, 2, (0.3,), "gpu")
    with pytest.raises(ValueError, match=r"mesh.to\('cpu'\)"):
        adaptmg.multigrid(Space(md), assemble.stiffness, backend="cpu")
    with pytest.raises(ValueError, match=r"mesh.to\('cpu'\)"):
        assemble.load(Space(md), 1.0, device="cpu")


def test_device_mesh_without_a_hierarchy_gets_algebraic_levels_there():
    """A fine box never refined: the coarsest geometric level is large, smoothed-aggregation
    levels follow, their near-nullspace built from the device mask (and points); the same
    iterations and solution as the host mesh's GPU set-up."""
    out = []
    for backend in ("cpu", "gpu"):
        space = Space(Mesh.box([0.0] * 3, [1.0] * 3, [24] * 3, backend=backend), 1, 3)
        ml, b, x, its = _run(space, "gpu")
        assert ml.num_algebraic > 0
        out.append((to_host(x), its))
    (xh, ih), (xd, idv) = out
    assert abs(ih - idv) <= 1 and 0 < idv <= 40
    assert np.linalg.norm(xh - xd) <= 1e-6 * np.linalg.norm(xh)


def test_device_mesh_galerkin_levels_equal_the_host_mesh_ones():
    """``galerkin=True``: R K P on the device from the device mesh's transfers and masks."""
    mls = [adaptmg.multigrid(Space(_mesh(3, 3, (0.35, 0.15), backend)), assemble.stiffness,
                             galerkin=True, backend="gpu", coarse_max_rows=None) for backend in ("cpu", "gpu")]
    assert len(mls[0].levels) == len(mls[1].levels) >= 3
    for l, (lh, ld) in enumerate(zip(*(ml.levels for ml in mls))):
        Ah, Ad = to_host(lh.A).tocsr(), to_host(ld.A).tocsr()
        assert Ah.shape == Ad.shape
        assert abs(Ah - Ad).max() <= 1e3 * EPS * abs(Ah).max(), f"level {l}"
