"""The device path of the node numbering, the hanging nodes and the boundary data (issue 36),
run on the host: under a strict stand-in for CuPy (``strict_cupy.py``: refuses NumPy-only
calls, host/device mixing and scatters with repeated indices) a mesh moved with
``to("gpu")`` gives the host mesh's integers exactly, device arrays throughout, and copies
O(levels) values to the host, not O(cells); the generic first occurrences (a scatter_min)
equal the host's tuned ones."""
import numpy as np
import pytest

import strict_cupy
from adaptmg import Mesh
from device_meshes import MESHES
from adaptmg.backend import backend_of
from adaptmg.mesh import _touch
from adaptmg.mesh._numbering import first_occurrences, first_occurrences_xp
from test_mesh import random_mesh

EPS = np.finfo(float).eps


@pytest.fixture
def gpu(monkeypatch):
    return strict_cupy.install(monkeypatch)


def _h(a):
    """A host copy of a stand-in device array (asserting it is one)."""
    assert isinstance(a, strict_cupy.ndarray), type(a)
    return a.get()


def _same(dev, host):
    d = _h(dev)
    assert d.shape == host.shape and np.array_equal(d, host), (d, host)


@pytest.mark.parametrize("name", sorted(MESHES))
def test_first_occurrences_generic_equal_the_host_ones(name):
    m = MESHES[name]()
    for h in m.hierarchy():
        flat = h._active_cell_nodes().ravel()
        F = h._forest
        nk = F.node_kind
        n_root = F.num_nodes if nk[-1] == 0 else int(np.argmax(nk != 0))
        want = first_occurrences(flat, F.num_nodes, n_root)
        got = first_occurrences_xp(flat, F.num_nodes, n_root, np)
        assert got.dtype == want.dtype and np.array_equal(got, want)


@pytest.mark.parametrize("name", sorted(MESHES))
def test_device_mesh_equals_the_host_mesh(name, gpu):
    host = MESHES[name]()
    assert host.num_hanging_nodes > 0 or name == "2d-uniform"
    def where(x):
        return x[:, 0] < 0.5

    def outputs(mesh):
        out = [mesh.node_ids, mesh.cells, mesh.points, mesh.hanging_nodes, mesh.hanging_parents,
               mesh.hanging_weights, mesh.hanging_owner, *mesh._hanging[3], mesh.is_hanging,
               mesh.cell_vertices(), mesh.region_cells([0, 2]), mesh.boundary_nodes(where=where)]
        for ids in (None, 0, [1, 2]):
            out += [*mesh.boundary_faces(ids), mesh.boundary_nodes(ids)]
        return out, mesh.volumes(), (mesh.num_nodes, mesh.num_hanging_nodes)

    for m in host.hierarchy():                   # coarse levels of a large forest: the sort branch
        g = m.to("gpu")
        assert g.backend.is_gpu
        before = strict_cupy.host_values()
        dev, vol_d, counts = outputs(g)
        moved, calls = np.subtract(strict_cupy.host_values(), before)
        # O(levels) scalars, not O(cells): a few per call
        assert moved <= 40 + 4 * int(m.levels.max()) and calls <= 60, (moved, calls, m.num_cells)
        want, vol_h, counts_h = outputs(m)
        assert counts == counts_h
        for d, h in zip(dev, want):
            _same(d, h)                          # points: a gather, exact
        vol_d, vol_h = _h(vol_d), vol_h
        assert np.abs(vol_d - vol_h).max() <= 8 * EPS * vol_h.max()
        N = g.incidence
        assert backend_of(N).is_gpu and N.dtype == np.float64
        assert (abs(N.get() - m.incidence) > 0).nnz == 0
        T = g.touch_graph
        Th = T.get() if hasattr(T, "get") else T
        assert (abs(Th - m.touch_graph) > 0).nnz == 0


def test_device_where_must_be_a_bool_predicate(gpu):
    g = random_mesh(2, 1, 3).to("gpu")
    with pytest.raises(ValueError, match="boolean"):
        g.boundary_nodes(where=lambda x: x[:, 0])
    with pytest.raises(TypeError, match="callable"):
        g.boundary_nodes(where=0.5)
    host_only = g.boundary_nodes(where=lambda x: np.asarray(x)[:, 1] > 0.5)       # refuses device points
    _same(host_only, g.to("cpu").boundary_nodes(where=lambda x: x[:, 1] > 0.5))


@pytest.mark.parametrize("dense", [False, True])        # the sparse (dominant level) and dense paths
@pytest.mark.parametrize("dim", [2, 3])
def test_level_jumps_on_the_device_path(dim, dense, gpu):
    if dense:
        m = Mesh.box([0] * dim, [1] * dim, [3] * dim).refine([0, 4, 8] if dim == 2 else [0, 5, 13, 20, 26])
    else:                                                 # three levels, level 0 dominant
        m = Mesh.box([0] * dim, [1] * dim, [8 if dim == 2 else 5] * dim).refine([0, 30]).refine([0])
    cells, lv = m.cells, m.levels
    jump, rows = _touch.level_jumps(cells, m.num_nodes, lv)
    dj, dr = _touch.level_jumps(gpu.asarray(cells), m.num_nodes, gpu.asarray(lv))
    _same(dj, jump)
    assert (rows is None) == (dr is None) and (rows is None) == dense
    if rows is not None:
        _same(dr, rows)


def test_the_stand_in_refuses_what_the_device_refuses(gpu):
    a = gpu.arange(6)
    with pytest.raises(TypeError, match="numpy.take"):
        np.take(a, [0, 1])
    with pytest.raises(TypeError, match="at"):
        np.minimum.at(a, gpu.asarray([0, 0]), gpu.asarray([1, 2]))
    with pytest.raises(TypeError, match="repeated"):
        a[gpu.asarray([0, 0])] = gpu.asarray([1, 2])
    with pytest.raises(TypeError, match="host"):
        a + np.arange(6)
    with pytest.raises(AttributeError):
        a.flags.writeable = False
    a[gpu.asarray([0, 0])] = 7                                 # one value: fine on the device
    assert a.get()[0] == 7


def test_bench_mesh_setup_device_mesh_table(gpu, capsys, monkeypatch):
    """``bench_mesh_setup.py --backend gpu --device-mesh`` prints the device rows, with the
    device's integers equal to the host's (here on the stand-in)."""
    import importlib.util
    import pathlib
    path = pathlib.Path(__file__).resolve().parents[2] / "scripts" / "bench_mesh_setup.py"
    spec = importlib.util.spec_from_file_location("bench_mesh_setup_device_test", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    monkeypatch.setattr("sys.argv", ["bench_mesh_setup.py", "--backend", "gpu", "--device-mesh",
                                     "--cases", "adaptive", "--targets", "3e3"])
    bench.main()
    rows = [ln.split() for ln in capsys.readouterr().out.splitlines() if ln.strip().startswith("adaptive")]
    phases = {r[3]: r for r in rows if len(r) > 3}
    assert {"numbering", "hanging", "hierarchy", "to(gpu)"} <= set(phases)
    assert phases["numbering"][-1] == "True" and phases["hanging"][-1] == "True"
