"""Meshes the device-mesh tests compare on the host and the device (not a test module):
2-D / 3-D, uniform, local refinement, three levels of hanging nodes, an unstructured
``from_cells`` mesh with regions and named boundaries."""
import numpy as np

from adaptmg import Mesh
from test_mesh import random_mesh


def unstructured():
    """A from_cells mesh (permuted, perturbed nodes; regions, named boundaries), refined twice."""
    rng = np.random.default_rng(5)
    b = Mesh.box([0, 0], [1, 1], [4, 3])
    perm = rng.permutation(b.num_nodes)
    inv = np.argsort(perm)
    inner = (b.points[perm] % 1 != 0).all(1)[:, None]
    pts = b.points[perm] + 0.04 * rng.uniform(-1, 1, b.points.shape) * inner
    bid = np.where(b.boundary_ids >= 0, b.boundary_ids + 1, -1)
    m = Mesh.from_cells(pts, inv[b.cells], bid, regions=np.arange(b.num_cells) % 3,
                        boundary_names={"left": 1, "right": 2}, region_names={"steel": 2})
    return m.refine([0, 5]).refine(np.arange(3))


MESHES = {
    "2d-uniform": lambda: Mesh.box([0, 0], [1, 2], [3, 2]).refine(),
    "2d-3levels": lambda: random_mesh(2, 3, 1, n0=3),
    "3d-local": lambda: Mesh.box([0] * 3, [1] * 3, [2] * 3).refine([0, 3]).refine([1, 2]),
    "3d-random": lambda: random_mesh(3, 2, 2, frac=0.4),
    "from_cells": unstructured,
}
