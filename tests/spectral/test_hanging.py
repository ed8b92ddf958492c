"""Spectral Q_k on 2:1 adaptive meshes with hanging nodes (adaptmg.spectral.hanging):
the GLL constraint matrix H reproduces global Q_k polynomials at the hanging nodes, the
constrained Galerkin solve (Gauss quadrature) reproduces u in Q_k exactly, the L2 error
falls like h^(k+1) on adaptively refined meshes, and broken meshes get clear errors."""
import numpy as np
import pytest

from adaptmg import Mesh
from adaptmg.spectral import SpectralSpace, poisson
from adaptmg.spectral.hanging import hanging_matrix

from .helpers import distorted_box

EPS = np.finfo(float).eps


def _shear(x):
    """An affine, non-Cartesian map: x_0 += 0.3 x_1 (+ 0.2 x_2); polynomials stay in Q_k."""
    y = x.copy()
    y[:, 0] += 0.3 * x[:, 1] + (0.2 * x[:, 2] if x.shape[1] == 3 else 0.0)
    return y


def _two_to_one(dim, n=2, mesh=None, levels=2):
    """``levels`` nested refinements of the cells near the corner 0.3: hanging nodes on
    edges and faces, of two levels."""
    m = Mesh.box([0] * dim, [1] * dim, [n] * dim) if mesh is None else mesh
    for r in (0.45, 0.3)[:levels]:
        c = m.points[m.cells].mean(1)
        m = m.refine(np.flatnonzero(np.linalg.norm(c - 0.3, axis=1) < r))
    return m


def _poly(k, dim):
    """u in Q_k on the sheared cells too (x^k + y^k z; 2-D x^k + y^k + x y^(k-1)), -Laplace u."""
    if dim == 3:
        return (lambda x: x[..., 0] ** k + x[..., 1] ** k * x[..., 2],
                lambda x: -k * (k - 1) * (x[..., 0] ** (k - 2) + x[..., 1] ** (k - 2) * x[..., 2]))
    return (lambda x: x[..., 0] ** k + x[..., 1] ** k + x[..., 0] * x[..., 1] ** (k - 1),
            lambda x: -k * (k - 1) * (x[..., 0] ** (k - 2) + x[..., 1] ** (k - 2))
            - (k - 1) * (k - 2) * x[..., 0] * x[..., 1] ** max(k - 3, 0))


@pytest.mark.parametrize("dim, degrees", [(2, (1, 2, 3, 5, 8)), (3, (1, 2, 3, 4))])
def test_H_reproduces_global_Qk_at_hanging_nodes(dim, degrees):
    mesh = _two_to_one(dim).map(_shear)
    assert mesh.num_hanging_nodes > 0
    for k in degrees:
        V = SpectralSpace(mesh, k)
        u = _poly(k, dim)[0](V.points)
        hd = V.hanging_dofs
        # hanging GLL nodes: every fine node inside a hanging edge/face (the (k-1) interior
        # nodes of each hanging edge and (k-1)^2 of each hanging face, plus the mesh nodes)
        assert hd.size >= mesh.num_hanging_nodes * (1 if k == 1 else 2)
        assert np.abs(V.H @ u - u).max() < 100 * EPS * np.abs(u).max(), k
        # a function off Q_k is changed at the hanging nodes only, and H is a projection
        v = np.random.default_rng(k).standard_normal(V.num_dofs)
        w = V.H @ v
        regular = np.setdiff1d(np.arange(V.num_dofs), hd)
        assert np.array_equal(w[regular], v[regular])
        assert np.abs(w[hd] - v[hd]).max() > 1e-6
        assert np.abs(V.H @ w - w).max() < 100 * EPS
        assert V.H[:, hd].count_nonzero() == 0


def test_conforming_mesh_has_no_constraints():
    V = SpectralSpace(Mesh.box([0, 0], [1, 1], [3, 3]), 4)
    assert V.H is None and V.hanging_dofs.size == 0


@pytest.mark.parametrize("dim, k, pc", [(2, 2, "two-scale"), (2, 3, "fine"), (2, 4, "jacobi"), (2, 4, "pmg"),
                                        (3, 2, "fine"), (3, 3, "two-scale"), (3, 4, "pmg")])
def test_poisson_reproduces_Qk_polynomial(dim, k, pc):
    """Continuity across hanging faces is exact: the Galerkin solution (exact quadrature on
    the affine cells) equals u in Q_k up to rounding."""
    mesh = _two_to_one(dim).map(_shear)
    u, f = _poly(k, dim)
    s = poisson(mesh, k, f, g=u, preconditioner=pc, quadrature="gauss", rtol=1e-13, backend="cpu")
    assert s.info == 0
    assert s.num_dofs == s.space.num_dofs - s.space.hanging_dofs.size
    assert s.l2_error(u) < 1e-10, s.l2_error(u)
    assert np.abs(s.u - u(s.space.points)).max() < 1e-10


def _exact(x):
    e = np.sin(np.pi * x[..., 0]) * np.exp(0.8 * x[..., 1])
    return e * np.cos(0.5 * x[..., 2]) if x.shape[-1] == 3 else e


def _rhs(x):
    return (np.pi ** 2 - 0.64 + (0.25 if x.shape[-1] == 3 else 0.0)) * _exact(x)


@pytest.mark.parametrize("dim, k, ns", [(2, 2, (4, 8, 16)), (2, 3, (4, 8, 16)), (3, 2, (2, 4)), (3, 3, (2, 4))])
def test_l2_rate_on_adaptive_meshes(dim, k, ns):
    """Each mesh: a distorted n^d mesh whose cells near a corner are refined twice more
    (nested), so hanging edges/faces of two levels sit in the smooth solution; h halves."""
    errs, its = [], []
    for n in ns:
        mesh = _two_to_one(dim, mesh=distorted_box(dim, n, seed=n), levels=2 if dim == 2 else 1)
        assert mesh.num_hanging_nodes > 0
        s = poisson(mesh, k, _rhs, g=_exact, rtol=1e-12, backend="cpu")
        assert s.info == 0
        errs.append(s.l2_error(_exact))
        its.append(s.iterations)
    rates = np.log2(np.array(errs[:-1]) / np.array(errs[1:]))
    assert (rates > k + 1 - 0.3).all(), (rates, errs)
    assert (rates < k + 1 + 0.6).all(), (rates, errs)


def test_two_scale_and_pmg_h_independent_on_adaptive_meshes():
    """Hanging faces of two levels: two-scale and p-multigrid iterations stay bounded, the
    fine scale alone grows like 1/h (measured 2-D k = 3, n = 4 8 16 32: two-scale 26 25 26 25,
    pmg 19 18 18 18, fine 61 114 220 433; conforming n^2 meshes: 13 and 7)."""
    its = {pc: [poisson(_two_to_one(2, n=n), 3, _rhs, g=_exact, rtol=1e-8, preconditioner=pc,
                        backend="cpu").iterations for n in (4, 8, 16)] for pc in ("two-scale", "pmg", "fine")}
    ts, pm, fi = its["two-scale"], its["pmg"], its["fine"]
    assert max(ts) - min(ts) <= 2 and max(ts) <= 30, its
    assert max(pm) - min(pm) <= 2 and max(pm) <= 22 and all(p < t for p, t in zip(pm, ts)), its
    assert fi[1] > 1.6 * fi[0] and fi[2] > 1.6 * fi[1], its


def test_curved_mapping_is_conforming_at_hanging_nodes():
    """With a ``mapping`` the fine side's GLL points follow the coarse side's Q_k trace,
    so the geometry stays watertight and the solution converges."""
    wave = lambda x: x + 0.04 * np.sin(np.pi * x[..., ::-1])
    errs = []
    for n in (4, 8):
        V = SpectralSpace(_two_to_one(2, n=n), 3, mapping=wave)
        assert np.abs(V.H @ V.points - V.points).max() < 100 * EPS
        s = poisson(V.mesh, 3, _rhs, g=_exact, mapping=wave, rtol=1e-12, backend="cpu")
        errs.append(s.l2_error(_exact))
    assert np.log2(errs[0] / errs[1]) > 3.5, errs


def _unbalanced(dim):
    m = Mesh.box([0] * dim, [1] * dim, [2] * dim)._refine_exact(np.array([0]))
    c = m.points[m.cells].mean(1)
    return m._refine_exact(np.array([np.argmin(np.linalg.norm(c - 0.5, axis=1))]))


@pytest.mark.parametrize("dim", [2, 3])
def test_mesh_breaking_two_to_one_is_rejected(dim):
    with pytest.raises(ValueError, match="2:1 rule"):
        SpectralSpace(_unbalanced(dim), 3)


def test_hanging_matrix_without_hanging_nodes_is_identity():
    V = SpectralSpace(Mesh.box([0, 0, 0], [1, 1, 1], [2, 2, 2]), 3)
    H, hd = hanging_matrix(V)
    assert hd.size == 0 and (H != __import__("scipy.sparse").sparse.identity(V.num_dofs)).nnz == 0


@pytest.mark.gpu
@pytest.mark.parametrize("pc", ["two-scale", "fine", "pmg"])
def test_gpu_hanging_matches_cpu(pc):
    mesh = _two_to_one(3, n=3)
    c = poisson(mesh, 3, _rhs, g=_exact, preconditioner=pc, backend="cpu")
    g = poisson(mesh, 3, _rhs, g=_exact, preconditioner=pc, backend="gpu")
    assert abs(c.iterations - g.iterations) <= 1
    assert np.abs(g.u.get() - c.u).max() < 1e-7


@pytest.mark.parametrize("dim, k", [(2, 1), (2, 2), (3, 1), (3, 2)])
def test_constrained_operator_equals_fe_peer(dim, k):
    """k = 1, 2: the GLL points are the Q1/Q2 lattice, so the constrained functions H x and
    the constrained Helmholtz matrix H^T (M + K) H (Gauss quadrature, exact on the affine
    cells) equal adaptmg.fe's on the regular DoFs, matched by their points.  (For even k a
    hanging mesh vertex coincides with the coarse edge's middle GLL node: here it is a
    hanging DoF of its own with the weight 1 on that node, fe shares it -- same space.)"""
    from adaptmg import assemble
    from adaptmg.fe import Constraints, Space
    from adaptmg.spectral import SpectralProblem
    mesh = _two_to_one(dim, levels=2 if dim == 2 else 1).map(_shear)
    V, q = SpectralSpace(mesh, k), Space(mesh, k)
    _, inv = np.unique(np.round(np.vstack([V.points, q.points]), 10), axis=0, return_inverse=True)
    inv = inv.ravel()
    fe_of = np.full(inv.max() + 1, -1)
    fe_of[inv[V.num_dofs:]] = np.arange(q.num_dofs)
    m = fe_of[inv[:V.num_dofs]]                                # spectral DoF -> fe DoF at its point
    assert (m >= 0).all()
    reg = np.setdiff1d(np.arange(V.num_dofs), V.hanging_dofs)
    assert np.array_equal(np.sort(m[reg]), np.flatnonzero(~q.is_hanging))
    x = np.zeros(V.num_dofs)
    x[reg] = np.random.default_rng(1).standard_normal(reg.size)
    y = np.zeros(q.num_dofs)
    y[m[reg]] = x[reg]
    assert np.abs(V.H @ x - (q.H @ y)[m]).max() < 100 * EPS * np.abs(x).max()
    prob = SpectralProblem(V, dirichlet=None, mass=1.0, stiffness=1.0, preconditioner="none",
                           quadrature="gauss", backend="cpu")
    eye = np.eye(V.num_dofs)
    A = np.column_stack([prob.restrict(prob.op.matvec(prob.expand(eye[:, j]))) for j in reg])[reg]
    R = Constraints(q).project(assemble.stiffness(q) + assemble.mass(q)).toarray()[m[reg]][:, m[reg]]
    assert np.abs(A - R).max() < 100 * EPS * np.abs(R).max()
