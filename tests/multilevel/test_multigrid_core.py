"""Multigrid core on exact structured Q1 hierarchies (uniform meshes, Dirichlet rows removed).

1-D Q1 on n cells of [0, 1]: K1 = tridiag(-1, 2, -1)/h, M1 = h/6 tridiag(1, 4, 1) on the
n-1 interior nodes.  2-D stiffness kron(K1, M1) + kron(M1, K1) (9-point stencil), 3-D the sum
of three triple Kronecker products (27-point).  Prolongation = kron of 1-D linear
interpolation, which for nested Q1 spaces makes R A_h P equal to A_2h exactly.
"""

import numpy as np
import pytest
import scipy.sparse as sp
import scipy.sparse.linalg as sla

from adaptmg.backend import to_host
from adaptmg.assemble.testing import tensor_prolongation, tensor_q1_stiffness
from adaptmg.multilevel import Level, MultilevelSolver
from adaptmg.multilevel.smoothers import Jacobi


def hierarchy(d, n0, L):
    """Matrices coarse -> fine on n0 * 2**l cells per direction, l = 0..L-1."""
    ns = [n0 * 2 ** l for l in range(L)]
    return [tensor_q1_stiffness(n, d) for n in ns], [tensor_prolongation(n, d) for n in ns[:-1]]


def factor(ml, backend, cycle="V", ncyc=8, seed=0):
    """Geometric-mean A-norm error reduction per cycle from a random error, zero rhs."""
    A = to_host(ml.levels[-1].A)
    n = A.shape[0]
    e0 = np.random.default_rng(seed).standard_normal(n)
    x = backend.asarray(e0.copy())
    b = backend.xp.zeros(n)
    for _ in range(ncyc):
        ml.cycle(b, x, cycle=cycle)
    e = to_host(x)
    return (np.sqrt(e @ (A @ e)) / np.sqrt(e0 @ (A @ e0))) ** (1.0 / ncyc)


@pytest.mark.parametrize("d,n0,Ls", [(2, 4, (3, 4, 5, 6)), (3, 2, (3, 4, 5))])
def test_vcycle_jacobi_factor_level_independent(backend, d, n0, Ls):
    """V(2,2)-Jacobi(omega=2/3): factor <= 0.2 and f(L+1) <= 1.1 f(L) + 0.02.

    Observed (CPU): 2-D 0.075, 0.077, 0.079, 0.080; 3-D 0.114, 0.124, 0.130.
    """
    fs = []
    for L in Ls:
        As, Ps = hierarchy(d, n0, L)
        ml = MultilevelSolver.from_matrices(As, Ps, backend=backend)
        fs.append(factor(ml, backend))
    assert max(fs) <= 0.2, fs
    for f0, f1 in zip(fs, fs[1:]):
        assert f1 <= 1.1 * f0 + 0.02, fs


def test_vcycle_is_symmetric_and_cg_converges(backend):
    As, Ps = hierarchy(2, 4, 5)
    for sm in ("jacobi", "chebyshev"):
        ml = MultilevelSolver.from_matrices(As, Ps, backend=backend, smoother=sm)
        for cyc in ("V", "W"):
            M = ml.aspreconditioner(cycle=cyc)
            n = As[-1].shape[0]
            rng = np.random.default_rng(5)
            x, y = (backend.asarray(rng.standard_normal(n)) for _ in range(2))
            Mx, My = to_host(M.matvec(x)), to_host(M.matvec(y))
            lhs, rhs = float(Mx @ to_host(y)), float(to_host(x) @ My)
            assert abs(lhs - rhs) <= 1e-12 * abs(lhs), (sm, cyc, lhs, rhs)
    # CG preconditioned by one V(2,2)-cycle: 1e-8 in at most 8 iterations (observed 6)
    ml = MultilevelSolver.from_matrices(As, Ps, backend=backend)
    b = backend.asarray(np.ones(As[-1].shape[0]))
    res = []
    ml.solve(b, rtol=1e-8, accel="cg", residuals=res)
    assert res[-1] <= 1e-8 * res[0]
    assert len(res) - 1 <= 8, res


def test_stationary_solve_and_residual_history(backend):
    As, Ps = hierarchy(2, 4, 6)
    ml = MultilevelSolver.from_matrices(As, Ps, backend=backend)
    n = As[-1].shape[0]
    rng = np.random.default_rng(0)
    xs = rng.standard_normal(n)
    b = backend.asarray(As[-1] @ xs)
    res = []
    x = ml.solve(b, rtol=1e-10, residuals=res)
    assert res[-1] <= 1e-10 * np.linalg.norm(As[-1] @ xs)
    assert len(res) <= 14                          # 0.08 per cycle -> ~10 cycles
    np.testing.assert_allclose(to_host(x), xs, rtol=0, atol=1e-8 * np.abs(xs).max() * 10)
    # x0 given is not modified, and a converged x0 returns at once
    x0 = backend.asarray(np.zeros(n))
    res2 = []
    ml.solve(b, x0=x0, rtol=1e-6, residuals=res2)
    assert float(abs(x0).max()) == 0.0
    # zero rhs -> zero solution, no iterations
    res3 = []
    z = ml.solve(backend.xp.zeros(n), residuals=res3)
    assert float(abs(z).max()) == 0.0 and res3 == [0.0]


def test_w_and_f_cycles_at_least_as_fast_as_v(backend):
    As, Ps = hierarchy(2, 4, 6)
    ml = MultilevelSolver.from_matrices(As, Ps, backend=backend, presmooth=1, postsmooth=1)
    fv = factor(ml, backend, "V")
    fw = factor(ml, backend, "W")
    ff = factor(ml, backend, "F")
    assert fw <= fv * 1.02 and ff <= fv * 1.02, (fv, fw, ff)
    assert max(fv, fw, ff) < 0.3


def test_chebyshev_multigrid(backend):
    As, Ps = hierarchy(3, 2, 4)
    ml = MultilevelSolver.from_matrices(As, Ps, backend=backend, smoother="chebyshev")
    assert factor(ml, backend) <= 0.2              # observed 0.107 (degree 3, V(2,2))


def test_block_jacobi_two_component_system(backend):
    """A = kron(A_scalar, B), B 2x2 SPD coupling (DoF = node*2 + comp), P = kron(P, I2).

    S A = kron(D^-1 A_scalar, I2) for block Jacobi, so the factor equals the scalar one.
    """
    As, Ps = hierarchy(2, 4, 5)
    B = sp.csr_matrix(np.array([[2.0, 1.0], [1.0, 3.0]]))
    I2 = sp.identity(2, format="csr")
    Av = [sp.kron(A, B).tocsr() for A in As]
    Pv = [sp.kron(P, I2).tocsr() for P in Ps]
    mlv = MultilevelSolver.from_matrices(Av, Pv, backend=backend, smoother="block_jacobi",
                                         block_size=2)
    mls = MultilevelSolver.from_matrices(As, Ps, backend=backend)
    fv, fs = factor(mlv, backend), factor(mls, backend)
    assert fv <= 0.2 and fv <= 1.1 * fs + 0.02, (fv, fs)
    # with a diagonal coupling, block Jacobi and point Jacobi give the same cycle
    Bd = sp.diags([2.0, 3.0])
    Ad = [sp.kron(A, Bd).tocsr() for A in As]
    m1 = MultilevelSolver.from_matrices(Ad, Pv, backend=backend, smoother="block_jacobi",
                                        block_size=2)
    m2 = MultilevelSolver.from_matrices(Ad, Pv, backend=backend, smoother="jacobi")
    r = backend.asarray(np.random.default_rng(1).standard_normal(Ad[-1].shape[0]))
    np.testing.assert_allclose(to_host(m1.aspreconditioner().matvec(r)),
                               to_host(m2.aspreconditioner().matvec(r)), rtol=1e-12, atol=1e-14)
    # singular node block
    bad = Av[-1].tolil()
    bad[10, 10] = bad[10, 11] = bad[11, 10] = bad[11, 11] = 0.0
    with pytest.raises(ValueError, match="node 5"):
        MultilevelSolver.from_matrices(Av[:-1] + [bad.tocsr()], Pv, backend=backend,
                                       smoother="block_jacobi", block_size=2)


def test_float32_hierarchy_inside_float64_krylov(backend):
    As, Ps = hierarchy(2, 4, 6)
    ml = MultilevelSolver.from_matrices(As, Ps, backend=backend, dtype=np.float32)
    assert ml._dev[-1].A.dtype == np.float32 and ml._coarse_inv.dtype == np.float32
    n = As[-1].shape[0]
    b64 = np.random.default_rng(2).standard_normal(n)
    # stationary mixed-precision iterative refinement reaches 1e-10 in float64
    res = []
    x = ml.solve(backend.asarray(b64), rtol=1e-10, residuals=res)
    assert x.dtype == np.float64
    assert np.linalg.norm(b64 - As[-1] @ to_host(x)) <= 1e-10 * np.linalg.norm(b64)
    # preconditioner takes and returns float64
    M = ml.aspreconditioner()
    assert M.dtype == np.float64
    y = M.matvec(backend.asarray(b64))
    assert y.dtype == np.float64
    for accel in ("cg", "gmres"):
        x = ml.solve(backend.asarray(b64), rtol=1e-10, accel=accel)
        assert np.linalg.norm(b64 - As[-1] @ to_host(x)) <= 1e-10 * np.linalg.norm(b64), accel
    if not backend.is_gpu:  # plain SciPy gmres with the float32 preconditioner
        x, info = sla.gmres(As[-1], b64, M=M, rtol=1e-10, atol=0.0)
        assert info == 0
        assert np.linalg.norm(b64 - As[-1] @ x) <= 1e-10 * np.linalg.norm(b64)


def test_adaptmg_linalg_accelerators(backend):
    linalg = pytest.importorskip("adaptmg.linalg")
    if not all(hasattr(linalg, f) for f in ("cg", "gmres", "fgmres")):
        pytest.skip("adaptmg.linalg has no cg/gmres/fgmres yet")
    As, Ps = hierarchy(2, 4, 5)
    for dtype in (np.float64, np.float32):
        ml = MultilevelSolver.from_matrices(As, Ps, backend=backend, dtype=dtype)
        b = backend.asarray(np.ones(As[-1].shape[0]))
        for accel in ("cg", "gmres", "fgmres"):
            x = ml.solve(b, rtol=1e-10, accel=accel)
            r = np.ones(As[-1].shape[0]) - As[-1] @ to_host(x)
            assert np.linalg.norm(r) <= 1e-10 * np.linalg.norm(np.ones(As[-1].shape[0])), accel


def test_print_shows_levels_and_complexity():
    As, Ps = hierarchy(2, 4, 4)
    metas = [{"cells": (4 * 2 ** l) ** 2, "hanging": 0} for l in range(4)]
    ml = MultilevelSolver.from_matrices(As, Ps, backend="cpu", metas=metas)
    text = repr(ml)
    oc = sum(A.nnz for A in As) / As[-1].nnz
    gc = sum(A.shape[0] for A in As) / As[-1].shape[0]
    assert f"Operator complexity: {oc:.3f}" in text
    assert f"Grid complexity:     {gc:.3f}" in text
    assert abs(ml.operator_complexity() - oc) < 1e-14
    rows = [ln for ln in text.splitlines() if ln.strip() and ln.split()[0].isdigit()]
    assert len(rows) == 4
    for l, ln in enumerate(reversed(rows)):
        f = ln.split()
        assert int(f[0]) == l and f[1] == "-" and int(f[2]) == metas[l]["cells"]   # no "kind" given
        assert int(f[3]) == As[l].shape[0] and int(f[4]) == As[l].nnz and f[5] == "0"


def test_galerkin_equals_rediscretisation_and_level_order():
    As, Ps = hierarchy(2, 4, 4)
    ml = MultilevelSolver.from_matrices(As[-1], Ps, galerkin=True, backend="cpu")
    for A, lev in zip(As, ml.levels):
        assert abs(lev.A - A).max() <= 1e-12 * abs(A).max()
    # levels given fine -> coarse are reversed
    levels = [Level(As[3], P=Ps[2]), Level(As[2], P=Ps[1]), Level(As[1], P=Ps[0]), Level(As[0])]
    ml2 = MultilevelSolver(levels, backend="cpu")
    assert [lev.n for lev in ml2.levels] == [A.shape[0] for A in As]
    # coarse_max_rows drops the tiny levels
    ml3 = MultilevelSolver.from_matrices(As, Ps, backend="cpu", coarse_max_rows=100)
    assert ml3.levels[0].n == As[1].shape[0] and len(ml3.levels) == 3


def test_foreign_smoother_and_coarse_smoother(backend):
    class Wrapped:  # only .smooth(x, b, sweeps): the contract for plug-in smoothers
        def __init__(self, A):
            self.inner = Jacobi(A, backend=backend)

        def smooth(self, x, b, sweeps=1):
            self.inner.smooth(x, b, sweeps)

    As, Ps = hierarchy(2, 4, 4)
    levels = [Level(As[0], smoother=Wrapped(As[0]))]
    levels += [Level(A, P=P, smoother=Wrapped(A)) for A, P in zip(As[1:], Ps)]
    ml = MultilevelSolver(levels, backend=backend, coarse="smoother", coarse_sweeps=30)
    ref = MultilevelSolver.from_matrices(As, Ps, backend=backend, coarse="smoother",
                                         coarse_sweeps=30)
    r = backend.asarray(np.random.default_rng(0).standard_normal(As[-1].shape[0]))
    np.testing.assert_allclose(to_host(ml.aspreconditioner().matvec(r)),
                               to_host(ref.aspreconditioner().matvec(r)), rtol=1e-12, atol=1e-14)
    assert factor(ml, backend) <= 0.2


def test_bad_input(backend):
    As, Ps = hierarchy(2, 4, 3)
    with pytest.raises(ValueError, match="square"):
        Level(sp.random(5, 6, density=0.5, format="csr"))
    with pytest.raises(ValueError, match="P has shape"):
        MultilevelSolver.from_matrices([As[0], As[2]], [Ps[1]], backend=backend)
    with pytest.raises(ValueError, match="rows"):
        Level(As[1], P=Ps[1])
    with pytest.raises(ValueError, match="coarsest"):
        MultilevelSolver([Level(As[1], P=Ps[0])], backend=backend)
    ml = MultilevelSolver.from_matrices(As, Ps, backend=backend)
    n = As[-1].shape[0]
    b = np.ones(n)
    b[3] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        ml.solve(backend.asarray(b))
    good = backend.asarray(np.ones(n))
    with pytest.raises(ValueError, match="rtol"):
        ml.solve(good, rtol=-1.0)
    with pytest.raises(ValueError, match="cycle"):
        ml.solve(good, cycle="X")
    with pytest.raises(ValueError, match="cycle"):
        ml.aspreconditioner(cycle="Z")
    with pytest.raises(ValueError, match="accel"):
        ml.solve(good, accel="bicg_nonsense")
    with pytest.raises(ValueError, match="shape"):
        ml.solve(backend.asarray(np.ones(n + 1)))
    with pytest.raises(ValueError, match="unknown smoother"):
        MultilevelSolver.from_matrices(As, Ps, backend=backend, smoother="gauss_jordan")
    with pytest.raises(TypeError, match="dtype"):
        ml.cycle(backend.asarray(np.ones(n, np.float32)), backend.asarray(np.zeros(n, np.float32)))
    with pytest.raises(ValueError, match="max_direct"):
        MultilevelSolver.from_matrices(As, Ps, backend=backend, max_direct=5)
    with pytest.raises(ValueError, match="coarse"):
        MultilevelSolver.from_matrices(As, Ps, backend=backend, coarse="lu")
    with pytest.raises(TypeError, match="smoother"):
        MultilevelSolver([Level(As[0]), Level(As[1], P=Ps[0], smoother=object())],
                         backend=backend)
    with pytest.raises(ValueError, match="fuse_below"):
        MultilevelSolver.from_matrices(As, Ps, backend=backend, fuse_below="sometimes")
    with pytest.raises(ValueError, match="fuse_below"):
        MultilevelSolver.from_matrices(As, Ps, backend=backend, fuse_below=True)   # a bool is no row count
    with pytest.raises(ValueError, match="fuse_transfers_below"):
        MultilevelSolver.from_matrices(As, Ps, backend=backend, fuse_transfers_below=-1)
    with pytest.warns(UserWarning, match="did not reach"):
        ml.solve(good, rtol=1e-14, maxiter=1)


@pytest.mark.parametrize("smoother,kw,pre,post", [
    ("jacobi", {}, 2, 2), ("jacobi", {}, 3, 3), ("jacobi", {}, 1, 4), ("jacobi", {}, 4, 1),
    ("jacobi", {}, 1, 1),
    ("chebyshev", {"degree": 3}, 2, 2), ("chebyshev", {"degree": 2}, 1, 2),
    ("chebyshev", {"degree": 6}, 2, 1)])
@pytest.mark.parametrize("transfers,presmooth_fused", [(False, False), (True, False),
                                                      (False, True), (True, True)])
def test_fused_small_levels_give_the_same_cycle(backend, smoother, kw, pre, post, transfers,
                                                presmooth_fused):
    """One-launch sweeps (Jacobi, the first two from zero in one launch) / steps (Chebyshev,
    ping-pong buffers, both parities of the step count, zero and non-zero initial guess)
    against SpMV + element-wise kernels; with ``transfers`` also the restricted residual
    R b - (R A) x and (Jacobi) the correction fused into the first post-sweep; with
    ``presmooth_fused`` (Jacobi, 1 or 2 pre-sweeps) the pre-smoothing from zero and
    ``R (I - A G) b`` in one launch (W-cycles: the later visits of a level start from a
    non-zero guess and take the other path)."""
    As, Ps = hierarchy(2, 4, 5)
    opts = dict(backend=backend, smoother=smoother, smoother_kwargs=kw, presmooth=pre,
                postsmooth=post)
    ref = MultilevelSolver.from_matrices(As, Ps, fuse_presmooth_below=0, **opts)
    fus = MultilevelSolver.from_matrices(As, Ps, fuse_below=10 ** 9,
                                         fuse_transfers_below=10 ** 9 if transfers else 0,
                                         fuse_presmooth_below=10 ** 9 if presmooth_fused else 0,
                                         defer_fused_products=False, **opts)
    ref.set_fuse_below(0)
    assert all(d.fused for d in fus._dev) and not any(d.fused for d in ref._dev)
    assert all(d.smoother.fused for d in fus._dev[1:])
    assert not any(d.tfused or d.sfused for d in ref._dev)
    assert [d.tfused for d in fus._dev] == [False] + [transfers] * (len(As) - 1)
    assert all((d.AP is not None) == (transfers and smoother == "jacobi") for d in fus._dev[1:])
    sfused = presmooth_fused and smoother == "jacobi" and pre in (1, 2)
    assert [d.sfused for d in fus._dev] == [False] + [sfused] * (len(As) - 1)
    r = backend.asarray(np.random.default_rng(4).standard_normal(As[-1].shape[0]))
    for cyc in ("V", "W"):
        np.testing.assert_allclose(to_host(fus.aspreconditioner(cyc).matvec(r)),
                                   to_host(ref.aspreconditioner(cyc).matvec(r)),
                                   rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("post,transfers,deferred", [
    (2, False, True), (3, False, False), (1, False, False), (2, True, True), (1, True, False),
    (0, False, False)])
@pytest.mark.parametrize("cyc", ["V", "W"])
def test_deferred_last_sweep_completes_the_cycle(backend, post, transfers, deferred, cyc):
    """``_run(defer_last=True)`` leaves out the finest level's last Jacobi sweep exactly when
    that sweep writes ``x`` from another buffer (even counts of plain sweeps, even counts
    after the fused correction, whose first sweep is in the correction launch); running
    the deferred sweep completes the
    cycle: the same ``x`` as the whole cycle (the same kernels, in the same order)."""
    from adaptmg.device import kernels as K
    As, Ps = hierarchy(2, 4, 4)
    ml = MultilevelSolver.from_matrices(As, Ps, backend=backend, fuse_below=10 ** 9,
                                        fuse_transfers_below=10 ** 9 if transfers else 0,
                                        postsmooth=post)
    n = As[-1].shape[0]
    b = backend.asarray(np.random.default_rng(5).standard_normal(n))
    whole, part = backend.xp.zeros(n), backend.xp.zeros(n)
    ml._run(b, whole, cyc, True)
    ml._run(b, part, cyc, True, defer_last=True)
    assert (ml._deferred is not None) == deferred
    if deferred:
        sm, src = ml._deferred
        assert src is not part
        K.csr_jacobi_sweep(sm.A, src, b, sm.dinv, sm.omega, part)
    # the same kernels in the same order (cuSPARSE's SpMV may still sum in another order)
    np.testing.assert_allclose(to_host(part), to_host(whole), rtol=1e-13, atol=1e-15)
    ml._run(b, part, cyc, True)
    assert ml._deferred is None


@pytest.mark.gpu
def test_cpu_and_gpu_iterates_agree():
    from adaptmg.backend import get_backend
    gpu = get_backend("gpu")
    As, Ps = hierarchy(2, 4, 5)
    n = As[-1].shape[0]
    b = np.random.default_rng(3).standard_normal(n)
    for sm in ("jacobi", "block_jacobi", "chebyshev"):
        for cyc in ("V", "W", "F"):
            mc = MultilevelSolver.from_matrices(As, Ps, backend="cpu", smoother=sm)
            mg = MultilevelSolver.from_matrices(As, Ps, backend=gpu, smoother=sm)
            xc, xg = np.zeros(n), gpu.xp.zeros(n)
            for _ in range(3):
                mc.cycle(b, xc, cycle=cyc)
                mg.cycle(gpu.asarray(b), xg, cycle=cyc)
                err = np.linalg.norm(to_host(xg) - xc) / np.linalg.norm(xc)
                assert err <= 1e-10, (sm, cyc, err)


@pytest.mark.gpu
def test_gpu_cycle_never_synchronises():
    """Device discipline: a cycle / preconditioner application does no implicit host sync
    (no .get(), no float() of device scalars), checked with cupyx.allow_synchronize(False)."""
    cupyx = pytest.importorskip("cupyx")
    if not hasattr(cupyx, "allow_synchronize"):
        pytest.skip("this CuPy has no cupyx.allow_synchronize")
    from adaptmg.backend import get_backend
    gpu = get_backend("gpu")
    As, Ps = hierarchy(3, 2, 4)
    for sm, fuse in (("jacobi", "auto"), ("jacobi", 0), ("chebyshev", "auto"),
                     ("block_jacobi", 0)):
        for dtype in (np.float64, np.float32):
            ml = MultilevelSolver.from_matrices(As, Ps, backend=gpu, smoother=sm,
                                                fuse_below=fuse, dtype=dtype)
            n = As[-1].shape[0]
            b = gpu.xp.ones(n, dtype)
            x = gpu.xp.zeros(n, dtype)
            M = ml.aspreconditioner("W")
            r64 = gpu.xp.ones(n)
            ml.cycle(b, x)                         # warm-up (kernel compilation)
            M.matvec(r64)
            gpu.synchronize()
            with cupyx.allow_synchronize(False):
                for cyc in ("V", "W", "F"):
                    ml.cycle(b, x, cycle=cyc)
                M.matvec(r64)
            gpu.synchronize()


@pytest.mark.gpu
def test_graph_preconditioner_replays_the_eager_cycle():
    """aspreconditioner(graph=...) on the GPU: the captured cycle gives the eager cycle's
    result (all smoothers, V/W/F, float64 and float32 levels), is really a graph by default,
    and the returned vectors are fresh arrays (a second application does not overwrite them)."""
    from adaptmg.backend import get_backend
    gpu = get_backend("gpu")
    for d, n0, L in ((3, 2, 4), (2, 4, 4)):       # 4 and 1 threads per CSR row
        _graph_vs_eager(gpu, *hierarchy(d, n0, L))


def _graph_vs_eager(gpu, As, Ps):
    n = As[-1].shape[0]
    r1 = gpu.asarray(np.random.default_rng(5).standard_normal(n))
    r2 = gpu.asarray(np.random.default_rng(6).standard_normal(n))
    for sm in ("jacobi", "block_jacobi", "chebyshev"):
        for dtype, tol in ((np.float64, 1e-12), (np.float32, 1e-5)):
            ml = MultilevelSolver.from_matrices(As, Ps, backend=gpu, smoother=sm, dtype=dtype)
            for cyc in ("V", "W", "F"):
                Mg = ml.aspreconditioner(cyc)
                assert Mg.graph, (sm, dtype, cyc, ml.graph_error)
                Me = ml.aspreconditioner(cyc, graph=False)
                assert not Me.graph
                z1 = Mg.matvec(r1)
                z2 = Mg.matvec(r2)
                assert z1.dtype == r1.dtype
                for z, r in ((z1, r1), (z2, r2)):
                    ref = to_host(Me.matvec(r))
                    err = np.abs(to_host(z) - ref).max() / np.abs(ref).max()
                    assert err <= tol, (sm, dtype, cyc, err)


def test_preconditioner_applies_into_a_given_vector(backend):
    """``M.adaptmg_apply_into(v, out)`` writes ``M v`` into ``out`` (the cycle's own
    dtype or a cast from float32 levels; graphed and eager), and fgmres uses it for its
    Z basis: the same iterates as with ``M.matvec`` (the same operations in the same
    order, so equal to a few ulps), and ``matvec`` is not called at all."""
    from adaptmg.linalg import fgmres
    xp = backend.xp
    As, Ps = hierarchy(2, 4, 4)
    n = As[-1].shape[0]
    v = backend.asarray(np.random.default_rng(1).standard_normal(n))
    b = backend.asarray(np.random.default_rng(2).standard_normal(n))
    graphs = (False, True) if backend.is_gpu else (False,)
    for dtype, tol in ((np.float64, 4e-16), (np.float32, 4e-16)):
        ml = MultilevelSolver.from_matrices(As, Ps, backend=backend, dtype=dtype)
        for graph in graphs:
            M = ml.aspreconditioner(graph=graph)
            ref = to_host(M.matvec(v))
            for out_dtype in (np.float64, np.float32):
                out = xp.full(n, np.nan, out_dtype)
                assert M.adaptmg_apply_into(v, out) is out
                err = np.abs(to_host(out) - ref.astype(out_dtype)).max() / np.abs(ref).max()
                assert err <= 4 * np.finfo(out_dtype).eps, (dtype, graph, out_dtype, err)
            with pytest.raises(TypeError, match="apply_into needs two"):
                M.adaptmg_apply_into(v, [0.0] * n)

            class Counted:                   # M with into; counts what fgmres calls
                shape, dtype = M.shape, M.dtype
                calls = {"matvec": 0, "into": 0}

                def matvec(self, x):
                    self.calls["matvec"] += 1
                    return M.matvec(x)

                def adaptmg_apply_into(self, x, out):
                    self.calls["into"] += 1
                    return M.adaptmg_apply_into(x, out)
            Mc = Counted()
            x1, i1 = fgmres(As[-1], b, M=Mc, restart=5, rtol=1e-10)
            x2, i2 = fgmres(As[-1], b, M=M.matvec, restart=5, rtol=1e-10)
            assert i1 == i2 == 0
            assert Mc.calls["matvec"] == 0 and Mc.calls["into"] > 0
            err = np.abs(to_host(x1) - to_host(x2)).max() / np.abs(to_host(x2)).max()
            assert err <= 1e3 * tol, (dtype, graph, err)


def test_graph_option_is_validated(backend):
    As, Ps = hierarchy(2, 4, 3)
    ml = MultilevelSolver.from_matrices(As, Ps, backend=backend)
    with pytest.raises(ValueError, match="graph"):
        ml.aspreconditioner(graph="yes")
    if not backend.is_gpu:
        with pytest.raises(ValueError, match="GPU"):
            ml.aspreconditioner(graph=True)
        assert not ml.aspreconditioner().graph


def test_singular_direct_coarse_matrix_is_refused(backend):
    """coarse='direct' with a singular coarse matrix: ValueError on CPU (LAPACK) and GPU (cuSOLVER)."""
    As, Ps = hierarchy(2, 4, 3)
    n0 = As[0].shape[0]
    A0 = sp.lil_matrix(As[0])
    A0[n0 - 1, :] = 0
    A0[:, n0 - 1] = 0
    with pytest.raises(ValueError, match="coarse"):
        MultilevelSolver.from_matrices([A0.tocsr()] + As[1:], Ps, backend=backend)


def test_fused_products_wait_for_the_second_use(backend):
    """``defer_fused_products`` (default): the first solve runs the unfused cycle and builds no
    ``R A`` / ``A P`` / ``S``; the second solve builds them and takes the fused path; both
    solves give the same iterations and, to round-off, the same solution.  ``cycle`` never
    builds them; ``aspreconditioner`` and ``build_fused_products`` build at once."""
    As, Ps = hierarchy(2, 4, 5)
    opts = dict(backend=backend, fuse_below=10 ** 9, fuse_transfers_below=10 ** 9,
                fuse_presmooth_below=10 ** 9)
    ml = MultilevelSolver.from_matrices(As, Ps, **opts)
    built = lambda: [(d.RA is not None, d.AP is not None, d.S is not None) for d in ml._dev[1:]]
    assert built() == [(False, False, False)] * (len(As) - 1)
    assert not any(d.tfused or d.sfused for d in ml._dev)
    b = backend.asarray(np.random.default_rng(3).standard_normal(As[-1].shape[0]))
    x1 = to_host(ml.solve(b, rtol=1e-10, accel="cg"))
    its1 = ml.last_iterations
    assert built() == [(False, False, False)] * (len(As) - 1)
    x2 = to_host(ml.solve(b, rtol=1e-10, accel="cg"))
    assert built() == [(True, True, True)] * (len(As) - 1)
    assert all(d.tfused and d.sfused for d in ml._dev[1:])
    assert ml.last_iterations == its1
    assert np.linalg.norm(x2 - x1) <= 1e-9 * np.linalg.norm(x1)
    # cycle(): never builds (no set-up inside a cycle); aspreconditioner /
    # build_fused_products: at once
    ml = MultilevelSolver.from_matrices(As, Ps, **opts)
    x = backend.xp.zeros_like(b)
    for _ in range(3):
        ml.cycle(b, x)
    assert not any(d.tfused or d.RA is not None for d in ml._dev)
    ml = MultilevelSolver.from_matrices(As, Ps, **opts)
    ml.aspreconditioner()
    assert all(d.tfused and d.sfused for d in ml._dev[1:])
    ml = MultilevelSolver.from_matrices(As, Ps, **opts)
    ml.build_fused_products()
    assert all(d.tfused and d.sfused for d in ml._dev[1:])
    ml = MultilevelSolver.from_matrices(As, Ps, defer_fused_products=False, **opts)
    assert built() == [(True, True, True)] * (len(As) - 1)


@pytest.mark.gpu
@pytest.mark.parametrize("dim,n0,L,pre,post,transfers,presmooth", [
    (2, 4, 5, 2, 2, True, True), (3, 2, 4, 2, 2, True, False), (2, 4, 5, 2, 1, True, False),
    (2, 4, 5, 2, 2, False, True), (2, 4, 5, 1, 3, False, True), (3, 2, 4, 3, 2, True, True)])
def test_graph_cg_solve_equals_host_driven_cg(dim, n0, L, pre, post, transfers, presmooth):
    """ml.solve(accel="cg") on the GPU (one CUDA graph per CG iteration, stopping test on the
    device) gives the iterates of the host-driven CG (callback path) to round-off: the same
    iteration count (residuals at the stop measured far from rtol: >= 3x apart per iteration
    here) and the same solution; maxiter is honoured with a ConvergenceWarning.  Both ways
    of ending an iteration: the cycle's last Jacobi sweep fused with (r, z) (even
    post-sweep counts; odd ones after the fused correction) or a separate (r, z) kernel;
    with and without the pre-smoothing fused with the restriction."""
    from adaptmg.backend import get_backend
    from adaptmg.linalg import ConvergenceWarning
    gpu = get_backend("gpu")
    As, Ps = hierarchy(dim, n0, L)
    ml = MultilevelSolver.from_matrices(As, Ps, backend=gpu, presmooth=pre, postsmooth=post,
                                        fuse_transfers_below="auto" if transfers else 0,
                                        fuse_presmooth_below=10 ** 9 if presmooth else 0)
    n = As[-1].shape[0]
    assert not ml._dev[-1].tfused            # the products wait for the second solve
    b = gpu.asarray(np.random.default_rng(7).standard_normal(n))
    its = []
    x_ref = to_host(ml.solve(b, rtol=1e-8, accel="cg", callback=its.append))
    x = to_host(ml.solve(b, rtol=1e-8, accel="cg"))
    g = ml._graph_cg("V")
    assert g is not None, ml.graph_error
    assert g.fused_last_sweep == (post % 2 == 0)
    assert ml._dev[-1].sfused == (presmooth and pre in (1, 2))
    assert ml._dev[-1].tfused == transfers
    assert g.iterations == len(its)
    assert np.linalg.norm(x - x_ref) <= 1e-9 * np.linalg.norm(x_ref)
    A = As[-1]
    bh = to_host(b)
    assert np.linalg.norm(bh - A @ x) <= 1e-8 * np.linalg.norm(bh)
    with pytest.warns(ConvergenceWarning):
        ml.solve(b, rtol=1e-8, accel="cg", maxiter=2)
    assert g.iterations == 2
    x0 = gpu.asarray(x)          # a converged start: zero iterations
    ml.solve(b, x0, rtol=1e-6, accel="cg")
    assert g.iterations == 0


@pytest.mark.gpu
def test_graph_cg_limit_is_by_stored_entries():
    """ml.solve records its CUDA-graph CG for fine matrices up to graph_cg_max_nnz entries
    (a 2-D Q1 problem of 263,169 rows, above the former 100,000-row limit, takes it on its
    second solve: above graph_cg_record_rows the first one is host-driven) and solves
    host-driven above the limit, all to the tolerance with the same iterations."""
    import adaptmg
    from adaptmg import assemble
    from adaptmg.backend import get_backend
    gpu = get_backend("gpu")
    mesh = adaptmg.Mesh.box([0.0, 0.0], [1.0, 1.0], [1, 1])
    for _ in range(9):
        mesh = mesh.refine()
    ml = adaptmg.multigrid(mesh, assemble.stiffness, backend=gpu)
    n = ml.levels[-1].n
    assert n == 513 ** 2 and ml.A.nnz <= ml.graph_cg_max_nnz
    b = gpu.asarray(np.random.default_rng(3).standard_normal(n))
    x1 = ml.solve(b, rtol=1e-8, accel="cg")
    assert ml._preconditioners.get(("graph_cg", "V")) is None     # the first: host-driven
    its_first = ml.last_iterations
    x = ml.solve(b, rtol=1e-8, accel="cg")
    g = ml._preconditioners.get(("graph_cg", "V"))
    assert g is not None, ml.graph_error
    its_graph = ml.last_iterations
    assert abs(its_graph - its_first) <= 1
    host = adaptmg.multigrid(mesh, assemble.stiffness, backend=gpu)
    host.graph_cg_max_nnz = host.A.nnz - 1
    host.solve(b, rtol=1e-8, accel="cg")
    xh = host.solve(b, rtol=1e-8, accel="cg")           # a second solve: still host-driven
    assert ("graph_cg", "V") in host._preconditioners
    assert host._preconditioners[("graph_cg", "V")] is None
    assert abs(host.last_iterations - its_graph) <= 1
    A = gpu.asmatrix(ml.A)
    for v in (x1, x, xh):
        assert float(gpu.xp.linalg.norm(b - A @ v)) <= 1e-8 * float(gpu.xp.linalg.norm(b))


def test_cycle_on_a_coarser_level_equals_the_prefix_solver(backend):
    """cycle(level=l) is the cycle of a solver built on levels[:l + 1] (full multigrid's
    per-level cycles without a second solver); the finest x, b are never preallocated."""
    As, Ps = hierarchy(2, 4, 5)
    ml = MultilevelSolver.from_matrices(As, Ps, backend=backend)
    assert ml._dev[-1].x is None and ml._dev[-1].b is None
    for l in (0, 2, 3):
        sub = MultilevelSolver(ml.levels[:l + 1], backend=backend)
        n = As[l].shape[0]
        rng = np.random.default_rng(l)
        b = backend.asarray(rng.standard_normal(n))
        x0 = rng.standard_normal(n)
        x1, x2 = backend.asarray(x0.copy()), backend.asarray(x0.copy())
        ml.cycle(b, x1, "W", level=l)
        sub.cycle(b, x2, "W")
        # the same kernels in the same order (cuSPARSE's SpMV may still sum in another order)
        np.testing.assert_allclose(to_host(x1), to_host(x2), rtol=1e-12, atol=1e-14)
    with pytest.raises(ValueError, match="level must be"):
        ml.cycle(b, x1, level=5)
    with pytest.raises(ValueError, match="must have shape"):
        ml.cycle(b, x1, level=4)


@pytest.mark.parametrize("accel", [None, "cg", "gmres", "fgmres"])
def test_last_iterations_counts_without_a_callback(backend, accel):
    """ml.last_iterations after solve() equals the number of callback calls of the same solve
    (Krylov: inner iterations), so iteration counts need no callback (which would keep the GPU
    off its CUDA-graph CG)."""
    As, Ps = hierarchy(2, 4, 5)
    ml = MultilevelSolver.from_matrices(As, Ps, backend=backend)
    b = backend.asarray(np.random.default_rng(2).standard_normal(As[-1].shape[0]))
    its = []
    ml.solve(b, rtol=1e-8, accel=accel, callback=its.append)
    counted = ml.last_iterations
    ml.solve(b, rtol=1e-8, accel=accel)
    assert ml.last_iterations == counted == len(its) > 0
