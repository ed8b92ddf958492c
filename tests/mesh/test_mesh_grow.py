"""The forest's tables grow in place (adaptmg.mesh._grow) without changing any forest that
shares their rows: refining one mesh twice (a branch) gives the same meshes as building each
from scratch, and the meshes refined first keep their arrays."""
import dataclasses

import numpy as np
import pytest

from adaptmg import Mesh
from adaptmg.mesh._grow import grown


def _arrays(mesh):
    F = mesh._forest
    out = {f.name: np.array(getattr(F, f.name)) for f in dataclasses.fields(F)
           if isinstance(getattr(F, f.name), np.ndarray)}
    out.update(cells=mesh.cells.copy(), points=mesh.points.copy(), bid=mesh.boundary_ids.copy())
    return out


def _same(x, y):
    assert x.keys() == y.keys()
    for k in x:
        assert x[k].dtype == y[k].dtype and np.array_equal(x[k], y[k]), k


def test_grown_shares_the_longest_prefix_and_copies_a_branch():
    a = np.arange(12, dtype=np.int32).reshape(6, 2)
    b = grown(a, 8)                       # a owns its memory: copied, with spare rows
    assert not np.shares_memory(a, b) and np.array_equal(b[:6], a)
    b[6:] = -1
    c = grown(b, 9)                       # b is the longest prefix: extended in place
    assert np.shares_memory(b, c) and np.array_equal(c[:8], b)
    c[8:] = 7
    d = grown(b, 9)                       # b again: its tail is c's now, so a copy
    assert not np.shares_memory(c, d) and np.array_equal(d[:8], b)
    d[8:] = 5
    assert (c[8] == 7).all() and (d[8] == 5).all() and np.array_equal(b[6:], -np.ones((2, 2)))
    with pytest.raises(ValueError, match="rows"):
        grown(b, 3)


@pytest.mark.parametrize("dim", [2, 3])
def test_branching_refinements_equal_fresh_builds(dim, monkeypatch):
    def base():
        m = Mesh.box([0] * dim, [1] * dim, [3] * dim).refine()
        return m.refine(m.cell_vertices().mean(1)[:, 0] < 0.3)

    def mark(m, k):
        return m.cell_vertices().mean(1)[:, k % dim] > 0.9          # few cells: room in the buffers

    m0 = base()
    snap_0 = _arrays(m0)
    a = m0.refine(mark(m0, 0))             # extends m0's tables in place
    assert np.shares_memory(a._forest.cell_nodes, m0._forest.cell_nodes)
    assert np.shares_memory(a._forest.X, m0._forest.X)
    snap_a = _arrays(a)
    c = a.refine(mark(a, 1))
    b = m0.refine(mark(m0, 1))             # a branch of m0: its tail is a's, so b copies
    assert not np.shares_memory(b._forest.cell_nodes, a._forest.cell_nodes)
    e = c.refine()                          # uniform, after c
    _same(_arrays(a), snap_a)              # nothing m0 or a hold was written
    _same(_arrays(m0), snap_0)
    # the references: every table copied at every refinement
    from adaptmg.mesh import _tree

    def copy(x, n):
        out = np.empty((n,) + x.shape[1:], dtype=x.dtype)
        out[:x.shape[0]] = x
        return out
    monkeypatch.setattr(_tree, "grown", copy)
    f0 = base()
    _same(_arrays(b), _arrays(f0.refine(mark(f0, 1))))
    fa = f0.refine(mark(f0, 0))
    fc = fa.refine(mark(fa, 1))
    _same(_arrays(c), _arrays(fc))
    _same(_arrays(e), _arrays(fc.refine()))
    assert e.num_hanging_nodes > 0


@pytest.mark.parametrize("dim", [2, 3])
def test_split_on_a_worker_thread_equals_the_serial_split(dim, monkeypatch):
    """Forest.split with its cell and node arrays built on a worker thread (large splits, more
    than one host thread) gives the serial split's forest, array for array (uniform and local
    refinements, regions, boundary ids, hanging nodes), and uses the worker."""
    import threading

    from adaptmg.mesh import _tree

    def build():
        m = Mesh.box([0] * dim, [1] * dim, [3] * dim).refine()
        F = m._forest
        m = Mesh(dataclasses.replace(F, cell_region=np.arange(F.num_cells, dtype=np.int32) % 3), m.cell_ids)
        m = m.refine(m.cell_vertices().mean(1)[:, 0] < 0.4)
        return m.refine().refine(m.refine().cell_vertices().mean(1).sum(1) < 0.5)

    monkeypatch.setenv("ADAPTMG_THREADS", "2")
    monkeypatch.setattr(_tree, "SPLIT_THREAD_CELLS", 1 << 40)
    serial = build()
    names = []
    for fn in ("_child_cells", "_new_nodes"):
        orig = getattr(_tree.Forest, fn)
        monkeypatch.setattr(_tree.Forest, fn, lambda *a, _f=orig: names.append(threading.current_thread().name)
                            or _f(*a))
    monkeypatch.setattr(_tree, "SPLIT_THREAD_CELLS", 1)
    threaded = build()
    assert names and all(n.startswith("adaptmg-split") for n in names)
    assert serial._forest.cell_region is not None and serial.num_hanging_nodes > 0
    _same(_arrays(threaded), _arrays(serial))
    monkeypatch.setenv("ADAPTMG_THREADS", "1")       # one host thread: no worker
    names.clear()
    _same(_arrays(build()), _arrays(serial))
    assert set(names) == {threading.current_thread().name}
