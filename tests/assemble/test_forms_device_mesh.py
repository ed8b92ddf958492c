"""GPU: the forms with coefficients on a mesh on the device (issue 36) equal the host mesh's.

Mass, stiffness, convection, scalar_form (with ``return_mass``), the lumped mass and the
derivative matrices C_k of the interpolated convection, with
constant, callable (CuPy-generic and NumPy-only), per-cell (NumPy and CuPy) and per-node
coefficients, on 2-D/3-D meshes with hanging nodes and on a distorted mesh: cupyx results
whose patterns equal the host's once entries below 64 eps of the largest are dropped, and
whose values agree to 64 eps of the largest.  The same code runs on the CPU under the strict
stand-in (``test_forms_device_branches.py``).  Cheap: a few seconds on an H200.
"""
import numpy as np
import pytest

from adaptmg import Mesh, Space, assemble
from adaptmg.backend import is_device_array, to_host
from test_forms_device_branches import EPS, MESHES, _close, _coefficients

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def cp():
    import cupy
    return cupy


@pytest.mark.parametrize("name", list(MESHES))
def test_mass_and_stiffness_on_a_device_mesh_equal_the_host_mesh(name, cp):
    m = MESHES[name]
    g = m.to("gpu")
    for c in (1, 2):
        h, d = Space(m, 1, c), Space(g, 1, c)
        for kind, (ch, cd) in _coefficients(m, h, cp).items():
            for form in (assemble.mass, assemble.stiffness):
                _close(form(d, cd), form(h, ch))


@pytest.mark.parametrize("name", list(MESHES))
def test_convection_scalar_form_and_lumped_mass_on_a_device_mesh(name, cp):
    m = MESHES[name]
    g = m.to("gpu")
    dim = m.dim
    h, d = Space(m, 1), Space(g, 1)
    rng = np.random.default_rng(3)
    bc = rng.standard_normal((m.num_cells, dim))
    bn = rng.standard_normal((h.num_nodes, dim))
    bconst = np.linspace(-1.0, 1.0, dim)
    for bh, bd in ((bconst, bconst), (bc, cp.asarray(bc)), (bn, cp.asarray(bn)), ((lambda x: 0.5 - x,) * 2)):
        _close(assemble.convection(d, bd), assemble.convection(h, bh))
    kap = lambda x: 1.0 + x[..., 0] ** 2                              # noqa: E731
    rho = rng.random(m.num_cells) + 1.0
    for kw in (dict(mass=1.0, diffusion=0.02, convection=bconst),
               dict(mass=rho, diffusion=kap, convection=bn),
               dict(mass=kap, diffusion=0.5)):
        Ad, Md = assemble.scalar_form(d, return_mass=True, **kw)
        Ah, Mh = assemble.scalar_form(h, return_mass=True, **kw)
        _close(Ad, Ah)
        _close(Md, Mh)
    for c in (1, 3):
        mh = assemble.lumped_mass(Space(m, 1, c))
        md = assemble.lumped_mass(Space(g, 1, c))
        assert is_device_array(md)
        assert np.abs(to_host(md) - mh).max() <= 64 * EPS * mh.max()
    for a, b in zip(assemble.derivative_matrices(d), assemble.derivative_matrices(h)):
        _close(a, b)


def test_a_larger_device_mesh_form_equals_the_host_one(cp):
    """2-D 256^2 cells with a local refinement: the device kernels at size.  Both paths compute
    J from absolute coordinates (the host at the cell centre on parallelograms, the device at
    every point), each with a relative rounding of about eps |x| / h: measured on the CPU
    stand-in 72-190 eps of the largest entry at |x| / h = 512, hence 64 eps x 8 here."""
    m = Mesh.box([0.0, 0.0], [1.0, 1.0], [128, 128]).refine()
    x = m.points[m.cells].mean(axis=1)
    m = m.refine(np.linalg.norm(x - 0.4, axis=1) < 0.2)
    h, d = Space(m, 1), Space(m.to("gpu"), 1)
    kw = dict(mass=lambda x: 1.0 + x[..., 1], diffusion=np.linspace(1.0, 2.0, m.num_cells), convection=(0.0, -1.0))
    _close(assemble.scalar_form(d, **kw), assemble.scalar_form(h, **kw), scale=8.0)
