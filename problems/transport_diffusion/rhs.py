r"""The right-hand side of one backward-Euler step, in fixed buffers, on the GPU one CUDA graph.

For the previous step's nodal values :math:`u^{k-1}` (:attr:`StepRHS.u`) and
:math:`t_k`:

.. math:: f^k = Z H^T\big(M(u^{k-1} + \Delta t\, f(t_k)) - A_D\, g(t_k)\big) + s\, g(t_k),

with :math:`g(t) = \mathrm{mask}\cdot\theta(t)` the Dirichlet lifting, :math:`A_D` the
system matrix's Dirichlet columns, :math:`Z` the 0/1 free mask, :math:`s` the
Dirichlet row scale and :math:`H^T` only when the mesh has hanging nodes. That is one
fused point kernel (:func:`.kernels.td_step_data_at`), two or three SpMVs and one
combination kernel: ~0.1 ms of device work for 1M DoFs, which launched from Python
cost ~0.5 ms per step on the H100 host. On the GPU the sequence is recorded once
(:func:`adaptmg.device.cudagraph.capture`) and each step replays it: the time enters
through a copy, recorded in the graph, from a page-locked host pair ``[t, c'(t)]``
into device memory, so the kernels read the step's time, not the time of the
recording. Same values as the launches, which remain the path when the capture is
refused (:attr:`StepRHS.graph_error` says why) and on the CPU.
"""
from __future__ import annotations

from adaptmg.device.cudagraph import capture

from .._stepping import constrain_combine
from .kernels import td_step_data_at, td_time

__all__ = ["StepRHS"]


class StepRHS:
    """``rhs = StepRHS(...)``; per step: write ``u^{k-1}`` into ``rhs.u``, then ``f = rhs(t_k)``
    (the buffer :attr:`out`, overwritten by the next call).

    Parameters
    ----------
    be : the backend; ``x, y, mask, z`` node coordinates, Dirichlet mask and free mask (0/1
        floats) as backend arrays; ``s`` the Dirichlet row scale; ``M_plan``, ``A_plan`` the
        SpMV plans of ``M`` and ``A_D``; ``HT_plan`` that of ``H^T`` or None (no hanging
        nodes); ``lam, b, dt`` the problem's coefficients; ``graph`` record a CUDA graph on
        the GPU (default True).
    """

    def __init__(self, be, x, y, mask, z, s, M_plan, A_plan, HT_plan, lam, b, dt, *, graph=True):
        xp = be.xp
        self.be, self.xp = be, xp
        self.x, self.y, self.mask, self.z, self.s = x, y, mask, z, float(s)
        self.M_plan, self.A_plan, self.HT_plan = M_plan, A_plan, HT_plan
        self.lam, self.b, self.dt = float(lam), (float(b[0]), float(b[1])), float(dt)
        n, dtype = x.shape[0], x.dtype
        self.u = xp.zeros(n, dtype)
        self.w, self.g, self.r = xp.empty(n, dtype), xp.empty(n, dtype), xp.empty(n, dtype)
        self.r2 = xp.empty(n, dtype) if HT_plan is not None else self.r
        self.out = xp.empty(n, dtype)
        self.tc = xp.zeros(2, dtype)
        if be.is_gpu:
            import cupyx
            self._tc_host = cupyx.empty_pinned((2,), dtype=dtype)
            self._done = xp.cuda.Event(disable_timing=True)
        else:
            self._tc_host = self.tc
            self._done = None
        self._tc_host[...] = td_time(self.dt)
        self.graph, self.graph_error = None, None
        if be.is_gpu and graph:
            # the check fills u with random values: u is set by the caller before each step
            self.graph, self.graph_error = capture(be, self._launch, [self.u], self.out)
        elif be.is_gpu:
            self.graph_error = "graph=False"

    @property
    def mode(self) -> str:
        """``"cuda-graph"`` or ``"launches"``."""
        return "cuda-graph" if self.graph is not None else "launches"

    def _launch(self):
        if self._done is not None:
            # the copy a graph replays reads the host pair when it runs (a raw runtime call:
            # CuPy's ndarray.set refuses host transfers on a capturing stream)
            rt = self.xp.cuda.runtime
            rt.memcpyAsync(self.tc.data.ptr, self._tc_host.ctypes.data, self.tc.nbytes,
                           rt.memcpyHostToDevice, self.xp.cuda.get_current_stream().ptr)
        td_step_data_at(self.x, self.y, self.u, self.mask, self.tc, self.lam, self.b, self.dt,
                        self.w, self.g)
        self.M_plan(self.w, self.r, 1.0, 0.0)          # r = M (u_old + dt f)
        self.A_plan(self.g, self.r, -1.0, 1.0)         # r -= A_D g   (Dirichlet lifting)
        if self.HT_plan is not None:
            self.HT_plan(self.r, self.r2, 1.0, 0.0)
        constrain_combine(self.z, self.r2, self.s, self.g, self.out)

    def __call__(self, t: float):
        """The step's right-hand side at time ``t`` from :attr:`u` (returns :attr:`out`)."""
        if self._done is not None:
            # the previous step's copy must have read the pair before it is rewritten
            self._done.synchronize()
        self._tc_host[...] = td_time(t)
        if self.graph is not None:
            self.graph.launch()
        else:
            self._launch()
        if self._done is not None:
            self._done.record()
        return self.out
