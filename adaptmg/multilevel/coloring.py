r"""Graph colouring of a sparse matrix on the matrix's backend (Jones-Plassmann rounds).

A *colouring* of the (node) graph of ``A`` assigns every node a colour so that
no two nodes of the same colour are coupled: ``a_ij = 0`` (and ``a_ji = 0``)
whenever ``i != j`` have the same colour.  Multicolour Gauss-Seidel relaxes all
rows of one colour at once: they do not read each other's unknowns, so the
simultaneous update is exactly the sequential Gauss-Seidel update within the
colour, and a sweep is one parallel step per colour.

Everything here is written once against a backend's ``xp`` (NumPy on the host,
CuPy on the device, :func:`adaptmg.backend.backend_of` of the matrix): a
colouring of a cupyx matrix runs on the GPU and never copies the matrix to the
host.  No Python loop runs over rows or nodes; loops run over rounds, over
colour classes and over 64-colour words.  All arithmetic is on integers, so the
host and the device produce the *same* colouring for the same seed.

Algorithm (Jones & Plassmann 1993, first-fit variant).  Node ``v`` has the key
``w_v = h(v, seed) 2^31 + v`` with ``h`` a 32-bit splitmix64 hash
(:func:`adaptmg.multilevel.aggregation.node_hash`): pseudo-random, without
ties, the same on both backends.  In each *round* every uncoloured node whose
key exceeds the keys of all its uncoloured neighbours is selected (one CSR
row-max pass, :func:`~adaptmg.multilevel.aggregation.csr_rowmax`); the
selected nodes form an independent set, and each takes the smallest colour not
used by its coloured neighbours (*first fit*: a CSR row-OR of the bit masks
``2^{colour}`` of the neighbours, :func:`csr_rowor`, then the lowest clear
bit).  The rows of coloured nodes are dropped from the round's CSR once the
uncoloured rows hold less than 70 % of its entries (one gather), so a round costs
O(entries of the rows still active).  The loop runs over rounds only: about the
length of the longest key-decreasing path (22 rounds for the 2-D 9-point
stencil on 1.05M nodes, 56 for the 3-D 27-point one on 287k nodes).  A node is
coloured after all its neighbours of larger key and before those of smaller key, so
the result *is* the sequential first-fit (greedy) colouring in decreasing key order,
computed in parallel rounds (the tests check this against a sequential loop).

Iterated greedy (Culberson 1992), ``passes`` times: the colour classes are
visited one after another (reverse order, then largest first, alternately) and
every node of the class takes the smallest colour free among its already
recoloured neighbours.  A class is an independent set, so each step is one
vectorised first fit over the class's rows, and the number of colours never
grows.  Measured (``passes = 4``, seeds 0-4, 10^4 to 10^6 nodes): 2-D 5-point
4 colours, 9-point 7, 3-D 7-point 5, 27-point 14-15 (optimum 2 / 4 / 2 / 8;
Jones-Plassmann alone: 5 / 8 / 6 / 17).  The colour count costs launches, not
work: every sweep touches each row once whatever the count.

Cost on the host, one core of the development machine (process time; the former
host code -- JP with a random permutation, edge lists filtered per round and the
whole edge list scanned for every colour class of every greedy pass -- in
brackets, same colour counts): 2-D Q1 1.05M rows 1.5-1.7 s (3.3-3.6 s), 3-D Q1 287k
rows 1.4-1.5 s (4.8-5.1 s), 3-D Q1 2.1M rows 9.3 s (26.1 s; there SciPy drops the
exactly cancelling face couplings of ``tensor_q1_stiffness``: a 21-point pattern,
10 colours).  On the device a round is a few dozen whole-array kernels (one
``adaptmg_csr_rowmax`` and one ``adaptmg_csr_rowor`` pass among them) and two host
synchronisations.

Block colouring.  With ``block_size = c`` the graph is the *node* graph: DoFs
``c*p .. c*p + c - 1`` form node ``p``, and nodes ``p != q`` are adjacent when
any entry of the ``c x c`` block ``A[p, q]`` or ``A[q, p]`` is stored.
"""
from __future__ import annotations

import functools

import numpy as np

from ..backend import backend_of, is_sparse, repeat, segment_owner, stable_argsort, to_host
from .aggregation import csr_row_reduce, csr_rowmax, node_hash

__all__ = ["node_graph", "color_graph", "color_groups", "check_coloring", "csr_rowor",
           "csr_row_positions"]

_IDX_BITS = 31          # keys: hash (32 bits) above the node index (31 bits)


# ----------------------------------------------------------------------------- kernels
@functools.lru_cache(maxsize=None)
def _rowor_kernel(xp):
    """CuPy ``ElementwiseKernel`` ``adaptmg_csr_rowor``: ``out_i = init_i | vals_k`` over the
    stored entries ``k`` of row ``i`` (one thread per row)."""
    return xp.ElementwiseKernel(
        "raw I indptr, raw uint64 vals, uint64 init", "uint64 out",
        """
        unsigned long long m = init;
        for (I k = indptr[i]; k < indptr[i + 1]; ++k) m |= vals[k];
        out = m;
        """,
        "adaptmg_csr_rowor")


def csr_rowor(be, indptr, vals, init):
    """``out_i = init_i | (OR_{k in row i} vals_k)`` for a CSR row pointer and uint64 entry
    values ``vals`` (one per stored entry, ``vals.size == indptr[-1] - indptr[0]`` rebased).

    GPU: one pass over the rows (``adaptmg_csr_rowor``); its NumPy twin is
    ``np.bitwise_or.reduceat`` over the non-empty rows.
    """
    return csr_row_reduce(be, indptr, vals, init, np.bitwise_or, _rowor_kernel, np.uint64)


def csr_row_positions(be, indptr, rows, nnz):
    """Gather plan of the rows ``rows`` (in that order) of a CSR matrix with row pointer
    ``indptr`` (``nnz`` stored entries), on ``be``: ``(ptr, pos)`` with ``ptr`` (int64, ``len(rows) + 1``) the new row
    pointer and ``pos`` the old position of every new entry, so that ``indices[pos]`` and
    ``data[pos]`` are the rows' entries.

    Entry ``t`` of new row ``q`` is old entry ``t + (indptr[rows[q]] - ptr[q])``: the row
    lengths, their running sum, and that shift repeated over each row's entries (one segmented
    expansion, :func:`adaptmg.backend.repeat`) -- whole-array operations, no loop over
    rows, and no host copy of any array (one scalar read: the number of entries)."""
    xp = be.xp
    start = indptr[rows]
    cnt = indptr[rows + 1] - start
    ptr = xp.zeros(rows.shape[0] + 1, dtype=xp.int64)
    ptr[1:] = xp.cumsum(cnt)
    total = int(ptr[-1])
    # int32 positions when they fit: less traffic
    it = xp.int32 if max(int(nnz), total) < 2**31 - 1 else xp.int64
    if total == 0:
        return ptr, xp.zeros(0, dtype=it)
    shift = (start - ptr[:-1]).astype(it)
    pos = repeat(shift, cnt, total, xp=xp)
    pos += xp.arange(total, dtype=it)
    return ptr, pos


def _take_rows(be, indptr, indices, rows):
    """CSR ``(indptr, indices)`` of the rows ``rows`` of a CSR pattern, in that order
    (``indptr`` int64)."""
    ptr, pos = csr_row_positions(be, indptr, rows, indices.shape[0])
    return ptr, indices[pos]


# ----------------------------------------------------------------------------- the graph
def _check_matrix(A, block_size):
    if not is_sparse(A):
        raise TypeError(f"color_graph: A must be a sparse matrix (SciPy or cupyx), "
                        f"got {type(A).__name__}")
    n, m = A.shape
    if n != m:
        raise ValueError(f"color_graph: A must be square, got shape {A.shape}")
    if isinstance(block_size, bool) or not isinstance(block_size, (int, np.integer)):
        raise TypeError(f"color_graph: block_size must be an integer, got {block_size!r}")
    c = int(block_size)
    if c < 1 or n % c:
        raise ValueError(f"color_graph: matrix size {n} is not a multiple of block_size {c}")
    return n // c, c


def _graph(A, block_size):
    """``(be, N, indptr, indices)``: CSR pattern of the symmetric node graph of ``A`` (both
    directions of every edge, no self-loops, no duplicates, sorted columns) on ``A``'s
    backend; ``indptr`` int64."""
    N, c = _check_matrix(A, block_size)
    be = backend_of(A)
    xp, sparse = be.xp, be.sparse
    C = A.tocoo()
    i, j = C.row, C.col
    if c > 1:
        i, j = i // c, j // c
    off = i != j
    i, j = i[off].astype(xp.int32), j[off].astype(xp.int32)
    if i.shape[0] == 0:                                     # no coupling at all
        return be, N, xp.zeros(N + 1, dtype=xp.int64), xp.zeros(0, dtype=xp.int32)
    # COO -> CSR sums the duplicates (SciPy and cupyx); + transpose: the symmetric pattern
    G = sparse.coo_matrix((xp.ones(i.shape[0], dtype=xp.float32), (i, j)), shape=(N, N)).tocsr()
    G = (G + G.T.tocsr()).tocsr()
    G.sum_duplicates()
    G.sort_indices()
    return be, N, G.indptr.astype(xp.int64), G.indices


def node_graph(A, block_size=1):
    """Symmetric adjacency of the node graph of ``A`` as (rows, cols) edge arrays.

    Edges are sorted by row and free of duplicates and self-loops; both
    directions of every edge are present.  Returns ``(N, rows, cols)`` (int64
    arrays on ``A``'s backend).
    """
    be, N, indptr, indices = _graph(A, block_size)
    xp = be.xp
    rows = segment_owner(xp.diff(indptr), int(indices.shape[0]), xp=xp)
    return N, rows.astype(xp.int64), indices.astype(xp.int64)


# ----------------------------------------------------------------------------- first fit
def _bit(xp, color):
    """``2^colour`` as uint64 for colours below 64, else 0 (-1, uncoloured: 0)."""
    ok = (color >= 0) & (color < 64)
    return xp.where(ok, xp.left_shift(xp.uint64(1), xp.where(ok, color, 0).astype(xp.uint64)),
                    xp.uint64(0))


def _first_fit(be, ptr, nb, color, bit, top):
    """Smallest colour not used by the neighbours ``nb`` (node ids, the entries of CSR rows
    ``ptr``), for each row; uncoloured neighbours (``color < 0``) are ignored.

    A row's mask has bit ``k`` set when colour ``k`` is taken (one CSR row-OR of the
    neighbours' ``bit = 2^colour``); the answer is its lowest clear bit.  Colours reach
    ``top - 1`` at most; with ``top > 64`` the masks run over words of 64 colours, the
    bit of an entry in word ``w`` looked up in a table of ``top + 1`` entries.
    """
    xp = be.xp
    m = ptr.shape[0] - 1
    one = xp.uint64(1)
    out = xp.full(m, -1, dtype=xp.int64)
    words = (int(top) + 63) // 64
    if words > 1:
        nbc = color[nb] + 1
        ks = np.arange(-1, int(top), dtype=np.int64)
    for w in range(words):
        if words == 1:
            vals = bit[nb]
        else:
            tab = np.where((ks >= 64 * w) & (ks < 64 * w + 64), _bit(np, ks - 64 * w), np.uint64(0))
            vals = be.asarray(tab)[nbc]
        free = ~csr_rowor(be, ptr, vals, xp.zeros(m, dtype=xp.uint64))
        has = free != 0
        low = free & (~free + one)                          # lowest set bit of ``free``
        k = xp.rint(xp.log2(xp.where(has, low, one).astype(xp.float64))).astype(xp.int64)
        out = xp.where((out < 0) & has, 64 * w + k, out)
        if w + 1 < words and not bool((out < 0).any()):
            break
    return out


def _assign(be, color, bit, nodes, fit):
    color[nodes] = fit
    bit[nodes] = _bit(be.xp, fit)


# ----------------------------------------------------------------------------- colouring
#: rebuild the active rows' CSR when the uncoloured rows hold less than this share of its edges
_COMPACT = 0.7


def _jones_plassmann(be, N, indptr, indices, key):
    """Jones-Plassmann rounds with first fit (module docstring); int64 colours."""
    xp = be.xp
    deg = xp.diff(indptr)
    top = int(deg.max()) + 1 if N else 1                  # colours < max degree + 1
    color = xp.where(deg == 0, 0, -1).astype(xp.int64)    # isolated nodes: colour 0
    bit = _bit(xp, color)
    node, ptr, c = xp.arange(N, dtype=xp.int64), indptr, indices   # the active rows
    while True:
        unc = color < 0
        un = unc[node]
        live = xp.flatnonzero(un)
        if live.shape[0] == 0:
            break
        nrow = xp.diff(ptr)
        if int(nrow[live].sum()) < _COMPACT * c.shape[0]:   # drop the coloured rows
            ptr, c = _take_rows(be, ptr, c, live)
            node, un = node[live], un[live]
        mx = csr_rowmax(be, ptr, xp.where(unc, key, -1)[c], xp.full(node.shape[0], -1, xp.int64))
        sel = xp.flatnonzero(un & (key[node] > mx))        # local maxima: an independent set
        ps, cs = _take_rows(be, ptr, c, sel)
        _assign(be, color, bit, node[sel], _first_fit(be, ps, cs, color, bit, top))
    return color


def _iterated_greedy(be, indptr, indices, color, passes):
    """``passes`` rounds of iterated greedy recolouring (module docstring)."""
    xp = be.xp
    N = color.shape[0]
    for p in range(int(passes)):
        counts = to_host(xp.bincount(color))
        K = counts.shape[0]
        order = xp.argsort(color)                            # nodes grouped by colour
        gptr = np.zeros(K + 1, dtype=np.int64)
        np.cumsum(counts, out=gptr[1:])
        classes = range(K - 1, -1, -1) if p % 2 == 0 else np.argsort(-counts, kind="stable")
        new = xp.full(N, -1, dtype=xp.int64)
        bit = xp.zeros(N, dtype=xp.uint64)
        for k in classes:
            s, e = int(gptr[k]), int(gptr[k + 1])
            if s == e:
                continue
            ps, cs = _take_rows(be, indptr, indices, order[s:e])     # the class's rows
            _assign(be, new, bit, order[s:e], _first_fit(be, ps, cs, new, bit, K))
        color = new
    return color


def color_graph(A, block_size=1, seed=0, passes=4):
    """Colour of every node of ``A``'s node graph: int32 array of length ``n / block_size``
    on ``A``'s backend (NumPy for SciPy, CuPy for cupyx matrices).

    Jones-Plassmann rounds with first fit, then ``passes`` rounds of iterated
    greedy recolouring (see the module docstring; ``passes = 0``: Jones-Plassmann
    alone).  ``seed`` fixes the hashed priorities: the colouring is reproducible,
    and the same on the host and on the device.
    """
    if isinstance(passes, bool) or not isinstance(passes, (int, np.integer)) or passes < 0:
        raise ValueError(f"color_graph: passes must be a non-negative integer, got {passes!r}")
    be, N, indptr, indices = _graph(A, block_size)
    xp = be.xp
    if N >= 1 << _IDX_BITS:
        raise ValueError(f"color_graph: at most 2^{_IDX_BITS} - 1 nodes, got {N}")
    if N == 0:
        return xp.zeros(0, dtype=xp.int32)
    key = (node_hash(be, N, seed, bits=32) << _IDX_BITS) | xp.arange(N, dtype=xp.int64)
    color = _jones_plassmann(be, N, indptr, indices, key)
    color = _iterated_greedy(be, indptr, indices, color, passes)
    return color.astype(xp.int32)


def color_groups(colors):
    """The nodes of each colour (sorted ascending, int64), a list indexed by colour, on the
    backend of ``colors`` (a NumPy or a CuPy array): views into one stable sort of the
    colours.  Only the colour counts (one per colour) are read to the host."""
    be = backend_of(colors)
    xp = be.xp
    if colors.shape[0] == 0:
        return []
    order = stable_argsort(colors).astype(xp.int64, copy=False)
    ends = np.cumsum(to_host(xp.bincount(colors)))
    starts = np.concatenate([[0], ends[:-1]])
    return [order[int(s):int(e)] for s, e in zip(starts, ends) if e > s]


def check_coloring(A, colors, block_size=1):
    """True when no two coupled nodes of ``A`` share a colour (a valid colouring).
    Runs on ``A``'s backend; ``colors`` may be on either."""
    N, rows, cols = node_graph(A, block_size)
    be = backend_of(A)
    colors = be.asarray(colors)
    if colors.shape != (N,) or bool((colors < 0).any()):
        return False
    return not bool((colors[rows] == colors[cols]).any())
