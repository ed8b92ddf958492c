r"""Owned rows of a Q1 scalar matrix, assembled on the distributed forest's local mesh.

:class:`~.forest.DistributedForest` gives every rank its owned leaves plus one ghost layer
(:attr:`~.forest.DistributedForest.mesh`) and global node ids.  A node ``i`` is *owned* by
the lowest rank among the leaves having it as a vertex, so every leaf with vertex ``i`` is
local to its owner.

Unconstrained rows (:func:`owned_rows`).  Row ``i`` of :math:`A = \sum_K P_K^T A_K P_K`
(``assemble(Space(mesh))``) sums the element matrices of the leaves with vertex ``i``: all
local, so the owner assembles its local mesh (owned + ghost leaves) and keeps the rows of
its owned nodes, columns renamed to global ids.  No communication.

Constrained rows (:func:`owned_constrained_rows`), the conventions of
:mod:`adaptmg.fe.constraints` and :mod:`.local`:

.. math::  K = Z H^T A H Z + s (I - Z), \qquad
           H^T A H = \sum_K (P_K H)^T A_K (P_K H),

``Z`` the 0/1 diagonal of the free nodes (neither hanging nor Dirichlet), ``s`` the mean of
:math:`|(H^T A H)_{ii}|` over the free nodes.  Row ``i`` of :math:`H^T A H` also needs the
leaves around a hanging node whose parent is ``i``; those need not be local to ``i``'s owner
(one ghost layer is not enough).  So each rank forms the congruence of its *owned* leaves
only, :math:`C_p = E_p^T A_p E_p` with :math:`E_p` the rows of ``H`` of its owned leaves'
vertices in global columns (a hanging vertex's coarse leaf is a ghost: its parents and
weights are local; the 2:1 rule over shared vertices, which :meth:`~.forest.DistributedForest.refine`
keeps, leaves no parent hanging), so that :math:`\sum_p C_p = H^T A H`; masks the non-free rows and
columns (Dirichlet status of the columns pulled from their owners: one request and one
reply ``Alltoallv``), keeps its owned rows and sends the entries of the others (the rows of
nodes on its cut) to their owners (one ``Alltoallv``), where duplicates are summed.  ``s``: one ``Allreduce`` of a sum and a count.  Every leaf
is assembled once over all ranks.

The constrained load (:func:`owned_constrained_load`) is built the same way, the Dirichlet
values ``g`` lifted with each rank's owned leaves' matrix: :math:`f = Z H^T (b - A H g) + s g`.

Vectorised, Q1 scalar (``components=1``) only.  On the host (NumPy/SciPy), or with
``backend="gpu"`` on the device: :func:`prepare` finds the local mesh's hanging nodes, ``H``,
the Dirichlet nodes and the expansion there, and the rows and the load are formed there; only
the cut's entries and requests cross to the host.
"""
from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from ..assemble import stiffness
from ..backend import (CPU, backend_of, call_points, csr_from_arrays, get_backend, is_device_sparse, scatter_add,
                       stable_argsort, to_host)
from ..device.congruence_rows import available as rows_available, constrained_congruence
from ..fe.csr_ops import mask_rows_cols, row_positions
from ..fe.space import Space
from ..multilevel.hierarchy import _on_backend, dirichlet_dofs
from .comm import alltoallv
from .forest import DistributedForest, _allsum
from .local import CellSubset, _drop_zeros

__all__ = ["owned_rows", "owned_constrained_rows", "owned_constrained_load", "owned_dirichlet_values",
           "Expansion", "prepare"]


def _check_forest(forest):
    if not isinstance(forest, DistributedForest):
        raise TypeError(f"expected a DistributedForest, got {type(forest).__name__}")


def _assembled(assemble, space, n, keep=False):
    """``assemble(space)``, checked to be ``n x n``, as SciPy CSR (``keep``: a device matrix stays
    there, as CSR)."""
    A = assemble(space)
    if getattr(A, "shape", None) != (n, n):
        raise ValueError(f"assemble(space) must return a {n} x {n} matrix (Q1 scalar), got shape "
                         f"{getattr(A, 'shape', None)}")
    return A.tocsr() if keep and is_device_sparse(A) else sp.csr_matrix(A)


def _global_rows(B, gid, N):
    """CSR (rows of ``B``, N) with the columns of ``B`` renamed by ``gid``, sorted per row."""
    out = sp.csr_matrix((B.data, gid[B.indices], B.indptr), shape=(B.shape[0], N))
    out.sort_indices()
    return out


def owned_rows(forest, assemble=stiffness):
    """The owned rows of the global matrix ``assemble(Space(mesh))`` (Q1 scalar), from the
    local mesh (owned + ghost leaves) only (module doc).

    Returns ``(A_o, gids)``: ``A_o`` a SciPy CSR of shape (owned nodes, global nodes), global
    columns sorted per row; ``gids`` the owned global ids (sorted, one contiguous block): row
    ``r`` of ``A_o`` is global row ``gids[r]``."""
    _check_forest(forest)
    M = forest.mesh
    A = _assembled(assemble, Space(M, 1), M.num_nodes)
    own, gid = forest.owned_nodes, forest.node_gid
    return _global_rows(A[own], gid, forest.num_global_nodes), gid[own]


def _owner_ranges(comm, n_owned):
    """Start of every rank's block of global ids (P + 1 entries)."""
    counts = [n_owned] if comm.Get_size() == 1 else comm.allgather(n_owned)
    return np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)


def _owned_span(want, first, n):
    """``(lo, hi)`` host ints: ``want[lo:hi]`` (sorted) are the ids ``first .. first + n - 1``."""
    xp = backend_of(want).xp
    return tuple(int(i) for i in to_host(xp.searchsorted(want, xp.asarray([first, first + n], dtype=want.dtype))))


def _pull(comm, starts, want, first, values):
    """``values`` (indexed by owned gid - ``first``; host or device) of the global ids ``want``
    (sorted, distinct; moved to ``values``' backend), from their owners: the owned ones taken
    here, the others (through the host) by one request and one reply ``Alltoallv``.  An array of
    ``values``' backend."""
    be = backend_of(values)
    xp = be.xp
    want = be.asarray(want)
    lo, hi = _owned_span(want, first, int(values.shape[0]))
    rest = to_host(xp.concatenate([want[:lo], want[hi:]]))
    dest = np.searchsorted(starts, rest, side="right") - 1
    asked, src = alltoallv(comm, dest, rest, np.full(rest.size, comm.Get_rank(), dtype=np.int64))
    got_ids, got = alltoallv(comm, src, asked, to_host(values[be.asarray(asked - first)]))
    o = np.argsort(got_ids)
    rem = be.asarray(got[o][np.searchsorted(got_ids[o], rest)])
    out = xp.empty(want.size, dtype=values.dtype)
    out[lo:hi] = values[want[lo:hi] - first]
    out[:lo], out[hi:] = rem[:lo], rem[lo:]
    return out


class Expansion:
    """The rows of the local mesh's node-level ``H`` in global columns: ``E`` (local nodes x
    ``u.size``) with column ``k`` the global node ``u[k]`` (``u`` sorted: the global nodes
    the rows reach), ``free_u`` the free status of those columns (from their owners),
    ``starts`` the ranks' blocks of global ids.  Exact for the vertices of owned leaves (a
    hanging vertex's coarse leaf is a ghost: its parents and weights are local).

    Host arrays (SciPy ``E``), or device arrays where :func:`prepare` built it on the GPU
    (``on_device``): then :meth:`on` gives them as they are and :meth:`drop_device` frees them."""

    def __init__(self, u, E, free_u, starts):
        self.u, self.E, self.free_u, self.starts = u, E, free_u, starts
        self.on_device = is_device_sparse(E)
        self._dev = None

    def on(self, be):
        """``(E, E^T, u, free_u)`` on ``be``: the host's own (``E^T`` a transposed view), on the
        device moved up once (or built there) and kept until :meth:`drop_device` -- what the
        rows and the load of a level read."""
        if self.E is None:
            raise RuntimeError("Expansion: its device arrays were dropped (drop_device)")
        if not be.is_gpu:
            if self.on_device:
                raise ValueError("Expansion: built on the device, asked for on the host")
            return self.E, self.E.T, self.u, self.free_u
        if self._dev is None:
            E = self.E if self.on_device else be.asmatrix(self.E)
            self._dev = (E, E.T.tocsr(), be.asarray(self.u), be.asarray(self.free_u))
        return self._dev

    def drop_device(self):
        """Free the device arrays (a coarse level's, once its transfer is built): the copies, or
        for an expansion built on the device the arrays themselves (``starts`` stays)."""
        self._dev = None
        if self.on_device:
            self.u = self.E = self.free_u = None

    def masked(self, be=CPU):
        """``E Z`` on ``be`` (:meth:`on`): the columns of non-free nodes dropped (zeros removed)."""
        E, _, _, z = self.on(be)
        return mask_rows_cols(E, be.xp.ones(E.shape[0], dtype=bool), z, drop_zeros=True)


def _renamed_columns(cols, gid):
    """``np.unique(gid[cols], return_inverse=True)`` for an injective ``gid`` (distinct local
    nodes have distinct global ids): the distinct columns by a mask, their ids sorted (on the
    host a stable sort: the owned ones are one increasing run), each entry's rank by a scatter
    -- a sort of the distinct columns instead of every entry.  Arrays of ``gid``'s backend."""
    xp = backend_of(gid).xp
    hit = xp.zeros(gid.size, dtype=bool)
    hit[cols] = True
    used = xp.flatnonzero(hit)
    g = gid.take(used)
    o = stable_argsort(g)
    rank = xp.empty(gid.size, dtype=np.int64)
    rank[used.take(o)] = xp.arange(used.size)
    return g.take(o), rank.take(cols)


def prepare(forest, dirichlet, backend=CPU):
    r"""``(space, gids, first, free_o, Expansion)`` of the forest's local mesh: its Q1 space, the
    owned global ids (host; one contiguous range), the first of them, the owned nodes' free
    mask (not hanging, not on a Dirichlet face: all faces at an owned node are local) and the
    expansion (collective: one request and one reply for the free status of the columns
    owned elsewhere).

    ``backend`` "gpu": the space is the local mesh's on the device
    (:meth:`~.forest.DistributedForest.local_space`: the mesh moved up once), whose hanging
    nodes, ``H`` and Dirichlet nodes are found there; ``free_o`` and the expansion are device
    arrays (the node ids moved up once), and the host mesh's hanging nodes are never searched
    for.  Only the free status of columns owned elsewhere crosses (the cut)."""
    be = get_backend(backend)
    comm = forest.comm
    space = forest.local_space(be)         # on the GPU: the mesh moved up once, numbered there
    gid, own = forest.node_gid, forest.owned_nodes
    gids = gid[own]
    first = int(gids[0]) if gids.size else 0
    gid_x, own_x = forest._moved("node_gid", be), forest.owned_nodes_on(be)
    M = space.mesh
    xp = be.xp
    fixed = xp.zeros(M.num_nodes, dtype=bool)
    fixed[dirichlet_dofs(space, dirichlet)] = True
    free_o = ~(fixed[own_x] | space.mesh.is_hanging[own_x])
    H = space.H_nodes
    u, inv = _renamed_columns(H.indices, gid_x)           # the global nodes H reaches
    E = csr_from_arrays(space.backend.sparse, H.data, inv, H.indptr, (M.num_nodes, int(u.size)))
    starts = _owner_ranges(comm, int(gids.size))
    free_u = _pull(comm, starts, u, first, free_o)        # E's columns are never hanging
    return space, gids, first, free_o, Expansion(u, E, free_u, starts)


def owned_dirichlet_values(forest, g, dirichlet="all", prep=None):
    r"""The Dirichlet values of the owned nodes (owned order, zero off the Dirichlet nodes --
    hanging nodes are never Dirichlet nodes: their values follow their parents), as
    :class:`adaptmg.Constraints` sets them: ``g`` a number, or a callable ``g(x)`` of the
    points (k, d) -> (k,) evaluated at the owned Dirichlet nodes of the local mesh (whose
    coordinates equal the serial mesh's); ``g=None`` with a ``{boundary: value}`` spec
    ``dirichlet``: its values (:func:`adaptmg.multilevel.hierarchy.dirichlet_values` on the
    local mesh: every face at an owned node is local).  None when the data are homogeneous
    (``g`` None and no value spec).  No communication.  An array of the space's backend:
    ``prep`` made on the GPU (:func:`prepare`) gives device values, a callable ``g`` then
    gets device points (or host copies where it refuses them:
    :func:`adaptmg.backend.call_points`)."""
    from ..multilevel.hierarchy import dirichlet_values
    _check_forest(forest)
    space, gids, first, free_o, ex = prepare(forest, dirichlet) if prep is None else prep
    xp = space.backend.xp
    own = forest.owned_nodes_on(space.backend)
    dm = dirichlet_owned(forest, free_o, space)
    if g is None:
        full = dirichlet_values(space, dirichlet)
        if full is None:
            return None
        g_o = full[own]
    elif callable(g):
        g_o = xp.zeros(own.size)
        d = xp.flatnonzero(dm)
        v = call_points(g, space.points[own[d]], xp=xp)
        if v.shape != (d.size,):
            raise ValueError(f"g(x) must return one value per point, shape ({d.size},), got {v.shape}")
        g_o[d] = v
    elif np.ndim(g) == 0 and np.isreal(g):
        g_o = xp.where(dm, float(g), 0.0)
    else:
        raise TypeError(f"g must be None, a number or a callable g(x) of the points, got {type(g).__name__}")
    if not bool(xp.isfinite(g_o).all()):
        raise ValueError("Dirichlet values contain NaN or Inf")
    return xp.where(dm, g_o, 0.0)


def dirichlet_owned(forest, free_o, space=None):
    """The owned nodes' Dirichlet mask: neither free nor hanging (``space``: the local mesh's
    space whose hanging nodes to read, on its backend -- :func:`prepare`'s; default the
    forest's host mesh)."""
    M = forest.mesh if space is None else space.mesh
    return ~free_o & ~M.is_hanging[forest.owned_nodes_on(M.backend)]


def owned_constrained_load(forest, f, dirichlet="all", prep=None, g_o=None, A=None, s=None,
                           assemble=stiffness, backend=CPU):
    r"""The owned entries of the constrained load vector (``b`` = :func:`adaptmg.assemble.load`
    of ``f`` on the global mesh), as :func:`owned_constrained_rows` builds the matrix and
    :meth:`adaptmg.Constraints.rhs` the serial one,

    .. math::  f = Z H^T (b - A H g) + s\, g :

    each rank loads its owned leaves only (``b_p``), lifts the Dirichlet values with the
    matrix of its owned leaves, :math:`r_p = b_p - A_p E_p g_u` (``g_u`` the values of the
    global nodes that :math:`E_p` reaches, pulled from their owners: one request and one
    reply; ``E_p g_u = H g`` on the local nodes, hanging ones following their parents),
    forms :math:`E_p^T r_p` in global ids, keeps its owned entries and sends the others to
    their owners (one ``Alltoallv``), where they are summed; non-free entries zero, the
    owned Dirichlet entries ``s g``.

    ``f``: a constant, a callable ``f(x)`` of the points (n, ..., d), or an array with one
    value per owned leaf (curve order); ``prep`` as for :func:`owned_constrained_rows`;
    ``g_o``: the owned nodes' Dirichlet values (:func:`owned_dirichlet_values`; None:
    homogeneous, or a value spec ``dirichlet``), then also the Dirichlet row scale ``s``
    (:func:`owned_constrained_rows`' fourth result) and ``A`` = ``A_p`` (its
    ``return_assembled``; assembled here with ``assemble`` if None).  ``backend`` "gpu": the
    load, the lift and :math:`E_p^T r_p` on the device (the local mesh there, as
    :func:`owned_constrained_rows` has it; a callable ``f`` gets device points), the cut's
    entries through the host; ``b_o`` a device array.  Returns ``(b_o, gids)``."""
    from ..assemble import load
    _check_forest(forest)
    be = get_backend(backend)
    xp = be.xp
    comm = forest.comm
    space, gids, first, free_o, ex = prepare(forest, dirichlet, be) if prep is None else prep
    if be.is_gpu:
        view = CellSubset(forest.local_space(be), forest.owned_cells_on(be))
    else:
        view = CellSubset(space, forest.owned_cells)
    if isinstance(f, np.ndarray) and f.ndim >= 1:
        if f.shape[0] != forest.num_owned:
            raise ValueError(f"f: one value per owned leaf ({forest.num_owned}) expected, got shape {f.shape}")
        f = be.asarray(f)
    if g_o is None:
        g_o = owned_dirichlet_values(forest, None, dirichlet, (space, gids, first, free_o, ex))
    lift = g_o is not None and bool(_allsum(comm, int(bool(g_o.any()))))
    if lift and s is None:
        raise ValueError("owned_constrained_load: non-zero Dirichlet values need the row scale s")
    if np.isscalar(f) and not isinstance(f, (bool, str)) and f == 0:
        b = xp.zeros(space.num_dofs)                      # no source: a zero load, no quadrature
    else:
        b = xp.asarray(load(view, f), dtype=float)
    E, ET, ub, _ = ex.on(be)
    if lift:
        g_u = be.asarray(_pull(comm, ex.starts, ex.u, first, g_o))
        if A is None:
            A = _assembled(_on_backend(assemble, be), view, forest.num_local_nodes, keep=True)
        b = b - A @ (E @ g_u)
    e = ET @ b                                            # E_p^T r_p over u
    lo, hi = _owned_span(ub, first, gids.size)
    out = xp.zeros(gids.size)
    out[ub[lo:hi] - first] = e[lo:hi]
    ur, er = (to_host(xp.concatenate([a[:lo], a[hi:]])) for a in (ub, e))    # the cut's entries
    r, v = alltoallv(comm, np.searchsorted(ex.starts, ur, side="right") - 1, ur, er)
    scatter_add(out, be.asarray(r - first), be.asarray(v))
    out[be.asarray(~free_o)] = 0.0
    if lift:
        d = be.asarray(dirichlet_owned(forest, free_o, space))
        out[d] = s * be.asarray(g_o)[d]
    return out, gids


def owned_constrained_rows(forest, assemble=stiffness, dirichlet="all", prep=None, return_assembled=False,
                           backend=CPU):
    r"""The owned rows of ``K = Z H^T A H Z + s (I - Z)`` (module doc), ``A`` =
    ``assemble(Space(mesh))`` (Q1 scalar), ``dirichlet`` any spec of
    :func:`adaptmg.multilevel.hierarchy.dirichlet_dofs` made of boundary faces (None, "all",
    ids/names, ``where``): each owner decides its own nodes from its local mesh, where every
    face at an owned node is local.

    Returns ``(K_o, gids, free, s)``: ``K_o`` CSR (owned nodes, global nodes), sorted columns,
    explicit zeros dropped; ``gids`` the owned global ids (sorted); ``free`` the owned rows'
    free mask; ``s`` the Dirichlet scale (the same on every rank).  ``prep``: what
    :func:`prepare` returned for this forest and ``dirichlet`` (made here if None).
    ``return_assembled``: also return ``A_p``, the matrix of the owned leaves on the local
    nodes (for lifting Dirichlet values, :func:`owned_constrained_load`).

    ``backend`` "gpu" (a :class:`~adaptmg.backend.Backend` or its name): ``A_p`` assembled on
    the local mesh moved to the device (:meth:`~.forest.DistributedForest.local_space`) and
    :math:`Z E_p^T A_p E_p Z` formed there by the congruence row kernels
    (:func:`adaptmg.device.congruence_rows.constrained_congruence` with the expansion ``E_p``
    as a rectangular ``H``: no SpGEMM), ``K_o`` (and ``A_p``) device CSR.  The forest's host
    data move up once per level (the owned cells, ``E``, ``u``, the free masks:
    :meth:`Expansion.on`); only the entries of rows owned elsewhere (the cut) and three
    numbers come back to the host."""
    _check_forest(forest)
    be = get_backend(backend)
    comm = forest.comm
    space, gids, first, free_o, ex = prepare(forest, dirichlet, be) if prep is None else prep
    N, nn = forest.num_global_nodes, forest.num_local_nodes
    starts = ex.starts
    xp = be.xp
    # C_p = Z E^T A_p E Z over the owned leaves (the rows of non-owned leaves' vertices are
    # never reached: A_p is zero there), rows and columns the global nodes u
    if be.is_gpu:
        dspace = forest.local_space(be)
        A = _assembled(_on_backend(assemble, be), CellSubset(dspace, forest.owned_cells_on(be)), nn,
                       keep=True)
        C = _device_congruence(be, A, ex)
        if not return_assembled:        # its memory back to the pool before the rows are split
            A = None
    else:
        A = _assembled(assemble, CellSubset(space, forest.owned_cells), nn)
        C = (ex.E.T.tocsr() @ A @ ex.E).tocsr()
        C.sort_indices()
        C = mask_rows_cols(C, ex.free_u, ex.free_u)
    # rows of owned nodes: a contiguous block of the sorted u, kept here (columns renamed by
    # the increasing u: rows stay sorted); the others' entries go to their owners
    ub = ex.on(be)[2]
    lo, hi = _owned_span(ub, first, gids.size)
    ip = C.indptr
    cnt = xp.zeros(gids.size, dtype=np.int64)
    cnt[ub[lo:hi] - first] = xp.diff(ip[lo:hi + 1])
    a, b = (int(i) for i in to_host(ip[xp.asarray([lo, hi])]))
    it = np.int32 if N < 2 ** 31 and C.nnz < 2 ** 31 else np.int64
    ptr = xp.zeros(gids.size + 1, dtype=it)
    ptr[1:] = xp.cumsum(cnt)
    B = csr_from_arrays(be.sparse, C.data[a:b], ub[C.indices[a:b]].astype(it), ptr, (gids.size, N))
    # the cut: the entries outside rows lo..hi-1, their rows by a search in the row pointer
    e = xp.concatenate([xp.arange(a, dtype=np.int64), xp.arange(b, int(C.nnz), dtype=np.int64)])
    er = xp.searchsorted(ip, e, side="right") - 1
    rr, cc, vv = (to_host(x) for x in (ub[er], ub[C.indices[e]], C.data[e]))
    r, c, v = alltoallv(comm, np.searchsorted(starts, rr, side="right") - 1, rr, cc, vv)
    if r.size:
        R = be.sparse.coo_matrix((be.asarray(v), (be.asarray(r - first), be.asarray(c))), shape=B.shape).tocsr()
        B = (B + R).tocsr()
    B.sum_duplicates()
    B = _drop_zeros(be, B)
    # s: the mean of |B_ii| over the free owned rows of all ranks (B[i, gids[i]])
    fo = be.asarray(free_o)
    d = 0.0
    if B.nnz:
        pos = row_positions(xp, B.indptr, B.indices, be.asarray(gids))
        d = float((xp.abs(B.data[xp.maximum(pos, 0)]) * ((pos >= 0) & fo)).sum())
    tot = _allsum(comm, np.array([d, float(int(fo.sum()))], dtype=float))
    s = float(tot[0] / tot[1]) if tot[1] > 0 and tot[0] > 0 else 1.0    # local._row_scale's rule
    fx = xp.flatnonzero(~fo)
    if fx.size:                     # the owned ids are one range: gids[fx] = first + fx
        S = be.sparse.coo_matrix((xp.full(fx.size, s), (fx, fx + first)), shape=B.shape)
        B = (B + S.tocsr()).tocsr()
    B.sort_indices()
    return (B, gids, free_o, s, A) if return_assembled else (B, gids, free_o, s)


def _device_congruence(be, A, ex):
    """:math:`Z E^T A E Z` (``u.size`` square, canonical device CSR) of the device ``A`` (local
    nodes) and the expansion ``ex`` (:meth:`Expansion.on`): the congruence row kernels with ``E`` as a
    rectangular ``H``, or, where they do not take the matrices (64-bit indices), cuSPARSE's
    products and a masking pass.  A non-free row's one kernel entry is an explicit zero (the
    scale 0 here: ``s`` is found after the rows are summed over the ranks), dropped later."""
    E, ET, _, z = ex.on(be)
    if rows_available(A, E, ET):
        C, _ = constrained_congruence(A, E, ET, z, scale=lambda d, m: 0.0)
        return C
    C = (ET @ A @ E).tocsr()
    C.sum_duplicates()
    return mask_rows_cols(C, z, z)
