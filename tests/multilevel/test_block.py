"""Block solves (many right-hand sides): ml.solve(B) with B of shape (n, k) against
column-by-column solves, per-column convergence and info, errors, amg hierarchies,
W/F cycles, every registry smoother, block Krylov against SciPy, gmres without restart."""
import warnings

import numpy as np
import pytest
import pyamg
import scipy.sparse.linalg as sla

import adaptmg
from adaptmg import assemble
from adaptmg.backend import to_host
from adaptmg.linalg import ConvergenceWarning
from adaptmg.linalg.block_krylov import block_cg, block_gmres
from adaptmg.multilevel.smoothers import SMOOTHERS

EPS = np.finfo(np.float64).eps


@pytest.fixture(scope="module")
def space():
    mesh = adaptmg.Mesh.box([0, 0], [1, 1], [4, 4]).refine().refine().refine()
    return adaptmg.Space(mesh, degree=1)


def _ml(space, be="cpu", **kw):
    return adaptmg.multigrid(space, assemble.stiffness, dirichlet="all", backend=be, **kw)


def _block(n, k, seed=0):
    B = np.random.default_rng(seed).standard_normal((n, k))
    B[:, 1] = 0.0                                           # a zero column
    return B


def _host(a):
    return a.get() if hasattr(a, "get") else np.asarray(a)


def _check_vs_columns(ml, B, accel, cycle, be_xp=np):
    """The block solve equals the k one-vector solves up to round-off, column by column,
    with the same iteration counts (+-1 for gmres: the block monitor is SciPy's target).
    On the GPU the one-vector path runs other (fused, graph-recorded) kernels: there the
    counts may differ by one and the solutions by the solver tolerance."""
    gpu = be_xp is not np
    X = _host(ml.solve(be_xp.asarray(B), rtol=1e-8, accel=accel, cycle=cycle))
    its, info = np.asarray(ml.last_iterations), np.asarray(ml.last_info)
    assert X.shape == B.shape and np.all(info == 0)
    A = to_host(ml.levels[-1].A)        # a device matrix when the GPU set-up built it there
    for j in range(B.shape[1]):
        x = _host(ml.solve(be_xp.asarray(np.ascontiguousarray(B[:, j])), rtol=1e-8,
                           accel=accel, cycle=cycle))
        tol = 1e-8 * np.linalg.norm(B[:, j])
        assert np.linalg.norm(B[:, j] - A @ X[:, j]) <= tol * (1 + 1e-6)
        # the same iterates: agreement far below the solver tolerance, in units of eps
        agree = 1e-6 if gpu else 1e4 * EPS
        assert np.abs(x - X[:, j]).max() <= agree * max(np.abs(x).max(), 1e-300)
        assert abs(int(its[j]) - ml.last_iterations) <= (1 if accel == "gmres" or gpu else 0)
    assert its[1] == 0                                      # the zero column: no iteration
    assert np.all(X[:, 1] == 0)
    return X, its


@pytest.mark.parametrize("accel", [None, "cg", "gmres"])
@pytest.mark.parametrize("cycle", ["V", "W", "F"])
def test_block_equals_columns(space, accel, cycle):
    ml = _ml(space)
    _check_vs_columns(ml, _block(ml.levels[-1].n, 4), accel, cycle)


@pytest.mark.parametrize("name", sorted(SMOOTHERS))
def test_every_registry_smoother_on_blocks(space, name):
    ml = _ml(space, smoother=name)
    X, its = _check_vs_columns(ml, _block(ml.levels[-1].n, 3, seed=1), "cg", "V")
    assert its.max() <= 12                                   # multigrid, not a slow fallback


def test_coarse_smoother_and_float32_hierarchy(space):
    ml = _ml(space, coarse="smoother", dtype=np.float32)
    B = _block(ml.levels[-1].n, 3)
    X = ml.solve(B, rtol=1e-8, accel="cg")
    A = ml.levels[-1].A
    r = np.linalg.norm(B - A @ X, axis=0)
    assert np.all(r <= 1e-8 * np.linalg.norm(B, axis=0) + 1e-300) and X.dtype == np.float64


def test_per_column_convergence_and_info(space):
    ml = _ml(space)
    n = ml.levels[-1].n
    A = ml.levels[-1].A
    B = _block(n, 4)
    x_exact = ml.solve(B[:, 0].copy(), rtol=1e-12, accel="cg")
    X0 = np.zeros_like(B)
    X0[:, 0] = x_exact                                      # column 0 starts converged
    B[:, 3] *= 1e6                                          # scaled: same relative work
    X = ml.solve(B, X0, rtol=1e-8, accel="cg")
    its = ml.last_iterations
    assert its[0] == 0 and its[1] == 0 and its[2] == its[3] > 0
    assert np.array_equal(X[:, 0], x_exact)                 # a converged column is not updated
    # maxiter too small: info per column, a warning naming the columns
    with pytest.warns(ConvergenceWarning, match="2 of 4 columns"):
        ml.solve(B, X0, rtol=1e-12, accel="cg", maxiter=2)
    assert list(ml.last_info) == [0, 0, 2, 2]
    with pytest.warns(ConvergenceWarning, match="columns"):
        ml.solve(B, rtol=1e-12, maxiter=1)
    assert ml.last_info[1] == 0 and ml.last_info[2] == 1
    res = []
    ml.solve(B, rtol=1e-8, residuals=res)
    assert len(res) == ml.last_iterations.max() + 1 and res[0].shape == (4,)
    assert np.all(res[-1][[0, 2, 3]] <= 1e-8 * np.linalg.norm(B[:, [0, 2, 3]], axis=0))
    assert np.linalg.norm(B[:, 2] - A @ X[:, 2]) <= 1e-8 * np.linalg.norm(B[:, 2])


def test_bad_blocks_are_refused(space):
    ml = _ml(space)
    n = ml.levels[-1].n
    with pytest.raises(ValueError, match=r"\(n,\)|shape"):
        ml.solve(np.ones((n + 1, 3)))
    with pytest.raises(ValueError, match="shape"):
        ml.solve(np.ones((n, 3, 1)))
    with pytest.raises(TypeError, match="complex"):
        ml.solve(np.ones((n, 3), dtype=complex))
    with pytest.raises(TypeError, match="real"):
        ml.solve(np.ones((n, 3), dtype=object))
    B = np.ones((n, 3))
    B[5, 2] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        ml.solve(B)
    with pytest.raises(ValueError, match="x0"):
        ml.solve(np.ones((n, 3)), np.ones((n, 2)))
    with pytest.raises(ValueError, match="fgmres"):
        ml.solve(np.ones((n, 3)), accel="fgmres")
    with pytest.raises(ValueError, match="restart"):
        ml.solve(np.ones(n), accel="cg", restart=10)
    with pytest.raises(ValueError, match="restart"):
        ml.solve(np.ones((n, 2)), accel="gmres", restart=0)
    # (n,) and (n, 1) keep the one-vector path
    x1 = ml.solve(np.ones(n))
    x2 = ml.solve(np.ones((n, 1)))
    assert x1.shape == (n,) and isinstance(ml.last_iterations, int)
    assert np.array_equal(x1, x2.reshape(n)) or np.allclose(x1, x2.reshape(n), rtol=1e-14)


def test_amg_hierarchy_block_and_preconditioner():
    A = pyamg.gallery.poisson((40, 40), format="csr")
    amg = adaptmg.amg(A, backend="cpu")
    B = np.random.default_rng(2).standard_normal((A.shape[0], 3))
    M = amg.aspreconditioner()
    B0 = B.copy()
    Y = M @ B
    assert np.array_equal(B, B0)                            # the input block is not written
    for j in range(3):
        y = M @ B[:, j]
        assert np.abs(Y[:, j] - y).max() <= 1e3 * EPS * np.abs(y).max()
    assert (M @ B[:, :1]).shape == (A.shape[0], 1)
    X = amg.solve(B, rtol=1e-10, accel="cg")
    assert np.all(amg.last_info == 0)
    assert np.all(np.linalg.norm(B - A @ X, axis=0) <= 1e-10 * np.linalg.norm(B, axis=0))
    # SciPy's CG with the block-capable preconditioner, column by column
    for j in range(3):
        x, info = sla.cg(A, B[:, j], rtol=1e-10, M=M)
        assert info == 0 and np.abs(x - X[:, j]).max() <= 1e-6 * np.abs(x).max()


def test_block_krylov_equals_scipy_per_column():
    A = pyamg.gallery.poisson((25, 25), format="csr")
    d = 1.0 / A.diagonal()
    B = np.random.default_rng(3).standard_normal((A.shape[0], 4))
    B[:, 2] = 0
    X, info, its = block_cg(A, B, rtol=1e-8, M=lambda V: d[:, None] * V, maxiter=400)
    for j in range(4):
        cnt = [0]
        x, inf = sla.cg(A, B[:, j], rtol=1e-8, maxiter=400,
                        M=sla.LinearOperator(A.shape, matvec=lambda v: d * v),
                        callback=lambda xk: cnt.__setitem__(0, cnt[0] + 1))
        assert info[j] == 0 and its[j] == cnt[0]
        assert np.abs(x - X[:, j]).max() <= 1e3 * EPS * max(np.abs(x).max(), 1e-300)
    for restart in (None, 15):
        X, info, its = block_gmres(A, B, rtol=1e-8, restart=restart, maxiter=400,
                                   M=lambda V: d[:, None] * V)
        assert np.all(info == 0) and its[2] == 0
        assert np.all(np.linalg.norm(B - A @ X, axis=0) <= 1e-8 * np.linalg.norm(B, axis=0))
    with pytest.warns(ConvergenceWarning, match="did not converge"):
        X, info, its = block_cg(A, B, rtol=1e-12, maxiter=3)
    assert list(info) == [3, 3, 0, 3] and list(its) == [3, 3, 0, 3]
    with pytest.raises(ValueError, match="2-D"):
        block_cg(A, B[:, 0])
    with pytest.raises(TypeError, match="floating"):
        block_cg(A, B.astype(np.complex128))


def _rotated_aniso(m=120):
    st = pyamg.gallery.diffusion_stencil_2d(epsilon=0.001, theta=np.pi / 8, type="FE")
    A = pyamg.gallery.stencil_grid(st, (m, m), format="csr")
    return A, pyamg.smoothed_aggregation_solver(A)


def test_gmres_no_restart_like_pyamg():
    """accel="gmres" runs pyamg's unrestarted GMRES: with the same preconditioner its
    monitored residuals are pyamg.krylov.gmres' residual history (pyamg's ml.solve),
    iteration for iteration past SciPy's old restart length 20; adaptmg then goes on
    until the *true* residual passes (pyamg stops on ||M r|| <= tol ||M b||)."""
    A, ml = _rotated_aniso(64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        am = adaptmg.from_pyamg(ml, backend="cpu")
    b = np.random.default_rng(0).standard_normal(A.shape[0])
    ref = []
    pyamg.krylov.gmres(A, b, tol=1e-8, M=am.aspreconditioner(), residuals=ref, maxiter=200)
    k = len(ref) - 1
    assert k > 30
    for restart, same in ((None, True), (20, False)):
        res = []
        x = am.solve(b, rtol=1e-8, accel="gmres", residuals=res, restart=restart)
        assert np.linalg.norm(b - A @ x) <= 1e-8 * np.linalg.norm(b)
        mon = np.asarray(res[1:k + 1])                 # absolute norms, as pyamg reports them
        dev = np.abs(mon / np.asarray(ref[1:]) - 1).max()
        assert (dev <= 1e-6) == same, (restart, dev)
        if same:
            assert k <= am.last_iterations <= k + 10


@pytest.mark.gpu
@pytest.mark.parametrize("accel", [None, "cg", "gmres"])
def test_block_equals_columns_gpu(space, accel):
    import cupy
    ml = _ml(space, be="gpu")
    _check_vs_columns(ml, _block(ml.levels[-1].n, 4), accel, "V", be_xp=cupy)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["jacobi", "chebyshev", "gauss_seidel", "block_jacobi",
                                  "l1_gauss_seidel"])
def test_smoothers_on_blocks_gpu(space, name):
    import cupy
    ml = _ml(space, be="gpu", smoother=name)
    _check_vs_columns(ml, _block(ml.levels[-1].n, 3), "cg", "W", be_xp=cupy)


@pytest.mark.parametrize("pre, post", [(2, 2), (3, 1), (1, 2), (2, 3), (0, 1)])
def test_host_block_cycle_equals_plain_sweeps(space, pre, post):
    """On the host, the scaled Jacobi sweeps (``Y = X + omega D^-1 B + N X``) and the
    restricted residual give the plain cycle's result up to round-off, for every parity
    of the sweep counts, and are really taken."""
    from adaptmg.multilevel.block import BlockCycle, _BlockJacobi
    ml = _ml(space, presmooth=pre, postsmooth=post)
    B = _block(ml.levels[-1].n, 5)
    fast, plain = BlockCycle(ml, "V"), BlockCycle(ml, "V")
    plain.fuse = False
    for lev in plain.levels:
        if isinstance(lev.smoother, _BlockJacobi):
            lev.smoother.N = None
    X1, X2 = fast.matmat(B), plain.matmat(B)
    assert all(lev.tfused and lev.AP is None for lev in fast.levels[1:])
    assert np.abs(X1 - X2).max() <= 1e3 * EPS * np.abs(X2).max()


@pytest.mark.gpu
@pytest.mark.parametrize("pre, post", [(2, 2), (3, 1), (1, 2), (2, 3), (0, 1)])
def test_fused_block_cycle_equals_unfused_gpu(space, pre, post):
    """The block cycle's fused passes (two sweeps from zero, restricted residual, correction
    with the first post-sweep) give the unfused cycle's result up to round-off, for every
    parity of the sweep counts; the fusion is really taken on the levels below the top."""
    import cupy
    from adaptmg.multilevel.block import BlockCycle
    ml = _ml(space, be="gpu", presmooth=pre, postsmooth=post)
    B = cupy.asarray(_block(ml.levels[-1].n, 6))
    fused, plain = BlockCycle(ml, "V"), BlockCycle(ml, "V")
    plain.fuse = False
    X1, X2 = fused.matmat(B), plain.matmat(B)
    assert all(lev.tfused for lev in fused.levels[1:])
    assert not any(lev.tfused for lev in plain.levels)
    scale = float(cupy.abs(X2).max())
    assert float(cupy.abs(X1 - X2).max()) <= 1e3 * EPS * scale


@pytest.mark.gpu
def test_gpu_block_matches_cpu(space):
    import cupy
    B = _block(_ml(space).levels[-1].n, 5)
    Xc = _ml(space).solve(B, rtol=1e-12, accel="cg")
    Xg = _ml(space, be="gpu").solve(cupy.asarray(B), rtol=1e-12, accel="cg")
    Xh = _ml(space, be="gpu").solve(B, rtol=1e-12, accel="gmres")     # host in, host out
    assert isinstance(Xg, cupy.ndarray) and isinstance(Xh, np.ndarray)
    assert np.abs(Xg.get() - Xc).max() <= 1e-8 * np.abs(Xc).max()
    assert np.abs(Xh - Xc).max() <= 1e-8 * np.abs(Xc).max()


def test_from_pyamg_block_and_matrix_free_refused():
    A, ml = _rotated_aniso(48)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        am = adaptmg.from_pyamg(ml, backend="cpu")          # PrePostSmoother(GS) levels
    B = np.random.default_rng(4).standard_normal((A.shape[0], 3))
    X = am.solve(B, rtol=1e-8, accel="gmres", maxiter=200)
    its = am.last_iterations.copy()
    for j in range(3):
        x = am.solve(np.ascontiguousarray(B[:, j]), rtol=1e-8, accel="gmres", maxiter=200)
        assert abs(int(its[j]) - am.last_iterations) <= 1
        assert np.linalg.norm(x - X[:, j]) <= 1e-6 * np.linalg.norm(x)
    # a matrix-free level: a clear error, not a wrong answer
    from adaptmg.multilevel import Level, MultilevelSolver
    Ap = pyamg.gallery.poisson((16, 16), format="csr")
    op = sla.aslinearoperator(Ap)
    op.diagonal = Ap.diagonal
    mf = MultilevelSolver([Level(op)], coarse="smoother", backend="cpu")
    with pytest.raises(TypeError, match="assembled sparse"):
        mf.solve(np.ones((Ap.shape[0], 2)))
