"""The forest of a structured box mesh, built on its backend.

The box ``[lower, upper]`` with ``n_i`` cells along axis ``i`` has the nodes
``k = sum_i j_i s_i`` (``s_0 = 1``, ``s_{i+1} = s_i (n_i + 1)``: x fastest) at
``x_i = a_i[j_i]``, where ``a_i = linspace(lower_i, upper_i, n_i + 1)`` (made on the host:
``n_i + 1`` numbers, then gathered on the backend, so both backends get the same
coordinates).  Cell ``c = sum_i q_i t_i`` (``t_{i+1} = t_i n_i``) has the vertex
``sum_i (q_i + e_i) s_i`` at reference corner ``e`` and the boundary id ``2 i`` on its face
``x_i = lower_i`` (``q_i = 0``), ``2 i + 1`` on ``x_i = upper_i`` (``q_i = n_i - 1``), -1 on
the other faces.  Everything per node or cell is index arithmetic on ``xp.arange``.
"""
from __future__ import annotations

import numpy as np

from . import reference as ref
from ._tree import Forest


def box_forest(lower: np.ndarray, upper: np.ndarray, n: np.ndarray, be) -> Forest:
    """The :class:`Forest` of the box (validated ``lower``, ``upper`` floats and ``n`` cell
    counts per axis) with every table on the backend ``be``."""
    xp = be.xp
    dim = len(n)
    npt = [int(k) + 1 for k in n]
    s = [int(np.prod(npt[:i])) for i in range(dim)]             # node strides
    t = [int(np.prod(n[:i])) for i in range(dim)]               # cell strides
    k = xp.arange(int(np.prod(npt)), dtype=np.int64)
    pts = xp.empty((k.size, dim), dtype=np.float64)
    for i in range(dim):
        axis = xp.asarray(np.linspace(lower[i], upper[i], npt[i]))
        pts[:, i] = axis[(k // s[i]) % npt[i]]
    c = xp.arange(int(np.prod(n)), dtype=np.int64)
    q = [(c // t[i]) % int(n[i]) for i in range(dim)]
    base = q[0] * s[0]
    for i in range(1, dim):
        base += q[i] * s[i]
    offs = (ref.corners(dim) * np.array(s)).sum(1)
    cell_nodes = base[:, None] + xp.asarray(offs)[None, :]
    bface = xp.empty((c.size, 2 * dim), dtype=np.int32)
    for i in range(dim):
        bface[:, 2 * i] = xp.where(q[i] == 0, 2 * i, -1)
        bface[:, 2 * i + 1] = xp.where(q[i] == int(n[i]) - 1, 2 * i + 1, -1)
    return Forest.from_coarse(pts, cell_nodes, bface)
