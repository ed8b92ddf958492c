"""The coarse solver of the distributed multigrid cycle: the serial levels on rank 0
(:class:`RankZeroCycle`, used by :class:`~.hierarchy.DistributedHierarchy` and
:mod:`.forest_levels`)."""
from __future__ import annotations

import time

import numpy as np

__all__ = ["RankZeroCycle", "MAX_GRAPHS"]

#: buffer pairs (and cycle kinds) a :class:`RankZeroCycle` records graphs for
MAX_GRAPHS = 8


class RankZeroCycle:
    r"""The coarse solver of the distributed :class:`~adaptmg.multilevel.MultilevelSolver`:
    on rank 0 one ``kind`` cycle of the serial hierarchy ``ml`` with its level ``level`` as
    the top (``ml._run``), on the levels agglomerated there; other ranks own no entry of that
    level (their vectors are empty) and do nothing.  ``depth = level``: the number of levels
    below the top, for the cycle schedule
    (:func:`~adaptmg.multilevel.solver.coarse_visits`), so that a W- or F-cycle visits it as
    the serial cycle visits ``ml.levels[level]``.

    On the GPU the visit is a CUDA graph (``graph="auto"``: where the serial hierarchy could
    record its own cycle, :meth:`~adaptmg.multilevel.MultilevelSolver._capturable`): the
    first visit with a given ``(kind, zero)`` and pair of buffers records ``ml._run`` on them
    (:func:`adaptmg.device.cudagraph.capture`, checked against the eager run; the caller's
    values kept), later visits replay it with one launch.  The levels here are small and
    their cycle is the host's launches: the one-GPU solver replays them inside its graph of
    the whole cycle, which the distributed levels' exchanges rule out.  A refused capture
    leaves that visit eager (``graph_error`` says why), as do buffers past the first
    :data:`MAX_GRAPHS` pairs (the solver passes the same two; a caller with new ones each
    time would otherwise record each time).  A graph freezes the serial levels as they were
    when it was recorded (their smoothers' parameters): ``graph=False`` for a hierarchy that
    changes after its first visit.

    ``seconds`` / ``calls``: wall time spent in it on this rank and its visits (reset them
    to measure; the GPU runs asynchronously, so set ``sync = True`` for device time: the
    device is then synchronised before and after each visit, which costs time itself)."""

    def __init__(self, ml, level, rank, graph="auto"):
        if graph not in (True, False, "auto"):
            raise ValueError(f"graph must be True, False or 'auto', got {graph!r}")
        self.ml, self.level, self.active = ml, int(level), rank == 0
        self.depth = self.level
        self.seconds, self.calls, self.sync = 0.0, 0, False
        self.graph, self.graph_error = graph, None
        self._graphs = {}            # (kind, zero, b, x) -> CUDA graph, or None: refused

    def _recorded(self, b, x, kind, zero):
        """The CUDA graph of ``ml._run(b, x, kind, zero)`` on these buffers (recorded on first
        use), or None where it is not recorded."""
        ml = self.ml
        if not self.graph or not ml.backend.is_gpu:
            return None
        key = (kind, bool(zero), b.data.ptr, b.size, x.data.ptr, x.size)
        if key not in self._graphs:
            if len(self._graphs) >= MAX_GRAPHS:
                return None
            g = None
            if self.graph is True or ml._capturable():
                from ..device.cudagraph import capture
                ins = [b] if zero else [b, x]            # zero: x is written, not read
                keep = [a.copy() for a in ins]            # the capture's check fills them
                g, self.graph_error = capture(ml.backend, lambda: ml._run(b, x, kind, zero, level=self.level),
                                              ins, x, rtol=1e3 * float(np.finfo(ml.dtype).eps))
                for a, k in zip(ins, keep):
                    a[...] = k
            self._graphs[key] = g
        return self._graphs[key]

    def cycle(self, b, x, kind, zero):
        if self.active:
            if self.sync:
                self.ml.backend.synchronize()
            t0 = time.perf_counter()
            g = self._recorded(b, x, kind, zero)
            if g is not None:
                g.launch()
            else:
                self.ml._run(b, x, kind, zero, level=self.level)
            if self.sync:
                self.ml.backend.synchronize()
            self.seconds += time.perf_counter() - t0
            self.calls += 1
        return x

    def __repr__(self):
        if self.ml is None:                     # a rank other than 0 (forest set-up): no serial hierarchy
            return f"RankZeroCycle(serial levels 0..{self.level} on rank 0)"
        return (f"RankZeroCycle(serial levels 0..{self.level} on rank 0, "
                f"{self.ml.levels[self.level].n} DoFs at the top)")
