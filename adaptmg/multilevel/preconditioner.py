"""One multigrid cycle as a preconditioner ``M ~ A^{-1}`` (a LinearOperator).

``M v`` runs one cycle on ``A x = v`` from ``x = 0``.  On the GPU the cycle can be
recorded once as a CUDA graph (:mod:`adaptmg.device.cudagraph`) and replayed with
one launch per application: the input is copied into a fixed buffer, the graph
replays, and the fixed output buffer is copied out.  The graph freezes the cycle
as it was recorded (smoother parameters included).
"""
from __future__ import annotations

import numpy as np

__all__ = ["make_preconditioner"]


def make_preconditioner(ml, kind, dtype=None, graph="auto"):
    """LinearOperator of one ``kind`` cycle of the MultilevelSolver ``ml``.

    See :meth:`adaptmg.multilevel.MultilevelSolver.aspreconditioner`.
    """
    if graph not in (True, False, "auto"):
        raise ValueError(f"graph must be True, False or 'auto', got {graph!r}")
    be, xp = ml.backend, ml.backend.xp
    if graph is True and not be.is_gpu:
        raise ValueError("graph=True needs the GPU backend (CUDA graphs); use graph=False or 'auto'")
    n = ml.levels[-1].n
    own_dtype = ml.dtype
    bbuf = xp.zeros(n, own_dtype)
    cyc = None
    if graph is True or (graph == "auto" and be.is_gpu and ml._capturable()):
        from ..device.cudagraph import capture
        xbuf = xp.zeros(n, own_dtype)
        g, why = capture(be, lambda: ml._run(bbuf, xbuf, kind, True), [bbuf], xbuf,
                         rtol=1e3 * float(np.finfo(own_dtype).eps))
        ml.graph_error = why
        if g is not None:
            cyc = (g, xbuf)

    def matvec(v):
        host_in = be.is_gpu and isinstance(v, np.ndarray)
        if host_in:
            v = be.asarray(v)
        vin = v.reshape(-1)
        if vin.shape != (n,):
            raise ValueError(f"preconditioner input must have {n} entries, got shape {v.shape}")
        if cyc is not None:
            xp.copyto(bbuf, vin, casting="unsafe")
            cyc[0].launch()
            out = cyc[1].astype(vin.dtype, copy=True)
        else:
            if vin.dtype == own_dtype and vin.flags.c_contiguous:
                bb = vin
            else:
                bb = bbuf
                xp.copyto(bb, vin, casting="unsafe")
            out = xp.empty(n, own_dtype)
            ml._run(bb, out, kind, True)
            if vin.dtype != own_dtype:
                out = out.astype(vin.dtype)
        out = out.reshape(v.shape)
        return xp.asnumpy(out) if host_in else out

    op_dtype = np.dtype(dtype) if dtype is not None else ml.outer_dtype
    M = be.linalg.LinearOperator((n, n), matvec=matvec, rmatvec=matvec, dtype=op_dtype)
    M.graph = cyc is not None
    return M
