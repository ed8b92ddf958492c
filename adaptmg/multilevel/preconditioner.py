"""One multigrid cycle as a preconditioner ``M ~ A^{-1}`` (a LinearOperator).

``M v`` runs one cycle on ``A x = v`` from ``x = 0``.  On the GPU the cycle can be
recorded once as a CUDA graph (:mod:`adaptmg.device.cudagraph`) and replayed with
one launch per application: the input is copied into a fixed buffer, the graph
replays, and the fixed output buffer is copied out.  The graph freezes the cycle
as it was recorded (smoother parameters included).
"""
from __future__ import annotations

import numpy as np

__all__ = ["BufferedCycle", "make_preconditioner"]


class BufferedCycle:
    """One cycle of a MultilevelSolver on fixed buffers: ``x <- cycle(A, b)`` from ``x = 0``.

    ``cyc.b`` is the right-hand side buffer (fill it in place), ``cyc()`` runs the
    cycle and returns ``cyc.x``.  On the GPU the cycle is recorded once as a CUDA graph
    and replayed with one launch (``mode == "cuda-graph"``); if the capture is refused,
    ``mode == "eager"`` and ``graph_error`` says why.  Nothing is allocated per call, so
    the caller may itself record ``cyc()`` in a larger graph.  This is the building
    block of :func:`make_preconditioner` and of solvers that prepare the cycle's input
    with their own kernels (e.g. the projection of a Neumann problem's residual).

    ``graph``: "auto" (GPU and every level an assembled matrix with adaptmg's own
    smoother), ``True`` (GPU, any levels) or ``False``.
    """

    def __init__(self, ml, kind="V", graph="auto"):
        if graph not in (True, False, "auto"):
            raise ValueError(f"graph must be True, False or 'auto', got {graph!r}")
        be, xp = ml.backend, ml.backend.xp
        if graph is True and not be.is_gpu:
            raise ValueError("graph=True needs the GPU backend (CUDA graphs); use graph=False or 'auto'")
        n = ml.levels[-1].n
        self.ml, self.kind = ml, kind
        self.b = xp.zeros(n, ml.dtype)
        self.x = xp.zeros(n, ml.dtype)
        self.graph = None
        self.graph_error = None
        self.mode = "eager" if be.is_gpu else "numpy"
        if graph is True or (graph == "auto" and be.is_gpu and kind != "AMLI"
                             and ml._capturable()):
            from ..device.cudagraph import capture
            g, why = capture(be, self.run_eager, [self.b], self.x,
                             rtol=1e3 * float(np.finfo(ml.dtype).eps))
            self.graph_error = ml.graph_error = why
            if g is not None:
                self.graph, self.mode = g, "cuda-graph"

    def run_eager(self, out=None, defer_last=False):
        """The cycle kernel by kernel (what the graph replays; callable inside another
        capture), into ``self.x`` or into ``out`` (an array like ``self.x``).

        ``defer_last=True``: the finest level's last Jacobi sweep may be left to the
        caller; returns ``(smoother, src)`` when it was (the caller then runs ``x <- src
        + omega D^{-1} (b - A src)``), else None (see ``MultilevelSolver._run``)."""
        ml = self.ml
        ml._run(self.b, self.x if out is None else out, self.kind, True, defer_last=defer_last)
        return ml._deferred if defer_last else None

    def __call__(self):
        if self.graph is not None:
            self.graph.launch()
        else:
            self.run_eager()
        return self.x


def make_preconditioner(ml, kind, dtype=None, graph="auto"):
    """LinearOperator of one ``kind`` cycle of the MultilevelSolver ``ml``.

    See :meth:`adaptmg.multilevel.MultilevelSolver.aspreconditioner`.
    """
    be, xp = ml.backend, ml.backend.xp
    cyc = BufferedCycle(ml, kind, graph)
    graphed = cyc.graph is not None
    n = ml.levels[-1].n
    own_dtype = ml.dtype

    def matvec(v):
        host_in = be.is_gpu and isinstance(v, np.ndarray)
        if host_in:
            v = be.asarray(v)
        vin = v.reshape(-1)
        if vin.shape != (n,):
            raise ValueError(f"preconditioner input must have {n} entries, got shape {v.shape}")
        if graphed:
            xp.copyto(cyc.b, vin, casting="unsafe")
            out = cyc().astype(vin.dtype, copy=True)
        else:
            if vin.dtype == own_dtype and vin.flags.c_contiguous:
                bb = vin
            else:
                bb = cyc.b
                xp.copyto(bb, vin, casting="unsafe")
            out = xp.empty(n, own_dtype)
            ml._run(bb, out, kind, True)
            if vin.dtype != own_dtype:
                out = out.astype(vin.dtype)
        out = out.reshape(v.shape)
        return xp.asnumpy(out) if host_in else out

    def apply_into(v, out):
        """``out <- M v`` for backend vectors ``v`` and ``out`` (``out`` contiguous, any
        float dtype): the cycle writes ``out`` itself where it has the cycle's dtype,
        else its fixed buffer is cast into ``out`` (no temporary either way)."""
        if not (isinstance(v, xp.ndarray) and isinstance(out, xp.ndarray)):
            raise TypeError(f"apply_into needs two {xp.__name__} arrays (the solver's backend), "
                            f"got {type(v).__name__} and {type(out).__name__}")
        vin = v.reshape(-1)
        if vin.shape != (n,) or out.shape != (n,) or not out.flags.c_contiguous:
            raise ValueError(f"apply_into needs vectors of {n} entries and a contiguous out, "
                             f"got {v.shape} and {out.shape}")
        if graphed:
            xp.copyto(cyc.b, vin, casting="unsafe")
            xp.copyto(out, cyc(), casting="unsafe")
            return out
        if vin.dtype == own_dtype and vin.flags.c_contiguous:
            bb = vin
        else:
            bb = cyc.b
            xp.copyto(bb, vin, casting="unsafe")
        if out.dtype == own_dtype and out is not vin and bb is not out:
            ml._run(bb, out, kind, True)
        else:
            ml._run(bb, cyc.x, kind, True)
            xp.copyto(out, cyc.x, casting="unsafe")
        return out

    def matmat(V):
        """``M V`` for a block ``V`` of shape ``(n, k)``: one block cycle
        (:mod:`adaptmg.multilevel.block`); ``(n, 1)`` takes the vector path."""
        if V.ndim != 2 or V.shape[0] != n:
            raise ValueError(f"preconditioner input must have shape ({n}, k), got {V.shape}")
        if V.shape[1] == 1:
            return matvec(V)
        from .block import block_matmat
        host_in = be.is_gpu and isinstance(V, np.ndarray)
        out = block_matmat(ml, kind, be.asarray(V))
        return xp.asnumpy(out) if host_in else out

    op_dtype = np.dtype(dtype) if dtype is not None else ml.outer_dtype
    M = be.linalg.LinearOperator((n, n), matvec=matvec, rmatvec=matvec, matmat=matmat,
                                 dtype=op_dtype)
    M.graph = graphed
    M.adaptmg_fresh_result = True          # every M v above is a new array
    M.adaptmg_apply_into = apply_into      # M v straight into a given vector (fgmres' Z)
    return M
