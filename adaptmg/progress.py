"""Progress bars for time loops, adaptive loops and long setups (rich).

Usage::

    from adaptmg.progress import progress
    for step in progress(range(nsteps), "time steps", quiet=quiet):
        ...
    with progress(total=nsteps, description="time steps") as bar:   # manual advance
        for k in range(nsteps):
            ...
            bar.advance()

The bar is drawn on stderr only when it is a terminal, ``quiet`` is false and
the environment does not set ``ADAPTMG_QUIET``; otherwise the helper is a
transparent pass-through (no output at all), so logs, pipes and test output
stay clean.  rich is imported lazily, only when a bar is drawn.
"""
from __future__ import annotations

import os
import sys

__all__ = ["progress", "Progress", "enabled"]


def enabled(quiet: bool = False, stream=None) -> bool:
    """True when a bar would be drawn: not quiet, ADAPTMG_QUIET unset, stream is a TTY."""
    if quiet or os.environ.get("ADAPTMG_QUIET"):
        return False
    stream = sys.stderr if stream is None else stream
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):   # no isatty, or a closed stream
        return False


class Progress:
    """Iterable / context manager wrapping one rich task (or nothing when disabled)."""

    def __init__(self, iterable=None, total=None, description="working", quiet=False,
                 stream=None):
        if iterable is None and total is None:
            raise ValueError("progress: give an iterable or total=")
        if total is not None:
            if isinstance(total, bool) or not isinstance(total, int) or total < 0:
                raise ValueError(f"progress: total must be a non-negative integer, got {total!r}")
        if not isinstance(description, str):
            raise TypeError(f"progress: description must be a str, got {type(description).__name__}")
        if total is None:
            try:
                total = len(iterable)
            except TypeError:
                total = None
        self.iterable = iterable
        self.total = total
        self.description = description
        self._on = enabled(quiet, stream)
        self._stream = sys.stderr if stream is None else stream
        self._rich = None
        self._task = None

    # -- rich lifecycle
    def _start(self):
        if self._on and self._rich is None:
            from rich.console import Console
            from rich.progress import (BarColumn, MofNCompleteColumn, Progress as RP,
                                       TextColumn, TimeElapsedColumn, TimeRemainingColumn)
            self._rich = RP(TextColumn("[bold]{task.description}"), BarColumn(),
                            MofNCompleteColumn(), TimeElapsedColumn(), TimeRemainingColumn(),
                            console=Console(file=self._stream), transient=False)
            self._rich.start()
            self._task = self._rich.add_task(self.description, total=self.total)

    def _stop(self):
        if self._rich is not None:
            self._rich.stop()
            self._rich = None

    def advance(self, n: int = 1):
        if self._rich is not None:
            self._rich.advance(self._task, n)

    def update(self, **fields):
        """Change ``description`` or ``total`` of the running bar."""
        if self._rich is not None:
            self._rich.update(self._task, **fields)

    def __enter__(self):
        self._start()
        return self

    def __exit__(self, *exc):
        self._stop()
        return False

    def __iter__(self):
        if self.iterable is None:
            raise TypeError("progress(total=...) is not iterable; use it as a context manager "
                            "and call .advance()")
        if not self._on:
            yield from self.iterable
            return
        self._start()
        try:
            for item in self.iterable:
                yield item
                self.advance()
        finally:
            self._stop()


def progress(iterable=None, description: str = "working", quiet: bool = False, *,
             total: int | None = None, stream=None) -> Progress:
    """Wrap ``iterable`` (or an integer ``total``) in a progress bar.

    ``progress(range(n), "time steps")`` iterates like ``range(n)``;
    ``progress(n, "adaptive loop")`` is ``progress(range(n), ...)``;
    ``progress(total=n)`` is a context manager with ``.advance()``.
    Silent when ``quiet``, when ``ADAPTMG_QUIET`` is set, or when stderr is not
    a terminal.
    """
    if isinstance(iterable, bool):
        raise TypeError("progress: iterable must be an iterable or an int, got bool")
    if isinstance(iterable, int):
        if iterable < 0:
            raise ValueError(f"progress: a count must be non-negative, got {iterable}")
        iterable = range(iterable)
    elif iterable is not None and not hasattr(iterable, "__iter__"):
        raise TypeError(f"progress: iterable must be iterable or an int, got {type(iterable).__name__}")
    return Progress(iterable, total, description, quiet, stream)
