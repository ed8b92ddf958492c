"""Q2 spaces, their transfers and elasticity (assembly and node-block constraints) on a mesh
on the device, run on the CPU: the carrier table and the Q2 hanging rows under the strict
CuPy stand-in (``tests/mesh/strict_cupy.py``: device arrays only, no repeated-index scatter,
O(levels) host reads), the matrix-level parts with a mesh whose backend says "gpu" but holds
NumPy (``test_space_on_device_mesh``'s stand-in, its refinements stand-ins too).  Integers
(cell_dofs, hanging rows, H, masks, P) equal the host code's exactly, assembled floats to
64 eps.  The lead runs the real thing: tests/multilevel/test_device_mesh_q2_elasticity.py."""
import os
import sys

import numpy as np
import pytest
import scipy.sparse as sp

sys.path.insert(0, os.path.join(os.path.dirname(__file__), os.pardir, "mesh"))
import strict_cupy                                                  # noqa: E402
from adaptmg import Constraints, Space, assemble                   # noqa: E402
from adaptmg.fe import space_xp                                     # noqa: E402
from adaptmg.fe.csr_ops import NodeBlockMatrix                      # noqa: E402
from adaptmg.multilevel import transfer                             # noqa: E402
from test_space_on_device_mesh import MESHES, STAND_IN, _same_csr, stand_in   # noqa: E402

EPS = np.finfo(np.float64).eps


def _close(Ah, Ad, tol=64):
    """Same pattern after dropping entries below ``tol`` eps of the largest, values to it."""
    Ah, Ad = sp.csr_matrix(Ah), sp.csr_matrix(Ad)
    scale = abs(Ah).max()
    drop = [sp.csr_matrix(M.multiply(abs(M) > tol * EPS * scale)) for M in (Ah, Ad)]
    for M in drop:
        M.sort_indices()
    assert np.array_equal(drop[0].indptr, drop[1].indptr) and np.array_equal(drop[0].indices, drop[1].indices)
    assert abs(Ah - Ad).max() <= tol * EPS * scale


@pytest.fixture
def gpu(monkeypatch):
    return strict_cupy.install(monkeypatch)


@pytest.mark.parametrize("name", ["local-2d", "local-3d", "from_cells"])
def test_q2_carrier_and_hanging_rows_under_the_strict_stand_in(name, gpu):
    m = MESHES[name]
    h = Space(m, 2, 1)
    g = m.to("gpu")
    before = strict_cupy.host_values()
    d = Space(g, 2, 1)
    rows = d._hanging_rows
    moved, calls = np.subtract(strict_cupy.host_values(), before)
    assert moved <= 40 and calls <= 40, (moved, calls)          # O(1) scalars, not O(cells)
    assert isinstance(d.cell_dofs, strict_cupy.ndarray)
    assert np.array_equal(d.cell_dofs.get(), h.cell_dofs)
    assert h.hanging_nodes.size > 0 or name == "from_cells"
    for a, b in zip(rows, h._hanging_rows):
        assert np.array_equal(a.get(), b)                       # dyadic weights: exact
    # the weights of a Q2 hanging row reproduce every quadratic: sum 1, first moments
    hn, cols, W = (a.get() for a in rows)
    P = h.points
    assert np.abs(W.sum(1) - 1).max() <= 8 * EPS
    for a in range(m.dim):
        q = P[:, a] ** 2
        assert np.abs((W * q[cols]).sum(1) - q[hn]).max() <= 16 * EPS


def test_lagrange_values_equal_the_element():
    from adaptmg.fe.element import LagrangeQ
    xi = np.random.default_rng(3).random((20, 3))
    for k in (1, 2):
        for d in (2, 3):
            assert np.abs(space_xp.lagrange_values(np, xi[:, :d], k) - LagrangeQ(k, d).values(xi[:, :d])).max() <= 8 * EPS


@pytest.mark.parametrize("name", list(MESHES))
def test_q2_space_and_stiffness_equal_the_host_ones(name, monkeypatch):
    from adaptmg.assemble import forms
    from adaptmg.assemble._device import DevicePattern
    monkeypatch.setattr(forms, "get_device_pattern", lambda be, r, c, nr, nc: DevicePattern(be, r, c, nr, nc))
    m = MESHES[name]
    for c in (1, 3):
        h, d = Space(m, 2, c), Space(stand_in(m), 2, c)
        assert d._on_device
        _same_csr(h.H_nodes, d.H_nodes)
        _same_csr(h.H, d.H)
        assert np.array_equal(h.is_hanging, d.is_hanging)
        assert np.array_equal(h.boundary_dofs(), d.boundary_dofs())
        Ah, Ad = assemble.stiffness(h), assemble.stiffness(d)
        assert np.array_equal(Ah.indptr, Ad.indptr) and np.array_equal(Ah.indices, Ad.indices)
        assert np.max(np.abs(Ah.data - Ad.data)) <= 64 * EPS * np.max(np.abs(Ah.data))
        f = (lambda x: 1.0 + x[..., 0] * x[..., 1]) if c == 1 else np.array([1.0, -2.0, 0.5])
        bh, bd = assemble.load(h, f), assemble.load(d, f)
        assert np.max(np.abs(bd - bh)) <= 64 * EPS * np.max(np.abs(bh))


@pytest.mark.parametrize("name", ["local-2d", "local-3d", "from_cells"])
def test_q2_embedding_on_the_device_path_equals_the_host_one_and_reproduces_quadratics(name):
    """chi (exact) and P with the hanging masks only: P reproduces the coarse space's
    quadratics on the regular fine DoFs (the masked P: test_space_on_device_mesh.py)."""
    mc, mf = MESHES[name].hierarchy()[-2:]
    for c in (1, 2):
        hs = [Space(mc, 2, c), Space(mf, 2, c)]
        ds = [Space(stand_in(mc), 2, c), Space(stand_in(mf), 2, c)]
        _same_csr(transfer.interpolation_matrix(*hs), transfer.interpolation_matrix(*ds))
        P0 = transfer.prolongation(*ds)
        _same_csr(transfer.prolongation(*hs), P0)
        u, uf = ((s.points[:, 0] ** 2 + s.points[:, 0] * s.points[:, -1]).repeat(c) for s in hs)
        reg = ~hs[1].is_hanging
        assert np.abs((P0 @ u - uf)[reg]).max() <= 16 * EPS


def test_device_mesh_interpolation_refuses_row_subsets():
    meshes = MESHES["local-2d"].hierarchy()
    ds = [Space(stand_in(meshes[-2]), 2), Space(stand_in(meshes[-1]), 2)]
    with pytest.raises(ValueError, match=r"mesh.to\('cpu'\)"):
        transfer.interpolation_matrix(*ds, nodes=np.arange(3))


@pytest.mark.parametrize("name", ["local-2d", "local-3d"])
def test_elasticity_and_block_constraints_equal_the_host_ones(name, monkeypatch):
    from adaptmg.assemble import vector_forms
    from adaptmg.assemble._device import DevicePattern
    from adaptmg.fe import constraints
    # the stand-in's expanded matrices are SciPy ones: let them take the device matrices' path
    monkeypatch.setattr(constraints, "is_device_sparse", sp.issparse)
    monkeypatch.setattr(vector_forms, "get_device_pattern", lambda be, r, c, nr, nc: DevicePattern(be, r, c, nr, nc))
    m = MESHES[name]
    d = m.dim
    h, s = Space(m, 1, d), Space(stand_in(m), 1, d)
    Ah = assemble.elasticity(h, 3.0, 1.5)
    Ad = assemble.elasticity(s, 3.0, 1.5)                       # device elements, pattern, sums
    _close(Ah, Ad)
    ip_h, ind_h, F_h = assemble.elasticity(h, 3.0, 1.5, format="fields", return_mass=True)
    ip_d, ind_d, F_d = assemble.elasticity(s, 3.0, 1.5, format="fields", return_mass=True)
    assert np.array_equal(ip_h, ip_d) and np.array_equal(ind_h, ind_d)
    assert np.abs(F_h - F_d).max() <= 64 * EPS * np.abs(F_h).max()
    with pytest.raises(ValueError, match="BSR"):
        assemble.elasticity(s, 3.0, 1.5, format="bsr")
    coef = np.zeros((1 + d * d, d, d))
    coef[0] = np.eye(d)
    coef[1:] = np.eye(d * d).reshape(d * d, d, d)              # mass (x) I + the elasticity blocks
    for dirichlet in ("nodes", "component"):                   # whole nodes fixed, or one component
        K = []
        for sp_, (ip, ind, F), be in ((h, (ip_h, ind_h, F_h), None), (s, (ip_d, ind_d, F_d), STAND_IN)):
            bd = sp_.boundary_dofs() if dirichlet == "nodes" else sp_.boundary_dofs(components=[0])
            cons = Constraints(sp_, bd)
            K.append((cons.matrix(NodeBlockMatrix(ip, ind, F, coef, sp_.num_nodes, backend=be)), cons.scale))
        _close(K[0][0], K[1][0])
        assert abs(K[0][1] - K[1][1]) <= 64 * EPS * K[0][1]
        # and the general congruence of the expanded matrix gives the same K
        cons = Constraints(h, h.boundary_dofs() if dirichlet == "nodes" else h.boundary_dofs(components=[0]))
        _close(cons.matrix(NodeBlockMatrix(ip_h, ind_h, F_h, coef, h.num_nodes).tocsr()), K[1][0])


def test_a_host_block_matrix_on_a_device_mesh_is_refused():
    m = MESHES["local-2d"]
    s = Space(stand_in(m), 1, 2)
    ip, ind, F = assemble.elasticity(Space(m, 1, 2), 1.0, 1.0, format="fields")
    cons = Constraints(s, s.boundary_dofs())
    with pytest.raises(ValueError, match=r"mesh.to\('cpu'\)"):
        cons.matrix(NodeBlockMatrix(ip, ind, F, np.eye(4).reshape(4, 2, 2), s.num_nodes))
