"""The device-mesh paths of Space, Constraints, the Dirichlet values, the load vector, the
forms and the Q1 prolongation, run on the CPU with NumPy standing in for CuPy.

A mesh whose backend *says* GPU but whose array module is NumPy (``_StandIn``) sends a
``Space`` down the code a mesh on the device takes (:mod:`adaptmg.fe.space_xp`, the device
load, the device assembly, the transfers' device masks); those functions use only what NumPy
and CuPy both offer, so this checks their arithmetic here: the integers (H's pattern, hanging
rows, boundary DoFs, masks, P's pattern) equal the host code's exactly, the floats to a few
ulps where another summation order is taken.  The lead runs the real thing on the GPU:
tests/multilevel/test_device_mesh_setup.py.
"""
import numpy as np
import pytest
import scipy.sparse as sp

import adaptmg
from adaptmg import Constraints, Mesh, Space, assemble
from adaptmg.backend import Backend
from adaptmg.fe import space_xp
from adaptmg.multilevel.hierarchy import dirichlet_values

EPS = np.finfo(np.float64).eps


class _StandInBackend(Backend):
    """Says "gpu", holds NumPy/SciPy: the device paths' code with host arrays."""

    def asarray(self, a, dtype=None):
        return np.asarray(a, dtype=dtype)

    def asmatrix(self, A, dtype=None):
        return sp.csr_matrix(A, dtype=dtype)


STAND_IN = _StandInBackend("gpu", np, sp)


class _StandIn(Mesh):
    """A host mesh whose backend is :data:`STAND_IN`; its refinements are stand-ins too (a Q2
    space's carrier stays "on the device")."""

    @property
    def backend(self):
        return STAND_IN

    def refine(self, marked=None):
        return stand_in(Mesh.refine(self, marked))


def stand_in(mesh):
    return _StandIn(mesh._forest, mesh._active)


def _ball(m, r, c=0.3):
    x = m.points[m.cells].mean(axis=1)
    return np.linalg.norm(x - c, axis=1) < r


def _unstructured():
    """A perturbed 4x3 quad mesh given cell by cell in shuffled order, refined twice locally."""
    b = Mesh.box([0.0, 0.0], [1.0, 1.0], [4, 3])
    p = b.points.copy()
    inner = (p > 0).all(1) & (p < 1).all(1)
    p[inner] += 0.04 * np.sin(7.0 * p[inner][:, ::-1])
    m = Mesh.from_cells(p, b.cells[np.random.default_rng(1).permutation(b.num_cells)])
    m = m.refine(_ball(m, 0.4))
    return m.refine(_ball(m, 0.25))


def _meshes():
    u2 = Mesh.box([0.0, 0.0], [1.0, 1.0], [3, 2]).refine().refine()
    l2 = u2.refine(_ball(u2, 0.3))
    l3 = Mesh.box([0.0] * 3, [1.0] * 3, [2] * 3).refine()
    l3 = l3.refine(_ball(l3, 0.4))
    l3 = l3.refine(_ball(l3, 0.2))                    # three levels, hanging nodes on two fronts
    return {"uniform-2d": u2, "local-2d": l2, "local-3d": l3, "from_cells": _unstructured()}


MESHES = _meshes()


def _same_csr(A, B):
    A, B = sp.csr_matrix(A), sp.csr_matrix(B)
    A.sort_indices()
    B.sort_indices()
    assert A.shape == B.shape
    assert np.array_equal(A.indptr, B.indptr) and np.array_equal(A.indices, B.indices)
    assert np.array_equal(A.data, B.data)


@pytest.mark.parametrize("name", list(MESHES))
def test_space_parts_equal_the_host_code(name):
    m = MESHES[name]
    for c in (1, 3):
        h, d = Space(m, 1, c), Space(stand_in(m), 1, c)
        assert d._on_device and not h._on_device
        for a, b in zip(h._hanging_rows, d._hanging_rows):
            assert np.array_equal(a, b)
        _same_csr(h.H_nodes, d.H_nodes)
        _same_csr(h.H, d.H)
        assert np.array_equal(h.is_hanging, d.is_hanging)
        assert np.array_equal(h.boundary_dofs(), d.boundary_dofs())
        where = lambda x: x[:, 0] < 0.5                            # noqa: E731
        assert np.array_equal(h.boundary_nodes(where=where), d.boundary_nodes(where=where))
        comps = [c - 1, 0] if c > 1 else [0]
        assert np.array_equal(h.boundary_dofs(components=comps), d.boundary_dofs(components=comps))
        f = (lambda x: x[:, 0] * x[:, 1]) if c == 1 else (lambda x: np.repeat(x[:, :1], c, axis=1))
        assert np.array_equal(h.interpolate(f), d.interpolate(f))
    assert (h.hanging_nodes.size > 0) == (name != "uniform-2d")   # the local cases hang nodes


@pytest.mark.parametrize("name", ["local-2d", "local-3d"])
def test_constraints_and_dirichlet_values_equal_the_host_code(name):
    m = MESHES[name]
    for c in (1, 2):
        h, d = Space(m, 1, c), Space(stand_in(m), 1, c)
        spec = {0: (lambda x: np.repeat(x[:, :1] + 2.0, c, axis=1)) if c > 1 else (lambda x: x[:, 0] + 2.0)}
        gh, gd = dirichlet_values(h, spec), dirichlet_values(d, spec)
        assert np.array_equal(gh, gd) and np.count_nonzero(gh) > 0
        ch = Constraints(h, h.boundary_dofs(), gh)
        cd = Constraints(d, d.boundary_dofs(), gd)
        assert np.array_equal(ch.free, cd.free) and np.array_equal(ch.dirichlet, cd.dirichlet)
        assert np.array_equal(ch.g, cd.g)
        # the node-mask test of the prolongation and the hanging rows of H on "the device"
        _same_csr(ch.H, cd.H)


def test_csr_rows_and_kron_identity_equal_scipy():
    rng = np.random.default_rng(0)
    A = sp.random(50, 40, density=0.1, random_state=1, format="csr")
    A.sort_indices()
    rows = rng.permutation(50)[:17]
    ptr, ind, dat = space_xp.csr_rows(STAND_IN, A, rows)
    _same_csr(sp.csr_matrix((dat, ind, ptr), shape=(17, 40)), A[rows])
    for c in (1, 2, 3):
        _same_csr(space_xp.kron_identity(STAND_IN, A, c), sp.kron(A, sp.identity(c), format="csr"))


def test_device_hanging_rows_of_the_congruence_equal_the_host_ones():
    """congruence._hanging_rows: the device branch (rows gathered by csr_rows) gives the host
    slice's arrays; checked through the public constraint matrices' congruence."""
    from adaptmg.fe.congruence import congruence_by_expansion
    from adaptmg.fe.csr_ops import congruence_with_constraints
    s = Space(MESHES["local-3d"], 1, 1)
    A = assemble.stiffness(s)
    hang = np.flatnonzero(s.is_hanging)
    ref = congruence_with_constraints(A, s.H, hang)
    B = congruence_by_expansion(A, s.H, hang)
    assert abs(B - ref).max() <= 64 * EPS * abs(ref).max()
    ptr, ind, dat = space_xp.csr_rows(STAND_IN, s.H, hang)
    Hh = s.H[hang]
    assert np.array_equal(ptr, Hh.indptr) and np.array_equal(ind, Hh.indices) and np.array_equal(dat, Hh.data)


@pytest.mark.parametrize("name", list(MESHES))
def test_load_on_the_device_path_matches_the_host(name):
    m = MESHES[name]
    for c, f in ((1, lambda x: 1.0 + x[..., 0] * x[..., 1]), (3, np.array([1.0, -2.0, 0.5]))):
        bh = assemble.load(Space(m, 1, c), f)
        bd = assemble.load(Space(stand_in(m), 1, c), f)           # load_on_device with NumPy
        assert bd.shape == bh.shape
        assert np.max(np.abs(bd - bh)) <= 64 * EPS * np.max(np.abs(bh))


@pytest.mark.parametrize("name", ["local-2d", "local-3d", "from_cells"])
def test_stiffness_on_the_device_path_matches_the_host(name, monkeypatch):
    from adaptmg.assemble import forms
    from adaptmg.assemble._device import DevicePattern
    monkeypatch.setattr(forms, "get_device_pattern", lambda be, r, c, nr, nc: DevicePattern(be, r, c, nr, nc))
    m = MESHES[name]
    for c in (1, 3):
        Ah = assemble.stiffness(Space(m, 1, c))
        Ad = assemble.stiffness(Space(stand_in(m), 1, c))         # device elements, pattern, sums
        assert np.array_equal(Ah.indptr, Ad.indptr) and np.array_equal(Ah.indices, Ad.indices)
        assert np.max(np.abs(Ah.data - Ad.data)) <= 64 * EPS * np.max(np.abs(Ah.data))


@pytest.mark.parametrize("degree", [1, 2])
@pytest.mark.parametrize("name", ["local-2d", "local-3d", "from_cells"])
def test_prolongation_on_the_device_path_equals_the_host_one(name, degree, monkeypatch):
    """Q1: the forest path on the device; Q2: the embedding chi built there
    (tests/fe/test_q2_elasticity_on_device_mesh.py checks what it reproduces)."""
    from adaptmg.multilevel import transfer
    monkeypatch.setattr(transfer, "_forest_tables", lambda F, be: (F.node_kind, F.node_par))
    meshes = MESHES[name].hierarchy()
    assert len(meshes) >= 3
    for c in (1, 2):
        for mc, mf in zip(meshes[-3:-1], meshes[-2:]):
            hs = [Space(mc, degree, c), Space(mf, degree, c)]
            ds = [Space(stand_in(mc), degree, c), Space(stand_in(mf), degree, c)]
            ch = [Constraints(s, s.boundary_dofs()) for s in hs]
            cd = [Constraints(s, s.boundary_dofs()) for s in ds]
            Ph = transfer.prolongation(*hs, ch[0].free, ch[1].free)
            Pd = transfer.prolongation(*ds, cd[0].free, cd[1].free)
            _same_csr(Ph, Pd)                          # dyadic sums: exact in any order


def test_a_device_mesh_is_not_used_silently_on_the_host():
    m = MESHES["local-2d"]
    d = Space(stand_in(m), 1, 1)
    with pytest.raises(ValueError, match=r"mesh.to\('cpu'\)"):
        adaptmg.multigrid(d, assemble.stiffness, backend="cpu")
    with pytest.raises(ValueError, match=r"device='cpu'|device=.cpu."):
        assemble.load(d, 1.0, device="cpu")
    cons = Constraints(d, d.boundary_dofs())
    with pytest.raises(ValueError, match="lives on the GPU"):
        cons.rhs(np.ones(d.num_dofs))
    with pytest.raises(ValueError, match="lives on the GPU"):
        cons.matrix(assemble.stiffness(Space(m, 1, 1)))
