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
from test_forms_device_branches import (MESHES, _close, check_convection_and_scalar_form,
                                        check_derivatives_and_lumped_mass, check_mass_and_stiffness)

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def cp():
    import cupy
    return cupy


@pytest.mark.parametrize("name", list(MESHES))
def test_forms_on_a_device_mesh_equal_the_host_mesh(name, cp):
    m = MESHES[name]
    check_mass_and_stiffness(m, cp, components=(1, 2))
    check_convection_and_scalar_form(m, cp)
    check_derivatives_and_lumped_mass(m)


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
