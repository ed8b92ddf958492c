r"""Flexible GMRES whose every inner iteration is one CUDA-graph launch (GPU, real dtypes).

The method is :func:`adaptmg.linalg.fgmres` with classical Gram-Schmidt twice
(``orthogonalization="cgs2"``; the module docstring of :mod:`adaptmg.linalg._arnoldi`
has the math): right preconditioning, ``z_j = M v_j`` kept in ``Z``, ``x = x_0 + Z_k y``.
What moves to the device is what the host did between two transfers: ``h_{j+1,j} =
||w||``, the Givens rotations of the new Hessenberg column, the monitor ``|g_{j+1}|`` and
the stopping test, in a one-thread kernel on device arrays (``R``, ``g``, ``cs``, ``sn``).
Inner iteration ``j`` is then a fixed sequence of kernels::

    z_j = M v_j                      (the caller's capturable preconditioner, into Z[j])
    w = A z_j                        (adaptmg's CSR kernel)
    h = V_j^T w; w -= V_j h; twice   (mdot / block_sub, into the column h_{.,j})
    h_{j+1,j}^2 = (w, w)
    rotate, monitor, test            (one thread; state != 0 stops the cycle)
    v_{j+1} = w / h_{j+1,j}          (skipped once stopped)

recorded once per ``j`` (the block sizes differ), when iteration ``j`` is first reached,
and replayed with one launch.  The host reads the state of each iteration from pinned
memory (``depth`` as in :mod:`adaptmg.linalg.graph_cg`; with ``depth = 2`` an iteration
launched after the stop changes nothing that the update reads: ``V[j+1]``, ``R``, ``g``
are guarded; ``Z[j+1]`` and the work column are not read for ``k = j``).

The ends of a cycle run on the device as well, each followed by one read of a few numbers
into pinned memory: the start of the first cycle (``r = b - A x``, ``||r||`` and ``||b||``,
``g_1``, the inner tolerance and ``v_1`` = a one-thread kernel between element-wise ones)
and the end of every cycle (the back substitution ``R_k y = g_k`` in one thread, ``x +=
Z_k y`` reading ``k`` on the device, the true residual and its norm).  A solve of ``k``
iterations in one cycle synchronises ``k + 2`` times (H100, transport-diffusion n=10, 1.05M
DoFs, 3 iterations: 2.23 ms per solve, 2.94 ms with the cycle's ends on the host, of which
the three graphs are 1.63 ms).  The true residual decides; later restart cycles start from
the host's figures.
The inner tolerance is SciPy's for right preconditioning: the monitor is the true
residual norm up to rounding, and after a cycle whose monitor passed but whose true
residual did not, the next cycle aims lower (the factor of :mod:`._arnoldi`).  States
other than "converged" or "cycle full" (a zero pivot, non-finite values, an invariant
Krylov space with a residual left) return to the caller, which hands the solve to
:func:`adaptmg.linalg.fgmres` to report them its own way.
"""
from __future__ import annotations

import collections
import functools
import math

import numpy as np

from ..device import kernels as K
from ..device.cudagraph import capture
from ._vectorops import VectorOps

__all__ = ["GraphFGMRES"]

# state codes (st[0]); st[1] = k, the basis vectors the update may use
RUNNING, CONVERGED, ZERO_PIVOT, NONFINITE, FULL, INVARIANT = 0, 1, 2, 3, 4, 5

_GIVENS = r"""
extern "C" __global__ void adaptmg_graphfgmres_givens_SFX(
        T* h, double* R, double* g, double* cs, double* sn, int* st, T* scale,
        const double* prm, const int j, const int m)
{
    // h[0..j]: the Gram-Schmidt column, h[j+1] = ||w||^2; prm = (ptol, eps)
    if (threadIdx.x != 0 || blockIdx.x != 0 || st[0] != 0) return;
    double hv[MAXM + 1];
    double col2 = 0.0;
    for (int i = 0; i <= j; ++i) { hv[i] = (double)h[i]; col2 += hv[i] * hv[i]; }
    const double hnext = sqrt(fmax((double)h[j + 1], 0.0));
    hv[j + 1] = hnext;
    col2 += hnext * hnext;
    const double colnorm = sqrt(col2);
    if (!isfinite(colnorm)) { st[0] = 3; return; }
    for (int i = 0; i < j; ++i) {
        const double t = cs[i] * hv[i] + sn[i] * hv[i + 1];
        hv[i + 1] = -sn[i] * hv[i] + cs[i] * hv[i + 1];
        hv[i] = t;
    }
    double c, s, rho;
    const double a = hv[j], b = hv[j + 1];
    if (b == 0.0) { c = 1.0; s = 0.0; rho = a; }
    else if (a == 0.0) { c = 0.0; s = (b > 0.0) ? 1.0 : -1.0; rho = fabs(b); }
    else {
        const double nu = hypot(fabs(a), fabs(b));
        const double ph = (a > 0.0) ? 1.0 : -1.0;
        c = fabs(a) / nu; s = ph * b / nu; rho = ph * nu;
    }
    cs[j] = c; sn[j] = s;
    for (int i = 0; i < j; ++i) R[i * m + j] = hv[i];
    R[j * m + j] = rho;
    const double gj = g[j];
    g[j + 1] = -s * gj;
    g[j] = c * gj;
    if (fabs(rho) <= prm[1] * colnorm) { st[0] = 2; return; }
    st[1] = j + 1;
    if (fabs(g[j + 1]) <= prm[0]) st[0] = 1;
    else if (hnext <= prm[1] * colnorm) st[0] = 5;
    else if (j + 1 == m) st[0] = 4;
    else scale[0] = (T)(1.0 / hnext);
}
"""


_CYCLE_ENDS = r"""
extern "C" __global__ void adaptmg_graphfgmres_start_SFX(
        const T* nrm, double* g, double* prm, int* st, T* scale, double* info,
        const double rtol, const double atol, const double eps)
{
    // nrm = (||r||^2, ||b||^2): the first cycle's g, ptol and state, without the host
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    const double r2 = (double)nrm[0], b2 = (double)nrm[1];
    const double rnorm = sqrt(r2 < 0.0 ? 0.0 : r2), bnrm = sqrt(b2 < 0.0 ? 0.0 : b2);  // NaN stays
    const double tol = fmax(rtol * bnrm, atol);
    info[0] = rnorm; info[1] = bnrm; info[2] = tol;
    g[0] = rnorm;
    prm[0] = bnrm > 0.0 ? fmin(bnrm, tol) : tol;      // SciPy's first inner tolerance
    prm[1] = eps;
    st[1] = 0;
    st[0] = (rnorm > tol) ? 0 : 1;                      // 1: nothing to do (or NaN: the host sees it)
    if (st[0] == 0) scale[0] = (T)(1.0 / rnorm);
}

extern "C" __global__ void adaptmg_graphfgmres_backsolve_SFX(
        const double* R, const double* g, const int* st, T* y, const int m)
{
    // y = R_k^{-1} g_k, k = st[1] (upper triangular, row-major m x m)
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    const int k = st[1];
    double yv[MAXM];
    for (int i = k - 1; i >= 0; --i) {
        double s = g[i];
        for (int j = i + 1; j < k; ++j) s -= R[i * m + j] * yv[j];
        yv[i] = s / R[i * m + i];
    }
    for (int i = 0; i < k; ++i) y[i] = (T)yv[i];
}

extern "C" __global__ void adaptmg_graphfgmres_report_SFX(
        const T* nrm, const double* g, const int* st, double* info)
{
    // after the update: state, k, the true residual norm and the monitor |g_k|
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    const int k = st[1];
    info[3] = (double)st[0];
    info[4] = (double)k;
    const double r2 = (double)nrm[0];
    info[5] = sqrt(r2 < 0.0 ? 0.0 : r2);                // NaN stays NaN
    info[6] = k > 0 ? fabs(g[k]) : -1.0;
}
"""


@functools.lru_cache(maxsize=None)
def _givens_kernel(xp, ctype, maxm):
    src = _GIVENS.replace("SFX", ctype).replace("MAXM", str(int(maxm)))
    mod = xp.RawModule(code="typedef " + ctype + " T;\n" + src)
    return mod.get_function(f"adaptmg_graphfgmres_givens_{ctype}")


@functools.lru_cache(maxsize=None)
def _cycle_end_kernels(xp, ctype, maxm):
    """(start, backsolve, report): the one-thread kernels around a restart cycle."""
    src = _CYCLE_ENDS.replace("SFX", ctype).replace("MAXM", str(int(maxm)))
    mod = xp.RawModule(code="typedef " + ctype + " T;\n" + src)
    return tuple(mod.get_function(f"adaptmg_graphfgmres_{nm}_{ctype}")
                 for nm in ("start", "backsolve", "report"))


@functools.lru_cache(maxsize=None)
def _update_kernel(xp):
    # x += Z_k^T y with k = st[1] read on the device (no host round trip for k or y)
    return xp.ElementwiseKernel(
        "raw T Z, raw T y, raw int32 st, int64 n", "T x",
        "T s = 0; const int k = st[1];"
        " for (int j = 0; j < k; ++j) s += y[j] * Z[(long long)j * n + i];"
        " x += s;", "adaptmg_graphfgmres_update")


@functools.lru_cache(maxsize=None)
def _normalize_kernel(xp):
    return xp.ElementwiseKernel("T w, raw T scale, raw int32 st", "T v",
                                "if (st[0] == 0) v = w * scale[0];", "adaptmg_graphfgmres_normalize")


class GraphFGMRES:
    """FGMRES(``restart``) with CGS2 and one CUDA graph per inner iteration.

    ``A``: a device CSR matrix (int32 indices, float32/float64); ``precond(v, z)``: writes
    ``M v`` into ``z`` using only preallocated buffers and no host synchronisation (it is
    recorded into the graphs).  ``self.graph_error`` says why a capture was refused (then
    :meth:`solve` returns ``None`` and the caller uses :func:`adaptmg.linalg.fgmres`).
    """

    depth = 1          #: launches in flight before the host reads a state

    def __init__(self, backend, A, precond, restart=30):
        if not backend.is_gpu:
            raise ValueError("GraphFGMRES needs the GPU backend")
        dt = np.dtype(A.dtype)
        if dt not in (np.float32, np.float64):
            raise TypeError(f"GraphFGMRES supports float32/float64 matrices, got {dt}")
        xp = backend.xp
        n = A.shape[0]
        m = int(min(restart, n))
        if not 1 <= m <= 256:
            raise ValueError(f"GraphFGMRES: restart must be in [1, 256], got {restart!r}")
        self.be, self.xp, self.A, self.precond = backend, xp, A, precond
        self.n, self.m, self.dtype = n, m, dt
        self.plan = K.make_spmv(A)
        self.ops = VectorOps(backend, n, dt, rows=m + 1)
        self.V = xp.zeros((m + 1, n), dt)
        self.Z = xp.zeros((m, n), dt)
        self.w = xp.zeros(n, dt)
        self.hcol = xp.zeros(m + 1, dt)
        self.h2 = xp.zeros(m, dt)
        self.R = xp.zeros(m * m, np.float64)
        self.g = xp.zeros(m + 1, np.float64)
        self.cs = xp.zeros(m, np.float64)
        self.sn = xp.zeros(m, np.float64)
        self.scale = xp.zeros(1, dt)
        self.prm = xp.zeros(2, np.float64)
        self.st = xp.zeros(2, np.int32)
        ctype = "double" if dt == np.float64 else "float"
        self._givens = _givens_kernel(xp, ctype, m)
        self._start, self._backsolve, self._report = _cycle_end_kernels(xp, ctype, m)
        self._update = _update_kernel(xp)
        self._normalize = _normalize_kernel(xp)
        self.nrm = xp.zeros(2, dt)                       # ||r||^2, ||b||^2
        self.y = xp.zeros(m, dt)
        self.info = xp.zeros(8, np.float64)              # see the start / report kernels
        self._pinned = [xp.cuda.alloc_pinned_memory(8) for _ in range(2)]
        self._host = [np.ndarray((2,), np.int32, buffer=p) for p in self._pinned]
        self._info_pinned = xp.cuda.alloc_pinned_memory(64)
        self._info_host = np.ndarray((8,), np.float64, buffer=self._info_pinned)
        self.graphs = [None] * m
        self.graph_error = None
        self.iterations = 0

    # ------------------------------------------------------------------ one step
    def _step(self, j):
        ops, V, w, hcol, h2 = self.ops, self.V, self.w, self.hcol, self.h2
        self.precond(V[j], self.Z[j])
        self.plan(self.Z[j], w, 1.0, 0.0)
        ops.mdot(V[:j + 1], w, hcol[:j + 1])
        ops.block_sub(w, V, hcol[:j + 1])
        ops.mdot(V[:j + 1], w, h2[:j + 1], acc=hcol[:j + 1])
        ops.block_sub(w, V, h2[:j + 1])
        ops.mdot(w[None], w, hcol[j + 1:j + 2])
        self._givens((1,), (1,), (hcol, self.R, self.g, self.cs, self.sn, self.st, self.scale,
                                  self.prm, np.int32(j), np.int32(self.m)))
        self._normalize(w, self.scale, self.st, V[j + 1])

    def _graph(self, j):
        """The graph of step ``j``, recorded on its first use (a solve that converges in
        k iterations records k graphs).  It may be recorded in the middle of a cycle:
        the capture's check runs the step twice on a random ``v_j`` (the basis before it
        as it is), so ``v_j``, ``g`` and the state are restored afterwards; everything
        else the step writes (``z_j``, ``w``, column ``j`` of ``R``, ``cs``, ``sn``,
        ``v_{j+1}``) the real launch writes again before anything reads it."""
        if self.graphs[j] is None and self.graph_error is None:
            keep = (self.V[j].copy(), self.g.copy(), self.st.copy())
            g, why = capture(self.be, lambda: self._step(j), [self.V[j:j + 1]], self.w,
                             rtol=1e3 * float(np.finfo(self.dtype).eps),
                             reset=lambda: self.st.fill(0))
            self.V[j][...], self.g[...], self.st[...] = keep
            if g is None:
                self.graph_error = why
            self.graphs[j] = g
        return self.graphs[j]

    def _read_info(self, stream):
        """``self.info`` to the host: one copy to pinned memory, then wait for it."""
        rt = self.xp.cuda.runtime
        rt.memcpyAsync(self._info_pinned.ptr, self.info.data.ptr, 64, rt.memcpyDeviceToHost,
                       stream.ptr)
        stream.synchronize()
        return self._info_host.copy()

    def _state_async(self, slot, stream):
        rt = self.xp.cuda.runtime
        rt.memcpyAsync(self._pinned[slot].ptr, self.st.data.ptr, 8, rt.memcpyDeviceToHost, stream.ptr)
        ev = self.xp.cuda.Event(block=False, disable_timing=True)
        ev.record(stream)
        return ev

    # ------------------------------------------------------------------ the solve
    def solve(self, b, x, *, rtol, atol=0.0, maxiter):
        """Restarted FGMRES on ``A x = b`` from ``x`` (updated in place), at most ``maxiter``
        restart cycles, to ``||b - A x|| <= max(rtol ||b||, atol)`` (SciPy's meaning).

        Returns ``(x, state, iterations)`` (state 0: converged, the true residual checked;
        ``FULL``: ``maxiter`` cycles done; else why it stopped), or ``None`` when a graph
        could not be recorded (``x`` then holds its initial values again, ``graph_error``
        says why).
        """
        if self.graph_error is not None:
            return None
        xp, eps, ops = self.xp, float(np.finfo(self.dtype).eps), self.ops
        # graphs are recorded on first use: keep x0 while some are missing (a refused
        # capture in a later restart cycle must not leave x half updated; x changes only at
        # the end of a cycle, so one cycle needs no copy)
        x_start = x.copy() if maxiter > 1 and any(g is None for g in self.graphs) else None
        stream = xp.cuda.get_current_stream()
        r = self.w
        # the first cycle's start on the device, one host read: r = b - A x, both norms,
        # g, ptol and the state (start kernel), v_1 = r / ||r||
        r[...] = b
        self.plan(x, r, -1.0, 1.0)
        ops.mdot(r[None], r, self.nrm[0:1])
        ops.mdot(b[None], b, self.nrm[1:2])
        self._start((1,), (1,), (self.nrm, self.g, self.prm, self.st, self.scale, self.info,
                                 np.float64(rtol), np.float64(atol), np.float64(eps)))
        self._normalize(r, self.scale, self.st, self.V[0])
        rnorm, bnrm2, tol = (float(v) for v in self._read_info(stream)[:3])
        self.iterations = its = 0
        if rnorm <= tol:
            return x, 0, 0
        if not math.isfinite(rnorm):
            return x, NONFINITE, 0
        ptol_factor = 1.0
        state = FULL
        for cycle in range(maxiter):
            if cycle > 0:                  # a restart: its start from the host's figures
                xp.multiply(r, 1.0 / rnorm, out=self.V[0])
                self.g[0:1].fill(rnorm)
                self.prm.set(np.array([ptol, eps]))
                self.st.fill(0)
            pending = collections.deque()
            for j in range(self.m):
                graph = self._graph(j)
                if graph is None:
                    if x_start is not None:         # None: still the caller's x (first cycle)
                        x[...] = x_start
                    self.iterations = 0
                    return None
                graph.launch()
                pending.append((self._state_async(j % 2, stream), j % 2))
                if len(pending) < self.depth:
                    continue
                ev, slot = pending.popleft()
                ev.synchronize()
                if int(self._host[slot][0]) != RUNNING:
                    break
            # the cycle's end on the device, one host read: y = R_k^{-1} g_k, x += Z_k y,
            # r = b - A x, ||r|| (k = st[1] is read by the kernels, not by the host)
            self._backsolve((1,), (1,), (self.R, self.g, self.st, self.y, np.int32(self.m)))
            self._update(self.Z, self.y, self.st, np.int64(self.n), x)
            r[...] = b
            self.plan(x, r, -1.0, 1.0)
            ops.mdot(r[None], r, self.nrm[0:1])
            self._report((1,), (1,), (self.nrm, self.g, self.st, self.info))
            info = self._read_info(stream)
            state, k, rnorm, presid = int(info[3]), int(info[4]), float(info[5]), float(info[6])
            its += k if state != ZERO_PIVOT else k + 1
            if rnorm <= tol:
                self.iterations = its
                return x, 0, its
            if not math.isfinite(rnorm) or state in (ZERO_PIVOT, NONFINITE, INVARIANT):
                break
            if k == 0:
                presid = rnorm
            if state == CONVERGED:            # the monitor passed, the true residual did not
                ptol_factor = max(eps, 0.25 * ptol_factor)
            else:
                ptol_factor = min(1.0, 1.5 * ptol_factor)
            ptol = presid * min(ptol_factor, tol / rnorm)
            state = FULL
        self.iterations = its
        return x, state, its
