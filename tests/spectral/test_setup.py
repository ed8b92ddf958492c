"""The spectral set-up (issue 39): the structures built on the backend equal independent
constructions, the chunked geometry equals one pass, a float32 problem converted from the
float64 set-up equals one built in float32, and the two-scale preconditioner with P^c on a
second CUDA stream equals the sequential one (``-m gpu``)."""
import numpy as np
import pytest
import scipy.sparse as sp

import adaptmg
from adaptmg.backend import get_backend
from adaptmg.spectral.space import array_nbytes
from adaptmg.spectral import SpectralProblem, SpectralSpace, poisson
from adaptmg.spectral import space as space_mod
from adaptmg.spectral.schwarz import CoarseQ1, FineSchwarz, TwoScale, space_transfer
from adaptmg.spectral.meshes import ogrid_cylinder

from .helpers import distorted_box

CPU = get_backend("cpu")
EPS = np.finfo(np.float64).eps


@pytest.fixture(scope="module")
def ogrid():
    return SpectralSpace(ogrid_cylinder(8, 4, height=1.0), 3)


def _host(A):
    return A.get() if hasattr(A, "get") else A


def test_gather_matrix_is_the_transposed_gather(ogrid, backend):
    V = ogrid
    G = _host(V.gather_matrix(backend))
    ref = sp.csr_matrix((np.ones(V.cell_dofs.size), (V.cell_dofs.ravel(), np.arange(V.cell_dofs.size))),
                        shape=G.shape)
    assert G.indices.dtype == np.int32 and G.has_sorted_indices       # the scatter kernel's order
    assert abs(G - ref).nnz == 0
    assert V.on_backend(backend, "gather") is V.on_backend(backend, "gather")   # made once


def test_fine_scale_index_and_scatter_agree(ogrid, backend):
    """The scatter matrix is the transpose of the patch index's gather, each valid box node
    of a cell's own DoFs is one of its box's interior nodes, and the weights are
    1/sqrt(number of patches holding the DoF)."""
    V = ogrid
    fixed = V.boundary_dofs("all")
    f = FineSchwarz(V, fixed, backend=backend)
    idx = np.asarray(_host(f.index))
    N, m, k = V.num_dofs, V.degree + 3, V.degree
    valid = idx.ravel() < N
    ref = sp.csr_matrix((np.ones(valid.sum()), (idx.ravel()[valid], np.flatnonzero(valid))), shape=(N, idx.size))
    assert abs(_host(f.scatter_matrix) - ref).nnz == 0
    assert not np.isin(idx[idx < N], fixed).any()
    box = idx.reshape((-1,) + (m,) * 3)[:, 1:k + 2, 1:k + 2, 1:k + 2].reshape(idx.shape[0], -1)
    own = V.cell_dofs
    free = ~np.isin(own, fixed)
    assert np.array_equal(box[free], own[free])                      # the cell sits in its box
    count = np.bincount(idx[idx < N], minlength=N)
    w = np.asarray(_host(f.weight))
    assert np.allclose(w[count > 0] ** -2, count[count > 0], rtol=10 * EPS)
    assert np.all(w[count == 0] == 0) and (count[np.setdiff1d(np.arange(N), fixed)] >= 1).all()


def test_q1_transfer_reproduces_the_multilinear_map(ogrid, backend):
    """On a mesh without a mapping, P (unmasked) interpolates the vertex coordinates into
    the GLL points exactly; the masks zero fixed rows and columns; R = P^T."""
    V = ogrid
    mesh = V.mesh
    P, R = space_transfer(V, 1, mesh.cells, mesh.num_nodes, [], [], backend, np.float64)
    P, R = _host(P), _host(R)
    assert np.abs(P @ mesh.points - V.points).max() < 20 * EPS
    assert abs(R - P.T).nnz == 0
    ff, cf = V.boundary_dofs("all"), np.unique(mesh.cells[:3])
    Pm = _host(space_transfer(V, 1, mesh.cells, mesh.num_nodes, ff, cf, backend, np.float64)[0])
    z = np.ones(V.num_dofs)
    z[ff] = 0
    zc = np.ones(mesh.num_nodes)
    zc[cf] = 0
    assert abs(Pm - sp.diags(z) @ P @ sp.diags(zc)).max() == 0


def test_chunked_geometry_equals_one_pass(monkeypatch):
    V = SpectralSpace(distorted_box(3, 3, seed=4), 4, mapping=lambda x: x + 0.05 * np.sin(3 * x[:, ::-1]))
    from adaptmg.spectral.operators import SpectralOperator
    one = SpectralOperator(V, backend="cpu")
    monkeypatch.setitem(space_mod.CHUNK_NODES, "cpu", 300)       # 2 cells a chunk
    assert len(space_mod.cell_chunks(V.mesh.num_cells, 125)) == 14
    many = SpectralOperator(V, backend="cpu")
    assert np.abs(many.G - one.G).max() <= 8 * EPS * np.abs(one.G).max()
    assert np.abs(many.wdet - one.wdet).max() <= 8 * EPS * np.abs(one.wdet).max()


def test_inverted_cell_in_a_late_chunk_is_reported(monkeypatch):
    mesh = adaptmg.Mesh.box([0, 0, 0], [1, 1, 1], [3, 3, 3])
    cells = mesh.cells.copy()
    cells[-1] = cells[-1][[1, 0, 3, 2, 5, 4, 7, 6]]                   # mirrored: det < 0
    monkeypatch.setitem(space_mod.CHUNK_NODES, "cpu", 64)
    with pytest.raises(ValueError, match=r"1 cell\(s\).*first: cell 26"):
        SpectralSpace(adaptmg.Mesh.from_cells(mesh.points, cells), 3)


@pytest.mark.parametrize("pc", ["two-scale", "fine", "jacobi"])
def test_float32_from_the_float64_setup_equals_a_float32_setup(ogrid, pc):
    V = ogrid
    kw = dict(mass=25.0, stiffness=0.01, backend="cpu", preconditioner=pc)
    p64 = SpectralProblem(V, **kw)
    q = p64.astype(np.float32)
    ref = SpectralProblem(V, dtype=np.float32, **kw)
    r = (np.random.default_rng(3).standard_normal(V.num_dofs) * p64.free).astype(np.float32)
    e32 = np.finfo(np.float32).eps
    for a, b in ((q.matvec(r), ref.matvec(r)), (q.M(r), ref.M(r))):
        assert a.dtype == np.float32
        assert np.abs(a - b).max() <= 4 * e32 * np.abs(b).max()
    assert np.shares_memory(q.op.scatter_matrix.indices, p64.op.scatter_matrix.indices)   # shared
    assert q.op.G.dtype == np.float32 and p64.op.G.dtype == np.float64
    assert 0 < q.nbytes() < p64.nbytes()
    x, its, info = q.solve(q.free * r, rtol=1e-5)
    assert info == 0 and its == ref.solve(ref.free * r, rtol=1e-5)[1]


def test_nbytes_counts_the_stored_arrays(ogrid):
    p = SpectralProblem(ogrid, backend="cpu")
    op, fine = p.op, p.M.fine
    lower = op.G.nbytes + op.wdet.nbytes + op.cell_dofs.nbytes + fine.index.nbytes + p.M.coarse.P.data.nbytes
    assert lower < p.nbytes(work_vectors=0)
    assert p.nbytes() - p.nbytes(work_vectors=0) == 6 * 8 * ogrid.num_dofs
    # p-multigrid: every level counted (the Q3 -> Q1 transfer P and R, the Q1 matrices, the
    # Schwarz smoother), the finest operator once
    q = SpectralProblem(ogrid, backend="cpu", preconditioner="pmg")
    top = q.M.solver._dev[-1]
    own = array_nbytes(*q._arrays(preconditioner=False))
    parts = sum(array_nbytes(a) for a in (top.P, top.R, q.M.solver._dev[0].A) + tuple(top.smoother.S.arrays()))
    assert own + parts < q.nbytes(work_vectors=0) < own + 3 * parts


def test_poisson_on_a_built_space_and_the_concurrent_option():
    mesh = distorted_box(3, 3, seed=2)
    f = lambda x: 1.0 + x[..., 0]
    V = SpectralSpace(mesh, 3)
    a, b = poisson(V, 3, f, backend="cpu"), poisson(mesh, 3, f, backend="cpu")
    assert a.iterations == b.iterations and np.abs(a.u - b.u).max() <= 1e3 * EPS * np.abs(b.u).max()
    assert a.nbytes > 0
    with pytest.raises(ValueError, match="degree 3 was given with degree=4"):
        poisson(V, 4, f, backend="cpu")
    p = SpectralProblem(V, backend="cpu")
    assert p.M.concurrent is False                                   # "auto": the GPU only
    with pytest.raises(ValueError, match="needs the GPU"):
        TwoScale(p.M.fine, p.M.coarse, concurrent=True)
    with pytest.raises(ValueError, match="concurrent must be"):
        TwoScale(p.M.fine, p.M.coarse, concurrent="yes")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_gpu_concurrent_two_scale_equals_sequential(dtype):
    """P^c on a second stream: the same products in the same order as one after the other."""
    be = get_backend("gpu")
    V = SpectralSpace(ogrid_cylinder(16, 16, height=2.0), 4, backend=be)
    p = SpectralProblem(V, mass=25.0, stiffness=0.01, dtype=dtype, backend=be)
    M = p.M
    assert M.concurrent is True
    seq = TwoScale(M.fine, CoarseQ1(V, "all", p.fixed, mass=25.0, stiffness=0.01, dtype=dtype, backend=be),
                   concurrent=False)
    xp = be.xp
    eps = np.finfo(dtype).eps
    for seed in range(3):
        r = p.free * xp.asarray(np.random.default_rng(seed).standard_normal(V.num_dofs), dtype=dtype)
        a, b = M(r), seq(r)
        be.synchronize()
        assert float(xp.abs(a - b).max()) <= 8 * eps * float(xp.abs(b).max())
    x1, its1, _ = p.solve(p.free * r, rtol=1e-6)
    p.M = seq
    x2, its2, _ = p.solve(p.free * r, rtol=1e-6)
    assert its1 == its2 and float(xp.abs(x1 - x2).max()) <= 1e3 * eps * float(xp.abs(x2).max())
