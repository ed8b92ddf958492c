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

Scalar forms (:func:`element_chunks`): the element matrices
:math:`K_c = \sum_q F_{c,q,:} T_{q,:,:}` of a geometric factor computed from the device
geometry (and the coefficients at the device points, :mod:`._coefficients`).  Lumped mass
(:func:`lumped_mass_on_device`): the per-cell masses of :func:`lumped_local` summed into the
nodes by ``xp.bincount``.

Elasticity element matrices (:func:`elasticity_entries`): with :math:`V = J^{-1}` at a
point and :math:`X_{af} = V_{:,a} V_{:,f}^T` (the outer products of its columns),

.. math:: K^{rs}_{ij} = \sum_q w_q \det J_q \sum_{b,e} G^{rs}_{q,be}\,
          \partial_b\hat\phi_i \partial_e\hat\phi_j, \qquad
          G^{rs} = \lambda X_{rs} + \mu X_{sr} + \delta_{rs}\,\mu \sum_a X_{aa}

(:func:`elastic_factor`, shared with the host path), i.e. one GEMM of the combined factor
(fields x cells, points x d x d) with the reference table per chunk of cells, on the
backend's arrays.
"""
from __future__ import annotations

import numpy as np

from ..backend import backend_of, call_points, constant, is_device_array, to_host
from ..device.deferred import check_later
from ..fe.geometry import _det, _det_inv, jacobian_error, q1_tables
from ._device import chunk_cells

__all__ = ["load_on_device", "lumped_mass_on_device", "lumped_local", "element_entries_on_device", "element_chunks",
           "device_element_sums",
           "elasticity_entries", "elastic_step", "elastic_factor",
           "DEVICE_CHUNK_CELLS"]

#: cells per chunk: the Jacobians of a chunk (cells, nq, d, d) stay below ~0.6 GB in 3-D
DEVICE_CHUNK_CELLS = 1 << 20
#: bytes of the temporaries of one chunk of :func:`elasticity_entries` (factors, products)
ELASTIC_CHUNK_BYTES = 1 << 29


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
    """``J`` (n, nq, d, d), ``detJ`` (n, nq) and, computed on first access, ``invJ`` and the
    physical points ``x`` (n, nq, d) of a chunk on the device (``X`` its cells' vertices, ``N``
    the Q1 values at the quadrature points): what the factors and coefficients of the forms
    read (see :func:`element_chunks`); ``num_cells``, ``num_points``, ``dim`` as
    :class:`~adaptmg.fe.geometry.CellGeometry`'s."""

    def __init__(self, J, detJ, X=None, N=None):
        self.J, self.detJ = J, detJ
        self.num_cells, self.num_points, self.dim = J.shape[0], J.shape[1], J.shape[-1]
        self._invJ = None
        self._X, self._N, self._x = X, N, None

    @property
    def x(self):
        if self._x is None:
            self._x = backend_of(self.detJ).xp.einsum("qv,cva->cqa", self._N, self._X)
        return self._x

    @property
    def invJ(self):
        if self._invJ is None:
            self._invJ = _det_inv(self.J)[1]
        return self._invJ


def _chunks(be, info, xi, step=None, window=None):
    """(slice, X (n, 2^d, d), geometry) over chunks of ``step`` cells of the cells ``window``
    (a slice; default all), all on the backend ``be`` (ValueError after the sweep for cells
    with det J <= 0; inside :func:`adaptmg.device.deferred.deferred_checks` at its end)."""
    xp = be.xp
    step = DEVICE_CHUNK_CELLS if step is None else step
    N, dN = q1_tables(info.dim, xi)
    N, dN = constant(N, xp), constant(dN, xp)
    pts, cells = xp.asarray(info.points), xp.asarray(info.cells)
    a, nc = (0, info.num_cells) if window is None else (window.start, window.stop)
    bad = xp.zeros(info.num_cells, dtype=bool)
    for s in range(a, nc, step):
        sl = slice(s, min(s + step, nc))
        X = pts[cells[sl]]                                     # (n, 2^d, d)
        J = xp.einsum("cva,qvb->cqab", X, dN)
        detJ = _det(J)
        bad[sl] = ~(detJ > 0).all(axis=1)
        yield sl, X, _DeviceGeometry(J, detJ, X, N)
        del X, J, detJ                  # not alive beside the next chunk's
    check_later(bad.any(), lambda: jacobian_error(to_host(bad)))     # (adaptmg.device.deferred)


def element_chunks(be, info, xi, w, factor, T_full, extra=None, step=None):
    r"""``(sl, K, K_e)`` over chunks of at most ``step`` (default :data:`DEVICE_CHUNK_CELLS`)
    cells: the element matrices
    :math:`K_c = F_c T` (n, nloc^2) of the chunk ``sl``, the geometric factor
    ``F = factor(sl, g, w det J)`` (n, nq, m) computed from the device geometry ``g`` (``J``,
    ``detJ``, ``invJ``) and contracted with the reference tensor ``T_full`` (nq * m, nloc^2)
    in one GEMM.  The factor reads the geometry and, for coefficients that are not
    constants, the points ``g.x`` (callables, :mod:`._coefficients`) or the chunk ``sl``
    (per-cell and per-node arrays), all on the device.

    ``extra = (cols, Te_full)``: ``K_e`` the element matrices of a part of the form, the
    factor columns ``cols`` (a slice of the m axis) against ``Te_full`` (nq * m_e, nloc^2)
    (e.g. the mass term of :func:`~adaptmg.assemble.scalar_form`'s ``return_mass``), from
    the same factor; else ``K_e`` is None.  Only one chunk's matrices are alive at a time
    when the caller sums them before the next (:meth:`._device.DevicePattern.add`)."""
    xp = be.xp
    w_d, T_d = constant(w, xp), constant(T_full, xp)
    if extra is not None:
        cols, Te_d = extra[0], xp.asarray(extra[1])
    for sl, X, g in _chunks(be, info, xi, step):
        F = factor(sl, g, g.detJ * w_d)
        n = g.num_cells
        K = F.reshape(n, -1) @ T_d
        Ke = None if extra is None else xp.ascontiguousarray(F[:, :, cols]).reshape(n, -1) @ Te_d
        del F
        yield sl, K, Ke
        del X, g, K, Ke                 # one chunk's geometry and matrices alive at a time


def device_element_sums(device, pat, info, xi, w, factor, T_full, extra, elements=None):
    """``(data, data_e)``: the element matrices computed on the device chunk by chunk
    (:func:`element_chunks`, at most :data:`._device.ASSEMBLY_CHUNK_BYTES` of them at
    once) and summed on the device pattern ``pat`` in ascending cell order (the same bits as
    one sum of all of them); ``data_e`` those of ``extra = (cols, Te_full)`` or None.
    ``elements(device, info, xi, w, T_full, step)``: another source of the same chunks
    (:func:`.q1_stiffness.stiffness_chunks`), in place of ``factor``'s."""
    per = T_full.shape[1] * (1 if extra is None else 2)
    step = min(DEVICE_CHUNK_CELLS, chunk_cells(per))
    data = pat.zeros()
    data_e = None if extra is None else pat.zeros()
    chunks = (element_chunks(device, info, xi, w, factor, T_full, extra, step) if elements is None
              else elements(device, info, xi, w, T_full, step))
    for sl, K, Ke in chunks:
        pat.add(data, sl.start, K)
        if Ke is not None:
            pat.add(data_e, sl.start, Ke)
        del K, Ke
    return data, data_e


def element_entries_on_device(be, info, xi, w, factor, T_full, out, extra=None):
    r"""Element matrices of every cell (:func:`element_chunks`) into the device array ``out``
    (cells * nloc^2, cell-major); ``extra = (cols, Te_full, out_e)`` those of a part of the
    form into ``out_e``."""
    per = T_full.shape[1]
    ext = None if extra is None else extra[:2]
    for sl, K, Ke in element_chunks(be, info, xi, w, factor, T_full, ext):
        lo, hi = sl.start * per, sl.stop * per
        out[lo:hi] = K.reshape(-1)
        if Ke is not None:
            extra[2][lo:hi] = Ke.reshape(-1)
    return out


def elastic_factor(xp, V, wl, wm, X, G, tmp):
    r"""The combined elasticity factor of the module docstring, in place on ``xp`` arrays.

    ``V`` (d, n, nq, d): :math:`V_{a,c,q,b} = (J^{-1}_{c,q})_{ba}` (column a of the inverse
    Jacobian); ``wl``, ``wm`` (n, nq, 1, 1): :math:`w_q \det J\,\lambda` and
    :math:`w_q \det J\,\mu`; ``X``, ``G``, ``tmp`` (d, d, n, nq, d, d) outputs/scratch.
    Returns ``G`` with :math:`G_{rs} = w\lambda X_{rs} + w\mu (X_{sr} + \delta_{rs}\sum_a X_{aa})`,
    :math:`X_{af}[c, q, b, e] = V_{a,c,q,b} V_{f,c,q,e}`: the fields (r, s) row-major, each
    (cells, points x d x d) against the reference table :math:`\partial_b\hat\phi_i\,\partial_e\hat\phi_j`.
    """
    d = V.shape[0]
    xp.multiply(V[:, None, :, :, :, None], V[None, :, :, :, None, :], out=X)
    xp.multiply(X, wl, out=G)
    xp.multiply(X.swapaxes(0, 1), wm, out=tmp)
    G += tmp
    tr = X[0, 0].copy()
    for a in range(1, d):                      # loops over components only
        tr += X[a, a]
    tr *= wm
    for r in range(d):
        G[r, r] += tr
    return G


def _coefficient_on(be, name, coef, num_cells):
    """``(ev, needs_x)``: ``ev(sl, x)`` the coefficient on the chunk ``sl`` as a float or an
    array broadcastable to (n, nq) on the backend, ``x`` (n, nq, d) the chunk's points (only
    computed when ``needs_x``).  Constants and per-cell arrays were validated by the host's
    ``_coefficient``; a callable's values are checked here (shape, finite)."""
    xp = be.xp
    if callable(coef):
        def ev(sl, x):
            v = call_points(coef, x, xp=xp)
            if v.shape != x.shape[:2]:
                raise ValueError(f"{name}(x) must return shape (...) for points x of shape "
                                 f"{tuple(x.shape)}, i.e. {tuple(x.shape[:2])}; got {tuple(v.shape)}")
            if not bool(xp.isfinite(v).all()):
                raise ValueError(f"{name}(x) contains non-finite values (NaN or inf); shape {tuple(v.shape)}")
            return v
        return ev, True
    a = coef if is_device_array(coef) else np.asarray(coef, dtype=np.float64)
    if a.ndim == 0:
        val = float(a)
        return (lambda sl, x: val), False
    a_d = be.asarray(a, dtype=np.float64).reshape(num_cells)
    return (lambda sl, x: a_d[sl][:, None]), False


def elastic_step(info, nq, L, mass):
    """Cells per chunk of :func:`elasticity_entries` (temporaries within ELASTIC_CHUNK_BYTES)."""
    d = info.dim
    nk = d * d
    per_cell = 8 * (3 * nk * nq * d * d + (nk + int(mass)) * L + 4 * nq * d * d)
    return int(max(1, min(DEVICE_CHUNK_CELLS, ELASTIC_CHUNK_BYTES // per_cell)))


def elasticity_entries(be, info, xi, w, lam, mu, T_full, Tm_full, out, window=None):
    r"""Element matrices of :func:`adaptmg.assemble.elasticity` for every cell (or the cells
    ``window``, a slice), on the backend ``be`` (NumPy or CuPy), into ``out`` (nfields,
    cells * nloc^2): row 0 the scalar mass
    :math:`\sum_q w_q \det J\,\hat\phi_i\hat\phi_j` when ``Tm_full`` (nq, nloc^2) is
    given, then the block fields (r, s) row-major, cell-major entries (c, i, j) in each row.

    Per chunk of cells: the vertices gathered, J, det J and :math:`J^{-1}` at every quadrature
    point (full rule on every cell), the coefficients (constants, per-cell arrays, callables
    of the points), :func:`elastic_factor`, and one GEMM (d^2 n, nq d^2) @ ``T_full``
    (nq d^2, nloc^2).  Nothing of O(cells) moves between host and device but the mesh's
    points and cells (and per-cell coefficients) going up.
    """
    xp = be.xp
    d, nq = info.dim, len(w)
    nk, L = d * d, T_full.shape[1]
    moff = 0 if Tm_full is None else 1
    w_d, T_d = constant(w, xp), constant(T_full, xp)
    Tm_d = None if Tm_full is None else xp.asarray(Tm_full)
    ev_l, x_l = _coefficient_on(be, "lam", lam, info.num_cells)
    ev_m, x_m = _coefficient_on(be, "mu", mu, info.num_cells)
    step = elastic_step(info, nq, L, moff)
    first = 0 if window is None else window.start
    for sl, _, g in _chunks(be, info, xi, step, window):
        n = g.num_cells
        wdet = g.detJ * w_d                                        # (n, nq)
        V = xp.ascontiguousarray(_det_inv(g.J)[1].transpose(3, 0, 1, 2))
        x = g.x if (x_l or x_m) else None
        wl = (wdet * ev_l(sl, x))[:, :, None, None]
        wm = (wdet * ev_m(sl, x))[:, :, None, None]
        shape = (d, d, n, nq, d, d)
        G = elastic_factor(xp, V, wl, wm, xp.empty(shape), xp.empty(shape), xp.empty(shape))
        lo, hi = (sl.start - first) * L, (sl.stop - first) * L
        out[moff:, lo:hi] = (G.reshape(nk * n, nq * d * d) @ T_d).reshape(nk, n * L)
        if moff:
            out[0, lo:hi] = (wdet @ Tm_d).reshape(-1)
    return out


def lumped_local(wdet, phi, method):
    r"""Per-cell lumped masses (n, nloc) from ``wdet`` (n, nq) = :math:`w_q \det J` and ``phi``
    (nq, nloc), host or device arrays: row sums :math:`m^T_i = \sum_q w_q \det J\,\hat\phi_i`
    (``"rowsum"``) or the HRZ scaling :math:`m^T_i = M^T_{ii}\,|T| / \sum_l M^T_{ll}` (``"hrz"``)
    of :func:`adaptmg.assemble.lumped_mass`."""
    if method == "rowsum":
        return wdet @ phi
    diag = wdet @ (phi * phi)
    return diag * (wdet.sum(1) / diag.sum(1))[:, None]


def lumped_mass_on_device(be, info, xi, w, phi, method):
    """The diagonal of :func:`adaptmg.assemble.lumped_mass` for a mesh on the GPU backend ``be``
    (a CuPy array of length ``num_dofs``): :func:`lumped_local` of every chunk on the device,
    summed into the nodes by ``xp.bincount`` (sums in another order than the host's: equal to
    rounding)."""
    xp = be.xp
    w_d, phi_d = constant(w, xp), constant(phi, xp)
    dofs = xp.asarray(info.cell_dofs).astype(xp.int64)
    m = xp.zeros(info.num_nodes, dtype=xp.float64)
    for sl, _, g in _chunks(be, info, xi):
        loc = lumped_local(g.detJ * w_d, phi_d, method)
        m += xp.bincount(dofs[sl].reshape(-1), weights=loc.reshape(-1), minlength=info.num_nodes)
    return xp.repeat(m, info.components) if info.components > 1 else m


def load_on_device(be, info, f, xi, w, phi):
    """The load vector of :func:`adaptmg.assemble.load` on the GPU backend ``be`` (a CuPy
    array of length ``num_dofs``); ``info`` is the validated space, ``xi, w`` the quadrature,
    ``phi`` (nq, nloc) the reference values."""
    xp = be.xp
    c, nc = info.components, info.num_cells
    nq = len(w)
    N = constant(q1_tables(info.dim, xi)[0], xp)
    w_d, phi_d = constant(w, xp), constant(phi, xp)
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
