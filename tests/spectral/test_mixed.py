"""Mixed-precision iterative refinement of the spectral problems (SpectralProblem.solve with
``inner_dtype``): float32 PCG inside, float64 residual outside, reaches tolerances that plain
float32 PCG cannot."""
import warnings

import numpy as np
import pytest

from adaptmg.linalg import ConvergenceWarning
from adaptmg.spectral import SpectralProblem, SpectralSpace, poisson
from adaptmg.spectral.space import array_nbytes

from .helpers import distorted_box
from .test_solve import exact3, rhs3


@pytest.fixture(scope="module")
def problem():
    V = SpectralSpace(distorted_box(3, 3, seed=1), 3)
    p = SpectralProblem(V, backend="cpu")
    b = p.free * np.random.default_rng(0).standard_normal(V.num_dofs)
    return p, b


def _relres(p, b, x):
    return np.linalg.norm(b - p.matvec(np.asarray(x, dtype=np.float64))) / np.linalg.norm(b)


def test_refinement_reaches_what_float32_cannot(problem):
    p, b = problem
    x64, its64, info64 = p.solve(b, rtol=1e-10)
    assert info64 == 0
    # plain float32 PCG stagnates at its attainable accuracy, ~1e-7 (measured 1.3e-7 after 150)
    p32 = p.astype(np.float32)
    with pytest.warns(ConvergenceWarning, match="did not converge"):
        x32, its32, info32 = p32.solve(b.astype(np.float32), rtol=1e-9, maxiter=150)
    assert info32 > 0 and its32 == 150 and _relres(p, b, x32) > 1e-8
    # refinement: float32 operator and two-scale preconditioner inside, float64 residual
    x, its, info = p.solve(b, rtol=1e-10, inner_dtype=np.float32, inner_rtol=1e-3)
    assert info == 0 and x.dtype == np.float64
    assert p.solve(b.astype(np.float32), rtol=1e-10, inner_dtype=np.float32)[0].dtype == np.float64
    assert _relres(p, b, x) <= 1e-10
    assert np.abs(x - x64).max() <= 1e-8 * np.abs(x64).max()
    # 1e-10 in steps of ~1e-3: 4 steps; the inner iterations about those of one float64 solve
    # (measured 17 in 4 steps against 16)
    assert 3 <= p.last_outer_steps <= 5, p.last_outer_steps
    assert its64 - 2 <= its <= its64 + 2 * p.last_outer_steps, (its, its64)
    # a looser inner tolerance: more outer steps, still converged
    x, its, info = p.solve(b, rtol=1e-10, inner_dtype=np.float32, inner_rtol=1e-1)
    assert info == 0 and p.last_outer_steps >= 8 and _relres(p, b, x) <= 1e-10
    # the inner float32 problem is kept and counted, the index structures it shares once
    low = p.inner(np.float32)
    assert p.inner("float32") is low and low.dtype == np.float32 and low.op.cell_dofs is p.op.cell_dofs
    n64 = array_nbytes(*p._arrays()) + 6 * 8 * b.size             # the float64 problem alone
    assert n64 + 0.9 * low.op.G.nbytes < p.nbytes() < n64 + low.nbytes(), (n64, p.nbytes(), low.nbytes())
    assert 1.2 < p.nbytes() / n64 < 1.8, p.nbytes() / n64


def test_refinement_not_converged_warns_and_sets_info(problem):
    p, b = problem
    with pytest.warns(ConvergenceWarning, match="refine did not converge.*maxiter"):
        x, its, info = p.solve(b, rtol=1e-10, inner_dtype=np.float32, maxiter=6)
    assert info > 0 and its <= 6 and _relres(p, b, x) > 1e-10
    # a tolerance below float64's own attainable accuracy: the outer steps stagnate and say so
    # long before maxiter
    with pytest.warns(ConvergenceWarning, match="reduced the residual by less"):
        x, its, info = p.solve(b, rtol=1e-18, inner_dtype=np.float32, maxiter=400)
    assert 0 < info < 100 and info == its and _relres(p, b, x) < 1e-13


def test_refinement_bad_input(problem):
    p, b = problem
    with pytest.raises(ValueError, match="inner_dtype"):
        p.solve(b, inner_dtype=np.int32)
    with pytest.raises(ValueError, match="inner_dtype"):
        p.astype(np.float32).solve(b.astype(np.float32), inner_dtype=np.float64)
    with pytest.raises(ValueError, match="inner_rtol"):
        p.solve(b, inner_dtype=np.float32, inner_rtol=1.0)


def test_poisson_mixed_matches_float64():
    mesh = distorted_box(3, 3)
    a = poisson(mesh, 4, rhs3, g=exact3, rtol=1e-10, backend="cpu")
    m = poisson(mesh, 4, rhs3, g=exact3, rtol=1e-10, backend="cpu", inner_dtype=np.float32)
    assert m.info == 0 and m.u.dtype == np.float64 and a.outer_steps == 1 and 3 <= m.outer_steps <= 5
    assert np.abs(m.u - a.u).max() <= 1e-8 * np.abs(a.u).max()
    assert abs(m.l2_error(exact3) - a.l2_error(exact3)) <= 1e-9


@pytest.mark.gpu
def test_gpu_refinement_matches_cpu():
    mesh = distorted_box(3, 4)
    c = poisson(mesh, 3, rhs3, g=exact3, rtol=1e-10, backend="cpu")
    g = poisson(mesh, 3, rhs3, g=exact3, rtol=1e-10, backend="gpu", inner_dtype=np.float32)
    assert g.info == 0 and g.u.dtype == np.float64
    assert abs(g.iterations - c.iterations) <= 6, (g.iterations, c.iterations)
    assert np.abs(g.u.get() - c.u).max() <= 1e-8 * np.abs(c.u).max()
