"""Validity checks of queued device work, read at the end of a block instead of at once.

An assembly on the device ends by reading one flag (did any cell have
:math:`\\det J \\le 0`?); that read waits for every kernel queued before it, so the host
sits idle while the element kernels run.  Inside :func:`deferred_checks` such a check
(:func:`check_later`: the flag, the stream it was queued on, the error to raise) is kept
and read at the block's normal end, so the host can queue other work meanwhile (on the
high-priority stream, :mod:`adaptmg.device.priority`: the distributed set-up builds a
level's transfer while its assembly runs).  Bad input still raises the same error, at the
end of the block and before anything after it; a block left by an exception drops its
checks (the exception wins).  Outside a block a check is read at once, as before.
"""
from __future__ import annotations

import threading
from contextlib import contextmanager

from ..backend import backend_of, in_host_memory

__all__ = ["check_later", "deferred_checks"]

_LOCAL = threading.local()


def check_later(flag, error):
    """Raise ``error()`` if the scalar ``flag`` (a host value, or a 0-d device array queued on
    the current stream) is true: at once, or inside :func:`deferred_checks` at its end."""
    pending = getattr(_LOCAL, "pending", None)
    if pending is None:
        if bool(flag):
            raise error()
        return
    be = backend_of(flag)
    stream = be.xp.cuda.get_current_stream() if be.is_gpu and not in_host_memory(flag) else None
    pending.append((flag, stream, error))


@contextmanager
def deferred_checks():
    """A block whose :func:`check_later` checks are read at its end (each after its stream's
    work; the first true one raises).  Blocks nest: an inner block reads its own."""
    outer = getattr(_LOCAL, "pending", None)
    pending = _LOCAL.pending = []
    try:
        yield
    finally:
        _LOCAL.pending = outer
    for flag, stream, error in pending:
        if stream is not None:
            stream.synchronize()
        if bool(flag):
            raise error()
