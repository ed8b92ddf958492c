"""Launchers of the CUDA kernels (CuPy RawKernel) of the Cartesian Q_k path.

The sources are generated from templates for each (dim, k, precision) and
memoised here (:func:`_raw_kernel`):

* :mod:`.cuda_operator` -- ``adaptmg_patch_lap{2,3}d``, the matrix-free operator
  (:class:`GpuLaplace`; at k = 1 the stencil kernel of :mod:`.stencil`);
* :mod:`.cuda_column` -- ``adaptmg_patch_smooth{2,3}d``, one colour of the fused
  vertex-patch smoother, a thread per output column;
* :mod:`.cuda_pencil` -- ``adaptmg_patch_smooth3dp`` / ``smooth3db``, the same
  colour step in pencil and Boundary form (:class:`GpuPatchSmoother` picks the
  form per degree and precision: ``SMOOTH3D_TUNED``, :func:`smoother_form`);
* :mod:`.cuda_axis` -- ``adaptmg_patch_axis``, a 1D matrix along one axis
  (:class:`GpuAxisMatrix`, the grid transfer);
* :mod:`.cuda_build` -- filling templates, compiling, prebuilt-cubin lookup
  (:func:`build_cubins` compiles every source ahead of time).

The public names of those modules (and ``_TYPES``, ``_load``) are re-exported,
so ``from adaptmg.patch.kernels import ...`` works as before the split.

Only ``adaptmg.backend`` imports CuPy; we get it as ``get_backend("gpu").xp``.
"""
from __future__ import annotations

import functools

import numpy as np

from ..backend import get_backend
from .cuda_axis import axis_source
from .cuda_build import _TYPES, _load, cubin_name  # noqa: F401  (_TYPES: re-exported)
from .cuda_column import SMOOTH3D_MIN_BLOCKS, patches_per_block, smoother_source
from .cuda_operator import cells_per_block, laplace_source
from .cuda_pencil import (boundary_layout, boundary_smoother_source, pencil_layout,
                          pencil_smoother_source)
from .stencil import GpuQ1Stencil
from .tensor import ell_form, eigenvalue_sums, patch_fast_diag, patch_matrices, reference_matrices

__all__ = ["GpuLaplace", "GpuPatchSmoother", "laplace_source", "smoother_source",
           "cells_per_block", "patches_per_block"]


def smoother_smem_bytes(dim, k, dtype, variant="column"):
    isz = np.dtype(dtype).itemsize
    if variant == "pencil":
        return patches_per_block(dim, k) * pencil_layout(k)[2] * isz
    if variant == "boundary":
        return patches_per_block(dim, k) * boundary_layout(k)["PSMEM"] * isz
    NP, NI = 2 * k + 1, 2 * k - 1
    nmat = 2 * NI * NP + NI * NI + NI
    nmat = ((nmat + 1) // 2) * 2
    per = NP ** 3 + 2 * NP * NP * NI if dim == 3 else NP * NP + 2 * NP * NI + 2 * NI * NI
    return (nmat + patches_per_block(dim, k) * per) * isz


# The 3D smoother's forms (see GpuPatchSmoother) and the default: "tuned" takes
# the form and register cap of SMOOTH3D_TUNED for each (k, dtype), the pencil
# form elsewhere.  Tuned with bench_patch.py --sections tune (H100, NOTES.md):
# the pencil form is 1.1-1.8x faster than the column form for k = 3..8; the
# Boundary form is faster still for k >= 6 (fp64 also k = 5) and slower below.
SMOOTH3D_VARIANTS = ("column", "pencil", "boundary")
SMOOTH3D_VARIANT = "tuned"
SMOOTH3D_PENCIL_MIN_BLOCKS = {(5, "float64"): 3, (6, "float64"): 3, (7, "float64"): 2,
                              (8, "float64"): 2, (4, "float32"): 2, (5, "float32"): 2,
                              (6, "float32"): 2, (7, "float32"): 3, (8, "float32"): 3}
# (k, dtype) -> (form, minimum blocks per SM, unroll of the Boundary form's
# residual stages); pairs not listed use the pencil form.
SMOOTH3D_TUNED = {(5, "float64"): ("boundary", 1, ""), (6, "float64"): ("boundary", 4, "2"),
                  (7, "float64"): ("boundary", 2, "2"), (8, "float64"): ("boundary", 2, "1"),
                  (6, "float32"): ("boundary", 2, "2"), (7, "float32"): ("boundary", 4, "2"),
                  (8, "float32"): ("boundary", 3, "2")}


def smoother_form(k, dtype, variant=None, minb=None, unroll=None):
    """(form, minb, unroll) of the 3D smoothing kernel for degree ``k`` and
    ``dtype``: ``variant`` None takes ``SMOOTH3D_VARIANT``; "tuned" the tuned
    table; a named form its tuned cap where the table has one (else none, and
    unroll "2" for the Boundary form); ``minb`` and ``unroll`` override them."""
    name = np.dtype(dtype).name
    variant = SMOOTH3D_VARIANT if variant is None else variant
    if variant == "tuned":
        variant = SMOOTH3D_TUNED.get((k, name), ("pencil",))[0]
    if variant not in SMOOTH3D_VARIANTS:
        raise ValueError(f"variant must be one of {SMOOTH3D_VARIANTS + ('tuned',)}, got {variant!r}")
    tuned = SMOOTH3D_TUNED.get((k, name))
    unr = ""
    if variant == "boundary":
        cap, unr = (tuned[1], tuned[2]) if tuned and tuned[0] == "boundary" else (1, "2")
    elif variant == "pencil":
        cap = SMOOTH3D_PENCIL_MIN_BLOCKS.get((k, name), 1)
    else:
        cap = SMOOTH3D_MIN_BLOCKS.get((k, name), 1)
    return variant, cap if minb is None else minb, unr if unroll is None else str(unroll)


def build_cubins(outdir, arch="sm_90", nvcc="nvcc"):
    """Compile every kernel with nvcc into ``outdir`` (ahead of time, so a
    fresh device machine skips NVRTC).  Loaded when the environment variable
    ADAPTMG_PATCH_CUBIN names that folder; sources are hash-checked."""
    import os
    import subprocess
    import tempfile
    os.makedirs(outdir, exist_ok=True)
    jobs = []
    for dim, kmax in ((2, 10), (3, 8)):
        for k in range(1, kmax + 1):
            for dt in (np.float64, np.float32):
                jobs += [laplace_source(dim, k, dt), smoother_source(dim, k, dt)]
    for k in range(4, 9):                       # register-capped variants (tuning)
        for dt in (np.float64, np.float32):
            jobs += [smoother_source(3, k, dt, minb) for minb in (2, 3)]
    for k in range(1, 9):
        for dt in (np.float64, np.float32):
            jobs += [pencil_smoother_source(k, dt, minb) for minb in (1, 2, 3)]
            jobs += [boundary_smoother_source(k, dt, minb, u) for minb in (1, 2, 3, 4)
                     for u in ("", "1", "2")]
    jobs += [axis_source(np.float64), axis_source(np.float32)]
    running, codes = [], []
    tmp = tempfile.mkdtemp()
    for src, name in jobs:
        out = os.path.join(outdir, cubin_name(src, name))
        if os.path.exists(out):
            continue
        cu = os.path.join(tmp, name + ".cu")
        with open(cu, "w") as f:
            f.write(src)
        if len(running) >= (os.cpu_count() or 1):          # one nvcc per core at a time
            codes.append(running.pop(0).wait())
        running.append(subprocess.Popen([nvcc, f"-arch={arch}", "-cubin", "-std=c++17", "-O3",
                                         cu, "-o", out]))
    return codes + [p.wait() for p in running]


@functools.lru_cache(maxsize=None)
def _raw_kernel(kind, dim, k, dtype_str, minb=None, unroll=""):
    if kind == "lap":
        src, name = laplace_source(dim, k, np.dtype(dtype_str))
    elif kind == "pencil":
        src, name = pencil_smoother_source(k, np.dtype(dtype_str), minb)
    elif kind == "boundary":
        src, name = boundary_smoother_source(k, np.dtype(dtype_str), minb, unroll)
    else:
        src, name = smoother_source(dim, k, np.dtype(dtype_str), minb)
    ker = _load(src, name)
    if kind != "lap":
        nbytes = smoother_smem_bytes(dim, k, np.dtype(dtype_str),
                                     kind if kind in ("pencil", "boundary") else "column")
        if nbytes > 48 * 1024:
            ker.max_dynamic_shared_size_bytes = nbytes
    return ker


class GpuLaplace:
    """Launcher of the operator kernel for one space and dtype (at k = 1 the
    stencil kernel of :mod:`.stencil`)."""

    def __init__(self, space, dtype):
        self.space = space
        self.dtype = np.dtype(dtype)
        cp = get_backend("gpu").xp
        self.cp = cp
        self.stencil = None
        if space.k == 1:
            self.stencil = GpuQ1Stencil(space, self.dtype)
            return
        Mh, Ah = reference_matrices(space.k)
        self.mats = cp.asarray(np.concatenate([Mh.ravel(), Ah.ravel()]), dtype=self.dtype)
        self.kernel = _raw_kernel("lap", space.dim, space.k, self.dtype.str)
        self.cpb = cells_per_block(space.dim, space.k)
        ncell = int(np.prod(space.cells))
        self.grid = ((ncell + self.cpb - 1) // self.cpb,)
        self.block = ((space.k + 1) ** 2, self.cpb)
        T = self.dtype.type
        self.args_tail = tuple(np.int32(n) for n in space.cells) + tuple(T(c) for c in space.coeffs)

    def apply(self, u, out=None, alpha=1.0, beta=0.0):
        """``out <- alpha A u + beta out`` (a new array when ``out`` is None).  The
        kernel adds each cell's contribution with atomicAdd, so ``out`` is first
        zeroed or scaled by ``beta``; at k = 1 the stencil kernel writes it directly."""
        if self.stencil is not None:
            return self.stencil.apply(u, out, alpha, beta)
        if out is None:
            out = self.cp.zeros_like(u)
        elif beta == 0:
            out.fill(0)
        elif beta != 1:
            out *= self.dtype.type(beta)
        self.kernel(self.grid, self.block, (u, out, self.mats) + self.args_tail
                    + (self.dtype.type(alpha),))
        return out

    def residual(self, u, b, r):
        """``r <- b - A u``: at k = 1 one stencil pass reading ``b``; else a copy of ``b``
        and the cell kernel adding ``-A u`` into it."""
        if self.stencil is not None:
            return self.stencil.apply(u, r, -1.0, 1.0, z=b)
        r[...] = b
        return self.apply(u, r, -1.0, 1.0)


class GpuPatchSmoother:
    """Launcher of the fused smoothing kernel, one launch per colour.

    ``variant`` (3D only): "column" (``_SMOOTH3D``: a thread per output column,
    matrices in shared memory), "pencil" (``_SMOOTH3D_PENCIL``: a thread per
    1D pencil, matrices compiled in), "boundary" (``_SMOOTH3D_BOUNDARY``: the
    pencil form's local solve after a residual from the patch shell only,
    x^I <- A_j^{-1} (b^I - A^{IB} x^B), seed 000 §4.1.3) or "tuned" (the
    fastest of these per degree and precision, ``SMOOTH3D_TUNED``); default
    ``SMOOTH3D_VARIANT``.  At k = 1 (2D and 3D) the default is "stencil":
    the patch step is point Gauss-Seidel there, run by the one-thread-per-DoF
    kernel of :mod:`.stencil` (the patch forms stay available by name).
    ``minb``: the register cap as minimum resident blocks per SM (default from
    the tuning tables); ``unroll``: the Boundary form's unroll factor
    (``boundary_smoother_source``)."""

    def __init__(self, space, dtype, minb=None, variant=None, unroll=None):
        self.space = space
        self.dtype = np.dtype(dtype)
        cp = get_backend("gpu").xp
        self.cp = cp
        k = space.k
        self.stencil = None
        if variant == "stencil" and k != 1:
            raise ValueError(f"variant 'stencil' (point Gauss-Seidel) is the k = 1 patch step; "
                             f"got k = {k}")
        if k == 1 and variant in (None, "tuned", "stencil"):
            self.stencil = GpuQ1Stencil(space, self.dtype)
            self.variant, self.minb, self.unroll = "stencil", None, ""
            return
        if space.dim == 3:
            variant, minb, unroll = smoother_form(k, self.dtype, variant, minb, unroll)
        elif variant not in (None, "column"):
            raise ValueError(f"variant must be 'column' in 2D, got {variant!r}")
        else:
            variant, unroll = "column", ""
        self.variant = variant
        if variant in ("pencil", "boundary"):
            self.mats = None                      # compiled into the kernel
            self.kernel = _raw_kernel(variant, 3, k, self.dtype.str, minb, unroll)
        else:
            Mb, Ab, _, _ = patch_matrices(k)
            S, lam = patch_fast_diag(k)
            self.mats = cp.asarray(np.concatenate([Mb.ravel(), Ab.ravel(), S.ravel(), lam]),
                                   dtype=self.dtype)
            self.kernel = _raw_kernel("smooth", space.dim, k, self.dtype.str, minb)
        self.minb, self.unroll = minb, unroll
        self.ppb = patches_per_block(space.dim, k)
        self.block = ((2 * k + 1) ** 2, self.ppb)
        self.smem = smoother_smem_bytes(space.dim, k, self.dtype, variant)
        T = self.dtype.type
        self.cells = tuple(np.int32(n) for n in space.cells)
        self.coeffs = tuple(T(c) for c in space.coeffs)
        self.tail = ()
        if variant == "pencil":        # 1 / (c0 lam_a0 + c1 lam_a1 + c2 lam_a2), [a2][a1][a0]
            lam = patch_fast_diag(k)[1]
            self.tail = (cp.asarray(1.0 / eigenvalue_sums([lam] * 3, space.coeffs), dtype=self.dtype).ravel(),)

    def sweep(self, x, b, colors, reverse=False):
        """One sweep over ``colors`` (:func:`~.smoother.patch_colors`; ``reverse``:
        backwards) in place: at k = 1 the stencil's sweep (two colours a launch,
        :meth:`~.stencil.GpuQ1Stencil.sweep`), else one launch per colour."""
        if self.stencil is not None:
            self.stencil.sweep(x, b, reverse)
            return
        for col, cnt in (colors[::-1] if reverse else colors):
            self.color(x, b, col, cnt)

    def color(self, x, b, col, cnt):
        """One colour (parities ``col``, ``cnt`` patches per direction, x first) in place."""
        if self.stencil is not None:
            self.stencil.color(x, b, col, cnt)
            return
        npatch = int(np.prod(cnt))
        grid = ((npatch + self.ppb - 1) // self.ppb,)
        mats = () if self.mats is None else (self.mats,)
        args = (x, b) + mats + self.cells + tuple(np.int32(c) for c in col) \
            + tuple(np.int32(c) for c in cnt) + self.coeffs + self.tail
        self.kernel(grid, self.block, args, shared_mem=self.smem)


#: The axis kernel uses 32-bit index arithmetic up to this many output entries
#: plus grid stride (a test lowers it to run the 64-bit path on small vectors).
AXIS_INDEX32_LIMIT = 2 ** 31 - 1


@functools.lru_cache(maxsize=None)
def _axis_kernel(dtype_str):
    return _load(*axis_source(np.dtype(dtype_str)))


class GpuAxisMatrix:
    """A 1D sparse matrix (scipy CSR) in ELL form, applied along one axis of a
    C-ordered array without transposes: ``v[o, i, r] = sum_j M[i, j] u[o, j, r]``."""

    def __init__(self, M, dtype):
        cp = get_backend("gpu").xp
        cols, vals, width = ell_form(M)
        self.shape = M.shape
        self.width = width
        self.dtype = np.dtype(dtype)
        self.cols = cp.asarray(cols)
        self.vals = cp.asarray(vals, dtype=self.dtype)
        self.kernel = _axis_kernel(self.dtype.str)
        self.cp = cp

    def apply(self, U, ax, out=None, alpha=1.0, beta=0.0):
        """``M`` along axis ``ax`` of ``U``: a new array, or ``out <- alpha M U + beta
        out`` into ``out`` (an array of the result's size)."""
        sh = U.shape
        outer = int(np.prod(sh[:ax]))
        inner = int(np.prod(sh[ax + 1:]))
        out_shape = sh[:ax] + (self.shape[0],) + sh[ax + 1:]
        if out is None:
            V, beta = self.cp.empty(out_shape, dtype=self.dtype), 0.0
        else:
            V = out.reshape(out_shape)
        total = outer * self.shape[0] * inner
        threads = 256
        blocks = int(min((total + threads - 1) // threads, 132 * 64))
        T = self.dtype.type
        self.kernel((blocks,), (threads,), (U, V, self.cols, self.vals, np.int32(self.width),
                                             np.int64(outer), np.int32(self.shape[1]),
                                             np.int32(self.shape[0]), np.int64(inner),
                                             T(alpha), T(beta), np.int64(AXIS_INDEX32_LIMIT)))
        return V

