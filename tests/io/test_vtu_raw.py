"""The raw appended VTU writer (``adaptmg.io.write(..., compression=None)``, issue 36 item 4):
meshio's reader and ``adaptmg.io.read`` get from it exactly the arrays of meshio's zlib file
(same bytes, so compared exactly), in 2-D and 3-D, with hanging nodes, vector fields, Q2
vertex values and names; a mesh on the device (the strict CuPy stand-in of
``tests/mesh/strict_cupy.py``) gives the host mesh's file bytes from host copies of its
arrays, without a host mesh or Space; the adaptive loop's writer does so too."""
import pathlib
import sys

import meshio
import numpy as np
import pytest

from adaptmg import Mesh, Space, io

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "mesh"))
from device_meshes import MESHES  # noqa: E402


def _named(m):
    return m.with_names({"left": 0, "top wall": 3}, {"steel": 0})


def _fields(m, xp=np):
    x = xp.asarray(m.points)
    pd = {"u": xp.sin(3 * x[:, 0]) * x[:, 1], "grad": 2.0 * x, "flag": xp.arange(m.num_nodes) % 3}
    cd = {"eta": xp.arange(m.num_cells) / 7.0, "vec": xp.ones((m.num_cells, 3), dtype=np.float32)}
    return pd, cd


def _same_meshio(a, b):
    assert a.points.dtype == b.points.dtype and np.array_equal(a.points, b.points)
    assert [c.type for c in a.cells] == [c.type for c in b.cells]
    for x, y in zip(a.cells, b.cells):
        assert x.data.dtype == y.data.dtype and np.array_equal(x.data, y.data)
    for da, db in ((a.point_data, b.point_data), (a.cell_data, b.cell_data), (a.field_data, b.field_data)):
        assert list(da) == list(db)
        for k in da:
            va = da[k][0] if isinstance(da[k], list) else da[k]
            vb = db[k][0] if isinstance(db[k], list) else db[k]
            assert va.dtype == vb.dtype and va.shape == vb.shape and np.array_equal(va, vb), k


@pytest.mark.parametrize("name", ["2d-3levels", "3d-random", "from_cells"])
def test_raw_file_reads_back_as_the_zlib_file(name, tmp_path):
    m = _named(MESHES[name]())
    assert m.num_hanging_nodes > 0
    pd, cd = _fields(m)
    z = io.write(tmp_path / "z.vtu", m, pd, cd)
    r = io.write(tmp_path / "r.vtu", m, pd, cd, compression=None)
    assert b'encoding="raw"' in r.read_bytes()[:4000] and b"vtkZLibDataCompressor" in z.read_bytes()[:400]
    a, b = meshio.read(z), meshio.read(r)
    _same_meshio(a, b)
    assert set(b.point_data) == {"u", "grad", "flag", "hanging"}
    assert b.point_data["grad"].shape == (m.num_nodes, m.dim)
    assert np.array_equal(np.nonzero(b.point_data["hanging"])[0], m.hanging_nodes)
    assert np.array_equal(b.cell_data["level"][0], m.levels)
    assert set(b.field_data) == {"left", "top wall", "steel"}
    mz, pz, cz = io.read(z, with_data=True)
    mr, pr, cr = io.read(r, with_data=True)
    for attr in ("points", "cells", "boundary_ids", "regions"):
        assert np.array_equal(getattr(mr, attr), getattr(mz, attr)), attr
    assert np.array_equal(mr.points, m.points) and np.array_equal(mr.cells, m.cells)
    assert (mr.boundary_names, mr.region_names) == (m.boundary_names, m.region_names)
    for k in (*pz, *cz):
        va, vb = (pz[k], pr[k]) if k in pz else (cz[k], cr[k])
        assert va.dtype == vb.dtype and np.array_equal(va, vb), k


def test_raw_q2_vertex_values_vector_space_and_no_mesh_data(tmp_path):
    m = MESHES["2d-3levels"]()
    s2 = Space(m, degree=2)
    v = np.cos(np.arange(s2.num_dofs) / 11.0)
    sv = Space(m, components=2)
    w = np.arange(sv.num_dofs, dtype=np.float64)
    for kw in ({"space": s2, "point_data": {"v": v}}, {"space": sv, "point_data": {"w": w}},
               {"point_data": {"x": m.points[:, 0]}, "mesh_data": False}):
        z = io.write(tmp_path / "z.vtu", m, **kw)
        r = io.write(tmp_path / "r.vtu", m, **kw, compression=None)
        _same_meshio(meshio.read(z), meshio.read(r))
    b = meshio.read(r)
    assert set(b.point_data) == {"x"} and not b.cell_data and not b.field_data
    b = meshio.read(io.write(tmp_path / "w.vtu", m, {"w": w}, space=sv, compression=None))
    assert np.array_equal(b.point_data["w"], w.reshape(-1, 2))


def test_bad_compression_and_dtypes_are_refused(tmp_path):
    m = Mesh.box([0, 0], [1, 1], [2, 2])
    for bad in ("lzma", "raw", 0, True):
        with pytest.raises(ValueError, match="compression must be 'zlib' or None"):
            io.write(tmp_path / "a.vtu", m, compression=bad)
    for suffix in (".xdmf", ".msh", ".vtk"):
        with pytest.raises(ValueError, match="VTU files only"):
            io.write(tmp_path / f"a{suffix}", m, compression=None)
    with pytest.raises(ValueError, match="'b'.*dtype bool"):
        io.write(tmp_path / "a.vtu", m, {"b": np.ones(m.num_nodes, bool)}, compression=None)
    assert not (tmp_path / "a.vtu").exists() or (tmp_path / "a.vtu").stat().st_size == 0


@pytest.fixture
def strict(monkeypatch):
    import strict_cupy
    return strict_cupy, strict_cupy.install(monkeypatch)


def _no_host_mesh(monkeypatch):
    """Fail if anything moves a device mesh to the host (a host numbering)."""
    def refuse(self, backend):
        raise AssertionError(f"the writer called Mesh.to({backend!r})")
    monkeypatch.setattr(Mesh, "to", refuse)


@pytest.mark.parametrize("name", ["2d-3levels", "3d-local", "from_cells"])
def test_device_mesh_gives_the_host_mesh_file_bytes(name, strict, tmp_path, monkeypatch):
    sc, xp = strict
    host = _named(MESHES[name]())
    dev = host.to("gpu")
    sd = Space(dev)
    assert dev.backend.is_gpu and isinstance(sd.cell_dofs, sc.ndarray)
    pd, cd = _fields(host)
    pdd, cdd = ({k: xp.asarray(v) for k, v in d.items()} for d in (pd, cd))
    _no_host_mesh(monkeypatch)
    for suffix, comp in ((".vtu", None), (".vtu", "zlib"), (".xdmf", "zlib")):
        h = io.write(tmp_path / f"h{suffix}", host, pd, cd, space=Space(host), compression=comp)
        before = sc.host_values()
        d = io.write(tmp_path / f"d{suffix}", dev, pdd, cdd, space=sd, compression=comp)
        values, calls = np.subtract(sc.host_values(), before)
        assert d.read_bytes() == h.read_bytes(), suffix
        # each mesh array (points, cells, levels, boundary ids, regions, hanging nodes) and each
        # field (u, grad, flag; eta, vec) copied once, nothing else
        n, nc, dim = host.num_nodes, host.num_cells, host.dim
        assert values == n * (2 * dim + 2) + nc * (2 ** dim + 2 * dim + 6) + host.num_hanging_nodes
        assert calls == 11, calls
    h = io.write(tmp_path / "h.msh", host, {"u": pd["u"]}, {"eta": cd["eta"]})     # Gmsh 4.1
    d = io.write(tmp_path / "d.msh", dev, {"u": pdd["u"]}, {"eta": cdd["eta"]})
    assert d.read_bytes() == h.read_bytes()


def test_adaptive_writer_copies_in_the_loop_thread_only(strict, tmp_path, monkeypatch):
    """_Writer.submit on a device space: the copies are made before it returns (the background
    thread runs no device code), and the file equals the one of the host space."""
    from adaptmg.estimate import adaptive as ad
    sc, xp = strict
    host = MESHES["3d-random"]()
    sh, sd = Space(host), Space(host.to("gpu"))
    u = np.linspace(0, 1, host.num_nodes)
    eta = np.arange(host.num_cells) * 0.5
    _no_host_mesh(monkeypatch)
    import threading
    main = threading.get_ident()
    seen = []
    orig = sc.ndarray.get

    def get(self, *a, **k):
        seen.append(threading.get_ident())
        return orig(self, *a, **k)
    monkeypatch.setattr(sc.ndarray, "get", get)
    w = ad._Writer(str(tmp_path), 1)
    w.submit(str(tmp_path / "d.vtu"), sd, {"u": xp.asarray(u)}, {"eta": xp.asarray(eta), "level": eta})
    w.submit(str(tmp_path / "h.vtu"), sh, {"u": u}, {"eta": eta})
    w.close()
    assert seen and set(seen) == {main}
    assert (tmp_path / "d.vtu").read_bytes() == (tmp_path / "h.vtu").read_bytes()
    r = meshio.read(tmp_path / "d.vtu")
    assert np.array_equal(r.point_data["u"], u) and np.array_equal(r.cell_data["level"][0], host.levels)


def test_time_series_of_a_device_mesh_equals_the_host_one(strict, tmp_path, monkeypatch):
    sc, xp = strict
    host = MESHES["2d-3levels"]()
    dev = host.to("gpu")
    _no_host_mesh(monkeypatch)
    out = []
    for name, m, conv in (("h", host, np.asarray), ("d", dev, xp.asarray)):
        with io.TimeSeriesWriter(tmp_path / f"{name}.xdmf", m) as ts:
            for t in (0.0, 1.0):
                ts.write(t, {"u": conv(host.points[:, 0] + t)})
        out.append((tmp_path / f"{name}.xdmf").read_bytes())
    assert out[0] == out[1]


@pytest.mark.gpu
def test_gpu_device_mesh_file_equals_the_host_one(tmp_path):
    """On the device: the raw file of a device mesh, and the adaptive loop's writer on a device
    space, give the host mesh's bytes."""
    from adaptmg.estimate import adaptive as ad
    host = _named(MESHES["3d-random"]())
    dev = host.to("gpu")
    xp = dev.backend.xp
    pd, cd = _fields(host)
    h = io.write(tmp_path / "h.vtu", host, pd, cd, compression=None).read_bytes()
    d = io.write(tmp_path / "d.vtu", dev, {k: xp.asarray(v) for k, v in pd.items()},
                 {k: xp.asarray(v) for k, v in cd.items()}, compression=None).read_bytes()
    assert d == h
    w = ad._Writer(str(tmp_path), 1)
    w.submit(str(tmp_path / "wd.vtu"), Space(dev), {"u": xp.asarray(pd["u"])}, {"eta": xp.asarray(cd["eta"])})
    w.submit(str(tmp_path / "wh.vtu"), Space(host), {"u": pd["u"]}, {"eta": cd["eta"]})
    w.close()
    assert (tmp_path / "wd.vtu").read_bytes() == (tmp_path / "wh.vtu").read_bytes()
