"""parent_of remembers the last level pair per mesh: equal answers, fresh arrays, and the
definition (a fine cell lies inside its coarse cell, at the child position it names)."""
import gc

import numpy as np
import pytest

from adaptmg import Mesh
from adaptmg.mesh import _parents


def test_parent_of_memo_returns_fresh_equal_arrays_and_follows_the_coarse_mesh():
    m = Mesh.box([0, 0], [1, 1], [3, 2]).refine()
    m = m.refine(np.arange(0, m.num_cells, 3))
    coarse, mid = m.hierarchy()[0], m.coarsen_once()
    a = m.parent_of(mid)
    assert _parents._MEMO[m][0]() is mid
    b = m.parent_of(mid)                                 # from the memo
    assert all(x.dtype == np.int64 and np.array_equal(x, y) for x, y in zip(a, b))
    b[0][:] = -7                                         # callers own their arrays
    assert np.array_equal(m.parent_of(mid)[0], a[0])
    # the definition: centroids inside the coarse cell; child c at the corner bits of c
    cidx, child = a
    cen = m.points[m.cells].mean(1)
    lo, hi = mid.points[mid.cells].min(1)[cidx], mid.points[mid.cells].max(1)[cidx]
    assert np.all((cen > lo) & (cen < hi))
    kids = child >= 0
    side = (cen[kids] > (lo[kids] + hi[kids]) / 2).astype(int)
    assert np.array_equal(side[:, 0] + 2 * side[:, 1], child[kids])
    assert np.all(m.levels[~kids] == mid.levels[cidx[~kids]])
    # another coarse mesh, two levels below some cells: computed afresh, and it raises
    with pytest.raises(ValueError, match="refined more than once"):
        m.parent_of(coarse)
    assert np.array_equal(m.parent_of(mid)[1], child)
    del mid
    gc.collect()
    assert m not in _parents._MEMO or _parents._MEMO[m][0]() is None
