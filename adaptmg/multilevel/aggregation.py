r"""Smoothed-aggregation building blocks, written once against a backend's ``xp`` / ``sparse``.

Every function here takes a :class:`~adaptmg.backend.Backend` and works on its arrays
(NumPy / SciPy on the host, CuPy / cupyx on the device) with whole-array operations:
no Python loop over rows, nodes or aggregates (loops run over Luby rounds of the
independent-set search and over the ``k <= 12`` near-nullspace columns).  The same
code is what :func:`adaptmg.amg` runs on the GPU (``setup="device"``), and on the CPU
when asked for; the tests run it with NumPy.

Strength of connection (:func:`strength`).  Symmetric, as pyamg's ``'symmetric'``:
:math:`j \ne i` is a strong neighbour of :math:`i` when
:math:`|a_{ij}| \ge \theta \sqrt{|a_{ii} a_{jj}|}` (``theta = 0`` keeps every
non-zero).  For systems the test is applied to the *node* matrix whose entries are
the Frobenius norms of the DoF blocks between two nodes
(:math:`N = \sqrt{E^T (A \circ A) E}`, ``E`` the DoF -> node incidence), so all
components of a node are aggregated together.  A DoF whose row has no off-diagonal
non-zero (a Dirichlet or hanging-node row ``s e_i^T`` of a constrained matrix) is
isolated and never aggregated: its row of the prolongator is zero and the smoother
alone solves it.

Aggregation (:func:`aggregate`): distance-2 maximal independent sets by Luby rounds
(Bell, Dalton, Olson, SIAM J. Sci. Comput. 34 (2012) C123).  Each node carries the key
``(state, priority, weight, index)`` packed into one int64 -- state 2 = root, 1 =
undecided, 0 = not a root; the priority prefers nodes with few undecided neighbours; the
weight is a hash of (index, seed), so the result is deterministic and the same on the
host and on the device.  A round takes twice the maximum of the keys over ``{i} U N(i)``
(one CSR pass each, :func:`csr_rowmax`); an undecided node that sees its own key becomes
a root, one that sees a root's key stops being a candidate.  Roots are at distance >= 3
from each other and every node is within distance 2 of a root.  Each root opens an
aggregate with its neighbours (a node has at most one root within distance 1).  Two more
such passes run on the nodes still free (candidates: at least half of their neighbours
free), then every free node joins the neighbouring aggregate it is most strongly
connected to.  On the finest level :func:`adaptmg.amg` grows the first independent set
as advancing fronts from sparse seeds instead (:func:`_mis2_front`): random-order roots
leave gaps that the later passes fill with aggregates 4-5 nodes wide, and on a
structured grid those cost what the random order saves in rounds (2-D Q1 box 512^2
below one geometric level: 11 CG iterations, 9 with the fronts, 8 with pyamg's
sequential lattice; the geometric hierarchy of the refined box: 6).

Tentative prolongator (:func:`tentative`).  For the ``k`` near-nullspace columns
``B`` restricted to aggregate ``a`` (``B_a = Q_a R_a``), ``T`` holds ``Q_a`` in the
aggregate's rows and columns ``a k .. a k + k - 1``, so ``T`` has orthonormal columns
and ``T B_c = B`` on aggregated DoFs with the coarse near-nullspace ``B_c`` = the
stacked ``R_a``.  The QR factorisations of all aggregates run at once by modified
Gram-Schmidt with one re-orthogonalisation, the per-aggregate inner products being
segment sums (``bincount`` with weights).  Columns that an aggregate cannot support
(a rigid rotation on a two-node aggregate in 3-D) are dropped, so no coarse row is zero.

Prolongation smoothing and Galerkin product (in :mod:`adaptmg.multilevel.amg`):
``P = (I - omega/rho D^{-1} A) T`` with ``rho`` = :func:`spectral_radius` of
``D^{-1} A`` and ``A_c = R A P``, ``R = P^T``, by sparse matrix products.
"""
from __future__ import annotations

import functools

import numpy as np

from ..backend import csr_from_arrays, to_host
from ..fe.csr_ops import csr_diagonal

__all__ = ["csr_rowmax", "neighbour_max", "strength", "node_graph", "isolated_dofs", "aggregate", "tentative",
           "spectral_radius", "node_hash"]

# packed int64 keys, high to low: state (2 bits) | priority (8) | hash weight (21) | index (31)
_IDX_BITS = 31
_W_BITS = 21
_P_BITS = 8
_IDX_MASK = (1 << _IDX_BITS) - 1
_P_SHIFT = _IDX_BITS + _W_BITS
_STATE_SHIFT = _P_SHIFT + _P_BITS


# ----------------------------------------------------------------------------- kernels
@functools.lru_cache(maxsize=None)
def _rowmax_kernel(xp):
    """CuPy ``ElementwiseKernel`` ``adaptmg_csr_rowmax``: ``out_i = max(init_i, vals_k)`` over
    the stored entries ``k`` of row ``i`` (one thread per row)."""
    return xp.ElementwiseKernel(
        "raw I indptr, raw int64 vals, int64 init", "int64 out",
        """
        long long m = init;
        for (I k = indptr[i]; k < indptr[i + 1]; ++k) {
            const long long v = vals[k];
            m = v > m ? v : m;
        }
        out = m;
        """,
        "adaptmg_csr_rowmax")


def csr_rowmax(be, indptr, vals, init):
    """``out_i = max(init_i, max_{k in row i} vals_k)`` for a CSR row pointer and int64 entry
    values ``vals`` (one per stored entry).

    GPU: one pass over the rows (``adaptmg_csr_rowmax``); its NumPy twin is
    ``np.maximum.reduceat`` over the non-empty rows.
    """
    return csr_row_reduce(be, indptr, vals, init, np.maximum, _rowmax_kernel, np.int64)


def csr_row_reduce(be, indptr, vals, init, ufunc, kernel, dtype):
    """``out_i = ufunc(init_i, ufunc-reduction of row i's vals)`` for an associative NumPy
    ``ufunc`` whose device twin is ``kernel(xp)`` (a kernel over the rows with arguments
    ``(indptr, vals, init, out)``, ``out`` of ``dtype``): the one row-reduction of
    :func:`csr_rowmax` and of the colouring's :func:`~adaptmg.multilevel.coloring.csr_rowor`."""
    xp = be.xp
    if be.is_gpu:
        out = xp.empty(init.shape[0], dtype=dtype)
        kernel(xp)(indptr, vals, init, out)
        return out
    out = init.copy()
    if vals.size:
        rows = np.flatnonzero(np.diff(indptr))            # reduceat needs non-empty segments
        out[rows] = ufunc(out[rows], ufunc.reduceat(vals, indptr[rows]))
    return out


def neighbour_max(be, G, key):
    """``max(key_i, max_{j in N(i)} key_j)`` over the graph ``G`` (CSR pattern)."""
    return csr_rowmax(be, G.indptr, key[G.indices], key)


def _coo_rows(be, M):
    """Row index of every stored entry of CSR ``M`` (in storage order)."""
    return M.tocoo().row


def _csr(be, data, indices, indptr, shape):
    return csr_from_arrays(be.sparse, data, indices, indptr, shape)


def _indptr_from_counts(be, counts):
    xp = be.xp
    indptr = xp.zeros(counts.shape[0] + 1, dtype=xp.int32)
    indptr[1:] = xp.cumsum(counts)
    return indptr


# ----------------------------------------------------------------------------- strength
def node_graph(be, A, dof_node, num_nodes):
    """Node matrix ``N_ab = ||A[dofs of a, dofs of b]||_F`` (``E^T (A o A) E``, entry-wise sqrt)."""
    xp = be.xp
    n = A.shape[0]
    E = _csr(be, xp.ones(n, dtype=A.dtype), dof_node.astype(xp.int32),
             xp.arange(n + 1, dtype=xp.int32), (n, num_nodes))
    A2 = A.copy()
    A2.data = A2.data * A2.data
    N = (E.T.tocsr() @ A2 @ E).tocsr()
    N.sum_duplicates()
    N.data = xp.sqrt(N.data)
    return N


def strength(be, A, theta=0.0):
    """Strong-neighbour graph of ``A`` (CSR, diagonal removed, values ``|a_ij|``).

    ``j != i`` is kept when ``a_ij != 0`` and ``|a_ij| >= theta sqrt(|a_ii a_jj|)``.
    The result is symmetric when ``A`` is.
    """
    xp = be.xp
    n = A.shape[0]
    A = A.tocsr()
    A.sum_duplicates()
    rows = _coo_rows(be, A)
    cols = A.indices
    v = xp.abs(A.data)
    keep = (rows != cols) & (v != 0)
    if theta > 0:
        d = xp.abs(csr_diagonal(A))
        keep &= v >= theta * xp.sqrt(d[rows] * d[cols])
    counts = xp.bincount(rows[keep], minlength=n)
    return _csr(be, v[keep], cols[keep].astype(xp.int32), _indptr_from_counts(be, counts), (n, n))


def isolated_dofs(be, A):
    """Mask of rows of ``A`` without an off-diagonal non-zero (identity rows of constraints)."""
    xp = be.xp
    rows = _coo_rows(be, A)
    off = (rows != A.indices) & (A.data != 0)
    return xp.bincount(rows[off], minlength=A.shape[0]) == 0


# ----------------------------------------------------------------------------- aggregation
def node_hash(be, n, seed, bits=_W_BITS):
    """Deterministic pseudo-random weights in ``[0, 2^bits)`` for nodes ``0..n-1`` (splitmix64 of
    index and seed): the same numbers on the host and on the device."""
    xp = be.xp
    u = np.uint64
    z = xp.arange(n, dtype=xp.uint64) + u((int(seed) * 0x9E3779B97F4A7C15 + 0x632BE59BD9B4E019)
                                          % (1 << 64))
    z = z * u(0x9E3779B97F4A7C15)
    z = (z ^ (z >> u(30))) * u(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> u(27))) * u(0x94D049BB133111EB)
    z = z ^ (z >> u(31))
    return (z >> u(64 - bits)).astype(xp.int64)


def _subgraph(be, G, keep):
    """The graph ``G`` restricted to the nodes ``keep`` (edges with both ends kept)."""
    xp = be.xp
    rows = G.tocoo().row
    m = keep[rows] & keep[G.indices]
    counts = xp.bincount(rows[m], minlength=G.shape[0])
    return _csr(be, G.data[m], G.indices[m], _indptr_from_counts(be, counts), G.shape)


def _mis2(be, G, wkey, cand):
    """Roots of a distance-2 maximal independent set of the candidates ``cand`` in ``G``.

    Luby rounds on the packed keys ``(state, priority, weight, index)``; non-candidates
    relay the maxima (state 0) but never become roots.  The priority prefers nodes with
    few undecided neighbours -- those at the front of the regions already decided -- so
    that new roots pack against the earlier ones (as a sequential greedy search does)
    instead of leaving gaps.  A round decides at least the undecided node of largest key,
    so the loop ends.
    """
    xp = be.xp
    ones = _csr(be, xp.ones(G.indices.shape[0], dtype=xp.float64), G.indices, G.indptr, G.shape)
    cap = (1 << _P_BITS) - 1
    state = xp.where(cand, 1, 0).astype(xp.int64)
    while True:
        und = state == 1
        if not bool(und.any()):
            break
        free_nb = xp.minimum((ones @ und.astype(xp.float64)).astype(xp.int64), cap)
        key = (state << _STATE_SHIFT) | ((cap - free_nb) << _P_SHIFT) | wkey
        m = neighbour_max(be, G, neighbour_max(be, G, key))
        state = xp.where(und & (m == key), 2, state)
        state = xp.where(und & ((m >> _STATE_SHIFT) == 2), 0, state)
    return state == 2


def _mis2_front(be, G, wkey, cand, density=1.0, tail=0.1):
    r"""Roots of a distance-2 maximal independent set of ``cand`` grown from sparse seeds.

    The sequential greedy search of pyamg packs roots at distance exactly 3 from the earlier
    ones (on a structured grid: the lattice of 3x3 aggregates, whose smoothed prolongator is
    the linear interpolation); Luby rounds with random keys scatter the roots instead.  Here
    round 0 takes as candidates only the *seeds*: the candidates whose hash weight lies in
    the lowest fraction ``density / s^3`` of its range, ``s`` = 1 + the mean degree of the
    candidates (an aggregate's size), i.e. one seed per ``s^2`` aggregates -- a patch some
    9 aggregates across for the 9-point (2-D) and 27-point (3-D) graphs of Q1 (at least one
    seed).  Every later round takes only the *front*: undecided
    candidates with decided nodes within distance 2, ranked by
    :math:`p = ((I+G)^2 d)_i` (``G``'s pattern, ``d`` the indicator of decided nodes), so a
    node that packs tightly against the decided region wins.  Roots are found as in
    :func:`_mis2` (maximum key over ``{i} U N(i)`` twice); the nodes within distance 2 of the
    new roots are decided in the same round.  Once at most ``tail`` of the candidates are
    undecided (the seams where fronts meet), or no front node is left, every undecided
    candidate competes.  Per round: two SpMVs with ``G``'s pattern, four row maxima and two
    scalars to the host; the number of rounds (measured: 12-25 for Q1 in 2-D and 3-D)
    grows with the patch width, not with the size of the graph.  Fewer seeds leave fewer
    seams between the patches' lattices but need more rounds.
    """
    xp = be.xp
    n = G.shape[0]
    ones = _csr(be, xp.ones(G.indices.shape[0], dtype=xp.float64), G.indices, G.indptr, G.shape)
    cap = (1 << (_P_BITS + 2)) - 1                 # the priority takes the state bits' place too
    n0 = int(cand.sum())
    if n0 == 0:
        return xp.zeros(n, dtype=bool)
    size = 1.0 + int(xp.diff(G.indptr)[cand].sum()) / n0
    h = xp.where(cand, wkey >> _IDX_BITS, 1 << _W_BITS)
    seeds = cand & (h <= max(int(h.min()), int(density / size ** 3 * (1 << _W_BITS)) - 1))
    und = cand.copy()
    root = xp.zeros(n, dtype=bool)
    first = True
    while True:
        nu = int(und.sum())
        if nu == 0:
            break
        dec = (~und).astype(xp.float64)
        c1 = dec + ones @ dec
        prio = xp.minimum((c1 + ones @ c1).astype(xp.int64), cap)
        if nu <= tail * n0:
            c = und
        else:
            c = und & (seeds if first else prio > 0)
            if not bool(c.any()):               # no seed / no front left in what remains
                c = und
        first = False
        key = xp.where(c, (prio << _P_SHIFT) | wkey, -1)
        m = neighbour_max(be, G, neighbour_max(be, G, key))
        new = c & (m == key)
        root |= new
        near = neighbour_max(be, G, neighbour_max(be, G, new.astype(xp.int64)))
        und &= near == 0
    return root


def _join_strongest(be, G, agg, left):
    """For each node in ``left``: the aggregate it is most strongly connected to (sum of
    ``G``'s weights to the aggregate's nodes, ties to the lower aggregate number), or -1."""
    xp, sparse = be.xp, be.sparse
    n = G.shape[0]
    rows = G.tocoo().row
    m = left[rows] & (agg[G.indices] >= 0)
    num = int(agg.max()) + 1
    C = sparse.coo_matrix((G.data[m].astype(xp.float64), (rows[m], agg[G.indices[m]])),
                          shape=(n, num)).tocsr()
    C.sum_duplicates()
    w = C.data.astype(xp.float32).view(xp.int32).astype(xp.int64)    # order of positive floats
    key = (w << 32) | ((1 << 31) - 1 - C.indices.astype(xp.int64))
    best = csr_rowmax(be, C.indptr, key, xp.full(n, -1, dtype=xp.int64))
    return xp.where(best >= 0, (1 << 31) - 1 - (best & 0xFFFFFFFF), -1)


def aggregate(be, G, seed=0, exclude=None, phases=3, fraction=0.5, front=None):
    """Aggregates of the nodes of the symmetric strength graph ``G`` (CSR, no diagonal).

    Phase 1: the roots of a distance-2 maximal independent set (random order from
    ``seed``; with ``front`` a seed density, grown from sparse seeds as advancing fronts,
    :func:`_mis2_front`) and their neighbours.  Phases 2..``phases``: among the nodes still free,
    those with at least ``fraction`` of their neighbours free are candidates for a
    distance-2 independent set in the graph of free nodes; its roots open aggregates with
    their free neighbours.  Then every free node joins the neighbouring aggregate it is
    most strongly connected to (repeated while that makes progress); what is left forms
    aggregates of its own.

    The later phases fill the gaps that a random-order independent set leaves between its
    roots (a lexicographic one, as pyamg's sequential aggregation finds on a structured grid,
    packs them densely but needs O(sqrt n) Luby rounds): on pyamg's 2-D Poisson problem CG
    with a V(1,1) Chebyshev cycle needs 11 iterations with them and 14 without (pyamg's own
    aggregation: 10).  The advancing fronts (``front=1, phases=3, fraction=0``, what
    :func:`adaptmg.amg` uses on its finest level) pack most roots on the distance-3
    lattice that the sequential search finds on structured grids; the random order leaves
    aggregates 4-5 nodes wide, and these cost iterations: with hand-made tilings of the
    2-D Q1 box 512^2 below one geometric level, the 3x3 lattice needs 8 CG iterations, the
    same lattice with one band of 4-wide (5-wide) aggregates through the middle 10 (12),
    with one band 1 or 2 nodes wide still 8 (``tests/multilevel/test_amg.py``).

    Returns ``(agg, num_aggregates)``: ``agg[i]`` is the aggregate of node ``i`` (``-1`` for
    nodes without neighbours and ``exclude``-d ones).
    """
    xp = be.xp
    n = G.shape[0]
    if n >= 1 << _IDX_BITS:
        raise ValueError(f"aggregate: at most 2^{_IDX_BITS} - 1 nodes, got {n}")
    wkey = (node_hash(be, n, seed) << _IDX_BITS) | xp.arange(n, dtype=xp.int64)
    deg = xp.diff(G.indptr)
    lone = deg == 0
    if exclude is not None:
        lone = lone | exclude
        G = _subgraph(be, G, ~exclude)
        deg = xp.diff(G.indptr)
    agg = xp.full(n, -1, dtype=xp.int64)
    num = 0
    free = ~lone
    for ph in range(phases):
        if ph == 0:
            H, cand = G, free
        else:
            H = _subgraph(be, G, free)
            cand = free & (xp.diff(H.indptr) >= fraction * deg) & (xp.diff(H.indptr) > 0)
        if ph == 0 and front is not None:
            roots = _mis2_front(be, H, wkey, cand, front)
        else:
            roots = _mis2(be, H, wkey, cand)
        nr = int(roots.sum())
        if nr == 0:
            break
        agg = xp.where(roots, num + xp.cumsum(roots) - 1, agg)
        num += nr
        m1 = neighbour_max(be, H, xp.where(roots, wkey, -1))     # the one root among the neighbours
        take = free & ~roots & (m1 >= 0)
        agg = xp.where(take, agg[xp.where(m1 >= 0, m1 & _IDX_MASK, 0)], agg)
        free = free & (agg < 0)
        if not bool(free.any()):
            break
    while num and bool(free.any()):
        best = _join_strongest(be, G, agg, free)
        took = best >= 0
        if not bool(took.any()):
            break
        agg = xp.where(took, best, agg)
        free = free & ~took
    if bool(free.any()):                                   # no aggregated neighbour at all
        extra = xp.flatnonzero(free)
        agg[extra] = num + xp.arange(extra.size, dtype=xp.int64)
        num += int(extra.size)
    return agg, num


# ----------------------------------------------------------------------------- tentative P
def tentative(be, agg, num_agg, B, drop_tol=1e-8):
    """Tentative prolongator ``T`` (CSR, orthonormal columns per aggregate) and coarse ``B_c``.

    ``agg``: aggregate of each DoF (``-1``: not aggregated, zero row of ``T``); ``B``: (n, k).
    Returns ``(T, Bc, col_agg)`` with ``col_agg`` the aggregate of each coarse DoF.  Column
    ``j`` of aggregate ``a`` is kept when its norm after orthogonalisation is above
    ``drop_tol`` times its norm before.
    """
    xp = be.xp
    n, k = B.shape
    inagg = agg >= 0
    a = xp.where(inagg, agg, 0)
    w_in = inagg.astype(B.dtype)

    def segsum(v):
        return xp.bincount(a, weights=v * w_in, minlength=num_agg)

    Q = xp.empty((n, k), dtype=B.dtype)
    R = xp.zeros((num_agg, k, k), dtype=B.dtype)
    keep = xp.zeros((num_agg, k), dtype=bool)
    for j in range(k):
        v = B[:, j] * w_in
        n0 = xp.sqrt(segsum(v * v))
        for _ in range(2):                      # MGS, then once more (CGS2-like stability)
            for i in range(j):
                r = segsum(Q[:, i] * v)
                R[:, i, j] += r
                v = v - r[a] * Q[:, i]
        nrm = xp.sqrt(segsum(v * v))
        ok = (nrm > drop_tol * n0) & (n0 > 0)
        keep[:, j] = ok
        R[:, j, j] = xp.where(ok, nrm, 0.0)
        scale = xp.where(ok, 1.0 / xp.where(ok, nrm, 1.0), 0.0)
        Q[:, j] = v * scale[a]
    keepf = keep.reshape(-1)
    colid = xp.cumsum(keepf) - 1                       # compressed column of (aggregate, j)
    nc = int(keepf.sum())
    mask = keep[a] & inagg[:, None]                    # (n, k): entry (i, j) of T is stored
    cols = colid.reshape(num_agg, k)[a]
    counts = mask.sum(axis=1)
    T = _csr(be, Q[mask], cols[mask].astype(xp.int32), _indptr_from_counts(be, counts), (n, nc))
    Bc = R.reshape(num_agg * k, k)[keepf]
    col_agg = xp.repeat(xp.arange(num_agg, dtype=xp.int64), k)[keepf]
    return T, Bc, col_agg


# ----------------------------------------------------------------------------- spectral radius
def spectral_radius(be, A, dinv, steps=12, seed=0):
    r"""Largest eigenvalue of ``D^{-1} A`` (``A`` SPD) by ``steps`` Lanczos steps on
    ``D^{-1/2} A D^{-1/2}`` with full re-orthogonalisation, on the backend's arrays.

    The Lanczos coefficients stay on the device until the end (one transfer of
    ``2 steps`` numbers); returns the largest Ritz value (a lower bound that converges
    fast for the top of the spectrum).
    """
    xp = be.xp
    n = A.shape[0]
    m = int(min(steps, n))
    s = xp.sqrt(dinv)
    v = node_hash(be, n, seed + 12345, bits=30).astype(dinv.dtype) - float(1 << 29)
    V = xp.zeros((m + 1, n), dtype=dinv.dtype)
    V[0] = v / xp.linalg.norm(v)
    alpha = xp.zeros(m, dtype=dinv.dtype)
    beta = xp.zeros(m, dtype=dinv.dtype)
    tiny = xp.asarray(1e-300, dtype=dinv.dtype)
    for j in range(m):
        w = s * (A @ (s * V[j]))
        alpha[j] = V[j] @ w
        Vj = V[: j + 1]
        w = w - Vj.T @ (Vj @ w)
        w = w - Vj.T @ (Vj @ w)
        beta[j] = xp.linalg.norm(w)
        V[j + 1] = w / xp.maximum(beta[j], tiny)
    alpha = np.asarray(to_host(alpha), dtype=np.float64)
    beta = np.asarray(to_host(beta), dtype=np.float64)
    k = m
    for j in range(m - 1):
        if beta[j] <= 1e-12 * max(abs(alpha[j]), 1e-300):
            k = j + 1
            break
    T = np.diag(alpha[:k]) + np.diag(beta[: k - 1], 1) + np.diag(beta[: k - 1], -1)
    return float(np.linalg.eigvalsh(T)[-1])
