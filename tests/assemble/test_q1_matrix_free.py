"""adaptmg.assemble.matrix_free.Q1Laplacian: the stiffness matrix's product and the constrained
diagonal without a matrix -- against adaptmg.assemble.stiffness on meshes with hanging nodes and
non-affine cells, on the host and (``-m gpu``) on the device."""
import numpy as np
import pytest
import scipy.sparse as sp

from adaptmg import assemble
from adaptmg.assemble.matrix_free import Q1Laplacian
from adaptmg.backend import to_host
from adaptmg.fe import Constraints, Space
from adaptmg.mesh import Mesh
from adaptmg.multilevel.hierarchy import dirichlet_dofs

EPS = np.finfo(float).eps


def _mesh(dim):
    m = Mesh.box([0.0] * dim, [1.0] * dim, [3] * dim).refine()
    m = m.refine(np.arange(m.num_cells) % 3 == 0)            # hanging nodes
    bump = lambda p: p + 0.05 * np.prod(np.sin(np.pi * p), axis=1)[:, None] * np.linspace(1, -1, dim)  # noqa: E731
    return m.map(bump)                                        # multilinear, not affine, cells


def _reference(dim):
    space = Space(_mesh(dim), 1)
    A = assemble.stiffness(space)
    H = sp.csr_matrix(space.H)
    Z = sp.diags(Constraints(space, dirichlet_dofs(space, "all")).free.astype(float))
    HZ = (H @ Z).tocsr()
    return space, A, HZ


@pytest.mark.parametrize("dim", [2, 3])
def test_product_and_diagonal_equal_the_assembled_matrix(dim):
    space, A, HZ = _reference(dim)
    op = Q1Laplacian(space.mesh.points, space.mesh.cells)
    u = np.random.default_rng(0).standard_normal(space.num_nodes)
    v = np.full_like(u, 2.0)
    op.apply(u, v)                                            # accumulates: v = 2 + A u
    ref = A @ u
    assert np.abs(v - 2.0 - ref).max() <= 50 * EPS * np.abs(ref).max()
    d = op.constrained_diagonal(HZ, HZ.shape[1])
    dref = (HZ.T @ A @ HZ).diagonal()
    assert np.abs(d - dref).max() <= 50 * EPS * np.abs(dref).max()
    assert (d[HZ.getnnz(axis=0) == 0] == 0).all() and (dref > 0).sum() == (d > 0).sum()


def test_inverted_cell_and_bad_input_are_refused():
    m = Mesh.box([0, 0], [1, 1], [2, 2])
    cells = np.array(m.cells)
    cells[1] = cells[1][[1, 0, 3, 2]]                         # mirrored: det J < 0
    with pytest.raises(ValueError, match="cell 1 has det J <= 0"):
        Q1Laplacian(m.points, cells)
    with pytest.raises(ValueError, match=r"cells must have shape \(C, 4\)"):
        Q1Laplacian(m.points, cells[:, :3])
    with pytest.raises(TypeError, match="integer node indices"):
        Q1Laplacian(m.points, cells.astype(float))
    with pytest.raises(ValueError, match="points must have shape"):
        Q1Laplacian(m.points[:, :1], cells)
    op = Q1Laplacian(m.points, m.cells)
    with pytest.raises(ValueError, match="HZ must have shape"):
        op.constrained_diagonal(sp.identity(3, format="csr"), 3)


@pytest.mark.gpu
@pytest.mark.parametrize("dim", [2, 3])
def test_device_kernels_equal_the_host_sums(dim):
    from adaptmg.backend import get_backend
    be = get_backend("gpu")
    space, A, HZ = _reference(dim)
    host = Q1Laplacian(space.mesh.points, space.mesh.cells)
    dev = Q1Laplacian(space.mesh.points, space.mesh.cells, backend="gpu")
    u = np.random.default_rng(1).standard_normal(space.num_nodes)
    v = np.zeros_like(u)
    host.apply(u, v)
    vd = be.xp.zeros(u.size)
    dev.apply(be.asarray(u), vd)
    assert np.abs(to_host(vd) - v).max() <= 50 * EPS * np.abs(v).max()
    d = host.constrained_diagonal(HZ, HZ.shape[1])
    dd = to_host(dev.constrained_diagonal(be.asmatrix(HZ), HZ.shape[1]))
    assert np.abs(dd - d).max() <= 50 * EPS * np.abs(d).max()
    cells = np.array(space.mesh.cells)
    cells[2] = cells[2][np.arange(2 ** dim) ^ 1]            # mirrored in x: det J < 0
    bad = Q1Laplacian(space.mesh.points, cells, backend="gpu")
    with pytest.raises(ValueError, match="cell 2 has det J <= 0"):
        bad.constrained_diagonal(be.asmatrix(HZ), HZ.shape[1])
