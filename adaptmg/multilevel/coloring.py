r"""Graph colouring of a sparse matrix, vectorised (Jones-Plassmann rounds).

A *colouring* of the (node) graph of ``A`` assigns every node a colour so that
no two nodes of the same colour are coupled: ``a_ij = 0`` (and ``a_ji = 0``)
whenever ``i != j`` have the same colour.  Multicolour Gauss-Seidel relaxes all
rows of one colour at once: they do not read each other's unknowns, so the
simultaneous update is exactly the sequential Gauss-Seidel update within the
colour, and a sweep is one parallel step per colour.

Algorithm (Jones & Plassmann 1993, first-fit variant).  Every node ``v`` gets a
random priority ``w_v`` (a permutation of ``0..N-1`` from a fixed seed, so no
ties and a reproducible result).  In each *round*, every uncoloured node whose
priority exceeds that of all its uncoloured neighbours is selected; the
selected nodes form an independent set, and each takes the smallest colour
not used by its already coloured neighbours (first fit).  A round is a handful
of vectorised array operations over the edges still incident to uncoloured
nodes (no loop over rows); the loop runs over rounds only, about the length of
the longest priority-decreasing path (20-50 rounds for FE stencils).  The
number of colours is at most ``max degree + 1``; after the iterated-greedy
passes of :func:`color_graph`, measured: 2-D 5-point 4 colours, 9-point 7,
3-D 7-point 5, 27-point 15 (optimum 2 / 4 / 2 / 8).  The colour count costs
launches, not work: every sweep touches each row once whatever the count.
Setup cost on one CPU core: 0.04 s for 40k rows (5-point), 0.35 s for 27k rows
(27-point).

Block colouring.  With ``block_size = c`` the graph is the *node* graph: DoFs
``c*p .. c*p + c - 1`` form node ``p``, and nodes ``p != q`` are adjacent when
any entry of the ``c x c`` block ``A[p, q]`` or ``A[q, p]`` is stored.
"""
from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from ..backend import to_host

__all__ = ["node_graph", "color_graph", "color_groups", "check_coloring"]


def node_graph(A, block_size=1):
    """Symmetric adjacency of the node graph of ``A`` as (rows, cols) edge arrays.

    Edges are sorted by row and free of duplicates and self-loops; both
    directions of every edge are present.  Returns ``(N, rows, cols)``.
    """
    A = to_host(A)
    if not sp.issparse(A):
        raise TypeError(f"color_graph: A must be a sparse matrix, got {type(A).__name__}")
    n, m = A.shape
    if n != m:
        raise ValueError(f"color_graph: A must be square, got shape {A.shape}")
    c = int(block_size)
    if c < 1 or n % c:
        raise ValueError(f"color_graph: matrix size {n} is not a multiple of block_size {c}")
    N = n // c
    C = sp.coo_matrix(A)
    i, j = C.row // c, C.col // c
    off = i != j
    G = sp.csr_matrix((np.ones(int(off.sum()), dtype=np.int8), (i[off], j[off])), shape=(N, N))
    G = (G + G.T).tocsr()                  # symmetric pattern; duplicates summed by SciPy
    G.sort_indices()
    rows = np.repeat(np.arange(N, dtype=np.int64), np.diff(G.indptr))
    return N, rows, G.indices.astype(np.int64)


def _first_fit(N, rows, cols, color, nodes):
    """Smallest colour not used by the coloured neighbours, for each node of the
    independent set ``nodes`` (neighbours with ``color < 0`` are ignored)."""
    mark = np.zeros(N, dtype=bool)
    mark[nodes] = True
    s = mark[rows]
    dr, dc = rows[s], cols[s]
    dcol = color[dc]
    s = dcol >= 0
    dr, dcol = dr[s], dcol[s]
    new = np.zeros(N, dtype=np.int64)
    if not dr.size:
        return new[nodes]
    top = int(dcol.max())
    if top < 63:
        # bit k of mask[v] set <=> colour k is taken by a neighbour; the answer is the lowest
        # clear bit.  ``dr`` is sorted (edge lists are sorted by row): one reduceat.
        bits = np.left_shift(np.uint64(1), dcol.astype(np.uint64))
        start = np.flatnonzero(np.r_[True, dr[1:] != dr[:-1]])
        mask = np.bitwise_or.reduceat(bits, start)
        free = ~mask
        low = free & (~free + np.uint64(1))
        new[dr[start]] = np.log2(low.astype(np.float64)).astype(np.int64)
    else:
        K = top + 2
        pair = np.unique(dr * K + dcol)               # sorted by node, then colour
        pn, pc = pair // K, pair % K
        start = np.flatnonzero(np.r_[True, pn[1:] != pn[:-1]])
        size = np.diff(np.r_[start, pn.size])
        pos = np.arange(pn.size) - np.repeat(start, size)
        # a node's colours sorted: the first position j holding a colour != j is the gap
        cand = np.where(pc != pos, pos, np.repeat(size, size))
        new[pn[start]] = np.minimum.reduceat(cand, start)
    return new[nodes]


def color_graph(A, block_size=1, seed=0, passes=4):
    """Colour of every node of ``A``'s node graph (int32 array of length ``n / block_size``).

    Jones-Plassmann rounds with first fit (see the module docstring), then
    ``passes`` rounds of *iterated greedy* recolouring (Culberson 1992): the
    colour classes are visited one after another (reverse order, then largest
    first, alternately) and every node of the class takes the smallest colour
    free among its already recoloured neighbours.  A class is an independent
    set, so each step is one vectorised first fit, and the number of colours
    never grows (typically -1 to -3 colours).  ``seed`` fixes the random
    priorities: the colouring is reproducible.
    """
    N, rows, cols = node_graph(A, block_size)
    color = np.full(N, -1, dtype=np.int64)
    if N == 0:
        return color.astype(np.int32)
    w = np.random.default_rng(seed).permutation(N)
    r, c_ = rows, cols
    for _round in range(N + 1):          # each round colours at least one node
        unc = color < 0
        if not unc.any():
            break
        keep = unc[r]                    # edges leaving uncoloured nodes
        r, c_ = r[keep], c_[keep]
        live = unc[c_]                   # ... to uncoloured nodes: the priority test
        beaten = np.zeros(N, dtype=bool)
        lr, lc = r[live], c_[live]
        beaten[lr[w[lc] > w[lr]]] = True
        sel = np.flatnonzero(unc & ~beaten)
        color[sel] = _first_fit(N, r, c_, color, sel)
    for p in range(int(passes)):
        groups = color_groups(color)
        if p % 2 == 0:
            order = range(len(groups) - 1, -1, -1)
        else:
            order = np.argsort([-g.size for g in groups], kind="stable")
        new = np.full(N, -1, dtype=np.int64)
        for k in order:
            new[groups[k]] = _first_fit(N, rows, cols, new, groups[k])
        color = new
    return color.astype(np.int32)


def color_groups(colors):
    """The nodes of each colour (sorted ascending), a list indexed by colour."""
    colors = np.asarray(colors)
    if colors.size == 0:
        return []
    order = np.argsort(colors, kind="stable")
    counts = np.bincount(colors)
    return [g for g in np.split(order, np.cumsum(counts)[:-1]) if g.size]


def check_coloring(A, colors, block_size=1):
    """True when no two coupled nodes of ``A`` share a colour (a valid colouring)."""
    N, rows, cols = node_graph(A, block_size)
    colors = np.asarray(colors)
    if colors.shape != (N,) or (colors < 0).any():
        return False
    return not bool(np.any(colors[rows] == colors[cols]))
