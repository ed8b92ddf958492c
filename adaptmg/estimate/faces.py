r"""Interior faces of an adaptive mesh with hanging nodes, and quadrature on faces.

Every interior face of an active cell is one of

* *conforming*: the same 2^(d-1) vertices as a face of exactly one other active
  cell (matched by keys made of the sorted vertex node ids);
* *fine sub-face*: one of the 2^(d-1) pieces of a face of a coarser cell.  One
  of its vertices is the hanging node in the middle of the coarse face (edge
  midpoint in 2D, face centre in 3D) whose 2^(d-1) ``hanging_parents`` are the
  coarse face's vertices, so the sorted parents are the coarse face's key;
* *coarse face*: the key of a coarse face is matched by its fine sub-faces, and
  its integrals are taken on them.

:func:`face_pairs` lists every conforming face once from each side and every fine
sub-face once (from the fine side), each with its neighbour cell and the reference
coordinates, in the neighbour, of the face's vertices (a vertex of the neighbour: its
corner; a hanging node: the mean of its parents' corners).  Gauss points on a face,
:math:`\hat x_q = \sum_j N_j(s_q)\,\hat R_j` with the (d-1)-dimensional Q1 functions
:math:`N_j` and the vertex coordinates :math:`\hat R_j`, are then exact in the neighbour
too, because a sub-face is an axis-parallel sub-square of the neighbour's reference face.

On the own side the unit outward normal and the surface element follow Nanson's
formula: for local face ``2 a + s`` (axis a, side s) with :math:`\hat n = \pm e_a`,
:math:`n = J^{-T}\hat n / |J^{-T}\hat n|` and :math:`dA = \det J\,|J^{-T}\hat n|\,d\hat A`.
The face diameter :math:`h_F` is the largest distance between two of its vertices.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass

import numpy as np

from ..fe.element import LagrangeQ
from ..fe.quadrature import tensor_gauss
from ..mesh import reference as ref
from .evaluation import PointValues, basis_tables


@dataclass
class FacePairs:
    """Interior faces integrated on the fine (or conforming) side.

    ``cell``/``face``: the cell whose face (2 axis + side) is integrated; ``nb``: the
    neighbour cell; ``R_nb`` (np, 2^(d-1), d): reference coordinates in ``nb`` of the
    face's vertices (lexicographic face order); ``hanging``: True for fine sub-faces
    (the coarse neighbour receives the same contribution).
    """
    cell: np.ndarray
    face: np.ndarray
    nb: np.ndarray
    R_nb: np.ndarray
    hanging: np.ndarray


_FACE_CACHE: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()   # mesh -> FacePairs (meshes are immutable)


def face_pairs(mesh) -> FacePairs:
    """Match the interior faces of an adaptive mesh (conforming faces and hanging sub-faces)."""
    cache = _FACE_CACHE.get(mesh)
    if cache is not None:
        return cache
    d = mesh.dim
    nfv = 2 ** (d - 1)
    fv = ref.face_vertices(d)
    cor = ref.corners(d).astype(float)
    bid = mesh.boundary_ids
    c_all, f_all = np.nonzero(bid < 0)
    V = mesh.cells[c_all[:, None], fv[f_all]]                      # (nF, nfv), face-lexicographic
    key = np.sort(V, axis=1)
    par = np.full((mesh.num_nodes, 4), -1, dtype=np.int64)
    if mesh.num_hanging_nodes:
        par[mesh.hanging_nodes] = mesh.hanging_parents
    npar = (par >= 0).sum(1)
    cand = npar[V] == nfv                                          # vertex = centre of the coarse face
    has = cand.any(1)
    which = np.argmax(cand, axis=1)
    hv = V[np.arange(V.shape[0]), which]
    ckey = np.sort(par[hv][:, :nfv], axis=1)
    hidx = np.flatnonzero(has)
    inv = _row_labels(np.concatenate([key, ckey[hidx]]))
    lab, clab = inv[:key.shape[0]], inv[key.shape[0]:]
    cnt = np.bincount(lab, minlength=inv.max() + 1)
    conf = cnt[lab] == 2
    nF = key.shape[0]
    partner = np.full(nF, -1, dtype=np.int64)
    ci = np.flatnonzero(conf)
    o = ci[np.argsort(lab[ci], kind="stable")]
    partner[o[0::2]] = o[1::2]
    partner[o[1::2]] = o[0::2]
    single = np.flatnonzero(cnt[lab] == 1)
    pos = np.full(cnt.size, -1, dtype=np.int64)
    pos[lab[single]] = single
    # fine sub-faces: not conforming, with a centre vertex whose parents' key is a (single) face key
    fine_rows = hidx[~conf[hidx]]
    target = pos[clab[~conf[hidx]]]
    ok = target >= 0
    fine_rows, target = fine_rows[ok], target[ok]
    is_coarse = np.zeros(nF, dtype=bool)
    is_coarse[target] = True
    is_fine = np.zeros(nF, dtype=bool)
    is_fine[fine_rows] = True
    bad = ~(conf | is_coarse | is_fine)
    if bad.any():
        i = np.flatnonzero(bad)[0]
        raise RuntimeError(f"face matching failed for {bad.sum()} interior face(s) (first: cell {c_all[i]}, "
                           f"face {f_all[i]}, vertices {V[i].tolist()}); is the mesh 2:1 balanced?")
    if (is_fine & is_coarse).any():
        raise RuntimeError("a face is both a fine sub-face and a coarse face; the mesh is not 2:1 balanced")
    rows = np.concatenate([np.flatnonzero(conf), fine_rows])
    nbrow = np.concatenate([partner[conf], target])
    hanging = np.concatenate([np.zeros(conf.sum(), bool), np.ones(fine_rows.size, bool)])
    cell, face, nb = c_all[rows], f_all[rows], c_all[nbrow]
    Vs = V[rows]                                                   # (np, nfv)
    W = mesh.cells[nb]                                             # (np, nv)
    cor_i = ref.corners(d)
    # vertices shared with the neighbour: their corner in the neighbour
    direct = Vs[:, :, None] == W[:, None, :]                       # (np, nfv, nv)
    isd = direct.any(2)
    R = cor[np.argmax(direct, axis=2)]                             # (np, nfv, d)
    # hanging vertices of fine sub-faces: mean of their parents' corners in the neighbour
    h_rows = np.flatnonzero(~isd.all(1))
    if h_rows.size:
        P = par[Vs[h_rows]]                                        # (nh, nfv, 4)
        Wh = W[h_rows][:, None, :]
        acc = np.zeros((h_rows.size, nfv, d))
        cnt_p = (P >= 0).sum(-1)
        found = np.zeros(P.shape[:2], dtype=np.int64)
        for k in range(P.shape[2]):                                # 4 parent slots
            hit = (P[:, :, k, None] == Wh) & (P[:, :, k, None] >= 0)
            ok = hit.any(-1)
            acc += ok[..., None] * cor_i[np.argmax(hit, axis=-1)]
            found += ok
        Rp = acc / np.maximum(cnt_p, 1)[..., None]
        ok = isd[h_rows] | ((found == cnt_p) & (cnt_p > 0))
        if not ok.all():
            raise RuntimeError("face matching: a sub-face vertex is neither a vertex of the neighbour "
                               "nor a hanging node on its face")
        R[h_rows] = np.where(isd[h_rows][..., None], R[h_rows], Rp)
    elif not isd.all():
        raise RuntimeError("face matching: a face vertex is not a vertex of the neighbour")
    out = FacePairs(cell, face, nb, R, hanging)
    try:
        _FACE_CACHE[mesh] = out
    except TypeError:          # not weak-referenceable: no caching
        pass
    return out


def _row_labels(keys):
    """Integer label of every row of the int array ``keys`` (n, 2 or 4): equal rows <-> equal labels.

    Rows are packed into int64 pairs (node ids < 2^31) and labelled through one lexsort,
    which is much faster than ``np.unique(axis=0)``."""
    a = (keys[:, 0].astype(np.int64) << 32) | keys[:, 1].astype(np.int64)
    b = ((keys[:, 2].astype(np.int64) << 32) | keys[:, 3].astype(np.int64)) if keys.shape[1] == 4 \
        else np.zeros_like(a)
    order = np.lexsort((b, a))
    a_s, b_s = a[order], b[order]
    new = np.ones(a.size, dtype=bool)
    new[1:] = (a_s[1:] != a_s[:-1]) | (b_s[1:] != b_s[:-1])
    lab = np.empty(a.size, dtype=np.int64)
    lab[order] = np.cumsum(new) - 1
    return lab


def face_quadrature(d, nq):
    """Gauss rule with nq points per direction on the reference face: the face Q1 functions
    Nf (nqf, 2^(d-1)) at the points, and the weights (nqf,)."""
    s, w = tensor_gauss(d - 1, nq)
    Nf = LagrangeQ(1, d - 1).values(s)                             # (nqf, nfv)
    return Nf, w


def own_face_refs(d, faces):
    """Reference coordinates (n, nfv, d) of the vertices of local faces ``faces`` in their own cell."""
    cor = ref.corners(d).astype(float)
    return cor[ref.face_vertices(d)[faces]]


def face_point_tables(space, R, Nf):
    """Basis tables at the face points  sum_j Nf[q, j] R[n, j]  of many faces.

    The vertex reference coordinates R (n, nfv, d) take values in {0, 1/2, 1}, so only a
    few distinct point sets occur (faces x orientations x sub-face positions): the basis
    is evaluated once per distinct set and gathered.  Returns (tables, points (n, nq, d))."""
    n, nfv, d = R.shape
    code = (np.rint(2 * R).astype(np.int64).reshape(n, -1) * 3 ** np.arange(nfv * d)).sum(1)
    _, first, inv = np.unique(code, return_index=True, return_inverse=True)
    inv = inv.ravel()
    xi_u = np.einsum("qj,njd->nqd", Nf, R[first])
    return tuple(t[inv] for t in basis_tables(space, xi_u)), np.einsum("qj,njd->nqd", Nf, R)


def outward_normals(ev: PointValues, faces, d):
    """Unit outward normals and surface elements (Nanson) at face points of the own cell."""
    axis, side = faces // 2, faces % 2
    e = np.zeros((faces.size, d))
    e[np.arange(faces.size), axis] = 2.0 * side - 1.0
    nvec = np.einsum("nmba,nb->nma", ev.invJ, e)                   # J^{-T} (+-e_axis)
    norm = np.linalg.norm(nvec, axis=-1)
    return nvec / norm[..., None], ev.detJ * norm


def face_diameters(mesh, cells, faces):
    """h_F of the local faces ``faces`` of ``cells``: the largest distance between two vertices."""
    V = mesh.points[mesh.cells[cells[:, None], ref.face_vertices(mesh.dim)[faces]]]
    diff = V[:, :, None, :] - V[:, None, :, :]
    return np.sqrt((diff ** 2).sum(-1)).max(axis=(1, 2))
