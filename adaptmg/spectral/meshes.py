"""Test and benchmark meshes for the spectral path (seed 004 §6's three kinds), built
vectorised: a box with non-affine cells, the same with every cell's vertex list rotated
(an "unstructured" input: neighbours disagree on orientation), and an O-grid of a
cylinder (vertices of valence 6 and edges of valence 3 at the corners of its core).
"""
from __future__ import annotations

import itertools

import numpy as np

from ..mesh import Mesh

__all__ = ["wavy", "rotations", "scramble", "distorted_box", "ogrid_cylinder", "ogrid_map"]


def wavy(x, a=0.06):
    """``x + a prod_i sin(pi x_i) cos(pi (x_rev + i))``: a smooth non-affine map of the unit
    box onto itself (the boundary stays put)."""
    d = x.shape[1]
    bump = np.prod(np.sin(np.pi * x), axis=1)
    return x + a * bump[:, None] * np.cos(np.pi * (x[:, ::-1] + np.arange(d)))


def rotations(dim):
    """The proper rotations of the reference cell as vertex permutations (lexicographic)."""
    cor = np.array([[(v >> i) & 1 for i in range(dim)] for v in range(2 ** dim)])
    s = 2 * cor - 1
    out = []
    for perm in itertools.permutations(range(dim)):          # the 2-D / 3-D symmetry group
        for signs in itertools.product((-1, 1), repeat=dim):
            R = np.zeros((dim, dim))
            R[np.arange(dim), perm] = signs
            if np.linalg.det(R) > 0:
                t = ((s @ R.T + 1) // 2).astype(int)
                out.append((t * (1 << np.arange(dim))).sum(1))
    return np.array(out)


def scramble(mesh, seed=0):
    """The same mesh with every cell's vertex list rotated at random."""
    rng = np.random.default_rng(seed)
    R = rotations(mesh.dim)
    cells = np.take_along_axis(mesh.cells, R[rng.integers(0, len(R), mesh.num_cells)], axis=1)
    return Mesh.from_cells(mesh.points, cells)


def distorted_box(dim, n, amplitude=0.06, seed=0):
    """The unit box with n^d cells, moved by :func:`wavy` and scrambled (``seed`` None: not)."""
    m = Mesh.box([0] * dim, [1] * dim, [n] * dim).map(lambda x: wavy(x, amplitude))
    return m if seed is None else scramble(m, seed)


def ogrid_map(x, radius=1.0, core=0.5):
    """The O-grid's geometry map from its "square picture" (points (n, 2) or (n, 3)): the
    core square ``||p||_inf <= a``, ``a = core radius / sqrt 2``, stays; a ring point
    ``p = s u`` (``s = ||p||_inf`` in (a, radius], ``u`` on the unit square's boundary)
    goes to ``(1 - r) a u + r radius c(u)``, ``r = (s - a) / (radius - a)``, with ``c(u)``
    the circle point at the angle ``w pi / 4`` from the middle of u's side (``w`` the
    tangential coordinate of u in [-1, 1]).  Along each ray this blends the core square
    linearly into the circle; z is kept.  Continuous, smooth inside each of the five
    blocks; the square picture's trilinear cells refine exactly (their midpoints are the
    finer square picture's nodes), so a refined square picture mapped equals the O-grid
    built at the fine size."""
    x = np.asarray(x, dtype=float)
    a = core * radius / np.sqrt(2.0)
    px, py = x[:, 0], x[:, 1]
    s = np.maximum(np.abs(px), np.abs(py))
    ring = s > a * (1 + 1e-12)
    out = x.copy()
    px, py, s = px[ring], py[ring], s[ring]
    xdom = np.abs(px) >= np.abs(py)
    w = np.where(xdom, py, px) / s
    cw, sw = np.cos(w * np.pi / 4), np.sin(w * np.pi / 4)
    cx = np.where(xdom, np.sign(px) * cw, sw)
    cy = np.where(xdom, sw, np.sign(py) * cw)
    r = (s - a) / (radius - a)
    out[ring, 0] = (1 - r) * a * px / s + r * radius * cx
    out[ring, 1] = (1 - r) * a * py / s + r * radius * cy
    return out


def ogrid_cylinder(n, nz=None, radius=1.0, height=1.0, core=0.5, levels=None):
    """Hex O-grid of the cylinder r <= radius, 0 <= z <= height: a square core of
    (n/2)^2 cells and four blocks of n/2 x n/4 cells out to the circle, ``nz`` (default
    n) layers; 0.75 n^2 nz cells for n divisible by 4.  The core's corners have 3 cells
    around them in a layer (vertex valence 6 in 3-D).  Boundary id 0 everywhere.

    Built as the paper builds its meshes: the coarsest O-grid ``(n / 2^L, nz / 2^L)``
    (``L = levels``, default as many halvings as keep n a multiple of 4 and nz an
    integer) in its square picture, refined L times by :meth:`Mesh.refine` and moved by
    :func:`ogrid_map`, so the mesh carries its refinement hierarchy (geometric multigrid
    levels on the O-grid itself) and its nodes are those of the O-grid built at
    ``(n, nz)`` directly (``levels=0``)."""
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 4 or n % 4:
        raise ValueError(f"ogrid_cylinder: n must be a positive multiple of 4, got {n!r}")
    nz = n if nz is None else nz
    if isinstance(nz, bool) or not isinstance(nz, (int, np.integer)) or nz < 1:
        raise ValueError(f"ogrid_cylinder: nz must be a positive integer, got {nz!r}")
    if not 0 < core < 1 or radius <= 0 or height <= 0:
        raise ValueError(f"ogrid_cylinder: need radius > 0, height > 0 and 0 < core < 1, "
                         f"got radius={radius}, height={height}, core={core}")
    most = 0
    while (n >> most) % 8 == 0 and (nz >> most) % 2 == 0:
        most += 1
    L = most if levels is None else int(levels)
    if not 0 <= L <= most:
        raise ValueError(f"ogrid_cylinder: levels must lie in [0, {most}] for n={n}, nz={nz} "
                         f"(n / 2^levels a multiple of 4, nz / 2^levels an integer), got {levels!r}")
    mesh = _ogrid_square(n >> L, nz >> L, radius, height, core * radius / np.sqrt(2.0))
    for _ in range(L):
        mesh = mesh.refine()
    return mesh.map(lambda x: ogrid_map(x, radius, core))


def _ogrid_square(n, nz, radius, height, a):
    """The O-grid's square picture (:func:`ogrid_map`): core [-a, a]^2 with (n/2)^2 cells,
    four trapezoids out to the square of half-width ``radius`` with n/2 x n/4 cells
    (``s u``, s uniform in [a, radius], u uniform on a side), nz layers."""
    ns, nr = n // 2, n // 4
    t = np.linspace(-1.0, 1.0, ns + 1)
    X, Y = np.meshgrid(a * t, a * t, indexing="xy")
    pts = [np.stack([X.ravel(), Y.ravel()], 1)]
    i, j = np.meshgrid(np.arange(ns), np.arange(ns), indexing="xy")
    base = (j * (ns + 1) + i).ravel()
    quads = [np.stack([base, base + 1, base + ns + 1, base + ns + 2], 1)]
    off = pts[0].shape[0]
    S, T = np.meshgrid(np.linspace(a, radius, nr + 1), t, indexing="ij")   # (nr+1, ns+1)
    i, j = np.meshgrid(np.arange(ns), np.arange(nr), indexing="xy")
    b = (j * (ns + 1) + i).ravel()
    for q in range(4):                                         # the four outer blocks
        c, s = np.cos(q * np.pi / 2), np.sin(q * np.pi / 2)
        P = np.stack([S, S * T], -1) @ np.array([[c, -s], [s, c]]).T
        pts.append(P.reshape(-1, 2))
        quads.append(np.stack([b, b + 1, b + ns + 1, b + ns + 2], 1) + off)
        off += P.shape[0] * P.shape[1]
    pts = np.concatenate(pts)
    quads = np.concatenate(quads)
    key = np.round(pts / radius * 1e9).astype(np.int64)
    _, first, inv = np.unique(key, axis=0, return_index=True, return_inverse=True)
    pts, quads = pts[first], inv.ravel()[quads]
    e1, e2 = pts[quads[:, 1]] - pts[quads[:, 0]], pts[quads[:, 2]] - pts[quads[:, 0]]
    flip = e1[:, 0] * e2[:, 1] - e1[:, 1] * e2[:, 0] < 0
    quads[flip] = quads[flip][:, [0, 2, 1, 3]]
    npt = pts.shape[0]
    z = np.linspace(0.0, height, nz + 1)
    P3 = np.column_stack([np.tile(pts, (nz + 1, 1)), np.repeat(z, npt)])
    lay = np.arange(nz)[:, None, None] * npt
    hexes = np.concatenate([quads[None] + lay, quads[None] + lay + npt], axis=2).reshape(-1, 8)
    return Mesh.from_cells(P3, hexes)
