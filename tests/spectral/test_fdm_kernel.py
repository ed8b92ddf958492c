"""The fused fine-scale kernel (adaptmg/spectral/fdm_kernels.py) against FineSchwarz's
batched-matmul path: its exact CUDA source run on host threads (tests/host_cuda.py), nvcc
compiling it for sm_90 (no spills, static shared memory below 48 KB), and on the device
(``-m gpu``) the fused P^f against ``fused=False``."""
import shutil

import numpy as np
import pytest

import adaptmg
from adaptmg.spectral.fdm_kernels import fdm_cell_apply, fdm_cells_per_block, fdm_smem_per_cell, fdm_source
from adaptmg.spectral.kernels import SMEM_BUDGET
from adaptmg.spectral.meshes import ogrid_cylinder
from adaptmg.spectral.schwarz import FineSchwarz
from adaptmg.spectral.space import SpectralSpace

from .helpers import nvcc_resources, scrambled, wavy

EPS = {np.dtype(np.float64): np.finfo(np.float64).eps, np.dtype(np.float32): np.finfo(np.float32).eps}


def _distorted(k, cells):
    mesh = adaptmg.Mesh.box([0, 0, 0], [1, 1, 1], list(cells)).map(wavy)
    V = SpectralSpace(scrambled(mesh, seed=k), k)
    return V, V.boundary_dofs("all")


def _ogrid(k, n, nz):
    """The O-grid (valence-6 vertices) with Dirichlet DoFs on the bottom and the mantle
    only: the pencils see Dirichlet, free (top) and extended sides."""
    V = SpectralSpace(ogrid_cylinder(n, nz), k)
    b = V.boundary_dofs("all")
    p = V.points[b]
    return V, b[(p[:, 2] < 1e-12) | (np.hypot(p[:, 0], p[:, 1]) > 1 - 1e-9)]


def _close(y, ref, eps, c=64):
    """|y - ref| <= c eps ||ref||_inf (different summation orders)."""
    y = np.asarray(y, dtype=np.float64)
    assert not np.isnan(y).any()
    err = np.abs(y - ref).max()
    assert err <= c * eps * np.abs(ref).max(), err / (eps * np.abs(ref).max())


def _residual(V, fixed, dtype, seed=0):
    r = np.random.default_rng(seed).standard_normal(V.num_dofs)
    r[fixed] = 0.0
    return r.astype(dtype)


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++ (C++20)")
@pytest.mark.parametrize("k,mesh,dtype,index", [(1, "distorted", np.float64, np.int32),
                                                (3, "ogrid", np.float64, np.int64),
                                                (3, "distorted", np.float32, np.int32),
                                                (8, "ogrid", np.float32, np.int32)])
def test_fused_fine_scale_on_host_threads_equals_the_batched_path(host_gpu, k, mesh, dtype, index):
    """FineSchwarz's fused dispatch (fdm_apply, the launcher and the exact CUDA source, then
    the scatter kernel) equals the batched-matmul P^f; Poisson and Helmholtz; partial last
    blocks (k = 1: 16 cells a block on 45 cells)."""
    V, fixed = _distorted(k, (5, 3, 3) if k == 1 else (3, 2, 1)) if mesh == "distorted" else _ogrid(k, 4, 1)
    eps = EPS[np.dtype(dtype)]
    r = _residual(V, fixed, dtype, k)
    for cm, ck in ((0.0, 1.0), (25.0, 0.01)):
        P = FineSchwarz(V, fixed, mass=cm, stiffness=ck, dtype=dtype, backend="cpu")
        assert not P.fused                                  # the host keeps the batched path
        ref = P(r).astype(np.float64)
        assert np.abs(ref).max() > 0
        P.fused, P.index = True, P.index.astype(index)      # the device dispatch
        y = P(r)
        assert y.dtype == dtype and y.shape == ref.shape
        _close(y, ref, eps)
        # the box outputs alone, against the batched path's before the scatter
        box = fdm_cell_apply(r, P.weight, P.index, P.S9, P.variant, P.lam, P.scale, cm, ck)
        assert box.shape == (V.mesh.num_cells, (k + 3) ** 3)
        _close(P.scatter_matrix @ box.reshape(-1) * P.weight, ref, eps)
    assert fdm_cells_per_block(k + 3, dtype) * (k + 3) ** 2 <= 256


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
def test_nvcc_compiles_the_fine_scale_kernel_without_spills_within_static_shared_memory(tmp_path):
    jobs = [(m, dt, np.int32) for m in (4, 6, 8, 11) for dt in (np.float64, np.float32)] + \
        [(7, np.float64, np.int64)]
    res = nvcc_resources([fdm_source(*j)[0] for j in jobs], [fdm_source(*j)[1] for j in jobs], tmp_path)
    assert all(no_spill for _, no_spill in res.values())
    assert [res[fdm_source(*j)[1]][0] for j in jobs] == \
        [fdm_cells_per_block(m, dt) * fdm_smem_per_cell(m, dt) for m, dt, _ in jobs]


def test_block_shape_and_bad_input():
    cases = [(m, dt) for m in range(4, 12) for dt in (np.float64, np.float32)]
    epb = np.array([fdm_cells_per_block(m, dt) for m, dt in cases])
    assert (epb >= 1).all() and (epb * [m * m for m, _ in cases] <= 256).all()
    assert (epb * [fdm_smem_per_cell(m, dt) for m, dt in cases] <= SMEM_BUDGET).all() and SMEM_BUDGET < 48 * 1024
    assert fdm_smem_per_cell(11, np.float64) == (2 * 1331 + 363) * 8
    assert fdm_cells_per_block(11, np.float64) == 1 and fdm_cells_per_block(4, np.float64) == 16
    for args, exc, match in (((12, np.float64), ValueError, "m = k \\+ 3 in 4..11"),
                             ((3, np.float64), ValueError, "got 3"),
                             ((5, np.float16), TypeError, "float32/float64"),
                             ((5, np.float64, np.int16), TypeError, "patch index must be int32 or int64")):
        with pytest.raises(exc, match=match):
            fdm_source(*args)
    # 2-D spaces keep the batched path everywhere
    V = SpectralSpace(adaptmg.Mesh.box([0, 0], [1, 1], [2, 2]), 3)
    assert not FineSchwarz(V, V.boundary_dofs("all"), backend="cpu").fused


# ---------------------------------------------------------------------------- on the device
@pytest.mark.gpu
@pytest.mark.parametrize("k", [1, 3, 8])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("mesh", ["distorted", "ogrid"])
def test_gpu_fused_fine_scale_equals_the_batched_path(k, dtype, mesh):
    """A few hundred cells: the distorted scrambled 6 x 6 x 5 cube (Dirichlet everywhere)
    and the O-grid of 12 x 12 x 2 cells (Dirichlet bottom and mantle); Poisson and the
    heat equation's Helmholtz operator; fp32 also against the fp64 batched path."""
    V, fixed = _distorted(k, (6, 6, 5)) if mesh == "distorted" else _ogrid(k, 12, 2)
    eps = EPS[np.dtype(dtype)]
    r64 = _residual(V, fixed, np.float64, k)
    for cm, ck in ((0.0, 1.0), (25.0, 0.01)):
        P = FineSchwarz(V, fixed, mass=cm, stiffness=ck, dtype=dtype, backend="gpu")
        assert P.fused
        xp = P.xp
        r = xp.asarray(r64, dtype=dtype)
        y = P(r)
        P.fused = False
        ref = P(r)
        assert y.dtype == dtype
        _close(y.get(), ref.get().astype(np.float64), eps)
        if dtype == np.float32:
            P64 = FineSchwarz(V, fixed, mass=cm, stiffness=ck, backend="gpu")
            P64.fused = False
            _close(y.get(), P64(xp.asarray(r64)).get(), eps)


def _coarse_check(backend, dtype):
    """CoarseQ1 on SpMV plans and the cycle's fixed buffers (add_to, __call__) against
    ``P M R r`` with the cycle as a LinearOperator, and TwoScale = P^f + P^c."""
    from adaptmg.spectral.schwarz import CoarseQ1, TwoScale
    V, fixed = _ogrid(2, 8, 2)
    C = CoarseQ1(V, "all", fixed, mass=25.0, stiffness=0.01, dtype=dtype, backend=backend)
    F = FineSchwarz(V, fixed, mass=25.0, stiffness=0.01, dtype=dtype, backend=backend)
    xp = C.backend.xp
    r = xp.asarray(_residual(V, fixed, dtype, 3))
    ref = C.P @ C.M.matvec(C.R @ r)
    eps = EPS[np.dtype(dtype)]
    host = (lambda a: a.get()) if backend == "gpu" else np.asarray
    ref_h = host(ref).astype(np.float64)
    assert np.abs(ref_h).max() > 0 and C(r).dtype == dtype
    _close(host(C(r)), ref_h, eps)
    y = F(r)
    fine_h = host(y).astype(np.float64)
    out = TwoScale(F, C)(r)
    _close(host(out), fine_h + ref_h, eps)
    y64 = xp.zeros(V.num_dofs)                           # another dtype: the operator path
    _close(host(C.add_to(r, y64)), ref_h, eps)


def test_coarse_scale_on_plans_equals_the_operator_path():
    for dtype in (np.float64, np.float32):
        _coarse_check("cpu", dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_gpu_coarse_scale_on_plans_equals_the_operator_path(dtype):
    _coarse_check("gpu", dtype)


def _heat_solves(backends, dtype, rtol):
    """One backward-Euler step of Table 4's heat equation (M/dt + kappa K, dt = 0.04,
    kappa = 0.01) on a small O-grid, k = 3, by the two-scale PCG on each backend."""
    from adaptmg.spectral import SpectralProblem
    V = SpectralSpace(ogrid_cylinder(8, 4), 3)
    f = np.exp(-((V.points - [0.3, 0.2, 0.5]) ** 2).sum(1) / 0.05)
    out = []
    for be in backends:
        p = SpectralProblem(V, mass=25.0, stiffness=0.01, dtype=dtype, backend=be)
        x, its, info = p.solve(p.free * p.op.matvec(p.xp.asarray(f, dtype=dtype)), rtol=rtol)
        assert info == 0
        out.append((p, np.asarray(x.get() if be == "gpu" else x, dtype=np.float64), its))
    return out


def test_heat_step_iterations_on_the_host():
    """The reference for the device test: few iterations, bounded (seed 004 Table 4: ~8 a step)."""
    (_, x, its), = _heat_solves(["cpu"], np.float64, 1e-10)
    assert 5 <= its <= 20 and np.abs(x).max() > 0


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,rtol,tol", [(np.float64, 1e-10, 1e-8), (np.float32, 1e-5, 1e-3)])
def test_gpu_two_scale_heat_step_matches_the_host(dtype, rtol, tol):
    """The whole device iteration (fused operator, fused P^f, P^c on plans and the graphed
    cycle, the masked operator) against the host's: same iterations (+-1), same solution."""
    (_, xh, ith), (pg, xg, itg) = _heat_solves(["cpu", "gpu"], dtype, rtol)
    assert pg.M.fine.fused and pg.op.fused
    assert abs(itg - ith) <= 1
    assert np.abs(xg - xh).max() <= tol * np.abs(xh).max()
