r"""Vector-valued and first-order forms: the derivative matrices :math:`C_k` (seed 001
§5.3) and linear elasticity, assembled with the machinery of :mod:`.forms` (validated
space, coefficients, chunked geometry, the memoised sparsity patterns, on the host or
with the pattern and sums on the device).
"""
from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from ..fe.geometry import matmul_serial
from ._device import DeviceFieldSums, get_device_pattern
from .forms import _SpaceInfo, _assembly_device, _coefficient, _ref_tables, _square_pattern

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
    regardless of ``space.components``. Returns a list [C_0, ..., C_{d-1}].
    """
    info = _SpaceInfo(space)
    xi, w = info.quadrature(quad_points)
    phi, dphi = _ref_tables(info, xi)
    nq, nloc, d = dphi.shape
    L = nloc * nloc
    Tq = np.einsum("qie,qj->qeij", dphi, phi).reshape(nq, d, L)
    T_full = np.ascontiguousarray(Tq.reshape(nq * d, L))
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


def elasticity(space, lam, mu, *, quad_points=None, format="csr", return_mass=False, device=None):
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
    ``device`` (``"gpu"`` or a GPU Backend; as for :func:`scalar_form`): the pattern is built
    and the fields are summed on the GPU (:class:`~adaptmg.assemble._device.DeviceFieldSums`:
    the element entries are copied up chunk by chunk, the sums down once); the element
    matrices are computed on the host as before and the result is the same, bit for bit.
    """
    if format not in ("csr", "bsr", "fields"):
        raise ValueError(f"elasticity: format must be 'csr', 'bsr' or 'fields', got {format!r}")
    info = _SpaceInfo(space)
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
    _, dphi = _ref_tables(info, xi)
    nq, nloc, _ = dphi.shape
    L = nloc * nloc
    # E_{a a2}[c, i, j] = sum_q w det J g_i[a] g_j[a2] = F_{a a2}[c, (q, b, e)] T[(q, b, e), (i, j)]
    # with F_{a a2}[c, q, b, e] = w det J invJ[b, a] invJ[e, a2],  T = dphi_i[b] dphi_j[e].
    # The block field A_rs = lam E_rs + mu E_sr + mu delta_rs sum_a E_aa is linear in F, so it is
    # one product of the combined factor G_rs = lam F_rs + mu F_sr + ... (formed on the small
    # (cells, points, d, d) factors, no (cells, L) temporaries); the d*d fields and the scalar
    # mass are summed in entry order by FieldSums (two adjacent block columns per complex add.at).
    Tq = np.einsum("qib,qje->qbeij", dphi, dphi).reshape(nq, d * d, L)
    T_full = np.ascontiguousarray(Tq.reshape(nq * d * d, L))
    T_aff = np.tensordot(w, Tq, axes=1)
    both_const = const_l and const_m
    lam_c = float(np.asarray(lam)) if both_const else None
    mu_c = float(np.asarray(mu)) if both_const else None
    dev = _assembly_device(device, info, L)
    if dev is not None:
        pat = get_device_pattern(dev, info.cell_dofs, info.cell_dofs, info.num_nodes, info.num_nodes)
    else:
        pat = _square_pattern(info)
    fields = [(r, s_) for r in range(d) for s_ in range(d)]    # in the column order of the block data
    nk = len(fields)
    moff = 1 if return_mass else 0               # element fields: [mass,] then the blocks
    nfld = nk + moff
    if format == "fields":                       # one (nnz, [1 +] d*d) array; adjacent columns pair up
        fdata = np.zeros((pat.nnz, nfld))
        targets = [(fdata, k) for k in range(nfld)]
    else:
        blocks = np.zeros((pat.nnz, d * d))      # (nnz, d*d): the BSR data, no stacking afterwards
        targets = [(blocks, r * d + s_) for r, s_ in fields]
        if return_mass:
            mdata = np.zeros(pat.nnz)
            targets.insert(0, mdata)
    if return_mass:
        phi, _ = _ref_tables(info, xi)
        Tm_full = np.ascontiguousarray((phi[:, :, None] * phi[:, None, :]).reshape(nq, L))
        Tm_aff = (w @ Tm_full)[None, :]
    step = info.chunk_size(xi, L * d * d)
    from ..fe.sparsity import FieldSums
    sums = (DeviceFieldSums if dev is not None else FieldSums)(pat, targets, step)
    gsz = d * d * step * nq * d * d
    gbuf = np.empty(3 * gsz + d * step * nq * d)
    kbuf = np.empty(nfld * step * L)
    affine_ok = not (callable(lam) or callable(mu))
    for sl, g in info.chunks(xi, L * d * d, affine=affine_ok):
        n, nqg = g.num_cells, g.num_points
        wdet = g.detJ if g.affine else g.detJ * w
        T = T_aff if g.affine else T_full
        # X[a, f, c, q, b, e] = invJ[c, q, b, a] invJ[c, q, e, f];  G_rs = wl X_rs + wm (X_sr + delta_rs sum_a X_aa)
        fsz = d * d * n * nqg * d * d
        V = gbuf[3 * gsz:3 * gsz + d * n * nqg * d].reshape(d, n, nqg, d)
        np.copyto(V, g.invJ.transpose(3, 0, 1, 2))
        X = gbuf[:fsz].reshape(d, d, n, nqg, d, d)
        np.multiply(V[:, None, :, :, :, None], V[None, :, :, :, None, :], out=X)
        if both_const:
            wl = (wdet * lam_c)[:, :, None, None]
            wm = (wdet * mu_c)[:, :, None, None]
        else:
            wl = (wdet * ev_l(sl, g))[:, :, None, None]
            wm = (wdet * ev_m(sl, g))[:, :, None, None]
        G = gbuf[gsz:gsz + fsz].reshape(d, d, n, nqg, d, d)
        tmp = gbuf[2 * gsz:2 * gsz + fsz].reshape(d, d, n, nqg, d, d)
        # A_(i,r),(j,s) = lam g_i[r] g_j[s] + mu g_i[s] g_j[r] + mu delta_rs g_i . g_j
        np.multiply(X, wl, out=G)
        np.multiply(X.swapaxes(0, 1), wm, out=tmp)
        G += tmp
        tr = X[0, 0].copy()
        for a_ in range(1, d):
            tr += X[a_, a_]
        tr *= wm
        for r in range(d):
            G[r, r] += tr
        K = kbuf[:nfld * n * L].reshape(nfld, n, L)
        matmul_serial(G.reshape(nk * n, -1), T, out=K[moff:].reshape(nk * n, L))   # fields (r, s) row-major
        if return_mass:
            matmul_serial(np.ascontiguousarray(wdet), Tm_aff if g.affine else Tm_full, out=K[0])
        sums.add(sl, K)
    if dev is not None:
        sums.finish()
    del sums
    if format == "fields":
        return pat.indptr, pat.indices, fdata
    Ms = pat.csr(mdata) if return_mass else None
    if format == "bsr":
        B = sp.bsr_matrix((blocks.reshape(-1, d, d), pat.indices, pat.indptr),
                          shape=(pat.shape[0] * d, pat.shape[1] * d))
        B.has_sorted_indices = True
        return (B, Ms) if return_mass else B
    A = pat.block_csr(blocks, d, d)
    return (A, Ms) if return_mass else A
