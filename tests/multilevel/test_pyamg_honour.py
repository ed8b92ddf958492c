"""from_pyamg honours what the pyamg hierarchy says (issue 41): pyamg's own relaxation on the
CPU, its coarse solver by name, the AMLI cycle, complex hierarchies, accel as a name or a
function.  The cycle is compared with pyamg's own (``ml.aspreconditioner() @ r``) to
round-off; the mapped (GPU) path with iteration counts."""
import warnings

import numpy as np
import pytest
import scipy.sparse as sp

import adaptmg
from adaptmg.multilevel.pyamg import SmootherMappingWarning
from adaptmg.multilevel.pyamg_relax import (PyamgRelaxation, coarse_operator,
                                            read_coarse_solver)

pyamg = pytest.importorskip("pyamg")

EPS = np.finfo(np.float64).eps


def _rel(a, b):
    return np.linalg.norm(a - b) / np.linalg.norm(b)


def _quiet(f, *a, **k):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return f(*a, **k)


def _bridge(ml, **kw):
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        mg = adaptmg.from_pyamg(ml, backend="cpu", **kw)
    return mg, [x for x in w if issubclass(x.category, SmootherMappingWarning)]


@pytest.mark.filterwarnings("ignore::scipy.linalg.LinAlgWarning")      # the singular 'lu' case
@pytest.mark.parametrize("solver", ["pinv", "pinv2", "lu", "cholesky", "splu", None,
                                    ("pinv", {"rtol": 0.3})])
def test_coarse_operator_is_pyamgs_coarse_solver(solver):
    """C b == pyamg's coarse_grid_solver(A, b): SPD 2-D Poisson, and for pinv/splu a singular
    matrix with an empty row/column (pyamg's pinv: least-squares; splu: drops it)."""
    class _ML:
        coarse_solver = pyamg.multilevel.coarse_grid_solver(solver)
    name, kw = read_coarse_solver(_ML)
    assert name == (solver[0] if isinstance(solver, tuple) else solver)
    assert kw == (solver[1] if isinstance(solver, tuple) else {})
    A = sp.csr_matrix(pyamg.gallery.poisson((5, 5)))
    cases = [A]
    if name in ("pinv", "splu"):
        S = sp.lil_matrix(sp.block_diag([pyamg.gallery.poisson((4,)), sp.csr_matrix((1, 1))]))
        cases.append(sp.csr_matrix(S))
    rng = np.random.default_rng(0)
    for M in cases:
        b = rng.standard_normal(M.shape[0])
        if M is not A and name == "splu":
            b[-1] = 0.0
        C = coarse_operator(name, kw, M)
        ref = pyamg.multilevel.coarse_grid_solver(solver)(M, b)    # (it caches its factors)
        if name is None:
            assert np.all(C == 0)
            continue
        assert _rel(C @ b, ref) <= 1e3 * EPS
    with pytest.raises(ValueError, match="'lu'"):                 # singular: refused, named
        coarse_operator("lu", {}, sp.csr_matrix(np.ones((3, 3))))


@pytest.mark.parametrize("cycle", ["V", "W", "F", "AMLI"])
def test_default_cpu_cycle_is_pyamgs_cycle(cycle):
    """Default SA (symmetric lexicographic GS, pinv coarse solve): one adaptmg cycle equals one
    pyamg cycle to round-off, with no mapping warning; AMLI too (nonlinear: same steps)."""
    A = pyamg.gallery.poisson((24, 24), format="csr")
    ml = pyamg.smoothed_aggregation_solver(A, max_coarse=10)
    assert len(ml.levels) >= 3
    mg, w = _bridge(ml)
    assert not w and mg.smoother_notes == []
    assert all(isinstance(d.smoother, PyamgRelaxation) for d in mg._dev[1:])
    assert "pinv" in repr(mg)
    r = np.random.default_rng(1).standard_normal(A.shape[0])
    z_p = _quiet(ml.aspreconditioner(cycle=cycle).matvec, r)
    z_a = mg.aspreconditioner(cycle=cycle) @ r
    assert _rel(z_a, z_p) <= 1e4 * EPS, cycle


def test_amli_with_fgmres_and_stationary():
    """The AMLI cycle alone gives pyamg's residual history (it stagnates there too: a
    nonlinear cycle from the all-ones start); inside FGMRES it converges as pyamg's."""
    A = pyamg.gallery.poisson((30, 30), format="csr")
    ml = pyamg.smoothed_aggregation_solver(A, max_coarse=10)
    mg = adaptmg.from_pyamg(ml, backend="cpu")
    b = np.random.default_rng(2).standard_normal(A.shape[0])
    res_p, res_a = [], []
    _quiet(ml.solve, b, tol=1e-8, cycle="AMLI", residuals=res_p, maxiter=12)
    _quiet(mg.solve, b, rtol=1e-8, cycle="AMLI", residuals=res_a, maxiter=12)
    assert len(res_a) == len(res_p) == 13 and res_a[-1] < 1e-4 * res_a[0]
    np.testing.assert_allclose(res_a, res_p, rtol=1e-8)
    res_p, res_a = [], []
    _quiet(ml.solve, b, tol=1e-10, accel="fgmres", cycle="AMLI", residuals=res_p)
    x = mg.solve(b, rtol=1e-10, accel="fgmres", cycle="AMLI", residuals=res_a)
    assert np.linalg.norm(b - A @ x) <= 1e-10 * np.linalg.norm(b)
    assert len(res_a) <= len(res_p) + 1 <= 12


def test_complex_hermitian_hierarchy_both_paths():
    """A complex Hermitian system (pyamg's gauge Laplacian): the default CPU path is pyamg's
    cycle; the mapped path (multicolour GS in complex arithmetic, what the GPU runs) converges
    within 1.25x pyamg's CG iterations."""
    A = pyamg.gallery.gauge_laplacian(14, spacing=1.0, beta=0.1).tocsr()
    A = A + 0.2 * sp.identity(A.shape[0], format="csr")
    assert A.dtype == np.complex128 and abs(A - A.conj().T).max() < 1e-12
    ml = pyamg.smoothed_aggregation_solver(A, max_coarse=10)
    rng = np.random.default_rng(3)
    b = rng.standard_normal(A.shape[0]) + 1j * rng.standard_normal(A.shape[0])
    res_p = []
    _quiet(ml.solve, b, tol=1e-8, accel="cg", residuals=res_p)
    mg, w = _bridge(ml)
    assert mg.dtype == np.complex128 and not w
    r = b.copy()
    assert _rel(mg.aspreconditioner() @ r, _quiet(ml.aspreconditioner().matvec, r)) <= 1e4 * EPS
    for kw in ({}, {"relax": "map"}):
        mg, _ = _bridge(ml, **kw)
        its = []
        x = mg.solve(b, rtol=1e-8, accel="cg", callback=lambda xk: its.append(1))
        assert x.dtype == np.complex128
        assert np.linalg.norm(b - A @ x) <= 1e-8 * np.linalg.norm(b)
        assert len(its) <= 1.25 * (len(res_p) - 1) + 1, (kw, len(its), len(res_p))
    with pytest.raises(TypeError, match="complex"):            # complex b, real hierarchy
        adaptmg.from_pyamg(pyamg.smoothed_aggregation_solver(
            pyamg.gallery.poisson((8, 8), format="csr")), backend="cpu").solve(b[:64])


def test_accel_names_and_functions():
    """accel: pyamg's cg as a function (pyamg's signature), SciPy's cgs by name, gmres with
    pyamg's residuals (||M r_k||, maxiter inner iterations); an unknown name is refused."""
    from pyamg.krylov import cg as pyamg_cg
    A = pyamg.gallery.poisson((20, 20), format="csr")
    ml = pyamg.smoothed_aggregation_solver(A)
    mg = adaptmg.from_pyamg(ml, backend="cpu")
    b = np.random.default_rng(4).standard_normal(A.shape[0])
    res_p, res_a = [], []
    x_p = _quiet(ml.solve, b, tol=1e-10, accel=pyamg_cg, residuals=res_p)
    x_a = mg.solve(b, rtol=1e-10, accel=pyamg_cg, residuals=res_a)
    assert len(res_a) == len(res_p) and _rel(x_a, x_p) <= 1e-8
    res = []
    x = mg.solve(b, rtol=1e-8, accel="cgs", residuals=res)
    assert np.linalg.norm(b - A @ x) <= 1e-8 * np.linalg.norm(b)
    assert res[0] == pytest.approx(np.linalg.norm(b)) and len(res) <= 15
    res_p, res_a = [], []
    _quiet(ml.solve, b, tol=1e-14, maxiter=4, accel="gmres", residuals=res_p)
    _quiet(mg.solve, b, rtol=1e-14, maxiter=4, accel="gmres", residuals=res_a)
    assert len(res_a) == len(res_p) == 5
    np.testing.assert_allclose(res_a, res_p, rtol=1e-6)
    with pytest.raises(ValueError, match="unknown accel"):
        mg.solve(b, accel="no_such_solver")


def test_iterative_coarse_solver_runs_pyamgs_own_on_the_cpu():
    """coarse_solver=('jacobi', {'iterations': 30}) (pyamg's test_coarse_solver_opts): the CPU
    calls pyamg's own, so the cycle is pyamg's; bad from_pyamg arguments are named."""
    A = pyamg.gallery.poisson((20, 20), format="csr")
    ml = pyamg.smoothed_aggregation_solver(A, coarse_solver=("jacobi", {"iterations": 30}),
                                           max_coarse=50)
    mg = adaptmg.from_pyamg(ml, backend="cpu")
    assert "'jacobi'" in repr(mg) and "host" in repr(mg)
    r = np.random.default_rng(5).standard_normal(A.shape[0])
    assert _rel(mg.aspreconditioner() @ r, _quiet(ml.aspreconditioner().matvec, r)) <= 1e4 * EPS
    with pytest.raises(ValueError, match="relax"):
        adaptmg.from_pyamg(ml, relax="exact")
    with pytest.raises(ValueError, match="coarse must be"):
        adaptmg.from_pyamg(ml, coarse="pinv3")


def test_device_coarse_solver_is_pyamgs_iterative_coarse_solver():
    """What the GPU runs for pyamg's iterative coarse solvers, here on the CPU backend:
    Jacobi (pyamg's omega / rho, 30 sweeps) equals pyamg's to round-off; cg with pyamg's
    tol reaches it; Gauss-Seidel (multicolour) smooths the coarse error as pyamg's does."""
    from adaptmg.backend import get_backend
    from adaptmg.multilevel.pyamg_relax import DeviceCoarseSolver
    A = sp.csr_matrix(pyamg.gallery.poisson((12, 12)))
    b = np.random.default_rng(6).standard_normal(A.shape[0])
    be = get_backend("cpu")
    for name, kw in (("jacobi", {"iterations": 30}), ("cg", {"tol": 1e-6}),
                     ("gauss_seidel", {"iterations": 30})):
        ref = pyamg.multilevel.coarse_grid_solver((name, kw))(A, b)
        dev = DeviceCoarseSolver(name, kw, A, be, np.float64, name)
        x = dev(b, np.empty_like(b))
        rr, ra = (np.linalg.norm(b - A @ v) / np.linalg.norm(b) for v in (ref, x))
        if name == "jacobi":
            assert dev.exact and _rel(x, ref) <= 1e4 * EPS
        elif name == "cg":
            assert dev.exact and ra <= 1e-6 and rr <= 1e-6
        else:
            assert not dev.exact and ra <= 1.3 * rr and ra < 0.5
    assert not DeviceCoarseSolver.supports("cgs")


@pytest.mark.gpu
def test_gpu_complex_hierarchy_amli_accel_and_coarse_solver():
    """On the device: a complex Hermitian pyamg hierarchy (complex multicolour GS through
    cupyx, complex cuSPARSE, complex dense coarse solve), pyamg's cg coarse solver by
    adaptmg's cg, the AMLI cycle inside FGMRES and pyamg's cg as accel on host arrays."""
    from pyamg.krylov import cg as pyamg_cg
    A = pyamg.gallery.gauge_laplacian(14, spacing=1.0, beta=0.1).tocsr()
    A = A + 0.2 * sp.identity(A.shape[0], format="csr")
    rng = np.random.default_rng(7)
    b = rng.standard_normal(A.shape[0]) + 1j * rng.standard_normal(A.shape[0])
    for coarse in ("pinv", ("cg", {"tol": 1e-12})):
        ml = pyamg.smoothed_aggregation_solver(A, max_coarse=10, coarse_solver=coarse)
        res_p = []
        _quiet(ml.solve, b, tol=1e-8, accel="cg", residuals=res_p)
        mg = _quiet(adaptmg.from_pyamg, ml, backend="gpu")
        assert mg.dtype == np.complex128 and mg.backend.is_gpu
        its = []
        x = mg.solve(b, rtol=1e-8, accel="cg", callback=lambda xk: its.append(1))
        assert isinstance(x, np.ndarray) and x.dtype == np.complex128
        assert np.linalg.norm(b - A @ x) <= 1e-8 * np.linalg.norm(b)
        assert len(its) <= 1.25 * (len(res_p) - 1) + 1
        x = mg.solve(b, rtol=1e-8, accel="fgmres", cycle="AMLI")
        assert np.linalg.norm(b - A @ x) <= 1e-8 * np.linalg.norm(b)
        res = []
        x = mg.solve(b, rtol=1e-8, accel=pyamg_cg, residuals=res)
        assert np.linalg.norm(b - A @ x) <= 1e-7 * np.linalg.norm(b) and len(res) <= 40


def test_zero_diagonal_and_singular_block_as_pyamg():
    """singular='pinv' (what from_pyamg asks for): a zero diagonal leaves its row alone and a
    singular node block is pseudo-inverted, as pyamg's relaxation; the default refuses."""
    from pyamg.relaxation.relaxation import block_gauss_seidel, gauss_seidel, jacobi
    from adaptmg.multilevel.gauss_seidel import BlockGaussSeidel, GaussSeidel
    from adaptmg.multilevel.smoothers import Jacobi
    A = sp.csr_matrix(np.array([[2.0, -1, 0], [-1, 0, -1], [0, -1, 2]]))
    b = np.array([1.0, 2.0, 3.0])
    for ours, ref in ((lambda: Jacobi(A, omega=1.0, singular="pinv"),
                       lambda x: jacobi(A, x, b, omega=1.0)),
                      (lambda: GaussSeidel(A, sweep="forward", singular="pinv"),
                       lambda x: gauss_seidel(A, x, b, sweep="forward"))):
        x, y = np.zeros(3), np.zeros(3)
        ours().smooth(x, b, 1)
        ref(y)
        np.testing.assert_allclose(x, y, rtol=1e-14)       # path graph: the colours are exact
    with pytest.raises(ValueError, match="row 1"):
        GaussSeidel(A)
    B = sp.csr_matrix(sp.block_diag([np.ones((2, 2)), 2.0 * np.eye(2)]))
    c = np.array([1.0, 3.0, 2.0, 4.0])
    x, y = np.zeros(4), np.zeros(4)
    BlockGaussSeidel(B, block_size=2, sweep="forward", singular="pinv").smooth(x, c, 1)
    block_gauss_seidel(sp.bsr_matrix(B, blocksize=(2, 2)), y, c, blocksize=2, sweep="forward")
    np.testing.assert_allclose(x, y, rtol=1e-13)
    np.testing.assert_allclose(x, [1.0, 1.0, 1.0, 2.0], rtol=1e-13)
    with pytest.raises(ValueError, match="node 0"):
        BlockGaussSeidel(B, block_size=2)
