"""The device branches of the forms with coefficients (mass, stiffness, convection,
scalar_form, lumped mass; issue 36), run on the host under the strict NumPy stand-in for CuPy
(``tests/mesh/strict_cupy.py``: refuses NumPy-only calls on device arrays, host/device
mixing, ``ufunc.at``, scatters with repeated indices): a mesh moved with ``to("gpu")``
gives cupyx-like matrices equal to the host mesh's -- patterns exact once entries below
64 eps of the largest are dropped, values within 64 eps of the largest.  The lead runs the
real thing on the GPU: ``tests/assemble/test_forms_device_mesh.py``."""
import pathlib
import sys

import numpy as np
import pytest
import scipy.sparse as sp

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "mesh"))
import strict_cupy  # noqa: E402

from adaptmg import Mesh, Space, assemble  # noqa: E402
from adaptmg.backend import is_device_array, is_device_sparse, to_host  # noqa: E402

EPS = np.finfo(np.float64).eps


def _ball(m, r, c=0.3):
    x = m.points[m.cells].mean(axis=1)
    return np.linalg.norm(x - c, axis=1) < r


def _meshes():
    l2 = Mesh.box([0.0, 0.0], [1.0, 1.0], [3, 2]).refine().refine()
    l2 = l2.refine(_ball(l2, 0.3))                                  # hanging nodes
    b = Mesh.box([0.0, 0.0], [1.0, 1.0], [4, 3])
    p = b.points.copy()
    inner = (p > 0).all(1) & (p < 1).all(1)
    p[inner] += 0.04 * np.sin(7.0 * p[inner][:, ::-1])              # no parallelograms
    dist = Mesh.from_cells(p, b.cells).refine()
    dist = dist.refine(_ball(dist, 0.3))
    l3 = Mesh.box([0.0] * 3, [1.0] * 3, [2] * 3).refine()
    l3 = l3.refine(_ball(l3, 0.4))
    return {"local-2d": l2, "distorted-2d": dist, "local-3d": l3}


MESHES = _meshes()


@pytest.fixture
def gpu(monkeypatch):
    from adaptmg.assemble import _device, forms, vector_forms
    from adaptmg.assemble._device import DevicePattern
    xp = strict_cupy.install(monkeypatch)
    # not memoised (the stand-in has no device id); the pattern itself is the device code
    for mod in (forms, vector_forms):
        monkeypatch.setattr(mod, "get_device_pattern", lambda be, r, c, nr, nc: DevicePattern(be, r, c, nr, nc))
    # the row-walk CUDA kernel runs as its NumPy twin (the stand-in's arrays are NumPy's)
    return xp


def _close(Ad, Ah, scale=1.0):
    """Patterns equal after dropping entries below 64 eps of the largest; values within 64 eps
    (times ``scale``)."""
    assert is_device_sparse(Ad), type(Ad)
    Ad = sp.csr_matrix(to_host(Ad), copy=True)      # copies: the host CSR shares the memoised pattern
    Ah = sp.csr_matrix(Ah, copy=True)
    assert Ad.shape == Ah.shape
    tol = 64 * EPS * scale * abs(Ah).max()
    assert tol > 0
    for M in (Ad, Ah):
        M.data[abs(M.data) <= tol] = 0.0
        M.eliminate_zeros()
        M.sort_indices()
    assert np.array_equal(Ad.indptr, Ah.indptr) and np.array_equal(Ad.indices, Ah.indices)
    assert abs(Ad - Ah).max() <= tol


def _coefficients(m, space, gpu):
    rng = np.random.default_rng(7)
    cell = rng.random(m.num_cells) + 0.5
    node = rng.random(space.num_nodes) + 0.5
    return {
        "constant": (2.5, 2.5),
        "callable": (lambda x: 1.0 + x[..., 0] * x[..., 1],) * 2,
        "numpy-only callable": (lambda x: 1.0 + np.sin(np.asarray(x)[..., 0]),) * 2,   # host fallback
        "per-cell": (cell, cell),
        "per-cell device array": (cell, gpu.asarray(cell)),
        "per-node": (node, node),
    }


def check_mass_and_stiffness(m, xp, components=(1,)):
    """mass and stiffness of every kind of coefficient on ``m.to("gpu")`` equal the host mesh's."""
    g = m.to("gpu")
    for c in components:
        h, d = Space(m, 1, c), Space(g, 1, c)
        for kind, (ch, cd) in _coefficients(m, h, xp).items():
            for form in (assemble.mass, assemble.stiffness):
                _close(form(d, cd), form(h, ch))


def check_convection_and_scalar_form(m, xp):
    """convection (constant, per-cell device, per-node, callable velocities) and scalar_form with
    return_mass (transport-diffusion's constants and mixed coefficients) equal the host mesh's."""
    dim = m.dim
    h, d = Space(m, 1), Space(m.to("gpu"), 1)
    rng = np.random.default_rng(3)
    bc = rng.standard_normal((m.num_cells, dim))
    bn = rng.standard_normal((h.num_nodes, dim))
    bconst = np.linspace(-1.0, 1.0, dim)
    for bh, bd in ((bconst, bconst), (bc, xp.asarray(bc)), (bn, bn), ((lambda x: 0.5 - x,) * 2)):
        _close(assemble.convection(d, bd), assemble.convection(h, bh))
    kap = lambda x: 1.0 + x[..., 0] ** 2                              # noqa: E731
    rho = rng.random(m.num_cells) + 1.0
    for kw in (dict(mass=1.0, diffusion=0.02, convection=bconst),       # transport-diffusion's
               dict(mass=rho, diffusion=kap, convection=bn),
               dict(mass=kap, diffusion=0.5)):
        Ad, Md = assemble.scalar_form(d, return_mass=True, **kw)
        Ah, Mh = assemble.scalar_form(h, return_mass=True, **kw)
        _close(Ad, Ah)
        _close(Md, Mh)


def check_derivatives_and_lumped_mass(m):
    """The C_k of the interpolated convection (Navier-Stokes) and the lumped mass (rowsum, HRZ;
    c = 1, 3) from a device mesh equal the host mesh's."""
    g = m.to("gpu")
    Ch = assemble.derivative_matrices(Space(m, 1))
    Cd = assemble.derivative_matrices(Space(g, 1))
    assert len(Cd) == len(Ch) == m.dim
    for a, b in zip(Cd, Ch):
        _close(a, b)
    for c in (1, 3):
        mh = assemble.lumped_mass(Space(m, 1, c))
        md = assemble.lumped_mass(Space(g, 1, c))
        assert is_device_array(md) and md.shape == mh.shape
        assert np.abs(to_host(md) - mh).max() <= 64 * EPS * mh.max()
        # sum of the lumped masses = |Omega| (x c): an independent check of both
        assert abs(mh.sum() - c) <= 64 * EPS * c * mh.size
    md = assemble.lumped_mass(Space(g, 1), method="hrz")
    assert np.abs(to_host(md) - assemble.lumped_mass(Space(m, 1), method="hrz")).max() <= 64 * EPS


@pytest.mark.parametrize("name", list(MESHES))
def test_mass_and_stiffness_with_coefficients_equal_the_host_mesh(name, gpu):
    # scalar spaces: the stand-in's cupyx matrices hold host index arrays, which the strict
    # xp refuses in kron_identity's device code (c > 1: the GPU tests)
    check_mass_and_stiffness(MESHES[name], gpu)


@pytest.mark.parametrize("name", list(MESHES))
def test_convection_and_scalar_form_equal_the_host_mesh(name, gpu):
    check_convection_and_scalar_form(MESHES[name], gpu)


@pytest.mark.parametrize("name", list(MESHES))
def test_derivative_matrices_and_lumped_mass_equal_the_host_mesh(name, gpu):
    check_derivatives_and_lumped_mass(MESHES[name])


def test_the_device_forms_copy_no_cells_to_the_host(gpu):
    """Only O(1) values per chunk come down (finiteness and det J checks), not O(cells)."""
    m = MESHES["local-3d"]
    d = Space(m.to("gpu"), 1)
    rng = np.random.default_rng(0)
    cell = gpu.asarray(rng.random(m.num_cells) + 0.5)
    before = strict_cupy.host_values()
    assemble.scalar_form(d, mass=cell, diffusion=lambda x: 1.0 + x[..., 0], convection=[1.0, 0.0, 0.0])
    assemble.lumped_mass(d)
    moved, calls = np.subtract(strict_cupy.host_values(), before)
    assert moved <= 40 and calls <= 40, (moved, calls)


def test_bad_coefficients_on_a_device_mesh_raise(gpu):
    m = MESHES["local-2d"]
    d = Space(m.to("gpu"), 1)
    with pytest.raises(ValueError, match=r"per-cell array of shape \(%d,\)" % m.num_cells):
        assemble.mass(d, gpu.ones(m.num_cells + 1))
    with pytest.raises(ValueError, match="non-finite"):
        assemble.stiffness(d, lambda x: x[..., 0] * np.nan)
    with pytest.raises(ValueError, match="non-finite"):
        assemble.mass(d, gpu.full(m.num_cells, np.nan))
    with pytest.raises(ValueError, match=r"must return shape"):
        assemble.convection(d, lambda x: x[..., 0])


@pytest.mark.parametrize("name", list(MESHES))
def test_per_node_coefficients_interpolate_exactly(name):
    """A per-node coefficient holding a linear function's nodal values is that
    function at the quadrature points (Q1 and Q2 reproduce it on any multilinear cell), so the
    matrices equal those of the callable."""
    m = MESHES[name]
    for s in (Space(m, 1), Space(m, 2)):
        P = s.points
        lin = lambda x: 1.5 + x[..., 0] - 0.5 * x[..., -1]              # noqa: E731
        vel = lambda x: np.stack([1.0 + x[..., -1]] + [x[..., 0]] * (m.dim - 1), axis=-1)   # noqa: E731
        for form, f in ((assemble.mass, lin), (assemble.stiffness, lin), (assemble.convection, vel)):
            A, B = form(s, f(P)), form(s, f)
            assert abs(A - B).max() <= 64 * EPS * abs(B).max()
