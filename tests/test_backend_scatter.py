"""The scatter and repeat helpers of adaptmg.backend agree with NumPy's ufunc.at / repeat."""
import numpy as np
import pytest

from adaptmg import backend as B


def _cases(xp):
    rng = np.random.default_rng(3)
    idx = rng.integers(0, 50, 2000)
    vals = rng.integers(-1000, 1000, 2000)
    return xp.asarray(idx), xp.asarray(vals), idx, vals


@pytest.mark.parametrize("name,ufunc,start", [("max", np.maximum, -10**9), ("min", np.minimum, 10**9),
                                               ("add", np.add, 0)])
def test_scatter_matches_ufunc_at(name, ufunc, start):
    idx, vals, hi, hv = _cases(np)
    want = np.full(60, start, dtype=np.int64)
    ufunc.at(want, hi, hv)
    got = getattr(B, f"scatter_{name}")(np.full(60, start, dtype=np.int64), idx, vals)
    assert np.array_equal(got, want)


def test_repeat_matches_numpy():
    a, c = np.arange(7) * 3, np.array([0, 2, 1, 0, 4, 1, 3])
    assert np.array_equal(B.repeat(a, c), np.repeat(a, c))


@pytest.mark.gpu
@pytest.mark.parametrize("name,ufunc,start", [("max", np.maximum, -10**9), ("min", np.minimum, 10**9),
                                               ("add", np.add, 0)])
def test_device_scatter_and_repeat_match_the_host(name, ufunc, start):
    import cupy
    idx, vals, hi, hv = _cases(cupy)
    want = np.full(60, start, dtype=np.int64)
    ufunc.at(want, hi, hv)
    got = getattr(B, f"scatter_{name}")(cupy.full(60, start, dtype=np.int64), idx, vals)
    assert np.array_equal(got.get(), want)
    a, c = np.arange(7) * 3, np.array([0, 2, 1, 0, 4, 1, 3])
    assert np.array_equal(B.repeat(cupy.asarray(a), cupy.asarray(c)).get(), np.repeat(a, c))


def test_unique_first_is_numpys_unique():
    a = np.random.default_rng(4).integers(0, 30, 500)
    for got, want in zip(B.unique_first(a), np.unique(a, return_index=True, return_inverse=True)):
        assert np.array_equal(got, want)


@pytest.mark.gpu
def test_device_unique_first_gives_first_occurrences():
    import cupy
    a = np.random.default_rng(4).integers(0, 300, 200000)
    got = [to.get() for to in B.unique_first(cupy.asarray(a))]
    for g, w in zip(got, np.unique(a, return_index=True, return_inverse=True)):
        assert np.array_equal(g, w.ravel())
