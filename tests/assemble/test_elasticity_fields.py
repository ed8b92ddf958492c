"""elasticity(): the block fields formed from the combined factor and summed by FieldSums, against
a direct reference (per-cell einsum, np.add.at per block field) on hanging-node meshes, and the
``format="fields"`` layout against the BSR one."""
import numpy as np
import pytest
import scipy.sparse as sp

from adaptmg import assemble as asm
from adaptmg.fe import Space
from adaptmg.fe.element import LagrangeQ
from adaptmg.fe.geometry import CellGeometry
from adaptmg.fe.quadrature import tensor_gauss
from adaptmg.mesh import Mesh


def _hanging_mesh(dim):
    m = Mesh.box([0.0] * dim, [1.0] * dim, [3] * dim).refine()
    m = m.refine(np.linalg.norm(m.points[m.cells].mean(axis=1), axis=1) < 0.4)
    return m.refine(np.linalg.norm(m.points[m.cells].mean(axis=1) - 0.1, axis=1) < 0.2)


def _reference(space, lam, mu):
    """Q1 elasticity from the per-cell gradients, each block field summed by its own np.add.at."""
    m = space.mesh
    d = m.dim
    xi, w = tensor_gauss(d, 2)
    el = LagrangeQ(1, d)
    dphi = el.gradients(xi)                                   # (nq, nloc, d)
    g = CellGeometry(m.points[m.cells], xi, check=False)
    grad = np.einsum("qib,cqba->cqia", dphi, g.invJ)          # physical gradients
    lam_q = np.broadcast_to(np.asarray(lam, float).reshape(-1, 1), g.detJ.shape)
    wd = g.detJ * w
    E = np.einsum("cq,cqia,cqjf->afcij", wd, grad, grad)      # lam-free part
    El = np.einsum("cq,cqia,cqjf->afcij", wd * lam_q, grad, grad)
    cd = space.cell_dofs
    nn = space.num_nodes
    rows = np.broadcast_to(cd[:, :, None], E.shape[2:]).reshape(-1)
    cols = np.broadcast_to(cd[:, None, :], E.shape[2:]).reshape(-1)
    A = sp.csr_matrix((nn * d, nn * d))
    for r in range(d):
        for s in range(d):
            K = El[r, s] + mu * E[s, r] + (mu * sum(E[a, a] for a in range(d)) if r == s else 0.0)
            A = A + sp.csr_matrix((K.reshape(-1), (rows * d + r, cols * d + s)), shape=A.shape)
    return A.tocsr()


@pytest.mark.parametrize("dim", [2, 3])
@pytest.mark.parametrize("lam_kind", ["const", "percell"])
def test_elasticity_equals_the_direct_reference(dim, lam_kind):
    m = _hanging_mesh(dim)
    s = Space(m, 1, components=dim)
    lam = 8.0e4 if lam_kind == "const" else np.random.default_rng(0).uniform(1.0, 9.0, m.num_cells)
    A = asm.elasticity(s, lam, 2.0e4 if lam_kind == "const" else 1.5)
    R = _reference(s, lam, 2.0e4 if lam_kind == "const" else 1.5)
    rowmax = abs(R).max(axis=1).toarray().ravel()
    diff = abs(A - R).max(axis=1).toarray().ravel()
    assert np.all(diff <= 1e-14 * rowmax)


@pytest.mark.parametrize("dim", [2, 3])
@pytest.mark.parametrize("return_mass", [False, True])
def test_elasticity_fields_layout_equals_bsr(dim, return_mass):
    s = Space(_hanging_mesh(dim), 1, components=dim)
    rng = np.random.default_rng(dim)
    lam, mu = rng.uniform(1, 3, s.mesh.num_cells), 1.25
    out = asm.elasticity(s, lam, mu, format="bsr", return_mass=return_mass)
    B, M = out if return_mass else (out, None)
    ip, ind, data = asm.elasticity(s, lam, mu, format="fields", return_mass=return_mass)
    np.testing.assert_array_equal(ip, B.indptr)
    np.testing.assert_array_equal(ind, B.indices)
    off = 1 if return_mass else 0
    assert data.shape == (B.indices.size, off + dim * dim)
    # the same element entries summed in the same order: bit for bit
    np.testing.assert_array_equal(data[:, off:], B.data.reshape(-1, dim * dim))
    if return_mass:
        np.testing.assert_array_equal(data[:, 0], M.data)
        np.testing.assert_array_equal(M.indices, ind)
    with pytest.raises(ValueError):
        asm.elasticity(s, lam, mu, format="coo")
