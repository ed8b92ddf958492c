"""Freeing a dropped multigrid hierarchy at once.

A solver's levels, SpMV plans, smoothers and constraints refer to each other (reference
cycles), so dropping the last reference to a hierarchy frees none of its arrays: they wait
for Python's cyclic collector, whose full collections are rare.  An adaptive loop would then
estimate, refine and build the next step's hierarchy beside the last one's memory -- on a
GPU ~0.5 KB per DoF of a 2-D Q1 hierarchy (one H200, 42.6M DoFs: 21.7 GiB still held after
``del`` of a distributed solve's result, 1.7 GiB after a collection).

:func:`release_hierarchies` runs one full collection when the dropped hierarchy had at least
:data:`RELEASE_DOFS` DoFs (a collection costs tens of milliseconds in a process with ~1e5
Python objects: not worth it for small steps)."""
from __future__ import annotations

import gc

__all__ = ["RELEASE_DOFS", "release_hierarchies"]

#: the smallest dropped hierarchy (DoFs of its finest level) that :func:`release_hierarchies`
#: collects for
RELEASE_DOFS = 1 << 20


def release_hierarchies(num_dofs) -> bool:
    """After dropping the last reference to a hierarchy of ``num_dofs`` DoFs: free its memory
    now (one ``gc.collect()``) if it had at least :data:`RELEASE_DOFS`; whether it did."""
    if int(num_dofs) < RELEASE_DOFS:
        return False
    gc.collect()
    return True
