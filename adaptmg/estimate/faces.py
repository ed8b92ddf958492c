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

from ..backend import CPU, constant, get_backend, to_host
from ..device.index_kernels import face_corners
from ..fe.element import LagrangeQ
from ..fe.quadrature import tensor_gauss
from ..fe.sparsity import counting_order
from ..mesh._touch import cells_with_vertex_in
from ..mesh import reference as ref
from .evaluation import PointValues, max_vertex_distance


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


_FACE_CACHE: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()   # mesh -> {backend: FacePairs}


def _resolve(backend):
    return CPU if backend is None else get_backend(backend)


def _cache_key(be):
    """Per-backend cache key: "cpu", or ("gpu", current device id)."""
    if not be.is_gpu:
        return "cpu"
    return ("gpu", int(be.xp.cuda.runtime.getDevice()))


def _cache_get(cache, mesh, be, tag=None):
    key = _cache_key(be) if tag is None else (_cache_key(be), tag)
    try:
        return cache.get(mesh, {}).get(key)
    except TypeError:          # not weak-referenceable: no caching
        return None


def _cache_put(cache, mesh, be, value, tag=None):
    key = _cache_key(be) if tag is None else (_cache_key(be), tag)
    try:
        cache.setdefault(mesh, {})[key] = value
    except TypeError:          # not weak-referenceable: no caching
        pass


@dataclass
class MeshArrays:
    """The mesh tables the estimators read, on a backend: ``cells`` (nc, 2^d) and ``points_t``
    (d, num_nodes), the transposed points (contiguous)."""
    cells: np.ndarray
    points_t: np.ndarray


_MESH_CACHE: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()   # mesh -> {backend: MeshArrays}


def mesh_arrays(mesh, backend=None) -> MeshArrays:
    """:class:`MeshArrays` of ``mesh`` on ``backend`` (as in :func:`face_pairs`), memoised per
    mesh and backend: on the GPU the face matching, the face diameters and the indicators'
    evaluation share one upload of the tables per mesh."""
    be = _resolve(backend)
    hit = _cache_get(_MESH_CACHE, mesh, be)
    if hit is None:
        hit = MeshArrays(be.asarray(mesh.cells), be.xp.ascontiguousarray(be.asarray(mesh.points).T))
        _cache_put(_MESH_CACHE, mesh, be, hit)
    return hit


def _bincount(xp, x, minlength):
    """``xp.bincount(x, minlength=minlength)``, also for an empty ``x`` (CuPy takes its max)."""
    if x.size == 0:
        return xp.zeros(minlength, dtype=np.intp)
    return xp.bincount(x, minlength=minlength)


def face_pairs(mesh, backend=None, partial=False) -> FacePairs:
    """Match the interior faces of an adaptive mesh (conforming faces and hanging sub-faces).

    ``partial``: the mesh is a piece of a larger one (a distributed forest's owned leaves and
    ghost layer): an interior face with no neighbour in the piece is left out instead of
    being an error (the cells at the piece's edge miss those faces; a cell all of whose
    neighbours are in the piece gets all its faces).
    ``backend``: None or "cpu" (NumPy), "gpu" or a :class:`~adaptmg.backend.Backend`; on the
    GPU the matching runs on CuPy arrays (the mesh tables are copied once per call) and the
    :class:`FacePairs` holds CuPy arrays, the same as the host's (same faces, same order).
    Memoised per mesh and backend."""
    be = _resolve(backend)
    tag = "partial" if partial else None
    cache = _cache_get(_FACE_CACHE, mesh, be, tag)
    if cache is not None:
        return cache
    out = _match_faces(mesh, be, partial, False)
    _cache_put(_FACE_CACHE, mesh, be, out, tag)
    return out


def _match_faces(mesh, be, partial, once_only, only=None):
    """:func:`face_pairs` (not memoised); ``once_only``: only the listings with ``once`` True
    (every face once, in the same order: what :func:`face_runs` keeps), so that the neighbour
    rows and corners of the second listing of a conforming face are never formed.

    ``only``: None, or a boolean mask of cells: then only the faces of two rings of cells
    around ``only`` are listed -- ``ring1`` the cells that share a vertex with a cell of
    ``only`` (every neighbour of such a cell, across a whole face or a sub-face, does), ``ring2``
    those sharing a vertex with ``ring1`` -- so every face of a ``ring1`` cell has its
    partner listed and is classified as in the whole mesh; fine sub-faces are looked for among
    ``ring1``'s faces only (a face of the outer ring whose partner was not listed could pass for
    one), the faces of ``only`` are all found, and others may be left out."""
    xp = be.xp
    d = mesh.dim
    nfv = 2 ** (d - 1)
    fv = constant(ref.face_vertices(d), xp)                        # no-ops on the host
    cor = constant(ref.corners(d).astype(float), xp)
    cor_i = constant(ref.corners(d), xp)
    cells = mesh_arrays(mesh, be).cells
    bid = be.asarray(mesh.boundary_ids)
    if only is None:
        c_all, f_all = xp.nonzero(bid < 0)
    else:                             # the faces of two rings of cells around ``only``, in the same order
        ring1 = _around(cells, only, mesh.num_nodes, xp)
        c_all, f_all = xp.nonzero((bid < 0) & _around(cells, ring1, mesh.num_nodes, xp)[:, None])
    # (nF, nfv), face-lexicographic: every cell's faces by one gather along the vertex axis,
    # then the interior ones as whole rows (row gathers by ``take``: a 2-D fancy index copies
    # element by element, several times slower on the host)
    V = cells.take(fv.reshape(-1), axis=1).reshape(-1, nfv).take(c_all * (2 * d) + f_all, axis=0)
    key = _sort_rows(V, xp)
    par = xp.full((mesh.num_nodes, 4), -1, dtype=np.int64)
    if mesh.num_hanging_nodes:
        par[be.asarray(mesh.hanging_nodes)] = be.asarray(mesh.hanging_parents)
    npar = (par >= 0).sum(1, dtype=np.int8)              # int8: npar[V] is one byte a vertex slot
    cand = npar[V] == nfv                                          # vertex = centre of the coarse face
    hidx = xp.flatnonzero(cand.any(1))
    if only is not None:
        hidx = hidx[ring1[c_all[hidx]]]
    hv = V[hidx, xp.argmax(cand[hidx], axis=1)]
    ckey = _sort_rows(par.take(hv, axis=0)[:, :nfv], xp)
    nF = key.shape[0]
    inv, order = _row_labels(xp.concatenate([key, ckey]), mesh.num_nodes, xp)
    lab, clab = inv[:nF], inv[nF:]
    cnt = _bincount(xp, lab, int(inv.max()) + 1 if inv.size else 0)
    conf = cnt[lab] == 2
    # the two listings of a conforming face are adjacent in the sorted order of the face keys
    # (whatever the order of equal keys, so the result does not depend on the sort)
    of = order[order < nF]
    pairs = of[conf[of]].reshape(-1, 2)
    partner = xp.full(nF, -1, dtype=np.int64)
    partner[pairs[:, 0]] = pairs[:, 1]
    partner[pairs[:, 1]] = pairs[:, 0]
    single = xp.flatnonzero(cnt[lab] == 1)
    pos = xp.full(cnt.size, -1, dtype=np.int64)
    pos[lab[single]] = single
    # fine sub-faces: not conforming, with a centre vertex whose parents' key is a (single) face key
    nc = xp.flatnonzero(~conf[hidx])                       # one read per mask, not per array
    fine_rows = hidx.take(nc)
    target = pos[clab.take(nc)]
    ok = xp.flatnonzero(target >= 0)
    fine_rows, target = fine_rows.take(ok), target.take(ok)
    is_coarse = xp.zeros(nF, dtype=bool)
    is_coarse[target] = True
    is_fine = xp.zeros(nF, dtype=bool)
    is_fine[fine_rows] = True
    bad = ~(conf | is_coarse | is_fine)
    if only is not None:              # the faces of ``only`` must match; the others may not
        bad &= only[c_all]
    if not partial and bad.any():                                                  # details copied to the host only here
        i = int(xp.flatnonzero(bad)[0])
        raise RuntimeError(f"face matching failed for {int(bad.sum())} interior face(s) (first: cell "
                           f"{int(c_all[i])}, face {int(f_all[i])}, vertices {to_host(V[i]).tolist()}); "
                           "is the mesh 2:1 balanced?")
    if (is_fine & is_coarse).any():
        raise RuntimeError("a face is both a fine sub-face and a coarse face; the mesh is not 2:1 balanced")
    conf_rows = xp.flatnonzero(conf)
    conf_nb = partner.take(conf_rows)
    if once_only:                     # the listing from the lower row of each conforming pair
        keep = xp.flatnonzero(conf_rows < conf_nb)
        conf_rows, conf_nb = conf_rows.take(keep), conf_nb.take(keep)
    nconf = conf_rows.size
    rows = xp.concatenate([conf_rows, fine_rows])
    nbrow = xp.concatenate([conf_nb, target])
    hanging = xp.concatenate([xp.zeros(nconf, dtype=bool), xp.ones(fine_rows.size, dtype=bool)])
    cell, face, nb = c_all.take(rows), f_all.take(rows), c_all.take(nbrow)
    Vs = V.take(rows, axis=0)                                      # (np, nfv)
    W = cells.take(nb, axis=0)                                     # (np, nv)
    # the face vertices' corners in the neighbour (a hanging node: its parents' mean)
    R, ok = face_corners(Vs, W, par, cor, cor_i)
    if not ok:
        raise RuntimeError("face matching: a sub-face vertex is neither a vertex of the neighbour "
                           "nor a hanging node on its face")
    once = xp.concatenate([rows[:nconf] < nbrow[:nconf], xp.ones(fine_rows.size, dtype=bool)])
    return FacePairs(cell, face, nb, R, hanging, once)


def _around(cells, mask, num_nodes, xp):
    """The cells (a mask) that share a vertex with a cell of ``mask``."""
    near = xp.zeros(num_nodes, dtype=bool)
    near[cells[mask].reshape(-1)] = True
    out = xp.zeros(cells.shape[0], dtype=bool)
    out[cells_with_vertex_in(cells, near)] = True
    return out


def _sort_rows(V, xp=np):
    """Rows of an int array (n, 1, 2 or 4) sorted ascending (min/max sorting network)."""
    if V.shape[1] == 1:
        return V
    a, b = xp.minimum(V[:, 0], V[:, 1]), xp.maximum(V[:, 0], V[:, 1])
    if V.shape[1] == 2:
        return xp.stack([a, b], axis=1)
    c, d = xp.minimum(V[:, 2], V[:, 3]), xp.maximum(V[:, 2], V[:, 3])
    lo, t1 = xp.minimum(a, c), xp.maximum(a, c)
    t2, hi = xp.minimum(b, d), xp.maximum(b, d)
    return xp.stack([lo, xp.minimum(t1, t2), xp.maximum(t1, t2), hi], axis=1)


def _int_labels(k, xp=np):
    """Dense labels of the int64 values k (equal values <-> equal labels) and the sort order."""
    order = xp.argsort(k)
    ks = k[order]
    new = xp.ones(k.size, dtype=bool)
    new[1:] = ks[1:] != ks[:-1]
    lab = xp.empty(k.size, dtype=np.int64)
    lab[order] = xp.cumsum(new, dtype=np.int64) - 1
    return lab, order


def _row_labels(keys, num_nodes, xp=np):
    """Integer label of every row of the int array ``keys`` (n, 2 or 4) of node ids below
    ``num_nodes`` (< 2^31), equal rows <-> equal labels, and an order that sorts the labels.

    A row is packed into one int64 (two ids, or four ids below 2^15) and labelled through
    one argsort, which is much faster than ``np.unique(axis=0)`` or a lexsort; four larger
    ids are packed as two labelled pairs.  ``xp``: the array module of ``keys``."""
    k = keys.astype(np.int64)
    if k.shape[1] == 1:
        return _int_labels(k[:, 0], xp)
    host = xp is np
    if k.shape[1] == 2:
        if host:
            return _pair_labels(k[:, 0], k[:, 1], num_nodes, num_nodes)
        return _int_labels((k[:, 0] << 32) | k[:, 1], xp)
    if num_nodes <= 2 ** 15:
        return _int_labels((k[:, 0] << 45) | (k[:, 1] << 30) | (k[:, 2] << 15) | k[:, 3], xp)
    if host:
        ab = _pair_labels(k[:, 0], k[:, 1], num_nodes, num_nodes)[0]
        cd = _pair_labels(k[:, 2], k[:, 3], num_nodes, num_nodes)[0]
        return _pair_labels(ab, cd, int(ab.max()) + 1, int(cd.max()) + 1)
    ab = _int_labels((k[:, 0] << 32) | k[:, 1], xp)[0]
    cd = _int_labels((k[:, 2] << 32) | k[:, 3], xp)[0]
    return _int_labels((ab << 32) | cd, xp)


def _pair_labels(a, b, na, nb):
    """Host :func:`_int_labels` of the pairs ``(a, b)`` (ints ``0 <= a < na``, ``0 <= b < nb``) in
    lexicographic order -- the labels of the packed ``a << 32 | b`` -- through two stable
    counting sorts (by ``b``, then by ``a``: O(n + na + nb), no comparison sort)."""
    if a.size == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    order = counting_order(b, nb)
    order = order.take(counting_order(a.take(order), na))
    sa, sb = a.take(order), b.take(order)
    new = np.empty(a.size, dtype=bool)
    new[0] = True
    np.not_equal(sa[1:], sa[:-1], out=new[1:])
    new[1:] |= sb[1:] != sb[:-1]
    lab = np.empty(a.size, dtype=np.int64)
    lab[order] = np.cumsum(new, dtype=np.int64) - 1
    return lab, order.astype(np.int64, copy=False)


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
    of ``(start, stop, face, set)``; ``sets`` (on the GPU) the set of every face, the
    neighbour's table id of the run products (:class:`~adaptmg.device.index_kernels.ColumnGroups`)."""
    cell: np.ndarray
    face: np.ndarray
    nb: np.ndarray
    hanging: np.ndarray
    h: np.ndarray
    R_sets: np.ndarray
    runs: list
    sets: object = None


_RUNS_CACHE: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()   # mesh -> {backend: FaceRuns}


def face_runs(mesh, backend=None, partial=False, only=None) -> FaceRuns:
    """The :class:`FaceRuns` of a mesh (memoised per mesh and backend; meshes are immutable).

    ``backend`` as in :func:`face_pairs`: on the GPU the face matching, the run grouping and
    the face diameters run on CuPy and ``cell``/``face``/``nb``/``hanging``/``h`` are CuPy
    arrays, equal to the host's in the same order (CuPy's argsort is stable, like the host's
    ``kind="stable"``); ``R_sets`` is a (small) NumPy array and ``runs`` a list either way.
    ``partial``: as in :func:`face_pairs`.

    ``only``: None, or a boolean mask of cells (on the backend): the faces touching them, as
    :func:`runs_touching` cuts them from the whole mesh's runs -- those runs when they are
    memoised already, else matched among the cells around ``only`` alone (a rank's share of a
    mesh that every rank holds: about that share of the work; not memoised)."""
    be = _resolve(backend)
    tag = "partial" if partial else None
    hit = _cache_get(_RUNS_CACHE, mesh, be, tag)
    if hit is not None:
        return hit if only is None else runs_touching(hit, only, be)
    xp, gpu = be.xp, be.is_gpu
    fp = _cache_get(_FACE_CACHE, mesh, be, "partial" if partial else None)
    if fp is not None and only is not None:
        return runs_touching(face_runs(mesh, be, partial), only, be)
    if only is not None:              # matched around ``only``; its runs cut to its faces below
        fp = _match_faces(mesh, be, partial, True, only)
    elif fp is None:                  # the listings kept below only (the same faces, same order), not
        #                               memoised: the second listing of every conforming face -- its
        #                               neighbour's vertices and corners -- is never formed (on an H200
        #                               at 42.6M 2-D cells: 13.7 GiB kept and ~1 KB a cell at the peak)
        fp = _match_faces(mesh, be, partial, True)
    d = mesh.dim
    sel = xp.flatnonzero(fp.once)
    R = fp.R_nb.take(sel, axis=0)
    n, nfv = R.shape[:2]
    # vertex coordinates are in {0, 1/2, 1}: a base-3 code per face, labelled through a table
    ncode = 3 ** (nfv * d)
    digit = xp.rint(2 * R).astype(np.int64).reshape(n, nfv * d)
    if gpu:                    # no integer matmul on the device: the nfv * d digits one by one
        code = digit[:, 0].copy()
        for j in range(1, nfv * d):
            code += digit[:, j] * 3 ** j
    else:
        code = digit @ (3 ** np.arange(nfv * d, dtype=np.int64))
    present = xp.zeros(ncode, dtype=bool)
    present[code] = True
    codes = xp.flatnonzero(present)
    lab = xp.cumsum(present, dtype=np.int64) - 1
    G = codes.size
    key = fp.face[sel] * G + lab[code]
    if gpu:
        order = xp.argsort(key)                                    # stable (CuPy's only sort)
    else:
        order = np.argsort(key.astype(np.int16) if 2 * d * G < 2 ** 15 else key, kind="stable")
    key, sel = key[order], sel[order]
    if gpu:                    # run starts on the device; only they and their keys are copied
        new = xp.ones(n, dtype=bool)
        new[1:] = key[1:] != key[:-1]
        first = xp.flatnonzero(new)
        starts, kstart = to_host(first), to_host(key[first])
        stops = np.r_[starts[1:], n].astype(starts.dtype)
    else:
        starts = np.flatnonzero(np.r_[True, key[1:] != key[:-1]])
        stops = np.r_[starts[1:], key.size]
        kstart = key
    codes = to_host(codes)
    digits = (codes[:, None] // 3 ** np.arange(nfv * d)) % 3
    R_sets = (digits / 2.0).reshape(G, nfv, d)
    if gpu:
        runs = [(int(a), int(b), int(k // G), int(k % G)) for a, b, k in zip(starts, stops, kstart) if b > a]
    else:
        runs = [(int(a), int(b), int(key[a] // G), int(key[a] % G)) for a, b in zip(starts, stops) if b > a]
    cell, face = fp.cell[sel], fp.face[sel]
    if only is not None:              # the faces of ``only`` (before their diameters)
        out = runs_touching(FaceRuns(cell, face, fp.nb[sel], fp.hanging[sel], None, R_sets, runs,
                                     key % G if gpu else None), only, be)
        out.h = face_diameters(mesh, out.cell, out.face, be)
        return out
    out = FaceRuns(cell, face, fp.nb[sel], fp.hanging[sel], face_diameters(mesh, cell, face, be), R_sets, runs,
                   key % G if gpu else None)
    _cache_put(_RUNS_CACHE, mesh, be, out, tag)
    return out


def runs_touching(fr: FaceRuns, mask, backend=None) -> FaceRuns:
    """The faces of ``fr`` with a cell in ``mask`` (a boolean array over the mesh's cells, on
    ``fr``'s backend) on either side, in their order, their runs re-cut: a run keeps the
    faces it had that touch ``mask`` (empty runs dropped), so the tables of the runs still
    serve them.  What a cell of ``mask`` receives from the faces is what it receives from all
    of ``fr`` (a face that is left out touches no cell of ``mask``).  On the GPU O(runs)
    numbers come to the host (the run bounds)."""
    be = _resolve(backend)
    xp = be.xp
    keep = mask[fr.cell] | mask[fr.nb]
    sel = xp.flatnonzero(keep)
    before = xp.zeros(keep.size + 1, dtype=np.int64)                # kept faces before face i
    xp.cumsum(keep, out=before[1:])
    ends = np.array([b for r in fr.runs for b in r[:2]], dtype=np.int64)
    pos = to_host(before[be.asarray(ends)]) if ends.size else ends
    runs = [(int(pos[2 * i]), int(pos[2 * i + 1]), f, g) for i, (_, _, f, g) in enumerate(fr.runs)
            if pos[2 * i + 1] > pos[2 * i]]
    take = lambda a: None if a is None else a[sel]                  # noqa: E731
    return FaceRuns(take(fr.cell), take(fr.face), take(fr.nb), take(fr.hanging), take(fr.h), fr.R_sets, runs,
                    take(fr.sets))


def has_face_runs(mesh, backend=None, partial=False) -> bool:
    """Whether :func:`face_runs` of the whole mesh is memoised (or its face pairs are)."""
    be = _resolve(backend)
    tag = "partial" if partial else None
    return _cache_get(_RUNS_CACHE, mesh, be, tag) is not None or _cache_get(_FACE_CACHE, mesh, be, tag) is not None


def outward_normals(ev: PointValues, faces, d):
    """Unit outward normals and surface elements (Nanson) at face points of the own cell."""
    axis, side = faces // 2, faces % 2
    e = np.zeros((faces.size, d))
    e[np.arange(faces.size), axis] = 2.0 * side - 1.0
    nvec = np.einsum("nmba,nb->nma", ev.invJ, e)                   # J^{-T} (+-e_axis)
    norm = np.linalg.norm(nvec, axis=-1)
    return nvec / norm[..., None], ev.detJ * norm


def face_diameters(mesh, cells, faces, backend=None):
    """h_F of the local faces ``faces`` of ``cells``: the largest distance between two vertices.

    ``backend`` as in :func:`face_pairs`: on the GPU ``cells``/``faces`` (host or device) and the
    mesh tables are copied to the device and the result is a CuPy array."""
    be = _resolve(backend)
    fv = constant(ref.face_vertices(mesh.dim), be.xp)               # no-ops on the host
    cells, faces = be.asarray(cells), be.asarray(faces)
    ma = mesh_arrays(mesh, be)
    nv = ma.cells.shape[1]                                          # (n, nfv) by flat gathers
    vid = ma.cells.reshape(-1).take(cells[:, None] * nv + fv.take(faces, axis=0))
    V = ma.points_t.take(vid.T, axis=1)                             # (d, nfv, n)
    return max_vertex_distance(V)
