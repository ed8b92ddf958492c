r"""Element matrices and load vectors on the device.

Load vectors: :math:`b_{(i,r)} = \sum_T \sum_q w_q \det J_T(\hat x_q)\,
f_r(x_T(\hat x_q))\,\hat\phi_i(\hat x_q)`.

The same quadrature as the host :func:`adaptmg.assemble.load`, written against the GPU
backend's ``xp``: the vertex coordinates of the cells are gathered on the device, the
Jacobians of the multilinear map are one contraction with the Q1 reference gradients
(:math:`J_{ab} = \sum_v X_{v,a} \partial_b \hat N_v`), a user callable ``f`` is evaluated
once on the device points of a chunk (:func:`adaptmg.backend.call_points`: CuPy arrays),
the element vectors are one contraction with the reference values, and they are summed
into the DoF vector by ``xp.bincount``.  Only the mesh's points and cells and the DoF
table are copied up (they live on the host); nothing of O(cells) comes back.  The sums run
in another order than on the host: results agree to rounding.
"""
from __future__ import annotations

import numpy as np

from ..backend import call_points, is_device_array
from ..fe.geometry import _det, jacobian_error, q1_tables

__all__ = ["load_on_device", "element_entries_on_device", "DEVICE_CHUNK_CELLS"]

#: cells per chunk: the Jacobians of a chunk (cells, nq, d, d) stay below ~0.6 GB in 3-D
DEVICE_CHUNK_CELLS = 1 << 20


def _values(be, f, sl, x, num_cells, n, nq, c):
    """f on the chunk ``sl`` of ``n`` cells as an (n, nq, c) device array: a callable of the
    points ``x`` (n, nq, d), a per-cell array ((num_cells,) or (num_cells, c)) or a constant
    (validated by the host ``load`` before)."""
    xp = be.xp
    tail = (c,) if c > 1 else ()
    if callable(f):
        v = call_points(f, x, xp=xp)
    else:
        a = f if is_device_array(f) else np.asarray(f, dtype=float)
        if a.ndim >= 1 and a.shape[:1] == (num_cells,) and a.ndim == 1 + len(tail):
            v = xp.asarray(a[sl], dtype=float).reshape((n, 1) + tail)
        else:
            v = xp.asarray(a, dtype=float)
    try:
        return xp.broadcast_to(v, (n, nq) + tail).reshape(n, nq, c)
    except ValueError:
        raise ValueError(f"f gave values of shape {tuple(v.shape)}, which do not broadcast to "
                         f"{(n, nq) + tail} (cells, points{', components' if tail else ''})") from None


class _DeviceGeometry:
    """``J`` (n, nq, d, d) and ``detJ`` (n, nq) of a chunk on the device: what the constant-
    coefficient factors of the forms read (see :func:`element_entries_on_device`)."""

    def __init__(self, J, detJ):
        self.J, self.detJ = J, detJ
        self.num_cells = J.shape[0]


def _chunks(be, info, xi):
    """(slice, X (n, 2^d, d), geometry) over chunks of cells, all on the device."""
    xp = be.xp
    N, dN = q1_tables(info.dim, xi)
    dN = xp.asarray(dN)
    pts, cells = xp.asarray(info.points), xp.asarray(info.cells)
    nc = info.num_cells
    bad = xp.zeros(nc, dtype=bool)
    for s in range(0, nc, DEVICE_CHUNK_CELLS):
        sl = slice(s, min(s + DEVICE_CHUNK_CELLS, nc))
        X = pts[cells[sl]]                                     # (n, 2^d, d)
        J = xp.einsum("cva,qvb->cqab", X, dN)
        detJ = _det(J)
        bad[sl] = ~(detJ > 0).all(axis=1)
        yield sl, X, _DeviceGeometry(J, detJ)
    if bool(bad.any()):
        raise jacobian_error(bad.get())


def element_entries_on_device(be, info, xi, w, factor, T_full, out):
    r"""Element matrices :math:`K_c = F_c T` of every cell into the device array ``out``
    (cells * nloc^2, cell-major), the geometric factor ``F = factor(sl, g, w det J)``
    (n, nq, m) computed from the device geometry ``g`` (``J``, ``detJ``) and contracted with
    the reference tensor ``T_full`` (nq * m, nloc^2) in one GEMM per chunk.  Only for
    factors that read nothing but ``g.J``/``g.detJ`` (constant coefficients)."""
    xp = be.xp
    w_d, T_d = xp.asarray(w), xp.asarray(T_full)
    per = T_full.shape[1]
    for sl, _, g in _chunks(be, info, xi):
        F = factor(sl, g, g.detJ * w_d)
        n = g.num_cells
        out[sl.start * per:sl.stop * per] = (F.reshape(n, -1) @ T_d).reshape(-1)
    return out


def load_on_device(be, info, f, xi, w, phi):
    """The load vector of :func:`adaptmg.assemble.load` on the GPU backend ``be`` (a CuPy
    array of length ``num_dofs``); ``info`` is the validated space, ``xi, w`` the quadrature,
    ``phi`` (nq, nloc) the reference values."""
    xp = be.xp
    c, nc = info.components, info.num_cells
    nq = len(w)
    N = xp.asarray(q1_tables(info.dim, xi)[0])
    w_d, phi_d = xp.asarray(w), xp.asarray(phi)
    dofs = xp.asarray(info.cell_dofs).astype(xp.int64)
    b = xp.zeros(info.num_dofs, dtype=xp.float64)
    comp = xp.arange(c, dtype=xp.int64)
    for sl, X, g in _chunks(be, info, xi):
        n = g.num_cells
        x = xp.einsum("qv,cva->cqa", N, X) if callable(f) else None
        fv = _values(be, f, sl, x, nc, n, nq, c)
        loc = xp.einsum("cqr,qi->cir", fv * (g.detJ * w_d)[:, :, None], phi_d)   # (n, nloc, c)
        idx = (dofs[sl][:, :, None] * c + comp).reshape(-1)
        b += xp.bincount(idx, weights=loc.reshape(-1), minlength=info.num_dofs)
    if not bool(xp.isfinite(b).all()):
        raise ValueError("load: f produced non-finite values (NaN or inf) on the device")
    return b
