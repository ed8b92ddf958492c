"""adaptmg.linalg.refine: mixed-precision iterative refinement around a float32 inner solver."""
import warnings

import numpy as np
import pyamg
import pytest

from adaptmg.linalg import ConvergenceWarning, cg, refine


def _system(n=40):
    A = pyamg.gallery.poisson((n, n), format="csr")
    b = np.random.default_rng(1).standard_normal(A.shape[0])
    return A, b


def _float32_cg(A):
    A32 = A.astype(np.float32)

    def inner(r, tau, maxiter):
        its = [0]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            d, _ = cg(A32, r.astype(np.float32), rtol=tau, maxiter=maxiter,
                      callback=lambda _: its.__setitem__(0, its[0] + 1))
        return d, its[0]
    return inner


def test_refine_reaches_tolerance_below_float32():
    A, b = _system()
    with pytest.warns(ConvergenceWarning):
        x32, info = cg(A.astype(np.float32), b.astype(np.float32), rtol=1e-11, maxiter=400)
    assert info > 0
    steps = []
    x, info, its, nsteps = refine(A, b, inner=_float32_cg(A), rtol=1e-11, inner_rtol=1e-2,
                                  callback=lambda xk: steps.append(np.linalg.norm(b - A @ xk)))
    assert info == 0 and x.dtype == np.float64
    assert np.linalg.norm(b - A @ x) <= 1e-11 * np.linalg.norm(b)
    # each step ~1e-2 (or the last, adaptive, only as far as needed): 11 decades in 5-7 steps
    assert nsteps == len(steps) and 5 <= nsteps <= 7, steps
    assert all(s1 < 0.05 * s0 for s0, s1 in zip(steps[:-1], steps[1:-1])), steps
    assert 0.02 * steps[-2] < steps[-1] <= 1e-11 * np.linalg.norm(b), steps   # the last: tau > 1e-2
    cold = refine(A, b, inner=_float32_cg(A), rtol=1e-11)             # inner_rtol 1e-3
    warm = refine(A, b, x + 1e-6, inner=_float32_cg(A), rtol=1e-11)    # starts ~6 decades lower
    assert cold[1] == warm[1] == 0 and warm[3] <= cold[3] - 1 and warm[2] < cold[2], (cold[2:], warm[2:])


def test_refine_failures_warn_and_set_info():
    A, b = _system(10)
    with pytest.warns(ConvergenceWarning, match="maxiter"):
        x, info, its, steps = refine(A, b, inner=_float32_cg(A), rtol=1e-12, maxiter=5)
    assert info == its == 5
    with pytest.warns(ConvergenceWarning, match="reduced the residual by less"):
        x, info, its, steps = refine(A, b, inner=lambda r, tau, m: (0 * r, 1), rtol=1e-8)
    assert info > 0 and steps == 2
    with pytest.warns(ConvergenceWarning, match="NaN"):
        x, info, its, steps = refine(A, b, inner=lambda r, tau, m: (np.nan * r, 1), rtol=1e-8)
    assert info < 0
    x, info, its, steps = refine(A, 0 * b, inner=_float32_cg(A))
    assert info == its == steps == 0 and not x.any()


def test_refine_bad_input():
    A, b = _system(4)
    with pytest.raises(TypeError, match="inner must be a callable"):
        refine(A, b, inner=None)
    with pytest.raises(ValueError, match="inner_rtol must lie in"):
        refine(A, b, inner=_float32_cg(A), inner_rtol=0.0)
    with pytest.raises(ValueError, match="shape"):
        refine(A, b[:-1], inner=_float32_cg(A))
