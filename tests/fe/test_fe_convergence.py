"""Patch tests and convergence rates of Q1/Q2 on uniform, adaptive (hanging nodes) and distorted meshes."""
import numpy as np
import pyamg
import pytest
import scipy.sparse.linalg as spla

from adaptmg import assemble
from adaptmg.fe import Constraints, Space
from adaptmg.fe.norms import errors
from adaptmg.mesh import Mesh


def solve_poisson(space, f, g):
    A = assemble.stiffness(space)
    b = assemble.load(space, f)
    c = Constraints(space, space.boundary_dofs(), g)
    K, rhs = c.apply(A, b)
    if K.shape[0] < 20000:
        x = spla.spsolve(K.tocsc(), rhs)
    else:   # large 3-D systems: algebraic multigrid + CG to far below the discretisation error
        x, info = spla.cg(K, rhs, rtol=1e-12, M=pyamg.smoothed_aggregation_solver(K).aspreconditioner())
        assert info == 0
    return c.expand(x), K


def random_adaptive(dim, seed, steps):
    rng = np.random.default_rng(seed)
    m = Mesh.box([0] * dim, [1] * dim, [2] * dim)
    for _ in range(steps):
        m = m.refine(rng.random(m.num_cells) < 0.35)
    return m


@pytest.mark.parametrize("dim", [2, 3])
@pytest.mark.parametrize("k", [1, 2])
@pytest.mark.parametrize("seed", [0, 1])
def test_patch_test_multilinear(dim, k, seed):
    """u = multilinear is in Q1 and Q2: reproduced to 1e-10 with hanging nodes."""
    if dim == 2:
        u = lambda x: 1 + 2 * x[..., 0] - x[..., 1] + 3 * x[..., 0] * x[..., 1]
    else:
        u = lambda x: 1 + x[..., 0] - 2 * x[..., 1] + x[..., 2] + 4 * x[..., 0] * x[..., 1] * x[..., 2]
    m = random_adaptive(dim, seed, 3 if dim == 2 else 2)
    assert m.num_hanging_nodes > 0
    s = Space(m, k)
    uh, K = solve_poisson(s, 0.0, u)
    assert np.abs(uh - u(s.points)).max() < 1e-10
    assert abs(K - K.T).max() < 1e-12 * abs(K).max()         # the constrained system stays symmetric


def rate(hs, es):
    return np.polyfit(np.log(hs), np.log(es), 1)[0]


def sin_problem(dim):
    u = lambda x: np.prod(np.sin(np.pi * x), axis=-1)

    def grad(x):
        s, c = np.sin(np.pi * x), np.cos(np.pi * x)
        g = []
        for a in range(dim):
            t = np.pi * c[..., a]
            for b in range(dim):
                if b != a:
                    t = t * s[..., b]
            g.append(t)
        return np.stack(g, -1)

    f = lambda x: dim * np.pi ** 2 * u(x)
    return u, grad, f


def distort(x):
    y = x.copy()
    d = x.shape[1]
    bump = np.prod(np.sin(np.pi * x), axis=1)
    for a in range(d):
        y[:, a] += 0.08 * bump * np.cos(np.pi * (a + 1) * x[:, (a + 1) % d])
    return y


def meshes(kind, dim, levels, start=1):
    """Sequences with h halving: uniform, adaptive base refined uniformly, distorted base."""
    base = Mesh.box([0] * dim, [1] * dim, [2] * dim)
    if kind == "adaptive":
        base = base.refine([0])
        base = base.refine(np.flatnonzero(base.levels == 1)[:2])
    elif kind == "distorted":
        base = base.refine().map(distort)
    out = []
    m = base
    for i in range(start + levels):
        if i >= start:
            out.append(m)
        m = m.refine()
    return out


# (dim, degree, number of meshes, refinements of the base before the first one)
CASES = [(2, 1, 4, 2), (2, 2, 3, 1), (3, 1, 3, 1), (3, 2, 3, 0)]


@pytest.mark.parametrize("kind", ["uniform", "adaptive", "distorted"])
@pytest.mark.parametrize("dim,k,levels,start", CASES)
def test_convergence_rates(kind, dim, k, levels, start):
    u, grad, f = sin_problem(dim)
    hs, e0, e1 = [], [], []
    for m in meshes(kind, dim, levels, start):
        s = Space(m, k)
        if kind == "adaptive":
            assert s.hanging_nodes.size > 0
        uh, _ = solve_poisson(s, f, 0.0)
        e = errors(s, uh, u, grad)
        hs.append(m.volumes().max() ** (1 / dim))
        e0.append(e["L2"])
        e1.append(e["H1"])
    r0, r1 = rate(hs, e0), rate(hs, e1)
    assert abs(r0 - (k + 1)) < 0.3, (r0, e0)
    assert abs(r1 - k) < 0.2, (r1, e1)
