"""multigrid() on the GPU builds its levels on the device: the same levels as on the CPU.

The library's forms accept ``device``/``keep_on_device``; ``multigrid`` passes them on the
GPU, so every level's matrix is assembled (pattern and sums) and constrained on the device.
The levels must be the CPU's: matrices, transfers and smoother parameters agree to a few
ulps (the device sums the element entries in the same order as ``np.add.at``; the congruent
-cell path and the SpGEMM of the constraints may round differently).
"""
import numpy as np
import pytest

import adaptmg
from adaptmg import assemble
from adaptmg.backend import is_device_sparse, to_host
from adaptmg.multilevel.hierarchy import _on_backend


def _mesh(dim, n, local):
    m = adaptmg.Mesh.box([0.0] * dim, [1.0] * dim, [2] * dim)
    for _ in range(n):
        m = m.refine()
    for _ in range(local):
        c = m.points[m.cells].mean(axis=1)
        m = m.refine(np.linalg.norm(c - 0.3, axis=1) < 0.3)
    return m


def _rel_diff(A, B):
    A, B = to_host(A).tocsr(), to_host(B).tocsr()
    scale = abs(A).max()
    return abs(A - B).max() / scale


def test_forms_are_called_with_the_device_only_on_the_gpu():
    calls = []

    def form(space, *, device=None, keep_on_device=False):
        calls.append((device, keep_on_device))
        return assemble.stiffness(space)

    space = adaptmg.Space(_mesh(2, 3, 1), degree=1)
    adaptmg.multigrid(space, form, backend="cpu")
    assert calls and all(c == (None, False) for c in calls)
    assert _on_backend(assemble.stiffness, adaptmg.get_backend("cpu")) is assemble.stiffness
    assert _on_backend(len, adaptmg.get_backend("cpu")) is len           # no signature: as is


def test_keep_on_device_needs_a_gpu_device():
    space = adaptmg.Space(_mesh(2, 2, 0), degree=1)
    for form in (assemble.stiffness, assemble.mass):
        with pytest.raises(ValueError, match="keep_on_device=True needs a GPU device"):
            form(space, keep_on_device=True)
        with pytest.raises(ValueError, match="keep_on_device=True needs a GPU device"):
            form(space, device="cpu", keep_on_device=True)


@pytest.mark.gpu
@pytest.mark.parametrize("dim,n,local,degree", [(3, 4, 1, 1), (2, 7, 2, 1), (2, 5, 1, 2)])
def test_gpu_setup_builds_the_cpu_levels(dim, n, local, degree):
    space = adaptmg.Space(_mesh(dim, n, local), degree=degree)
    cpu = adaptmg.multigrid(space, assemble.stiffness, backend="cpu", coarse_max_rows=None)
    gpu = adaptmg.multigrid(space, assemble.stiffness, backend="gpu", coarse_max_rows=None)
    assert is_device_sparse(gpu.assembled)           # the finest level never went through the host
    assert len(cpu.levels) == len(gpu.levels)
    eps = np.finfo(np.float64).eps
    for lc, lg, d in zip(cpu.levels, gpu.levels, gpu._dev):
        assert lc.n == lg.n
        assert _rel_diff(lc.A, lg.A) <= 256 * eps       # 2-D: 2e-14 seen (sums of O(1) entries)
        if lc.P is not None:
            assert _rel_diff(lc.P, lg.P) <= 4 * eps
            assert _rel_diff(lc.R, lg.R) <= 4 * eps
            if degree == 1:                             # Q1 transfers are built on the device
                assert is_device_sparse(lg.P) and is_device_sparse(lg.R)
        # the fused cycle's products of device levels are formed on the device (SpGEMM)
        if getattr(d, "RA", None) is not None:
            assert _rel_diff(to_host(lc.R) @ to_host(lc.A), d.RA) <= 64 * eps
        if getattr(d, "S", None) is not None:
            from adaptmg.device.kernels import smooth_restrict_matrix
            sm = d.smoother
            dinv = getattr(sm, "_dinv_host", None)
            S = smooth_restrict_matrix(to_host(lg.A), to_host(lg.R),
                                       to_host(sm.dinv if dinv is None else dinv), sm.omega,
                                       gpu.presmooth)
            assert _rel_diff(S, d.S) <= 64 * eps
        if hasattr(lc.smoother, "omega"):
            assert abs(lc.smoother.omega - lg.smoother.omega) <= 1e-6 * lc.smoother.omega
    b = cpu.constrain(assemble.load(space, lambda x: 1.0 + 0 * x[..., 0]))
    bg = gpu.constrain(assemble.load(space, lambda x: 1.0 + 0 * x[..., 0]))
    assert np.max(np.abs(to_host(bg) - b)) <= 64 * eps * np.max(np.abs(b))
    xc = cpu.solve(b, rtol=1e-10, accel="cg")
    xg = to_host(gpu.solve(bg, rtol=1e-10, accel="cg"))
    assert np.max(np.abs(xc - xg)) <= 1e-8 * np.max(np.abs(xc))


def test_load_device_argument_is_checked():
    space = adaptmg.Space(_mesh(2, 2, 0), degree=1)
    with pytest.raises(TypeError, match="device must be"):
        assemble.load(space, 1.0, device=3)
    b = assemble.load(space, 1.0, device="cpu")                # the host path
    assert isinstance(b, np.ndarray) and abs(b.sum() - 1.0) < 1e-13


@pytest.mark.gpu
@pytest.mark.parametrize("dim,degree,components", [(2, 1, 1), (3, 1, 1), (2, 2, 2), (3, 2, 1)])
def test_device_load_equals_host_load(dim, degree, components):
    space = adaptmg.Space(_mesh(dim, 3, 1), degree=degree, components=components)
    nc = space.mesh.num_cells
    rng = np.random.default_rng(0)
    per_cell = rng.random((nc, components)) if components > 1 else rng.random(nc)
    const = np.arange(1.0, components + 1) if components > 1 else 2.5

    def fun(x):
        v = x[..., 0] ** 2 + 3 * x[..., -1]
        return v if components == 1 else v[..., None] * np.arange(1.0, components + 1)
    eps = np.finfo(np.float64).eps
    for f in (const, per_cell, fun):
        bh = assemble.load(space, f)
        bd = assemble.load(space, f, device="gpu")
        assert not isinstance(bd, np.ndarray)
        assert np.max(np.abs(to_host(bd) - bh)) <= 64 * eps * np.max(np.abs(bh))


@pytest.mark.gpu
def test_device_rhs_with_dirichlet_lift_equals_host():
    space = adaptmg.Space(_mesh(2, 4, 2), degree=1)
    ml = adaptmg.multigrid(space, assemble.stiffness, dirichlet="all", backend="gpu")
    cons = ml.constraints[-1]
    cons.g[cons.dirichlet] = 1.0 + np.arange(cons.dirichlet.size) % 3     # non-zero lift
    b = assemble.load(space, lambda x: 1.0 + x[..., 0])
    fh = cons.rhs(b, ml.assembled)
    fd = cons.rhs(assemble.load(space, lambda x: 1.0 + x[..., 0], device="gpu"), ml.assembled)
    eps = np.finfo(np.float64).eps
    assert np.max(np.abs(to_host(fd) - fh)) <= 256 * eps * np.max(np.abs(fh))


@pytest.mark.parametrize("degree,components", [(1, 1), (2, 2)])
def test_device_code_run_on_numpy_matches_host_assembly(degree, components):
    """The device element matrices and load vectors are xp code: run on NumPy they give the
    host results (distorted cells, hanging nodes) to a few ulps."""
    import scipy.sparse as sp
    from adaptmg.assemble import forms
    from adaptmg.assemble.on_device import element_entries_on_device, load_on_device
    from adaptmg.backend import CPU
    from adaptmg.fe.geometry import metric_factor
    m = _mesh(3 if components == 1 else 2, 2, 1)
    m = adaptmg.Mesh.from_cells(m.points + 0.02 * np.sin(7 * m.points), m.cells)
    space = adaptmg.Space(m, degree=degree, components=components)
    info = forms._SpaceInfo(space)
    xi, w = info.quadrature(None)
    phi, dphi = forms._ref_tables(info, xi)
    T = forms._stiffness_tensor(dphi)
    nq, mm, per = T.shape
    data = np.empty(info.num_cells * per)
    element_entries_on_device(CPU, info, xi, w,
                              lambda sl, g, wdet: metric_factor(g.J, g.detJ, wdet / g.detJ, packed=True),
                              np.ascontiguousarray(T.reshape(nq * mm, per)), data)
    rows = np.repeat(info.cell_dofs, info.nloc, axis=1).ravel()
    cols = np.tile(info.cell_dofs, (1, info.nloc)).ravel()
    A = sp.csr_matrix((data, (rows, cols)), shape=(info.num_nodes,) * 2)
    B = assemble.stiffness(adaptmg.Space(m, degree=degree))
    eps = np.finfo(np.float64).eps
    assert _rel_diff(A, B) <= 16 * eps
    rng = np.random.default_rng(1)
    tail = (components,) if components > 1 else ()
    for f in (np.arange(1.0, components + 1) if tail else 2.0, rng.random((m.num_cells,) + tail),
              lambda x: (x[..., :1] ** 2 * np.ones(tail or (1,))).reshape(x.shape[:-1] + tail)):
        a, b = load_on_device(CPU, info, f, xi, w, phi), assemble.load(space, f)
        assert np.max(np.abs(a - b)) <= 16 * eps * np.max(np.abs(b))


def test_galerkin_device_branch_equals_the_host_branch(fake_gpu):
    """The Galerkin coarse matrices' device branch (``hierarchy._galerkin``: products of the
    backend's matrices, the fixed DoFs' diagonal as a COO matrix, zeros dropped by the
    device masking) on the stand-in: the host branch's matrices, on every level of an
    adaptive hierarchy with Dirichlet and hanging nodes."""
    import scipy.sparse as sp
    from adaptmg.multilevel.hierarchy import _galerkin
    fake_cupy = fake_gpu
    space = adaptmg.Space(_mesh(2, 3, 2), degree=1)
    ml = adaptmg.multigrid(space, assemble.stiffness, galerkin=True, backend="cpu", coarse_max_rows=None)
    assert len(ml.levels) >= 3 and space.mesh.num_hanging_nodes > 0
    for l in range(len(ml.levels) - 1):
        fine = ml.levels[l + 1]
        free = ml.constraints[l].free
        assert not free.all()
        dev = [fake_cupy.csr_matrix(M) for M in (fine.R, fine.A, fine.P)]
        assert all(is_device_sparse(M) for M in dev)
        K = sp.csr_matrix(_galerkin(*dev, free))
        ref = sp.csr_matrix(ml.levels[l].A, copy=True)      # the host branch's, in multigrid()
        K.sort_indices()                                    # SciPy's product leaves rows unsorted
        ref.sort_indices()
        np.testing.assert_array_equal(K.indptr, ref.indptr)
        np.testing.assert_array_equal(K.indices, ref.indices)
        np.testing.assert_allclose(K.data, ref.data, rtol=4 * np.finfo(float).eps, atol=0)


def test_smoother_and_coarse_device_branches_equal_the_host_ones(fake_gpu):
    """Chebyshev's Lanczos estimate on a device matrix (vectors on the device, the same start
    vector), Jacobi's D^{-1} and the dense coarse inverse built from a device matrix, on the
    stand-in: the host branches' numbers."""
    import pyamg
    from adaptmg.backend import get_backend
    from adaptmg.multilevel.chebyshev import estimate_lambda_max
    from adaptmg.multilevel.coarse import dense_inverse
    from adaptmg.multilevel.smoother_base import _diagonal, _inverse_diagonal
    A = pyamg.gallery.poisson((20, 20), format="csr")
    Ad = fake_gpu.csr_matrix(A)
    eps = np.finfo(np.float64).eps
    lam, lam_d = estimate_lambda_max(A), estimate_lambda_max(Ad)
    assert 1.9 < lam < 2.0 and abs(lam - lam_d) <= 8 * eps * lam
    np.testing.assert_array_equal(np.asarray(_inverse_diagonal(_diagonal(Ad, "t"), "t")), 1.0 / A.diagonal())
    inv, inv_d = dense_inverse(A, get_backend("cpu"), np.float64, 2000), \
        dense_inverse(Ad, get_backend("gpu"), np.float64, 2000)
    np.testing.assert_allclose(np.asarray(inv_d), inv, rtol=0, atol=64 * eps * abs(inv).max())
