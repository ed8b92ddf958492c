"""Device tests of adaptmg.patch: CUDA kernels against the NumPy implementation.

fp64 results must agree to 1e-12 (relative, 2-norm), fp32 kernels with the
fp64 NumPy result to 1e-5.  Skipped where no CUDA device is visible.
"""
import numpy as np
import pytest

from adaptmg.backend import get_backend, to_host
from adaptmg.patch import (CartesianSpace, LaplaceOperator, PatchMultigrid, PatchSmoother,
                           prolongation, restriction)

pytestmark = pytest.mark.gpu

CASES = [(2, k, 3) for k in (1, 2, 3, 5, 8, 10)] + [(3, k, 2) for k in (1, 2, 3, 4)] \
    + [(3, k, 1) for k in (5, 6, 7, 8)] + [(3, 3, 3)]


def _rel(a, b):
    a, b = to_host(a).astype(np.float64), to_host(b).astype(np.float64)
    return np.linalg.norm(a - b) / np.linalg.norm(b)


@pytest.mark.parametrize("dim,k,level", CASES)
def test_operator_kernel_matches_numpy(dim, k, level):
    gpu = get_backend("gpu")
    V = CartesianSpace(dim, k, level, lengths=(1.0, 1.5, 0.75)[:dim], base=(1,) * (dim - 1) + (2,))
    u = np.random.default_rng(k).standard_normal(V.n_dofs)
    ref = LaplaceOperator(V) @ u
    out = LaplaceOperator(V, gpu) @ gpu.asarray(u)
    assert _rel(out, ref) <= 1e-12
    out32 = LaplaceOperator(V, gpu, np.float32) @ gpu.asarray(u, np.float32)
    assert out32.dtype == np.float32
    assert _rel(out32, ref) <= 1e-5


@pytest.mark.parametrize("dim,k,level", CASES)
def test_smoother_kernel_matches_numpy(dim, k, level):
    gpu = get_backend("gpu")
    V = CartesianSpace(dim, k, level + 1 if dim == 2 else level, lengths=(1.0, 2.0, 1.0)[:dim],
                       base=(1,) * (dim - 1) + (3,))
    rng = np.random.default_rng(10 + k)
    x, b = rng.standard_normal(V.n_dofs), rng.standard_normal(V.n_dofs)
    ref = x.copy()
    S = PatchSmoother(V)
    S.smooth(ref, b, sweeps=2)
    S.smooth(ref, b, reverse=True)
    xg = gpu.asarray(x)
    Sg = PatchSmoother(V, gpu)
    Sg.smooth(xg, gpu.asarray(b), sweeps=2)
    Sg.smooth(xg, gpu.asarray(b), reverse=True)
    assert _rel(xg, ref) <= 1e-12
    x32 = gpu.asarray(x, np.float32)
    S32 = PatchSmoother(V, gpu, np.float32)
    S32.smooth(x32, gpu.asarray(b, np.float32), sweeps=2)
    S32.smooth(x32, gpu.asarray(b, np.float32), reverse=True)
    assert _rel(x32, ref) <= 1e-5


@pytest.mark.parametrize("k", range(1, 9))
@pytest.mark.parametrize("dtype,tol", [(np.float64, 1e-12), (np.float32, 1e-5)])
def test_smoother_forms_agree_3d(k, dtype, tol):
    """The column, pencil and Boundary forms of the 3D smoothing kernel (every
    register cap of the pencil form, the Boundary form with full, 1 and 2
    unrolled residual stages and its tuned cap) compute the same sweep: against
    the fp64 NumPy sweep on a mesh with three different cell sizes.  The
    Boundary form sets x^I instead of adding a correction, so it rounds
    differently: fp64 agrees to 1e-13 here (measured 5e-15 .. 3e-14)."""
    from adaptmg.patch.kernels import GpuPatchSmoother
    gpu = get_backend("gpu")
    V = CartesianSpace(3, k, 2 if k <= 4 else 1, lengths=(1.0, 2.0, 0.5), base=(2, 1, 3))
    rng = np.random.default_rng(20 + k)
    x, b = rng.standard_normal(V.n_dofs), rng.standard_normal(V.n_dofs)
    ref = x.copy()
    PatchSmoother(V).smooth(ref, b, sweeps=2)
    forms = [("column", None, None), ("pencil", 1, None), ("pencil", 2, None), ("pencil", 3, None),
             ("boundary", 1, ""), ("boundary", 2, "1"), ("boundary", 1, "2"), ("boundary", None, None)]
    if k == 1:
        forms.append(("stencil", None, None))
    for variant, minb, unroll in forms:
        S = PatchSmoother(V, gpu, dtype)
        S._gpu = GpuPatchSmoother(V, dtype, minb, variant=variant, unroll=unroll)
        xg = gpu.asarray(x, dtype)
        S.smooth(xg, gpu.asarray(b, dtype), sweeps=2)
        assert _rel(xg, ref) <= (1e-13 if dtype == np.float64 else tol), (variant, minb, unroll)


@pytest.mark.parametrize("k", (2, 7))
def test_boundary_form_reads_no_interior(k):
    """The Boundary form never reads a patch's interior x^I: one colour step
    with NaN in every entry that step sets gives the same result, bit for bit
    (same kernel, same inputs read)."""
    from adaptmg.patch.kernels import GpuPatchSmoother
    from adaptmg.patch.smoother import patch_colors
    gpu = get_backend("gpu")
    V = CartesianSpace(3, k, 2 if k <= 4 else 1, base=(2, 2, 2))
    rng = np.random.default_rng(k)
    x, b = rng.standard_normal(V.n_dofs), rng.standard_normal(V.n_dofs)
    G = GpuPatchSmoother(V, np.float64, variant="boundary")
    col, cnt = patch_colors(V)[0]
    xg = gpu.asarray(x)
    G.color(xg, gpu.asarray(b), col, cnt)
    changed = to_host(xg) != x
    assert changed.sum() == np.prod(cnt) * (2 * k - 1) ** 3      # exactly the patch interiors
    xn = gpu.asarray(np.where(changed, np.nan, x))       # the same interiors, unknown
    G.color(xn, gpu.asarray(b), col, cnt)
    np.testing.assert_array_equal(to_host(xn), to_host(xg))


def test_smoother_variant_checked():
    from adaptmg.patch.kernels import GpuPatchSmoother
    with pytest.raises(ValueError, match="variant"):
        GpuPatchSmoother(CartesianSpace(2, 2, 2), np.float64, variant="pencil")
    with pytest.raises(ValueError, match="variant"):
        GpuPatchSmoother(CartesianSpace(3, 2, 2), np.float64, variant="rows")
    with pytest.raises(ValueError, match="k = 1"):
        GpuPatchSmoother(CartesianSpace(3, 2, 2), np.float64, variant="stencil")
    for dim in (2, 3):
        assert GpuPatchSmoother(CartesianSpace(dim, 1, 2), np.float32).variant == "stencil"


@pytest.mark.parametrize("dim,k", [(2, 1), (3, 1), (2, 4), (3, 3)])
@pytest.mark.parametrize("dtype,tol", [(np.float64, 1e-12), (np.float32, 1e-5)])
def test_spmv_kernels_match_numpy(dim, k, dtype, tol):
    """``y <- alpha A x + beta y`` of the operator kernels (stencil at k = 1, cell
    kernel with atomics above) and of the transfers (one gather pass at k = 1, the last
    axis pass above), against NumPy;
    ``beta = 0`` never reads ``y`` (NaN there)."""
    gpu = get_backend("gpu")
    V = CartesianSpace(dim, k, 3 if dim == 2 else 2, lengths=(1.0, 2.0, 0.5)[:dim],
                       base=(2,) + (1,) * (dim - 1))
    rng = np.random.default_rng(3 * k + dim)
    ops = ((LaplaceOperator(V), LaplaceOperator(V, gpu, dtype), V.n_dofs),
           (prolongation(V), prolongation(V, gpu, dtype), V.n_dofs),
           (restriction(V), restriction(V, gpu, dtype), V.refine().n_dofs))
    for T, Tg, n_in in ops:
        u, y0 = rng.standard_normal(n_in), rng.standard_normal(T.shape[0])
        for alpha, beta in ((1.0, 0.0), (-1.0, 1.0), (2.5, -0.5)):
            ref = alpha * (T @ u) + beta * y0
            y = gpu.asarray(y0, dtype) if beta else gpu.xp.full(T.shape[0], np.nan, dtype)
            assert Tg.spmv(gpu.asarray(u, dtype), y, alpha, beta) is y
            assert _rel(y, ref) <= tol, (type(T).__name__, alpha, beta)
        assert _rel(Tg @ gpu.asarray(u, dtype), T @ u) <= tol
    # one gather pass for the Q1 transfers, the axis passes above
    assert (ops[1][1]._gather is not None) == (ops[2][1]._gather is not None) == (k == 1)
    assert (ops[1][1].to(dtype=np.float32)._gather is not None) == (k == 1)
    # the residual r <- b - A u: one stencil pass reading b at k = 1, copy + cell kernel above
    A, Ag, _ = ops[0]
    u, b = rng.standard_normal(V.n_dofs), rng.standard_normal(V.n_dofs)
    r = gpu.xp.full(V.n_dofs, np.nan, dtype)
    bg = gpu.asarray(b, dtype)
    assert Ag.residual(gpu.asarray(u, dtype), bg, r) is r
    assert _rel(r, b - A @ u) <= tol
    assert _rel(bg, b.astype(dtype)) == 0          # b is only read


def test_gpu_kernels_refuse_strided_vectors():
    """The kernels write through the data pointer: a strided view is refused, not
    silently misread."""
    gpu = get_backend("gpu")
    V = CartesianSpace(3, 1, 2)
    u = gpu.xp.zeros(2 * V.n_dofs)[::2]
    with pytest.raises(ValueError, match="contiguous"):
        LaplaceOperator(V, gpu) @ u
    with pytest.raises(ValueError, match="contiguous"):
        PatchSmoother(V, gpu).smooth(u, gpu.xp.zeros(V.n_dofs))
    with pytest.raises(ValueError, match="contiguous"):
        prolongation(V, gpu).spmv(gpu.xp.zeros(V.n_dofs), gpu.xp.zeros(2 * V.refine().n_dofs)[::2])
    # a strided input is read correctly by the one-pass Q1 gather (copied first)
    w = np.random.default_rng(0).standard_normal(2 * V.n_dofs)
    P = prolongation(V, gpu)
    assert P._gather is not None
    assert _rel(P @ gpu.asarray(w)[::2], prolongation(V) @ w[::2]) <= 1e-14


def test_axis_kernel_64bit_index_path(monkeypatch):
    """The transfer kernel's 64-bit index arithmetic (taken above 2^31 entries) gives
    the same result as the 32-bit path, forced here on a small level."""
    from adaptmg.patch import kernels
    gpu = get_backend("gpu")
    Vc = CartesianSpace(3, 2, 2)
    u = gpu.asarray(np.random.default_rng(0).standard_normal(Vc.refine().n_dofs))
    P = restriction(Vc, gpu)                 # rows of 5 x 5 x 5: the axis passes
    assert P._gather is None
    ref = to_host(P @ u)
    monkeypatch.setattr(kernels, "AXIS_INDEX32_LIMIT", 0)
    np.testing.assert_array_equal(to_host(P @ u), ref)     # same sums, same order


@pytest.mark.parametrize("dim", (2, 3))
def test_q1_stencil_grid_stride_loops(dim, monkeypatch):
    """Levels with more rows or planes than a grid dimension holds (65535): the
    stencil kernels' grid-stride loops (the operator's over z-segments of 8 planes
    too: 31 planes here), exercised with the grid capped at 2."""
    from adaptmg.patch import stencil
    gpu = get_backend("gpu")
    V = CartesianSpace(dim, 1, 4, base=(1,) * (dim - 1) + (2,))
    rng = np.random.default_rng(dim)
    u, b = rng.standard_normal(V.n_dofs), rng.standard_normal(V.n_dofs)
    ref_Au = LaplaceOperator(V) @ u
    ref_x = u.copy()
    PatchSmoother(V).smooth(ref_x, b)
    monkeypatch.setattr(stencil, "_GRID_MAX", 2)
    assert _rel(LaplaceOperator(V, gpu) @ gpu.asarray(u), ref_Au) <= 1e-12
    xg = gpu.asarray(u)
    PatchSmoother(V, gpu).smooth(xg, gpu.asarray(b))
    assert _rel(xg, ref_x) <= 1e-12


@pytest.mark.parametrize("dim,k", [(2, 3), (3, 2), (3, 5)])
def test_transfer_kernel_matches_numpy(dim, k):
    gpu = get_backend("gpu")
    Vc = CartesianSpace(dim, k, 2)
    rng = np.random.default_rng(2)
    uc, uf = rng.standard_normal(Vc.n_dofs), rng.standard_normal(Vc.refine().n_dofs)
    for T, u in ((prolongation, uc), (restriction, uf)):
        ref = T(Vc) @ u
        assert _rel(T(Vc, gpu) @ gpu.asarray(u), ref) <= 1e-12
        assert _rel(T(Vc, gpu, np.float32) @ gpu.asarray(u, np.float32), ref) <= 1e-5


@pytest.mark.parametrize("dim,k,level", [(2, 3, 5), (3, 2, 3), (3, 4, 3), (3, 1, 5)])
def test_gpu_solve_matches_cpu(dim, k, level):
    gpu = get_backend("gpu")
    V = CartesianSpace(dim, k, level)
    b, _ = V.sine_problem()
    x_cpu, info_cpu = PatchMultigrid(V).solve(b, rtol=1e-9)
    mg = PatchMultigrid(V, gpu)
    for method in ("fmg", "gmres"):
        for prec in ("double", "mixed"):
            x, info = mg.solve(gpu.asarray(b), rtol=1e-9, method=method, precision=prec)
            assert info["converged"], (method, prec, info)
            if method == "fmg" and prec == "double":
                # same count although GPU and NumPy/BLAS reductions round differently: the residuals
                # bracketing the stop are >= 1.6 and <= 0.55 rtol in these cases (H100), far from it
                assert info["iterations"] == info_cpu["iterations"]
            e, e_cpu = V.l2_error_sine(x), V.l2_error_sine(x_cpu)
            assert abs(e - e_cpu) <= 1e-6 * e_cpu


def test_patch_levels_in_multilevel_solver_gpu():
    ml_mod = pytest.importorskip("adaptmg.multilevel")
    from adaptmg.patch import patch_levels
    gpu = get_backend("gpu")
    V = CartesianSpace(3, 3, 3)
    b, _ = V.sine_problem()
    ml = ml_mod.MultilevelSolver(patch_levels(V, gpu), coarse="direct", presmooth=1,
                                 postsmooth=1, backend=gpu)
    x = ml.solve(gpu.asarray(b), rtol=1e-9, accel="gmres", maxiter=30)
    r = gpu.asarray(b) - LaplaceOperator(V, gpu) @ x
    assert float(gpu.xp.linalg.norm(r)) <= 1e-9 * np.linalg.norm(b)


@pytest.mark.parametrize("dim,base,level", [(3, (3, 1, 2), 5), (2, (3, 1), 7), (3, (1, 1, 1), 1),
                                            (2, (1, 1), 11), (2, (2, 1), 11)])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("reverse", [False, True])
def test_q1_fused_sweep_is_the_colour_sweep(dim, base, level, dtype, reverse):
    """The k = 1 sweep with two colours a launch (a block a row) gives the colour-by-
    colour sweep of the same stencil: odd and even row lengths (95 x 31 x 63 DoFs),
    2D, a level with one DoF a direction, rows of 2047 DoFs (1024 threads, the most
    a block takes) and of 4095 (the colour-by-colour fallback); forward and reverse.
    The sums run in another order: 8 eps relative (2-norm; measured 0 .. 1.2 eps)."""
    from adaptmg.patch.kernels import GpuPatchSmoother
    from adaptmg.patch.smoother import patch_colors
    gpu = get_backend("gpu")
    V = CartesianSpace(dim, 1, level, lengths=(1.0, 2.0, 0.5)[:dim], base=base)
    rng = np.random.default_rng(level + dim)
    x, b = rng.standard_normal(V.n_dofs), rng.standard_normal(V.n_dofs)
    G = GpuPatchSmoother(V, dtype)
    assert G.variant == "stencil"
    colors = patch_colors(V)
    xs, xc, bg = gpu.asarray(x, dtype), gpu.asarray(x, dtype), gpu.asarray(b, dtype)
    for _ in range(2):
        G.sweep(xs, bg, colors, reverse)
        for col, cnt in (colors[::-1] if reverse else colors):
            G.color(xc, bg, col, cnt)
    assert _rel(xs, xc) <= 8 * np.finfo(dtype).eps
    assert _rel(xs, x) > 1e-2                  # it did smooth
