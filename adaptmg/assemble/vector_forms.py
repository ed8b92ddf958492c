r"""Vector-valued and first-order forms: the derivative matrices :math:`C_k` (seed 001
§5.3) and linear elasticity, assembled with the machinery of :mod:`.forms` (validated
space, coefficients, chunked geometry, the memoised sparsity patterns, on the host or
with the pattern and sums on the device).
"""
from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from ..backend import csr_from_arrays, to_host
from ..fe.csr_ops import expand_node_blocks
from ..fe.geometry import matmul_serial
from ._device import get_device_pattern
from .forms import _SpaceInfo, _assembly_device, _coefficient, _keep_backend, _ref_tables, _square_pattern
from .on_device import elastic_factor

__all__ = ["derivative_matrices", "elasticity"]


def derivative_matrices(space, *, quad_points=None):
    r"""The matrices :math:`C_k` of seed 001 §5.3, one per coordinate direction k < dim.

    Index convention: :math:`(C_k)_{ij} = (\phi_j, \partial_k\phi_i)`, i.e. row i
    carries the *differentiated* (test) function and column j the undifferentiated
    one. Hence for nodal values v of a function :math:`v_h`,
    :math:`(C_k v)_i = (v_h, \partial_k\phi_i)`, which is what the interpolated
    convection :math:`-(\mathcal I_h(u\otimes u), \nabla\chi)` needs (eq. 15).
    Note :math:`C_k^T` is the convection matrix of :math:`b = e_k`.

    Built on the scalar node numbering: each C_k is (num_nodes x num_nodes)
    regardless of ``space.components``. Returns a list [C_0, ..., C_{d-1}]: SciPy CSR, or
    cupyx CSR on a mesh on the GPU (element matrices, pattern and sums there:
    :func:`_device_derivatives`).
    """
    info = _SpaceInfo(space)
    xi, w = info.quadrature(quad_points)
    phi, dphi = _ref_tables(info, xi)
    nq, nloc, d = dphi.shape
    L = nloc * nloc
    Tq = np.einsum("qie,qj->qeij", dphi, phi).reshape(nq, d, L)
    T_full = np.ascontiguousarray(Tq.reshape(nq * d, L))
    if info.device is not None:
        return _device_derivatives(info, xi, w, T_full)
    T_aff = np.tensordot(w, Tq, axes=1)                   # (d, L)
    pat = _square_pattern(info)
    data = [pat.new_data() for _ in range(d)]
    step = info.chunk_size(xi, L)
    fbuf = np.empty((step, nq * d))
    kbuf = np.empty((step, L))
    for sl, g in info.chunks(xi, L, affine=True):
        n = g.num_cells
        wdet = g.detJ if g.affine else g.detJ * w
        T = T_aff if g.affine else T_full
        F = fbuf[:n, :g.num_points * d].reshape(n, g.num_points, d)
        for k in range(d):
            np.multiply(g.invJ[..., k], wdet[:, :, None], out=F)     # F[c, q, e] = w det J invJ[e, k]
            K = matmul_serial(F.reshape(n, -1), T, out=kbuf[:n])
            pat.add(data[k], sl, K)
    return [pat.csr(data[k]) for k in range(d)]


def _device_derivatives(info, xi, w, T_full):
    r"""The :math:`C_k` of :func:`derivative_matrices` for a mesh on the GPU, as cupyx CSR: per
    direction k the factor :math:`F_{c,q,e} = w_q \det J\,(J^{-1})_{ek}` of every cell on the
    device (:func:`~.on_device.element_chunks`, the full rule on every cell), summed chunk by
    chunk on the device pattern."""
    from .on_device import device_element_sums
    be = info.device
    pat = get_device_pattern(be, info.cell_dofs, info.cell_dofs, info.num_nodes, info.num_nodes)
    out = []
    for k in range(info.dim):
        data, _ = device_element_sums(be, pat, info, xi, w, lambda sl, g, wdet: g.invJ[..., k] * wdet[:, :, None],
                                       T_full, None)
        out.append(pat.device_csr(data))
    return out


def elasticity(space, lam, mu, *, quad_points=None, format="csr", return_mass=False, device=None,
               keep_on_device=False):
    r"""Linear elasticity matrix :math:`A_{(i,r),(j,s)} = (\sigma(\phi_j e_s), \varepsilon(\phi_i e_r))`.

    :math:`\sigma(u) = 2\mu\varepsilon(u) + \lambda\,\mathrm{div}\,u\,I`,
    :math:`\varepsilon(u) = (\nabla u + \nabla u^T)/2`. With physical gradients
    :math:`g_i = \nabla\phi_i`,

    .. math:: A_{(i,r),(j,s)} = \int \mu\,\delta_{rs}\, g_i\cdot g_j + \mu\, g_{i,s} g_{j,r}
              + \lambda\, g_{i,r} g_{j,s} \,dx .

    Requires ``space.components == dim``; DoF (node i, component r) is i*dim + r.
    ``lam``, ``mu``: constants, per-cell arrays or callables (as ``coef``).
    The rigid-body motions (translations, infinitesimal rotations) are in its kernel.
    ``format="bsr"`` returns the summed dim x dim node blocks as SciPy BSR on the scalar
    node pattern (the same pattern as :func:`mass` of the scalar space), without the
    conversion to CSR.  ``return_mass=True`` returns ``(A, Ms)`` with ``Ms`` the *scalar*
    mass matrix :math:`(\phi_j, \phi_i)` (num_nodes x num_nodes CSR on the same node pattern,
    equal to :func:`mass` of the scalar space up to rounding) from the same pass: one more
    product per chunk instead of a second geometry evaluation and scatter.
    ``format="fields"`` returns ``(indptr, indices, data)``: the scalar node pattern (shared
    with the memoised pattern: do not modify) and data (nnz, d*d) with the block entry (r, s)
    in column r*d + s, or with ``return_mass=True`` data (nnz, 1 + d*d) with the scalar mass
    in column 0 and the block entries in the columns 1 + r*d + s (one array, e.g. the fields of
    a :class:`~adaptmg.fe.csr_ops.NodeBlockMatrix`, without stacking afterwards).

    ``device`` (``"gpu"`` or a GPU Backend; as for :func:`scalar_form`): everything of O(cells)
    runs on the GPU -- the pattern (:class:`~adaptmg.assemble._device.DevicePattern`), the
    geometry and the element matrices (:func:`~adaptmg.assemble.on_device.elasticity_entries`:
    the full quadrature rule on every cell, one GEMM per chunk) and their sums; only the
    summed fields come down (equal to the host result to rounding: other products and
    summation order).  ``keep_on_device=True`` (with a GPU device) keeps the result there,
    nothing of O(n) copied down: with ``format="fields"`` the device arrays ``(d_indptr,
    d_indices, data)``; with ``format="csr"`` a cupyx CSR matrix (canonical; ``return_mass``:
    ``(A, Ms)``, both cupyx), the fields expanded on the device as the node-block matrix
    :math:`\sum_{r,s} A_{rs} \otimes e_r e_s^T` (:func:`~adaptmg.fe.csr_ops.expand_node_blocks`:
    the same pattern and values as the host CSR, explicit zeros included), so that
    :func:`adaptmg.multigrid` on the GPU -- which passes ``device`` and ``keep_on_device`` to a
    callable that takes them, e.g. ``functools.partial(elasticity, lam=.., mu=..)`` --
    constrains every level there.  ``format="bsr"`` cannot be kept (cupyx has no BSR matrix).
    Meshes with fewer than ``MIN_DEVICE_ENTRIES`` element entries stay on the host (then a
    kept result is the host one moved up).
    """
    if format not in ("csr", "bsr", "fields"):
        raise ValueError(f"elasticity: format must be 'csr', 'bsr' or 'fields', got {format!r}")
    if keep_on_device and format == "bsr":
        raise ValueError("elasticity: keep_on_device=True takes format='csr' or 'fields', got 'bsr' "
                         "(cupyx has no BSR matrix)")
    info = _SpaceInfo(space)
    if info.device is not None and format == "bsr":
        raise ValueError("elasticity: the mesh lives on the GPU and cupyx has no BSR matrix: take "
                         "format='csr' or 'fields', or use mesh.to('cpu')")
    keep = _keep_backend("elasticity", device, keep_on_device, info)     # a device mesh: its backend
    d = info.dim
    if info.components != d:
        raise ValueError(f"elasticity needs space.components == dim == {d}, got {info.components}")
    xi, w = info.quadrature(quad_points)
    ev_l, const_l = _coefficient("lam", lam, info.num_cells, d)
    ev_m, const_m = _coefficient("mu", mu, info.num_cells, d)
    if not callable(mu) and np.any(np.asarray(mu) <= 0):
        raise ValueError(f"elasticity: the shear modulus mu must be positive, got min {np.min(mu)!r}")
    if not callable(lam) and not callable(mu) and np.any(np.asarray(lam) + 2.0 * np.asarray(mu) / d <= 0):
        raise ValueError(f"elasticity: lam + 2 mu / {d} (bulk modulus) must be positive, "
                         f"got lam={np.min(lam)!r}, mu={np.min(mu)!r}")
    phi, dphi = _ref_tables(info, xi)
    nq, nloc, _ = dphi.shape
    L = nloc * nloc
    # E_{a a2}[c, i, j] = sum_q w det J g_i[a] g_j[a2] = F_{a a2}[c, (q, b, e)] T[(q, b, e), (i, j)]
    # with F_{a a2}[c, q, b, e] = w det J invJ[b, a] invJ[e, a2],  T = dphi_i[b] dphi_j[e].
    # The block field A_rs = lam E_rs + mu E_sr + mu delta_rs sum_a E_aa is linear in F, so it is
    # one product of the combined factor G_rs = lam F_rs + mu F_sr + ... (formed on the small
    # (cells, points, d, d) factors, no (cells, L) temporaries; on_device.elastic_factor); the
    # d*d fields and the scalar mass are summed in entry order by FieldSums (two adjacent block
    # columns per complex add.at) on the host, by the device pattern's row sums there.
    Tq = np.einsum("qib,qje->qbeij", dphi, dphi).reshape(nq, d * d, L)
    T_full = np.ascontiguousarray(Tq.reshape(nq * d * d, L))
    Tm_full = np.ascontiguousarray((phi[:, :, None] * phi[:, None, :]).reshape(nq, L)) if return_mass else None
    moff = 1 if return_mass else 0               # element fields: [mass,] then the blocks
    nfld = d * d + moff
    dev = _assembly_device(device, info, L * d * d)
    if dev is not None:
        pat = get_device_pattern(dev, info.cell_dofs, info.cell_dofs, info.num_nodes, info.num_nodes)
        fdata = _device_fields(dev, pat, info, xi, w, lam, mu, T_full, Tm_full, nfld)
        if keep is not None:
            return _kept_result(keep, pat.d_indptr, pat.d_indices, fdata, format, return_mass, info)
        fdata = to_host(fdata)
    else:
        pat = _square_pattern(info)
        fdata = np.zeros((pat.nnz, nfld))
        _host_fields(info, pat, xi, w, Tq, T_full, Tm_full, (ev_l, const_l, lam), (ev_m, const_m, mu), fdata)
        if keep is not None:
            return _kept_result(keep, *(keep.asarray(a) for a in (pat.indptr, pat.indices, fdata)),
                                format, return_mass, info)
    if format == "fields":
        return pat.indptr, pat.indices, fdata
    blocks = np.ascontiguousarray(fdata[:, moff:])   # (nnz, d*d): the BSR data
    Ms = pat.csr(np.ascontiguousarray(fdata[:, 0])) if return_mass else None
    if format == "bsr":
        B = sp.bsr_matrix((blocks.reshape(-1, d, d), pat.indices, pat.indptr),
                          shape=(pat.shape[0] * d, pat.shape[1] * d))
        B.has_sorted_indices = True
        return (B, Ms) if return_mass else B
    A = pat.block_csr(blocks, d, d)
    return (A, Ms) if return_mass else A


def _kept_result(be, indptr, indices, fdata, format, return_mass, info):
    r"""The ``keep_on_device`` result of :func:`elasticity` from the summed fields on the device
    ``be`` (the scalar node pattern ``(indptr, indices)``, ``fdata`` (nnz, [1 +] d*d)): the
    fields themselves, or the cupyx CSR of :math:`\sum_{r,s} A_{rs} \otimes E_{rs}`
    (:math:`E_{rs} = e_r e_s^T`) expanded there -- each node block's d x d entries in its
    rows' column order, the host ``format="csr"`` pattern -- and with ``return_mass`` the
    scalar mass CSR on the node pattern."""
    if format == "fields":
        return indptr, indices, fdata
    d, n = info.dim, info.num_nodes
    moff = fdata.shape[1] - d * d
    unit = np.eye(d * d).reshape(d * d, d, d)               # field r*d + s -> block entry (r, s)
    A = expand_node_blocks(be, indptr, indices, fdata[:, moff:], unit, n)
    A.has_canonical_format = True                            # sorted node columns, sorted blocks
    if not return_mass:
        return A
    M = csr_from_arrays(be.sparse, be.xp.ascontiguousarray(fdata[:, 0]), indices.copy(), indptr.copy(), (n, n))
    M.has_canonical_format = True
    return A, M


def _device_fields(dev, pat, info, xi, w, lam, mu, T_full, Tm_full, nfld):
    """The summed fields (nnz, nfld) on the device: the element matrices there
    (:func:`~.on_device.elasticity_entries`) window by window of cells -- a whole number of
    its chunks, at most :data:`._device.ASSEMBLY_CHUNK_BYTES` of entries -- each added into all
    fields by one row-walk sum (:meth:`~._device.DevicePattern.add`)."""
    from ._device import chunk_cells
    from .on_device import elastic_step, elasticity_entries
    xp = dev.xp
    L, nc = T_full.shape[1], info.num_cells
    step = elastic_step(info, len(w), L, Tm_full is not None)
    span = step * max(1, chunk_cells(nfld * L) // step)         # same chunks as one sweep
    K = xp.empty((nfld, min(span, nc) * L))
    fdata = xp.zeros((pat.nnz, nfld))
    for a in range(0, nc, span):                 # loop over windows of cells
        b = min(a + span, nc)
        Kw = K[:, :(b - a) * L]
        elasticity_entries(dev, info, xi, w, lam, mu, T_full, Tm_full, Kw, window=slice(a, b))
        pat.add(fdata, a, Kw)
    return fdata


def _host_fields(info, pat, xi, w, Tq, T_full, Tm_full, lam, mu, fdata):
    """The summed fields into the host ``fdata`` (nnz, nfld): chunked host geometry (the affine
    one-point path where the coefficients allow), the combined factor, one product per chunk
    (single-threaded BLAS blocks), summed in entry order by FieldSums.  ``lam``/``mu``:
    (evaluator, constant?, the argument) of ``_coefficient``."""
    from ..fe.sparsity import FieldSums
    (ev_l, const_l, lam_a), (ev_m, const_m, mu_a) = lam, mu
    d = info.dim
    nq, nk, L = Tq.shape
    nfld = fdata.shape[1]
    moff = nfld - nk
    T_aff = np.tensordot(w, Tq, axes=1)
    both_const = const_l and const_m
    lam_c = float(np.asarray(lam_a)) if both_const else None
    mu_c = float(np.asarray(mu_a)) if both_const else None
    if moff:
        Tm_aff = (w @ Tm_full)[None, :]
    step = info.chunk_size(xi, L * d * d)
    sums = FieldSums(pat, [(fdata, k) for k in range(nfld)], step)
    gsz = d * d * step * nq * d * d
    gbuf = np.empty(3 * gsz + d * step * nq * d)
    kbuf = np.empty(nfld * step * L)
    affine_ok = not (callable(lam_a) or callable(mu_a))
    for sl, g in info.chunks(xi, L * d * d, affine=affine_ok):
        n, nqg = g.num_cells, g.num_points
        wdet = g.detJ if g.affine else g.detJ * w
        T = T_aff if g.affine else T_full
        fsz = d * d * n * nqg * d * d
        V = gbuf[3 * gsz:3 * gsz + d * n * nqg * d].reshape(d, n, nqg, d)
        np.copyto(V, g.invJ.transpose(3, 0, 1, 2))
        if both_const:
            wl = (wdet * lam_c)[:, :, None, None]
            wm = (wdet * mu_c)[:, :, None, None]
        else:
            wl = (wdet * ev_l(sl, g))[:, :, None, None]
            wm = (wdet * ev_m(sl, g))[:, :, None, None]
        G = elastic_factor(np, V, wl, wm, *(gbuf[k * gsz:k * gsz + fsz].reshape(d, d, n, nqg, d, d)
                                            for k in range(3)))
        K = kbuf[:nfld * n * L].reshape(nfld, n, L)
        matmul_serial(G.reshape(nk * n, -1), T, out=K[moff:].reshape(nk * n, L))   # fields (r, s) row-major
        if moff:
            matmul_serial(np.ascontiguousarray(wdet), Tm_aff if g.affine else Tm_full, out=K[0])
        sums.add(sl, K)
