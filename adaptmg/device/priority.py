"""Host work beside queued device work: a block of set-up run on the device's high-priority
stream while the current stream's queued kernels run on.

The distributed set-up queues long device work whose result it needs only later (a level's
power iteration, an assembly's last kernels) and meanwhile does host-bound work with small
kernels (the next levels, the constraint blocks).  On the current stream those kernels, and
every host wait of that work, would queue behind the long ones; on a second stream of the
*same* priority the device still dispatches the long kernels' blocks first (measured on an
H200: a coarser level's set-up 42 -> 69 ms beside a 21M-row power iteration); on the
high-priority stream its kernels go first (53 ms).

:meth:`PriorityStream.after` runs a block there after an event (:meth:`PriorityStream.mark`)
of the current stream and makes the current stream wait for the block's work at its end,
so the work after the block sees its results.  What the block reads must have been made
before the mark; what the current stream queued after the mark, the block must not read.

CuPy's memory pool keeps the blocks freed on a stream for that stream (its arenas), so the
temporaries of the work done there stay cached for the priority stream (the pool frees
them when an allocation would fail); and an allocation the pool must take from CUDA
synchronises with the device, so the overlap needs those cached blocks: the first set-up
in a process overlaps little, the set-ups after it (warm, an adaptive loop's) do.
"""
from __future__ import annotations

from contextlib import contextmanager

__all__ = ["PriorityStream", "priority_stream"]

_STREAMS = {}


def priority_stream(xp):
    """The device's non-blocking stream of the highest priority (CUDA clamps the asked
    priority to the device's range), one per device, made on first use and kept: a stream
    made per use would strand the pool's blocks cached for it."""
    dev = int(xp.cuda.Device().id)
    s = _STREAMS.get(dev)
    if s is None:
        s = _STREAMS[dev] = xp.cuda.Stream(non_blocking=True, priority=-100)
    return s


class PriorityStream:
    """Blocks of work on :func:`priority_stream` beside the current stream (module doc).
    ``switches``: how many blocks ran there (each costs two stream waits)."""

    def __init__(self, xp):
        self.xp = xp
        self.switches = 0

    def mark(self):
        """An event after the current stream's work so far."""
        ev = self.xp.cuda.Event(disable_timing=True)
        ev.record(self.xp.cuda.get_current_stream())
        return ev

    @contextmanager
    def after(self, mark):
        """Run the block on the priority stream after the event ``mark``; at its end (also on
        an exception) the previous current stream is current again and waits for the
        block's work."""
        xp = self.xp
        prev, hi = xp.cuda.get_current_stream(), priority_stream(xp)
        hi.wait_event(mark)
        hi.use()
        self.switches += 1
        try:
            yield hi
        finally:
            done = xp.cuda.Event(disable_timing=True)
            done.record(hi)
            prev.use()
            prev.wait_event(done)
