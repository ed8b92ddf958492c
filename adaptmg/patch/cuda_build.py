"""Turning the CUDA source templates of the Cartesian Q_k path into kernels.

The templates (:mod:`.cuda_operator`, :mod:`.cuda_column`, :mod:`.cuda_pencil`,
:mod:`.cuda_axis`) hold ``$KEY`` placeholders; :func:`_fill` replaces them
(longest key first, so ``$KP`` before ``$K``), :func:`_literals` writes the 1D
matrices compiled into a kernel as exact hexadecimal C literals, and :func:`_load`
compiles a source with NVRTC (CuPy ``RawKernel``) or, where the environment
variable ADAPTMG_PATCH_CUBIN names a folder of prebuilt cubins
(:func:`.kernels.build_cubins`), loads the cubin whose name carries the hash of
this exact source (:func:`cubin_name`).

Only ``adaptmg.backend`` imports CuPy; we get it as ``get_backend("gpu").xp``.
"""
from __future__ import annotations

import numpy as np

from ..backend import get_backend

_TYPES = {np.dtype(np.float64): "double", np.dtype(np.float32): "float"}


def _fill(tpl, **kw):
    out = tpl
    for key in sorted(kw, key=len, reverse=True):      # $KP before $K
        out = out.replace("$" + key, str(kw[key]))
    return out


def _literals(values, dtype):
    """Exact C literals (hexadecimal floats) of ``values`` rounded to ``dtype``."""
    dt = np.dtype(dtype)
    suffix = "f" if dt == np.float32 else ""
    return ", ".join(float(v).hex() + suffix for v in np.asarray(values, dtype=dt).ravel())


def cubin_name(src, name):
    """File name of a prebuilt cubin for this exact source (hash-tagged)."""
    import hashlib
    return f"{name}_{hashlib.sha1(src.encode()).hexdigest()[:12]}.cubin"


def _load(src, name):
    import os
    cp = get_backend("gpu").xp
    d = os.environ.get("ADAPTMG_PATCH_CUBIN")
    if d:
        path = os.path.join(d, cubin_name(src, name))
        if os.path.exists(path):
            try:
                return cp.RawModule(path=path).get_function(name)
            except Exception:           # wrong arch / driver: compile instead
                pass
    return cp.RawKernel(src, name, options=("-std=c++17",))

