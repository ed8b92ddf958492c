"""Reference elements, quadrature and cell geometry (adaptmg.fe.element/quadrature/geometry)."""
import itertools

import numpy as np
import pytest

from adaptmg.fe.element import LagrangeQ, lagrange_1d, lagrange_1d_derivative
from adaptmg.fe.geometry import CellGeometry, cell_geometry, metric_factor
from adaptmg.fe.quadrature import default_num_points, gauss_legendre, tensor_gauss

CASES = [(k, d) for k in (1, 2) for d in (2, 3)]
rng = np.random.default_rng(0)


@pytest.mark.parametrize("k,d", CASES)
def test_partition_of_unity_and_kronecker(k, d):
    el = LagrangeQ(k, d)
    assert el.num_local == (k + 1) ** d
    xi = rng.random((50, d))
    assert np.allclose(el.values(xi).sum(1), 1.0, atol=1e-14)
    assert np.allclose(el.gradients(xi).sum(1), 0.0, atol=1e-13)
    assert np.allclose(el.values(el.nodes), np.eye(el.num_local), atol=1e-14)


@pytest.mark.parametrize("k,d", CASES)
def test_lexicographic_numbering(k, d):
    el = LagrangeQ(k, d)
    for j in range(el.num_local):
        idx = [(j // (k + 1) ** a) % (k + 1) for a in range(d)]
        assert np.allclose(el.nodes[j], np.array(idx) / k)
    if k == 1:   # vertex v at (v&1, (v>>1)&1, (v>>2)&1)
        for v in range(2 ** d):
            assert tuple(el.nodes[v]) == tuple(float((v >> a) & 1) for a in range(d))


@pytest.mark.parametrize("k,d", CASES)
def test_gradients_match_finite_differences(k, d):
    el = LagrangeQ(k, d)
    xi = 0.1 + 0.8 * rng.random((20, d))
    g = el.gradients(xi)
    h = 1e-6
    for b in range(d):
        e = np.zeros(d)
        e[b] = h
        fd = (el.values(xi + e) - el.values(xi - e)) / (2 * h)
        assert np.abs(fd - g[:, :, b]).max() < 1e-8


@pytest.mark.parametrize("k,d", CASES)
def test_reproduces_Qk_polynomials(k, d):
    el = LagrangeQ(k, d)
    alphas = list(itertools.product(range(k + 1), repeat=d))
    coef = rng.standard_normal(len(alphas))

    def p(x):
        return sum(c * np.prod(x ** np.array(a), axis=1) for c, a in zip(coef, alphas))

    def dp(x, b):
        out = 0.0
        for c, a in zip(coef, alphas):
            if a[b] == 0:
                continue
            a2 = np.array(a)
            a2[b] -= 1
            out = out + c * a[b] * np.prod(x ** a2, axis=1)
        return out

    xi = rng.random((40, d))
    assert np.allclose(el.values(xi) @ p(el.nodes), p(xi), atol=1e-12)
    for b in range(d):
        assert np.allclose(el.gradients(xi)[:, :, b] @ p(el.nodes), dp(xi, b), atol=1e-11)
    # and a polynomial of degree k+1 in one variable is NOT reproduced
    q = el.nodes[:, 0] ** (k + 1)
    assert np.abs(el.values(xi) @ q - xi[:, 0] ** (k + 1)).max() > 1e-3


def test_lagrange_1d():
    nodes = np.array([0.0, 0.3, 1.0])
    x = np.linspace(0, 1, 7)
    L = lagrange_1d(nodes, x)
    assert L.shape == (7, 3)
    assert np.allclose(lagrange_1d(nodes, nodes), np.eye(3))
    assert np.allclose(L @ nodes ** 2, x ** 2)                 # quadratics reproduced
    assert np.allclose(lagrange_1d_derivative(nodes, x) @ nodes ** 2, 2 * x)
    with pytest.raises(ValueError, match="distinct"):
        lagrange_1d([0.0, 0.0], x)
    with pytest.raises(ValueError, match="xi must have shape"):
        LagrangeQ(1, 2).values(np.zeros((3, 3)))
    with pytest.raises(ValueError, match="degree"):
        LagrangeQ(0, 2)


@pytest.mark.parametrize("d", [1, 2, 3])
@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_tensor_gauss_exactness(d, n):
    pts, w = tensor_gauss(d, n)
    assert pts.shape == (n ** d, d) and w.shape == (n ** d,)
    assert np.isclose(w.sum(), 1.0)
    assert np.all((pts > 0) & (pts < 1))
    for a in itertools.product(range(2 * n), repeat=d):       # degree <= 2n-1 per variable: exact
        exact = np.prod([1.0 / (ai + 1) for ai in a])
        assert abs(w @ np.prod(pts ** np.array(a), axis=1) - exact) < 1e-14
    a = [2 * n] + [0] * (d - 1)                                  # degree 2n: not exact
    assert abs(w @ pts[:, 0] ** (2 * n) - 1.0 / (2 * n + 1)) > 1e-6


def test_gauss_legendre_and_default():
    x, w = gauss_legendre(2)
    assert np.allclose(x, 0.5 + np.array([-1, 1]) / (2 * np.sqrt(3)))
    assert default_num_points(1) == 2 and default_num_points(2) == 3
    with pytest.raises(ValueError):
        gauss_legendre(0)


class _M:
    def __init__(self, points, cells):
        self.points, self.cells, self.dim = np.asarray(points, float), np.asarray(cells), np.asarray(points).shape[1]


@pytest.mark.parametrize("d", [2, 3])
def test_affine_geometry(d):
    A = np.eye(d) + 0.3 * rng.standard_normal((d, d))
    A *= np.sign(np.linalg.det(A))
    if np.linalg.det(A) < 0:
        A[0] *= -1
    b = rng.standard_normal(d)
    ref = LagrangeQ(1, d).nodes
    mesh = _M(ref @ A.T + b, np.arange(2 ** d)[None, :])
    xi, w = tensor_gauss(d, 3)
    g = cell_geometry(mesh, xi)
    assert np.allclose(g.J, A)
    assert np.allclose(g.detJ, np.linalg.det(A))
    assert np.allclose(g.invJ @ g.J, np.eye(d))
    assert np.allclose(g.invJT, np.linalg.inv(A).T)
    assert np.allclose(g.x[0], xi @ A.T + b)
    assert np.isclose(g.volumes(w)[0], np.linalg.det(A))
    F = metric_factor(g.J, g.detJ, np.ones_like(g.detJ))
    Ai = np.linalg.inv(A)
    assert np.allclose(F, np.linalg.det(A) * Ai @ Ai.T)


def test_bilinear_geometry_and_gradients():
    # a general (non-parallelogram) quad: J varies with xi, det J = |T| on average
    X = np.array([[0.0, 0.0], [2.0, 0.0], [0.0, 1.0], [1.5, 1.8]])
    g = CellGeometry(X[None], *tensor_gauss(2, 2)[:1])
    xi, w = tensor_gauss(2, 2)
    area = 0.5 * abs((X[3, 0] - X[0, 0]) * (X[2, 1] - X[1, 1]) - (X[2, 0] - X[1, 0]) * (X[3, 1] - X[0, 1]))
    assert np.isclose(g.volumes(w)[0], area)
    assert np.ptp(g.detJ) > 0.1
    # physical gradients of x_0 and x_1 (in the space) are e_0, e_1
    el = LagrangeQ(1, 2)
    G = g.physical_gradients(el.gradients(xi))
    assert np.allclose(np.einsum("cqia,i->cqa", G, X[:, 0]), [1, 0])
    assert np.allclose(np.einsum("cqia,i->cqa", G, X[:, 1]), [0, 1])


def test_nonpositive_jacobian_raises():
    ref = LagrangeQ(1, 2).nodes
    cells = np.stack([ref + [i, 0] for i in range(5)])       # 5 unit squares in a row
    cells[3] = cells[3][[1, 0, 3, 2]]                          # mirrored vertex order
    with pytest.raises(ValueError, match=r"1 cell\(s\).*first offending cell index 3"):
        CellGeometry(cells, tensor_gauss(2, 2)[0])
    g = CellGeometry(cells, tensor_gauss(2, 2)[0], check=False)
    assert g.bad.tolist() == [False, False, False, True, False]
    with pytest.raises(ValueError, match="vertices must have shape"):
        CellGeometry(np.zeros((2, 3, 2)), tensor_gauss(2, 2)[0])


def test_matmul_serial_blocks():
    from adaptmg.fe.geometry import matmul_serial
    A = rng.standard_normal((1000, 72))
    B = rng.standard_normal((72, 64))
    assert np.allclose(matmul_serial(A, B), A @ B)               # split into row blocks
    out = np.empty((1000, 64))
    assert matmul_serial(A[:3], B, out=out[:3]) is not None and np.allclose(out[:3], A[:3] @ B)


def test_affine_mask():
    from adaptmg.fe.geometry import affine_mask
    for d in (2, 3):
        ref = LagrangeQ(1, d).nodes
        A = np.eye(d) + 0.3 * rng.standard_normal((d, d))
        X = np.stack([ref @ A.T, ref @ A.T + 1.0, ref.copy()])
        X[2, -1] += 0.05                                         # move the last vertex: not affine
        assert affine_mask(X).tolist() == [True, True, False]
        # against the definition: coefficients C (monomials of degree >= 2) times the vertices
        V = rng.standard_normal((300, 2 ** d, d))
        V[::2] = V[::2, :1] + (ref @ A.T)[None]                   # affine half
        V[::4] += 1e-14 * rng.standard_normal((75, 2 ** d, d))      # within the tolerance or not
        C = np.array([[(-1) ** (bin(S).count("1") - bin(v).count("1")) if v & ~S == 0 else 0
                       for v in range(2 ** d)] for S in range(2 ** d) if bin(S).count("1") >= 2])
        twist = np.abs(np.einsum("tv,cva->cta", C, V)).max(axis=(1, 2))
        size = np.abs(V - V[:, :1]).max(axis=(1, 2))
        assert np.array_equal(affine_mask(V), twist <= 1e-12 * size)
        assert affine_mask(V[:0]).shape == (0,)
