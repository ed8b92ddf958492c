"""CUDA-graph capture of a fixed launch sequence, checked against an eager run.

A sequence of kernel launches that reads and writes only preallocated device
buffers and never waits for the host (a multigrid cycle, one Arnoldi step)
can be recorded once by stream capture and replayed with a single
``cudaGraphLaunch``.  The GPU work is unchanged; what disappears is the host
cost of each launch (10-20 us of Python and CuPy argument handling), which
dominates on small levels: a V-cycle of a 7-level 3-D elasticity hierarchy
issues about 100 launches.

:func:`capture` records ``run()`` and accepts the graph only if

* nothing is allocated during the capture (an allocator that refuses is
  installed: memory taken from CuPy's pool while capturing would be owned by
  the graph yet handed back to the pool afterwards), and
* one replay reproduces the eager result on the same inputs to ``rtol``
  (relative max-norm).

Otherwise it returns ``None`` and the reason, and the caller keeps launching
eagerly.  Replays run on the current stream.
"""
from __future__ import annotations

import numpy as np

from . import pdl

__all__ = ["capture"]


def _refuse(size):
    raise MemoryError(f"device allocation of {size} bytes during CUDA-graph capture")


def capture(backend, run, inputs, output, rtol=1e-12, seed=0, reset=None):
    """Record ``run()`` in a CUDA graph; return ``(graph, None)`` or ``(None, reason)``.

    ``inputs``: the device arrays ``run`` reads (filled with random values for the
    check and left so); ``output``: the array it writes.  ``run`` must launch the
    same work on every call and may only touch preallocated buffers.  ``reset``
    (optional) restores any other state ``run`` reads (e.g. integer flags) before
    each of the eager run and the checked replay; it is not recorded.

    The kernels of :func:`adaptmg.device.pdl.module` are recorded with programmatic
    dependent launches (Hopper and later); if the driver refuses those, PDL is switched
    off and the graph is recorded once more without it.
    """
    if not backend.is_gpu:
        return None, "not a GPU backend"
    if not hasattr(backend.xp.cuda.Stream, "begin_capture"):
        return None, "this array module cannot record CUDA graphs (no Stream.begin_capture)"
    try:
        return _capture(backend, run, inputs, output, rtol, seed, reset)
    except pdl.PDLUnavailable:
        return _capture(backend, run, inputs, output, rtol, seed, reset)


def _capture(backend, run, inputs, output, rtol, seed, reset):
    xp = backend.xp
    # the check's inputs are drawn on the device (a host draw of a 1M-row vector and its
    # upload cost ~20 ms, more than the rest of a V-cycle's capture)
    rng = xp.random.RandomState(seed)
    vals = [rng.standard_normal(a.shape, dtype=np.float64).astype(a.dtype) for a in inputs]

    def fill():
        for a, v in zip(inputs, vals):
            a[...] = v
        if reset is not None:
            reset()
    try:
        fill()
        run()                                   # compiles kernels, creates lazy buffers
        ref = output.copy()
        stream = xp.cuda.Stream(non_blocking=True)
        graph = None
        with xp.cuda.using_allocator(_refuse), stream:
            stream.begin_capture()
            try:
                with pdl.capturing():           # kernels of pdl.module: programmatic launches
                    run()
            except BaseException:
                try:                            # end the (possibly invalidated) capture; the
                    stream.end_capture()        # error that stopped run() is the one to report
                except Exception:               # pragma: no cover - depends on the driver
                    pass
                raise
            graph = stream.end_capture()
        stream.synchronize()
        output.fill(0)
        fill()
        graph.launch()
        backend.synchronize()
        scale = max(float(xp.abs(ref).max()), 1e-300)
        err = float(xp.abs(output - ref).max()) / scale
        if not err <= rtol:
            return None, f"graph replay differs from the eager run (relative {err:.2e})"
        return graph, None
    except pdl.PDLUnavailable:
        raise
    except (RuntimeError, NotImplementedError, MemoryError, TypeError, ValueError) as exc:
        # pragma: no cover - CuPy refuses cuSPARSE/cuBLAS under capture (NotImplementedError),
        # the refusing allocator (MemoryError), CUDA errors (RuntimeError): launch eagerly
        return None, f"{type(exc).__name__}: {exc}"
