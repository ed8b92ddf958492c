"""pyamg bridge: the same hierarchy cycled by adaptmg converges like pyamg (CG iterations <= pyamg's + 1).

Smoother setting used: pyamg is built with weighted Jacobi (``('jacobi',
{'omega': 4/3})``, i.e. omega = 4/(3 rho(D^-1 A)) per level, pyamg's
``withrho``), and ``from_pyamg`` reads pyamg's per-level weight and sweep
count, so both cycles are the same operator.  pyamg's default symmetric
Gauss-Seidel becomes adaptmg's symmetric multicolour Gauss-Seidel (with a
warning: colour order, not lexicographic); tests/multilevel/test_pyamg_fidelity.py
checks all mappings.
"""
import numpy as np
import pytest
import scipy.sparse as sp

pyamg = pytest.importorskip("pyamg")

import adaptmg
from adaptmg import assemble
from adaptmg.linalg import cg

JAC = ("jacobi", {"omega": 4.0 / 3.0})


def _poisson():
    return pyamg.gallery.poisson((100, 100), format="csr")


def _q1_fe():
    """Q1 stiffness on a locally refined L-ish mesh (hanging nodes) with Dirichlet constraints."""
    mesh = adaptmg.Mesh.box([0, 0], [1, 1], [32, 32])
    x = mesh.points[mesh.cells].mean(axis=1)
    mesh = mesh.refine(np.linalg.norm(x - 0.5, axis=1) < 0.3)
    space = adaptmg.Space(mesh, degree=1)
    assert mesh.num_hanging_nodes > 0
    con = adaptmg.Constraints(space, space.boundary_dofs())
    return sp.csr_matrix(con.matrix(assemble.stiffness(space, 1.0)))


def _iterations(solve):
    its = []
    x, info = solve(lambda xk: its.append(1))
    return x, info, len(its)


@pytest.mark.parametrize("matrix", [_poisson, _q1_fe], ids=["gallery-poisson", "q1-fe-hanging"])
@pytest.mark.parametrize("kind", ["sa", "rs"])
def test_bridge_cg_iterations_match_pyamg(matrix, kind):
    A = matrix()
    b = np.random.default_rng(1).standard_normal(A.shape[0])
    build = pyamg.smoothed_aggregation_solver if kind == "sa" else pyamg.ruge_stuben_solver
    ml = build(A, presmoother=JAC, postsmoother=JAC, max_coarse=20)
    assert len(ml.levels) >= 3
    res = []
    ml.solve(b, tol=1e-8, accel="cg", residuals=res, maxiter=300)
    it_pyamg = len(res) - 1
    assert res[-1] <= 1e-8 * np.linalg.norm(b)

    mg = adaptmg.from_pyamg(ml, backend="cpu")
    assert isinstance(mg, adaptmg.MultilevelSolver)
    assert len(mg.levels) == len(ml.levels)
    # levels coarse -> fine, R stored explicitly and equal to pyamg's
    assert mg.levels[-1].n == A.shape[0] and mg.levels[0].P is None
    R0 = sp.csr_matrix(ml.levels[0].R)
    assert abs(sp.csr_matrix(mg.levels[-1].R) - R0).max() == 0
    x, info, it = _iterations(lambda cb: cg(A, b, rtol=1e-8, M=mg.aspreconditioner(),
                                            callback=cb, maxiter=300))
    assert info == 0
    assert np.linalg.norm(b - A @ x) <= 1e-8 * np.linalg.norm(b)
    assert it <= it_pyamg + 1, (it, it_pyamg)
    assert it_pyamg >= 3  # the comparison means something


def test_bridge_preconditioner_is_pyamg_cycle():
    """One adaptmg cycle = one pyamg cycle (same Jacobi weights, same matrices) to round-off."""
    A = _poisson()
    ml = pyamg.smoothed_aggregation_solver(A, presmoother=JAC, postsmoother=JAC)
    mg = adaptmg.from_pyamg(ml, backend="cpu")
    r = np.random.default_rng(2).standard_normal(A.shape[0])
    z_pyamg = ml.aspreconditioner(cycle="V") @ r
    z = mg.aspreconditioner() @ r
    assert np.linalg.norm(z - z_pyamg) <= 1e-10 * np.linalg.norm(z_pyamg)


def test_bridge_default_gauss_seidel_hierarchy_converges():
    from adaptmg.multilevel.pyamg import SmootherMappingWarning
    A = _poisson()
    ml = pyamg.smoothed_aggregation_solver(A)              # symmetric Gauss-Seidel in pyamg
    with pytest.warns(SmootherMappingWarning, match="multicolour GS"):   # the GPU's mapping
        mg = adaptmg.from_pyamg(ml, backend="cpu", relax="map")   # symmetric multicolour GS
    b = np.ones(A.shape[0])
    res, res_p = [], []
    x = mg.solve(b, rtol=1e-8, accel="cg", residuals=res)
    assert np.linalg.norm(b - A @ x) <= 1e-8 * np.linalg.norm(b)
    ml.solve(b, tol=1e-8, accel="cg", residuals=res_p)
    assert len(res) - 1 <= 1.25 * (len(res_p) - 1)
    mj = adaptmg.from_pyamg(ml, backend="cpu", smoother="jacobi")   # the earlier default
    res = []
    mj.solve(b, rtol=1e-8, accel="cg", residuals=res)
    assert len(res) - 1 <= 30


@pytest.mark.gpu
def test_bridge_gpu_matches_cpu():
    be = adaptmg.get_backend("gpu")
    A = _poisson()
    ml = pyamg.smoothed_aggregation_solver(A, presmoother=JAC, postsmoother=JAC)
    b = np.random.default_rng(3).standard_normal(A.shape[0])
    z_cpu = adaptmg.from_pyamg(ml, backend="cpu").aspreconditioner() @ b
    mg = adaptmg.from_pyamg(ml, backend="gpu")
    z_gpu = be.xp.asnumpy(mg.aspreconditioner() @ be.asarray(b))
    assert np.linalg.norm(z_gpu - z_cpu) <= 1e-10 * np.linalg.norm(z_cpu)
    its = []
    Ad, bd = be.asmatrix(A), be.asarray(b)
    x, info = cg(Ad, bd, rtol=1e-8, M=mg.aspreconditioner(), callback=lambda xk: its.append(1))
    assert info == 0 and type(x).__module__.startswith("cupy")
    res = []
    ml.solve(b, tol=1e-8, accel="cg", residuals=res)
    assert len(its) <= len(res)


def test_oom_is_reported_with_size_and_advice(monkeypatch):
    from adaptmg import errors

    class OutOfMemoryError(Exception):
        pass
    OutOfMemoryError.__module__ = "cupy.cuda.memory"
    with pytest.raises(MemoryError, match=r"GPU out of memory while moving.*MiB.*backend='cpu'.*float32"):
        with errors.gpu_memory_guard("moving a test hierarchy", 3 * 2**20):
            raise OutOfMemoryError("out of memory allocating 1024 bytes")
    with pytest.raises(KeyError):
        with errors.gpu_memory_guard("x"):
            raise KeyError("other errors pass through")


@pytest.mark.gpu
def test_real_cupy_oom_becomes_memory_error():
    from adaptmg import errors
    xp = adaptmg.get_backend("gpu").xp
    with pytest.raises(MemoryError, match=r"GPU out of memory while allocating a test array.*TiB"):
        with errors.gpu_memory_guard("allocating a test array", 8 * 10 ** 14):
            xp.empty(10 ** 14, dtype=xp.float64)              # 800 TB
