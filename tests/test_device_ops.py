"""Fewer launches and synchronising reads per level of the device set-up (issue 36).

The formulations that replaced launch chains give the same integers as before
(``backend.segment_index`` against ``np.repeat``), small host constants reach a device once
(``backend.constant``), and the census of ``scripts/census_device_ops.py`` -- the stand-in
L-shape loop with recording device arrays -- bounds the operations a step's set-up and
estimator issue: the counts measured after the cuts (before them, the same loop's one-level
steps made 44 synchronising operations and 25 reads in the set-up, the two-level ones 124
and 77, and every estimate copied 10 host tables to the device; now 29 and 15, 85 and 49,
and 2).  The ``gpu`` tests run the
same formulations on CuPy for the lead's H200.
"""
import importlib.util
import pathlib
import sys
import types

import numpy as np
import pytest

from adaptmg import backend as B

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _counts(rng, n):
    c = rng.integers(0, 4, n)
    c[rng.random(n) < 0.3] = 0                 # runs of empty segments, also at both ends
    return c


@pytest.fixture
def strict(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "tests" / "mesh"))
    import strict_cupy
    strict_cupy.install(monkeypatch)
    return strict_cupy


def test_segment_index_is_the_repeat_of_arange(strict):
    rng = np.random.default_rng(7)
    cases = [np.zeros(0, np.int64), np.zeros(5, np.int64), np.array([3]), np.array([0, 0, 2, 0])]
    cases += [_counts(rng, n) for n in (1, 2, 17, 300)]
    for c in cases:
        want = np.repeat(np.arange(c.size), c)
        got = B.segment_index(np, c, int(c.sum()))
        assert got.dtype == np.int64 and np.array_equal(got, want)
        before = strict.host_values()
        dev = B.segment_index(strict.xp, strict.xp.asarray(c), int(c.sum()))
        assert strict.host_values() == before                 # no read of the device
        assert isinstance(dev, strict.ndarray) and np.array_equal(dev.get(), want)
        vals = rng.integers(-9, 9, c.size)
        assert np.array_equal(B.repeat(strict.xp.asarray(vals), strict.xp.asarray(c)).get(), np.repeat(vals, c))


def test_constant_reaches_a_device_once(strict, monkeypatch):
    a = np.arange(12.0).reshape(3, 4)
    assert B.constant(a, np) is a                             # the host: np.asarray
    copies = []
    real = strict.xp.asarray
    monkeypatch.setattr(strict.xp, "asarray", lambda x, dtype=None: copies.append(1) or real(x, dtype))
    d1 = B.constant(a, strict.xp)
    d2 = B.constant(a.copy(), strict.xp)                      # equal content: the same device array
    d3 = B.constant(a, strict.xp, dtype=np.float32)           # another dtype: another one
    d4 = B.constant(a.T, strict.xp)                           # another layout of the values: another one
    assert d1 is d2 and d3 is not d1 and d4 is not d1 and len(copies) == 3
    assert isinstance(d1, strict.ndarray) and np.array_equal(d1.get(), a)
    assert d3.dtype == np.float32 and np.array_equal(d4.get(), a.T)
    big = np.zeros(B.CONSTANT_MAX_ENTRIES + 1)
    assert B.constant(big, strict.xp) is not B.constant(big, strict.xp)      # large: not kept


def _census():
    spec = importlib.util.spec_from_file_location("census_device_ops", ROOT / "scripts" / "census_device_ops.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_census_of_the_lshape_loop_bounds_syncs_and_copies(monkeypatch):
    """The stand-in L-shape loop to ~3700 DoFs (10 one-level steps, 2 two-level ones): per
    step, the set-up's synchronising operations (nonzero / flatnonzero / unique / sorts / mask
    reads), its reads (int / bool / float / get of device arrays) and host -> device copies,
    and the estimator's and error norms' copies within the counts measured after the cuts.
    (The constrained matrix and the hanging-node matrix written row by row read their entry
    counts, where the COO paths took them from flatnonzero's syncs: two reads more, seven
    syncs fewer per level; the device pattern reads its tables' ranges and entry count once,
    where its sorts synchronised twice: a read more, two syncs fewer per assembly.)"""
    c = _census()
    c.install(monkeypatch)
    monkeypatch.setattr(c, "RECORDS", type(c.RECORDS)())
    steps = c.run_loop(2500, 200)
    assert [lev for _, lev, _ in steps] == [1] * 10 + [2] * 2
    assert [d for d, _, _ in steps][-1] == 3651

    def count(counter, phase, cat):
        return sum(n for (p, _, k, _), n in counter.items() if p == phase and k == cat)
    for k, (dofs, lev, cnt) in enumerate(steps):
        syncs = count(cnt, "setup", "sync")
        assert syncs <= (20 if lev == 1 else 67), (dofs, syncs)
        assert count(cnt, "setup", "h2d") <= (3 if lev == 1 else 8) or k <= 1, dofs
        if k >= 2:                                            # the tables are on the device by now
            assert count(cnt, "estimate", "h2d") <= 2 and count(cnt, "error", "h2d") == 0, dofs
        reads = count(cnt, "setup", "read")
        assert reads <= (18 if lev == 1 else 55), dofs
        assert syncs + reads <= (38 if lev == 1 else 122), dofs          # 44 / 134 before


# ----------------------------------------------------------------------------- on the GPU
@pytest.mark.gpu
def test_gpu_formulations_equal_the_host():
    """segment_index / repeat, the vertex order of the numbering and ``constant`` on CuPy:
    the host's integers; a constant is copied once per device."""
    import cupy as cp

    from adaptmg import Mesh
    from adaptmg.mesh._numbering import first_occurrences, first_occurrences_xp
    rng = np.random.default_rng(3)
    for n in (0, 1, 40, 5000):
        c = _counts(rng, n)
        assert np.array_equal(cp.asnumpy(B.segment_index(cp, cp.asarray(c), int(c.sum()))),
                              np.repeat(np.arange(n), c))
    m = Mesh.box([0, 0], [1, 1], [4, 4]).refine()
    x = m.points[m.cells].mean(axis=1)
    m = m.refine(np.linalg.norm(x, axis=1) < 0.4)
    x = m.points[m.cells].mean(axis=1)                  # the refined mesh's cell centres
    m = m.refine(np.linalg.norm(x, axis=1) < 0.2)
    F, acn = m._forest, m._active_cell_nodes()
    want = first_occurrences(acn.ravel(), F.num_nodes, F.n_root)
    got = first_occurrences_xp(cp.asarray(acn.ravel()), F.num_nodes, F.n_root, cp)
    assert np.array_equal(cp.asnumpy(got), want)
    a = np.linspace(0.0, 1.0, 30)
    assert B.constant(a, cp) is B.constant(a.copy(), cp)
    assert isinstance(B.constant(a, cp), cp.ndarray)
    g = m.to("gpu")
    assert np.array_equal(cp.asnumpy(g.hanging_nodes), m.hanging_nodes)
    assert np.array_equal(cp.asnumpy(g.cells), m.cells)
