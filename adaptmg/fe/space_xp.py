r"""The parts of a :class:`~adaptmg.fe.space.Space` that read its mesh, written once against
the array module of the mesh (``xp = mesh.backend.xp``: NumPy, or CuPy for a mesh on the
device), so that a space on a device mesh builds its hanging-node matrix, boundary DoFs and
nodal interpolants there, with nothing of O(cells) read back to the host.

The boundary DoFs and the interpolant are this code on the host too (``xp = numpy``).  For
the hanging rows and ``H`` the host keeps the NumPy-tuned code of :mod:`.space` (a direct
canonical CSR, ``np.repeat`` with count arrays); these functions give the same integers and
the same floats (every weight here is a product of dyadic numbers, exact in any order), and
the CPU tests run them with NumPy against the host code.

Hanging rows (seed 001 §2.2).  A hanging node h with parents :math:`p_1..p_m` (m = 2 on an
edge, 4 on a face) on an edge or face of its owner cell K has the reference coordinates
:math:`\hat x_h = \frac1m \sum_k \hat v(p_k)` (the mean of the parents' corners of K) and
the row :math:`H_{h,j} = \hat\phi_j(\hat x_h)` over K's vertices j; for Q1
:math:`\hat\phi_j(\hat x) = \prod_a (\hat x_a \text{ if } b_{j,a} = 1 \text{ else } 1 - \hat x_a)`
with :math:`b_j` the corner bits of vertex j: the weights 1/2 (edges) and 1/4 (faces).
Q2: the DoF nodes are those of the uniform refinement (the carrier, refined on the mesh's
backend); ``cell_dofs`` is gathered from its cells (:func:`q2_cell_dofs`) and a hanging
carrier node's row holds the Q2 weights (products of 3/8, 3/4, -1/8) over the 3^d nodes of
the coarse cell that contains its owner (:func:`hanging_rows`, :func:`lagrange_values`).
"""
from __future__ import annotations

import numpy as np

from ..backend import constant, csr_from_arrays
from ..device.index_kernels import csr_row_entries, weight_rows_csr
from ..mesh import reference as ref

__all__ = ["hanging_rows", "constraint_matrix_on", "kron_identity", "boundary_nodes",
           "boundary_dofs", "interpolate", "csr_rows", "q1_values", "lagrange_values", "q2_cell_dofs"]


def q1_values(xp, xi):
    r"""Q1 basis values :math:`\hat\phi_j(\hat x_q)` (nq, 2^d) at the reference points ``xi``
    (nq, d) of the array module ``xp``, lexicographic vertex order (the tensor product above)."""
    d = xi.shape[1]
    bits = ref.corners(d)                                    # (2^d, d) 0/1, lexicographic
    out = xp.ones((xi.shape[0], bits.shape[0]))
    for a in range(d):                                       # a loop over dimensions only
        x = xi[:, a:a + 1]
        sel = constant(bits[:, a][None, :] == 1, xp)
        out *= xp.where(sel, x, 1.0 - x)
    return out


def lagrange_values(xp, xi, k):
    r"""Q_k basis values :math:`\hat\phi_j(\hat x_q) = \prod_a \ell_{j_a}(\hat x_{q,a})` (nq, (k+1)^d)
    at the reference points ``xi`` (nq, d) of ``xp``, k = 1 or 2, lexicographic (axis 0
    fastest, as :class:`~adaptmg.fe.element.LagrangeQ`): Q1 :math:`\ell_0 = 1 - x,\ \ell_1 = x`;
    Q2 :math:`\ell_0 = 2 (x - \tfrac12)(x - 1),\ \ell_1 = -4 x (x - 1),\ \ell_2 = 2 x (x - \tfrac12)`
    (at the quarter points of the hanging nodes: 3/8, 3/4, -1/8, exact in any order)."""
    if k == 1:
        return q1_values(xp, xi)
    d = xi.shape[1]
    idx = ref.lattice(d, 3)                                  # (3^d, d): j_a, axis 0 fastest
    out = xp.ones((xi.shape[0], idx.shape[0]))
    for a in range(d):                                       # a loop over dimensions only
        x = xi[:, a]
        ell = xp.stack([2.0 * (x - 0.5) * (x - 1.0), -4.0 * x * (x - 1.0), 2.0 * x * (x - 0.5)], axis=1)
        out *= ell[:, constant(idx[:, a], xp)]
    return out


def q2_cell_dofs(xp, fine_cells, cidx, child, num_cells):
    """The (num_cells, 3^d) Q2 ``cell_dofs`` of a mesh from its uniform refinement (``fine_cells``
    and ``parent_of``'s ``(cidx, child)``, every fine cell a child): lattice point p of cell K is
    vertex ``e = p - b`` of K's child ``b = p // 2`` (per axis; child b's vertex e sits at
    lattice point b + e, :func:`~adaptmg.mesh.reference.child_lattice_index`) -- one gather per
    lattice point instead of a scatter of every child's vertices (whose shared points are
    written several times)."""
    d = int(round(np.log2(fine_cells.shape[1])))
    lat = ref.lattice(d, 3)                                  # lattice point of each index (axis 0 fastest)
    b = lat // 2
    w = 1 << np.arange(d)
    bi, ei = (b * w).sum(axis=1), ((lat - b) * w).sum(axis=1)
    row = xp.empty((num_cells, 1 << d), dtype=xp.int64)      # fine row of (cell, child): distinct pairs
    row[cidx, child] = xp.arange(cidx.shape[0], dtype=xp.int64)
    return fine_cells[row[:, constant(bi, xp)], constant(ei, xp)[None, :]]


def hanging_rows(xp, cells, hanging, parents, owner, fine_parent=None, cell_dofs=None):
    r"""``(hanging nodes, (nh, 2^d) columns, (nh, 2^d) weights)`` of a Q1 space on a mesh with
    ``cells`` and the hanging nodes' ``parents`` (-1 padded) and ``owner`` cells (module
    doc); the arrays of ``xp``.  Equals :attr:`Space._hanging_rows` of a Q1 space.

    Q2 (``fine_parent = (cidx, child)`` of the carrier -- the uniform refinement whose
    ``cells``, ``hanging``, ... these are -- and the space's ``cell_dofs``): the owner's
    reference point mapped into its parent cell K, :math:`(b + \hat x_h) / 2` with b the
    child bits, and the Q2 weights over K's 3^d DoF nodes (columns ``cell_dofs[K]``)."""
    d = int(round(np.log2(cells.shape[1])))
    nv = cells.shape[1]
    if fine_parent is not None:
        nv = 3 ** d
    if hanging.shape[0] == 0:
        return hanging, xp.zeros((0, nv), dtype=cells.dtype), xp.zeros((0, nv))
    cor = constant(ref.corners(d).astype(float), xp)
    owner_cells = xp.take(cells, owner, axis=0)
    hit = owner_cells == parents[:, 0:1]                     # parents are distinct vertices: an "any"
    for p in range(1, parents.shape[1]):                     # a loop over the <= 4 parents
        hit |= owner_cells == parents[:, p:p + 1]
    cnt = (parents >= 0).sum(axis=1)
    xi = (hit.astype(float) @ cor) / cnt[:, None]
    if fine_parent is None:
        W, cols = q1_values(xp, xi), owner_cells
    else:
        cidx, child = fine_parent
        xi = (cor[xp.take(child, owner)] + xi) / 2.0
        W, cols = lagrange_values(xp, xi, 2), xp.take(cell_dofs, xp.take(cidx, owner), axis=0)
    W[xp.abs(W) < 1e-13] = 0.0
    return hanging, cols, W


def constraint_matrix_on(be, n, hanging, cols, W):
    """:func:`~adaptmg.fe.space.constraint_matrix` on the backend ``be`` (arrays of ``be``):
    the (n x n) canonical CSR with identity rows on the regular nodes and the weights ``W``
    in the columns ``cols`` of the rows ``hanging``; chains (a weight on another hanging
    node) substituted by products H <- H H."""
    xp = be.xp
    is_h = xp.zeros(n, dtype=bool)
    is_h[hanging] = True                                      # one value: repeats are harmless
    H = weight_rows_csr(be, n, is_h, hanging, cols, W)        # two node kernels on the device
    for _ in range(8):
        if not bool(is_h[H.indices].any()):
            break
        H = (H @ H).tocsr()
        C = H.tocoo()                                        # the products' zeros dropped
        keep = C.data != 0
        H = be.sparse.coo_matrix((C.data[keep], (C.row[keep], C.col[keep])), shape=(n, n)).tocsr()
        H.sum_duplicates()
    else:
        raise RuntimeError("hanging-node constraints do not resolve (cyclic dependencies)")
    return H


def kron_identity(be, A, c):
    r""":math:`A \otimes I_c` of a canonical CSR ``A`` on its backend ``be``, node-major
    (entry (i, j) becomes (i c + r, j c + r)): row i c + r holds row i's entries, columns
    ``j c + r`` (sorted as A's), at ``c indptr_i + r len_i``; a loop over the c components."""
    if c == 1:
        return A
    xp = be.xp
    N, M = A.shape
    nnz = int(A.nnz)
    it = xp.int32 if max(c * nnz, c * N, c * M) < np.iinfo(np.int32).max else xp.int64
    ip = A.indptr.astype(xp.int64)
    ln = ip[1:] - ip[:-1]
    row = xp.searchsorted(ip, xp.arange(nnz, dtype=xp.int64), side="right") - 1
    off = xp.arange(nnz, dtype=xp.int64) - ip[row]
    indptr = xp.empty(N * c + 1, dtype=it)
    indices = xp.empty(c * nnz, dtype=it)
    data = xp.empty(c * nnz, dtype=A.data.dtype)
    col = A.indices.astype(xp.int64) * c
    for r in range(c):                                        # a loop over components only
        indptr[r:N * c:c] = (ip[:-1] * c + r * ln).astype(it)
        at = ip[row] * c + r * ln[row] + off
        indices[at] = (col + r).astype(it)
        data[at] = A.data
    indptr[N * c] = c * nnz
    B = csr_from_arrays(be.sparse, data, indices, indptr, (N * c, M * c))
    B.has_canonical_format = True
    return B


def csr_rows(be, A, rows):
    """``(ptr, indices, data)`` (int64, int64, float64) of the rows ``rows`` of the CSR ``A``,
    all on ``be`` (``A``'s backend): ``A[rows]``'s arrays without a sparse row slice."""
    xp = be.xp
    ip = A.indptr.astype(xp.int64)
    start = ip[rows]
    cnt = ip[rows + 1] - start
    ptr = xp.zeros(rows.shape[0] + 1, dtype=xp.int64)
    ptr[1:] = xp.cumsum(cnt)
    return (ptr,) + csr_row_entries(ptr, start, A.indices, A.data, int(ptr[-1]))   # one kernel on the device


def boundary_nodes(xp, space, ids=None, where=None):
    """:meth:`Space.boundary_nodes` on the mesh's array module: the sorted DoF nodes on the
    boundary faces with ids ``ids`` where ``where(x)`` holds (``where`` gets ``xp`` points;
    the points are gathered only then)."""
    c, f, _ = space.mesh.boundary_faces(ids)
    k, d = space.degree, space.dim
    lat = ref.lattice(d, k + 1)
    local = xp.asarray(np.array([np.flatnonzero(lat[:, a] == k * s) for a in range(d) for s in (0, 1)]))
    cd = space.cell_dofs
    mark = xp.zeros(space.num_nodes, dtype=bool)            # sorted distinct nodes without a sort
    mark[cd[c[:, None], local[f]]] = True                    # one value: repeats are harmless
    nodes = xp.flatnonzero(mark).astype(cd.dtype)
    if where is None:
        return nodes
    if not callable(where):
        raise TypeError(f"where must be a callable where(x) -> bool array, got {type(where).__name__}")
    keep = xp.asarray(where(space.points[nodes]))
    if keep.shape != nodes.shape or keep.dtype != bool:
        raise ValueError(f"where(x) must return a boolean array of shape {nodes.shape}, "
                         f"got {keep.dtype} {keep.shape}")
    return nodes[keep]


def boundary_dofs(xp, space, ids=None, where=None, components=None):
    """:meth:`Space.boundary_dofs` on the mesh's array module."""
    nodes = boundary_nodes(xp, space, ids, where)
    c = space.components
    comps = np.arange(c) if components is None else np.atleast_1d(np.asarray(components))
    if comps.size and (comps.min() < 0 or comps.max() >= c):
        raise ValueError(f"components must lie in [0, {c}), got {list(comps)}")
    dofs = (nodes[:, None] * c + constant(comps, xp)[None, :]).ravel()
    return dofs if components is None else xp.sort(dofs)


def interpolate(xp, space, f):
    """:meth:`Space.interpolate` on the mesh's array module (``f`` gets ``xp`` points)."""
    if not callable(f):
        raise TypeError(f"interpolate: f must be a callable f(x) -> values, got {type(f).__name__}")
    vals = xp.asarray(f(space.points), dtype=float)
    n, c = space.num_nodes, space.components
    if vals.shape not in ((n,), (n, c)) or (vals.shape == (n,) and c != 1):
        raise ValueError(f"f must return shape ({n},) or ({n}, {c}), got {vals.shape}")
    return vals.reshape(-1)
