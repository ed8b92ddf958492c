"""The forest, refinement and global coarsening on the device give the host's integers.

The device path is the generic variant of the mesh's array code (:mod:`adaptmg.mesh._xp`):
on the host it runs under ``_xp.generic()`` with NumPy, and must equal the NumPy-tuned
variant exactly (forest tables, active cells, levels, parents, boundary ids, regions, the
hierarchy, ``parent_of``, ``touch_max``); a stand-in CuPy (``fake_gpu``) runs the device
branches with no device -> host copy; with ``-m gpu`` the same meshes are built from CuPy
arrays and compared with the host ones.
"""
import sys
import types

import numpy as np
import pytest

from adaptmg import Mesh
from adaptmg.backend import to_host
from adaptmg.mesh import _touch, _xp
from adaptmg.mesh._tree import ARRAYS, merge_registry, unique_pairs


def _centres(m):
    """Cell centres from the forest (no node numbering), on the host."""
    X, acn = to_host(m._forest.X), to_host(m._active_cell_nodes())
    return X[acn].mean(axis=1)


def _ball(p, r, as_index=False):
    def mark(m):
        c = _centres(m)
        hit = ((c - np.asarray(p)) ** 2).sum(1) < r * r
        return np.flatnonzero(hit) if as_index else hit
    return mark


def _triangle(be):
    """Three quads around the centroid of a triangle (an interior vertex of valence 3)."""
    A, B, C = np.array([0.0, 0.0]), np.array([2.0, 0.0]), np.array([0.7, 1.8])
    pts = np.array([A, B, C, (A + B) / 2, (B + C) / 2, (C + A) / 2, (A + B + C) / 3])
    cells = np.array([[0, 3, 5, 6], [3, 1, 6, 4], [6, 4, 5, 2]])
    return Mesh.from_cells(pts, cells, regions=np.array([1, 2, 1])).to(be)


def _shuffled_box(be):
    """A 3-D box with its node ids shuffled (edge/face keys not in lexicographic order)."""
    b = Mesh.box([0, 0, 0], [1, 1, 2], [2, 2, 3])
    perm = np.random.default_rng(7).permutation(b.num_nodes)
    inv = np.argsort(perm)
    return Mesh.from_cells(b.points[perm], inv[b.cells], b.boundary_ids,
                           regions=np.arange(b.num_cells) % 3).to(be)


#: (coarse mesh on a backend, marks per refinement: None = all)
CASES = {
    "2d": (lambda be: Mesh.box([0, 0], [1, 1], [3, 2], backend=be),
           [None, _ball((0.3, 0.4), 0.3), _ball((0.1, 0.1), 0.15, True), _ball((0.1, 0.1), 0.06)]),
    "3d": (lambda be: Mesh.box([0, 0, 0], [1, 1, 1], [2, 2, 2], backend=be),
           [None, _ball((0.2, 0.3, 0.4), 0.3), _ball((0.1, 0.1, 0.1), 0.12, True)]),
    "3d-uniform": (lambda be: Mesh.box([0, 0, 0], [1, 2, 1], [1, 2, 2], backend=be), [None, None]),
    "triangle": (_triangle, [_ball((0.5, 0.4), 0.3), _ball((0.2, 0.1), 0.25, True),
                             _ball((0.05, 0.02), 0.1)]),
    "shuffled-3d": (_shuffled_box, [_ball((0.9, 0.1, 1.9), 0.5), None, _ball((1, 0, 2), 0.3, True)]),
}


def _build(case, be, xp=np):
    make, marks = CASES[case]
    m = make(be)
    for mk in marks:
        m = m.refine(None if mk is None else xp.asarray(mk(m)))
    return m


def _raw_outputs(m):
    """Everything this part of the mesh produces: forest tables, the active cells' arrays,
    the hierarchy's levels, parent_of between them and touch_max."""
    F = m._forest
    out = {f"forest.{f}": getattr(F, f) for f in ARRAYS if getattr(F, f) is not None}
    out.update(cell_ids=m.cell_ids, levels=m.levels, parents=m.parents,
               boundary_ids=m.boundary_ids, regions=m.regions)
    rng = np.random.default_rng(3)
    vals = rng.integers(0, 5, m.num_cells)
    vals[rng.random(m.num_cells) < 0.9] = 0                      # the sparse path
    out["touch_max.levels"] = m.touch_max(m.levels)
    out["touch_max.sparse"] = m.touch_max(m.backend.xp.asarray(vals))
    out["touch_max.host_values"] = m.touch_max(rng.integers(-4, 9, m.num_cells))
    hier = m.hierarchy()
    for i, h in enumerate(hier):
        out[f"hier{i}.cell_ids"], out[f"hier{i}.levels"] = h.cell_ids, h.levels
        if i:
            out[f"hier{i}.parent"], out[f"hier{i}.child"] = h.parent_of(hier[i - 1])
    out["coarsen_once"] = m.coarsen_once().cell_ids
    return out


def _outputs(m):
    """:func:`_raw_outputs` on the host."""
    return {k: to_host(v) for k, v in _raw_outputs(m).items()}


def _assert_same(got, want):
    assert got.keys() == want.keys()
    for k in want:
        assert got[k].dtype == want[k].dtype, (k, got[k].dtype, want[k].dtype)
        assert got[k].shape == want[k].shape and np.array_equal(got[k], want[k]), k


def _assert_points_close(got, want, ulps=4):
    assert got.shape == want.shape
    tol = ulps * np.finfo(float).eps * np.maximum(np.abs(want), 1.0)
    assert (np.abs(got - want) <= tol).all(), np.abs(got - want).max()


@pytest.mark.parametrize("case", sorted(CASES))
def test_generic_variant_equals_the_tuned_host_one(case):
    want = _outputs(_build(case, "cpu"))
    with _xp.generic():
        assert not _xp.tuned(np.zeros(1))
        got = _outputs(_build(case, "cpu"))
    assert want["hier0.levels"].max() == 0 and want["levels"].max() >= 2
    _assert_same(got, want)                      # coordinates too: the same additions, exactly


def test_generic_split_of_a_large_refinement_equals_the_threaded_one():
    """A split above SPLIT_THREAD_CELLS (the host's worker thread) and the generic inline one,
    with registry lookups (a second refinement of a local one)."""
    m = Mesh.box([0, 0], [1, 1], [200, 200])
    mk = _centres(m)[:, 0] < 0.6
    want = m.refine(mk).refine()
    with _xp.generic():
        got = m.refine(mk).refine()
    assert want.num_cells > 4 * (1 << 15)
    _assert_same({f: to_host(getattr(got._forest, f)) for f in ARRAYS[:-1]},
                 {f: getattr(want._forest, f) for f in ARRAYS[:-1]})


def test_touch_max_with_hanging_links_generic():
    """touch_max through the hanging-node links (its int32 scatters in the generic variant),
    dense and sparse, equals the tuned int64 one."""
    m = _build("2d", "cpu")
    links, rng = m._hanging[3], np.random.default_rng(5)
    for vals in (rng.integers(-3, 9, m.num_cells), np.where(rng.random(m.num_cells) < 0.05, 4, -2)):
        want = _touch.touch_max(m.cells, m.num_nodes, links, vals)
        with _xp.generic():
            got = _touch.touch_max(m.cells, m.num_nodes, links, vals)
        assert got.dtype == want.dtype == np.int64 and np.array_equal(got, want)
        assert (want > vals).any()


def test_unique_pairs_and_registry_merge():
    rng = np.random.default_rng(0)
    a, b = rng.integers(0, 50, 300), rng.integers(0, 50, 300)
    lo, hi = np.minimum(a, b), np.maximum(a, b)
    keys, first, inv = unique_pairs(lo, hi)
    ref_k, ref_f, ref_i = np.unique((lo << 32) | hi, return_index=True, return_inverse=True)
    assert np.array_equal(keys, ref_k) and np.array_equal(first, ref_f) and np.array_equal(inv, ref_i)
    old = np.sort(rng.choice(np.setdiff1d(np.arange(10 ** 4), keys), 40, replace=False))
    k, v = merge_registry(old, np.arange(40), keys, 100 + np.arange(keys.size))
    assert np.array_equal(k, np.sort(np.concatenate([old, keys])))
    assert np.array_equal(v, np.concatenate([np.arange(40), 100 + np.arange(keys.size)])[
        np.argsort(np.concatenate([old, keys]))])


def test_box_of_the_generic_variant_and_errors():
    m = Mesh.box([0, -1, 2], [1, 1, 3], [3, 2, 1])
    with _xp.generic():
        g = Mesh.box([0, -1, 2], [1, 1, 3], [3, 2, 1])
    _assert_same({f: getattr(g._forest, f) for f in ARRAYS[:-1]},
                 {f: getattr(m._forest, f) for f in ARRAYS[:-1]})
    assert np.array_equal(m.points[m.cells[0]], [[0, -1, 2], [1 / 3, -1, 2], [0, 0, 2], [1 / 3, 0, 2],
                                                 [0, -1, 3], [1 / 3, -1, 3], [0, 0, 3], [1 / 3, 0, 3]])
    with pytest.raises(ValueError, match="indices must lie"):
        m.refine(np.array([0, 6]))
    with pytest.raises(ValueError, match="boolean mask must have shape"):
        m.refine(np.ones(5, dtype=bool))
    with pytest.raises(ValueError, match="non-positive Jacobian"):
        m.map(lambda x: x * np.array([-1.0, 1.0, 1.0]))


# ------------------------------------------------------------------ a stand-in device

@pytest.fixture
def fake_device(fake_gpu, monkeypatch):
    """The ``fake_gpu`` stand-in CuPy whose every function returns stand-in device arrays
    (NumPy's own drop the subclass), plus a ``cupyx`` whose scatters are NumPy's ufunc.at."""
    import adaptmg.backend as backend
    dev = fake_gpu.ndarray

    def wrap(a):
        if isinstance(a, tuple):
            return tuple(wrap(b) for b in a)
        return a.view(dev) if isinstance(a, np.ndarray) and not isinstance(a, dev) else a

    class XP(type(fake_gpu.xp)):
        def __getattr__(self, name):
            f = getattr(np, name)
            if not callable(f) or isinstance(f, type):
                return f
            return lambda *a, **k: wrap(f(*a, **k))

    xp = XP("cupy")
    monkeypatch.setattr(backend, "_cupy_status", lambda: (xp, fake_gpu.csp, ""))

    def at(ufunc):
        return lambda a, idx, v: ufunc.at(a.view(np.ndarray), np.asarray(idx), np.asarray(v))
    cupyx = types.ModuleType("cupyx")
    cupyx.scatter_max, cupyx.scatter_min, cupyx.scatter_add = at(np.maximum), at(np.minimum), at(np.add)
    monkeypatch.setitem(sys.modules, "cupyx", cupyx)
    fake_gpu.strict_xp = xp
    return fake_gpu


@pytest.mark.parametrize("case", ["2d", "triangle", "shuffled-3d"])
def test_stand_in_device_keeps_the_mesh_there_and_copies_nothing_back(case, fake_device):
    want = _outputs(_build(case, "cpu"))
    m = _build(case, "gpu", fake_device.strict_xp)
    assert m.backend.is_gpu
    gets = fake_device.device_to_host()
    raw = _raw_outputs(m)
    assert fake_device.device_to_host() == gets                  # no device -> host copy
    wrong = [k for k, v in raw.items() if type(v) is not fake_device.ndarray]
    assert not wrong, wrong                                      # every array on the "device"
    assert all(h.backend.is_gpu for h in m.hierarchy())
    _assert_same({k: to_host(v) for k, v in raw.items()}, want)


# ------------------------------------------------------------------ the device (-m gpu)

@pytest.mark.gpu
@pytest.mark.parametrize("case", sorted(CASES))
def test_device_mesh_equals_the_host_mesh(case):
    import cupy
    want = _outputs(_build(case, "cpu"))
    m = _build(case, "gpu", cupy)
    assert m.backend.is_gpu
    assert all(isinstance(getattr(m._forest, f), cupy.ndarray) for f in ARRAYS
               if getattr(m._forest, f) is not None)
    assert isinstance(m.hierarchy()[0].cell_ids, cupy.ndarray)
    got = _outputs(m)
    _assert_points_close(got.pop("forest.X"), want.pop("forest.X"))
    _assert_same(got, want)


@pytest.mark.gpu
def test_device_box_with_a_map_and_host_marks():
    f = lambda x: x * x + x                                                        # noqa: E731
    h = Mesh.box([0, 0, 0], [1, 1, 1], [3, 2, 2], map=f).refine()
    d = Mesh.box([0, 0, 0], [1, 1, 1], [3, 2, 2], map=f, backend="gpu").refine()
    import cupy
    mk = _centres(h)[:, 0] < 0.4                                                    # a host mask
    h, d = h.refine(mk), d.refine(mk)
    mk = _centres(h)[:, 1] > 0.7
    h, d = h.refine(cupy.asarray(mk)), d.refine(np.flatnonzero(mk))     # and the other way round
    assert d.backend.is_gpu and h.backend.name == "cpu"
    _assert_points_close(to_host(d._forest.X), h._forest.X)
    assert np.array_equal(to_host(d.cell_ids), h.cell_ids)
    assert np.array_equal(to_host(d._forest.cell_nodes), h._forest.cell_nodes)


# ------------------------------------------------------------------ scripts/bench_mesh_device.py

def _script(name):
    import importlib.util
    import pathlib
    path = pathlib.Path(__file__).resolve().parents[2] / "scripts" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"{name}_under_test", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_bench_family_is_bench_distributed_make_mesh():
    """The bench's backend-built adaptive family (closed-form node counts, centres from the
    forest) is the mesh of bench_distributed.make_mesh, cell for cell."""
    bench = _script("bench_mesh_device")
    want = _script("bench_distributed").make_mesh(3, 1, 3e4)
    got = bench.make_mesh("cpu", 3, 1, 3e4)
    assert want.num_hanging_nodes > 0
    assert np.array_equal(got.cell_ids, want.cell_ids) and np.array_equal(got.cells, want.cells)


def test_bench_mesh_device_on_a_stand_in_device(fake_device, capsys):
    rows = _script("bench_mesh_device").main(["--backend", "gpu", "--refine", "2", "--targets", "3e3",
                                              "--repeat", "1"])
    out = capsys.readouterr().out
    assert [r["case"] for r in rows] == ["uniform", "adaptive"] and all(r["same"] for r in rows)
    assert "mesh gpu s" in out and out.count(" yes") == 2
    assert rows[0]["cells"] == 8 * 64 and rows[0]["levels"] == 3
