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

``face_corners``
    The reference coordinates, in the neighbour cell, of the vertices ``v`` of matched faces
    (``estimate/faces.py``): a vertex of the neighbour (row ``W`` of its vertex ids) is its
    corner :math:`\hat c_k`; a hanging node is the mean of its parents' corners,

    .. math::  \hat R = \frac{1}{n_p} \sum_{p \in \mathrm{par}(v)} \hat c_{k(p)},

    and ``ok`` says that each parent is a vertex of the neighbour (exact: sums of 0/1 and one
    division, the same bits on both sides).
"""
from __future__ import annotations

import functools

import numpy as np

from ..backend import backend_of, get_backend

__all__ = ["hanging_candidates", "face_corners", "FUSED", "KERNEL_NAMES"]

#: the fused functions of this module (the census counts a call as one launch)
FUSED = ("hanging_candidates", "face_corners")

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
    # one thread per (face, face vertex): its corner in the neighbour, or its parents' mean
    "face_corners": (
        "V v, raw V W, raw P par, raw F cor, int32 nfv, int32 nv, int32 d", "bool ok, raw float64 R",
        "long long row = i / nfv; int c = -1;"
        " for (int k = 0; k < nv; ++k) if (W[row * nv + k] == v) { c = k; break; }"
        " if (c >= 0) {"
        "   for (int a = 0; a < d; ++a) R[i * d + a] = (double)cor[c * d + a];"
        "   ok = true;"
        " } else {"
        "   double acc[3] = {0.0, 0.0, 0.0}; int cnt = 0, found = 0;"
        "   for (int k = 0; k < 4; ++k) {"
        "     long long p = (long long)par[(long long)v * 4 + k];"
        "     if (p < 0) continue;"
        "     ++cnt;"
        "     for (int q = 0; q < nv; ++q) if ((long long)W[row * nv + q] == p) {"
        "       for (int a = 0; a < d; ++a) acc[a] += (double)cor[q * d + a];"
        "       ++found; break; }"
        "   }"
        "   double den = cnt > 0 ? (double)cnt : 1.0;"
        "   for (int a = 0; a < d; ++a) R[i * d + a] = acc[a] / den;"
        "   ok = found == cnt && cnt > 0;"
        " }"),
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


def face_corners(Vs, W, par, cor, cor_i):
    """``(R, ok)``: ``R`` (n, nfv, d) float64 reference coordinates in the neighbour of the
    face vertices ``Vs`` (n, nfv) node ids, the neighbour's vertex ids ``W`` (n, nv) (distinct
    per row), the hanging parents ``par`` (num_nodes, 4) -1 padded, the corners ``cor``
    (nv, d) float (``cor_i`` the same as integers); ``ok`` (host bool): every vertex is a
    vertex of the neighbour or a hanging node whose parents all are.  One kernel and one
    reduction on the device; the twin runs a loop over the 2^d corners and 4 parent slots."""
    xp = backend_of(Vs).xp
    n, nfv = Vs.shape
    nv, d = cor.shape
    if not _twin(Vs):
        R = xp.empty((n, nfv, d), dtype=np.float64)
        ok = xp.empty((n, nfv), dtype=bool)
        _kernel("face_corners")(Vs, W, par, cor, np.int32(nfv), np.int32(nv), np.int32(d), ok, R)
        return R, bool(ok.all())
    corner = xp.zeros(Vs.shape, dtype=np.intp)
    isd = xp.zeros(Vs.shape, dtype=bool)
    eq = xp.empty(Vs.shape, dtype=bool)
    vals = xp.arange(nv, dtype=np.intp)                            # corner numbers as array scalars
    for v in range(nv):                                            # loop over the 2^d corners only
        xp.equal(Vs, W[:, v, None], out=eq)
        xp.copyto(corner, vals[v], where=eq)
        isd |= eq
    R = cor[corner]                                                # (n, nfv, d)
    # hanging vertices of fine sub-faces: mean of their parents' corners in the neighbour
    h_rows = xp.flatnonzero(~isd.all(1))
    if not h_rows.size:
        return R, True
    P = par[Vs[h_rows]]                                            # (nh, nfv, 4)
    Wh = W[h_rows][:, None, :]
    acc = xp.zeros((h_rows.size, nfv, d))
    cnt_p = (P >= 0).sum(-1)
    found = xp.zeros(P.shape[:2], dtype=np.int64)
    for k in range(P.shape[2]):                                    # 4 parent slots
        hit = (P[:, :, k, None] == Wh) & (P[:, :, k, None] >= 0)
        ok = hit.any(-1)
        acc += ok[..., None] * cor_i[xp.argmax(hit, axis=-1)]
        found += ok
    Rp = acc / xp.maximum(cnt_p, 1)[..., None]
    ok = isd[h_rows] | ((found == cnt_p) & (cnt_p > 0))
    R[h_rows] = xp.where(isd[h_rows][..., None], R[h_rows], Rp)
    return R, bool(ok.all())
