"""Seed 000's iteration tables (Tables 1-3) on the small levels the CPU runs quickly.

The tables' problem (``seed_table_iterations``): -Laplace u = 1 on the unit square/cube,
right-hand side *vector* of ones (the seed code's ``rhs = 1.``), full multigrid
(Algorithm 2.2) with V(1,1) cycles, steps = repetitions of the while loop (at least
one) until ||b - A x|| <= 1e-9 ||b||.  Level L = 2**L cells per direction.

Measured (CPU, see adaptmg/patch/NOTES.md), paper in brackets:
  2D L=4, default           5 3 2 2 2 2 1 1   (9 5 3 3 3 2 2 2)
  2D L=4, variant seed-code 8 4 3 2 2 2 2 1
  3D L=3, default           5 5 3 3 3 2 2 2   (6 5 3 3 3 3 2 2)
  3D L=4, default           6 5 3 3
  3D point Gauss-Seidel     L=2: 4 7 9 11 19 19 28 29, L=3: 5 8 10 11 19 19, L=4: 6 8 11 12
                                                    (6 8 11 13 19 20 27 30)
"""
import numpy as np
import pytest

from adaptmg.backend import get_backend
from adaptmg.patch import CartesianSpace, FastDiagSolver, LaplaceOperator, PatchMultigrid
from adaptmg.patch import PatchSmoother, prolongation, restriction
from adaptmg.patch.solver import seed_table_iterations

TABLE1 = {1: 9, 2: 5, 3: 3, 4: 3, 5: 3, 6: 2, 7: 2, 8: 2}          # 2D, L = 4 (Q1: 7 at L = 11)
TABLE2 = {1: 6, 2: 5, 3: 3, 4: 3, 5: 3, 6: 3, 7: 2, 8: 2}          # 3D, L = 4..7
TABLE3_GS = {1: 6, 2: 8, 3: 11, 4: 13, 5: 19, 6: 20, 7: 27, 8: 30}  # 3D point Gauss-Seidel


def _row(dim, level, ks, **opts):
    out = {}
    for k in ks:
        it, info = seed_table_iterations(dim, k, level, **opts)
        assert info["converged"] and info["residuals"][-1] <= 1e-9, (dim, k, level, info)
        out[k] = it
    return out


def test_table1_2d_seed_code_variant_within_one():
    # the seed code's cycle (x <- x + (b - A x) + P x_c) reproduces Table 1 for every degree
    its = _row(2, 4, range(1, 9), variant="seed-code")
    assert its == {1: 8, 2: 4, 3: 3, 4: 2, 5: 2, 6: 2, 7: 2, 8: 1}, its
    assert all(abs(its[k] - TABLE1[k]) <= 1 for k in its), its
    its5 = _row(2, 5, (1, 2, 3, 4), variant="seed-code")
    assert all(abs(its5[k] - TABLE1[k]) <= 1 for k in its5), its5


def test_table1_2d_default_algorithm():
    # Algorithm 2.1 as printed: within one step of Table 1 from Q3 on; Q1 and Q2 need fewer
    # steps than the published counts (5 vs 9, 3 vs 5), whose cycle added the fine residual
    its = _row(2, 4, range(1, 9))
    assert its == {1: 5, 2: 3, 3: 2, 4: 2, 5: 2, 6: 2, 7: 1, 8: 1}, its
    assert all(abs(its[k] - TABLE1[k]) <= 1 for k in range(3, 9)), its
    assert its[1] < TABLE1[1] - 1 and its[2] < TABLE1[2] - 1


def test_table2_3d_within_one():
    its = _row(3, 3, (1, 2, 3, 4))
    assert its == {1: 5, 2: 5, 3: 3, 4: 3}, its
    assert all(abs(its[k] - TABLE2[k]) <= 1 for k in its), its
    its4 = _row(3, 4, (1, 2))
    assert its4 == {1: 6, 2: 5}, its4                   # = Table 2
    # in 3D the level matrices scale like h, so the seed code's extra residual term hardly matters
    assert _row(3, 3, (1, 2, 3), variant="seed-code") == {1: 5, 2: 5, 3: 3}


def test_table3_point_gauss_seidel_row():
    # forward multicolour point Gauss-Seidel (pre and post) on assembled CSR level matrices.
    # Measured 5 8 10 (L=3) and 6 8 (L=4); the greedy colouring's node order moves a count
    # by one step at most (colouring seeds 0-3: L=4 Q1 5 or 6), so only +-1 is asserted.
    its3 = _row(3, 3, (2, 3), smoother="point_gs")
    its4 = _row(3, 4, (1, 2), smoother="point_gs")
    for its in (its3, its4):
        assert all(abs(its[k] - TABLE3_GS[k]) <= 1 for k in its), (its3, its4)
    # the vertex-patch smoother needs fewer steps from Q2 on (Table 3's point)
    patch = _row(3, 3, (2, 3))
    assert patch[2] < its3[2] and patch[3] <= its3[3] - 5, (patch, its3)


def test_min_cycles_counts_the_while_loop():
    V = CartesianSpace(2, 10, 4)
    b = V.load_separable([np.ones_like] * 2)     # load vector: the FMG start reaches 5.4e-10
    mg = PatchMultigrid(V)
    _, info0 = mg.solve(b, rtol=1e-9, min_cycles=0)
    _, info1 = mg.solve(b, rtol=1e-9)
    assert info0["iterations"] == 0 and info0["converged"]
    assert info1["iterations"] == 1 and info1["residuals"][1] < info1["residuals"][0]


def test_post_smoothing_order():
    V = CartesianSpace(2, 3, 3)
    rng = np.random.default_rng(3)
    b, x0 = rng.standard_normal(V.n_dofs), rng.standard_normal(V.n_dofs)
    fwd, rev = PatchSmoother(V), PatchSmoother(V, post="reverse")
    np.testing.assert_array_equal(fwd.smooth_adjoint(x0.copy(), b), fwd.smooth(x0.copy(), b))
    np.testing.assert_array_equal(rev.smooth_adjoint(x0.copy(), b),
                                  rev.smooth(x0.copy(), b, reverse=True))
    assert not np.allclose(fwd.smooth_adjoint(x0.copy(), b), rev.smooth_adjoint(x0.copy(), b))
    assert fwd.to(dtype=np.float32).post == "forward" and rev.to(dtype=np.float32).post == "reverse"


def test_seed_code_cycle_is_the_formula():
    # two levels: x1 = S(x0), t = b - A x1, x2 = x1 + t + P A_c^{-1} R t, x = S(x2)
    V = CartesianSpace(2, 2, 2)
    C = V.coarsen()
    rng = np.random.default_rng(11)
    b, x0 = rng.standard_normal(V.n_dofs), rng.standard_normal(V.n_dofs)
    A, S = LaplaceOperator(V), PatchSmoother(V)
    x1 = S.smooth(x0.copy(), b)
    t = b - A @ x1
    x2 = x1 + t + prolongation(C) @ FastDiagSolver(C).solve(restriction(C) @ t)
    ref = S.smooth(x2, b)
    out = PatchMultigrid(V, variant="seed-code").vcycle(b, x0.copy())
    assert np.linalg.norm(out - ref) <= 1e-13 * np.linalg.norm(ref)
    plain = PatchMultigrid(V).vcycle(b, x0.copy())
    assert np.linalg.norm(plain - ref) > 1e-3 * np.linalg.norm(ref)


def test_bad_options():
    V = CartesianSpace(2, 1, 2)
    for kw in (dict(post="backward"), dict(variant="deal.II"), dict(smoother="jacobi")):
        with pytest.raises(ValueError):
            PatchMultigrid(V, **kw)
    with pytest.raises(ValueError):
        PatchSmoother(V, post="symmetric")
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError):
            PatchMultigrid(V).solve(np.ones(V.n_dofs), min_cycles=bad)


@pytest.mark.gpu
def test_table_counts_gpu_equal_cpu():
    gpu = get_backend("gpu")
    cases = [(2, k, 4, {}) for k in (1, 2, 3, 4)] + [(2, 1, 4, dict(variant="seed-code"))] \
        + [(3, k, 3, {}) for k in (1, 2, 3)] + [(3, 2, 3, dict(smoother="point_gs"))]
    for dim, k, level, opts in cases:
        it_cpu, _ = seed_table_iterations(dim, k, level, **opts)
        it_gpu, info = seed_table_iterations(dim, k, level, backend=gpu, **opts)
        assert info["converged"] and it_gpu == it_cpu, (dim, k, level, opts, it_gpu, it_cpu)
