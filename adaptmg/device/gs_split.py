r"""Gauss-Seidel colour updates that reuse half of the row products across alternating sweeps.

With the colours ``1..K`` of a colouring of the node graph of ``A`` (rows of one colour never
coupled), the row block of colour ``k`` splits into the couplings to lower colours, the
diagonal node blocks and the couplings to higher colours,

.. math::  A_{C_k,:}\, x = L_k x + D_k x_{C_k} + U_k x, \qquad
           x_{C_k} \leftarrow x_{C_k} + \omega\, D_k^{-1} (b_{C_k} - L_k x - D_k x_{C_k} - U_k x)

(``L_k x`` reads only colours ``< k``, ``U_k x`` only colours ``> k``).  A forward sweep updates
``1, 2, .., K``, a backward one ``K, .., 1``.  Between the forward update of colour ``k`` and the
backward one that follows, only colours ``> k`` change: ``L_k x`` is the same at both, and the
backward update needs ``U_k x`` alone; between a backward update of ``k`` and the next forward
one only colours ``< k`` change, so ``U_k x`` carries over.  Each update stores the half it
computed and the next one reads it back: every one-way sweep of a run of alternating sweeps
after the first reads *half* of ``A`` -- the symmetric sweep of SSOR at the cost of 1.5 passes
over ``A`` instead of 2, two of them at 2 instead of 4 (SSOR at the cost of SOR, the
alternating-direction reuse of Conrad and Wallach, 1979).  From ``x = 0`` the first sweep's other
half is zero as well (``U_k x = 0`` in a forward sweep until the colours above ``k`` are
updated).  Reuse is exact: the stored half is the product of the same ``x`` entries, summed in
another order than a full row (round-off only); the ``A``-adjointness of forward and backward
sweeps, and so the symmetric V-cycle, are unchanged.

:meth:`SplitColoredSweep.schedule` plans a colour sequence once (cached per sequence): for
every update whether each half is *zero* (``x = 0`` on its colours since the sweep started
from zero), *read* from the store (no colour of that half changed since it was stored) or
*computed*, and which computed half to store -- the one still valid at the colour's next update
(a look-ahead over the sequence: the rule holds for any order and any ``omega``).  The store is
one vector of length ``n`` (the colour's rows hold its last stored half), owned by the plan.

The residual ``r = b - A x`` after the sweeps (the multigrid restriction's, through
``GaussSeidel.smooth(..., residual=r)``) is one more step per colour that writes ``r`` and
leaves ``x``: after a sweep that ends backward every colour's upper half is still valid (no
colour above ``k`` changes after its last update), so the residual reads the lower halves
only -- half a pass instead of the SpMV's one.  The kernel takes a row's empty half as zero in
every mode, so these steps (the same modes for all colours but colour 0's empty lower and
colour ``K``'s empty upper half) run as one launch over every node row.

Cost per V(2,2) cycle with symmetric sweeps on the finest level (``K`` colours, passes over
``A``; the CPU counts of ``scripts/bench_elasticity_gs.py``, ``fine_passes``): full rows
``2 (4K - 3) / K`` for the smoothing and one for the residual, 8.72 on the bench's size-3 mesh
(14 colours); split 2 + 2.5 for the smoothing (pre-smoothing from zero, post from the corrected
``x``) and 0.56 for the residual (half the off-diagonal blocks and the diagonal ones), 5.21.

Layout: the node rows of every colour as ``c x c`` blocks (BSR, as
:func:`~adaptmg.device.gs_kernels.colour_blocks`), each row's blocks reordered *lower colours
first, then higher colours*, the diagonal blocks apart (``dval``, in colour order) and
``nlow`` the count of lower blocks of each row; ``c = 1`` is point Gauss-Seidel.

* GPU: one launch of ``adaptmg_gs_split<c>_<type>`` per colour (``tpr`` lanes a node row, warp
  shuffles), reading only the blocks of the halves it computes; no allocation, no host
  synchronisation (CUDA graphs).
* CPU (the twin, for a SciPy ``A``, as :mod:`~adaptmg.device.gs_kernels` chooses its plans):
  per colour the two halves as SciPy BSR (CSR for ``c = 1``) matrices, one compiled product
  each, and the same schedule.
"""
from __future__ import annotations

import functools

import numpy as np
import scipy.sparse as sp

from ..backend import backend_of, repeat, to_host
from ..fe.csr_ops import csr_entry_rows
from . import gs_kernels, pdl
from .gs_kernels import MAX_GPU_BLOCK, ColoredSweep, _ctype, gs_threads_per_row, node_blocks, plan_inputs

__all__ = ["make_colored_sweep", "SplitColoredSweep", "split_blocks", "split_gather", "split_kernel_name", "ZERO", "COMPUTE",
           "READ", "RESIDUAL"]

#: a half of an update: zero (x = 0 on its colours), computed from A, or read from the store
ZERO, COMPUTE, READ = 0, 1, 2
#: ``save`` of a residual step: ``r_C = b_C - A_{C,:} x`` written out, ``x`` left as it is
RESIDUAL = 3

_SPLIT_SRC = r"""
// Gauss-Seidel update of the nodes of one colour with the row's blocks split into couplings to
// lower colours [bptr[t], bptr[t] + nlow[t]) and to higher ones [.., bptr[t + 1]):
// x_P += omega Binv_p (b_P - l - D_p x_P - u), l / u each zero (0), computed (1) or read
// from the store h (2); save = 1 / 2 stores the computed l / u in h; save = 3 writes the
// residual b_P - l - D_p x_P - u to out and leaves x alone.  A row's empty half is zero in
// every mode (one launch may then cover rows of several colours).  tpr lanes a node row.
extern "C" __global__ void adaptmg_gs_split{C}_{T}{SUFFIX}(
    const int m, const int tpr, const int* __restrict__ nodes, const int* __restrict__ bptr,
    const int* __restrict__ nlow, const int* __restrict__ bcol, const {T}* __restrict__ bval,
    const {T}* __restrict__ dval, const {T}* __restrict__ b, const {T}* __restrict__ binv,
    const {T} omega, {T}* x, {T}* h, {T}* out, const int lo, const int up, const int save)
{
    const int tid = blockDim.x * blockIdx.x + threadIdx.x;
    const int t = tid / tpr, lane = tid % tpr;
    const int p = t < m ? nodes[t] : 0;
    {T} sl[{C}], su[{C}];
#pragma unroll
    for (int q = 0; q < {C}; ++q) { sl[q] = 0; su[q] = 0; }
    const int k0 = t < m ? bptr[t] : 0, k1 = t < m ? k0 + nlow[t] : 0, k2 = t < m ? bptr[t + 1] : 0;
    const bool head = t < m && lane == 0;
    // the _pre kernel (launches of a wave or less): lane 0's diagonal and inverse blocks, the
    // plan's own, held in registers and loaded before the wait (blocks of at most 16 entries), so
    // that after the row products only the shuffles stand between the vector loads and the
    // update; on larger launches the registers cost more occupancy than the early loads gain
    constexpr bool pre = {PRE} && {C} <= 4;
    {T} Bp[pre ? {C} * {C} : 1], Dp[pre ? {C} * {C} : 1], xo[{C}], bo[{C}], ho[{C}];
    const {T}* Bg = binv + (size_t)p * ({C} * {C});
    const {T}* Dg = dval + (size_t)t * ({C} * {C});
    if (pre && head) {
#pragma unroll
        for (int q = 0; q < (pre ? {C} * {C} : 1); ++q) { Bp[q] = Bg[q]; Dp[q] = Dg[q]; }
    }
    ADAPTMG_GRID_WAIT();        // above: the plan's own arrays; below: x, h, b written by kernels
    if (head) {
#pragma unroll
        for (int q = 0; q < {C}; ++q) { xo[q] = x[p * {C} + q]; bo[q] = b[p * {C} + q]; ho[q] = h[p * {C} + q]; }
    }
    if (t < m) {
        const int s = lo == 1 ? k0 : k1, e = up == 1 ? k2 : k1;
        for (int k = s + lane; k < e; k += tpr) {
            const {T}* Ak = bval + (size_t)k * ({C} * {C});
            const {T}* xj = x + (size_t)bcol[k] * {C};
            {T} xv[{C}];
#pragma unroll
            for (int l = 0; l < {C}; ++l) xv[l] = xj[l];
            if (k < k1) {
#pragma unroll
                for (int q = 0; q < {C}; ++q)
#pragma unroll
                    for (int l = 0; l < {C}; ++l) sl[q] += Ak[q * {C} + l] * xv[l];
            } else {
#pragma unroll
                for (int q = 0; q < {C}; ++q)
#pragma unroll
                    for (int l = 0; l < {C}; ++l) su[q] += Ak[q * {C} + l] * xv[l];
            }
        }
    }
    if (lo == 1)
#pragma unroll
        for (int q = 0; q < {C}; ++q)
            for (int off = tpr / 2; off > 0; off >>= 1) sl[q] += __shfl_down_sync(0xffffffffu, sl[q], off, tpr);
    if (up == 1)
#pragma unroll
        for (int q = 0; q < {C}; ++q)
            for (int off = tpr / 2; off > 0; off >>= 1) su[q] += __shfl_down_sync(0xffffffffu, su[q], off, tpr);
    if (head) {
        {T} r[{C}];
#pragma unroll
        for (int q = 0; q < {C}; ++q) {
            const {T} l = lo == 2 && k1 > k0 ? ho[q] : sl[q];     // an empty half is 0
            const {T} u = up == 2 && k2 > k1 ? ho[q] : su[q];
            {T} d = 0;
#pragma unroll
            for (int j = 0; j < {C}; ++j) d += (pre ? Dp[pre ? q * {C} + j : 0] : Dg[q * {C} + j]) * xo[j];
            r[q] = bo[q] - l - d - u;
            if (save == 1) h[p * {C} + q] = l;
            else if (save == 2) h[p * {C} + q] = u;
            else if (save == 3) out[p * {C} + q] = r[q];
        }
        if (save == 3) return;
#pragma unroll
        for (int q = 0; q < {C}; ++q) {
            {T} acc = 0;
#pragma unroll
            for (int j = 0; j < {C}; ++j) acc += (pre ? Bp[pre ? q * {C} + j : 0] : Bg[q * {C} + j]) * r[j];
            x[p * {C} + q] = xo[q] + omega * acc;
        }
    }
}
"""


#: launches of at most this many threads use the ``_pre`` kernel (the diagonal and inverse blocks
#: loaded before the grid wait).  One V-cycle, 3-D elasticity, GS on the finest level (H200, A/B
#: in one process): 104,955 DoFs (2.3k nodes a colour, 32 lanes a node) 0.635 -> 0.597 ms
#: symmetric, 0.456 -> 0.432 ms forward/backward; 1,683,867 DoFs (37k nodes a colour, 8 lanes)
#: 3.30 -> 3.79 ms with it on every launch
PREFETCH_MAX_THREADS = 1 << 17


def split_kernel_name(block_size, dtype, prefetch=False):
    """Name of the split kernel for ``block_size`` and ``dtype`` (``adaptmg_gs_split<c>_<type>``,
    ``_pre`` appended for the prefetching variant)."""
    return f"adaptmg_gs_split{int(block_size)}_{_ctype(dtype)}" + ("_pre" if prefetch else "")


@functools.lru_cache(maxsize=None)
def _split_module(xp, ctype, block_size, prefetch=False):
    """The split kernel's module (:func:`adaptmg.device.pdl.module`: in a CUDA graph each colour
    launch overlaps the previous one's tail up to ``ADAPTMG_GRID_WAIT``)."""
    return pdl.module(xp, _SPLIT_SRC.replace("{T}", ctype).replace("{C}", str(int(block_size)))
                      .replace("{PRE}", "true" if prefetch else "false").replace("{SUFFIX}", "_pre" if prefetch else ""))


def split_blocks(A, groups, block_size):
    """:func:`split_gather` cut into one piece per colour (views; see there)."""
    be = backend_of(A)
    whole, bounds, ends = split_gather(A, groups, block_size)
    return _cut(be.xp, whole, bounds, ends, int(block_size) ** 2)


def split_gather(A, groups, block_size):
    r"""The node rows of every colour, in colour order, as blocks split by the colour of their
    column node, gathered from CSR ``A`` on its backend: ``(whole, bounds, ends)`` with ``whole
    = (nodes, bptr, nlow, bcol, bval, dval)`` -- the nodes (int32), the int32 block row pointer
    of their off-diagonal blocks, ``nlow`` (int32) the count of each row's blocks to lower
    colours (they come first, in column order, then the higher colours'), the block columns
    (int32), the blocks (row-major, flattened) and the diagonal blocks (``c^2`` a node, zero
    where ``A`` stores none); ``bounds`` / ``ends`` (host) the first node row / block of each
    colour and the ends.

    One gather into colour order (:func:`~adaptmg.device.gs_kernels.node_blocks`), then each
    block's new place from two running sums (the lower and the higher blocks before it in its
    row): whole-array operations, no sort.  Host reads: the colour boundaries."""
    be = backend_of(A)
    xp = be.xp
    c = int(block_size)
    cc = c * c
    ptr, nodes, bcol, bval = node_blocks(A, groups, c)
    sizes = np.array([int(g.shape[0]) for g in groups], dtype=np.int64)
    M, nb = int(nodes.shape[0]), int(bcol.shape[0])
    row_colour = repeat(xp.arange(len(groups), dtype=xp.int64), be.asarray(sizes), M, xp=xp)
    node_colour = xp.zeros(A.shape[0] // c, dtype=xp.int64)
    node_colour[nodes] = row_colour
    row = csr_entry_rows(ptr, nb)
    kc, kr = node_colour[bcol], row_colour[row]
    low, upp, diag = kc < kr, kc > kr, kc == kr        # same colour: the node itself (valid colouring)

    def running(mask):                                   # per row: count, and rank of each entry
        cs = xp.zeros(nb + 1, dtype=xp.int64)
        cs[1:] = xp.cumsum(mask.astype(xp.int64))
        return cs[ptr[1:]] - cs[ptr[:-1]], cs[:-1] - cs[ptr[:-1]][row]
    nlow, rlow = running(low)
    nupp, rupp = running(upp)
    nptr = xp.zeros(M + 1, dtype=xp.int64)
    nptr[1:] = xp.cumsum(nlow + nupp)
    pos = nptr[:-1][row] + xp.where(low, rlow, nlow[row] + rupp)
    off = ~diag
    nnew = int(nptr[-1])
    ocol = xp.zeros(nnew, dtype=xp.int32)
    oval = xp.zeros(nnew * cc, dtype=bval.dtype)
    ocol[pos[off]] = bcol[off]
    bv = bval.reshape(nb, cc)
    oval.reshape(nnew, cc)[pos[off]] = bv[off]
    dval = xp.zeros((M, cc), dtype=bval.dtype)
    dval[row[diag]] = bv[diag]
    bounds = np.concatenate([[0], np.cumsum(sizes)])
    ends = to_host(nptr[be.asarray(bounds)]) if be.is_gpu else nptr[bounds]
    whole = (nodes.astype(xp.int32), nptr.astype(xp.int32), nlow.astype(xp.int32), ocol, oval, dval.reshape(-1))
    return whole, bounds, ends


def _cut(xp, whole, bounds, ends, cc):
    """One ``(nodes, bptr, nlow, bcol, bval, dval)`` per colour: views of the whole gather, the
    block row pointer rebased to 0."""
    nodes, nptr, nlow, ocol, oval, dval = whole
    out = []
    for k in range(len(bounds) - 1):
        r0, r1, s, e = int(bounds[k]), int(bounds[k + 1]), int(ends[k]), int(ends[k + 1])
        out.append((nodes[r0:r1], nptr[r0:r1 + 1] - np.int32(s), nlow[r0:r1], ocol[s:e], oval[cc * s:cc * e],
                    dval[cc * r0:cc * r1]))
    return out


def make_colored_sweep(A, groups, inv, block_size=1, sliced=None, layout=None):
    """The colour plan the Gauss-Seidel smoothers use: with ``layout`` (default
    :data:`adaptmg.device.gs_kernels.BLOCK_LAYOUT`; "auto": "split" for node blocks on the GPU)
    "split" and a real ``A`` a
    :class:`SplitColoredSweep`, else :func:`adaptmg.device.gs_kernels.make_colored_sweep`'s plan
    (the same arguments)."""
    layout = gs_kernels.resolve_layout(layout, backend_of(A).is_gpu, block_size)
    if layout == "split" and np.dtype(A.dtype).kind == "f":
        _, groups, inv = plan_inputs(A, groups, inv, block_size)
        return SplitColoredSweep(A, groups, inv, int(block_size))
    return gs_kernels.make_colored_sweep(A, groups, inv, block_size, sliced, layout)


class SplitColoredSweep(ColoredSweep):
    """Plan of the split colour updates of one matrix (module docstring), on ``A``'s backend:
    the RawKernel on the device, SciPy products on the host.  ``sweep(x, b, omega, order,
    zero_initial)`` runs :meth:`schedule`'s steps."""

    _THREADS = 128
    layout = "split"
    sliced = True
    forms_residual = True       # sweep(..., residual=r)

    def __init__(self, A, groups, inv, block_size):
        super().__init__(A, groups, block_size)
        be = backend_of(A)
        xp, c = be.xp, self.block_size
        if np.dtype(A.dtype).kind not in "f":
            raise TypeError(f"split Gauss-Seidel needs a real floating matrix, got {A.dtype}")
        dt = np.dtype(A.dtype)
        self._t = dt.type
        self._host = not be.is_gpu
        whole, bounds, ends = split_gather(A, groups, c)
        parts = _cut(xp, whole, bounds, ends, c * c)
        nlow = to_host(xp.stack([sl[2].sum(dtype=xp.int64) for sl in parts])) if parts else []
        #: per colour: (off-diagonal blocks, those to lower colours) -- the cost counts of :meth:`reads`
        self.blocks = [(int(sl[3].shape[0]), int(nl)) for sl, nl in zip(parts, nlow)]
        self._h = xp.zeros(A.shape[0], dtype=dt)           # the store of one half per row
        self._plans = {}
        inv = inv.astype(dt, copy=False)
        if self._host:
            self._setup_twin(A, parts, inv)
            return
        if c > MAX_GPU_BLOCK:
            raise ValueError(f"block Gauss-Seidel on the GPU supports block_size <= {MAX_GPU_BLOCK}, "
                             f"got {c}")
        # both variants fetched (compiled) here: a warm-up records the kernels a plan can launch
        fns = [_split_module(xp, _ctype(dt), c, pre).get_function(split_kernel_name(c, dt, pre))
               for pre in (False, True)]
        self._inv = xp.ascontiguousarray(inv).reshape(-1)
        per_row = sum(nb for nb, _ in self.blocks) / max(A.shape[0] // c, 1)
        def launch(nodes, *arrays):
            m = int(nodes.shape[0])
            tpr = gs_kernels.THREADS_PER_ROW or gs_threads_per_row(per_row, m)   # more lanes for small colours
            return (fns[m * tpr <= PREFETCH_MAX_THREADS], ((m * tpr + self._THREADS - 1) // self._THREADS,),
                    (np.int32(m), np.int32(tpr), nodes) + arrays)
        self._launch = [launch(*sl) for sl in parts]
        self._launch_all = launch(*whole)           # every node row: the one-launch residual

    @property
    def lanes(self):
        """Threads a node row of each colour's launch (:func:`gs_threads_per_row` of its size)."""
        return [int(head[1]) for _, _, head in self._launch]

    def _setup_twin(self, A, parts, inv):
        c = self.block_size
        n = A.shape[1]
        self._rows, self._L, self._U, self._D, self._inv = [], [], [], [], []
        for nodes, bptr, nlow, bcol, bval, dval in parts:
            m = nodes.shape[0]
            nodes = nodes.astype(np.int64)
            rows = nodes if c == 1 else (nodes[:, None] * c + np.arange(c)).reshape(-1)
            rank = np.arange(bcol.shape[0]) - np.repeat(bptr[:-1], np.diff(bptr))
            low = rank < np.repeat(nlow, np.diff(bptr))
            vals = bval.reshape(-1, c, c)
            for mask, out in ((low, self._L), (~low, self._U)):
                cnt = np.zeros(m + 1, dtype=np.int64)
                np.cumsum(np.bincount(np.repeat(np.arange(m), np.diff(bptr))[mask], minlength=m), out=cnt[1:])
                out.append(sp.csr_matrix((vals[mask, 0, 0], bcol[mask], cnt), shape=(m, n)) if c == 1 else
                           sp.bsr_matrix((vals[mask], bcol[mask], cnt), shape=(m * c, n)))
            self._rows.append(rows)
            self._D.append(dval.reshape(m, c, c))
            self._inv.append(inv[rows] if c == 1 else inv[nodes])

    # --------------------------------------------------------------- the schedule
    def schedule(self, order, zero_initial=False, residual=False):
        """Steps ``(k, lo, up, save)`` of the colour sequence ``order``: each half of colour
        ``k``'s update :data:`ZERO`, :data:`COMPUTE` or :data:`READ`; ``save`` 0, 1 (store the
        lower half) or 2 (the upper half).  ``residual``: then one step per colour ``(k, lo, up,
        RESIDUAL)`` writing ``b - A x`` of its rows, with the halves still valid read back.
        Cached per ``(order, zero_initial, residual)``."""
        key = (tuple(int(k) for k in order), bool(zero_initial), bool(residual))
        if key not in self._plans:
            self._plans[key] = _schedule(key[0], self.ncolors, key[1], key[2])
        return self._plans[key]

    def reads(self, order, zero_initial=False, residual=False):
        """Blocks of ``A`` the sweep ``order`` (and the residual) reads, diagonal blocks
        included, for the cost counts of the benchmarks: the halves it computes."""
        total = 0
        for k, lo, up, _ in self.schedule(order, zero_initial, residual):
            nb, nl = self.blocks[k]
            total += self.sizes[k] + (nl if lo == COMPUTE else 0) + (nb - nl if up == COMPUTE else 0)
        return total

    def sweep(self, x, b, omega, order, zero_initial=False, residual=None):
        """The colour updates ``order`` on ``x`` in place; ``residual`` (a vector or None):
        then ``residual <- b - A x`` of the final ``x``, each colour's halves that are still
        valid read back from the store (after a backward sweep every colour's upper half: half a
        pass over ``A`` instead of one)."""
        steps = self.schedule(order, zero_initial, residual is not None)
        one = None if residual is None or self._host else self._one_residual(steps)
        for k, lo, up, save in steps if one is None else steps[:-self.ncolors]:
            self.color(k, x, b, omega, lo, up, save, residual)
        if one is not None:                     # the residual steps as one launch over every row
            fn, grid, head = self._launch_all
            fn(grid, (self._THREADS,), head + (b, self._inv, self._t(omega), x, self._h, residual,
                                                       np.int32(one[0]), np.int32(one[1]), np.int32(RESIDUAL)))
        return x

    def _one_residual(self, steps):
        """``(lo, up)`` when the residual steps (the last ``K``) share their modes -- up to the
        empty lower half of colour 0 and upper half of colour ``K - 1``, which the kernel takes as
        zero in any mode -- so that one launch over every row does them all; else None."""
        K = self.ncolors
        res = steps[-K:]
        los = {lo for k, lo, _, _ in res if k > 0}
        ups = {up for k, _, up, _ in res if k < K - 1}
        if len(los) > 1 or len(ups) > 1:
            return None
        return (los.pop() if los else ZERO), (ups.pop() if ups else ZERO)

    def color(self, k, x, b, omega, lo=COMPUTE, up=COMPUTE, save=0, out=None):
        if not self._host:
            fn, grid, head = self._launch[k]
            fn(grid, (self._THREADS,), head + (b, self._inv, self._t(omega), x, self._h,
                                                       self._h if out is None else out,
                                                       np.int32(lo), np.int32(up), np.int32(save)))
            return x
        rows, h, c = self._rows[k], self._h, self.block_size
        half = {ZERO: lambda M: 0.0, COMPUTE: lambda M: M @ x, READ: lambda M: h[rows]}
        lower, upper = half[lo](self._L[k]), half[up](self._U[k])
        xo = x[rows]
        d = self._D[k][:, 0, 0] * xo if c == 1 else np.einsum("mkl,ml->mk", self._D[k], xo.reshape(-1, c)).reshape(-1)
        r = b[rows] - lower - d - upper
        if save == RESIDUAL:
            out[rows] = r
            return x
        if save:
            h[rows] = lower if save == 1 else upper
        r = self._inv[k] * r if c == 1 else np.einsum("mkl,ml->mk", self._inv[k], r.reshape(-1, c)).reshape(-1)
        x[rows] = xo + omega * r
        return x


def _schedule(order, K, zero, residual=False):
    """The steps of :meth:`SplitColoredSweep.schedule` (module docstring).  ``last[j]``: the
    step colour ``j`` was last updated at (-1: not in this sweep); ``store[k]``: ``(half, step)``
    of colour ``k``'s stored half.  The residual steps come after ``order`` and update nothing:
    the next use of a colour's last update is its residual step."""
    last = [-1] * K
    store = [None] * K
    steps = []

    def modes(k):
        halves = (range(k), range(k + 1, K))
        changed = [max((last[j] for j in cols), default=-1) for cols in halves]
        out = []
        for h, cols in enumerate(halves):
            if not cols or (zero and changed[h] < 0):
                out.append(ZERO)
            elif store[k] is not None and store[k][0] == h and changed[h] < store[k][1]:
                out.append(READ)
            else:
                out.append(COMPUTE)
        return halves, out

    for s, k in enumerate(order):
        halves, mode = modes(k)
        # the next use of k (its next update, or its residual step): which half is still
        # valid there (no colour of it is updated before)
        nxt = next((t for t in range(s + 1, len(order)) if order[t] == k), len(order) if residual else None)
        save = 0
        if nxt is not None:
            between = set(order[s + 1:nxt])
            for h, cols in enumerate(halves):
                if mode[h] == COMPUTE and not between.intersection(cols):
                    save = h + 1
                    store[k] = (h, s)
                    break
        last[k] = s
        steps.append((k, mode[0], mode[1], save))
    if residual:
        steps.extend((k, *modes(k)[1], RESIDUAL) for k in range(K))
    return tuple(steps)
