r"""Prolongation and restriction between nested spaces of a global-coarsening hierarchy.

Between consecutive meshes Omega_{l-1} (coarse) and Omega_l (fine), every fine
cell F is either a coarse cell or one of the 2^d children of a coarse cell K.
The canonical embedding V_{l-1} -> V_l evaluates the coarse function at the fine
DoF nodes (seed 001 eq. (1)):

.. math::  u^{(l)}_i = \sum_j \chi_{ij} u^{(l-1)}_j, \qquad
           \chi_{ij} = \hat\phi^K_j\big((b + \hat x_i)/2\big),

where b are the child bits of F in K and \hat x_i the reference node of DoF i in
F.  On constrained vectors (hanging and Dirichlet entries excluded) this is

.. math::  P_l = Z_l \, (\chi \otimes I_c)\, H_{l-1} \, Z_{l-1},

with H_{l-1} the coarse hanging-node matrix (so coarse hanging values are
interpolated first) and Z the 0/1 diagonal of free DoFs.  The restriction
R_l = P_l^T is stored explicitly (a transposed SpMV is 2-3x slower on a GPU).
"""
from __future__ import annotations

import functools
import threading
import weakref

import numpy as np
import scipy.sparse as sp

from ..backend import CPU, csr_from_arrays, get_backend, repeat, scatter_min
from ..device import forest_hanging as FH
from ..device import index_kernels as IK
from ..fe.congruence import _hanging_rows, _index_array, _parents
from ..fe.csr_ops import csr_entry_rows, mask_rows_cols
from ..fe.element import LagrangeQ
from ..fe.space import Space
from ..fe.space_xp import kron_identity
from ..mesh import reference as ref

__all__ = ["interpolation_matrix", "prolongation"]


def interpolation_matrix(coarse: Space, fine: Space, nodes=None, cells=None) -> sp.csr_matrix:
    """Node-level embedding chi (fine nodes x coarse nodes) of nested Q_k spaces.

    ``nodes`` (sorted fine nodes, optional): only these rows (a ``nodes.size x`` coarse nodes
    matrix), each node taken from the first of ``cells`` (fine cells, default all) that
    contains it -- the rows a rank of :mod:`adaptmg.distributed` needs, from its cells only.

    Each fine node is taken from one fine cell containing it (its first occurrence in
    ``fine.cell_dofs``); its row holds the nonzero weights of table row (child position of
    that cell, local index of the node), so the rows are built straight in CSR from the
    compressed nonzero pattern of the (2^d + 1) * nloc table rows -- no dense
    (nodes, nloc) weight and column arrays, no COO conversion.

    Q1 between meshes of one forest (hanging nodes in the fine mesh only) takes
    :func:`_interpolation_q1_conforming` instead: the same CSR arrays from the forest's node
    parents, without the per-cell tables.
    """
    if not (isinstance(coarse, Space) and isinstance(fine, Space)):
        raise TypeError("interpolation_matrix expects two Space objects")
    if coarse.degree != fine.degree or coarse.dim != fine.dim:
        raise ValueError(f"spaces differ: Q{coarse.degree} in {coarse.dim}D vs Q{fine.degree} in {fine.dim}D")
    if fine.mesh.backend.is_gpu:
        if nodes is not None or cells is not None:
            raise ValueError("interpolation_matrix: nodes= / cells= take spaces on a host mesh; use mesh.to('cpu')")
        return _interpolation_on(fine.mesh.backend, coarse, fine)
    if fine.degree == 1 and nodes is None and cells is None:
        chi = _interpolation_q1_conforming(coarse, fine)
        if chi is not None:
            return chi
    cidx, child = fine.mesh.parent_of(coarse.mesh)
    nloc = fine.element.num_local
    kc, wv, cnt_tab, start_tab = _embedding_tables(fine.degree, fine.dim)
    sel = np.where(child < 0, 2 ** fine.dim, child)
    rows = fine.cell_dofs.ravel() if cells is None else fine.cell_dofs[cells].ravel()
    nf, ncn = fine.num_nodes, coarse.num_nodes
    # one (cell, local index) occurrence per fine node: later writes win, so write in reverse
    first = np.full(nf, -1, dtype=np.int64)
    first[rows[::-1]] = np.arange(rows.size - 1, -1, -1)
    if nodes is not None:
        first = first[np.asarray(nodes, dtype=np.int64)]
        nf = first.size
    if (first < 0).any():
        raise RuntimeError("fine space has DoF nodes outside its cells" if nodes is None else
                           "interpolation_matrix: a fine node lies in none of the given cells")
    pos = first // nloc                                     # position among the cells taken
    cell = pos if cells is None else np.asarray(cells, dtype=np.int64)[pos]
    key = sel[cell] * nloc + (first - pos * nloc)           # table row of each fine node
    cnt = cnt_tab[key]
    indptr = np.zeros(nf + 1, dtype=np.int64)
    np.cumsum(cnt, out=indptr[1:])
    t = np.repeat(start_tab[key] - indptr[:-1], cnt)        # entry e -> nonzero t of the table
    t += np.arange(t.size)
    flat = np.repeat(cidx[cell] * nloc, cnt)                # coarse cell_dofs entry of each entry
    flat += kc[t]
    idx_t = np.int32 if max(nf, ncn, t.size) <= np.iinfo(np.int32).max else np.int64
    A = sp.csr_matrix((wv[t], coarse.cell_dofs.ravel()[flat].astype(idx_t, copy=False),
                       indptr.astype(idx_t, copy=False)), shape=(nf, ncn))
    A.sort_indices()                                        # rows are distinct coarse nodes: no duplicates
    return A


@functools.lru_cache(maxsize=None)
def _embedding_tables(degree, dim):
    r"""The compressed nonzero pattern of the weights table of :func:`interpolation_matrix` for
    Q``degree`` in ``dim`` dimensions: rows (table, j) for the 2^d children and the identity (a fine cell that
    is a coarse cell), the weights :math:`\hat\phi_k((b + \hat x_j) / 2)` of local fine node j;
    ``(columns, weights, count per row, start per row)`` in row-major order (host, small)."""
    el = LagrangeQ(degree, dim)
    d, nloc = el.dim, el.num_local
    cor = ref.corners(d).astype(float)
    tables = [el.values((cor[b] + el.nodes) / 2.0) for b in range(2 ** d)] + [np.eye(nloc)]
    W = np.stack(tables).reshape(-1, nloc)                  # ((2^d + 1) * nloc, nloc)
    W[np.abs(W) < 1e-13] = 0.0
    kr, kc = np.nonzero(W)                                  # table row-major: row, then column
    cnt_tab = np.bincount(kr, minlength=W.shape[0])
    out = (kc, W[kr, kc], cnt_tab, np.cumsum(cnt_tab) - cnt_tab)
    for a in out:
        a.flags.writeable = False                           # shared by every call
    return out


def _interpolation_on(be, coarse, fine):
    """:func:`interpolation_matrix` (all rows) for spaces on a mesh on the device ``be``: the
    same CSR built there -- ``parent_of`` on the device, each fine node's first occurrence in
    ``fine.cell_dofs`` by a scatter-min of positions (no "last write wins" scatter), the rows'
    entries by the backend's repeat; only the small weights table goes up.  The weights are
    the host table's: the result equals the host CSR exactly."""
    xp = be.xp
    cidx, child = fine.mesh.parent_of(coarse.mesh)
    d, nloc = fine.dim, fine.element.num_local
    kc, wv, cnt_tab, start_tab = (be.asarray(a) for a in _embedding_tables(fine.degree, fine.dim))
    sel = xp.where(child < 0, 2 ** d, child)
    rows = fine.cell_dofs.ravel()
    nf, ncn = fine.num_nodes, coarse.num_nodes
    first = xp.full(nf, rows.shape[0], dtype=xp.int64)
    scatter_min(first, rows, xp.arange(rows.shape[0], dtype=xp.int64))
    if bool((first == rows.shape[0]).any()):
        raise RuntimeError("fine space has DoF nodes outside its cells")
    cell = first // nloc
    key = xp.take(sel, cell) * nloc + (first - cell * nloc)     # table row of each fine node
    cnt = xp.take(cnt_tab, key)
    indptr = xp.zeros(nf + 1, dtype=xp.int64)
    indptr[1:] = xp.cumsum(cnt)
    total = int(indptr[-1])
    own = repeat(xp.arange(nf, dtype=xp.int64), cnt, total, xp=xp)  # fine node of each entry
    t = xp.take(start_tab, xp.take(key, own)) + (xp.arange(total, dtype=xp.int64) - xp.take(indptr, own))
    flat = xp.take(cidx, xp.take(cell, own)) * nloc + xp.take(kc, t)
    it = xp.int32 if max(nf, ncn, total) <= np.iinfo(np.int32).max else xp.int64
    A = csr_from_arrays(be.sparse, xp.take(wv, t), xp.take(coarse.cell_dofs.ravel(), flat).astype(it),
                        indptr.astype(it), (nf, ncn))
    A.sort_indices()                                        # distinct coarse nodes per row
    A.has_canonical_format = True
    return A


_NETWORK = {2: ((0, 1),),
            4: ((0, 1), (2, 3), (0, 2), (1, 3), (1, 2)),
            8: ((0, 2), (1, 3), (4, 6), (5, 7), (0, 4), (1, 5), (2, 6), (3, 7), (0, 1), (2, 3),
                (4, 5), (6, 7), (2, 4), (3, 5), (1, 4), (3, 6), (1, 2), (3, 4), (5, 6))}


def _sort_columns(c, xp=np):
    """The 1, 2, 4 or 8 equal-length arrays ``c`` sorted elementwise (``c[0] <= c[1] <= ...``
    at every position) by a min/max sorting network (8: the 19-comparator network), each
    comparator two whole-array operations (a row-wise ``np.sort`` of the (n, w) table pays a
    call per row); a new list."""
    c = list(c)
    for i, j in _NETWORK.get(len(c), ()):
        c[i], c[j] = xp.minimum(c[i], c[j]), xp.maximum(c[i], c[j])
    return c


_FOREST_TABLES: dict = {}   # device id -> (weak reference to a forest, its (node_kind, node_par) there)
_FOREST_LOCK = threading.Lock()


def _forest_tables(F, be):
    """The forest's ``(node_kind, node_par)`` on ``be``: the host arrays on the CPU; on the GPU
    a copy uploaded once and kept for the latest forest per device (every level of a
    hierarchy shares its forest: one upload serves all its transfers, the worker threads
    that build them waiting for the first one's upload instead of repeating it; the next
    forest -- the next step of an adaptive loop -- replaces it, and it goes with its forest)."""
    if not be.is_gpu:
        return F.node_kind, F.node_par
    dev = int(be.xp.cuda.Device().id)
    with _FOREST_LOCK:
        hit = _FOREST_TABLES.get(dev)
        if hit is None or hit[0]() is not F:
            ref = weakref.ref(F, functools.partial(_drop_tables, dev))
            hit = _FOREST_TABLES[dev] = (ref, (be.asarray(F.node_kind), be.asarray(F.node_par)))
        return hit[1]


def _drop_tables(dev, ref):
    """Weak-reference callback: the forest of ``ref`` died, its device tables go (if they are
    still the cached ones; no lock: it may run inside a collection on any thread)."""
    if _FOREST_TABLES.get(dev, (None,))[0] is ref:
        _FOREST_TABLES.pop(dev, None)


def _scatter_map(xp, ids, size):
    """The inverse of the distinct ``ids`` as a table of length ``size``: ``m[ids[i]] = i``,
    -1 elsewhere (int32 when that holds every index)."""
    m = xp.full(size, -1, dtype=xp.int32 if ids.shape[0] < 2**31 - 1 else xp.int64)
    m[ids] = xp.arange(ids.shape[0], dtype=m.dtype)
    return m


def _forest_map(mesh, be):
    """Forest id -> node of ``mesh`` (-1: none) on ``be``: the mesh's own cached map on the
    host; on the GPU scattered there from the mesh's node ids (an O(level) upload; the
    O(forest) table is written by the device)."""
    if not be.is_gpu:
        return mesh._node_numbering[1]
    return _scatter_map(be.xp, be.asarray(mesh.node_ids), mesh._forest.num_nodes)


def _q1_forest_groups(coarse: Space, fine: Space, fine_free=None, backend=None):
    """The rows of the Q1 embedding chi from the forest's node parents, by kind, on
    ``backend`` (default: the CPU): (a list over k = 0..d of (fine nodes of kind k (sorted),
    the coarse nodes of their 2^k parents (2^k, n_k): parent-major, -1 where a parent is no
    coarse node), the kind of every fine node (int8)), kind 0 being the coarse nodes
    themselves (parent: the node); only the rows of ``fine_free`` (a host mask over the
    fine nodes, None: all), the others of kind -1 and in no list; None when that does not
    apply.  The caller checks that the parents are coarse nodes (the -1 entries).

    One code against ``xp``: O(fine nodes + entries) gathers from the forest tables
    (:func:`_forest_tables`) and the forest -> coarse node map (:func:`_forest_map`), no
    host temporary the size of the forest (a level of an adaptive hierarchy may be much
    smaller than it), no parents gathered for rows that the mask drops; on the GPU the host
    only uploads the two meshes' node ids and the mask (the forest tables once).

    Every fine node is a coarse node (chi row: weight 1 on itself) or was created by
    splitting a coarse cell K: then it is the midpoint of an edge, face or of K, and its
    forest parents are that entity's 2^k corners, all coarse nodes (some maybe hanging in
    the coarse mesh), with the Q1 weights 2^-k -- exactly (dyadic) the nonzeros of the
    per-cell table row of :func:`interpolation_matrix`, whichever cell that takes.

    The checks (one forest, every coarse node a fine node, every other fine node a midpoint
    whose parents are all coarse nodes) imply what ``fine.mesh.parent_of(coarse.mesh)``
    checks: a child C of a coarse leaf K refined again in the fine mesh makes C's centre a
    fine node with a parent (K's centre) that is no coarse node -- no coarse cell, hanging
    nodes included, has a vertex inside the leaf K --, and a coarse cell refined away in the
    fine mesh would leave coarse nodes (its parent's midpoints) that are no fine node.
    """
    fm, cm = fine.mesh, coarse.mesh
    F = fm._forest
    if cm._forest is not F:
        return None
    be = CPU if backend is None else get_backend(backend)
    xp = be.xp
    node_kind, node_par = _forest_tables(F, be)
    fid = be.asarray(fm.node_ids)
    cmap = _forest_map(cm, be)                         # forest id -> coarse node, -1 if absent
    pos = xp.take(cmap, fid)
    old = pos >= 0
    kind = xp.take(node_kind, fid)
    kind *= ~old                                       # 0 on the coarse nodes
    if (int(xp.count_nonzero(old)) != coarse.num_nodes
            or int(xp.count_nonzero(kind)) != fine.num_nodes - coarse.num_nodes):
        return None                                    # a coarse node missing, or a new node of kind 0
    if fine_free is not None:
        kind[~be.asarray(fine_free)] = -1
    rows = xp.flatnonzero(kind == 0)
    groups = [(rows, pos[rows][None, :])]
    for k in range(1, fine.dim + 1):
        rows = xp.flatnonzero(kind == k)
        par = xp.take(node_par, xp.take(fid, rows), axis=0)[:, :1 << k]
        groups.append((rows, xp.take(cmap, par.T)))       # (2^k, n_k): a row per parent
    return groups, kind


def _q1_forest_csr(coarse: Space, fine: Space, fine_free=None, coarse_free=None, H=None,
                   backend=None, components=1, fused=None):
    r"""``(Z_f chi H Z_c) (x) I_c`` (``components`` c; ``*_free`` boolean host masks over
    nodes, None: all; ``H`` the coarse hanging-node matrix (nodes) or None: I) built straight
    as canonical CSR from :func:`_q1_forest_groups`; None when those do not apply.
    ``backend`` (default: the CPU): where the matrix is built and lives -- on the GPU only
    node ids, masks and the hanging rows of H go up (the forest tables once per forest) and
    every index step runs on the device (no host CSR, no upload of P).

    Per kind k the rows have 2^k entries 2^-k: the masked-out columns are replaced by a
    sentinel (``ncn``), each row sorted by a sorting network (sentinels last), so that the
    kept entries of node row i are its first ``cnt_i``.  With the node row pointer ``ip``
    (the running sum of ``cnt``), entry j of DoF row i c + r lies at
    ``c ip_i + r cnt_i + j`` with column ``c col + r`` (the node rows' c copies are
    consecutive): one scatter per kind and component, the masked-out entries sent to a
    spare slot past the end; the weights are the rows' 2^-k repeated ``c cnt_i`` times.
    Rows with a hanging coarse parent (few: hanging nodes lie on the refinement front) are
    expanded through the rows of H of the hanging coarse nodes (:func:`_hanging_parent_rows`;
    a hanging node's column code is ``ncn + 1 + node``, so it keeps its identity through the
    sort) and summed by the backend's COO -> CSR: nothing comes back to the host, only those
    rows of H go up.  The sums are of positive dyadic weights, exact in any order, so the
    result equals ``chi @ H`` followed by the masks bit for bit, on either backend.

    ``fused`` (default: on the GPU): the rows from the fused node kernels of
    :func:`_q1_forest_csr_fused` instead of the groups by kind (the same matrix; on the host
    their NumPy twins, for the tests)."""
    be = CPU if backend is None else get_backend(backend)
    if be.is_gpu if fused is None else fused:
        return _q1_forest_csr_fused(coarse, fine, fine_free, coarse_free, H, be, int(components))
    xp = be.xp
    res = _q1_forest_groups(coarse, fine, fine_free, be)
    if res is None:
        return None
    groups, kind = res
    c = int(components)
    nf, ncn = fine.num_nodes, coarse.num_nodes
    it = np.int32 if max(nf, 2 * ncn) * c + 2 < np.iinfo(np.int32).max else np.int64
    # one gather per column maps it to itself (kept), ncn (masked out) or ncn + 1 + node
    # (hanging: expanded through H below); the extra last entry maps a parent that is no
    # coarse node (-1) to -1
    hanging = coarse.hanging_nodes if H is not None else np.zeros(0, dtype=np.int64)
    colmap = _colmap(be, ncn, it, coarse_free, hanging)
    cnt = xp.zeros(nf, dtype=xp.int64)                # int64: NumPy's running sums and repeats take it as is
    parts, cplx = [], []
    for k, (rows_b, par) in enumerate(groups):
        if rows_b.size == 0:
            continue
        # parent-major (2^k, n_k): every row operation below runs along n_k
        cm = xp.stack(_sort_columns(list(xp.take(colmap, par)), xp))
        if int(cm[0].min()) < 0:                      # a parent that is no coarse node
            return None
        valid = cm < ncn
        if hanging.size:
            hr = xp.flatnonzero(cm[-1] > ncn)         # rows with a hanging parent
            if hr.shape[0]:
                cplx.append((rows_b[hr], cm[:, hr].T, 0.5 ** k))
                valid[:, hr] = False
        cnt[rows_b] = valid.sum(axis=0)
        parts.append((rows_b, cm, None if bool(valid.all()) else valid))
    C = None
    if cplx:                                          # (their rows are free: no fine mask)
        rows_c, C = _hanging_parent_rows(be, cplx, H, hanging, ncn, coarse_free)
        cnt[rows_c] = C.indptr[1:] - C.indptr[:-1]
    # the node row pointer, int64 (NumPy's own index type: the scatters below take it as is)
    ip = xp.zeros(nf + 1, dtype=xp.int64)
    ip[1:] = xp.cumsum(cnt)
    nnz = int(ip[-1]) * c
    if nnz > np.iinfo(it).max:                        # row pointers beyond int32: all int64
        it = np.int64
    buf = xp.empty(nnz + 1, dtype=it)                 # the last entry: the masked-out ones' slot
    for rows_b, cm, valid in parts:
        base = xp.take(ip, rows_b)
        if c > 1:
            base *= c
        step = xp.take(cnt, rows_b) if c > 1 else None
        off = xp.arange(cm.shape[0], dtype=xp.int64)[:, None]
        for r in range(c):
            if r:
                base += step
            dest = base + off
            if valid is not None:
                dest = xp.where(valid, dest, nnz)
            buf[dest] = cm if c == 1 else cm * it(c) + it(r)
    indices = buf[:nnz]
    w_row = xp.ldexp(1.0, -kind.astype(xp.int32))          # 2^-k of each row (exact; dropped rows: no entries)
    data = repeat(w_row, cnt * c if c > 1 else cnt, nnz, xp=be.xp)
    if C is not None and C.nnz:
        _write_hanging_entries(xp, C, rows_c, ip, cnt, c, it, indices, data)
    A = csr_from_arrays(be.sparse, data, indices, _dof_indptr(xp, ip, cnt, nf, c, nnz, it), (nf * c, ncn * c))
    if not be.is_gpu:
        A.has_canonical_format = True                 # distinct parents, sorted
    return A


def _colmap(be, ncn, it, coarse_free, hanging):
    """Coarse node -> column code: itself (kept), ``ncn`` (masked out) or ``ncn + 1 + node``
    (hanging: expanded through H); the extra last entry maps a parent that is no coarse
    node (-1) to -1."""
    xp = be.xp
    colmap = xp.empty(ncn + 1, dtype=it)
    colmap[:ncn] = xp.arange(ncn, dtype=it)
    colmap[ncn] = -1
    if coarse_free is not None:
        colmap[:ncn][~be.asarray(coarse_free)] = ncn
    if hanging.size:
        h = be.asarray(hanging)
        colmap[h] = (h + (ncn + 1)).astype(it)
    return colmap


def _q1_forest_csr_fused(coarse, fine, fine_free, coarse_free, H, be, c):
    """:func:`_q1_forest_csr` from one node kernel and one fill kernel
    (:func:`~adaptmg.device.index_kernels.q1_forest_rows` / ``q1_forest_fill``): every fine
    node's sorted parent codes, kept count, kind and flags at once, one read for the checks
    (every coarse node a fine node, every other fine node a midpoint of coarse nodes) and
    the count of rows with a hanging parent, which on the device two more node kernels expand
    through the coarse H (:mod:`adaptmg.device.forest_hanging`) and on the host (the twins)
    :func:`_hanging_parent_rows`; the same matrix as the groups by kind (positive dyadic sums:
    exact)."""
    fm, cm = fine.mesh, coarse.mesh
    F = fm._forest
    if cm._forest is not F:
        return None
    xp = be.xp
    node_kind, node_par = _forest_tables(F, be)
    fid = be.asarray(fm.node_ids)
    cmap = _forest_map(cm, be)
    nf, ncn = fine.num_nodes, coarse.num_nodes
    it = np.int32 if max(nf, 2 * ncn) * c + 2 < np.iinfo(np.int32).max else np.int64
    hanging = coarse.hanging_nodes if H is not None else np.zeros(0, dtype=np.int64)
    colmap = _colmap(be, ncn, it, coarse_free, hanging)[:ncn]
    free = None if fine_free is None else be.asarray(fine_free)
    codes, cnt, kind, hang, bad, old = IK.q1_forest_rows(fid, cmap, node_kind, node_par, colmap, free,
                                                         ncn, fine.dim)
    # one read: -1 when a coarse node is missing, a new node has kind 0 or a parent is no
    # coarse node (the forest path does not apply), else the rows with a hanging parent
    n_hang = int(xp.where((xp.count_nonzero(old) != ncn) | bad.any(), -1, xp.count_nonzero(hang)))
    if n_hang < 0:
        return None
    C = None

    def expanded():              # the rows with a hanging parent through the rows of H
        rows_h = xp.flatnonzero(hang)
        w_h = xp.ldexp(1.0, -kind.take(rows_h).astype(xp.int32))
        return _hanging_parent_rows(be, [(rows_h, codes[rows_h], w_h)], H, hanging, ncn, coarse_free)

    # the rows with a hanging parent: on the device two node kernels (forest_hanging), else
    # (host arrays: the twins) the rows of H gathered and expanded
    kernels = bool(n_hang) and FH.available(H, codes)
    cfree = None if coarse_free is None else be.asarray(coarse_free)
    if kernels:
        FH.count(xp, codes, kind, hang, H, cfree, ncn, cnt)
    elif n_hang:
        rows_c, C = expanded()
        cnt[rows_c] = C.indptr[1:] - C.indptr[:-1]
    ip = xp.zeros(nf + 1, dtype=xp.int64)
    ip[1:] = xp.cumsum(cnt)
    nnz = int(ip[-1]) * c
    if nnz > np.iinfo(it).max:
        it = np.int64
    indices, data = xp.empty(nnz, dtype=it), xp.empty(nnz, dtype=np.float64)
    IK.q1_forest_fill(cnt, kind, hang, codes, ip, c, indices, data)
    if kernels and it == np.int32:
        FH.fill(xp, codes, kind, hang, H, cfree, ncn, cnt, ip, c, indices, data)
    elif kernels:                    # int64 entries past 2^31 (the kernels write int32): as on the host
        rows_c, C = expanded()
    if C is not None and C.nnz:
        _write_hanging_entries(xp, C, rows_c, ip, cnt, c, it, indices, data)
    A = csr_from_arrays(be.sparse, data, indices, _dof_indptr(xp, ip, cnt, nf, c, nnz, it), (nf * c, ncn * c))
    if not be.is_gpu:
        A.has_canonical_format = True                 # distinct parents, sorted (the twins: tests)
    return A


def _write_hanging_entries(xp, C, rows_c, ip, cnt, c, it, indices, data):
    """The entries of the rows with a hanging parent (``C``: one row per fine row ``rows_c``)
    written at their places in the DoF rows."""
    e_row = csr_entry_rows(C.indptr, C.nnz)      # C's row of each entry
    fr = xp.take(rows_c, e_row)                   # its fine row
    at = xp.take(ip, fr) * c + (xp.arange(C.nnz, dtype=xp.int64) - xp.take(C.indptr, e_row))
    for r in range(c):
        if r:
            at += xp.take(cnt, fr)
        indices[at] = C.indices.astype(it, copy=False) * it(c) + it(r)
        data[at] = C.data


def _dof_indptr(xp, ip, cnt, nf, c, nnz, it):
    """The DoF row pointer from the node row pointer ``ip`` and counts ``cnt`` (the c copies
    of node row i: ``c ip_i + r cnt_i``)."""
    if c == 1:
        return ip.astype(it)
    indptr = xp.empty(nf * c + 1, dtype=it)
    D = indptr[:-1].reshape(nf, c)
    D[:, 0] = ip[:-1] * c
    for r in range(1, c):
        D[:, r] = D[:, r - 1] + cnt
    indptr[-1] = nnz
    return indptr


def _hanging_parent_rows(be, cplx, H, hanging, ncn, coarse_free):
    r"""The rows of :math:`Z_f \chi H Z_c` whose coarse parents include hanging nodes, on
    ``be``: those fine rows (sorted) and their entries as a canonical CSR matrix with one row
    each (``len(rows) x ncn``: no work or memory in the number of fine rows).

    ``cplx``: per kind k, (the rows, their sorted column codes (n, 2^k) -- ``ncn``: masked
    out, ``ncn + 1 + node``: hanging --, the weight 2^-k, or one weight per row); every parent is expanded to its
    parents in H (a regular node to itself, weight 1: :func:`~adaptmg.fe.congruence._parents`
    on the hanging rows of ``H``), the coarse mask applied (the rows are free: the fine mask
    dropped the others before) and the duplicates summed by COO -> CSR.  ``coarse_free``: a
    host mask or None."""
    xp = be.xp
    rows = xp.sort(xp.concatenate([rr for rr, _, _ in cplx]))       # distinct
    r = xp.concatenate([xp.repeat(rr, cc.shape[1]) for rr, cc, _ in cplx])
    code = xp.concatenate([cc.ravel() for _, cc, _ in cplx])
    w = xp.concatenate([xp.full(cc.size, wk) if np.ndim(wk) == 0 else xp.repeat(wk, cc.shape[1])
                        for _, cc, wk in cplx])
    keep = xp.flatnonzero(code != ncn)                 # masked-out regular parents: nothing
    r, code, w = r.take(keep), code.take(keep), w.take(keep)      # (one read, not one per array)
    node = xp.where(code > ncn, code - (ncn + 1), code).astype(xp.int64)
    (hp_ptr, hp_idx, hp_w), _, rank = _hanging_rows(be, H, _index_array(hanging), ncn)
    own, c, wh = _parents(be, node, rank, hp_ptr, hp_idx, hp_w)
    r, v = r[own], w[own] * wh
    ok = v != 0
    if coarse_free is not None:
        ok &= xp.take(be.asarray(coarse_free), c)
    it = xp.int32 if max(rows.shape[0], ncn) < 2**31 - 1 else xp.int64      # cuSPARSE's usual indices
    ok = xp.flatnonzero(ok)
    q = xp.searchsorted(rows, r.take(ok)).astype(it)  # compact row
    C = be.sparse.coo_matrix((v.take(ok), (q, c.take(ok).astype(it))), shape=(rows.shape[0], ncn)).tocsr()
    C.sum_duplicates()                                 # sorted, summed (positive: no zeros)
    return rows, C


def _interpolation_q1_conforming(coarse: Space, fine: Space):
    """chi of :func:`interpolation_matrix` for Q1 between meshes of one forest whose coarse mesh
    has no hanging nodes, from the forest's node parents (:func:`_q1_forest_csr` without masks
    and H); None when that does not apply (the caller takes the general path, which also
    reports meshes that are not one refinement apart).  A coarse hanging node that is a
    fine node has the row e_j here but the interpolation from its coarse cell in the
    general path: the two differ, their products with H (:func:`prolongation`) do not."""
    if coarse.mesh.num_hanging_nodes:
        return None
    return _q1_forest_csr(coarse, fine)


def prolongation(coarse: Space, fine: Space, coarse_free=None, fine_free=None, nodes=None,
                 cells=None, backend=None):
    """P = Z_f (chi kron I_c) H_c Z_c on DoFs; ``*_free`` are boolean masks of free DoFs
    (default: all non-hanging DoFs).  ``nodes``, ``cells``: only the rows of the DoFs of the
    fine nodes ``nodes`` (node-major, as the DoF numbering), from the fine cells ``cells``
    (:func:`interpolation_matrix`).  ``backend`` (default: the CPU): the backend of the
    result; Q1 between meshes of one forest, with masks that free or fix whole nodes, is built
    there (:func:`_q1_forest_csr`: on the GPU without a host CSR, the components written
    straight into ``P``), the other cases on the host and moved.  Spaces on a mesh on the GPU
    (:attr:`adaptmg.Mesh.backend`): masks on the device, ``P`` built there (default backend:
    the mesh's), the host fallback a ValueError."""
    if coarse.components != fine.components:
        raise ValueError(f"component counts differ: {coarse.components} vs {fine.components}")
    c = fine.components
    on_dev = fine.mesh.backend.is_gpu                 # a device mesh: masks and P live there
    xp = fine.mesh.backend.xp
    if on_dev:                                        # default: the mesh's backend
        backend = fine.mesh.backend if backend is None else get_backend(backend)
        if not backend.is_gpu:
            raise ValueError("prolongation: the spaces' mesh lives on the GPU; pass backend='gpu' "
                             "or use spaces on mesh.to('cpu')")
    zf = ~fine.is_hanging if fine_free is None else xp.asarray(fine_free).astype(bool, copy=False)
    zc = ~coarse.is_hanging if coarse_free is None else xp.asarray(coarse_free).astype(bool, copy=False)
    if fine.degree == 1 and nodes is None and cells is None:
        if zf.shape != (fine.num_dofs,) or zc.shape != (coarse.num_dofs,):
            raise ValueError(f"free masks must have shapes ({fine.num_dofs},) and ({coarse.num_dofs},), "
                             f"got {zf.shape} and {zc.shape}")
        zfn, zcn = zf.reshape(-1, c), zc.reshape(-1, c)
        # masks of whole nodes (Dirichlet on all components): P = (Z_f chi H_n Z_c)_nodes (x) I_c
        if c == 1 or (bool((zfn == zfn[:, :1]).all()) and bool((zcn == zcn[:, :1]).all())):
            P = _q1_forest_csr(coarse, fine, zfn[:, 0], zcn[:, 0],
                               coarse.H_nodes if coarse.hanging_nodes.size else None, backend=backend,
                               components=c)
            if P is not None:                        # Z_f chi H Z_c in one pass: no product, no mask
                return P
    if on_dev:                                        # the general path on the device
        if nodes is not None or cells is not None:
            raise ValueError("prolongation: nodes= / cells= take spaces on a host mesh; use mesh.to('cpu')")
        chi = kron_identity(backend, _interpolation_on(backend, coarse, fine), c)
        P = (chi @ coarse.H).tocsr() if coarse.hanging_nodes.shape[0] else chi
        P.sum_duplicates()                             # canonical (SpGEMM's flags unknown)
        P = mask_rows_cols(P, zf, zc, drop_zeros=True)
        P.sort_indices()
        return P
    be = None if backend is None else get_backend(backend)
    if be is not None and be.is_gpu:
        return be.asmatrix(prolongation(coarse, fine, zc, zf, nodes, cells))
    chi = interpolation_matrix(coarse, fine, nodes, cells)
    if c > 1:
        chi = sp.kron(chi, sp.identity(c), format="csr")
    P = chi @ coarse.H if coarse.hanging_nodes.size else chi
    if nodes is not None:
        zf = zf.reshape(-1, c)[np.asarray(nodes, dtype=np.int64)].ravel()
    P = mask_rows_cols(P, zf, zc, drop_zeros=True)     # = mask, then eliminate_zeros()
    P.sort_indices()                                 # no-op for sorted input (flag carried over)
    return P
