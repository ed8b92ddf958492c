"""Mesh: refinement with 2:1 closure, hanging nodes, global coarsening, input checks."""
import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from adaptmg.fe import Space
from adaptmg.mesh import Mesh


def lattice_boxes(mesh, n0):
    """Integer boxes of the cells of a refined unit box with n0 root cells per axis."""
    lmax = mesh.levels.max()
    scale = n0 * 2 ** lmax
    X = mesh.points[mesh.cells]
    lo = np.rint(X.min(1) * scale).astype(np.int64)
    hi = np.rint(X.max(1) * scale).astype(np.int64)
    return lo, hi


def brute_touch(mesh, n0):
    lo, hi = lattice_boxes(mesh, n0)
    inter = np.all((lo[:, None, :] <= hi[None, :, :]) & (lo[None, :, :] <= hi[:, None, :]), axis=2)
    return inter


def random_mesh(dim, steps, seed, n0=2, frac=0.3):
    rng = np.random.default_rng(seed)
    m = Mesh.box([0] * dim, [1] * dim, [n0] * dim)
    for _ in range(steps):
        m = m.refine(rng.random(m.num_cells) < frac)
    return m


def test_box_basics():
    m = Mesh.box([0, 0], [2, 1], [4, 3])
    assert (m.dim, m.num_cells, m.num_nodes) == (2, 12, 20)
    assert np.isclose(m.volumes().sum(), 2.0)
    # lexicographic vertex order: v1 - v0 along x, v2 - v0 along y
    X = m.points[m.cells]
    assert np.allclose(X[:, 1, 1], X[:, 0, 1]) and (X[:, 1, 0] > X[:, 0, 0]).all()
    assert np.allclose(X[:, 2, 0], X[:, 0, 0]) and (X[:, 2, 1] > X[:, 0, 1]).all()
    m3 = Mesh.box([0, 0, 0], [1, 1, 1], [2, 3, 4])
    assert (m3.num_cells, m3.num_nodes) == (24, 60)


def test_refine_single_cell_2d_hanging_nodes():
    m = Mesh.box([0, 0], [1, 1], [2, 2]).refine(np.array([0]))
    assert m.num_cells == 7 and m.num_nodes == 14 and m.num_hanging_nodes == 2
    hp = m.points[m.hanging_nodes]
    assert sorted(map(tuple, np.round(hp, 12))) == [(0.25, 0.5), (0.5, 0.25)]
    # each hanging node is the weighted mean of its parents
    par, w = m.hanging_parents, m.hanging_weights
    recon = np.einsum("hp,hpd->hd", w, m.points[np.where(par >= 0, par, 0)])
    assert np.allclose(recon, hp)


def test_closure_enforces_vertex_balance():
    # refining a corner twice must refine the cells touching it, also across a vertex
    m = Mesh.box([0, 0], [1, 1], [2, 2]).refine([3])          # cell 3 = upper right
    inner = np.flatnonzero((m.levels == 1) & np.all(np.isclose(m.points[m.cells].min(1), 0.5), axis=1))
    m2 = m.refine(inner)                                       # child touching the centre
    assert m2.levels.min() == 1                                # all coarse cells got refined
    assert np.isclose(m2.volumes().sum(), 1.0)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(dim=st.sampled_from([2, 3]), steps=st.integers(1, 4), seed=st.integers(0, 10 ** 6),
       frac=st.floats(0.05, 0.5))
def test_random_refinement_properties(dim, steps, seed, frac):
    if dim == 3:
        steps = min(steps, 3)
    m = random_mesh(dim, steps, seed, frac=frac)
    # cell volumes sum to the domain volume
    assert np.isclose(m.volumes().sum(), 1.0, rtol=1e-12)
    # 2:1 rule: touching cells (found geometrically, independently) differ by <= 1 level
    touch = brute_touch(m, 2)
    lv = m.levels
    assert np.abs(lv[:, None] - lv[None, :])[touch].max() <= 1
    # the touch graph equals the geometric one
    assert np.array_equal(m.touch_graph.toarray().astype(bool), touch)
    # hanging nodes: H rows sum to 1, identity on regular DoFs, hanging columns zero
    for k in (1, 2):
        s = Space(m, k)
        H = s.H.tocsr()
        assert np.allclose(np.asarray(H.sum(axis=1)).ravel(), 1.0)
        reg = ~s.is_hanging
        Hr = H[reg][:, reg]
        assert (Hr != sp.identity(reg.sum(), format="csr")).nnz == 0
        assert H[:, s.is_hanging].nnz == 0
    # no hanging node has a hanging parent (2:1 rule keeps constraints one level deep)
    par = m.hanging_parents
    assert not np.isin(par[par >= 0], m.hanging_nodes).any()


@settings(max_examples=10, deadline=None)
@given(dim=st.sampled_from([2, 3]), seed=st.integers(0, 10 ** 6))
def test_global_coarsening_hierarchy(dim, seed):
    m = random_mesh(dim, 3 if dim == 2 else 2, seed, frac=0.4)
    H = m.hierarchy()
    assert H[-1] is m
    assert H[0].levels.max() == 0                      # ends at the coarse mesh
    for c, f in zip(H[:-1], H[1:]):
        assert c.num_cells < f.num_cells
        cidx, child = f.parent_of(c)                   # nested: each fine cell in one coarse cell
        assert np.allclose(np.bincount(cidx, weights=f.volumes(), minlength=c.num_cells), c.volumes())
        touch = brute_touch(c, 2)
        assert np.abs(c.levels[:, None] - c.levels[None, :])[touch].max() <= 1
    # as many refinements as possible are taken back: a level-l mesh has max level l at most
    assert all(h.levels.max() <= i for i, h in enumerate(H))


def test_hierarchy_of_a_coarse_mesh_reuses_the_meshes_below_it():
    """A coarse mesh of a hierarchy keeps its coarsening: its own hierarchy is the meshes below
    it, the same objects, equal to a fresh coarsening; the caller's mesh keeps none (a second
    hierarchy of it makes new meshes); max_levels still ends it."""
    m = random_mesh(3, 2, 5, frac=0.4)
    H = m.hierarchy()
    assert len(H) >= 3 and "_coarsened" not in m.__dict__
    H2 = H[-2].hierarchy()
    assert len(H2) == len(H) - 1 and all(a is b for a, b in zip(H2, H[:-1]))
    fresh = Mesh(H[-2]._forest, H[-2].cell_ids).hierarchy()
    assert all(a is not b and np.array_equal(a.cell_ids, b.cell_ids) for a, b in zip(fresh, H2))
    assert all(a is not b for a, b in zip(m.hierarchy()[:-1], H[:-1]))
    assert H[-2].hierarchy(max_levels=2) == H[-3:-1]


def _coarsen_by_counting(m):
    """coarsen_once as seed 001 §2.2 reads: a parent whose 2^d children are all active
    (counted over the forest) goes back unless one of its children touches a staying cell
    of a higher level (brute-force touching), repeated until no family is blocked."""
    F, nv = m._forest, 2 ** m.dim
    par, lv = m.parents, m.levels
    cnt = np.bincount(par[par >= 0], minlength=F.num_cells)
    fam = set(np.flatnonzero(cnt == nv).tolist())
    touch = brute_touch(m, 2)
    while fam:
        cell_in = np.array([p in fam for p in par])
        stay_lv = np.where(cell_in, -1, lv)
        bad = cell_in & (np.where(touch, stay_lv[None, :], -1).max(axis=1) >= lv + 1)
        if not bad.any():
            break
        fam -= set(par[bad].tolist())
    if not fam:
        return m._active
    cell_in = np.array([p in fam for p in par])
    return np.sort(np.concatenate([m._active[~cell_in], sorted(fam)]))


@settings(max_examples=10, deadline=None)
@given(dim=st.sampled_from([2, 3]), seed=st.integers(0, 10 ** 6))
def test_coarsen_once_equals_counting_the_children(dim, seed):
    """coarsen_once (families as windows of the sorted active ids) takes back exactly the
    refinements the definition does, on random 2:1 meshes refined several times (families
    blocked, partial families, several levels)."""
    m = random_mesh(dim, 4 if dim == 2 else 3, seed, frac=0.35)
    while m.levels.max() > 0:
        c = m.coarsen_once()
        assert np.array_equal(c._active, _coarsen_by_counting(m))
        if c.num_cells == m.num_cells:
            break
        m = c


def test_refine_bad_markers():
    m = Mesh.box([0, 0], [1, 1], [2, 2])
    with pytest.raises(ValueError, match=r"shape \(4,\)"):
        m.refine(np.ones(5, dtype=bool))
    with pytest.raises(ValueError, match="dtype float64"):
        m.refine(np.ones(4))
    with pytest.raises(ValueError, match=r"\[0, 4\)"):
        m.refine(np.array([7]))


def test_nonpositive_jacobian_rejected():
    pts = np.array([[0, 0], [1, 0], [0, 1], [1, 1.0]])
    with pytest.raises(ValueError, match="non-positive Jacobian"):
        Mesh.from_cells(pts, np.array([[1, 0, 2, 3]]))          # mirrored cell
    m = Mesh.box([0, 0], [1, 1], [2, 2])
    with pytest.raises(ValueError, match="non-positive Jacobian"):
        m.map(lambda x: np.stack([x[:, 0] ** 3 - 0.9 * x[:, 0], x[:, 1]], 1))


def test_from_meshio_quads_and_rejects_other_types():
    meshio = pytest.importorskip("meshio")
    pts = np.array([[0, 0, 0], [1, 0, 0], [2, 0, 0], [0, 1, 0], [1, 1, 0], [2, 1, 0.0]])
    quads = np.array([[0, 1, 4, 3], [1, 2, 5, 4]])               # VTK counter-clockwise
    m = Mesh.from_meshio(meshio.Mesh(pts, [("quad", quads)]))
    assert m.dim == 2 and m.num_cells == 2 and np.isclose(m.volumes().sum(), 2.0)
    assert m.boundary_nodes().size == 6
    with pytest.raises(ValueError, match="triangle"):
        Mesh.from_meshio(meshio.Mesh(pts, [("triangle", np.array([[0, 1, 4]]))]))
    with pytest.raises(TypeError):
        Mesh.from_meshio("not a mesh")
    hexpts = np.array([[x, y, z] for z in (0, 1) for y in (0, 1) for x in (0, 1)], dtype=float)
    vtk = np.array([[0, 1, 3, 2, 4, 5, 7, 6]])
    m3 = Mesh.from_meshio(meshio.Mesh(hexpts, [("hexahedron", vtk)]))
    assert np.isclose(m3.refine().volumes().sum(), 1.0)


def test_graded_map_keeps_refinement_consistent():
    grade = lambda x: 0.5 - 0.5 * np.cos(np.pi * x)
    m = Mesh.box([0, 0], [1, 1], [4, 4], map=grade)
    f = m.refine(np.arange(0, 16, 3))
    assert np.isclose(f.volumes().sum(), 1.0)
    assert f.points[:, 0].min() == 0 and np.isclose(f.points[:, 0].max(), 1)


@settings(max_examples=10, deadline=None)
@given(dim=st.sampled_from([2, 3]), seed=st.integers(0, 10 ** 6))
def test_touch_max_matches_touch_graph(dim, seed):
    m = random_mesh(dim, 3 if dim == 2 else 2, seed)
    vals = np.random.default_rng(seed).integers(-5, 50, m.num_cells)
    T = m.touch_graph.tocsr()
    ref = np.array([vals[T.indices[T.indptr[i]:T.indptr[i + 1]]].max() for i in range(m.num_cells)])
    assert np.array_equal(m.touch_max(vals), ref)


# ----------------------------------------------------------------------------- split fast paths

def _np_unique_pairs(lo, hi):
    """Reference for adaptmg.mesh._tree.unique_pairs: np.unique of the packed keys."""
    from adaptmg.mesh._tree import pack
    return np.unique(pack(lo, hi), return_index=True, return_inverse=True)


@pytest.mark.parametrize("n,top", [(0, 10), (1, 10), (1000, 50), (5000, 3000), (2000, 2 ** 26),
                                   (2000, 2 ** 27), (300, 2 ** 31 - 2)])
def test_unique_pairs_matches_np_unique(n, top):
    """The packed-sort unique of node pairs equals np.unique of the packed keys (keys, first
    occurrence, inverse), also where the packing does not fit (np.unique fallback)."""
    from adaptmg.mesh._tree import unique_pairs
    rng = np.random.default_rng(n)
    a, b = rng.integers(0, top, n), rng.integers(0, top, n)
    a[n // 2:] = a[:n - n // 2]                  # plenty of repeated pairs
    b[n // 2:] = b[:n - n // 2]
    lo, hi = np.minimum(a, b), np.maximum(a, b)
    got, ref = unique_pairs(lo, hi), _np_unique_pairs(lo, hi)
    for x, y in zip(got[:2], ref[:2]):
        assert x.dtype == y.dtype and x.shape == y.shape and np.array_equal(x, y)
    # the inverse: int32 on the packed path (np.unique's intp on its fallback), same values
    assert got[2].dtype in (np.int32, np.intp) and got[2].shape == ref[2].shape
    assert np.array_equal(got[2], ref[2])


def _refined_meshes():
    box2 = lambda: Mesh.box([0, 0], [1, 2], [3, 5])
    box3 = lambda: Mesh.box([0, 0, 0], [1, 1, 2], [2, 3, 2])
    # cells turned by 180 degrees about the z axis: orientations vary between neighbours
    p, c = np.array(box3().points), np.array(box3().cells)
    c[::2] = c[::2][:, [3, 2, 1, 0, 7, 6, 5, 4]]
    turned = lambda: Mesh.from_cells(p, c)
    left = lambda m: m.refine(m.cell_vertices().mean(1)[:, 0] < 0.4)
    return {
        "2d uniform": lambda: box2().refine().refine().refine(),
        "3d uniform": lambda: box3().refine().refine(),
        "2d adaptive then uniform": lambda: left(left(box2())).refine().refine(),
        "3d adaptive then uniform": lambda: left(left(box3())).refine(),
        "3d turned cells, adaptive": lambda: left(turned().refine()).refine(),
        "2d random": lambda: random_mesh(2, 4, 7),
        "3d random": lambda: random_mesh(3, 3, 8, frac=0.4),
    }


@pytest.mark.parametrize("name", list(_refined_meshes()))
def test_split_fast_unique_equals_np_unique(name, monkeypatch):
    """Forest.split with the packed-sort unique_pairs builds the same forest, array for array
    (node numbering, order, registries, boundary ids), as with np.unique."""
    import dataclasses
    from adaptmg.mesh import _tree
    build = _refined_meshes()[name]
    fast = build()
    monkeypatch.setattr(_tree, "unique_pairs", _np_unique_pairs)
    ref = build()
    for f in dataclasses.fields(fast._forest):
        x, y = getattr(fast._forest, f.name), getattr(ref._forest, f.name)
        if isinstance(x, np.ndarray):
            assert x.dtype == y.dtype and np.array_equal(x, y), f.name
    assert np.array_equal(fast.cell_ids, ref.cell_ids)
    assert np.array_equal(fast.points, ref.points) and np.array_equal(fast.cells, ref.cells)
    assert np.array_equal(fast.boundary_ids, ref.boundary_ids)


@pytest.mark.parametrize("dim", [2, 3])
def test_uniform_refine_of_coarsened_mesh_reuses_children(dim):
    """Refining cells that still have children in the forest adds no cells: the mesh is the
    finer one again (the path of _refine_exact for cells that were not split just now)."""
    fine = random_mesh(dim, 2, 5).refine()
    coarse = fine.coarsen_once()
    again = coarse.refine()
    assert again._forest is fine._forest
    assert np.array_equal(again.cell_ids, fine.cell_ids)


# ----------------------------------------------------------------- node numbering
@pytest.mark.parametrize("dim,times", [(2, 6), (3, 4)])
def test_refined_node_numbering_is_local(dim, times):
    """Nodes created by refinement are numbered along the cells' space-filling curve, so an
    assembled row's columns stay close to the row (by forest id, i.e. creation order, the
    90th percentile of |i - j| was ~n / 1.3)."""
    from adaptmg import Space, assemble
    mesh = Mesh.box([0.0] * dim, [1.0] * dim, [2] * dim)
    for _ in range(times):
        mesh = mesh.refine()
    A = assemble.stiffness(Space(mesh, 1)).tocsr()
    n = A.shape[0]
    dist = np.abs(A.indices - np.repeat(np.arange(n), np.diff(A.indptr)))
    assert np.median(dist) <= 32
    assert np.percentile(dist, 90) <= 2 * n ** ((dim - 1) / dim)


def test_node_numbering_keeps_the_coarse_points_first():
    """An unrefined mesh keeps its input points' numbering; refinement appends new nodes."""
    rng = np.random.default_rng(3)
    base = Mesh.box([0.0, 0.0], [1.0, 1.0], [3, 2])
    perm = rng.permutation(base.num_nodes)
    inv = np.argsort(perm)
    mesh = Mesh.from_cells(base.points[perm], inv[base.cells])
    np.testing.assert_array_equal(mesh.points, base.points[perm])
    fine = mesh.refine().refine()
    np.testing.assert_array_equal(fine.points[:mesh.num_nodes], mesh.points)
    assert sorted(fine.node_ids.tolist()) == list(range(fine.num_nodes))


@pytest.mark.parametrize("local", [False, True])
def test_refinement_past_the_node_limit_raises(local, monkeypatch):
    """Node ids are int32 in the forest: a refinement that would pass MAX_NODES raises a
    ValueError (before an int32 inverse could wrap) instead of building wrong tables."""
    from adaptmg.mesh import _tree
    m = Mesh.box([0, 0, 0], [1, 1, 1], [2, 2, 2]).refine()
    marked = np.arange(5) if local else None
    n_after = m.refine(marked)._forest.num_nodes
    monkeypatch.setattr(_tree, "MAX_NODES", n_after - 1)
    with pytest.raises(ValueError, match="at most"):
        m.refine(marked)
    monkeypatch.setattr(_tree, "MAX_NODES", n_after)
    assert m.refine(marked)._forest.num_nodes == n_after
