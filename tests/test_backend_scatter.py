"""The scatter, repeat and unique helpers of adaptmg.backend agree with NumPy's ufunc.at /
repeat / unique on both array modules."""
import numpy as np
import pytest

from adaptmg import backend as B

XP = ["cpu", pytest.param("gpu", marks=pytest.mark.gpu)]


def _xp(name):
    return B.get_backend(name).xp


@pytest.mark.parametrize("where", XP)
@pytest.mark.parametrize("name,ufunc,start", [("max", np.maximum, -10**9), ("min", np.minimum, 10**9),
                                               ("add", np.add, 0)])
def test_scatter_matches_ufunc_at(where, name, ufunc, start):
    xp = _xp(where)
    rng = np.random.default_rng(3)
    idx, vals = rng.integers(0, 50, 2000), rng.integers(-1000, 1000, 2000)
    want = np.full(60, start, dtype=np.int64)
    ufunc.at(want, idx, vals)
    got = getattr(B, f"scatter_{name}")(xp.full(60, start, dtype=np.int64), xp.asarray(idx), xp.asarray(vals))
    assert np.array_equal(B.to_host(got), want)


@pytest.mark.parametrize("where", XP)
def test_repeat_and_unique_first_match_numpy(where):
    xp = _xp(where)
    a, c = np.arange(7) * 3, np.array([0, 2, 1, 0, 4, 1, 3])
    assert np.array_equal(B.to_host(B.repeat(xp.asarray(a), xp.asarray(c))), np.repeat(a, c))
    # many repeats of few values: a sort that does not keep equal keys in order would give
    # another index than the first occurrence
    v = np.random.default_rng(4).integers(0, 300, 200000)
    got = B.unique_first(xp.asarray(v))
    for g, w in zip(got, np.unique(v, return_index=True, return_inverse=True)):
        assert np.array_equal(B.to_host(g), w.ravel())
