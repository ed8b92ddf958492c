"""Small meshes for the spectral tests: rotated cell orderings, distorted boxes."""
import itertools

import numpy as np

import adaptmg


def rotations(dim):
    """The proper rotations of the reference cell as vertex permutations (lexicographic)."""
    out = []
    cor = np.array([[(v >> i) & 1 for i in range(dim)] for v in range(2 ** dim)])
    s = 2 * cor - 1
    for perm in itertools.permutations(range(dim)):
        for signs in itertools.product((-1, 1), repeat=dim):
            R = np.zeros((dim, dim))
            R[np.arange(dim), perm] = signs
            if np.linalg.det(R) < 0:
                continue
            t = ((s @ R.T + 1) // 2).astype(int)
            out.append((t * (1 << np.arange(dim))).sum(1))
    return np.array(out)


def scrambled(mesh, seed=0):
    """The same mesh with every cell's vertex list rotated at random (unstructured input)."""
    rng = np.random.default_rng(seed)
    R = rotations(mesh.dim)
    pick = R[rng.integers(0, len(R), mesh.num_cells)]
    cells = np.take_along_axis(mesh.cells, pick, axis=1)
    return adaptmg.Mesh.from_cells(mesh.points, cells)


def wavy(x, a=0.06):
    """A smooth non-affine perturbation of the unit box that keeps its boundary."""
    d = x.shape[1]
    bump = np.prod(np.sin(np.pi * x), axis=1)
    return x + a * bump[:, None] * np.cos(np.pi * (x[:, ::-1] + np.arange(d)))


def distorted_box(dim, n, a=0.06, seed=0):
    return scrambled(adaptmg.Mesh.box([0] * dim, [1] * dim, [n] * dim).map(lambda x: wavy(x, a)), seed)
