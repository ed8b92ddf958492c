"""Host-tuned or generic: which variant of the mesh's array code runs.

The forest's functions have one body written against ``xp`` (NumPy or CuPy, taken from the
arrays).  At a few places the host keeps a NumPy-only variant because it is measurably
faster there (``take(..., out=, mode="clip")``, ``.view`` of another itemsize, the timsort
merge of two sorted runs, the in-place growth of :mod:`._grow`, a worker thread in
:meth:`Forest.split`); the generic variant, which the device runs, uses only what NumPy and
CuPy both offer (scatters through :func:`adaptmg.backend.scatter_max`, stable sorts through
:func:`adaptmg.backend.stable_argsort`).
:func:`tuned` says which one to take; :func:`generic` forces the generic one on the host
too, so that the CPU tests run the device's code with NumPy and compare it, integer for
integer, with the tuned one.
"""
from __future__ import annotations

import contextlib
import contextvars

from ..backend import backend_of

#: set inside :func:`generic` (this thread / context only)
_FORCED = contextvars.ContextVar("adaptmg_mesh_generic", default=False)


def tuned(*arrays) -> bool:
    """True when ``arrays`` live on the host and the generic variant is not forced."""
    return not _FORCED.get() and not backend_of(*arrays).is_gpu


def xp_of(*arrays):
    """The array module of ``arrays`` (``numpy`` or ``cupy``)."""
    return backend_of(*arrays).xp


@contextlib.contextmanager
def generic():
    """Run the mesh's generic (device) variants on the host inside the block (this thread:
    the generic :meth:`Forest.split` runs inline)."""
    token = _FORCED.set(True)
    try:
        yield
    finally:
        _FORCED.reset(token)

