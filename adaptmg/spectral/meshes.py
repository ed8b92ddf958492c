"""Test and benchmark meshes for the spectral path (seed 004 §6's three kinds), built
vectorised: a box with non-affine cells, the same with every cell's vertex list rotated
(an "unstructured" input: neighbours disagree on orientation), and an O-grid of a
cylinder (vertices of valence 6 and edges of valence 3 at the corners of its core).
"""
from __future__ import annotations

import itertools

import numpy as np

from ..mesh import Mesh

__all__ = ["wavy", "rotations", "scramble", "distorted_box", "ogrid_cylinder"]


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


def ogrid_cylinder(n, nz=None, radius=1.0, height=1.0, core=0.5):
    """Hex O-grid of the cylinder r <= radius, 0 <= z <= height: a square core of
    (n/2)^2 cells and four blocks of n/2 x n/4 cells out to the circle, ``nz`` (default
    n) layers; 0.75 n^2 nz cells for n divisible by 4.  The core's corners have 3 cells
    around them in a layer (vertex valence 6 in 3-D).  Boundary id 0 everywhere."""
    if n < 4 or n % 4:
        raise ValueError(f"ogrid_cylinder: n must be a positive multiple of 4, got {n}")
    nz = n if nz is None else nz
    a = core * radius / np.sqrt(2.0)
    ns, nr = n // 2, n // 4
    s = np.linspace(-a, a, ns + 1)
    X, Y = np.meshgrid(s, s, indexing="xy")
    pts = [np.stack([X.ravel(), Y.ravel()], 1)]
    quads = []
    i, j = np.meshgrid(np.arange(ns), np.arange(ns), indexing="xy")
    base = (j * (ns + 1) + i).ravel()
    quads.append(np.stack([base, base + 1, base + ns + 1, base + ns + 2], 1))
    off = pts[0].shape[0]
    t = np.linspace(0.0, 1.0, ns + 1)
    r = np.linspace(0.0, 1.0, nr + 1)
    T, Rr = np.meshgrid(t, r, indexing="xy")                  # (nr+1, ns+1)
    for q in range(4):                                         # the four outer blocks
        th0 = -np.pi / 4 + q * np.pi / 2
        rot = np.array([[np.cos(q * np.pi / 2), -np.sin(q * np.pi / 2)],
                        [np.sin(q * np.pi / 2), np.cos(q * np.pi / 2)]])
        inner = np.stack([np.full(T.shape, a), -a + 2 * a * T], -1) @ rot.T
        th = th0 + T * np.pi / 2
        outer = radius * np.stack([np.cos(th), np.sin(th)], -1)
        P = (1 - Rr[..., None]) * inner + Rr[..., None] * outer
        pts.append(P.reshape(-1, 2))
        i, j = np.meshgrid(np.arange(ns), np.arange(nr), indexing="xy")
        b = off + (j * (ns + 1) + i).ravel()
        quads.append(np.stack([b, b + 1, b + ns + 1, b + ns + 2], 1))
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
    P3 = np.concatenate([np.column_stack([pts, np.full(npt, zz)]) for zz in z])
    lay = np.arange(nz)[:, None, None] * npt
    hexes = np.concatenate([quads[None] + lay, quads[None] + lay + npt], axis=2).reshape(-1, 8)
    return Mesh.from_cells(P3, hexes)
