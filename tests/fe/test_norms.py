"""fe.norms.errors: exact reproduction of functions in the space on sheared (affine, non
axis-aligned) cells, vector components, and the device computation against the host one."""
import math

import numpy as np
import pytest

from adaptmg.backend import get_backend
from adaptmg.fe import Space
from adaptmg.fe.norms import errors
from adaptmg.mesh import Mesh

SHEAR = np.array([[1.0, 0.4, -0.2], [0.1, 0.9, 0.3], [0.0, -0.25, 1.1]])


def sheared(dim, refine):
    m = Mesh.box([0] * dim, [1] * dim, [2] * dim)
    rng = np.random.default_rng(dim)
    for _ in range(refine):
        m = m.refine(rng.random(m.num_cells) < 0.4)
    S = SHEAR[:dim, :dim]
    return m.map(lambda x: x @ S.T)


@pytest.mark.parametrize("dim,k,c", [(2, 1, 1), (2, 2, 2), (3, 1, 3), (3, 2, 1)])
def test_errors_vanish_for_linear_functions_on_sheared_cells(dim, k, c):
    """u linear in the physical coordinates lies in the mapped Q_k space of affine cells:
    the L2 and H1 errors of its interpolant are round-off (1e-13), while a perturbed nodal
    vector gives errors of the perturbation's size."""
    m = sheared(dim, 2)
    s = Space(m, k, components=c)
    A = np.arange(1, c * dim + 1, dtype=float).reshape(c, dim) / 3.0
    exact = lambda x: (x @ A.T + 0.5).reshape(x.shape[:-1] + ((c,) if c > 1 else ()))
    G = A if c > 1 else A[0]                     # (c, d) or (d,)
    grad = lambda x: np.broadcast_to(G, x.shape[:-1] + G.shape)
    u = (s.points @ A.T + 0.5).ravel()
    e = errors(s, u, exact, grad)
    assert e["L2"] < 1e-13 and e["H1"] < 1e-12, e
    bump = np.zeros(s.num_dofs)
    bump[s.num_dofs // 2] = 1e-3
    e = errors(s, u + bump, exact, grad)
    assert 1e-8 < e["L2"] < 1e-3 and 1e-7 < e["H1"] < 1e-1, e


@pytest.mark.gpu
@pytest.mark.parametrize("dim,k,c", [(2, 1, 1), (3, 2, 3)])
def test_errors_on_the_device_equal_the_host(dim, k, c):
    """errors(backend="gpu") (device quadrature, the callables on CuPy arrays) equals the
    host computation to 1e-12 relative; a callable that refuses device arrays (math.* on
    an array raises TypeError) is evaluated on host copies with the same result."""
    m = sheared(dim, 2)
    s = Space(m, k, components=c)
    u = np.random.default_rng(0).standard_normal(s.num_dofs)

    def exact(x):
        v = np.sin(np.pi * x).prod(-1)
        return np.stack([v * (j + 1) for j in range(c)], -1) if c > 1 else v

    def grad(x):                  # any smooth field serves to compare host and device
        g = np.cos(np.pi * x) * np.exp(x.sum(-1))[..., None]
        return np.stack([g * (j + 1) for j in range(c)], -2) if c > 1 else g

    host = errors(s, u, exact, grad)
    gpu = get_backend("gpu")
    dev = errors(s, gpu.asarray(u), exact, grad)            # backend from u
    for key in ("L2", "H1"):
        assert abs(dev[key] - host[key]) <= 1e-12 * host[key], (key, dev, host)

    def host_only(x):
        if not isinstance(x, np.ndarray):
            raise TypeError("NumPy arrays only")
        return exact(x)

    dev = errors(s, u, host_only, backend=gpu)
    assert abs(dev["L2"] - host["L2"]) <= 1e-12 * host["L2"]
    assert math.isfinite(dev["L2"])


def test_errors_over_a_cell_subset_add_up_to_the_whole():
    """``cells=``: the squared norms over a split of the cells (a distributed forest's owned
    cells on each rank) add up to those over all cells (within eps units), a subset's are
    smaller, and bad indices are a ValueError."""
    m = sheared(2, 2)
    s = Space(m, 1)
    exact = lambda x: np.sin(3 * x[..., 0]) * x[..., 1]
    grad = lambda x: np.stack([3 * np.cos(3 * x[..., 0]) * x[..., 1], np.sin(3 * x[..., 0])], -1)
    u = np.zeros(s.num_dofs)
    whole = errors(s, u, exact, grad)
    part = np.random.default_rng(0).random(m.num_cells) < 0.3
    a = errors(s, u, exact, grad, cells=np.flatnonzero(part))
    b = errors(s, u, exact, grad, cells=np.flatnonzero(~part))
    for k in ("L2", "H1"):
        assert 0 < a[k] < whole[k] and 0 < b[k] < whole[k]
        assert abs(a[k] ** 2 + b[k] ** 2 - whole[k] ** 2) <= 64 * np.finfo(float).eps * whole[k] ** 2
    with pytest.raises(ValueError, match="cell indices"):
        errors(s, u, exact, grad, cells=np.array([m.num_cells]))
