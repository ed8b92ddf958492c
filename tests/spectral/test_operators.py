"""GLL numbering on unstructured meshes and the matrix-free operators against an
independent dense element-matrix assembly."""
import numpy as np
import pytest

import adaptmg
from adaptmg.spectral.basis import gll_weights, quadrature_rule
from adaptmg.spectral.operators import SpectralOperator
from adaptmg.spectral.space import SpectralSpace, _multilinear, local_indices
from adaptmg.spectral.basis import gll_points

from .helpers import distorted_box, scrambled, wavy

EPS = np.finfo(float).eps


@pytest.mark.parametrize("dim,k", [(2, 1), (2, 4), (3, 1), (3, 2), (3, 3)])
def test_numbering_shared_nodes_agree_on_scrambled_cells(dim, k):
    n = 3
    mesh = scrambled(adaptmg.Mesh.box([0] * dim, [1] * dim, [n] * dim).map(wavy), seed=k)
    V = SpectralSpace(mesh, k)
    assert V.num_dofs == (n * k + 1) ** dim
    # each cell's own multilinear image of its GLL points equals the shared global points
    xc = _multilinear(mesh.points[mesh.cells], gll_points(k), dim)
    assert np.abs(xc - V.points[V.cell_dofs]).max() < 100 * EPS
    assert len(np.unique(np.round(V.points, 10), axis=0)) == V.num_dofs
    assert V.boundary_dofs().size == (n * k + 1) ** dim - (n * k - 1) ** dim


def _dense_reference(V, quad, cm, ck):
    """Element matrices from Kronecker products and np.linalg.inv, added densely."""
    d, k = V.dim, V.degree
    B, DB, w = quadrature_rule(k, quad)
    B = np.eye(k + 1) if B is None else B
    W = np.prod(np.asarray(w)[local_indices(len(w) - 1, d)], axis=1)

    def kron(mats):                       # mats[ax] for ax = 0 (x) .. d-1; x fastest
        out = np.ones((1, 1))
        for M in mats[::-1]:
            out = np.kron(out, M)
        return out
    Dh = [kron([DB if ax == j else B for ax in range(d)]) for j in range(d)]
    Bh = kron([B] * d)
    N = V.num_dofs
    A = np.zeros((N, N))
    for c in range(V.mesh.num_cells):    # test reference: a loop over a handful of cells
        X = V.cell_points[c]                                       # (n^d, d)
        J = np.stack([np.stack([Dh[j] @ X[:, i] for j in range(d)], -1) for i in range(d)], -2)
        Ji = np.linalg.inv(J)
        det = np.linalg.det(J)
        Ke = np.zeros((Bh.shape[1],) * 2)
        grads = np.stack([Dh[j] for j in range(d)], -1)            # (nq, n^d, d)
        phys = np.einsum("qpj,qji->qpi", grads, Ji)                # grad phi . J^-1
        Ke = ck * np.einsum("q,qpi,qri->pr", W * det, phys, phys) + cm * Bh.T @ ((W * det)[:, None] * Bh)
        dofs = V.cell_dofs[c]
        A[np.ix_(dofs, dofs)] += Ke
    return A


@pytest.mark.parametrize("dim,k,quad", [(2, 3, "gll"), (2, 2, "gauss"), (3, 2, "gll"), (3, 3, "gauss")])
def test_operator_equals_assembled_reference(dim, k, quad):
    V = SpectralSpace(distorted_box(dim, 2), k)
    op = SpectralOperator(V, mass=0.7, stiffness=1.3, quadrature=quad, backend="cpu")
    A = np.stack([op.matvec(e) for e in np.eye(V.num_dofs)], 1)
    R = _dense_reference(V, quad, 0.7, 1.3)
    scale = np.abs(R).max()
    assert np.abs(A - R).max() <= 200 * EPS * scale
    assert np.abs(A - A.T).max() <= 50 * EPS * scale
    assert np.abs(op.diagonal() - np.diag(R)).max() <= 200 * EPS * scale
    # on-the-fly geometry (from the vertices) gives the same operator
    otf = SpectralOperator(V, mass=0.7, stiffness=1.3, quadrature=quad, geometry="on_the_fly", backend="cpu")
    x = np.random.default_rng(1).standard_normal(V.num_dofs)
    assert np.abs(otf.matvec(x) - A @ x).max() <= 500 * EPS * scale * np.abs(x).max()


def test_mass_integrates_volume_and_stiffness_linear_energy():
    mesh = distorted_box(3, 3, seed=5)
    V = SpectralSpace(mesh, 3)
    M = SpectralOperator(V, mass=1, stiffness=0, quadrature="gauss", backend="cpu")
    K = SpectralOperator(V, quadrature="gauss", backend="cpu")
    one = np.ones(V.num_dofs)
    vol = mesh.volumes().sum()
    assert abs(one @ M.matvec(one) - vol) < 50 * EPS
    a = np.array([0.3, -1.1, 0.7])
    u = V.points @ a
    assert abs(u @ K.matvec(u) - (a @ a) * vol) < 200 * EPS
    assert np.abs(K.matvec(one)).max() < 100 * EPS


def test_float32_operator_close_to_float64():
    V = SpectralSpace(distorted_box(3, 2), 4)
    x = np.random.default_rng(2).standard_normal(V.num_dofs)
    y64 = SpectralOperator(V, mass=1.0, stiffness=0.1, backend="cpu").matvec(x)
    op32 = SpectralOperator(V, mass=1.0, stiffness=0.1, dtype=np.float32, backend="cpu")
    y32 = op32.matvec(x.astype(np.float32))
    assert y32.dtype == np.float32
    e32 = np.finfo(np.float32).eps
    assert np.abs(y32 - y64).max() <= 200 * e32 * np.abs(y64).max()
    assert np.abs(y32 - y64).max() > 0.0


def test_bad_input_errors():
    mesh = adaptmg.Mesh.box([0, 0, 0], [1, 1, 1], [2, 2, 2])
    with pytest.raises(ValueError, match="1..8"):
        SpectralSpace(mesh, 9)
    with pytest.raises(TypeError):
        SpectralSpace(mesh, 2.0)
    with pytest.raises(ValueError, match="non-positive Jacobian"):
        SpectralSpace(mesh, 2, mapping=lambda x: x * np.array([1.0, 1.0, -1.0]))
    assert SpectralSpace(mesh.refine([0]), 2).hanging_dofs.size > 0   # 2:1 meshes: test_hanging.py
    V = SpectralSpace(mesh, 2)
    with pytest.raises(ValueError, match="shape"):
        SpectralOperator(V, backend="cpu").matvec(np.ones(3))
    with pytest.raises(ValueError, match="on_the_fly"):
        SpectralOperator(SpectralSpace(mesh, 2, mapping=lambda x: x), geometry="on_the_fly")


@pytest.mark.gpu
def test_gpu_operator_matches_cpu():
    V = SpectralSpace(distorted_box(3, 3), 4)
    x = np.random.default_rng(3).standard_normal(V.num_dofs)
    for geom in ("stored", "on_the_fly"):
        c = SpectralOperator(V, mass=0.5, geometry=geom, backend="cpu").matvec(x)
        g = SpectralOperator(V, mass=0.5, geometry=geom, backend="gpu").matvec(x)
        assert np.abs(g.get() - c).max() <= 200 * EPS * np.abs(c).max()


@pytest.mark.parametrize("cols,high", [(1, 50), (2, 7), (3, 40), (3, 3_000_000), (4, 9), (4, 5_000_000_000), (5, 4)])
def test_row_ids_equal_numpy_unique_rows(cols, high):
    # the packed-key paths (one 1-D unique, a lexsort of two packed columns) and the fallback
    from adaptmg.spectral.space import row_ids
    rng = np.random.default_rng(cols)
    keys = rng.integers(0, high, size=(400, cols))
    keys = np.concatenate([keys, keys[rng.integers(0, 400, 300)]])          # repeated rows
    ref = np.unique(keys, axis=0, return_inverse=True)[1].ravel()
    assert np.array_equal(row_ids(keys), ref)
    assert row_ids(np.zeros((0, cols), dtype=np.int64)).size == 0
