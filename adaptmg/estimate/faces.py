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

:func:`face_runs` keeps every face once (one listing of a conforming face, every fine
sub-face) and sorts the faces into runs with the same own local face and the same
neighbour vertex coordinates :math:`\hat R`, i.e. the same reference points on both
sides, so that the estimator tabulates the basis once per run.  Face keys are matched by
packing the sorted vertex ids into int64 and one argsort.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass

import numpy as np

from ..fe.element import LagrangeQ
from ..fe.quadrature import tensor_gauss
from ..mesh import reference as ref
from .evaluation import PointValues


@dataclass
class FacePairs:
    """Interior faces integrated on the fine (or conforming) side.

    ``cell``/``face``: the cell whose face (2 axis + side) is integrated; ``nb``: the
    neighbour cell; ``R_nb`` (np, 2^(d-1), d): reference coordinates in ``nb`` of the
    face's vertices (lexicographic face order); ``hanging``: True for fine sub-faces
    (the coarse neighbour receives the same contribution); ``once``: True for one of the
    two listings of every conforming face and for every fine sub-face (each face once).
    """
    cell: np.ndarray
    face: np.ndarray
    nb: np.ndarray
    R_nb: np.ndarray
    hanging: np.ndarray
    once: np.ndarray | None = None


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
    key = _sort_rows(V)
    par = np.full((mesh.num_nodes, 4), -1, dtype=np.int64)
    if mesh.num_hanging_nodes:
        par[mesh.hanging_nodes] = mesh.hanging_parents
    npar = (par >= 0).sum(1)
    cand = npar[V] == nfv                                          # vertex = centre of the coarse face
    hidx = np.flatnonzero(cand.any(1))
    hv = V[hidx, np.argmax(cand[hidx], axis=1)]
    ckey = _sort_rows(par[hv][:, :nfv])
    nF = key.shape[0]
    inv, order = _row_labels(np.concatenate([key, ckey]), mesh.num_nodes)
    lab, clab = inv[:nF], inv[nF:]
    cnt = np.bincount(lab, minlength=int(inv.max()) + 1 if inv.size else 0)
    conf = cnt[lab] == 2
    # the two listings of a conforming face are adjacent in the sorted order of the face keys
    of = order[order < nF]
    pairs = of[conf[of]].reshape(-1, 2)
    partner = np.full(nF, -1, dtype=np.int64)
    partner[pairs[:, 0]] = pairs[:, 1]
    partner[pairs[:, 1]] = pairs[:, 0]
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
    corner = np.zeros(Vs.shape, dtype=np.intp)
    isd = np.zeros(Vs.shape, dtype=bool)
    eq = np.empty(Vs.shape, dtype=bool)
    for v in range(W.shape[1]):                                    # loop over the 2^d corners only
        np.equal(Vs, W[:, v, None], out=eq)
        np.copyto(corner, v, where=eq)
        isd |= eq
    R = cor[corner]                                                # (np, nfv, d)
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
    once = np.concatenate([rows[:conf.sum()] < nbrow[:conf.sum()], np.ones(fine_rows.size, bool)])
    out = FacePairs(cell, face, nb, R, hanging, once)
    try:
        _FACE_CACHE[mesh] = out
    except TypeError:          # not weak-referenceable: no caching
        pass
    return out


def _sort_rows(V):
    """Rows of an int array (n, 1, 2 or 4) sorted ascending (min/max sorting network)."""
    if V.shape[1] == 1:
        return V
    a, b = np.minimum(V[:, 0], V[:, 1]), np.maximum(V[:, 0], V[:, 1])
    if V.shape[1] == 2:
        return np.stack([a, b], axis=1)
    c, d = np.minimum(V[:, 2], V[:, 3]), np.maximum(V[:, 2], V[:, 3])
    lo, t1 = np.minimum(a, c), np.maximum(a, c)
    t2, hi = np.minimum(b, d), np.maximum(b, d)
    return np.stack([lo, np.minimum(t1, t2), np.maximum(t1, t2), hi], axis=1)


def _int_labels(k):
    """Dense labels of the int64 values k (equal values <-> equal labels) and the sort order."""
    order = np.argsort(k)
    ks = k[order]
    new = np.ones(k.size, dtype=bool)
    new[1:] = ks[1:] != ks[:-1]
    lab = np.empty(k.size, dtype=np.int64)
    lab[order] = np.cumsum(new) - 1
    return lab, order


def _row_labels(keys, num_nodes):
    """Integer label of every row of the int array ``keys`` (n, 2 or 4) of node ids below
    ``num_nodes`` (< 2^31), equal rows <-> equal labels, and an order that sorts the labels.

    A row is packed into one int64 (two ids, or four ids below 2^15) and labelled through
    one argsort, which is much faster than ``np.unique(axis=0)`` or a lexsort; four larger
    ids are packed as two labelled pairs."""
    k = keys.astype(np.int64)
    if k.shape[1] == 1:
        return _int_labels(k[:, 0])
    if k.shape[1] == 2:
        return _int_labels((k[:, 0] << 32) | k[:, 1])
    if num_nodes <= 2 ** 15:
        return _int_labels((k[:, 0] << 45) | (k[:, 1] << 30) | (k[:, 2] << 15) | k[:, 3])
    ab = _int_labels((k[:, 0] << 32) | k[:, 1])[0]
    cd = _int_labels((k[:, 2] << 32) | k[:, 3])[0]
    return _int_labels((ab << 32) | cd)


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


@dataclass
class FaceRuns:
    """Every interior face once (:attr:`FacePairs.once`), sorted into runs that share the own
    local face and the neighbour's reference point set, so that both sides of a run are
    evaluated with tables shared by all its faces.

    ``cell``/``face``/``nb``/``hanging`` as in :class:`FacePairs`, ``h`` the face diameters,
    ``R_sets`` (G, 2^(d-1), d) the distinct neighbour vertex coordinates and ``runs`` a list
    of ``(start, stop, face, set)``."""
    cell: np.ndarray
    face: np.ndarray
    nb: np.ndarray
    hanging: np.ndarray
    h: np.ndarray
    R_sets: np.ndarray
    runs: list


_RUNS_CACHE: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def face_runs(mesh) -> FaceRuns:
    """The :class:`FaceRuns` of a mesh (memoised per mesh; meshes are immutable)."""
    hit = _RUNS_CACHE.get(mesh)
    if hit is not None:
        return hit
    fp = face_pairs(mesh)
    d = mesh.dim
    sel = np.flatnonzero(fp.once)
    R = fp.R_nb[sel]
    n, nfv = R.shape[:2]
    # vertex coordinates are in {0, 1/2, 1}: a base-3 code per face, labelled through a table
    ncode = 3 ** (nfv * d)
    code = np.rint(2 * R).astype(np.int64).reshape(n, nfv * d) @ (3 ** np.arange(nfv * d, dtype=np.int64))
    present = np.zeros(ncode, dtype=bool)
    present[code] = True
    codes = np.flatnonzero(present)
    lab = np.cumsum(present) - 1
    G = codes.size
    key = fp.face[sel] * G + lab[code]
    order = np.argsort(key.astype(np.int16) if 2 * d * G < 2 ** 15 else key, kind="stable")
    key, sel = key[order], sel[order]
    starts = np.flatnonzero(np.r_[True, key[1:] != key[:-1]])
    stops = np.r_[starts[1:], key.size]
    digits = (codes[:, None] // 3 ** np.arange(nfv * d)) % 3
    R_sets = (digits / 2.0).reshape(G, nfv, d)
    runs = [(int(a), int(b), int(key[a] // G), int(key[a] % G)) for a, b in zip(starts, stops) if b > a]
    cell, face = fp.cell[sel], fp.face[sel]
    out = FaceRuns(cell, face, fp.nb[sel], fp.hanging[sel], face_diameters(mesh, cell, face), R_sets, runs)
    try:
        _RUNS_CACHE[mesh] = out
    except TypeError:
        pass
    return out


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
    fv = ref.face_vertices(mesh.dim)
    vid = mesh.cells[cells[:, None], fv[faces]]                     # (n, nfv)
    V = np.ascontiguousarray(mesh.points.T)[:, vid.T]               # (d, nfv, n)
    best = None
    for i in range(fv.shape[1]):              # loop over the vertex pairs of a reference face only
        for j in range(i + 1, fv.shape[1]):
            diff = V[:, i] - V[:, j]
            s2 = diff[0] * diff[0]
            for a in range(1, diff.shape[0]):
                s2 += diff[a] * diff[a]
            best = s2 if best is None else np.maximum(best, s2, out=best)
    return np.sqrt(best) if best is not None else np.zeros(len(cells))
