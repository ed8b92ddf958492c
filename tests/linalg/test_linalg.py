"""Tests of adaptmg.linalg: cg, gmres, fgmres against scipy.sparse.linalg.

Every test body runs on NumPy ("cpu") and, with ``-m gpu``, on CuPy ("gpu"):
the inputs are moved to the backend under test, the solution must come back on
the same backend and is compared on the host.
"""
import importlib
import itertools
import warnings

import numpy as np
import pytest
import scipy.sparse as sp
import scipy.sparse.linalg as spla

from adaptmg.backend import to_host
from adaptmg.linalg import ConvergenceWarning, cg, fgmres, gmres

SOLVERS = {"cg": cg, "gmres": gmres, "fgmres": fgmres}
SCIPY = {"cg": spla.cg, "gmres": spla.gmres, "fgmres": spla.gmres}


# ----------------------------------------------------------------------------- problems
def poisson2d(m):
    """5-point Laplacian on an m x m interior grid (SPD, n = m^2)."""
    T = sp.diags([-1.0, 2.0, -1.0], [-1, 0, 1], shape=(m, m), dtype=np.float64)
    I = sp.eye(m, dtype=np.float64)
    return (sp.kron(I, T) + sp.kron(T, I)).tocsr()


def convdiff2d(m, eps=0.01, wind=(1.0, 0.5)):
    """-eps Laplace u + w . grad u, first-order upwind on an m x m grid (nonsymmetric)."""
    h = 1.0 / (m + 1)
    D = sp.diags([-1.0, 2.0, -1.0], [-1, 0, 1], shape=(m, m), dtype=np.float64) * (eps / h**2)
    C = sp.diags([-1.0, 1.0], [-1, 0], shape=(m, m), dtype=np.float64) / h   # backward difference
    I = sp.eye(m, dtype=np.float64)
    return (sp.kron(I, D + wind[0] * C) + sp.kron(D + wind[1] * C, I)).tocsr()


PROBLEMS = {"spd": poisson2d(20), "nonsym": convdiff2d(20)}
N = 400


def rhs(seed=0, n=N):
    return np.random.default_rng(seed).standard_normal(n)


def relres(A, x, b):
    x, b = to_host(x), to_host(b)
    return np.linalg.norm(b - A @ x) / np.linalg.norm(b)


def as_form(A, form, backend):
    """A (SciPy CSR) in one of the accepted operator forms, on the backend under test."""
    if form == "sparse":
        return backend.asmatrix(A)
    if form == "dense":
        return backend.asarray(A.toarray())
    Ab = backend.asmatrix(A)
    if form == "linop":
        linalg = importlib.import_module(backend.sparse.__name__ + ".linalg")
        return linalg.LinearOperator(A.shape, matvec=lambda x: Ab @ x, dtype=A.dtype)
    if form == "callable":
        return lambda x: Ab @ x
    if form == "matvec":
        class Op:                       # duck type: only a matvec method, no shape
            def matvec(self, x):
                return Ab @ x
        return Op()
    raise AssertionError(form)


def counter():
    calls = []
    return calls, (lambda arg: calls.append(arg))


def on_backend(x, backend):
    return isinstance(x, backend.xp.ndarray)


CASES = [(s, p) for s in SOLVERS for p in PROBLEMS if not (s == "cg" and p == "nonsym")]
ORTHO = ("mgs", "cgs2")
# every (f)gmres case with both Gram-Schmidt variants; cg once (it has no such option)
CASES_O = [(s, p, o) for s, p in CASES for o in (ORTHO if s != "cg" else ("-",))]


def okw(solver, ortho):
    """The orthogonalization keyword for (f)gmres, nothing for cg."""
    return {} if solver == "cg" else {"orthogonalization": ortho}


def cbkw(solver):
    """(f)gmres: a callback once per inner iteration, maxiter counting restart cycles
    (gmres' default is SciPy's deprecated 'legacy', which makes maxiter count inner
    iterations and warns)."""
    return {} if solver == "cg" else {"callback_type": "pr_norm"}


# ----------------------------------------------------------------------------- agreement
@pytest.mark.parametrize("form", ["sparse", "dense", "linop", "callable", "matvec"])
@pytest.mark.parametrize("solver,problem,ortho", CASES_O)
def test_agrees_with_scipy(backend, solver, problem, form, ortho):
    A, b, rtol = PROBLEMS[problem], rhs(1), 1e-10
    x, info = SOLVERS[solver](as_form(A, form, backend), backend.asarray(b), rtol=rtol,
                              restart=30, maxiter=500, **okw(solver, ortho)) if solver != "cg" else \
        cg(as_form(A, form, backend), backend.asarray(b), rtol=rtol, maxiter=500)
    xref, iref = SCIPY[solver](A, b, rtol=rtol, maxiter=500,
                               **({} if solver == "cg" else {"restart": 30}))
    assert iref == 0 and info == 0
    assert on_backend(x, backend) and x.shape == (N,)
    assert relres(A, x, b) <= rtol
    # both residuals <= 1e-10 ||b||; cond(A) ~ 2e2 (spd) / ~1e3 (nonsym)
    assert np.linalg.norm(to_host(x) - xref) <= 1e-6 * np.linalg.norm(xref)


@pytest.mark.parametrize("solver,problem", CASES)
def test_default_tolerance_and_x0_untouched(backend, solver, problem):
    A = PROBLEMS[problem]
    b = rhs(2)
    x0 = backend.asarray(rhs(3))
    x0_before = to_host(x0).copy()
    x, info = SOLVERS[solver](backend.asmatrix(A), backend.asarray(b), x0)
    assert info == 0
    assert x is not x0
    np.testing.assert_array_equal(to_host(x0), x0_before)
    assert relres(A, x, b) <= 1e-5
    # the starting guess matters: x0 = exact solution returns immediately, unchanged
    xs = spla.spsolve(A.tocsc(), b)
    calls, cb = counter()
    x, info = SOLVERS[solver](backend.asmatrix(A), backend.asarray(b), backend.asarray(xs),
                              callback=cb, **cbkw(solver))
    assert info == 0 and calls == []
    np.testing.assert_allclose(to_host(x), xs, rtol=0, atol=0)


@pytest.mark.parametrize("solver", SOLVERS)
def test_zero_rhs(backend, solver):
    A = backend.asmatrix(PROBLEMS["spd"])
    b = backend.xp.zeros(N)
    with warnings.catch_warnings():
        warnings.simplefilter("error")          # no ConvergenceWarning, no 0/0
        x, info = SOLVERS[solver](A, b)
        assert info == 0 and on_backend(x, backend)
        assert float(abs(x).max()) == 0.0
        x0 = backend.asarray(rhs(4))
        x, info = SOLVERS[solver](A, b, x0)      # x0 != 0 does not satisfy A x = 0
        assert info == 0 and float(abs(x).max()) == 0.0


@pytest.mark.parametrize("solver,problem", CASES)
def test_exact_preconditioner_converges_at_once(backend, solver, problem):
    A, b = PROBLEMS[problem], rhs(5)
    lu = spla.splu(A.tocsc())
    M = spla.LinearOperator(A.shape, matvec=lu.solve, dtype=A.dtype)   # lives on the host
    calls, cb = counter()
    x, info = SOLVERS[solver](backend.asmatrix(A), backend.asarray(b), rtol=1e-10, M=M,
                              callback=cb, **cbkw(solver))
    assert info == 0 and on_backend(x, backend)
    assert 1 <= len(calls) <= 3
    assert relres(A, x, b) <= 1e-10


@pytest.mark.parametrize("solver,problem,ortho", CASES_O)
def test_maxiter_exhausted(backend, solver, problem, ortho):
    A, b = PROBLEMS[problem], rhs(6)
    calls, cb = counter()
    if solver == "cg":
        with pytest.warns(ConvergenceWarning, match=r"relative residual .* after 3 iterations"):
            x, info = cg(backend.asmatrix(A), backend.asarray(b), maxiter=3, callback=cb)
        assert info == 3 and len(calls) == 3
    else:
        msg = r"relative residual .* after 2 restart cycles \(10 iterations"
        with pytest.warns(ConvergenceWarning, match=msg):
            x, info = SOLVERS[solver](backend.asmatrix(A), backend.asarray(b), restart=5,
                                      maxiter=2, callback=cb, **okw(solver, ortho),
                                      **cbkw(solver))
        assert info == 2 and len(calls) == 10
        # scipy's gmres does exactly the same iterations
        xref, iref = spla.gmres(A, b, restart=5, maxiter=2)
        assert iref == 2
        np.testing.assert_allclose(to_host(x), xref, rtol=1e-8, atol=1e-12)
    assert relres(A, x, b) > 1e-5


@pytest.mark.parametrize("ortho", ORTHO)
@pytest.mark.parametrize("solver", ["gmres", "fgmres"])
def test_callback_is_relative_residual(backend, solver, ortho):
    A, b = PROBLEMS["nonsym"], rhs(7)
    calls, cb = counter()
    x, info = SOLVERS[solver](backend.asmatrix(A), backend.asarray(b), rtol=1e-8,
                              restart=200, callback=cb, orthogonalization=ortho,
                              **cbkw(solver))
    assert info == 0
    hist = np.array(calls, dtype=float)
    assert np.all(np.diff(hist) <= 1e-12)                 # GMRES: monotone in one cycle
    assert hist[-1] <= 1e-8 < hist[-2]
    assert abs(hist[-1] - relres(A, x, b)) <= 1e-9        # monitor = true residual


def test_cg_callback_gets_iterate(backend):
    A, b = PROBLEMS["spd"], rhs(8)
    seen = []
    x, info = cg(backend.asmatrix(A), backend.asarray(b),
                 callback=lambda xk: seen.append((on_backend(xk, backend), xk.shape)))
    assert info == 0 and len(seen) > 5 and set(seen) == {(True, (N,))}
    ref = []
    spla.cg(A, b, callback=lambda xk: ref.append(1))
    # same iteration count as scipy: exact although the two differ in rounding, because the
    # stopping residuals sit far from rtol (about 1.17 and 0.79 rtol), not within round-off
    assert len(seen) == len(ref)


def test_gmres_happy_breakdown(backend):
    # 3 distinct eigenvalues: the Krylov space is invariant after 3 steps
    d = np.repeat([1.0, 2.0, 5.0], [150, 150, 100])
    A = sp.diags(d).tocsr()
    b = rhs(9)
    for solver in ("gmres", "fgmres", "cg"):
        calls, cb = counter()
        x, info = SOLVERS[solver](backend.asmatrix(A), backend.asarray(b), rtol=1e-14,
                                  callback=cb, **cbkw(solver))
        assert info == 0 and len(calls) == 3, solver     # step-3 residual <= 4e-16, far below 1e-14
        np.testing.assert_allclose(to_host(x), b / d, rtol=1e-12)
    e = np.zeros(N)
    e[0] = 3.0                                            # an eigenvector: one step
    calls, cb = counter()
    x, info = gmres(backend.asmatrix(A), backend.asarray(e), rtol=0.0, callback=cb,
                    callback_type="pr_norm")
    assert info == 0 and len(calls) == 1 and float(x[0]) == 3.0


def test_fgmres_with_variable_preconditioner(backend):
    A, b, rtol = PROBLEMS["spd"], rhs(10), 1e-8
    Ab = backend.asmatrix(A)

    def make_M():
        counts = itertools.cycle([2, 4, 6, 8, 10])        # a different inner CG each call

        def M(v):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", ConvergenceWarning)
                return cg(Ab, v, rtol=1e-14, maxiter=next(counts))[0]
        return M

    calls_f, cb_f = counter()
    x, info = fgmres(Ab, backend.asarray(b), rtol=rtol, restart=20, maxiter=5, M=make_M(),
                     callback=cb_f)
    assert info == 0 and relres(A, x, b) <= rtol
    assert len(calls_f) <= 25

    calls_g, cb_g = counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        xg, info_g = gmres(Ab, backend.asarray(b), rtol=rtol, restart=20, maxiter=5, M=make_M(),
                           callback=cb_g, callback_type="pr_norm")
    assert info_g != 0 or len(calls_g) >= len(calls_f)   # plain gmres is not better
    # whatever gmres' recurrence said, info == 0 iff the true residual passes
    assert (info_g == 0) == (relres(A, xg, b) <= rtol)


def test_recurrence_residual_is_not_trusted(backend):
    # with a varying M, plain gmres' monitor drops below rtol although the
    # iterate it builds does not: info must not be 0 then
    A, b, rtol = PROBLEMS["nonsym"], rhs(11), 1e-8
    Ab = backend.asmatrix(A)
    counts = itertools.cycle([2, 4, 6, 8, 10])

    def M(v):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            return gmres(Ab, v, rtol=1e-14, restart=next(counts), maxiter=1)[0]

    calls, cb = counter()
    with pytest.warns(ConvergenceWarning, match="did not converge"):
        x, info = gmres(Ab, backend.asarray(b), rtol=rtol, restart=20, maxiter=3, M=M,
                        callback=cb, callback_type="pr_norm")
    assert min(calls) <= rtol
    assert info == 3 and relres(A, x, b) > rtol


@pytest.mark.parametrize("solver,problem,ortho", CASES_O)
def test_info_zero_iff_true_residual_passes(backend, solver, problem, ortho):
    # Near machine precision the recurrence residual keeps shrinking while the true
    # residual stagnates (scipy's cg returns info 0 at rtol=1e-15 with a true
    # relative residual ~5e-15 here): info == 0 must mean the true residual passed.
    A, b = PROBLEMS[problem], rhs(20)
    kw = dict(maxiter=400) if solver == "cg" else dict(restart=20, maxiter=20)
    for rtol in (1e-15, 1e-17):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            x, info = SOLVERS[solver](backend.asmatrix(A), backend.asarray(b), rtol=rtol, **kw,
                                      **okw(solver, ortho))
        assert info >= 0
        assert (info == 0) == (relres(A, x, b) <= rtol), (rtol, info, relres(A, x, b))
        assert (info == 0) == (len(caught) == 0)
    assert info == kw["maxiter"]                       # 1e-17 is out of reach
    assert "did not converge" in str(caught[0].message)


@pytest.mark.parametrize("solver", SOLVERS)
def test_singular_operator_breaks_down(backend, solver):
    idx = np.arange(N)                  # explicit zeros: an empty CSR is a corner case of cuSPARSE
    Z = backend.asmatrix(sp.csr_matrix((np.zeros(N), (idx, idx)), shape=(N, N)))
    with pytest.warns(ConvergenceWarning, match="broke down"):
        x, info = SOLVERS[solver](Z, backend.asarray(rhs(12)))
    assert info < 0
    assert np.all(np.isfinite(to_host(x)))


@pytest.mark.parametrize("solver", SOLVERS)
def test_column_rhs_float32_and_lists(backend, solver):
    A, b = PROBLEMS["spd"], rhs(13)
    x, info = SOLVERS[solver](backend.asmatrix(A), backend.asarray(b).reshape(N, 1))
    assert info == 0 and x.shape == (N,) and relres(A, x, b) <= 1e-5
    x, info = SOLVERS[solver](backend.asmatrix(A.astype(np.float32)),
                              backend.asarray(b.astype(np.float32)), rtol=1e-4)
    assert info == 0 and x.dtype == np.float32 and relres(A, x, b) <= 2e-4
    # integer b is promoted to float64 (like scipy)
    x, info = SOLVERS[solver](backend.asmatrix(A), backend.asarray(np.arange(N)))
    assert info == 0 and x.dtype == np.float64


@pytest.mark.parametrize("solver,ortho", [("cg", "-")] + [(s, o) for s in ("gmres", "fgmres")
                                                            for o in ORTHO])
def test_complex_system(backend, solver, ortho):
    if solver == "cg":      # Hermitian positive definite: Laplacian + i * (K - K^T)
        K = sp.diags([1.0], [1], shape=(N, N))
        A = (PROBLEMS["spd"] + 0.5j * (K - K.T)).tocsr()
    else:
        A = (PROBLEMS["nonsym"] + 2j * sp.eye(N)).tocsr()
    b = rhs(14) + 1j * rhs(15)
    x, info = SOLVERS[solver](backend.asmatrix(A), backend.asarray(b), rtol=1e-10,
                              **okw(solver, ortho))
    xref, _ = SCIPY[solver](A, b, rtol=1e-10)
    assert info == 0 and x.dtype == np.complex128
    assert relres(A, x, b) <= 1e-10
    assert np.linalg.norm(to_host(x) - xref) <= 1e-7 * np.linalg.norm(xref)


def _orthogonality_loss(backend, A, b, m, ortho):
    """max |I - V^H V| of the basis v_1..v_m of one GMRES(m) cycle (rtol = 0: no early exit).

    Without x0 and M, gmres applies A to v_1, ..., v_m in this order (then once to the
    update, for the true residual), so A records the basis."""
    seen = []
    Ab = backend.asarray(A)

    def A_recording(v):
        seen.append(to_host(v).copy())
        return Ab @ v
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        gmres(A_recording, backend.asarray(b), rtol=0.0, restart=m, maxiter=1,
              orthogonalization=ortho)
    V = np.array(seen[:m])
    return np.abs(np.eye(len(V)) - V.conj() @ V.T).max(), len(V)


def test_cgs2_basis_is_orthonormal_where_one_pass_is_not(backend):
    # eigenvalues clustered in [1, 1.01]: GMRES converges to round-off within a few
    # steps, after which w = A v_j lies almost in span(V_j) and one Gram-Schmidt pass
    # cancels catastrophically.  Single-pass CGS (reference below, host) and MGS lose
    # orthogonality completely here (MGS: loss ~ eps * cond of the Krylov matrix);
    # the second CGS pass keeps the basis orthonormal to working precision.
    n, k = N, 12
    rng = np.random.default_rng(30)
    Q, _ = np.linalg.qr(rng.standard_normal((n, n)))
    A = (Q * (1.0 + 0.01 * np.linspace(0.0, 1.0, n))) @ Q.T
    b = rng.standard_normal(n)
    loss, m = _orthogonality_loss(backend, A, b, k, "cgs2")
    assert m == k and loss <= 1e-13, loss
    V = np.zeros((k, n))
    V[0] = b / np.linalg.norm(b)
    for j in range(k - 1):
        w = A @ V[j]
        w -= V[:j + 1].T @ (V[:j + 1] @ w)
        V[j + 1] = w / np.linalg.norm(w)
    assert np.abs(np.eye(k) - V @ V.T).max() > 0.1            # the case is a hard one


@pytest.mark.parametrize("solver", ["gmres", "fgmres"])
@pytest.mark.parametrize("problem", PROBLEMS)
def test_cgs2_matches_mgs_iteration_by_iteration(backend, solver, problem):
    # same Krylov spaces, same Hessenberg matrices up to round-off: the residual
    # histories (one value per inner iteration, across restarts) and iterates agree
    A, b = PROBLEMS[problem], rhs(21)
    Ab, bb = backend.asmatrix(A), backend.asarray(b)
    Md = backend.asmatrix(sp.diags(1.0 / A.diagonal()).tocsr())     # Jacobi, on the backend
    out = {}
    for ortho in ORTHO:
        calls, cb = counter()
        x, info = SOLVERS[solver](Ab, bb, rtol=1e-10, restart=15, maxiter=100, M=Md,
                                  callback=cb, orthogonalization=ortho, **cbkw(solver))
        assert info == 0 and on_backend(x, backend)
        out[ortho] = (np.array(calls), to_host(x))
    (hm, xm), (hc, xc) = out["mgs"], out["cgs2"]
    # restarts were involved; equal counts although MGS and CGS2 round differently: the last two
    # residuals are about 1.07-1.18 and 0.87-0.89 rtol, far outside their < 1e-6 relative gap
    assert len(hm) == len(hc) > 15
    np.testing.assert_allclose(hc, hm, rtol=1e-6, atol=1e-13)
    assert np.linalg.norm(xc - xm) <= 1e-8 * np.linalg.norm(xm)


@pytest.mark.parametrize("solver", ["gmres", "fgmres"])
@pytest.mark.parametrize("value,exc", [("cgs", ValueError), ("MGS", ValueError),
                                       (None, TypeError), (2, TypeError)])
def test_bad_orthogonalization(solver, value, exc):
    with pytest.raises(exc, match="orthogonalization must be one of"):
        SOLVERS[solver](PROBLEMS["spd"], rhs(19), orthogonalization=value)
    with pytest.raises(TypeError):                      # keyword-only
        SOLVERS[solver](PROBLEMS["spd"], rhs(19), None, 1e-5, 0.0, 20, None, None, None, "cgs2")


@pytest.mark.gpu
@pytest.mark.parametrize("solver", SOLVERS)
def test_result_follows_b_across_backends(solver):
    from adaptmg.backend import get_backend
    gpu = get_backend("gpu")
    A, b = PROBLEMS["spd"], rhs(16)
    x, info = SOLVERS[solver](A, gpu.asarray(b))                 # scipy A, cupy b
    assert info == 0 and isinstance(x, gpu.xp.ndarray)
    x, info = SOLVERS[solver](gpu.asmatrix(A), b, M=gpu.asmatrix(sp.eye(N)))  # cupyx A, numpy b
    assert info == 0 and isinstance(x, np.ndarray) and relres(A, x, b) <= 1e-5


# ----------------------------------------------------------------------------- bad input
def _bad_cases():
    A, b = PROBLEMS["spd"], rhs(17)
    bad_b = b.copy()
    bad_b[5] = np.nan
    bad_x0 = np.zeros(N)
    bad_x0[7] = np.inf
    # NaN in x0 where A x0 does not see it (a zero column): still reported, not carried into x
    A_zero_col = A.tolil()
    A_zero_col[:, 9] = 0
    A_zero_col[9, 9] = 0
    A_zero_col = A_zero_col.tocsr()
    A_zero_col.eliminate_zeros()
    nan_x0 = np.zeros(N)
    nan_x0[9] = np.nan
    return [
        ("x0-nan-unseen", dict(A=A_zero_col, x0=nan_x0), ValueError, r"x0 contains NaN or Inf"),
        ("nonsquare", dict(A=A[:, :-1]), ValueError, r"A must be square.*\(400, 399\)"),
        ("dense-3d", dict(A=np.zeros((2, 2, 2))), ValueError, r"A must be a 2-D"),
        ("b-length", dict(b=b[:-1]), ValueError, r"b has shape \(399,\).*\(400,\)"),
        ("b-2d", dict(b=np.ones((N, 2))), ValueError, r"b has shape \(400, 2\)"),
        ("b-nan", dict(b=bad_b), ValueError, r"b contains NaN or Inf"),
        ("x0-inf", dict(x0=bad_x0), ValueError, r"x0 contains NaN or Inf"),
        ("x0-length", dict(x0=np.zeros(3)), ValueError, r"x0 must have shape \(400,\)"),
        ("rtol-negative", dict(rtol=-1e-5), ValueError, r"rtol .*-1e-05"),
        ("atol-nan", dict(atol=np.nan), ValueError, r"atol .*nan"),
        ("rtol-string", dict(rtol="1e-5"), TypeError, r"rtol must be a real number"),
        ("maxiter-zero", dict(maxiter=0), ValueError, r"maxiter must be a positive integer"),
        ("maxiter-float", dict(maxiter=2.5), TypeError, r"maxiter must be a positive integer"),
        ("A-string", dict(A="matrix"), TypeError, r"A must be a sparse or dense matrix.*str"),
        ("A-object-dtype", dict(A=np.empty((N, N), dtype=object)), TypeError,
         r"A must have a numeric dtype"),
        ("b-strings", dict(b=np.array(["a"] * N)), TypeError, r"b must have a numeric dtype"),
        ("M-shape", dict(M=sp.eye(N - 1)), ValueError, r"M has shape \(399, 399\)"),
        ("M-string", dict(M="jacobi"), TypeError, r"M must be"),
        ("callback", dict(callback=3), TypeError, r"callback must be callable"),
        ("A-wrong-output", dict(A=lambda x: x[:-1]), ValueError,
         r"A returned an array of shape \(399,\)"),
    ]


BAD = _bad_cases()


@pytest.mark.parametrize("solver", SOLVERS)
@pytest.mark.parametrize("case", BAD, ids=[c[0] for c in BAD])
def test_bad_input(solver, case):
    _, change, exc, msg = case
    args = dict(A=PROBLEMS["spd"], b=rhs(17), x0=None)
    args.update(change)
    A, b, x0 = args.pop("A"), args.pop("b"), args.pop("x0")
    with pytest.raises(exc, match=msg):
        SOLVERS[solver](A, b, x0, **args)


@pytest.mark.parametrize("solver", ["gmres", "fgmres"])
@pytest.mark.parametrize("restart,exc", [(0, ValueError), (-3, ValueError), (1.5, TypeError),
                                         (True, TypeError)])
def test_bad_restart(solver, restart, exc):
    with pytest.raises(exc, match="restart must be a positive integer"):
        SOLVERS[solver](PROBLEMS["spd"], rhs(18), restart=restart)
