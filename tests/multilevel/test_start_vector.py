"""The start vector of the set-up's spectral estimates: deterministic, per entry, same on
every backend; and the estimates it starts still bound the spectrum."""
import numpy as np
import pytest
from pyamg.gallery import poisson

from adaptmg.backend import get_backend, to_host
from adaptmg.multilevel.smoothers import Jacobi
from adaptmg.multilevel.start_vector import start_vector


def test_values_are_uniform_and_seeded():
    v = start_vector(200_000)
    assert v.dtype == np.float64 and v.shape == (200_000,)
    assert v.min() >= -1.0 and v.max() < 1.0
    # uniform on [-1, 1): mean 0 +- 4 sigma (sigma = 1/sqrt(3 n)), variance 1/3
    assert abs(v.mean()) < 4 / np.sqrt(3 * v.size)
    assert abs(v.var() - 1 / 3) < 0.01
    # neighbouring entries uncorrelated (a plain counter would not be)
    assert abs(np.corrcoef(v[:-1], v[1:])[0, 1]) < 0.02
    assert np.array_equal(start_vector(100), start_vector(100, 0))
    assert not np.any(start_vector(100, 1) == start_vector(100, 0))


def test_rows_are_the_entries_of_the_whole_vector():
    """A rank's owned rows give the serial vector's entries (what adaptmg.distributed uses)."""
    v = start_vector(1000, 3)
    rows = np.array([999, 0, 17, 17, 512])
    assert np.array_equal(start_vector(1000, 3, rows=rows), v[rows])
    assert np.array_equal(start_vector(1000, 3, rows=rows.astype(np.int32)), v[rows])
    assert start_vector(0).shape == (0,)


@pytest.mark.parametrize("kw, exc, match", [
    (dict(n=-1), ValueError, "non-negative integer"),
    (dict(n=2.5), ValueError, "non-negative integer"),
    (dict(n=4, seed=-1), ValueError, "seed"),
    (dict(n=4, rows=np.array([0, 4])), ValueError, r"\[0, 4\)"),
    (dict(n=4, rows=np.array([0.0])), TypeError, "integers"),
])
def test_bad_input(kw, exc, match):
    with pytest.raises(exc, match=match):
        start_vector(**kw)


def test_power_estimate_bounds_the_spectrum():
    """omega="auto": 1.05 x the 12-step power estimate of lambda_max(D^-1 A) lies within
    [0.95, 1.1] of the true value for the 2-D Laplacian (lambda_max -> 2)."""
    A = poisson((40, 40), format="csr")
    lam_true = float(np.linalg.eigvalsh((A / 4.0).toarray())[-1])
    lam = Jacobi(A).lambda_max()
    assert 0.95 * lam_true <= lam <= 1.1 * lam_true, (lam, lam_true)


@pytest.mark.gpu
def test_same_vector_and_omega_on_the_gpu():
    be = get_backend("gpu")
    v = start_vector(300_001, 5, xp=be.xp)
    assert np.array_equal(to_host(v), start_vector(300_001, 5))
    rows = np.array([7, 300_000, 3])
    assert np.array_equal(to_host(start_vector(300_001, 5, rows=be.asarray(rows), xp=be.xp)),
                          start_vector(300_001, 5, rows=rows))
    A = poisson((64, 64), format="csr")
    w_cpu = Jacobi(A, omega="auto").omega
    w_gpu = Jacobi(A, omega="auto", backend=be).omega
    assert abs(w_gpu - w_cpu) <= 64 * np.finfo(float).eps * w_cpu


@pytest.mark.parametrize("as_array", [False, True])
def test_power_iteration_with_device_style_norm(as_array):
    """A norm returning a 0-d array (the device's: no read per step) gives the estimate of
    a float norm, and a zero operator is refused either way (0 or NaN, not an omega)."""
    from adaptmg.multilevel.smoothers import power_lambda_max
    norm = (lambda u: np.asarray(np.linalg.norm(u))) if as_array else (lambda u: float(np.linalg.norm(u)))
    A = poisson((20, 20), format="csr")
    lam = power_lambda_max(lambda u: A @ u, start_vector(400), norm)
    ref = power_lambda_max(lambda u: A @ u, start_vector(400), lambda u: float(np.linalg.norm(u)))
    assert lam == ref
    with np.errstate(invalid="ignore"), pytest.raises(ValueError, match="could not estimate"):
        power_lambda_max(lambda u: 0.0 * u, start_vector(400), norm)


def test_power_iterations_together_equal_each_alone():
    """power_lambda_max_many: the steps of several operators interleaved, their norms asked
    together, give each operator's power_lambda_max (the same operations: equal floats, and
    not all equal to each other); a zero operator among them is refused."""
    from adaptmg.multilevel.smoothers import power_lambda_max, power_lambda_max_many
    ops = [poisson((20, 20), format="csr"), poisson((9, 13), format="csr"), 3.0 * poisson((30,), format="csr")]
    norm = lambda u: float(np.linalg.norm(u))                                   # noqa: E731
    calls = []

    def norms(us):
        calls.append(len(us))
        return [norm(u) for u in us]
    alone = [power_lambda_max(lambda u, A=A: A @ u, start_vector(A.shape[0], 3), norm, 12) for A in ops]
    together = power_lambda_max_many([lambda u, A=A: A @ u for A in ops],
                                     [start_vector(A.shape[0], 3) for A in ops], norms, 12)
    assert together == alone and len(set(alone)) == 3
    assert calls == [3] * 13                       # the start vectors', then one per step
    with np.errstate(invalid="ignore"), pytest.raises(ValueError, match="could not estimate"):
        power_lambda_max_many([lambda u: ops[0] @ u, lambda u: 0.0 * u], [start_vector(400), start_vector(400)],
                              norms)
