r"""Preconditioned CG whose every iteration is one CUDA graph of the cycle and two or three
kernels of its own, with the stopping test on the device.

The iteration is that of :func:`adaptmg.linalg.cg` (same recurrences, same order of
operations), with the preconditioner a fixed-buffer multigrid cycle
(:class:`~adaptmg.multilevel.preconditioner.BufferedCycle`).  With ``s = (rz, pq, rr,
rz_new, beta)`` and the status ``st = (state, iterations, maxiter)`` in device memory, one
iteration is::

    K1  if state == 0:  p' = z + beta p  (else p' = p);   q = A p';  pq = (p', q)
    K2  p = p';  if state == 0:  alpha = rz / pq;  x += alpha p;  r -= alpha q
        rr = (r, r)
        if state == 0:  iterations += 1;  state = 1 if rr <= tol^2, 2 if pq <= 0 or rz <= 0,
                        3 if rr is not finite, 4 if iterations == maxiter
        z = M r                         (the cycle; r is its own right-hand side buffer)
    K3  rz_new = (r, z);  if state == 0:  beta = rz_new / rz;  rz = rz_new

Each K is one kernel: its element-wise part, the per-block partial sums of its inner
product and, in the block that finishes last (a device-wide counter, reset by that block
for the next replay), the sum of the partials in a fixed order and the scalar work after
it -- so the reductions are deterministic and no kernel launches just to finish a sum or
to update a scalar (before: eleven kernels per iteration besides the cycle).  The SpMV
of K1 is adaptmg's CSR row kernel (threads per row by
:func:`~adaptmg.device.kernels.threads_per_row`); it forms the search direction ``p' =
z + beta p`` of each column it reads on the fly (the same expression in every row, so
``q = A p'`` exactly as if ``p'`` had been stored first), which saves a direction-update
kernel: 1-1.5 us per iteration on an H100 in 2-D and 3-D alike, although K1 then reads
two vectors per entry (``scripts/bench_solve_latency.py`` sizes, A/B in one process).  When the
cycle ends in a fused Jacobi sweep of the finest level (``z <- y + omega D^{-1} (r - A
y)``), K3 *is* that sweep: the cycle leaves it out (``BufferedCycle.run_eager(
defer_last=True)``) and K3 computes ``z`` row by row with the partial sums of ``(r,
z)``.  Once ``state != 0`` the updates are no-ops: ``x`` and the iteration count freeze
at the iteration that stopped.

The host does not wait after every launch: it launches ``k - 1`` iterations back to back,
``k`` the iterations of the previous solve (solves of one operator take similar counts, e.g.
in time stepping or an adaptive loop), then copies the status asynchronously into pinned
memory and waits for that copy; from there on it waits after every launch.  Launches past
the stop cost the device one iteration each (their updates are no-ops) but no round trip,
so a solve like the previous one pays per iteration the device time of its graph and one
launch, and one host wait in all instead of one round trip (~10-20 us) per iteration.

The stopping contract of :mod:`adaptmg.linalg` holds: on ``state == 1`` the true residual
``b - A x`` is computed; if it fails the test (the recurrence residual drifted) or on a
breakdown, the solve goes on with :func:`adaptmg.linalg.cg` from the current ``x`` with
the iterations that are left, which restarts from the true residual and reports a
breakdown its own way.
"""
from __future__ import annotations

import functools

import numpy as np

from ..device import kernels as K
from ..device import pdl
from ..device.cudagraph import capture
from ._vectorops import VectorOps

__all__ = ["GraphCG"]


_BLOCK = 256

_SRC = r"""
// sum over the block (256 threads); the result is valid in thread 0
__device__ __forceinline__ {T} gcg_block_sum({T} v, {T}* sh)
{
    for (int off = 16; off > 0; off >>= 1) v += __shfl_down_sync(0xffffffffu, v, off);
    const int w = threadIdx.x >> 5, l = threadIdx.x & 31;
    __syncthreads();                       // sh may still be read by an earlier call
    if (l == 0) sh[w] = v;
    __syncthreads();
    v = (threadIdx.x < (blockDim.x >> 5)) ? sh[threadIdx.x] : ({T})0;
    if (w == 0)
        for (int off = 16; off > 0; off >>= 1) v += __shfl_down_sync(0xffffffffu, v, off);
    return v;
}
// thread 0 stores the block's partial sum; returns true in the block that finishes last,
// after which every partial is visible; that block then sums them in a fixed order
__device__ __forceinline__ bool gcg_finish({T} v, {T}* partial, unsigned int* counter, {T}* sh,
                                           {T}* total)
{
    __shared__ bool last;
    v = gcg_block_sum(v, sh);
    if (threadIdx.x == 0) {
        partial[blockIdx.x] = v;
        __threadfence();
        last = atomicAdd(counter, 1u) == gridDim.x - 1;
    }
    __syncthreads();
    if (!last) return false;
    {T} t = 0;
    for (int i = threadIdx.x; i < gridDim.x; i += blockDim.x) t += __ldcg(partial + i);
    t = gcg_block_sum(t, sh);
    if (threadIdx.x == 0) { *total = t; *counter = 0u; }
    return threadIdx.x == 0;
}
// the sum of a row's tpr lanes (shuffles within the sub-warp); lane 0 gets it
__device__ __forceinline__ {T} gcg_lanes_sum({T} acc, const int tpr)
{
    for (int off = tpr / 2; off > 0; off >>= 1) acc += __shfl_down_sync(0xffffffffu, acc, off, tpr);
    return acc;
}
// after s[3] = rz_new is summed, in the last block, while running: beta = rz_new / rz and
// rz = rz_new (K3 and K3j)
__device__ __forceinline__ void gcg_next_beta({T}* s)
{
    s[4] = (s[0] != ({T})0) ? s[3] / s[0] : ({T})0;
    s[0] = s[3];
}
// the search direction p' = z + beta p of column j (p itself once stopped)
__device__ __forceinline__ {T} gcg_direction(const bool go, const {T} beta,
                                              const {T}* __restrict__ z,
                                              const {T}* __restrict__ p, const int j)
{
    return go ? z[j] + beta * p[j] : p[j];
}
// K1: p' = z + beta p; q = A p' (tpr threads per row), s[1] = (p', q)
extern "C" __global__ void gcg_spmv_pq_{T}(
    const int n, const int tpr, const int* __restrict__ indptr, const int* __restrict__ indices,
    const {T}* __restrict__ data, const {T}* __restrict__ z, const {T}* __restrict__ p,
    {T}* __restrict__ pn, {T}* __restrict__ q, {T}* __restrict__ partial, unsigned int* counter,
    {T}* s, const int* st)
{
    __shared__ {T} sh[32];
    const int tid = blockDim.x * blockIdx.x + threadIdx.x;
    const int row = tid / tpr, lane = tid % tpr;
    const int kb = (row < n) ? indptr[row] + lane : 0, ke = (row < n) ? indptr[row + 1] : 0;
    ADAPTMG_GRID_WAIT();                  // the row bounds above are set-up data
    const bool go = st[0] == 0;
    const {T} beta = s[4];
    {T} acc = 0;
    for (int k = kb; k < ke; k += tpr) acc += data[k] * gcg_direction(go, beta, z, p, indices[k]);
    acc = gcg_lanes_sum(acc, tpr);
    {T} v = 0;
    if (row < n && lane == 0) {
        const {T} pi = gcg_direction(go, beta, z, p, row);
        pn[row] = pi;
        q[row] = acc;
        v = pi * acc;
    }
    gcg_finish(v, partial, counter, sh, s + 1);
}
// K2: p = p'; x += alpha p; r -= alpha q; s[2] = (r, r); the status
extern "C" __global__ void gcg_xr_rr_{T}(
    const int n, const {T}* __restrict__ pn, {T}* __restrict__ p, const {T}* __restrict__ q,
    {T}* __restrict__ x, {T}* __restrict__ r, {T}* __restrict__ partial, unsigned int* counter,
    {T}* s, const {T}* __restrict__ tol2, int* st)
{
    __shared__ {T} sh[32];
    const int i = blockDim.x * blockIdx.x + threadIdx.x;
    const bool go = st[0] == 0;           // read by every block before the last one writes it
    const {T} a = (go && s[1] != ({T})0) ? s[0] / s[1] : ({T})0;
    {T} v = 0;
    if (i < n) {
        const {T} pi = pn[i];
        p[i] = pi;
        x[i] += a * pi;
        const {T} ri = r[i] - a * q[i];
        r[i] = ri;
        v = ri * ri;
    }
    if (gcg_finish(v, partial, counter, sh, s + 2) && st[0] == 0) {
        st[1] += 1;
        const {T} rr = s[2];
        if (!isfinite((double)rr)) st[0] = 3;
        else if (rr <= tol2[0]) st[0] = 1;
        else if (!(s[1] > ({T})0) || !(s[0] > ({T})0)) st[0] = 2;
        else if (st[1] >= st[2]) st[0] = 4;
    }
}
// K3: s[3] = (r, z); if running: s[4] = beta = rz_new / rz, s[0] = rz_new
extern "C" __global__ void gcg_rz_{T}(
    const int n, const {T}* __restrict__ r, const {T}* __restrict__ z, {T}* __restrict__ partial,
    unsigned int* counter, {T}* s, const int* st)
{
    __shared__ {T} sh[32];
    const int i = blockDim.x * blockIdx.x + threadIdx.x;
    {T} v = (i < n) ? r[i] * z[i] : ({T})0;
    if (gcg_finish(v, partial, counter, sh, s + 3) && st[0] == 0)
        gcg_next_beta(s);
}
// K3 fused with the cycle's last sweep: z = y + omega D^{-1} (r - A y) (tpr threads per
// row, as adaptmg_csr_jacobi_vec), s[3] = (r, z); if running: s[4] = beta, s[0] = rz_new
extern "C" __global__ void gcg_jacobi_rz_{T}(
    const int n, const int tpr, const int* __restrict__ indptr, const int* __restrict__ indices,
    const {T}* __restrict__ data, const {T}* __restrict__ y, const {T}* __restrict__ r,
    const {T}* __restrict__ dinv, const {T} omega, {T}* __restrict__ z,
    {T}* __restrict__ partial, unsigned int* counter, {T}* s, const int* st)
{
    __shared__ {T} sh[32];
    const int tid = blockDim.x * blockIdx.x + threadIdx.x;
    const int row = tid / tpr, lane = tid % tpr;
    const int kb = (row < n) ? indptr[row] + lane : 0, ke = (row < n) ? indptr[row + 1] : 0;
    const {T} di = (row < n && lane == 0) ? dinv[row] : ({T})0;
    ADAPTMG_GRID_WAIT();                  // the row bounds and dinv above are set-up data
    {T} acc = 0;
    for (int k = kb; k < ke; k += tpr) acc += data[k] * y[indices[k]];
    acc = gcg_lanes_sum(acc, tpr);
    {T} v = 0;
    if (row < n && lane == 0) {
        const {T} zi = y[row] + omega * di * (r[row] - acc);
        z[row] = zi;
        v = r[row] * zi;
    }
    if (gcg_finish(v, partial, counter, sh, s + 3) && st[0] == 0)
        gcg_next_beta(s);
}
"""


@functools.lru_cache(maxsize=None)
def _module(xp, ctype):
    return pdl.module(xp, _SRC.replace("{T}", ctype))


@functools.lru_cache(maxsize=None)
def _init_kernel(xp):
    return xp.ElementwiseKernel("int32 m", "raw int32 st", "st[0] = 0; st[1] = 0; st[2] = m;",
                                "adaptmg_graphcg_init")


class GraphCG:
    """CG preconditioned by a fixed-buffer cycle, one CUDA graph per iteration (GPU only).

    ``A``: the device CSR matrix (int32 indices) of the cycle's finest level; ``cycle``:
    a :class:`~adaptmg.multilevel.preconditioner.BufferedCycle` of the same dtype.  The
    graph is recorded at construction; ``self.graph_error`` says why when it was refused
    (then :meth:`solve` must not be used: ``self.graph is None``).  ``self.iterations``:
    the iterations of the last :meth:`solve`; ``self.fused_last_sweep``: whether the
    graph runs the cycle's last sweep fused with ``(r, z)``.
    """

    def __init__(self, backend, A, cycle):
        if not backend.is_gpu:
            raise ValueError("GraphCG needs the GPU backend")
        xp = backend.xp
        self.be, self.xp, self.A, self.cycle = backend, xp, A, cycle
        n = A.shape[0]
        dt = np.dtype(A.dtype)
        if cycle.b.dtype != dt or cycle.b.shape != (n,):
            raise ValueError(f"GraphCG: the cycle works on {cycle.b.shape} {cycle.b.dtype}, "
                             f"A is {A.shape} {dt}")
        self.n, self.dtype = n, dt
        self.plan = K.make_spmv(A)
        self.ops = VectorOps(backend, n, dt, rows=1)
        ctype = "double" if dt == np.float64 else "float"
        if dt not in (np.float64, np.float32):
            raise TypeError(f"GraphCG supports float32/float64, got {dt}")
        mod = _module(xp, ctype)
        self._k1, self._k2, self._k3, self._k3j = (mod.get_function(f"gcg_{name}_{ctype}")
                                                   for name in ("spmv_pq", "xr_rr", "rz", "jacobi_rz"))
        self._tpr = K.csr_threads_per_row(A)
        self._grid1 = (n * self._tpr + _BLOCK - 1) // _BLOCK
        self._grid = (n + _BLOCK - 1) // _BLOCK
        # room for the partial sums of any grid (up to 32 threads per row)
        self._partial = xp.zeros((n * 32 + _BLOCK - 1) // _BLOCK, dt)
        self._counters = xp.zeros(3, np.uint32)
        self.x, self.p, self.pn, self.q = (xp.zeros(n, dt) for _ in range(4))
        self.r = cycle.b           # the cycle reads b and never writes it: z = M r needs no copy
        self.s = xp.zeros(5, dt)
        self.tol2 = xp.zeros(1, dt)
        self.st = xp.zeros(3, np.int32)
        self._pinned = xp.cuda.alloc_pinned_memory(12)
        self._host = np.ndarray((3,), np.int32, buffer=self._pinned)
        self.iterations = 0
        self._hint = 1             # iterations of the last solve that iterated
        self.graph, self.graph_error = capture(
            backend, self._iteration, [self.x, self.r, self.p, self.s, cycle.x], self.x,
            rtol=1e3 * float(np.finfo(dt).eps), reset=self._reset_status)

    def _reset_status(self):
        self.st.set(np.array([0, 0, 2 ** 30], np.int32))

    def _iteration(self):
        s, st, cyc, A = self.s, self.st, self.cycle, self.A
        n = np.int32(self.n)
        part, cnt = self._partial, self._counters
        self._k1((self._grid1,), (_BLOCK,), (n, np.int32(self._tpr), A.indptr, A.indices, A.data,
                                            cyc.x, self.p, self.pn, self.q, part, cnt[0:1], s, st))
        self._k2((self._grid,), (_BLOCK,), (n, self.pn, self.p, self.q, self.x, self.r, part,
                                           cnt[1:2], s, self.tol2, st))
        deferred = cyc.run_eager(defer_last=True)
        self.fused_last_sweep = deferred is not None
        if deferred is None:
            self._k3((self._grid,), (_BLOCK,), (n, self.r, cyc.x, part, cnt[2:3], s, st))
            return
        sm, y = deferred                # z = y + omega D^{-1} (r - A y), fused with (r, z)
        S = sm.A
        tpr = K.csr_threads_per_row(S)
        self._k3j(((self.n * tpr + _BLOCK - 1) // _BLOCK,), (_BLOCK,),
                  (n, np.int32(tpr), S.indptr, S.indices, S.data, y, self.r, sm.dinv,
                   self.dtype.type(sm.omega), cyc.x, part, cnt[2:3], s, st))

    def _wait_status(self, stream):
        """Copy the status into pinned memory behind the last launch and wait for it."""
        rt = self.xp.cuda.runtime
        rt.memcpyAsync(self._pinned.ptr, self.st.data.ptr, 12, rt.memcpyDeviceToHost, stream.ptr)
        stream.synchronize()
        return int(self._host[0])

    def solve(self, b, x, tol, maxiter, *, x_zero=False, bnorm=None):
        """CG on ``A x = b`` from ``x`` (updated in place) to ``||b - A x|| <= tol``.

        ``x_zero=True`` with ``bnorm = ||b||`` says that ``x`` is zero: the initial residual
        is then ``b`` without a product or a norm.  Returns ``(x, state, iterations)``:
        state 0 converged (true residual checked), else the iterations done and why it
        stopped (1: the true residual failed the test after the recurrence passed it; 2:
        breakdown; 3: non-finite; 4: maxiter), for the caller to continue with
        :func:`adaptmg.linalg.cg` or to report.
        """
        xp, r = self.xp, self.r
        r[...] = b
        if x_zero and bnorm is not None:
            rnorm = float(bnorm)
        else:
            self.plan(x, r, -1.0, 1.0)
            rnorm = float(xp.linalg.norm(r))
        self.iterations = 0
        if rnorm <= tol:
            return x, 0, 0
        if maxiter <= 0:
            return x, 4, 0
        xp.copyto(self.x, x)
        self.cycle()
        self.p.fill(0)              # with beta = 0 the first K1 forms p = z
        self.s.fill(0)
        self.ops.mdot(r[None], self.cycle.x, self.s[0:1])
        self.tol2.fill(tol * tol)
        _init_kernel(xp)(np.int32(maxiter), self.st, size=1)
        stream = xp.cuda.get_current_stream()
        ahead = max(1, min(int(maxiter), self._hint - 1))
        for _ in range(ahead):
            self.graph.launch()
        launched = ahead
        state = self._wait_status(stream)
        while state == 0 and launched < maxiter:
            self.graph.launch()
            launched += 1
            state = self._wait_status(stream)
        its = int(self._host[1])
        self.iterations = its
        if its > 0:
            self._hint = its
        xp.copyto(x, self.x)
        if state == 1:
            r[...] = b
            self.plan(x, r, -1.0, 1.0)
            if float(xp.linalg.norm(r)) <= tol:
                return x, 0, its
        return x, state, its
