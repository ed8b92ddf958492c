"""elasticity(device=...): the element matrices computed on the backend's arrays
(:func:`adaptmg.assemble.on_device.elasticity_entries`, full quadrature rule on every cell) and
summed by the device pattern, against the host path (chunked host geometry, affine one-point
path, FieldSums).  On the CPU the same code runs with NumPy (the ``xp_path`` fixture: the
backend is NumPy's and :class:`~adaptmg.assemble._device.DevicePattern` runs on NumPy); the
GPU tests run it on CuPy.  Other products and summation orders: equal to a few eps of each
row's largest entry."""
from types import SimpleNamespace

import numpy as np
import pytest
import scipy.sparse as sp

from adaptmg import assemble as asm
from adaptmg.backend import get_backend, to_host
from adaptmg.fe import Space
from adaptmg.mesh import Mesh

EPS = np.finfo(float).eps


def _hanging_mesh(dim, distort=False):
    m = Mesh.box([0.0] * dim, [1.0] * dim, [3] * dim).refine()
    if distort:                 # non-affine cells: the host path takes the full rule there too
        m = m.map(lambda x: x + 0.08 * np.sin(3.0 * x[:, ::-1]) * x * (1 - x))
    m = m.refine(np.linalg.norm(m.points[m.cells].mean(axis=1), axis=1) < 0.4)
    return m.refine(np.linalg.norm(m.points[m.cells].mean(axis=1) - 0.1, axis=1) < 0.2)


@pytest.fixture
def xp_path(monkeypatch):
    """``device="xp"`` runs the device path of elasticity() with NumPy as ``xp``."""
    from adaptmg.assemble import vector_forms as vf
    from adaptmg.assemble._device import DevicePattern
    cpu = get_backend("cpu")
    monkeypatch.setattr(vf, "_assembly_device", lambda device, info, per: cpu if device == "xp" else None)
    monkeypatch.setattr(vf, "get_device_pattern", lambda be, r, c, nr, nc: DevicePattern(be, r, c, nr, nc))
    return "xp"


def _coefs(kind, mesh):
    nc = mesh.num_cells
    if kind == "const":
        return 8.0e4, 2.0e4
    if kind == "percell":
        rng = np.random.default_rng(nc)
        return rng.uniform(1.0, 9.0, nc), rng.uniform(0.5, 2.0, nc)
    # callables of the points, written for any array module (NumPy ufuncs dispatch to CuPy)
    return (lambda x: 2.0 + np.sin(x[..., 0]) * x[..., 1]), (lambda x: 1.0 + x[..., 0] ** 2)


def _assert_close(X, Y, ulps=64):
    """Each column of the (nnz, k) fields within ``ulps`` eps of its row's largest |entry|."""
    ip, ind, A = X
    ip2, ind2, B = Y
    np.testing.assert_array_equal(to_host(ip), to_host(ip2))
    np.testing.assert_array_equal(to_host(ind), to_host(ind2))
    A, B = np.asarray(A), to_host(B)
    assert A.shape == B.shape
    row = np.repeat(np.arange(ip.size - 1), np.diff(ip))
    scale = np.zeros((ip.size - 1, A.shape[1]))
    np.maximum.at(scale, row, np.abs(A))
    err = np.abs(A - B) / np.maximum(scale[row], np.finfo(float).tiny)
    assert err.max() <= ulps * EPS, err.max() / EPS


@pytest.mark.parametrize("dim, degree, distort", [(2, 1, False), (2, 2, True), (3, 1, False), (3, 1, True)])
@pytest.mark.parametrize("kind", ["const", "percell", "callable"])
def test_xp_entries_equal_the_host_path(xp_path, dim, degree, distort, kind):
    m = _hanging_mesh(dim, distort)
    s = Space(m, degree, components=dim)
    lam, mu = _coefs(kind, m)
    for rm in (False, True):
        X = asm.elasticity(s, lam, mu, format="fields", return_mass=rm)
        Y = asm.elasticity(s, lam, mu, format="fields", return_mass=rm, device=xp_path)
        _assert_close(X, Y)


@pytest.mark.parametrize("fmt", ["csr", "bsr"])
def test_xp_path_formats(xp_path, fmt):
    """csr / bsr (and the scalar mass) from the device fields equal the host matrices."""
    s = Space(_hanging_mesh(3), 1, components=3)
    lam = np.linspace(1.0, 3.0, s.mesh.num_cells)
    A, M = asm.elasticity(s, lam, 0.7, format=fmt, return_mass=True)
    B, N = asm.elasticity(s, lam, 0.7, format=fmt, return_mass=True, device=xp_path)
    assert type(A) is type(B) and type(M) is type(N)
    for P, Q in ((A, B), (M, N)):
        assert np.array_equal(P.indptr, Q.indptr) and np.array_equal(P.indices, Q.indices)
        assert abs(P - Q).max() <= 64 * EPS * abs(P).max()
    # the rigid-body motions are in the kernel of the device matrix too
    x = s.mesh.points if s.num_nodes == s.mesh.num_nodes else None
    if x is not None and fmt == "csr":
        rot = np.stack([-x[:, 1], x[:, 0], np.zeros(len(x))], axis=1).ravel()
        assert np.abs(B @ rot).max() <= 1e-12 * abs(B).max()


def test_xp_path_bad_input(xp_path):
    """Callables of the wrong shape or with NaN, and inverted cells, are ValueErrors on the
    device path as on the host."""
    m = _hanging_mesh(2)
    s = Space(m, 1, components=2)
    with pytest.raises(ValueError, match=r"lam\(x\) must return shape"):
        asm.elasticity(s, lambda x: np.ones(3), 1.0, device=xp_path)
    with pytest.raises(ValueError, match=r"mu\(x\) contains non-finite"):
        asm.elasticity(s, 1.0, lambda x: np.where(x[..., 0] > 0.5, np.nan, 1.0), device=xp_path)
    with pytest.raises(ValueError, match="keep_on_device=True takes format='csr' or 'fields', got 'bsr'"):
        asm.elasticity(s, 1.0, 1.0, format="bsr", device=xp_path, keep_on_device=True)
    cells = m.cells.copy()
    cells[3] = cells[3][[1, 0, 3, 2]]                  # mirrored: det J < 0
    bad = SimpleNamespace(mesh=SimpleNamespace(dim=2, points=m.points, cells=cells), degree=1,
                          components=2, cell_dofs=cells, num_nodes=m.points.shape[0])
    for dev in (None, xp_path):
        with pytest.raises(ValueError, match=r"non-positive Jacobian determinant at a quadrature point \(first offending cell index 3\)"):
            asm.elasticity(bad, 1.0, 1.0, device=dev)


def test_keep_on_device_needs_a_gpu():
    s = Space(_hanging_mesh(2), 1, components=2)
    for dev in (None, "cpu"):
        with pytest.raises(ValueError, match="keep_on_device=True needs a GPU device"):
            asm.elasticity(s, 1.0, 1.0, format="fields", device=dev, keep_on_device=True)


@pytest.mark.gpu
@pytest.mark.parametrize("dim", [2, 3])
@pytest.mark.parametrize("kind", ["const", "percell", "callable"])
def test_device_elasticity_equals_host(dim, kind, monkeypatch):
    """elasticity(device="gpu"): element matrices, pattern and sums on the GPU equal the host
    result to a few eps (every format, with the mass); keep_on_device gives CuPy arrays of the
    same values; small meshes stay on the host."""
    from adaptmg.assemble import forms
    monkeypatch.setattr(forms, "MIN_DEVICE_ENTRIES", 0)
    s = Space(_hanging_mesh(dim, distort=True), 1, components=dim)
    lam, mu = _coefs(kind, s.mesh)
    X = asm.elasticity(s, lam, mu, format="fields", return_mass=True)
    _assert_close(X, asm.elasticity(s, lam, mu, format="fields", return_mass=True, device="gpu"))
    from adaptmg.backend import host_copies
    before = host_copies()
    K = asm.elasticity(s, lam, mu, format="fields", return_mass=True, device="gpu", keep_on_device=True)
    assert host_copies() == before                     # nothing of O(cells) came back
    assert all(type(a).__module__.startswith("cupy") for a in K)
    _assert_close(X, K)
    for fmt in ("csr", "bsr"):
        A, M = asm.elasticity(s, lam, mu, format=fmt, return_mass=True)
        B, N = asm.elasticity(s, lam, mu, format=fmt, return_mass=True, device="gpu")
        for P, Q in ((A, B), (M, N)):
            assert type(P) is type(Q) and np.array_equal(P.indices, Q.indices)
            assert abs(sp.csr_matrix(P) - sp.csr_matrix(Q)).max() <= 64 * EPS * abs(P).max()
    monkeypatch.setattr(forms, "MIN_DEVICE_ENTRIES", 1 << 30)
    from adaptmg.assemble import vector_forms
    calls = []
    monkeypatch.setattr(vector_forms, "get_device_pattern", lambda *a: calls.append(a))
    asm.elasticity(s, 1.0, 1.0, device="gpu")
    assert calls == []
