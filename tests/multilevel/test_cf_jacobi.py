"""C/F Jacobi (:class:`adaptmg.multilevel.smoothers.CFJacobi`) against pyamg's ``cf_jacobi`` /
``fc_jacobi`` / ``cf_block_jacobi`` on AIR levels, and ``from_pyamg(relax="map")`` (the
GPU's smoother mapping) against pyamg's own cycle on AIR hierarchies.

Each body runs on NumPy and (``-m gpu``) on CuPy through the ``backend`` fixture."""
import warnings

import numpy as np
import pytest
import scipy.sparse as sp

pyamg = pytest.importorskip("pyamg")
from pyamg.relaxation import relaxation as R  # noqa: E402

import adaptmg  # noqa: E402
from adaptmg.backend import to_host  # noqa: E402
from adaptmg.multilevel.pyamg import SmootherMappingWarning  # noqa: E402
from adaptmg.multilevel.smoothers import CFJacobi, PrePostSmoother  # noqa: E402

EPS = np.finfo(np.float64).eps
PYAMG = {"cf": R.cf_jacobi, "fc": R.fc_jacobi}


def _air_level(shape=(24, 24)):
    A = pyamg.gallery.poisson(shape, format="csr")
    ml = pyamg.air_solver(A, max_coarse=50)
    lev = ml.levels[0]
    split = lev.splitting.astype(bool)
    assert 0 < split.sum() < split.size             # a real splitting, both classes present
    return lev.A, split, np.flatnonzero(split), np.flatnonzero(~split)


def _close(got, ref, ulps, scale):
    """``|got - ref| <= ulps eps scale`` (the sweeps' sums run in other orders than pyamg's)."""
    err = np.linalg.norm(to_host(got) - ref)
    assert err <= ulps * EPS * scale, (err, ulps * EPS * scale)


@pytest.mark.parametrize("order", ["cf", "fc"])
@pytest.mark.parametrize("it, fi, ci, w", [(1, 1, 1, 1.0), (2, 2, 1, 0.7), (1, 0, 3, 1.3)])
def test_matches_pyamg(backend, order, it, fi, ci, w):
    A, split, C, F = _air_level()
    rng = np.random.default_rng(it + 10 * fi + 100 * ci)
    x0, b = rng.standard_normal(A.shape[0]), rng.standard_normal(A.shape[0])
    x = x0.copy()
    PYAMG[order](A, x, b, C, F, iterations=it, f_iterations=fi, c_iterations=ci, omega=w)
    sm = CFJacobi(A, split, order=order, f_iterations=fi, c_iterations=ci, omega=w,
                  backend=backend)
    y = backend.asarray(x0.copy())         # the CPU backend does not copy
    sm.smooth(y, backend.asarray(b), it)
    assert np.linalg.norm(x - x0) > 0.1 * np.linalg.norm(x0)         # the sweep did something
    _close(y, x, 16, np.linalg.norm(x) + np.linalg.norm(b))
    # only the relaxed class moved when the other one has no half-sweeps
    if fi == 0:
        np.testing.assert_array_equal(to_host(y)[F], x0[F])


def test_block_and_bsr_variants_match_pyamg(backend):
    """``fc_block_jacobi`` (pyamg's Dinv and our own inverses) and ``cf_jacobi`` on a BSR
    matrix (nodes of 2 rows relaxed point by point), splitting by nodes."""
    A, split, C, F = _air_level((12, 12))
    Ab = sp.bsr_matrix(sp.kron(A, np.array([[4.0, 1.0], [0.5, 3.0]])).tocsr(), blocksize=(2, 2))
    rng = np.random.default_rng(5)
    x0, b = rng.standard_normal(Ab.shape[0]), rng.standard_normal(Ab.shape[0])
    Dinv = pyamg.util.utils.get_block_diag(Ab, blocksize=2, inv_flag=True)
    x = x0.copy()
    R.fc_block_jacobi(Ab, x, b, C, F, Dinv=Dinv, blocksize=2, iterations=2, f_iterations=2,
                      c_iterations=1, omega=0.8)
    for D in (Dinv, None):
        sm = CFJacobi(Ab.tocsr(), split, order="fc", f_iterations=2, c_iterations=1, omega=0.8,
                      block=True, Dinv=D, backend=backend)
        assert sm.node_size == 2 and "block_size=2" in repr(sm)
        y = backend.asarray(x0.copy())         # the CPU backend does not copy
        sm.smooth(y, backend.asarray(b), 2)
        _close(y, x, 64, np.linalg.norm(x) + np.linalg.norm(b))
    x = x0.copy()
    R.cf_jacobi(Ab, x, b, C, F, iterations=1, f_iterations=1, c_iterations=2, omega=0.9)
    sm = CFJacobi(Ab.tocsr(), split, order="cf", f_iterations=1, c_iterations=2, omega=0.9,
                  backend=backend)
    y = backend.asarray(x0.copy())         # the CPU backend does not copy
    sm.smooth(y, backend.asarray(b), 1)
    _close(y, x, 16, np.linalg.norm(x) + np.linalg.norm(b))


def test_complex_and_zero_diagonal_as_pyamg(backend):
    """A complex matrix with a zero diagonal entry: pyamg leaves that row alone."""
    A, split, C, F = _air_level((10, 10))
    A = (A + 0.3j * sp.diags(np.linspace(-1, 1, A.shape[0]))).tolil()
    z = int(F[3])
    A[z, z] = 0.0
    A = A.tocsr()
    A.eliminate_zeros()
    rng = np.random.default_rng(2)
    n = A.shape[0]
    x0 = rng.standard_normal(n) + 1j * rng.standard_normal(n)
    b = rng.standard_normal(n) + 1j * rng.standard_normal(n)
    x = x0.copy()
    R.fc_jacobi(A, x, b, C, F, iterations=2, f_iterations=2, c_iterations=1, omega=0.9)
    sm = CFJacobi(A, split, order="fc", f_iterations=2, c_iterations=1, omega=0.9,
                  backend=backend)
    y = backend.asarray(x0.copy())         # the CPU backend does not copy
    sm.smooth(y, backend.asarray(b), 2)
    assert to_host(y)[z] == x0[z]
    _close(y, x, 16, np.linalg.norm(x) + np.linalg.norm(b))


def test_adjoint_is_reverse_order_and_A_adjoint():
    r"""``smooth_adjoint`` of ``cf`` is the ``fc`` sweep, and :math:`(A E u, v) = (A u, E^* v)`
    for the error propagation :math:`E` (``b = 0``) of a symmetric matrix."""
    A, split, C, F = _air_level((16, 16))
    rng = np.random.default_rng(7)
    u, v = rng.standard_normal(A.shape[0]), rng.standard_normal(A.shape[0])
    zero = np.zeros_like(u)
    cf = CFJacobi(A, split, order="cf", f_iterations=2, c_iterations=1, omega=0.8)
    fc = CFJacobi(A, split, order="fc", f_iterations=2, c_iterations=1, omega=0.8)
    Eu = cf.smooth(u.copy(), zero, 2)
    Ev = cf.smooth_adjoint(v.copy(), zero, 2)
    np.testing.assert_array_equal(Ev, fc.smooth(v.copy(), zero, 2))
    lhs, rhs = (A @ Eu) @ v, (A @ u) @ Ev
    assert abs(lhs - rhs) <= 64 * EPS * np.linalg.norm(A @ u) * np.linalg.norm(v)
    assert abs((A @ Eu) @ Eu) < 0.5 * abs((A @ u) @ u)      # and it smooths (energy drops)


def test_bad_input_is_named():
    A, split, C, F = _air_level((8, 8))
    with pytest.raises(ValueError, match="order"):
        CFJacobi(A, split, order="ff")
    with pytest.raises(ValueError, match="does not divide"):
        CFJacobi(A, split[:-1])
    with pytest.raises(TypeError, match="boolean"):
        CFJacobi(A, split.astype(float))
    with pytest.raises(ValueError, match="f_iterations"):
        CFJacobi(A, split, f_iterations=-1)
    with pytest.raises(ValueError, match="Dinv must have shape"):
        CFJacobi(A, split, block=True, Dinv=np.ones((split.size, 2, 2)))   # 1 row per node
    sm = CFJacobi(A, split)
    with pytest.raises(ValueError, match="shape"):
        sm.smooth(np.zeros(3), np.zeros(3))
    s32 = sm.to("cpu", np.float32)
    x = np.zeros(A.shape[0], np.float32)
    s32.smooth(x, np.ones_like(x), 1)
    x64 = sm.smooth(np.zeros(A.shape[0]), np.ones(A.shape[0]), 1)
    np.testing.assert_allclose(x, x64, rtol=1e-5)


# ------------------------------------------------------------------ from_pyamg(relax="map")
def _air_cases():
    A = pyamg.gallery.poisson((30, 30), format="csr")
    n = 120
    Ad = sp.diags_array([np.ones(n), -np.ones(n - 1)], offsets=[0, -1], format="csr")
    Ad.sort_indices()
    blk = np.array([1, -1, 1, 1])
    data = np.concatenate((np.tile(np.concatenate((blk, -blk)), n - 1), blk)).reshape(2 * n - 1, 2, 2)
    Ab = sp.bsr_array((data, Ad.indices, Ad.indptr), blocksize=[2, 2])
    return {
        "default": pyamg.air_solver(A, max_coarse=50),          # pre None, post fc_jacobi
        "cf_fc": pyamg.air_solver(A, max_coarse=50, presmoother=(
            "cf_jacobi", {"omega": 0.8, "f_iterations": 2, "c_iterations": 1, "iterations": 1}),
            postsmoother=("fc_jacobi", {"omega": 0.8, "f_iterations": 2, "c_iterations": 1,
                                        "iterations": 1})),
        "block": pyamg.air_solver(Ab, max_levels=2, postsmoother=(
            "fc_block_jacobi", {"iterations": 1, "f_iterations": 1, "c_iterations": 0})),
    }


@pytest.mark.parametrize("case", ["default", "cf_fc", "block"])
def test_map_is_pyamgs_cycle(backend, case):
    """The mapped hierarchy (what the GPU runs) applies pyamg's own cycle: one V-cycle of
    ``relax="map"`` on ``backend`` equals the CPU cycle that calls pyamg's smoothers."""
    ml = _air_cases()[case]
    with warnings.catch_warnings():
        warnings.simplefilter("error", SmootherMappingWarning)     # exact: no warning
        mg = adaptmg.from_pyamg(ml, backend=backend, relax="map")
    assert mg.smoother_notes == []
    fine = mg.levels[-1].smoother
    parts = (fine.pre, fine.post) if isinstance(fine, PrePostSmoother) else (fine,)
    assert any(isinstance(s, CFJacobi) for s in parts), fine
    if case == "cf_fc":                 # a cf/fc pair is one smoother and its adjoint
        assert isinstance(fine, CFJacobi) and fine.order == "cf"
    ref = adaptmg.from_pyamg(ml, backend="cpu")                    # pyamg's own smoothers
    n = ml.levels[0].A.shape[0]
    r = np.random.default_rng(11).standard_normal(n)
    z_ref = ref.aspreconditioner() @ r
    z = to_host(mg.aspreconditioner() @ backend.asarray(r))
    assert np.linalg.norm(z - z_ref) <= 1e4 * EPS * np.linalg.norm(z_ref)     # ~1e-16 measured
    z_pyamg = ml.aspreconditioner() @ r
    assert np.linalg.norm(z - z_pyamg) <= 1e4 * EPS * np.linalg.norm(z_pyamg)
