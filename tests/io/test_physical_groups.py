"""Issue 42: boundary conditions by the names users gave them (Gmsh physical groups, cell sets).

The files are made on the fly with meshio as a Gmsh user's would look: quads (2-D) or hexes
(3-D) in two physical regions "left" (1) / "right" (2), boundary lines (2-D) or quads (3-D)
in the groups "inlet" (7, x = 0), "wall" (9, y = 0) and "outlet" (11, x = 1); the rest of
the boundary carries no group.  The meshes are distorted (curved interior lines) so that
nothing relies on a Cartesian grid.
"""
import subprocess
import sys
import warnings

import numpy as np
import pytest

import adaptmg
from adaptmg import assemble, io
from adaptmg.estimate import residual_indicators

meshio = pytest.importorskip("meshio")

INLET, WALL, OUTLET, LEFT, RIGHT = 7, 9, 11, 1, 2
BNAMES = {"inlet": INLET, "wall": WALL, "outlet": OUTLET}
RNAMES = {"left": LEFT, "right": RIGHT}


def _distort(x):
    """Smooth interior distortion that keeps the faces x_i = 0, 1 in place."""
    s = np.prod(np.sin(np.pi * x), axis=1, keepdims=True)
    return x + 0.06 * s * np.cos(np.pi * x[:, ::-1])


def _user_mesh(dim, n=4):
    """meshio.Mesh with physical groups, blocks one per (dim, group) (as Gmsh writes them) and
    gmsh:dim_tags (each node on the entity of lowest dimension that holds it)."""
    axes = np.linspace(0.0, 1.0, n + 1)
    grid = np.stack(np.meshgrid(*([axes] * dim), indexing="ij"), -1).reshape(-1, dim)
    pts = _distort(grid)
    idx = np.arange((n + 1) ** dim).reshape((n + 1,) * dim)
    if dim == 2:
        q = np.stack([idx[:-1, :-1], idx[1:, :-1], idx[1:, 1:], idx[:-1, 1:]], -1).reshape(-1, 4)
        face = {"inlet": np.stack([idx[0, :-1], idx[0, 1:]], -1),
                "wall": np.stack([idx[:-1, 0], idx[1:, 0]], -1),
                "outlet": np.stack([idx[-1, :-1], idx[-1, 1:]], -1)}
        ctype, ftype = "quad", "line"
    else:
        q = np.stack([idx[:-1, :-1, :-1], idx[1:, :-1, :-1], idx[1:, 1:, :-1], idx[:-1, 1:, :-1],
                      idx[:-1, :-1, 1:], idx[1:, :-1, 1:], idx[1:, 1:, 1:], idx[:-1, 1:, 1:]], -1).reshape(-1, 8)

        def quads(s):
            a = idx[s]
            return np.stack([a[:-1, :-1], a[1:, :-1], a[1:, 1:], a[:-1, 1:]], -1).reshape(-1, 4)
        face = {"inlet": quads((0, slice(None), slice(None))), "wall": quads((slice(None), 0, slice(None))),
                "outlet": quads((-1, slice(None), slice(None)))}
        ctype, ftype = "hexahedron", "quad"
    face = {k: v.reshape(-1, 2 ** (dim - 1)) for k, v in face.items()}
    left = grid[q].mean(axis=1)[:, 0] < 0.5
    blocks = [(ctype, q[left]), (ctype, q[~left])] + [(ftype, face[k]) for k in BNAMES]
    phys = [LEFT, RIGHT] + list(BNAMES.values())
    geo = [1, 2, 1, 2, 3]
    cd = {"gmsh:physical": [np.full(len(b[1]), t) for b, t in zip(blocks, phys)],
          "gmsh:geometrical": [np.full(len(b[1]), t) for b, t in zip(blocks, geo)]}
    fd = {k: np.array([v, dim - 1]) for k, v in BNAMES.items()}
    fd.update({k: np.array([v, dim]) for k, v in RNAMES.items()})
    dt = np.column_stack([np.full(len(pts), dim), np.where(grid[:, 0] < 0.5, 1, 2)])
    for g, k in enumerate(BNAMES):
        dt[np.unique(face[k]), :] = [dim - 1, g + 1]
    return meshio.Mesh(pts, blocks, cell_data=cd, field_data=fd, point_data={"gmsh:dim_tags": dt})


def _write_user_file(tmp_path, dim, fmt, binary):
    m = _user_mesh(dim)
    p = tmp_path / f"user{dim}d_{fmt}_{'bin' if binary else 'ascii'}.msh"
    if fmt == "gmsh22":
        m.point_data = {}
    meshio.write(str(p), m, file_format=fmt, binary=binary)
    return p


def _face_centres(mesh):
    """(cells, faces, ids, centres) of the boundary faces."""
    from adaptmg.mesh import reference as ref
    c, f, bid = mesh.boundary_faces()
    X = mesh.points[mesh.cells[c[:, None], ref.face_vertices(mesh.dim)[f]]].mean(axis=1)
    return c, f, bid, X


def _expected_ids(X):
    """The boundary id a face with centre X must carry (default 0 where no group covers it)."""
    tol = 1e-12
    return np.where(X[:, 0] < tol, INLET, np.where(X[:, 0] > 1 - tol, OUTLET,
                                                    np.where(X[:, 1] < tol, WALL, 0)))


FILES = [(d, f, b) for d in (2, 3) for f in ("gmsh22", "gmsh") for b in (False, True)]


@pytest.mark.parametrize("dim,fmt,binary", FILES)
def test_gmsh_groups_become_ids_names_and_regions(tmp_path, dim, fmt, binary):
    with warnings.catch_warnings():
        warnings.simplefilter("error")                      # every boundary element matches a face
        mesh = io.read(_write_user_file(tmp_path, dim, fmt, binary))
    assert mesh.dim == dim and mesh.num_cells == 4 ** dim
    assert mesh.boundary_names == BNAMES and mesh.region_names == RNAMES
    _, _, bid, X = _face_centres(mesh)
    assert np.array_equal(bid, _expected_ids(X))
    assert (bid == INLET).sum() == 4 ** (dim - 1)
    centre_x = mesh.points[mesh.cells].mean(axis=1)[:, 0]
    assert np.array_equal(mesh.regions, np.where(centre_x < 0.5, LEFT, RIGHT))
    # and they survive refinement: children inherit regions and the ids of their faces
    fine = mesh.refine(mesh.region_cells("left"))
    _, _, bid, X = _face_centres(fine)
    assert np.array_equal(bid, _expected_ids(X))
    assert fine.boundary_names == BNAMES
    cx = fine.points[fine.cells].mean(axis=1)[:, 0]
    assert np.array_equal(fine.regions, np.where(cx < 0.5, LEFT, RIGHT))
    assert fine.region_cells("left").size == 2 ** dim * mesh.region_cells(LEFT).size


def _solve(space, dirichlet, neumann=None, backend="cpu"):
    """Nodal solution of -Laplace u = 0 with ``dirichlet`` ({boundary: value}) and the Neumann
    loads ``neumann`` ({(boundaries...): g(x, n)})."""
    ml = adaptmg.multigrid(space, assemble.stiffness, dirichlet=dirichlet, backend=backend)
    b = np.zeros(space.num_dofs)
    for ids, g in (neumann or {}).items():
        b += assemble.boundary_load(space, g, ids=list(ids))
    f = adaptmg.get_backend(backend).asarray(ml.constrain(b))
    with warnings.catch_warnings():
        warnings.simplefilter("error")                  # a solve that misses rtol fails the test
        x = ml.solve(f, rtol=1e-12, accel="cg")
    return np.asarray(adaptmg.backend.to_host(ml.expand(x)))


@pytest.mark.parametrize("dim,fmt,binary", FILES)
def test_poisson_dirichlet_by_name_neumann_elsewhere_is_exact(tmp_path, dim, fmt, binary):
    """Done-when of issue 42: -Laplace u = 0 with u = g on "inlet" (by name) and the flux
    du/dn = grad u . n on "wall", "outlet" and the unnamed rest (id 0): Q1 reproduces the
    linear u exactly, on a distorted mesh with hanging nodes."""
    mesh = io.read(_write_user_file(tmp_path, dim, fmt, binary), isolate=False)
    mesh = mesh.refine(mesh.region_cells("right"))           # hanging nodes at x = 1/2
    space = adaptmg.Space(mesh, degree=1)
    a = np.array([1.0, 2.0, -3.0])[:dim]

    def u(x):
        return x @ a + 0.5

    uh = _solve(space, {"inlet": u}, {("wall", "outlet", 0): lambda x, n: n @ a})
    err = np.abs(uh - u(space.points)).max()
    assert err < 1e-11, err
    # a zero flux elsewhere: u = x from u = 0 on "inlet" and u = 1 on "outlet" (a name and an id)
    uh = _solve(space, {"inlet": 0.0, OUTLET: 1.0})
    assert np.abs(uh - space.points[:, 0]).max() < 1e-11


def test_quadratic_with_given_flux_converges_at_rate_two(tmp_path):
    """-Laplace u = f for u = x^2 y with Dirichlet data on "inlet" and "wall" (by name) and the
    flux grad u . n on "outlet" and the unnamed rest: the nodal error of Q1 on the distorted
    mesh falls as h^2 (measured 2.01, 2.00)."""
    mesh = io.read(_write_user_file(tmp_path, 2, "gmsh", True), isolate=False)
    u = lambda x: x[..., 0] ** 2 * x[..., 1]                                      # noqa: E731
    grad = lambda x: np.stack([2 * x[..., 0] * x[..., 1], x[..., 0] ** 2], -1)    # noqa: E731
    errs = []
    for _ in range(3):
        space = adaptmg.Space(mesh, degree=1)
        ml = adaptmg.multigrid(space, assemble.stiffness, dirichlet={"inlet": u, "wall": u}, backend="cpu")
        b = assemble.load(space, lambda x: -2 * x[..., 1]) + assemble.boundary_load(
            space, lambda x, n: (grad(x) * n).sum(-1), ids=["outlet", 0])
        uh = ml.expand(ml.solve(ml.constrain(b), rtol=1e-12, accel="cg"))
        errs.append(np.abs(uh - u(space.points)).max())
        mesh = mesh.refine()
    rate = np.log2(np.array(errs[:-1]) / np.array(errs[1:]))
    assert (rate > 1.8).all() and errs[0] < 0.01, (errs, rate)


@pytest.mark.parametrize("ext,fmt", [("msh", None), ("msh", "gmsh22"), ("vtu", None), ("xdmf", None)])
def test_ids_regions_and_names_survive_write_read(tmp_path, ext, fmt):
    mesh = io.read(_write_user_file(tmp_path, 3, "gmsh", False), isolate=False)
    mesh = mesh.refine(mesh.region_cells("left")).refine([0])          # hanging nodes, two levels
    assert mesh.num_hanging_nodes > 0
    back = io.read(io.write(tmp_path / f"rt.{ext}", mesh, file_format=fmt), isolate=ext == "msh")
    assert back.boundary_names == BNAMES and back.region_names == RNAMES

    def canon(m):
        cen = m.points[m.cells].mean(axis=1)
        o = np.lexsort(cen.T)
        return cen[o], m.boundary_ids[o], m.regions[o]
    for a, b in zip(canon(mesh), canon(back)):
        assert np.allclose(a, b, rtol=0, atol=1e-12)
    if ext != "msh":                                   # same cells in the same order
        assert np.array_equal(back.cells, mesh.cells)


def test_names_survive_map_hierarchy_and_with_names():
    mesh = adaptmg.Mesh.box([0, 0], [1, 1], [2, 2]).with_names({"left": 0, "right": 1})
    fine = mesh.refine().refine([0]).map(lambda x: x * 2)
    for m in fine.hierarchy():
        assert m.boundary_names == {"left": 0, "right": 1}
        assert np.array_equal(np.sort(m.boundary_nodes("left")), np.sort(m.boundary_nodes(0)))
    s = adaptmg.Space(fine, degree=2)
    assert np.array_equal(adaptmg.dirichlet_dofs(s, ["left", "right"]), s.boundary_dofs(ids=[0, 1]))
    assert np.array_equal(adaptmg.dirichlet_dofs(s, "left"), s.boundary_dofs(ids=0))
    with pytest.raises(ValueError, match="the mesh's boundary names are: 'left' \\(0\\), 'right' \\(1\\)"):
        adaptmg.dirichlet_dofs(s, {"inlet": 1.0})
    with pytest.raises(ValueError, match="both a boundary and a region"):
        io.groups.field_data(mesh.with_names(region_names={"left": 0}))


def test_unknown_names_and_bad_values_are_refused(tmp_path):
    mesh = io.read(_write_user_file(tmp_path, 2, "gmsh22", False), isolate=False)
    space = adaptmg.Space(mesh)
    known = "'inlet' \\(7\\), 'outlet' \\(11\\), 'wall' \\(9\\)"
    for call in (lambda: adaptmg.multigrid(space, assemble.stiffness, dirichlet={"inlte": 0.0}),
                 lambda: adaptmg.multigrid(space, assemble.stiffness, dirichlet=["inlet", "wal"]),
                 lambda: space.boundary_dofs(ids="Inlet"),
                 lambda: assemble.boundary_load(space, 1.0, ids="top"),
                 lambda: residual_indicators(space, np.zeros(space.num_dofs), neumann=0.0, neumann_ids=["out"])):
        with pytest.raises(ValueError, match=known):
            call()
    with pytest.raises(ValueError, match="region names are: 'left' \\(1\\), 'right' \\(2\\)"):
        mesh.region_cells("steel")
    with pytest.raises(TypeError, match="integers or names"):
        space.boundary_dofs(ids=[1.5])
    with pytest.raises(ValueError, match="dirichlet value of 'inlet'"):
        adaptmg.multigrid(space, assemble.stiffness, dirichlet={"inlet": np.ones(3)})
    with pytest.raises(ValueError, match="g must return shape"):
        assemble.boundary_load(space, lambda x: np.ones(3), ids="inlet")
    with pytest.raises(ValueError, match="cell_data cannot be written to Gmsh 2.2"):
        io.write(tmp_path / "x.msh", mesh, cell_data={"e": np.ones(mesh.num_cells)}, file_format="gmsh22")


def test_neumann_ids_by_name_in_the_estimator(tmp_path):
    mesh = io.read(_write_user_file(tmp_path, 2, "gmsh", False), isolate=False)
    space = adaptmg.Space(mesh)
    u = space.points[:, 0] ** 2
    a = residual_indicators(space, u, neumann=lambda x, n: 2 * x[..., 0] * n[..., 0], neumann_ids=["wall", "outlet"])
    b = residual_indicators(space, u, neumann=lambda x, n: 2 * x[..., 0] * n[..., 0], neumann_ids=[WALL, OUTLET])
    assert np.array_equal(a, b)


def test_dwr_dual_problem_is_homogeneous_on_named_boundaries(tmp_path):
    """dwr_indicators with a {name: value} spec: the dual problem takes only its boundaries."""
    from adaptmg.estimate import dwr_indicators
    mesh = io.read(_write_user_file(tmp_path, 2, "gmsh", False), isolate=False)
    space = adaptmg.Space(mesh)
    u = space.points[:, 0] * (1 - space.points[:, 0])
    kw = dict(f=2.0, backend="cpu", rtol=1e-10, return_dual=True)
    a = dwr_indicators(space, u, 1.0, dirichlet={"inlet": 0.0, "outlet": 5.0}, **kw)
    b = dwr_indicators(space, u, 1.0, dirichlet=[INLET, OUTLET], **kw)
    z = b[2]["z"]
    assert np.abs(a[2]["z"] - z).max() <= 1e-8 * np.abs(z).max()
    assert np.allclose(a[0], b[0], rtol=1e-8, atol=1e-14)


def test_boundary_load_measures_the_boundary(tmp_path):
    """int_Gamma 1 ds: the perimeter 4 (2-D) / surface 6 (3-D) of the unit box, and the flux
    of grad(x + 2y) through "inlet" + "outlet" (-1 + 1 = 0 on the curved-interior mesh)."""
    for dim, total in ((2, 4.0), (3, 6.0)):
        mesh = io.read(_write_user_file(tmp_path, dim, "gmsh", True), isolate=False).refine([0, 3])
        for deg in (1, 2):
            space = adaptmg.Space(mesh, degree=deg)
            assert abs(assemble.boundary_load(space, 1.0).sum() - total) < 1e-13
            assert abs(assemble.boundary_load(space, 1.0, ids="inlet").sum() - 1.0) < 1e-13
    s2 = adaptmg.Space(mesh, components=2)
    b = assemble.boundary_load(s2, np.array([1.0, -2.0]), ids="wall").reshape(-1, 2).sum(0)
    assert np.allclose(b, [1.0, -2.0], rtol=0, atol=1e-13)


def test_cell_sets_name_boundaries_and_regions(tmp_path):
    """Abaqus element sets (meshio cell sets) of boundary lines and of quads."""
    m = _user_mesh(2)
    blocks = [(b.type, b.data) for b in m.cells]
    nb = [len(d) for _, d in blocks]
    sets = {"steel": [np.arange(nb[0]), np.zeros(0, int)] + [np.zeros(0, int)] * 3}
    for k, name in enumerate(BNAMES):
        sets[name] = [np.zeros(0, int)] * 2 + [np.arange(nb[2 + j]) if j == k else np.zeros(0, int)
                                                for j in range(3)]
    p = tmp_path / "sets.inp"
    meshio.write(str(p), meshio.Mesh(m.points, blocks, cell_sets=sets))
    mesh = io.read(p)
    assert mesh.region_names == {"steel": 1}
    assert set(mesh.boundary_names) == set(BNAMES)
    _, _, bid, X = _face_centres(mesh)
    exp = _expected_ids(X)
    for name, i in BNAMES.items():
        assert np.array_equal(bid == mesh.boundary_names[name], exp == i)
    cx = mesh.points[mesh.cells].mean(axis=1)[:, 0]
    assert np.array_equal(mesh.regions, np.where(cx < 0.5, 1, 0))


def test_from_meshio_and_unmatched_elements_warn():
    m = _user_mesh(2)
    mesh = adaptmg.Mesh.from_meshio(m)
    assert mesh.boundary_names == BNAMES and np.isin([INLET, WALL, OUTLET], mesh.boundary_ids).all()
    # a physical point (vertex element) is skipped, as io.read skips it
    pt = meshio.Mesh(m.points, [(b.type, b.data) for b in m.cells] + [("vertex", np.array([[0]]))],
                     cell_data={k: v + [np.array([3])] for k, v in m.cell_data.items()}, field_data=m.field_data)
    assert np.array_equal(adaptmg.Mesh.from_meshio(pt).boundary_ids, mesh.boundary_ids)
    bad = meshio.Mesh(m.points, [(b.type, b.data) for b in m.cells] + [("line", np.array([[0, 6]]))],
                      cell_data={k: v + [np.array([5])] for k, v in m.cell_data.items()}, field_data=m.field_data)
    with pytest.warns(UserWarning, match="1 tagged boundary element"):
        adaptmg.Mesh.from_meshio(bad)


def test_data_channel_has_named_groups():
    import os
    mesh = io.read(os.path.join(os.path.dirname(__file__), "..", "..", "data", "channel_quad.msh"))
    assert mesh.boundary_names == {"inlet": 1, "outlet": 2, "wall": 3, "obstacle": 4}
    assert mesh.region_names == {"upstream": 1, "downstream": 2}
    _, _, bid, X = _face_centres(mesh)
    assert np.array_equal(bid == 1, X[:, 0] == 0) and np.array_equal(bid == 2, X[:, 0] == 4)
    assert (bid == 4).sum() == 8 and (bid == 3).sum() == 32


def test_import_adaptmg_is_enough_for_io():
    code = "import adaptmg, sys; adaptmg.io.read; assert 'adaptmg.io' in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


@pytest.mark.gpu
def test_named_dirichlet_on_the_gpu_matches_the_cpu(tmp_path):
    mesh = io.read(_write_user_file(tmp_path, 3, "gmsh", True)).refine()
    space = adaptmg.Space(mesh)
    spec = {"inlet": lambda x: x[:, 1], "outlet": 1.0}
    u_cpu = _solve(space, spec, backend="cpu")
    u_gpu = _solve(space, spec, backend="gpu")
    assert np.abs(u_gpu - u_cpu).max() < 1e-9
