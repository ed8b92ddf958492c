r"""Colour-by-colour Gauss-Seidel updates: one CUDA kernel per colour, and their NumPy twin.

For a colouring of the node graph of ``A`` (:mod:`adaptmg.multilevel.coloring`)
the update of colour ``k`` is

.. math::  x_C \leftarrow x_C + \omega\, D_{CC}^{-1} (b_C - A_{C,:}\, x),

``C`` the rows of the nodes of colour ``k`` and ``D_CC`` the diagonal
(``block_size = 1``) or the block diagonal of the ``c x c`` node blocks
(``block_size = c``; rows ``c p .. c p + c - 1`` belong to node ``p``).  Nodes of
one colour are not coupled, so every row of ``C`` reads only unknowns of other
colours (and its own node's): all of ``C`` may be updated at once, and the
result is exactly sequential Gauss-Seidel over ``C``.

:func:`make_colored_sweep` builds, once per matrix and backend, a *plan* whose
``color(k, x, b, omega)`` runs that update in place:

* GPU: one launch of the RawKernel ``adaptmg_gs_point_<type>`` (point) or
  ``adaptmg_gs_block<c>_<type>`` (blocks, ``c`` a compile-time constant) over the
  nodes of colour ``k`` (a preallocated int32 index array); by default the rows
  of each colour are kept as a CSR slice of their own (:data:`SLICED`), so the
  kernel reads the colour's entries contiguously.  ``tpr`` threads
  share a row (a node's rows) and reduce with warp shuffles, about one entry
  per lane (:func:`gs_threads_per_row`: a colour launch is latency-bound).  The
  residual is computed in registers and ``x`` is updated in place: no
  temporaries, no allocation, no host synchronisation, so a sweep can be
  recorded in a CUDA graph.
* CPU (the twin): the rows of colour ``k`` as a SciPy CSR row slice prepared at
  setup; ``r = b_C - A_C x`` is one compiled product and the update one vectorised
  NumPy expression.

Block GS can instead read each colour's node rows as ``c x c`` blocks (BSR,
:data:`BLOCK_LAYOUT` = "bsr", kernel ``adaptmg_gs_bsr<c>_<type>``: one column index and
``c`` contiguous ``x`` entries per block), the host's default: on the H200, 3-D elasticity with
1,683,867 DoFs (``scripts/bench_elasticity_gs.py --size 10 --gs-layout csr,bsr --parts
static,sweep``), two block GS sweeps of the finest level take 1.55 ms against 2.46 ms with
the CSR slices (block Jacobi 0.83 ms) and the CG solve 55.8 ms against 84.0 ms.

The "split" layout (:mod:`adaptmg.device.gs_split`) splits each node row by the colour of its
couplings and reuses a stored half-product across alternating sweeps (fewer passes over ``A``):
the GPU's default for node blocks (``BLOCK_LAYOUT = "auto"``), one V-cycle 3.25 ms against
3.63 ms with "bsr" in the benchmark above.

The slices are cut where ``A`` lives (:func:`colour_slices`: one gather of every entry
into colour order and one view per colour, the same ``xp`` code on both backends), so a
device matrix is never copied to the host to build a plan.

GPU and CPU results differ by the order of the row sums only (round-off).
"""
from __future__ import annotations

import functools

import numpy as np
import scipy.sparse as sp

from ..backend import backend_of, csr_from_arrays, to_host
from ..fe.csr_ops import csr_entry_rows
from ..multilevel.coloring import csr_row_positions
from .kernels import _ctype as ctype_of

__all__ = ["make_colored_sweep", "ColoredSweep", "MAX_GPU_BLOCK", "SLICED", "kernel_name",
           "gs_threads_per_row", "GS_MIN_THREADS", "colour_slices", "colour_rows",
           "colour_blocks", "node_blocks", "BLOCK_LAYOUT", "LAYOUTS", "THREADS_PER_ROW", "resolve_layout"]

#: largest block size with a device kernel (the node's residual lives in registers)
MAX_GPU_BLOCK = 16

_GS_SRC = r"""
// Gauss-Seidel update of the rows of one colour: x_i += omega dinv_i (b_i - A_i x).
// tpr threads per row (1 or a power of two <= 32) reduce with shuffles; every thread of
// the grid reaches the shuffles (loads are guarded, the shuffles are not).
// sliced != 0: (indptr, indices, data) hold only the rows of this colour, in order (row t of
// the slice is matrix row rows[t]): contiguous, coalesced reads of the colour's entries.
extern "C" __global__ void adaptmg_gs_point_{T}(
    const int m, const int tpr, const int sliced, const int* __restrict__ rows,
    const int* __restrict__ indptr, const int* __restrict__ indices, const {T}* __restrict__ data,
    const {T}* __restrict__ b, const {T}* __restrict__ dinv, const {T} omega, {T}* x)
{
    const int tid = blockDim.x * blockIdx.x + threadIdx.x;
    const int t = tid / tpr, lane = tid % tpr;
    const int i = t < m ? rows[t] : 0;
    const int r = sliced ? t : i;
    {T} s = 0;
    if (t < m)
        for (int k = indptr[r] + lane; k < indptr[r + 1]; k += tpr) s += data[k] * x[indices[k]];
    for (int off = tpr / 2; off > 0; off >>= 1) s += __shfl_down_sync(0xffffffffu, s, off, tpr);
    if (t < m && lane == 0) x[i] += omega * dinv[i] * (b[i] - s);
}
"""

_GS_BLOCK_SRC = r"""
// Block Gauss-Seidel update of the nodes of one colour: rows c p .. c p + c - 1 of node p,
// x_P += omega Binv_p (b_P - A_P x), Binv_p the inverse c x c diagonal block (row-major).
extern "C" __global__ void adaptmg_gs_block{C}_{T}(
    const int m, const int tpr, const int sliced, const int* __restrict__ nodes,
    const int* __restrict__ indptr, const int* __restrict__ indices, const {T}* __restrict__ data,
    const {T}* __restrict__ b, const {T}* __restrict__ binv, const {T} omega, {T}* x)
{
    const int tid = blockDim.x * blockIdx.x + threadIdx.x;
    const int t = tid / tpr, lane = tid % tpr;
    const int p = t < m ? nodes[t] : 0;
    {T} r[{C}];
#pragma unroll
    for (int q = 0; q < {C}; ++q) {
        {T} s = 0;
        if (t < m) {
            const int i = sliced ? t * {C} + q : p * {C} + q;
            for (int k = indptr[i] + lane; k < indptr[i + 1]; k += tpr) s += data[k] * x[indices[k]];
        }
        for (int off = tpr / 2; off > 0; off >>= 1) s += __shfl_down_sync(0xffffffffu, s, off, tpr);
        r[q] = s;
    }
    if (t < m && lane == 0) {
        const {T}* B = binv + (size_t)p * ({C} * {C});
#pragma unroll
        for (int q = 0; q < {C}; ++q) r[q] = b[p * {C} + q] - r[q];
        {T} u[{C}];
#pragma unroll
        for (int q = 0; q < {C}; ++q) {
            {T} acc = 0;
#pragma unroll
            for (int l = 0; l < {C}; ++l) acc += B[q * {C} + l] * r[l];
            u[q] = acc;
        }
#pragma unroll
        for (int q = 0; q < {C}; ++q) x[p * {C} + q] += omega * u[q];
    }
}
"""

# Block Gauss-Seidel on node blocks stored as BSR (``bptr``/``bcol`` over the colour's node rows,
# ``bval`` the c x c blocks row-major): a lane reads one block column index and c contiguous x
# entries per c*c values, where the CSR kernel reads c indices and c x entries per c values
# (elasticity, c = 3: 76 bytes a block, 8.4 instead of 12 an entry; a third of the dependent loads).
# The residual's tail (lane 0 applies the inverse block) is the CSR block kernel's, verbatim.
_GS_BSR_HEAD = r"""
extern "C" __global__ void adaptmg_gs_bsr{C}_{T}(
    const int m, const int tpr, const int* __restrict__ nodes,
    const int* __restrict__ bptr, const int* __restrict__ bcol, const {T}* __restrict__ bval,
    const {T}* __restrict__ b, const {T}* __restrict__ binv, const {T} omega, {T}* x)
{
    const int tid = blockDim.x * blockIdx.x + threadIdx.x;
    const int t = tid / tpr, lane = tid % tpr;
    const int p = t < m ? nodes[t] : 0;
    {T} r[{C}];
#pragma unroll
    for (int q = 0; q < {C}; ++q) r[q] = 0;
    if (t < m)
        for (int k = bptr[t] + lane; k < bptr[t + 1]; k += tpr) {
            const {T}* Ak = bval + (size_t)k * ({C} * {C});
            const {T}* xj = x + (size_t)bcol[k] * {C};
            {T} xv[{C}];
#pragma unroll
            for (int l = 0; l < {C}; ++l) xv[l] = xj[l];
#pragma unroll
            for (int q = 0; q < {C}; ++q)
#pragma unroll
                for (int l = 0; l < {C}; ++l) r[q] += Ak[q * {C} + l] * xv[l];
        }
#pragma unroll
    for (int q = 0; q < {C}; ++q)
        for (int off = tpr / 2; off > 0; off >>= 1) r[q] += __shfl_down_sync(0xffffffffu, r[q], off, tpr);
"""
_GS_BSR_SRC = _GS_BSR_HEAD + _GS_BLOCK_SRC[_GS_BLOCK_SRC.index("    if (t < m && lane == 0) {"):]


def _ctype(dtype):
    return ctype_of(dtype, "Gauss-Seidel kernels")


def kernel_name(block_size, dtype):
    """Name of the device kernel for ``block_size`` and ``dtype`` (``adaptmg_gs_...``)."""
    ct = _ctype(dtype)
    return f"adaptmg_gs_point_{ct}" if block_size == 1 else f"adaptmg_gs_block{int(block_size)}_{ct}"


def bsr_kernel_name(block_size, dtype):
    """Name of the BSR block kernel (``adaptmg_gs_bsr<c>_<type>``, :data:`BLOCK_LAYOUT`)."""
    return f"adaptmg_gs_bsr{int(block_size)}_{_ctype(dtype)}"


@functools.lru_cache(maxsize=None)
def _gs_module(xp, ctype, block_size, bsr=False):
    """The RawModule holding ``kernel_name(block_size, ctype)`` (``bsr``: the BSR kernel's)
    (built once per key)."""
    if block_size == 1:
        code = _GS_SRC.replace("{T}", ctype)
    else:
        code = (_GS_BSR_SRC if bsr else _GS_BLOCK_SRC).replace("{T}", ctype).replace("{C}", str(int(block_size)))
    return xp.RawModule(code=code)


class ColoredSweep:
    """Plan of the colour updates of one matrix on one backend (see the module docstring).

    ``color(k, x, b, omega)`` updates the rows of colour ``k`` in place;
    ``sweep(x, b, omega, order)`` runs the colours in ``order`` (a sequence of
    colour indices).  Built by :func:`make_colored_sweep`.
    """

    def __init__(self, A, groups, block_size):
        self.A = A
        self.block_size = int(block_size)
        self.ncolors = len(groups)
        self.sizes = tuple(int(g.size) for g in groups)

    def color(self, k, x, b, omega):  # pragma: no cover - abstract
        raise NotImplementedError

    def sweep(self, x, b, omega, order, zero_initial=False):
        """The colours ``order`` one after another (``zero_initial``: ``x`` is zero on entry, which
        this plan does not use; :class:`~adaptmg.device.gs_split.SplitColoredSweep` does)."""
        for k in order:
            self.color(k, x, b, omega)
        return x


def colour_slices(A, groups, block_size=1):
    r"""The rows of each colour as a CSR matrix of their own, cut from CSR ``A`` on its backend.

    With ``C_k`` the rows of the nodes ``groups[k]`` (``c p .. c p + c - 1`` for node ``p``,
    ``c = block_size``, in node order), the slices are the row blocks of the colour-ordered
    matrix ``P A`` (``P`` the permutation that lists ``C_1, C_2, ...``): one gather of all of
    ``A``'s entries -- on the device :func:`~adaptmg.multilevel.coloring.csr_row_positions`
    (row lengths, a running sum, a segmented expansion: whole-array operations, no copy of
    ``A`` to the host), on the host SciPy's row indexing -- then one view per colour.  Returns a list of ``(rows, indptr,
    indices, data)``: ``rows`` (int64) the matrix rows ``C_k``; ``indptr`` (int32, rebased to
    0) and views ``indices``, ``data`` of the gathered arrays, so that row ``t`` of the slice
    is matrix row ``rows[t]``.  Host reads: the ``K + 1`` colour boundaries.
    """
    be = backend_of(A)
    xp = be.xp
    c = int(block_size)
    if not groups:
        return []
    nodes = xp.concatenate([be.asarray(g).astype(xp.int64, copy=False) for g in groups])
    rows = nodes if c == 1 else (nodes[:, None] * c + xp.arange(c, dtype=xp.int64)[None, :]).reshape(-1)
    nnz = int(A.indices.shape[0])
    if nnz >= 2**31 - 1:
        raise ValueError(f"colour slices: {nnz} stored entries do not fit int32 row pointers")
    if be.is_gpu:
        ptr, pos = csr_row_positions(be, A.indptr, rows, nnz)
        indices, data = A.indices[pos], A.data[pos]
    else:                              # SciPy's compiled row gather (3x faster than the above)
        P = A[rows]
        ptr, indices, data = P.indptr, P.indices, P.data
    return _per_colour(be, groups, c, ptr, rows, (indices, 1), (data, 1))


def _per_colour(be, groups, c, ptr, rows, *entries):
    """Cut a colour-ordered gather into one piece per colour: ``(rows, indptr, *entries)`` with
    ``rows[r0:r1]`` (``c`` rows a node), the row pointer rebased to 0 (int32) and, for each
    ``(array, w)`` of ``entries``, the view ``array[w s:w e]`` of the colour's entries
    ``s..e`` (``w`` values an entry).  Reads the ``K + 1`` colour boundaries to the host."""
    bounds = np.concatenate([[0], np.cumsum([int(g.shape[0]) for g in groups])]) * c
    ends = to_host(ptr[be.asarray(bounds)]) if be.is_gpu else ptr[bounds]
    out = []
    for k in range(len(groups)):
        r0, r1, s, e = int(bounds[k]), int(bounds[k + 1]), int(ends[k]), int(ends[k + 1])
        out.append((rows[r0:r1], (ptr[r0:r1 + 1] - s).astype(be.xp.int32))
                   + tuple(a[w * s:w * e] for a, w in entries))
    return out


def colour_rows(A, groups, inv, block_size=1):
    """Per colour, on ``A``'s backend: the matrix rows ``C_k``, the slice ``A[C_k, :]`` as a
    CSR matrix (SciPy or cupyx; :func:`colour_slices`) and ``D^{-1}`` of the colour --
    ``inv[C_k]`` (``block_size = 1``) or the inverse blocks ``inv[groups[k]]``.  Three lists."""
    be = backend_of(A)
    rows_, mats, invs = [], [], []
    for g, (rows, ptr, idx, dat) in zip(groups, colour_slices(A, groups, block_size)):
        rows_.append(rows)
        mats.append(csr_from_arrays(be.sparse, dat, idx, ptr, (int(rows.shape[0]), A.shape[1])))
        invs.append(inv[rows] if block_size == 1 else be.xp.ascontiguousarray(inv[g]))
    return rows_, mats, invs


class _CpuColoredSweep(ColoredSweep):
    """The ``xp`` twin: per colour the CSR row slice ``A[C, :]`` (:func:`colour_slices`) and
    ``D_CC^{-1}``, on ``A``'s backend.

    On the host this is the CPU plan (one compiled SciPy product per colour); on the GPU
    (a cupyx ``A``) the same code runs on CuPy arrays and cupyx slices: the path of complex
    matrices, which the RawKernels do not cover (one SpMV and a few element-wise launches
    per colour)."""

    def __init__(self, A, groups, inv, block_size):
        super().__init__(A, groups, block_size)
        self._xp = backend_of(A).xp
        self._rows, self._A, self._inv = colour_rows(A, groups, inv, self.block_size)

    def color(self, k, x, b, omega):
        rows = self._rows[k]
        r = b[rows] - self._A[k] @ x
        if self.block_size == 1:
            r *= self._inv[k]
        else:
            c = self.block_size
            r = self._xp.einsum("mkl,ml->mk", self._inv[k], r.reshape(-1, c)).reshape(-1)
        r *= omega
        x[rows] += r
        return x


#: GPU: keep a copy of each colour's rows as its own CSR slice (contiguous reads; one more
#: copy of the matrix entries in device memory) instead of indexing into ``A``
SLICED = True


#: lanes a colour launch should fill before its rows get more lanes each (2^16: about half an
#: H200's resident threads)
GS_MIN_THREADS = 1 << 16


def gs_threads_per_row(nnz_per_row: float, rows=None) -> int:
    """Threads per row of the colour kernels: the power of two <= min(32, nnz_per_row), then
    doubled (up to 32) while a launch of ``rows`` rows would have fewer than
    :data:`GS_MIN_THREADS` lanes.

    A colour holds 1/K of the rows (K = 7-15 colours for 3-D Q1), so a colour launch has few
    rows and each thread's loop over its row is a chain of dependent loads (``indices[k]``,
    then ``x[indices[k]]``): latency, not bandwidth, sets the time.  About one entry per
    lane shortens the chain to one or two loads; the fused full-matrix kernels' rule
    (:func:`~adaptmg.device.kernels.threads_per_row`, about five entries per lane) is
    tuned for launches over every row.  Measured on an H200, 3-D elasticity (edge 6,
    104,955 DoFs, 15 colours, V(2,2) symmetric block GS, CUDA graph): cycle 9.0 -> 2.5 ms,
    CG solve 83.9 -> 22.9 ms (block Jacobi: 0.23 ms and 4.3 ms).  Reading a node's c rows
    as one contiguous range in one strided loop instead of one loop per row measured
    the same (2.46 ms): what is left is launches and the load chain nodes -> indptr ->
    indices -> x of each small launch.  The split kernel's V-cycle with every colour at
    8 / 16 / 32 lanes a node row (27 blocks a row; H200, ``dev``-style A/B): edge 6, 2.3k
    nodes a colour, 0.84 / 0.73 / 0.67 ms; edge 10 (1,683,867 DoFs, 37k nodes a colour)
    3.20 / 3.52 / 4.60 ms -- hence the lane floor ``rows``."""
    t = 1
    while t < 32 and 2 * t <= nnz_per_row:
        t *= 2
    if rows is not None:
        while t < 32 and int(rows) * t < GS_MIN_THREADS:
            t *= 2
    return t


def colour_blocks(A, groups, block_size):
    """The node rows of each colour in BSR form (``c x c`` blocks, ``c = block_size``), cut
    from CSR ``A`` on its backend: a list of ``(nodes, bptr, bcol, bval)`` -- the colour's
    nodes, int32 block row pointer (rebased to 0), block columns (int32) and the blocks
    (row-major, flattened), views of one gather in colour order.

    Every stored entry ``(i, j)`` lands in block ``(i // c, j // c)`` at ``(i % c, j % c)``:
    one sort of the block keys (``unique``), a weighted ``bincount`` into the blocks (sums
    duplicates; entries a block does not store are zeros), then the node rows gathered in
    colour order as in :func:`colour_slices`.  Host reads: the colour boundaries."""
    be = backend_of(A)
    c = int(block_size)
    ptr, nodes, bcol, bval = node_blocks(A, groups, c)
    return _per_colour(be, groups, 1, ptr, nodes, (bcol, 1), (bval, c * c))


def node_blocks(A, groups, block_size):
    """The gather behind :func:`colour_blocks`, whole: ``(ptr, nodes, bcol, bval)`` -- the
    int64 block row pointer of the node rows in colour order (``groups[0]``'s nodes first),
    those nodes (int64), the block columns (int32) and the ``c x c`` blocks (row-major,
    flattened), on ``A``'s backend."""
    be = backend_of(A)
    xp = be.xp
    c = int(block_size)
    N, nnz = A.shape[0] // c, int(A.indices.shape[0])
    rows = csr_entry_rows(A.indptr, nnz)
    cols = A.indices.astype(xp.int64)
    ukey, which = xp.unique((rows // c) * N + cols // c, return_inverse=True)
    nb = int(ukey.shape[0])
    if nb >= 2**31 - 1:
        raise ValueError(f"colour blocks: {nb} stored blocks do not fit int32 row pointers")
    flat = which.reshape(-1) * (c * c) + (rows % c) * c + cols % c
    bval = xp.bincount(flat, weights=A.data, minlength=nb * c * c).astype(A.dtype).reshape(nb, c * c)
    bptr = xp.zeros(N + 1, dtype=xp.int64)
    bptr[1:] = xp.cumsum(xp.bincount(ukey // N, minlength=N))
    nodes = xp.concatenate([be.asarray(g).astype(xp.int64, copy=False) for g in groups])
    ptr, pos = csr_row_positions(be, bptr, nodes, nb)
    return ptr, nodes, (ukey % N)[pos].astype(xp.int32), bval[pos].reshape(-1)


#: GPU block Gauss-Seidel (``block_size > 1``): "bsr" (the default) -- each colour's node rows
#: as ``c x c`` blocks (:func:`colour_blocks`, kernel ``adaptmg_gs_bsr<c>_<type>``): fewer bytes
#: and dependent loads per entry, 1.6x faster sweeps than "csr" on the H200 (module docstring);
#: "csr" -- each colour's rows as a CSR slice, ``c`` row loops per node
#: (``scripts/bench_elasticity_gs.py --gs-layout csr,bsr`` compares them); "split" -- the node
#: rows as blocks split into the couplings to lower and to higher colours, and a stored half
#: reused by the next update of the colour (:mod:`adaptmg.device.gs_split`: a symmetric sweep
#: reads 1.5 instead of 2 passes of ``A``, alternating sweeps half a pass each after the first);
#: unlike the other two it applies to every block size (``c = 1`` too) and to the host plan
#: "auto" (the default): "split" for node blocks (c > 1) on the GPU -- one V-cycle of 3-D
#: elasticity with 1,683,867 DoFs, GS on the finest level, 3.25 ms against 3.63 ms with "bsr"
#: (block Jacobi 1.77 ms; H200, ``bench_elasticity_gs.py --size 10 --gs-layout bsr,split``) --
#: and "bsr" elsewhere (the host plan and scalar GS unchanged: :func:`resolve_layout`)
BLOCK_LAYOUT = "auto"
LAYOUTS = ("auto", "csr", "bsr", "split")


def resolve_layout(layout, on_gpu: bool, block_size: int) -> str:
    """The layout a colour plan takes: ``layout`` (None: :data:`BLOCK_LAYOUT`), "auto" resolved
    to "split" for node blocks on the GPU and to "bsr" otherwise (checked against
    :data:`LAYOUTS`)."""
    layout = BLOCK_LAYOUT if layout is None else layout
    if layout not in LAYOUTS:
        raise ValueError(f"make_colored_sweep: layout must be one of {LAYOUTS}, got {layout!r}")
    if layout == "auto":
        return "split" if on_gpu and int(block_size) > 1 else "bsr"
    return layout

#: threads per row (node row for blocks) of the GPU colour kernels: None = :func:`gs_threads_per_row`,
#: else a power of two <= 32 (for tuning: ``scripts/bench_elasticity_gs.py --parts sweep --gs-tpr``)
THREADS_PER_ROW = None


class _GpuColoredSweep(ColoredSweep):
    """CuPy: one RawKernel launch per colour over a preallocated int32 node index array.
    Everything is built on the device from the device ``A``, ``groups`` and ``inv``.
    ``slices``: per colour the (row pointer, columns, values) its launch reads."""

    _THREADS = 128

    def __init__(self, A, groups, inv, block_size, be, sliced=None, layout=None):
        super().__init__(A, groups, block_size)
        c = self.block_size
        if c > MAX_GPU_BLOCK:
            raise ValueError(f"block Gauss-Seidel on the GPU supports block_size <= {MAX_GPU_BLOCK}, "
                             f"got {c}")
        if A.indices.dtype != np.int32 or A.indptr.dtype != np.int32:
            raise TypeError("the Gauss-Seidel kernels need int32 CSR indices")
        layout = resolve_layout(layout, True, c) if c > 1 else "csr"
        if layout not in ("csr", "bsr"):
            raise ValueError(f"Gauss-Seidel block layout must be 'csr' or 'bsr', got {layout!r}")
        xp = be.xp
        dt = np.dtype(A.dtype)
        self._t = dt.type
        self.layout = layout
        bsr = layout == "bsr"
        name = bsr_kernel_name(c, dt) if bsr else kernel_name(c, dt)
        self._fn = _gs_module(xp, _ctype(dt), c, bsr).get_function(name)
        self._inv = xp.ascontiguousarray(inv.astype(dt, copy=False)).reshape(-1)
        self.sliced = sliced = bsr or (SLICED if sliced is None else bool(sliced))
        if bsr:
            slices = colour_blocks(A, groups, c)
            per_row = sum(int(sl[2].shape[0]) for sl in slices) / max(A.shape[0] // c, 1)
        else:
            slices = colour_slices(A, groups, c) if sliced else \
                [(None, A.indptr, A.indices, A.data)] * len(groups)
            per_row = A.nnz / max(A.shape[0], 1)
        self.slices = [sl[1:] for sl in slices]
        flag = () if bsr else (np.int32(1 if sliced else 0),)
        self._launch = []
        for g, sl in zip(groups, self.slices):
            m = int(g.shape[0])
            tpr = THREADS_PER_ROW or gs_threads_per_row(per_row, m)     # more lanes for small colours
            grid = ((m * tpr + self._THREADS - 1) // self._THREADS,)
            self._launch.append((grid, (np.int32(m), np.int32(tpr)) + flag + (g.astype(xp.int32),) + sl))

    @property
    def lanes(self):
        """Threads a row of each colour's launch (:func:`gs_threads_per_row` of its size)."""
        return [int(head[1]) for _, head in self._launch]

    def color(self, k, x, b, omega):
        grid, head = self._launch[k]
        self._fn(grid, (self._THREADS,), head + (b, self._inv, self._t(omega), x))
        return x


def make_colored_sweep(A, groups, inv, block_size=1, sliced=None, layout=None):
    """Plan of the colour updates of ``A`` on ``A``'s backend, built there.

    ``A``: CSR matrix on its backend (SciPy or cupyx, the smoother's dtype);
    ``groups``: int arrays, the nodes of each colour; ``inv``: ``D^{-1}`` -- the
    inverse diagonal (length ``n``) for ``block_size = 1``, else the inverse node
    blocks, shape ``(n / c, c, c)``.  ``groups`` and ``inv`` are moved to ``A``'s
    backend when they live elsewhere (given on the device for a cupyx ``A``, nothing is
    copied to the host).  GPU only: ``sliced`` (default :data:`SLICED`) stores each
    colour's rows as a CSR slice of their own (:func:`colour_slices`, cut on the device);
    ``layout`` "csr" / "bsr" / "auto" (default :data:`BLOCK_LAYOUT`) chooses the block kernels.  The
    "split" layout's plan is built by :func:`adaptmg.device.gs_split.make_colored_sweep`
    (the one the smoothers call); here it reads full rows as "bsr".
    """
    layout = resolve_layout(layout, backend_of(A).is_gpu, block_size)
    be, groups, inv = plan_inputs(A, groups, inv, block_size)
    c = int(block_size)
    if be.is_gpu and np.dtype(A.dtype).kind != "c":
        return _GpuColoredSweep(A, groups, inv, c, be, sliced=sliced, layout="bsr" if layout == "split" else layout)
    # the twin: the host plan, and the GPU's for complex matrices (no complex RawKernel)
    return _CpuColoredSweep(A, groups, inv.astype(A.dtype, copy=False), c)


def plan_inputs(A, groups, inv, block_size):
    """``(backend, groups, inv)`` of a colour plan: the shape of ``inv`` checked, ``A`` a CSR
    matrix, ``groups`` and ``inv`` on ``A``'s backend."""
    c = int(block_size)
    n = A.shape[0]
    want = (n,) if c == 1 else (n // c, c, c)
    if tuple(inv.shape) != want:
        raise ValueError(f"make_colored_sweep: inverse diagonal must have shape {want}, "
                         f"got {tuple(inv.shape)}")
    be = backend_of(A)
    if not be.is_gpu and not (sp.issparse(A) and A.format == "csr"):
        raise TypeError(f"make_colored_sweep: A must be a CSR matrix, got {type(A).__name__}")
    return be, [be.asarray(g) for g in groups], be.asarray(inv)
