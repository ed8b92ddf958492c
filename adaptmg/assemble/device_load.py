r"""Load vectors on the device: :math:`b_{(i,r)} = \sum_T \sum_q w_q \det J_T(\hat x_q)\,
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

__all__ = ["load_on_device", "DEVICE_CHUNK_CELLS"]

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


def load_on_device(be, info, f, xi, w, phi):
    """The load vector of :func:`adaptmg.assemble.load` on the GPU backend ``be`` (a CuPy
    array of length ``num_dofs``); ``info`` is the validated space, ``xi, w`` the quadrature,
    ``phi`` (nq, nloc) the reference values."""
    xp = be.xp
    d, c, nc = info.dim, info.components, info.num_cells
    nq = len(w)
    N, dN = q1_tables(d, xi)
    N, dN, w_d, phi_d = (xp.asarray(a) for a in (N, dN, w, phi))
    pts = xp.asarray(info.points)
    cells = xp.asarray(info.cells)
    dofs = xp.asarray(info.cell_dofs).astype(xp.int64)
    b = xp.zeros(info.num_dofs, dtype=xp.float64)
    comp = xp.arange(c, dtype=xp.int64)
    bad = xp.zeros(nc, dtype=bool)
    for s in range(0, nc, DEVICE_CHUNK_CELLS):
        sl = slice(s, min(s + DEVICE_CHUNK_CELLS, nc))
        X = pts[cells[sl]]                                     # (n, 2^d, d)
        n = X.shape[0]
        J = xp.einsum("cva,qvb->cqab", X, dN)
        detJ = _det(J)
        bad[sl] = ~(detJ > 0).all(axis=1)
        x = xp.einsum("qv,cva->cqa", N, X) if callable(f) else None
        fv = _values(be, f, sl, x, nc, n, nq, c)
        loc = xp.einsum("cqr,qi->cir", fv * (detJ * w_d)[:, :, None], phi_d)   # (n, nloc, c)
        idx = (dofs[sl][:, :, None] * c + comp).reshape(-1)
        b += xp.bincount(idx, weights=loc.reshape(-1), minlength=info.num_dofs)
    if bool(bad.any()):
        raise jacobian_error(bad.get())
    if not bool(xp.isfinite(b).all()):
        raise ValueError("load: f produced non-finite values (NaN or inf) on the device")
    return b
