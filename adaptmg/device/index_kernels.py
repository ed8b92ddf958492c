r"""Fused index kernels of the device mesh set-up, each with a NumPy twin.

On the GPU the set-up of a level is bound by CuPy's per-call host overhead (an elementwise
op ~10 us, a boolean mask or ``flatnonzero`` ~100 us: it reads its size back), not by
bandwidth (issue 36).  A chain of elementwise tests and gathers that ends in one
``flatnonzero`` is folded here into one ``ElementwiseKernel`` (made once, lazily, named
``adaptmg_<name>``) and that one ``flatnonzero``.

Dispatch is on the array type: a NumPy array (the host, and the stand-ins of the CPU tests,
``tests/mesh/strict_cupy.py`` / ``tests/distributed/fake_cupy.py``, whose arrays are NumPy
subclasses) runs the *twin*, the plain array code of the same formula (it is the host's
path, unchanged); a CuPy array runs the kernel.  Both give the same integers (the GPU tests
of ``tests/mesh/test_index_kernels.py`` compare them).  :data:`FUSED` names the functions,
so that ``scripts/census_device_ops.py`` can count a twin's call as the one launch it is on
the device.

Kernels
=======

``hanging_candidates``
    The forest nodes ``i`` (ascending) that can hang on the mesh: a vertex of one of the
    cells looked at (``seen[i]``), an edge midpoint or a face centre
    (:math:`1 \le \mathrm{kind}_i < d`), and every one of its (up to 4) parents
    :math:`p` a node where cells of two levels meet (``jump[p]``):

    .. math::  C = \{ i : s_i \wedge 1 \le k_i < d \wedge
               \forall j < 4:\ P_{ij} < 0 \vee J_{P_{ij}} \}.
"""
from __future__ import annotations

import functools

import numpy as np

from ..backend import backend_of, get_backend

__all__ = ["hanging_candidates", "FUSED", "KERNEL_NAMES"]

#: the fused functions of this module (the census counts a call as one launch)
FUSED = ("hanging_candidates",)

_SPECS = {
    # one thread per forest node; par (nn, stride) row-major, -1 padded; jump by node
    "hanging_candidates": (
        "bool seen, int8 kind, raw P par, raw bool jump, int32 stride, int32 d", "bool ok",
        "bool r = seen && kind >= 1 && kind < d;"
        " for (int j = 0; r && j < 4; ++j) {"
        "   long long p = (long long)par[(long long)i * stride + j];"
        "   if (p >= 0 && !jump[p]) r = false;"
        " }"
        " ok = r;"),
}

KERNEL_NAMES = tuple(f"adaptmg_{n}" for n in _SPECS)


@functools.lru_cache(maxsize=None)
def _kernel(name: str):
    """The CuPy ``ElementwiseKernel`` ``adaptmg_<name>`` (built once)."""
    xp = get_backend("gpu").xp
    ins, outs, op = _SPECS[name]
    return xp.ElementwiseKernel(ins, outs, op, f"adaptmg_{name}")


def _twin(a) -> bool:
    """Whether ``a`` runs the NumPy twin (NumPy arrays and the tests' NumPy-subclass stand-ins)."""
    return isinstance(a, np.ndarray)


def hanging_candidates(seen, kind, par, jump, dim: int):
    """Ascending forest node ids ``i`` with ``seen[i]``, ``1 <= kind[i] < dim`` and each of
    ``par[i, :4]`` negative (padding) or a ``jump`` node (the module's formula).  ``seen``,
    ``jump`` (nn,) bool, ``kind`` (nn,) int8, ``par`` (nn, >= 4) int node parents, the first
    two valid for every edge midpoint / face centre.  One kernel and one ``flatnonzero`` on
    the device; the twin filters step by step (few candidates survive each step)."""
    xp = backend_of(seen).xp
    if not _twin(seen):
        ok = _kernel("hanging_candidates")(seen, kind, par, jump, np.int32(par.shape[1]),
                                           np.int32(dim))
        return xp.flatnonzero(ok)
    cand = xp.flatnonzero(seen)
    k = kind.take(cand)
    cand = cand[(k >= 1) & (k < dim)]
    # first by their first two parents (every candidate has them): flat gathers of two
    # columns instead of the (candidates, 4) parent rows, one flatnonzero for both
    flat_par = par.reshape(-1)
    at = cand * par.shape[1]
    cand = cand.take(xp.flatnonzero(jump.take(flat_par.take(at)) & jump.take(flat_par.take(at + 1))))
    gpar = par[cand, :4]
    valid = gpar >= 0
    return cand.take(xp.flatnonzero((jump[xp.where(valid, gpar, 0)] | ~valid).all(axis=1)))
