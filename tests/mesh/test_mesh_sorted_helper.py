"""Mesh._sorted: np.sort that skips already sorted input (refinement and coarsening)."""
import numpy as np

from adaptmg.mesh.mesh import _sorted


def test_sorted_equals_np_sort():
    rng = np.random.default_rng(1)
    for a in (np.zeros(0, np.int64), np.array([3]), np.arange(10) * 2, np.array([1, 1, 2, 2]),
              rng.integers(0, 50, 100), np.arange(10)[::-1].copy()):
        out = _sorted(a)
        assert np.array_equal(out, np.sort(a)) and out.dtype == a.dtype
