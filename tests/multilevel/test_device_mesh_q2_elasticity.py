"""Q2 and elasticity with the mesh on the device (issue 36): ``multigrid(Space(mesh_gpu, 2),
...)``, ``functools.partial(assemble.elasticity, ...)`` on a 3-component space of a device mesh
and the elasticity problem's node-block system give the host mesh's GPU levels -- P, R, H and
the masks exactly, the matrices within 64 eps of their largest entry (after dropping the
entries below that: congruence sums that cancel to 0 on one path) -- and the same CG
iterations and solutions (1e-10).  CPU stand-in of the same code:
tests/fe/test_q2_elasticity_on_device_mesh.py.

    python -m pytest -m gpu -q tests/multilevel/test_device_mesh_q2_elasticity.py
"""
import functools

import numpy as np
import pytest

import adaptmg
from adaptmg import Space, assemble
from adaptmg.backend import get_backend, to_host
from test_device_mesh_setup import _exact, _mesh, same_levels

pytestmark = pytest.mark.gpu


def _compare(ml_h, ml_d):
    assert len(ml_h.levels) == len(ml_d.levels) >= 2
    same_levels(ml_h, ml_d)


def _solve_both(spaces, form, f, **kw):
    be = get_backend("gpu")
    out = []
    for s in spaces:
        ml = adaptmg.multigrid(s, form, dirichlet="all", backend=be, **kw)
        b = ml.constrain(assemble.load(s, f, device="gpu"))
        x = ml.solve(b, rtol=1e-8, accel="cg")
        out.append((ml, to_host(b), x, int(np.max(ml.last_iterations))))
    (ml_h, b_h, xd_h, it_h), (ml_d, b_d, xd_d, it_d) = out
    x_h, x_d = to_host(xd_h), to_host(xd_d)
    _compare(ml_h, ml_d)
    assert np.max(np.abs(b_h - b_d)) <= 64 * np.finfo(float).eps * np.max(np.abs(b_h))
    assert it_h == it_d and 0 < it_d <= 40
    assert np.linalg.norm(x_h - x_d) <= 1e-10 * np.linalg.norm(x_h)
    u_h, u_d = to_host(ml_h.expand(xd_h)), to_host(ml_d.expand(xd_d))
    assert np.linalg.norm(u_h - u_d) <= 1e-10 * np.linalg.norm(u_h)
    return ml_d


@pytest.mark.parametrize("dim, refine, radii", [(2, 4, (0.3, 0.15)), (3, 2, (0.35, 0.15))])
def test_q2_on_a_device_mesh_gives_the_host_mesh_levels(dim, refine, radii):
    mh, md = _mesh(dim, refine, radii, "cpu"), _mesh(dim, refine, radii, "gpu")
    sh, sd = Space(mh, 2), Space(md, 2)
    assert sd.hanging_nodes.shape[0] == sh.hanging_nodes.size > 0
    _exact(sh.cell_dofs, sd.cell_dofs, "cell_dofs")
    assert type(sd.H).__module__.startswith("cupyx")
    _solve_both([sh, sd], assemble.stiffness, lambda x: 1.0 + x[..., 0] * x[..., 1])


def test_elasticity_on_a_device_mesh_gives_the_host_mesh_levels():
    mh, md = _mesh(3, 3, (0.35, 0.15), "cpu"), _mesh(3, 3, (0.35, 0.15), "gpu")
    form = functools.partial(assemble.elasticity, lam=2.0, mu=1.0)
    ml = _solve_both([Space(mh, 1, 3), Space(md, 1, 3)], form, np.array([0.0, -1.0, 0.5]),
                     smoother="block_jacobi")
    assert type(ml.levels[-1].A).__module__.startswith("cupyx")


def test_elasticity_problem_system_on_a_device_mesh_gives_the_host_mesh_levels():
    """The elasticity problem's node-block system (M and the nine A_rs on the scalar pattern,
    constrained by the node-block congruence map) from a device mesh."""
    from adaptmg_problems.elasticity import make_mesh, system_matrix
    be = get_backend("gpu")
    mh = make_mesh("face", 2)                                 # 8^3 box + one face layer: 3 GPU levels
    md = mh.to("gpu")
    mls = [adaptmg.multigrid(Space(m, 1, 6), system_matrix(0.025, backend=be), dirichlet="all",
                             smoother="block_jacobi", backend=be) for m in (mh, md)]
    _compare(*mls)
    b = be.xp.ones(mls[0].levels[-1].A.shape[0])
    xs = [to_host(ml.solve(b, rtol=1e-8, accel="gmres")) for ml in mls]
    assert np.linalg.norm(xs[0] - xs[1]) <= 1e-10 * np.linalg.norm(xs[0])
