"""The fused CUDA element kernel of the collocated 3-D spectral operator
(:mod:`adaptmg.spectral.kernels`) against the batched-matmul path.

Without a GPU three host checks guard the kernel: a pure-Python emulation of its exact
loop order and index arithmetic (threads, shared memory, registers, barriers as phases);
the operator's fused path with its launchers and the kernels' own sources compiled as C++
and run with one host thread per CUDA thread (``__syncthreads`` a ``std::barrier``; a
stand-in for CuPy's RawModule); and nvcc compiling them for sm_90 (no spills, static
shared memory below 48 KB).  On the device (``-m gpu``) the fused operator equals the same
operator built with ``fused=False``."""
import shutil

import numpy as np
import pytest

from adaptmg.spectral.kernels import SMEM_BUDGET, elements_per_block, kernel_source, scatter_source
from adaptmg.spectral.operators import SpectralOperator
from adaptmg.spectral.space import SpectralSpace

from .helpers import distorted_box, nvcc_resources, scrambled, wavy

EPS64 = np.finfo(np.float64).eps
EPS32 = np.finfo(np.float32).eps


def _space(k, cells):
    """A distorted, scrambled hex mesh with ``cells`` = (nx, ny, nz) cells."""
    import adaptmg
    mesh = adaptmg.Mesh.box([0, 0, 0], [1, 1, 1], list(cells)).map(wavy)
    return SpectralSpace(scrambled(mesh, seed=k), k)


def _flat(op):
    """The kernel's arguments from a host operator: flat cell_dofs, G, wdet, D."""
    return (np.ascontiguousarray(op.cell_dofs).ravel(), np.ascontiguousarray(op.G).ravel(),
            np.ascontiguousarray(op.wdet).ravel(), np.ascontiguousarray(op.DB).ravel())


def emulate(n, epb, ncells, gather, dofs, x, G, wdet, Dg, cm, ck):
    """adaptmg_spectral_ax3d in pure Python: for each block its threads (a, b, e) run the
    three stages between the barriers one after another; shared memory and ``y`` start as
    NaN, so a read before a write or a missing write shows.  Index arithmetic as in _SRC."""
    N = n
    T = x.dtype.type
    y = np.full(ncells * N ** 3, np.nan, dtype=x.dtype)
    nq = ncells * N ** 3
    for blk in range((ncells + epb - 1) // epb):
        sD = np.full(N * N, np.nan, dtype=x.dtype)                 # sD[N][N]
        su, sf0, sf1 = (np.full(epb * N ** 3, np.nan, dtype=x.dtype) for _ in range(3))
        threads = [(a, b, e) for e in range(epb) for b in range(N) for a in range(N)]
        reg = {}
        for a, b, e in threads:                                    # stage 1: loads
            t = (e * N + b) * N + a
            while t < N * N:
                sD[(t // N) * N + t % N] = Dg[t]
                t += N * N * epb
            cell = blk * epb + e
            active = cell < ncells
            base = cell * N ** 3
            ru = [T(0)] * N
            for c in range(N):
                p = base + (c * N + b) * N + a
                ru[c] = x[dofs[p] if gather else p] if active else T(0)
                su[((e * N + c) * N + b) * N + a] = ru[c]
            reg[a, b, e] = (active, base, ru, [None] * N)
        for a, b, e in threads:                                    # stage 2: g, f = G g
            active, base, ru, rf2 = reg[a, b, e]
            for c in range(N):
                g0 = g1 = g2 = T(0)
                for m in range(N):
                    g0 += sD[a * N + m] * su[((e * N + c) * N + b) * N + m]
                    g1 += sD[b * N + m] * su[((e * N + c) * N + m) * N + a]
                    g2 += sD[c * N + m] * ru[m]
                f0 = f1 = f2 = T(0)
                if active and ck != 0:
                    p = base + (c * N + b) * N + a
                    G00, G11, G22 = G[p], G[nq + p], G[2 * nq + p]
                    G01, G02, G12 = G[3 * nq + p], G[4 * nq + p], G[5 * nq + p]
                    f0 = G00 * g0 + G01 * g1 + G02 * g2
                    f1 = G01 * g0 + G11 * g1 + G12 * g2
                    f2 = G02 * g0 + G12 * g1 + G22 * g2
                sf0[((e * N + c) * N + b) * N + a] = f0
                sf1[((e * N + c) * N + b) * N + a] = f1
                rf2[c] = f2
        for a, b, e in threads:                                    # stage 3: D^T, mass
            active, base, ru, rf2 = reg[a, b, e]
            if not active:
                continue
            for c in range(N):
                v = T(0)
                for m in range(N):
                    v += (sD[m * N + a] * sf0[((e * N + c) * N + b) * N + m]
                          + sD[m * N + b] * sf1[((e * N + c) * N + m) * N + a] + sD[m * N + c] * rf2[m])
                p = base + (c * N + b) * N + a
                out = T(ck) * v
                if cm != 0:
                    out += T(cm) * (wdet[p] * ru[c])
                y[p] = out
    return y


def _close(y, ref, eps, c=64):
    """|y - ref| <= c eps ||ref||_inf (different summation orders)."""
    err = np.abs(np.asarray(y, dtype=np.float64) - ref).max()
    assert err <= c * eps * np.abs(ref).max(), (err / (eps * np.abs(ref).max()))
    return err


@pytest.mark.parametrize("k,cells,dtype,cm,ck", [(1, (5, 4, 4), np.float64, 0.7, 1.3),
                                                 (3, (3, 2, 2), np.float64, 0.0, 1.0),
                                                 (3, (3, 2, 2), np.float32, 0.7, 1.3),
                                                 (8, (3, 1, 1), np.float64, 0.7, 1.3),
                                                 (2, (2, 2, 1), np.float64, 1.0, 0.0)])
def test_emulated_kernel_equals_the_reference_path(k, cells, dtype, cm, ck):
    """Blocks with inactive elements (80 cells by 64 at k = 1, 3 by 2 at k = 8), fp64/fp32,
    Poisson, Helmholtz, mass only; gathered from the global vector and from cell arrays."""
    V = _space(k, cells)
    op = SpectralOperator(V, mass=cm, stiffness=ck, dtype=dtype, backend="cpu")
    x = np.random.default_rng(k).standard_normal(V.num_dofs).astype(dtype)
    ref = op.cell_apply(x[op.cell_dofs].reshape(op._cshape)).reshape(-1)
    dofs, G, wdet, D = _flat(op)
    n = k + 1
    args = (n, elements_per_block(n, dtype), V.mesh.num_cells)
    y = emulate(*args, True, dofs, x, G, wdet, D, cm, ck)
    assert y.dtype == dtype and not np.isnan(y).any()
    _close(y, ref, np.finfo(dtype).eps)
    y2 = emulate(*args, False, dofs, x[op.cell_dofs].ravel(), G, wdet, D, cm, ck)
    assert np.array_equal(y, y2)
    # and the global operator: the scatter of the element outputs
    _close(op.scatter_matrix @ y, op.matvec(x), np.finfo(dtype).eps)


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++ (C++20)")
@pytest.mark.parametrize("k,cells,dtype,index", [(1, (5, 4, 4), np.float64, np.int32),
                                                 (3, (3, 2, 2), np.float64, np.int64),
                                                 (3, (3, 2, 2), np.float32, np.int32),
                                                 (8, (3, 1, 1), np.float64, np.int32)])
def test_fused_path_with_kernels_run_on_host_threads_equals_the_reference_path(host_gpu, k, cells, dtype, index):
    """SpectralOperator's fused matvec (both scatters) and cell_apply, their launchers and the
    exact CUDA sources, on the host: Helmholtz, Poisson, mass only; partial last blocks."""
    V = _space(k, cells)
    x = np.random.default_rng(k).standard_normal(V.num_dofs).astype(dtype)
    eps = np.finfo(dtype).eps
    for cm, ck in ((0.7, 1.3), (0.0, 1.0), (1.0, 0.0)):
        ref = SpectralOperator(V, mass=cm, stiffness=ck, dtype=dtype, backend="cpu")
        op = SpectralOperator(V, mass=cm, stiffness=ck, dtype=dtype, backend="cpu")
        op.fused, op.cell_dofs = True, op.cell_dofs.astype(index)   # the device dispatch
        r = ref.matvec(x)
        for scatter in ("spmv", "kernel"):
            op.scatter = scatter
            y = op.matvec(x)
            assert y.dtype == dtype and not np.isnan(y).any()
            _close(y, r, eps)
        uc = x[ref.cell_dofs].reshape(ref._cshape)
        _close(op.cell_apply(uc), ref.cell_apply(uc), eps)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
def test_nvcc_compiles_the_kernels_without_spills_within_static_shared_memory(tmp_path):
    jobs = [(n, dt, np.int32) for n in (2, 4, 9) for dt in (np.float64, np.float32)] + \
        [(8, np.float64, np.int64)]
    res = nvcc_resources([kernel_source(*j)[0] for j in jobs]
                         + [scatter_source(np.float64)[0], scatter_source(np.float32)[0]],
                         [kernel_source(*j)[1] for j in jobs], tmp_path)
    for n, dt, it in jobs:
        smem, no_spill = res[kernel_source(n, dt, it)[1]]
        assert smem == (n * n + 3 * elements_per_block(n, dt) * n ** 3) * np.dtype(dt).itemsize <= SMEM_BUDGET
        assert no_spill


def test_block_shape_and_bad_input():
    for n in range(2, 10):
        for dt in (np.float64, np.float32):
            epb = elements_per_block(n, dt)
            assert 1 <= epb and n * n * epb <= 256
            assert (n * n + 3 * epb * n ** 3) * np.dtype(dt).itemsize <= SMEM_BUDGET < 48 * 1024
    assert elements_per_block(9, np.float64) == 2 and elements_per_block(2, np.float64) == 64
    with pytest.raises(ValueError, match="2..9"):
        kernel_source(10, np.float64)
    with pytest.raises(TypeError, match="float32/float64"):
        kernel_source(4, np.float16)
    with pytest.raises(TypeError, match="int32 or int64"):
        kernel_source(4, np.float64, np.int16)
    # the host keeps the batched-matmul path
    V = _space(2, (1, 1, 1))
    assert not SpectralOperator(V, backend="cpu").fused
    with pytest.raises(ValueError, match="scatter"):
        SpectralOperator(V, backend="cpu", scatter="atomic")


# ---------------------------------------------------------------------------- on the device
def _device_pair(V, **kw):
    fused = SpectralOperator(V, backend="gpu", **kw)
    plain = SpectralOperator(V, backend="gpu", fused=False, **kw)
    return fused, plain


@pytest.mark.gpu
@pytest.mark.parametrize("k", [1, 3, 8])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_gpu_fused_operator_equals_the_batched_path(k, dtype):
    """Distorted scrambled mesh of 6 x 6 x 5 = 180 cells; Poisson, Helmholtz, mass only;
    matvec (gather in the kernel) and cell_apply (cell arrays)."""
    V = _space(k, (6, 6, 5))
    eps = np.finfo(dtype).eps
    x64 = np.random.default_rng(k).standard_normal(V.num_dofs)
    for cm, ck in ((0.0, 1.0), (0.7, 1.3), (1.0, 0.0)):
        fused, plain = _device_pair(V, mass=cm, stiffness=ck, dtype=dtype)
        assert fused.fused and not plain.fused
        xp = fused.xp
        x = xp.asarray(x64, dtype=dtype)
        y, r = fused.matvec(x), plain.matvec(x)
        assert y.dtype == dtype
        _close(y.get(), r.get().astype(np.float64), eps)
        assert fused.scatter == "kernel"               # the default: the scatter kernel
        fused.scatter = "spmv"                         # and the scatter matrix's SpMV
        _close(fused.matvec(x).get(), r.get().astype(np.float64), eps)
        uc = x[fused.cell_dofs].reshape(fused._cshape)
        _close(fused.cell_apply(uc).get(), plain.cell_apply(uc).get().astype(np.float64), eps)
        if dtype == np.float32:              # and against the fp64 operator
            ref = SpectralOperator(V, mass=cm, stiffness=ck, backend="gpu").matvec(xp.asarray(x64))
            _close(y.get(), ref.get(), eps)


@pytest.mark.gpu
def test_gpu_fused_dispatch_only_where_it_applies():
    V3 = _space(3, (2, 2, 2))
    assert SpectralOperator(V3, backend="gpu").fused
    assert not SpectralOperator(V3, backend="gpu", quadrature="gauss").fused
    assert not SpectralOperator(V3, backend="gpu", geometry="on_the_fly").fused
    assert not SpectralOperator(SpectralSpace(distorted_box(2, 3), 3), backend="gpu").fused
