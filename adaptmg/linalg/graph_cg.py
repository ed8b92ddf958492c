r"""Preconditioned CG whose every iteration is one CUDA-graph launch, with the stopping test on the device.

The iteration is that of :func:`adaptmg.linalg.cg` (same recurrences, same order of
operations), with the preconditioner a fixed-buffer multigrid cycle
(:class:`~adaptmg.multilevel.preconditioner.BufferedCycle`).  With ``s = (rz, pq, rr,
rz_new)`` and the status ``st = (state, iterations, maxiter)`` in device memory, one
iteration is::

    q = A p;  pq = (p, q)
    if state == 0:  alpha = rz / pq;  x += alpha p;  r -= alpha q
    rr = (r, r)
    if state == 0:  iterations += 1;  state = 1 if rr <= tol^2, 2 if pq <= 0 or rz <= 0,
                    3 if rr is not finite, 4 if iterations == maxiter
    z = M r;  rz_new = (r, z)          (r is the cycle's own right-hand side buffer)
    if state == 0:  p = z + (rz_new / rz) p;  rz = rz_new

Every step is a kernel on preallocated buffers (the SpMV is adaptmg's CSR kernel, the
inner products :meth:`~adaptmg.linalg._vectorops.VectorOps.mdot`, the updates read
their scalars from device memory), so the whole iteration is recorded once and
replayed with one launch.  Once ``state != 0`` the updates are no-ops: ``x`` and the
iteration count freeze at the iteration that stopped.

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
from ..device.cudagraph import capture
from ._vectorops import VectorOps

__all__ = ["GraphCG"]


@functools.lru_cache(maxsize=None)
def _kernels(xp):
    ek = xp.ElementwiseKernel
    return {
        "xr": ek("T p, T q, raw T s, raw int32 st", "T x, T r",
                 "const T a = (st[0] == 0 && s[1] != T(0)) ? s[0] / s[1] : T(0);"
                 "x += a * p; r -= a * q;", "adaptmg_graphcg_xr"),
        "p": ek("T z, raw T s, raw int32 st", "T p",
                "if (st[0] == 0) { const T c = (s[0] != T(0)) ? s[3] / s[0] : T(0); p = z + c * p; }",
                "adaptmg_graphcg_p"),
        # one thread: the stopping test, the iteration count, rz <- rz_new
        "status": ek("raw T s, raw T tol2", "raw int32 st",
                     "if (st[0] == 0) {"
                     "  st[1] += 1;"
                     "  const T rr = s[2];"
                     "  if (!isfinite((double)rr)) st[0] = 3;"
                     "  else if (rr <= tol2[0]) st[0] = 1;"
                     "  else if (!(s[1] > T(0)) || !(s[0] > T(0))) st[0] = 2;"
                     "  else if (st[1] >= st[2]) st[0] = 4;"
                     "}", "adaptmg_graphcg_status"),
        "init": ek("int32 m", "raw int32 st", "st[0] = 0; st[1] = 0; st[2] = m;",
                   "adaptmg_graphcg_init"),
        "shift": ek("raw int32 st", "raw T s", "if (st[0] == 0) s[0] = s[3];",
                    "adaptmg_graphcg_shift"),
    }


class GraphCG:
    """CG preconditioned by a fixed-buffer cycle, one CUDA graph per iteration (GPU only).

    ``A``: the device CSR matrix (int32 indices) of the cycle's finest level; ``cycle``:
    a :class:`~adaptmg.multilevel.preconditioner.BufferedCycle` of the same dtype.  The
    graph is recorded at construction; ``self.graph_error`` says why when it was refused
    (then :meth:`solve` must not be used: ``self.graph is None``).  ``self.iterations``:
    the iterations of the last :meth:`solve`.
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
        self.k = _kernels(xp)
        self.x, self.p, self.q = (xp.zeros(n, dt) for _ in range(3))
        self.r = cycle.b           # the cycle reads b and never writes it: z = M r needs no copy
        self.s = xp.zeros(4, dt)
        self.tol2 = xp.zeros(1, dt)
        self.st = xp.zeros(3, np.int32)
        self._pinned = xp.cuda.alloc_pinned_memory(12)
        self._host = np.ndarray((3,), np.int32, buffer=self._pinned)
        self.iterations = 0
        self._hint = 1             # iterations of the last solve that iterated
        self.graph, self.graph_error = capture(
            backend, self._iteration, [self.x, self.r, self.p, self.s], self.x,
            rtol=1e3 * float(np.finfo(dt).eps), reset=self._reset_status)

    def _reset_status(self):
        self.st.set(np.array([0, 0, 2 ** 30], np.int32))

    def _iteration(self):
        k, ops, s, st, cyc = self.k, self.ops, self.s, self.st, self.cycle
        self.plan(self.p, self.q, 1.0, 0.0)
        ops.mdot(self.p[None], self.q, s[1:2])
        k["xr"](self.p, self.q, s, st, self.x, self.r)
        ops.mdot(self.r[None], self.r, s[2:3])
        k["status"](s, self.tol2, st, size=1)
        cyc.run_eager()
        ops.mdot(self.r[None], cyc.x, s[3:4])
        k["p"](cyc.x, s, st, self.p)
        k["shift"](st, s, size=1)

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
        xp.copyto(self.p, self.cycle.x)
        self.ops.mdot(r[None], self.cycle.x, self.s[0:1])
        self.tol2.fill(tol * tol)
        self.k["init"](np.int32(maxiter), self.st, size=1)
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
