"""adaptmg.linalg against scipy.sparse.linalg, argument by argument.

SciPy's own test suite runs in test_scipy_cases.py; this module pins the
semantics that suite does not see: iterate-by-iterate agreement with SciPy
(gmres in every callback_type, with and without M and restarts; bicgstab; cg;
minres up to SciPy's looser stop), ``x0='Mb'``, ``psolve``, ``atol``
validation, the DeprecationWarning of gmres' default, fgmres' own default, the
info/warning contract of bicgstab and minres, and minres' ``shift``, ``check``
and ``show``.  Every test taking ``backend`` runs on NumPy and (``-m gpu``) CuPy.
"""
import warnings

import numpy as np
import pytest
import scipy.sparse as sp
import scipy.sparse.linalg as spla

from adaptmg.backend import to_host
from adaptmg.linalg import ConvergenceWarning, bicgstab, cg, fgmres, gmres, minres

OURS = {"cg": cg, "gmres": gmres, "fgmres": fgmres, "bicgstab": bicgstab, "minres": minres}


def laplace2d(m):
    T = sp.diags([-1.0, 2.0, -1.0], [-1, 0, 1], shape=(m, m))
    I = sp.eye(m)
    return (sp.kron(I, T) + sp.kron(T, I)).tocsr()


def convdiff2d(m, eps=0.01):
    h = 1.0 / (m + 1)
    T = sp.diags([-1.0, 2.0, -1.0], [-1, 0, 1], shape=(m, m)) * (eps / h**2)
    C = sp.diags([-1.0, 1.0], [-1, 0], shape=(m, m)) / h
    I = sp.eye(m)
    return (sp.kron(I, T + C) + sp.kron(T + 0.5 * C, I)).tocsr()


SPD, NONSYM = laplace2d(16), convdiff2d(16)
N = SPD.shape[0]
B = np.random.default_rng(0).standard_normal(N)


def jacobi(A):
    return sp.diags(1.0 / A.diagonal()).tocsr()


def relres(A, x, b, shift=0.0):
    x = to_host(x)
    return np.linalg.norm(b - A @ x + shift * x) / np.linalg.norm(b)


def history(solver, *args, **kw):
    seen = []
    x, info = solver(*args, callback=lambda v: seen.append(np.array(to_host(v), copy=True)), **kw)
    return to_host(x), info, seen


def cbt(name):
    """gmres' callback_type, given so that a callback does not warn."""
    return {"callback_type": "x"} if name == "gmres" else {}


def agree(seen, ref, backend, rtol):
    """Iterates agree with SciPy's: all of them on the host (same operations, same rounding);
    on the device the reductions round differently and a long history drifts, so the first
    ten iterates are compared there (the results are compared by their residuals)."""
    k = len(ref) if not backend.is_gpu else min(10, len(ref))
    np.testing.assert_allclose(np.array(seen[:k]), np.array(ref[:k]), rtol=rtol, atol=1e-12)


def quiet(solver, *args, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return solver(*args, **kw)


# ----------------------------------------------------------------------------- agreement
@pytest.mark.parametrize("precond", [False, True])
@pytest.mark.parametrize("callback_type", ["x", "pr_norm", "legacy"])
@pytest.mark.parametrize("restart,maxiter", [(10, 60), (300, 3), (8, 5)])
def test_gmres_runs_scipys_iteration(backend, precond, callback_type, restart, maxiter):
    # left preconditioning, SciPy's inner tolerance control, the meaning of maxiter and of
    # the callback's argument in each callback_type: the same numbers as SciPy's gmres
    M = jacobi(NONSYM) if precond else None
    kw = dict(rtol=1e-8, restart=restart, maxiter=maxiter, callback_type=callback_type)
    x, info, seen = quiet(history, gmres, backend.asmatrix(NONSYM), backend.asarray(B),
                          M=None if M is None else backend.asmatrix(M), **kw)
    xr, ir, ref = quiet(history, spla.gmres, NONSYM, B, M=M, **kw)
    assert info == ir
    assert len(seen) == len(ref)
    agree(seen, ref, backend, rtol=1e-7)
    if not backend.is_gpu:
        assert np.linalg.norm(x - xr) <= 1e-9 * np.linalg.norm(xr)
    assert (relres(NONSYM, x, B) <= 1e-8) == (info == 0)


@pytest.mark.parametrize("name,A,M", [("cg", SPD, jacobi(SPD)), ("cg", SPD, None),
                                      ("bicgstab", NONSYM, jacobi(NONSYM)),
                                      ("bicgstab", NONSYM, None)])
def test_cg_and_bicgstab_run_scipys_iteration(backend, name, A, M):
    scipy_solver = getattr(spla, name)
    x, info, seen = history(OURS[name], backend.asmatrix(A), backend.asarray(B), rtol=1e-9,
                            M=None if M is None else backend.asmatrix(M))
    xr, ir, ref = history(scipy_solver, A, B, rtol=1e-9, M=M)
    assert info == ir == 0
    assert len(seen) == len(ref) if not backend.is_gpu else abs(len(seen) - len(ref)) <= 5
    agree(seen, ref, backend, rtol=1e-8)
    assert relres(A, x, B) <= 1e-9


@pytest.mark.parametrize("shift,M", [(0.0, None), (0.0, jacobi(SPD)), (2.5, None)])
def test_minres_runs_scipys_iteration_to_the_documented_tolerance(backend, shift, M):
    # same Lanczos/QR recurrences, hence the same iterates while both run; SciPy stops on
    # ||r|| <= rtol ||A|| ||x|| (its docs: "relative residual below rtol"); adaptmg on
    # ||r|| <= rtol ||b||, checked with the true residual, so it may take more iterations
    A = SPD
    x, info, seen = history(minres, backend.asmatrix(A), backend.asarray(B), rtol=1e-8,
                            shift=shift, M=None if M is None else backend.asmatrix(M))
    xr, ir, ref = history(spla.minres, A, B, rtol=1e-8, shift=shift, M=M)
    assert info == ir == 0 and len(seen) >= len(ref) - (5 if backend.is_gpu else 0)
    agree(seen[:len(ref)], ref, backend, rtol=1e-7)
    assert relres(A, x, B, shift) <= 1e-8


# ----------------------------------------------------------------------------- arguments
@pytest.mark.parametrize("name", OURS)
def test_x0_Mb_starts_from_M_b(backend, name):
    A = NONSYM if name in ("gmres", "fgmres", "bicgstab") else SPD
    xs = spla.spsolve(A.tocsc(), B)
    M = spla.LinearOperator(A.shape, matvec=spla.splu(A.tocsc()).solve, dtype=float)
    seen = []
    x, info = OURS[name](backend.asmatrix(A), backend.asarray(B), "Mb", M=M,
                         callback=seen.append, **cbt(name))
    assert info == 0 and seen == []                  # M b is the solution: no iteration
    np.testing.assert_allclose(to_host(x), xs, rtol=1e-10)
    # without M, 'Mb' is b (SciPy's identity preconditioner)
    x, info = quiet(OURS[name], backend.asmatrix(sp.eye(N).tocsr()), backend.asarray(B), "Mb",
                    maxiter=1)
    # exact: x0 = M b = b is a copy (no arithmetic) and A = I leaves no residual to iterate on
    assert info == 0 and np.array_equal(to_host(x), B)
    with pytest.raises(ValueError, match="x0 must be an array, None or 'Mb'"):
        OURS[name](A, B, "bM")


@pytest.mark.parametrize("name", OURS)
def test_psolve_is_the_preconditioner_without_M(backend, name):
    A = NONSYM if name in ("gmres", "fgmres", "bicgstab") else SPD
    lu = spla.splu(A.tocsc())
    op = spla.aslinearoperator(A)
    calls = []
    op.psolve = lambda v: calls.append(1) or lu.solve(v)       # SciPy's convention
    x, info = OURS[name](op, backend.asarray(B), rtol=1e-10)
    assert info == 0 and relres(A, x, B) <= 1e-10
    assert 1 <= len(calls) <= 4                                # an exact preconditioner


@pytest.mark.parametrize("name", ["cg", "gmres", "fgmres", "bicgstab"])
@pytest.mark.parametrize("atol,exc", [(None, ValueError), ("legacy", ValueError),
                                      (-1.0, ValueError), (np.nan, ValueError),
                                      ([1e-5], TypeError)])
def test_atol_is_validated_as_scipy_does(name, atol, exc):
    with pytest.raises(exc, match="atol"):
        OURS[name](SPD, B, atol=atol)


@pytest.mark.parametrize("name", OURS)
def test_infinite_tolerances_succeed_at_once(backend, name):
    x0 = backend.asarray(np.ones(N))
    kws = [dict(rtol=np.inf)] + ([dict(atol=np.inf)] if name != "minres" else [])
    for kw in kws:
        seen = []
        x, info = OURS[name](backend.asmatrix(SPD), backend.asarray(B), x0, callback=seen.append,
                             **kw, **cbt(name))
        # exact: no iteration runs, so the solver returns its copy of x0 untouched
        assert info == 0 and seen == [] and np.array_equal(to_host(x), np.ones(N))


def test_gmres_default_callback_type_is_scipys_legacy_with_a_deprecation_warning():
    seen = []
    with pytest.warns(DeprecationWarning, match="called without specifying `callback_type`"):
        x, info = quiet_convergence(gmres, NONSYM, B, restart=50, maxiter=4, callback=seen.append)
    assert info == 4 and len(seen) == 4                        # maxiter counted inner iterations
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        gmres(NONSYM, B, callback_type="pr_norm", callback=seen.append)   # explicit: no warning
        gmres(NONSYM, B)                                                   # no callback: none
        fgmres(NONSYM, B, callback=seen.append)                # fgmres' default is 'pr_norm'
    with pytest.raises(ValueError, match="Unknown callback_type: 'xx'"):
        gmres(NONSYM, B, callback=seen.append, callback_type="xx")


def quiet_convergence(solver, *args, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        return solver(*args, **kw)


def test_fgmres_callback_types(backend):
    A, b = backend.asmatrix(NONSYM), backend.asarray(B)
    M = backend.asmatrix(jacobi(NONSYM))
    x, info, rk = quiet(history, fgmres, A, b, restart=10, maxiter=3, M=M)    # 'pr_norm'
    assert info == 3 and len(rk) == 30
    # the right-preconditioned monitor is the true residual: the last value is the final one
    assert abs(float(rk[-1]) - relres(NONSYM, x, B)) <= 1e-8
    x, info, xs = quiet(history, fgmres, A, b, restart=10, maxiter=3, M=M, callback_type="x")
    # exact: the last callback receives the iterate that is returned (same values, no recomputation)
    assert info == 3 and len(xs) == 3 and np.array_equal(xs[-1], to_host(x))
    x, info, rk = quiet(history, fgmres, A, b, restart=10, maxiter=3, M=M,
                        callback_type="legacy")
    assert info == 3 and len(rk) == 3                          # maxiter counts inner iterations


def test_gmres_callback_gets_the_preconditioned_residual(backend):
    # SciPy's TestGMRES.test_callback, on a larger problem: M = c I scales the monitor by c
    c = 1e-3
    ref = quiet(history, gmres, backend.asmatrix(NONSYM), backend.asarray(B), restart=5,
                maxiter=2, callback_type="pr_norm")[2]
    got = quiet(history, gmres, backend.asmatrix(NONSYM), backend.asarray(B), restart=5,
                maxiter=2, callback_type="pr_norm", M=backend.asmatrix(c * sp.eye(N)))[2]
    np.testing.assert_allclose(np.array(got), c * np.array(ref), rtol=1e-10)
    raw = []
    quiet(gmres, backend.asmatrix(NONSYM), backend.asarray(B), maxiter=1,
          callback=raw.append, callback_type="pr_norm")
    assert raw and all(type(r) is np.float64 for r in raw)    # a float with .ndim, as SciPy's


# ----------------------------------------------------------------------------- contract
@pytest.mark.parametrize("name", OURS)
def test_info_zero_iff_true_residual_passes(backend, name):
    A = NONSYM if name in ("gmres", "fgmres", "bicgstab") else SPD
    kw = {"callback_type": "pr_norm"} if name == "gmres" else {}
    for rtol in (1e-14, 1e-17):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            x, info = OURS[name](backend.asmatrix(A), backend.asarray(B), rtol=rtol, maxiter=300,
                                 **kw)
        assert (info == 0) == (relres(A, x, B) <= rtol), (rtol, info, relres(A, x, B))
        assert (info == 0) == (len(caught) == 0)
    if name == "bicgstab":      # at round-off level (rt, r) falls below SciPy's eps^2 first
        message = str(caught[0].message)
        assert (info, "did not converge" in message or "rho breakdown" in message) in \
            ((300, True), (-10, True))
    else:
        assert info == 300 and "did not converge" in str(caught[0].message)
    assert caught[0].filename == __file__                      # attributed to the caller


@pytest.mark.parametrize("name", ["bicgstab", "minres"])
def test_maxiter_exhausted_warns(backend, name):
    A = NONSYM if name == "bicgstab" else SPD
    seen = []
    with pytest.warns(ConvergenceWarning, match=r"relative residual .* after 3 iterations"):
        x, info = OURS[name](backend.asmatrix(A), backend.asarray(B), maxiter=3,
                             callback=seen.append)
    assert info == 3 and len(seen) == 3 and relres(A, x, B) > 1e-5


def test_bicgstab_breakdowns_are_scipys_codes(backend):
    # SciPy's "sym-nonpd" case: rho breakdown (info -10) after a few iterations
    A = np.block([[np.zeros((5, 5)), np.array([[1, 2, 2, 2, 1]]).T, -np.eye(5)],
                  [np.array([[1, 2, 2, 2, 1]]), np.zeros((1, 1)), np.zeros((1, 5))],
                  [-np.eye(5), np.zeros((5, 1)), -np.eye(5)]])
    b = np.zeros(11)
    b[5] = 1.0
    with pytest.warns(ConvergenceWarning, match="broke down"):
        x, info = bicgstab(backend.asarray(A), backend.asarray(b))
    xr, ir = spla.bicgstab(A, b)
    assert info == ir < 0
    assert np.all(np.isfinite(to_host(x)))
    # a zero operator: (rt, A M p) == 0 at once (info -11)
    with pytest.warns(ConvergenceWarning, match="broke down"):
        x, info = bicgstab(backend.asarray(np.zeros((4, 4))), backend.asarray(np.ones(4)))
    assert info == -11


def test_minres_indefinite_shift_check_and_show(backend, capsys):
    A = SPD
    # shift inside the spectrum: an indefinite system (A - 3 I), solved to rtol
    x, info = minres(backend.asmatrix(A), backend.asarray(B), rtol=1e-8, shift=3.0)
    assert info == 0 and relres(A, x, B, 3.0) <= 1e-8
    with pytest.raises(ValueError, match="non-symmetric matrix"):
        minres(backend.asmatrix(NONSYM), backend.asarray(B), check=True)
    with pytest.raises(ValueError, match="indefinite preconditioner"):
        minres(backend.asmatrix(A), backend.asarray(B), M=backend.asmatrix(-sp.eye(N)))
    x, info = minres(backend.asmatrix(A), backend.asarray(B), show=True)
    out = capsys.readouterr().out
    assert out.startswith("Enter minres.") and "Exit  minres." in out and info == 0
    # default maxiter is 5 n (SciPy's)
    small = laplace2d(3)
    with pytest.warns(ConvergenceWarning, match=f"after {5 * 9} iterations"):
        minres(backend.asmatrix(small), backend.asarray(np.arange(1.0, 10.0)), rtol=1e-30)
    with pytest.raises(TypeError, match="shift must be a real number"):
        minres(A, B, shift=1j)


def test_minres_singular_inconsistent_breaks_down(backend):
    # b has a component in the null space of A: no solution; SciPy returns a least-squares
    # x with info 0, adaptmg says so (info < 0, a warning) once the Krylov space is invariant
    d = np.array([0.0, 1.0, 2.0, 3.0])
    with pytest.warns(ConvergenceWarning, match="broke down"):
        x, info = minres(backend.asmatrix(sp.diags(d)), backend.asarray(np.ones(4)))
    assert info < 0
    np.testing.assert_allclose(to_host(x)[1:], 1.0 / d[1:], rtol=1e-10)   # the LS solution


@pytest.mark.parametrize("name", OURS)
def test_keyword_only_and_signature(name):
    with pytest.raises(TypeError):
        OURS[name](SPD, B, None, 1e-5)
    if name == "minres":
        import inspect
        assert list(inspect.signature(minres).parameters) == [
            "A", "b", "x0", "rtol", "shift", "maxiter", "M", "callback", "show", "check"]
