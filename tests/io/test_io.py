"""adaptmg.io: exact write/read round trips (2D/3D, hanging nodes), data/ meshes, hostile files."""
import os
import time

import numpy as np
import pytest

import adaptmg
from adaptmg import io

DATA = os.path.join(os.path.dirname(__file__), "..", "..", "data")


def _adaptive_mesh(dim):
    mesh = adaptmg.Mesh.box([0] * dim, [1] * dim, [3] * dim)
    for _ in range(2):
        c = mesh.points[mesh.cells].mean(axis=1)
        mesh = mesh.refine(np.linalg.norm(c, axis=1) < 0.5)
    assert mesh.num_hanging_nodes > 0 and mesh.levels.max() == 2
    return mesh


@pytest.mark.parametrize("ext", ["vtu", "xdmf"])
@pytest.mark.parametrize("dim", [2, 3])
def test_round_trip_exact_with_hanging_nodes(tmp_path, dim, ext):
    mesh = _adaptive_mesh(dim)
    rng = np.random.default_rng(dim)
    space = adaptmg.Space(mesh, degree=1, components=dim)
    u = rng.standard_normal(space.num_dofs)                 # vector field, DoF = node*c + comp
    p = rng.standard_normal(mesh.num_nodes) * 1e-300        # tiny values survive too
    eta = rng.random(mesh.num_cells)
    path = io.write(tmp_path / f"m.{ext}", mesh, {"u": u, "p": p}, {"eta": eta})
    back, pd, cd = io.read(path, with_data=True)
    # geometry: same points, same cells in the same (lexicographic) order, bit for bit
    assert np.array_equal(back.points, mesh.points)
    assert np.array_equal(back.cells, mesh.cells)
    assert back.dim == dim and back.num_cells == mesh.num_cells
    # user data exactly, vectors as (num_nodes, dim)
    assert pd["u"].shape == (mesh.num_nodes, dim)
    assert np.array_equal(pd["u"], u.reshape(-1, dim))
    assert np.array_equal(pd["p"], p)
    assert np.array_equal(cd["eta"], eta)
    # mesh data: hanging flags, levels, boundary ids
    flags = np.zeros(mesh.num_nodes, int)
    flags[mesh.hanging_nodes] = 1
    assert np.array_equal(pd["hanging"], flags) and flags.sum() == mesh.num_hanging_nodes
    assert np.array_equal(cd["level"], mesh.levels)
    assert np.array_equal(cd["boundary_ids"], mesh.boundary_ids)
    # what a read-back mesh is: a new coarse mesh without refinement tree, whose
    # boundary ids are restored (non-conforming interior faces stay interior)
    assert (back.levels == 0).all() and back.num_hanging_nodes == 0
    assert np.array_equal(back.boundary_ids, mesh.boundary_ids)


def test_write_accepts_space_vectors_and_q2(tmp_path):
    mesh = _adaptive_mesh(2)
    s2 = adaptmg.Space(mesh, degree=2)
    f = lambda x: 1.0 + x[..., 0] ** 2 - 3 * x[..., 1]
    u2 = s2.interpolate(f)
    io.write(tmp_path / "q2.vtu", mesh, {"u": u2}, space=s2)
    _, pd, _ = io.read(tmp_path / "q2.vtu", with_data=True)
    assert np.allclose(pd["u"], f(mesh.points), rtol=0, atol=1e-13)   # vertex values of Q2


def test_time_series_xdmf(tmp_path):
    mesh = _adaptive_mesh(2)
    times = [0.0, 0.1, 0.25]
    fields = [np.sin(np.arange(mesh.num_nodes) * (k + 1.0)) for k in range(3)]
    with io.TimeSeriesWriter(tmp_path / "ts.xdmf", mesh) as ts:
        for t, u in zip(times, fields):
            ts.write(t, {"u": u}, {"eta": u[mesh.cells].mean(axis=1)})
        with pytest.raises(ValueError, match="t must increase"):
            ts.write(0.2, {"u": fields[0]})
    back, steps = io.read_time_series(tmp_path / "ts.xdmf")
    assert np.array_equal(back.points, mesh.points) and np.array_equal(back.cells, mesh.cells)
    assert [s[0] for s in steps] == times
    for (t, pd, cd), u in zip(steps, fields):
        assert np.array_equal(pd["u"], u)
        assert np.array_equal(cd["eta"], u[mesh.cells].mean(axis=1))
        assert np.array_equal(cd["level"], mesh.levels)


@pytest.mark.parametrize("name,dim,cells", [("channel_quad.msh", 2, 60), ("lshape_quad.msh", 2, 192), ("annulus_quad.xdmf", 2, 48),
                                            ("rod_hex.inp", 3, 256), ("bracket_hex.vtu", 3, 56)])
def test_data_meshes(name, dim, cells):
    mesh = io.read(os.path.join(DATA, name))
    assert mesh.dim == dim and mesh.num_cells == cells
    assert (mesh.volumes() > 0).all()
    fine = mesh.refine([0])                               # usable as a coarse mesh
    assert fine.num_hanging_nodes > 0


def test_gmsh_and_abaqus_geometry_round_trip(tmp_path):
    mesh = _adaptive_mesh(3)
    for ext in ("msh", "inp"):
        back = io.read(io.write(tmp_path / f"m.{ext}", mesh))
        # Gmsh 4.1 lists the nodes grouped by entity (boundary groups, regions): same cells
        # and points, the nodes renumbered
        assert np.allclose(back.points[back.cells], mesh.points[mesh.cells], rtol=0, atol=1e-12)
        if ext == "inp":
            assert np.array_equal(back.cells, mesh.cells)


def _hostile(tmp_path):
    good = tmp_path / "good.vtu"
    io.write(good, adaptmg.Mesh.box([0, 0], [1, 1], [2, 2]))
    text = good.read_text()
    cases = {
        "garbage.vtu": (b"\x00\xff" * 500, "could not be read"),
        "empty.vtu": (b"", "empty"),
        "bomb.vtu": (b'<?xml version="1.0"?><!DOCTYPE lolz [<!ENTITY lol "lol"><!ENTITY l2 "&lol;&lol;">]>'
                     b"<VTKFile>&l2;</VTKFile>", "DOCTYPE"),
        "huge.vtu": (text.replace('NumberOfCells="4"', 'NumberOfCells="999999999999"').encode(), "NumberOfCells"),
        "trunc.msh": (b"$MeshFormat\n4.1 0 8\n$EndMeshFormat\n$Nodes\n1 999999999999 1 9\n", "could not be read"),
        "tri.msh": (b"$MeshFormat\n2.2 0 8\n$EndMeshFormat\n$Nodes\n3\n1 0 0 0\n2 1 0 0\n3 0 1 0\n$EndNodes\n"
                    b"$Elements\n1\n1 2 2 0 1 1 2 3\n$EndElements\n", "no quad or hexahedron"),
        "badidx.msh": (b"$MeshFormat\n2.2 0 8\n$EndMeshFormat\n$Nodes\n4\n1 0 0 0\n2 1 0 0\n3 1 1 0\n4 0 1 0\n"
                       b"$EndNodes\n$Elements\n1\n1 3 2 0 1 1 2 3 7\n$EndElements\n", "could not be read|outside"),
        "inverted.msh": (b"$MeshFormat\n2.2 0 8\n$EndMeshFormat\n$Nodes\n4\n1 0 0 0\n2 1 0 0\n3 1 1 0\n4 0 1 0\n"
                         b"$EndNodes\n$Elements\n1\n1 3 2 0 1 1 4 3 2\n$EndElements\n", "Jacobian"),
        "escape.xdmf": (b'<?xml version="1.0"?><Xdmf Version="3.0"><Domain><Grid><Topology TopologyType="Quadrilateral">'
                        b'<DataItem Format="Binary" Dimensions="1 4">../../../../etc/passwd</DataItem></Topology>'
                        b"</Grid></Domain></Xdmf>", "outside the folder"),
        "model.pkl": (b"cos\nsystem\n(S'echo pwned'\ntR.", "cannot tell the mesh format"),
        "nan.xdmf": (good.read_bytes(), None),
    }
    return good, cases


def test_hostile_and_malformed_files_raise_value_error_quickly(tmp_path):
    good, cases = _hostile(tmp_path)
    m = io.read(good)
    x = tmp_path / "nan.xdmf"
    io.write(x, m)
    cases["nan.xdmf"] = (x.read_text().replace("0.5", "nan", 1).encode(), "NaN or Inf")
    for name, (content, pattern) in cases.items():
        p = tmp_path / name
        p.write_bytes(content)
        t0 = time.perf_counter()
        with pytest.raises(ValueError, match=pattern) as info:
            io.read(p)
        assert str(p) in str(info.value), name             # the message names the file
        assert time.perf_counter() - t0 < 10, name
    assert not (tmp_path / "pwned").exists()
    with pytest.raises(ValueError, match="max_bytes"):
        io.read(good, max_bytes=10)
    with pytest.raises(ValueError, match="trusted=True"):
        io.read(tmp_path / "trunc.msh", file_format="ansys")
    with pytest.raises(FileNotFoundError):
        io.read(tmp_path / "missing.vtu")


def test_write_validates_fields(tmp_path):
    mesh = adaptmg.Mesh.box([0, 0], [1, 1], [2, 2])
    with pytest.raises(ValueError, match=r"point_data\['u'\].*9 nodes.*\(4,\)"):
        io.write(tmp_path / "a.vtu", mesh, {"u": np.zeros(4)})
    with pytest.raises(ValueError, match=r"cell_data\['eta'\].*4 cells"):
        io.write(tmp_path / "a.vtu", mesh, cell_data={"eta": np.zeros(5)})
    with pytest.raises(ValueError, match="reserved"):
        io.write(tmp_path / "a.vtu", mesh, {"hanging": np.zeros(9)})
    with pytest.raises(TypeError, match="mesh must be an adaptmg Mesh"):
        io.write(tmp_path / "a.vtu", "mesh")


@pytest.mark.gpu
def test_write_cupy_arrays(tmp_path):
    be = adaptmg.get_backend("gpu")
    mesh = _adaptive_mesh(3)
    u = np.random.default_rng(0).standard_normal(mesh.num_nodes)
    io.write(tmp_path / "g.vtu", mesh, {"u": be.asarray(u)}, {"eta": be.asarray(np.ones(mesh.num_cells))})
    _, pd, cd = io.read(tmp_path / "g.vtu", with_data=True)
    assert np.array_equal(pd["u"], u) and np.array_equal(cd["eta"], np.ones(mesh.num_cells))
