"""The cell-node incidence of a mesh and the touch graph of its cells, as sparse matrices of
the mesh's backend (SciPy on the host, cupyx on the device).

Incidence: ``N[K, i] = 1`` if node ``i`` is a vertex of cell ``K`` (CSR with 2^d entries a
row).  Touch graph: with ``Q[C, h] = 1`` for a hanging node ``h`` on an edge/face of the
coarse cell ``C`` and ``G = N + Q``, two cells touch iff ``(N G^T + G N^T)[K, L] != 0``.
cuSPARSE holds no integer values: on the device both matrices are float64 (entries 0/1,
the same pattern), on the host int32 as before.
"""
from __future__ import annotations

import numpy as np

from ..backend import csr_from_arrays


def _value_dtype(be):
    return np.float64 if be.is_gpu else np.int32


def incidence(cells, num_nodes: int, be):
    """(num_cells, num_nodes) 0/1 CSR of ``cells`` (nc, nv) node ids on the backend ``be``."""
    nc, nv = cells.shape
    xp = be.xp
    return csr_from_arrays(be.sparse, xp.ones(nc * nv, dtype=_value_dtype(be)), cells.ravel(),
                           xp.arange(0, nc * nv + 1, nv), (nc, num_nodes))


def touch_graph(N, links, be):
    """(num_cells, num_cells) 0/1 CSR of the cells that share a point, from the incidence
    ``N`` and the hanging-node ``links`` (nodes, coarse cells holding them)."""
    hn, hc = links
    Q = be.sparse.coo_matrix((be.xp.ones(hn.size, dtype=_value_dtype(be)), (hc, hn)),
                             shape=N.shape).tocsr()
    G = N + Q
    T = (N @ G.T) + (G @ N.T)
    T.data[:] = 1
    return T.tocsr()
