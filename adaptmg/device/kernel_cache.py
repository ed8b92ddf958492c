"""A compiled-kernel cache that adaptmg controls, layered under CuPy's own.

CuPy compiles every kernel (its element-wise and reduction kernels as well as adaptmg's
``RawKernel``/``RawModule`` sources) with NVRTC on first use and keeps the cubin in its
disk cache (``CUPY_CACHE_DIR``, default ``~/.cupy/kernel_cache``), under a file name that
hashes the source, the options, the architecture and the NVRTC version.  A process that
meets an empty CuPy cache -- a new machine, a container, a CI job, a user who clears it --
compiles every kernel again: tens of seconds for one multigrid set-up (measured with
``scripts/bench_setup.py --cold``).

:func:`install` puts a :class:`LayeredKernelCache` in front of CuPy's cache backend:

* ``load(name)``: CuPy's own cache first; on a miss adaptmg's cache
  (:func:`cache_dir`), and a hit there is copied into CuPy's cache; on a miss there too
  the cubin the package ships for the call in progress (:mod:`.kernel_bundle`), stored
  into both caches;
* ``save(name, cubin, source)``: into both.

Since the file names are CuPy's hashes, a cubin is only ever found for the exact source,
options, architecture and compiler it was built from: a stale or foreign file is never
used, it is just not found (and CuPy checks each file's own hash when it reads it).
``adaptmg warmup`` (:mod:`adaptmg.device.warmup`) fills adaptmg's cache ahead of time, in
parallel processes; after that, a fresh process with an empty CuPy cache loads instead of
compiling.  ``ADAPTMG_KERNEL_CACHE=off`` leaves CuPy's cache as it is.

CuPy 14 offers the cache backend as a private hook (``cupy.cuda.compiler.
_set_kernel_cache_backend``); where it is missing, :func:`install` does nothing and CuPy
works as before.
"""
from __future__ import annotations

import os

__all__ = ["cache_dir", "install", "installed", "LayeredKernelCache"]

_STATE = {"installed": None}


def cache_dir() -> str | None:
    """adaptmg's kernel cache folder: ``$ADAPTMG_KERNEL_CACHE``, else
    ``$XDG_CACHE_HOME/adaptmg/kernels`` (``~/.cache/adaptmg/kernels``); None when the
    variable is ``off``/``0``/``none``."""
    env = os.environ.get("ADAPTMG_KERNEL_CACHE")
    if env is not None:
        if env.strip().lower() in ("", "off", "0", "none", "false"):
            return None
        return os.path.abspath(os.path.expanduser(env))
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "adaptmg", "kernels")


def _layered_class(base_cls, disk_cls):
    class LayeredKernelCache(base_cls):
        """CuPy's cache backend first, adaptmg's folder second (see the module docstring)."""

        def __init__(self, primary, folder):
            os.makedirs(folder, exist_ok=True)
            self.primary = primary
            self.folder = folder
            self.secondary = disk_cls(folder)

        def load(self, name):
            payload = self.primary.load(name)
            if payload is not None:
                return payload
            payload = self.secondary.load(name)
            if payload is not None:
                try:
                    self.primary.save(name, payload, "")
                except OSError:                # a read-only CuPy cache: still usable
                    pass
                return payload
            payload = _shipped()               # the package's cubin of the call in progress
            if payload is not None:
                try:
                    self.save(name, payload, "")
                except OSError:
                    pass
            return payload

        def save(self, name, cubin, source):
            self.primary.save(name, cubin, source)
            try:
                self.secondary.save(name, cubin, source)
            except OSError:                    # adaptmg's folder not writable: CuPy's suffices
                pass

    return LayeredKernelCache


LayeredKernelCache = None      # the class, made by install() from CuPy's base class


def _shipped():
    """The shipped cubin of the compile call in progress (:mod:`.kernel_bundle`), or None."""
    try:
        from .kernel_bundle import payload
    except ImportError:                        # the manifest's workers load this file by path
        return None
    try:
        return payload()
    except Exception:                          # noqa: BLE001 - a bundle only saves time
        return None


def install(compiler) -> bool:
    """Layer adaptmg's cache under CuPy's (``compiler`` is ``cupy.cuda.compiler``).

    Idempotent; returns whether the layered cache is in place."""
    global LayeredKernelCache
    if _STATE["installed"] is not None:
        return _STATE["installed"]
    folder = cache_dir()
    setter = getattr(compiler, "_set_kernel_cache_backend", None)
    current = getattr(compiler, "_kernel_cache_backend", None)
    disk_cls = getattr(compiler, "_DiskKernelCacheBackend", None)
    base_cls = getattr(compiler, "_KernelCacheBackend", None)
    ok = False
    if folder and setter and current is not None and disk_cls and base_cls:
        try:
            LayeredKernelCache = _layered_class(base_cls, disk_cls)
            setter(LayeredKernelCache(current, folder))
            ok = True
        except OSError:                        # the folder cannot be made: CuPy's cache only
            ok = False
    _STATE["installed"] = ok
    return ok


def installed() -> bool:
    """Whether :func:`install` put the layered cache in place in this process."""
    return bool(_STATE["installed"])
