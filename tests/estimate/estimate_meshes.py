"""Meshes shared by the estimator tests (imported by basename: pytest puts this folder on sys.path)."""
import numpy as np

from adaptmg import Mesh


def adaptive_box(dim, seed, steps, n=2, distort=True):
    """An n^dim box refined ``steps`` times at random (30 % of the cells), with hanging nodes;
    ``distort``: a smooth non-affine distortion that keeps the boundary."""
    rng = np.random.default_rng(seed)
    m = Mesh.box([0] * dim, [1] * dim, [n] * dim)
    for _ in range(steps):
        m = m.refine(rng.random(m.num_cells) < 0.3)
    if distort:
        m = m.map(lambda x: x + 0.2 * np.sin(3 * x[:, ::-1]) * np.prod(x * (1 - x), axis=1, keepdims=True))
    return m


def k_coefficient(x):
    """A smooth variable diffusion coefficient k(x) = 1 + x_0^2 + x_1 / 2."""
    return 1 + x[..., 0] ** 2 + 0.5 * x[..., 1]
