"""Transfer between nested spaces: the embedding chi and Mesh.parent_of on adaptive meshes."""
import numpy as np
import pytest
import scipy.sparse as sp

from adaptmg.fe import Space
from adaptmg.mesh import Mesh
from adaptmg.multilevel.transfer import interpolation_matrix


def _adaptive(dim):
    m = Mesh.box([0.0] * dim, [1.0] * dim, [3] * dim).refine()
    m = m.refine(np.flatnonzero(m.cell_vertices().mean(1)[:, 0] < 0.4))
    return m.refine(np.flatnonzero(m.cell_vertices().mean(1).sum(1) < 0.5))


def _chi_reference(coarse, fine):
    """Dense per-node evaluation: coarse basis of the containing coarse cell at every fine node."""
    cidx, child = fine.mesh.parent_of(coarse.mesh)
    el = fine.element
    d = fine.dim
    cor = np.array([[(b >> a) & 1 for a in range(d)] for b in range(2 ** d)], float)
    first = {}
    for c, row in enumerate(fine.cell_dofs):
        for j, node in enumerate(row):
            first.setdefault(int(node), (c, j))
    A = np.zeros((fine.num_nodes, coarse.num_nodes))
    for node, (c, j) in first.items():
        xi = el.nodes[j] if child[c] < 0 else (cor[child[c]] + el.nodes[j]) / 2.0
        w = el.values(xi[None, :])[0]
        w[np.abs(w) < 1e-13] = 0.0
        A[node, coarse.cell_dofs[cidx[c]]] += w
    return A


@pytest.mark.parametrize("dim,k", [(2, 1), (2, 2), (3, 1), (3, 2)])
def test_interpolation_matrix_matches_pointwise_evaluation(dim, k):
    H = _adaptive(dim).hierarchy()
    assert H[-1].num_hanging_nodes > 0
    for mc, mf in zip(H[:-1], H[1:]):
        sc, sf = Space(mc, k), Space(mf, k)
        chi = interpolation_matrix(sc, sf)
        assert chi.has_canonical_format and chi.indices.dtype == np.int32
        assert np.array_equal(chi.toarray(), _chi_reference(sc, sf))
        # nested spaces: the embedding reproduces degree-k polynomials at the fine nodes
        p = lambda x: (1 + x[:, 0]) ** k * (2 - x[:, -1])  # noqa: E731
        assert np.allclose(chi @ p(sc.points), p(sf.points), atol=1e-13)
        assert sp.isspmatrix_csr(chi)


def test_parent_of_rejects_foreign_and_twice_refined_meshes():
    m = Mesh.box([0.0, 0.0], [1.0, 1.0], [2, 2])
    f2 = m.refine().refine()
    with pytest.raises(ValueError, match="more than once"):
        f2.parent_of(m)
    other = Mesh.box([0.0, 0.0], [1.0, 1.0], [3, 3])
    with pytest.raises(ValueError, match="refinement history"):
        m.refine().parent_of(other)
    cidx, child = m.refine(np.array([1])).parent_of(m)
    assert cidx.tolist() == [0, 2, 3, 1, 1, 1, 1] and child.tolist() == [-1, -1, -1, 0, 1, 2, 3]
