r"""Near-nullspace vectors ``B`` for smoothed aggregation, from a space or from node coordinates.

Smoothed aggregation interpolates the columns of ``B`` exactly (``T B_c = B`` on every
aggregate), so ``B`` should span the low-energy modes of the operator:

* :func:`constant_modes` -- one column per component, ``B[node*c + k, k] = 1``: the
  kernel of the Laplacian (per component of a vector Laplacian, pyamg's default for
  block systems).
* :func:`rigid_body_modes` -- the rigid motions of linear elasticity: in 2-D the
  translations :math:`e_x, e_y` and the rotation :math:`(-y, x)`, in 3-D three
  translations and the rotations :math:`(0, -z, y), (z, 0, -x), (-y, x, 0)`;
  coordinates relative to the centroid (better conditioned).  For ``components =
  m * dim`` (e.g. the 6-component displacement/velocity system of
  :mod:`problems.elasticity`) each group of ``dim`` components gets its own copy.
* :func:`near_nullspace` -- the above for a :class:`~adaptmg.Space` by name, with the
  rows of constrained DoFs (Dirichlet, hanging) set to zero.

DoFs are numbered ``node * components + component`` (:class:`~adaptmg.Space`).
"""
from __future__ import annotations

import numpy as np

from ..backend import backend_of

__all__ = ["constant_modes", "rigid_body_modes", "near_nullspace", "NEAR_NULLSPACES"]

NEAR_NULLSPACES = ("constant", "rigid_body")


def constant_modes(num_nodes: int, components: int = 1) -> np.ndarray:
    """``(num_nodes * components, components)``: column ``k`` is 1 on the DoFs of component ``k``."""
    if num_nodes < 0 or components < 1:
        raise ValueError(f"constant_modes: need num_nodes >= 0 and components >= 1, "
                         f"got {num_nodes}, {components}")
    B = np.zeros((num_nodes, components, components))
    B[:, np.arange(components), np.arange(components)] = 1.0
    return B.reshape(num_nodes * components, components)


def rigid_body_modes(points, components=None) -> np.ndarray:
    """Rigid-body modes at nodes ``points`` (``(num_nodes, dim)``, dim 2 or 3).

    ``components`` (default ``dim``) must be a multiple of ``dim``; DoF ``node *
    components + k``.  Returns ``(num_nodes * components, r * components / dim)`` with
    ``r = 3`` (2-D) or 6 (3-D) modes per group of ``dim`` components.
    """
    xp = backend_of(points).xp                 # CuPy points (a mesh on the device): built there
    X = xp.asarray(points, dtype=np.float64)
    if X.ndim != 2 or X.shape[1] not in (2, 3):
        raise ValueError(f"rigid_body_modes: points must have shape (num_nodes, 2 or 3), got {X.shape}")
    nn, dim = X.shape
    c = dim if components is None else int(components)
    if c < dim or c % dim:
        raise ValueError(f"rigid_body_modes: components ({c}) must be a multiple of the dimension "
                         f"({dim}): rigid motions act on groups of {dim} displacement components")
    X = X - X.mean(axis=0) if nn else X
    if dim == 2:
        x, y = X.T
        one, zero = xp.ones(nn), xp.zeros(nn)
        modes = [xp.stack([one, zero], 1), xp.stack([zero, one], 1), xp.stack([-y, x], 1)]
    else:
        x, y, z = X.T
        one, zero = xp.ones(nn), xp.zeros(nn)
        modes = [xp.stack([one, zero, zero], 1), xp.stack([zero, one, zero], 1),
                 xp.stack([zero, zero, one], 1), xp.stack([zero, -z, y], 1),
                 xp.stack([z, zero, -x], 1), xp.stack([-y, x, zero], 1)]
    groups = c // dim
    r = len(modes)
    B = xp.zeros((nn, c, r * groups))
    for g in range(groups):
        for j, M in enumerate(modes):
            B[:, g * dim:(g + 1) * dim, g * r + j] = M
    return B.reshape(nn * c, r * groups)


def near_nullspace(space, kind="constant", free=None) -> np.ndarray:
    """Near-nullspace ``B`` of a :class:`~adaptmg.Space`: ``kind`` "constant" (per component)
    or "rigid_body" (needs ``components`` a multiple of the dimension), or an array
    ``(num_dofs, k)`` used as given.  Rows of DoFs outside the boolean mask ``free``
    (Dirichlet, hanging) are set to zero."""
    n = space.num_dofs
    if isinstance(kind, str):
        if kind == "constant":
            B = constant_modes(space.num_nodes, space.components)
        elif kind == "rigid_body":
            B = rigid_body_modes(space.points, space.components)
        else:
            raise ValueError(f"near_nullspace must be one of {NEAR_NULLSPACES} or an array "
                             f"(num_dofs, k), got {kind!r}")
    else:
        B = np.asarray(kind, dtype=np.float64)
        if B.ndim == 1:
            B = B[:, None]
        if B.ndim != 2 or B.shape[0] != n or B.shape[1] < 1:
            raise ValueError(f"near_nullspace array must have shape ({n}, k), got {B.shape}")
        B = B.copy()
    if free is not None:
        xp = backend_of(free).xp                   # a device mask (a mesh on the GPU): B goes there
        free = xp.asarray(free).astype(bool, copy=False)
        if free.shape != (n,):
            raise ValueError(f"free must be a boolean mask of shape ({n},), got {free.shape}")
        B = xp.asarray(B)
        B[~free] = 0.0
    return B
