"""Error helpers shared by the user-facing entry points (CLI, pyamg bridge, I/O).

GPU out-of-memory
-----------------
CuPy raises ``cupy.cuda.memory.OutOfMemoryError`` (and cuSPARSE sometimes a
``CUSPARSE_STATUS_ALLOC_FAILED`` error) when a device allocation fails.  Those
messages name the bytes of *one* allocation but not the problem that was being
set up, nor what to do.  :func:`gpu_memory_guard` turns them into a plain
:class:`MemoryError` that says what was attempted (``what``, and the size of
the problem when the caller knows it) and the three ways out: a smaller
problem, ``backend="cpu"``, or single precision (``dtype=float32`` halves the
multigrid hierarchy).

The check is by class name and module (``cupy...OutOfMemoryError``, through
:func:`adaptmg.backend.is_device_error`) so this module never imports CuPy
(``adaptmg.backend`` is the only module that does).
"""
from __future__ import annotations

import contextlib

from .backend import is_device_error

__all__ = ["gpu_memory_guard", "is_gpu_oom", "oom_message", "format_bytes"]


def format_bytes(n) -> str:
    """``1536 -> '1.5 KiB'`` (binary units)."""
    try:
        n = float(n)
    except (TypeError, ValueError):
        return str(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024.0 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024.0
    return f"{n:.1f} TiB"  # pragma: no cover


def is_gpu_oom(exc: BaseException) -> bool:
    """True for CuPy's OutOfMemoryError and cuSPARSE/cuBLAS allocation failures."""
    if not is_device_error(exc):
        return False
    if type(exc).__name__ == "OutOfMemoryError":
        return True
    msg = str(exc)
    return "ALLOC_FAILED" in msg or "out of memory" in msg.lower()


def oom_message(what: str, nbytes=None, exc: BaseException | None = None) -> str:
    """The text of the MemoryError raised by :func:`gpu_memory_guard`."""
    size = f" (about {format_bytes(nbytes)} of data)" if nbytes else ""
    detail = f" [{type(exc).__name__}: {exc}]" if exc is not None else ""
    return (f"GPU out of memory while {what}{size}{detail}. "
            "What to do: use a smaller problem (fewer cells/refinements), run on the CPU "
            "(backend='cpu', or --backend cpu on the command line), or use single precision "
            "(dtype=numpy.float32 for the multigrid hierarchy, which halves its memory).")


@contextlib.contextmanager
def gpu_memory_guard(what: str, nbytes=None):
    """Context manager: re-raise a GPU out-of-memory error as :class:`MemoryError`.

    ``what`` describes the operation ("moving a 4-level hierarchy to the GPU"),
    ``nbytes`` the size of the data involved if known.  Other exceptions pass
    through unchanged.
    """
    try:
        yield
    except Exception as exc:   # not swallowed: re-raised unchanged unless it is a GPU OOM
        if is_gpu_oom(exc):
            raise MemoryError(oom_message(what, nbytes, exc)) from exc
        raise
