"""The fused index kernels of ``adaptmg/device/index_kernels.py``: the NumPy twin against the
formula evaluated node by node (CPU), and the CuPy kernel against the twin (GPU, exact
integers)."""
import importlib.util
import pathlib

import numpy as np
import pytest

import adaptmg
from adaptmg.device import index_kernels
from adaptmg.mesh import _touch


def _mesh(dim, backend="cpu"):
    m = adaptmg.Mesh.box([0.0] * dim, [1.0] * dim, [2] * dim, backend=backend)
    for _ in range(3 if dim == 2 else 2):
        c = m.points[m.cells].mean(axis=1)
        m = m.refine(m.backend.xp.linalg.norm(c, axis=1) < 0.45)
    return m


def _inputs(m, face=False):
    """(K, ent, keys, vals, seen, jump) as ``hanging_in_forest`` hands them to the kernel: every
    active cell, its edges (or faces) and the forest's registry, ``seen`` every vertex, the
    level jumps."""
    from adaptmg.mesh._hanging import _entities
    F, cells, levels = m._forest, m._active_cell_nodes(), m.levels
    xp = F.backend.xp
    seen = xp.zeros(F.num_nodes, dtype=bool)
    seen[cells] = True
    jump, _ = _touch.level_jumps(cells, F.num_nodes, levels.astype(F.cell_level.dtype))
    ent = _entities(F.dim)[1 if face else 0][0]
    keys, vals = (F.face_keys, F.face_nodes) if face else (F.edge_keys, F.edge_nodes)
    return cells, ent, keys, vals, seen, jump


def _census_module(monkeypatch):
    """scripts/census_device_ops.py, installed for this test (its stand-in device)."""
    root = pathlib.Path(__file__).resolve().parents[2]
    spec = importlib.util.spec_from_file_location("census_device_ops", root / "scripts" / "census_device_ops.py")
    census = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(census)
    monkeypatch.setattr(census, "RECORDS", type(census.RECORDS)())
    census.install(monkeypatch)
    return census


@pytest.mark.parametrize("dim, face", [(2, False), (3, False), (3, True)])
def test_registry_midpoints_twin_is_the_formula(dim, face):
    """Cell by cell and entity by entity: the registered midpoint (centre) of the edge (face),
    found by comparing the key with every registry entry, where it is a vertex of the mesh and
    the entity's vertices are jump nodes."""
    K, ent, keys, vals, seen, jump = _inputs(_mesh(dim), face)
    got = index_kernels.registry_midpoints(K, ent, keys, vals, seen, jump)
    reg = dict(zip(keys.tolist(), vals.tolist()))
    want = np.full(got.shape, -1)
    for r in range(K.shape[0]):
        for e, loc in enumerate(ent):
            v = [int(K[r, j]) for j in loc if j >= 0]
            if len(v) == 2:
                lo, hi = min(v), max(v)
            else:                       # smallest corner and the one diagonally opposite
                j = int(np.argmin(v))
                lo, hi = v[j], v[3 - j]
            n = reg.get((lo << 32) | hi, -1)
            want[r, e] = n if n >= 0 and seen[n] and all(jump[v]) else -1
    assert (want >= 0).sum() > 10                           # the mesh has midpoints to find
    np.testing.assert_array_equal(got, want)


def _vertex_on_entity_interior(m):
    """Brute force, by coordinates: the mesh nodes at the midpoint of an edge or the centre of a
    face of an active cell (2:1 meshes: the hanging nodes), sorted."""
    from adaptmg.mesh import reference as ref
    X, C, d = m.points, m.cells, m.dim
    mids = [X[C[:, list(e)]].mean(axis=1) for e in ref.edges(d)]
    if d == 3:
        mids += [X[C[:, list(f)]].mean(axis=1) for f in ref.face_vertices(3)]
    P = np.concatenate(mids)
    key = lambda Y: {tuple(np.round(y * 2 ** 20).astype(np.int64)) for y in Y}    # noqa: E731
    inside = key(P)
    return np.array(sorted(i for i, x in enumerate(X) if tuple(np.round(x * 2 ** 20).astype(np.int64)) in inside
                           and i in set(C.ravel().tolist())))


@pytest.mark.parametrize("dim", [2, 3])
def test_hanging_nodes_are_the_vertices_inside_an_edge_or_face(dim):
    """The registry path finds exactly the vertices of active cells lying at the midpoint of an
    active cell's edge or the centre of its face (coordinates, cell by cell), on a graded mesh
    and on each level of its global-coarsening hierarchy; the owner holds its node."""
    rng = np.random.default_rng(dim)
    m = adaptmg.Mesh.box([0.0] * dim, [1.0] * dim, [3] * dim)
    for _ in range(3):
        m = m.refine(rng.random(m.num_cells) < 0.25)
    found = 0
    for lev in m.hierarchy():
        want = _vertex_on_entity_interior(lev)
        np.testing.assert_array_equal(lev.hanging_nodes, want)
        own = lev.cells[lev.hanging_owner]
        par = lev.hanging_parents
        assert all(set(p[p >= 0]) <= set(c) for p, c in zip(par, own))
        found += want.size
    assert found > 20


def test_census_runs_each_fused_kernel_once_per_call(monkeypatch):
    """The census's stand-in runs the device path (one kernel) with the same integers as the
    twin, so its operation counts are those of the device."""
    census = _census_module(monkeypatch)
    host = _inputs(_mesh(2))
    want = index_kernels.registry_midpoints(*host)
    dev = [census.xp.asarray(a) if isinstance(a, np.ndarray) and a is not host[1] else a for a in host]
    census.RECORDS.clear()
    got = index_kernels.registry_midpoints(*dev)
    np.testing.assert_array_equal(np.asarray(got.view(np.ndarray)), want)
    names = sorted(k[3] for k, n in census.RECORDS.items() for _ in range(n))
    assert "kernel:registry_midpoints" in names and names.count("kernel:registry_midpoints") == 1


@pytest.mark.gpu
@pytest.mark.parametrize("dim, face", [(2, False), (3, False), (3, True)])
def test_registry_midpoints_kernel_equals_twin(dim, face):
    from adaptmg.backend import to_host
    dev = _inputs(_mesh(dim, backend="gpu"), face)
    host = [to_host(a) if not isinstance(a, np.ndarray) else a for a in dev]
    got = index_kernels.registry_midpoints(*dev)
    assert not isinstance(got, np.ndarray)                  # the kernel ran
    want = index_kernels.registry_midpoints(*host)
    assert (want >= 0).sum() > 10
    np.testing.assert_array_equal(to_host(got), want)
    m = _mesh(dim, backend="gpu")
    np.testing.assert_array_equal(to_host(m.hanging_nodes), _mesh(dim).hanging_nodes)


def _face_inputs(dim, backend="cpu"):
    """(Vs, W, par, cor, cor_i) of the matched faces of a refined mesh, as face_pairs has them."""
    from adaptmg.estimate import faces
    from adaptmg.mesh import reference as ref
    m = _mesh(dim, backend)
    xp = m.backend.xp
    fp = faces.face_pairs(m, m.backend)
    cells = m.cells
    Vs = cells[fp.cell[:, None], xp.asarray(ref.face_vertices(dim))[fp.face]]
    par = xp.full((m.num_nodes, 4), -1, dtype=np.int64)
    par[m.hanging_nodes] = m.hanging_parents
    cor_i = xp.asarray(ref.corners(dim))
    return Vs, cells[fp.nb], par, cor_i.astype(float), cor_i


@pytest.mark.parametrize("dim", [2, 3])
def test_face_corners_twin_is_the_formula(dim):
    Vs, W, par, cor, cor_i = _face_inputs(dim)
    R, ok = index_kernels.face_corners(Vs, W, par, cor, cor_i)
    assert ok and R.shape == Vs.shape + (dim,)
    hanging = 0
    for r in range(Vs.shape[0]):
        where = {int(w): k for k, w in enumerate(W[r])}
        for j, v in enumerate(Vs[r]):
            if v in where:
                want = cor[where[v]]
            else:
                hanging += 1
                want = np.mean([cor[where[p]] for p in par[v] if p >= 0], axis=0)
            np.testing.assert_array_equal(R[r, j], want)        # sums of 0/1 and one division: exact
    assert hanging > 10
    # a vertex that is neither the neighbour's nor a hanging node on its face: not ok
    bad = W.copy()
    bad[0] = W.max() + 1 + np.arange(W.shape[1])
    assert not index_kernels.face_corners(Vs, bad, par, cor, cor_i)[1]


def test_census_face_corners_is_one_kernel(monkeypatch):
    census = _census_module(monkeypatch)
    host = _face_inputs(2)
    R0, ok0 = index_kernels.face_corners(*host)
    dev = [census.xp.asarray(a) for a in host]
    census.RECORDS.clear()
    R, ok = index_kernels.face_corners(*dev)
    assert ok == ok0 and np.array_equal(R.view(np.ndarray), R0)
    names = sorted(k[3] for k, n in census.RECORDS.items() for _ in range(n) if k[2] != "alloc")
    assert names == ["__bool__", "all", "kernel:face_corners"]


@pytest.mark.gpu
@pytest.mark.parametrize("dim", [2, 3])
def test_face_corners_kernel_equals_twin(dim):
    from adaptmg.backend import to_host
    dev = _face_inputs(dim, backend="gpu")
    host = [to_host(a) for a in dev]
    R, ok = index_kernels.face_corners(*dev)
    assert not isinstance(R, np.ndarray)                    # the kernel ran
    R0, ok0 = index_kernels.face_corners(*host)
    assert ok and ok0
    np.testing.assert_array_equal(to_host(R), R0)           # exact: the same float bits
    from adaptmg.backend import get_backend
    bad = dev[1].copy()
    bad[0] = bad.max() + 1 + get_backend("gpu").xp.arange(bad.shape[1], dtype=bad.dtype)
    assert not index_kernels.face_corners(dev[0], bad, *dev[2:])[1]


def _grouped_case(rng, xp=np):
    """Tables, cells-last data and groups as the estimator's face runs have them (unsorted),
    with the table id of every column."""
    tables = [rng.standard_normal((6, 4)) for _ in range(5)]
    B = rng.standard_normal((3, 4, 50))
    groups = [(20, 31, 3), (0, 7, 1), (7, 20, 4), (31, 50, 1)]
    ids = np.zeros(50, dtype=np.int64)
    for s, e, i in groups:
        ids[s:e] = i
    return ([xp.asarray(t) for t in tables], xp.asarray(B),
            index_kernels.ColumnGroups(groups, xp.asarray(ids)))


def test_grouped_table_product_twin_is_the_formula():
    tables, B, groups = _grouped_case(np.random.default_rng(1))
    got = index_kernels.grouped_table_product(tables, B, groups)
    for s, e, i in groups:
        for j in range(s, e):
            np.testing.assert_allclose(got[:, :, j], np.einsum("rk,lk->lr", tables[i], B[:, :, j]),
                                       rtol=0, atol=8 * np.finfo(float).eps * np.abs(B).max() * 4)


def test_census_grouped_table_product_is_one_kernel(monkeypatch):
    census = _census_module(monkeypatch)
    tables, B, groups = _grouped_case(np.random.default_rng(2))
    want = index_kernels.grouped_table_product(tables, B, groups)
    dt, dB = [census.xp.asarray(t) for t in tables], census.xp.asarray(B)
    dg = index_kernels.ColumnGroups(groups, census.xp.asarray(groups.ids))
    census.RECORDS.clear()
    got = index_kernels.grouped_table_product(dt, dB, dg)
    np.testing.assert_allclose(got.view(np.ndarray), want, rtol=0, atol=32 * np.finfo(float).eps)
    launches = sorted(k[3] for k, n in census.RECORDS.items() for _ in range(n) if k[2] == "launch")
    assert "kernel:grouped_table_product" in launches and "matmul" not in launches


@pytest.mark.gpu
def test_grouped_table_product_kernel_equals_twin():
    from adaptmg.backend import get_backend, to_host
    cp = get_backend("gpu").xp
    tables, B, groups = _grouped_case(np.random.default_rng(3), cp)
    got = index_kernels.grouped_table_product(tables, B, groups)
    twin = index_kernels.grouped_table_product(tables, B, list(groups))      # no ids: the loop
    out = cp.empty_like(got)
    for s, e, i in groups:                                  # the twin's loop on the device
        out[..., s:e] = cp.matmul(tables[i], B[..., s:e])
    scale = float(cp.abs(B).max()) * 4 * 3.0
    assert float(cp.abs(got - out).max()) <= 8 * np.finfo(float).eps * scale
    assert cp.array_equal(twin, out)
    # a single-precision copy goes through the same kernel (T = float32)
    got32 = index_kernels.grouped_table_product([t.astype(cp.float32) for t in tables],
                                                B.astype(cp.float32), groups)
    assert got32.dtype == cp.float32
    assert float(cp.abs(got32 - out).max()) <= 64 * np.finfo(np.float32).eps * scale
    assert to_host(got).shape == (3, 6, 50)


def _rows_case(xp=np):
    """A random CSR (some empty rows) and rows to pack (repeats, an empty row), as csr_rows."""
    import scipy.sparse as sp
    A = sp.random(40, 30, density=0.15, format="csr", random_state=4)
    A.data[:] = np.random.default_rng(4).standard_normal(A.nnz)
    A = sp.csr_matrix(A.multiply(np.arange(40)[:, None] != 17))       # row 17 empty
    A.eliminate_zeros()
    rows = np.array([3, 0, 17, 3, 39, 21, 8], dtype=np.int64)
    assert (np.diff(A.indptr)[rows] == 0).any() and (np.diff(A.indptr)[rows] > 0).sum() >= 4
    ip = A.indptr.astype(np.int64)
    start, cnt = ip[rows], ip[rows + 1] - ip[rows]
    ptr = np.r_[0, np.cumsum(cnt)].astype(np.int64)
    return A, rows, [xp.asarray(a) for a in (ptr, start, A.indices, A.data)], int(ptr[-1])


def test_csr_row_entries_twin_is_the_row_slice():
    A, rows, args, total = _rows_case()
    ind, dat = index_kernels.csr_row_entries(*args, total)
    S = A[rows]
    assert ind.dtype == np.int64 and dat.dtype == np.float64 and total == S.nnz > 10
    np.testing.assert_array_equal(ind, S.indices)
    np.testing.assert_array_equal(dat, S.data)


def test_census_csr_row_entries_is_one_kernel(monkeypatch):
    census = _census_module(monkeypatch)
    A, rows, args, total = _rows_case()
    want = index_kernels.csr_row_entries(*args, total)
    dev = [census.xp.asarray(a) for a in args]
    census.RECORDS.clear()
    got = index_kernels.csr_row_entries(*dev, total)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g.view(np.ndarray), w)
    launches = [k[3] for k, n in census.RECORDS.items() if k[2] == "launch"]
    assert launches == ["kernel:csr_row_entries"]


@pytest.mark.gpu
def test_csr_row_entries_kernel_equals_twin():
    from adaptmg.backend import get_backend, to_host
    A, rows, args, total = _rows_case()
    cp = get_backend("gpu").xp
    got = index_kernels.csr_row_entries(*[cp.asarray(a) for a in args], total)
    assert not isinstance(got[0], np.ndarray)
    want = index_kernels.csr_row_entries(*args, total)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(to_host(g), w)                # copies: exact
    none = index_kernels.csr_row_entries(*[cp.asarray(a) for a in args], 0)
    assert none[0].size == 0 and none[1].size == 0


def _constrained_case():
    """A canonical CSR with explicit zeros, a fixed row without a diagonal entry and an empty
    free row, and its free mask."""
    import scipy.sparse as sp
    rng = np.random.default_rng(5)
    D = rng.standard_normal((30, 30)) * (rng.random((30, 30)) < 0.25)
    D[4, :] = 0.0                                             # an empty (free) row
    D[7, 7] = 0.0                                             # a fixed row without a diagonal entry
    B = sp.csr_matrix(D)
    B.data[::5] = 0.0                                         # stored zeros (dropped in free rows)
    z = np.ones(30, dtype=bool)
    z[[7, 11, 12, 25]] = False
    return B, z


def test_constrained_csr_twin_is_the_formula():
    B, z = _constrained_case()
    K = index_kernels.constrained_csr(B, z, 2.5)
    Z = np.diag(z.astype(float))
    np.testing.assert_array_equal(K.toarray(), Z @ B.toarray() @ Z + 2.5 * (np.eye(30) - Z))
    assert K.has_canonical_format and (K.data != 0).all()
    assert np.diff(K.indptr)[4] == 0 and np.diff(K.indptr)[~z].tolist() == [1, 1, 1, 1]


@pytest.mark.gpu
def test_constrained_csr_kernel_equals_twin():
    from adaptmg.backend import get_backend, to_host
    B, z = _constrained_case()
    be = get_backend("gpu")
    Bd = be.asmatrix(B)
    K = index_kernels.constrained_csr(Bd, be.xp.asarray(z), 2.5)
    W = index_kernels.constrained_csr(B, z, 2.5)
    for a in ("indptr", "indices", "data"):                   # the same canonical CSR, exactly
        np.testing.assert_array_equal(to_host(getattr(K, a)), getattr(W, a))
    assert K.has_canonical_format


_ROWS = np.array([25, 3, 7, 4, 11, 0, 29], dtype=np.int64)      # unsorted, fixed and free rows


def test_constrained_rows_twin_is_the_formula():
    """The chosen rows of K, and s from the sum of |B_rr| over the free rows among them."""
    B, z = _constrained_case()
    seen = []

    def scale(d, m):
        seen.append((d, m))
        return 2.5
    K, s = index_kernels.constrained_rows(B, _ROWS, z, scale)
    Z = np.diag(z.astype(float))
    full = Z @ B.toarray() @ Z + 2.5 * (np.eye(30) - Z)
    np.testing.assert_array_equal(K.toarray(), full[_ROWS])
    assert s == 2.5 and K.has_canonical_format and (K.data != 0).all()
    free = _ROWS[z[_ROWS]]
    (d, m), = seen                                            # |B_rr| summed in another order
    assert m == free.size and d == pytest.approx(np.abs(B.diagonal()[free]).sum(), rel=4 * np.finfo(float).eps)
    none, _ = index_kernels.constrained_rows(B, _ROWS[:0], z, lambda d, m: 1.0)
    assert none.shape == (0, 30) and none.nnz == 0


@pytest.mark.gpu
def test_constrained_rows_kernel_equals_twin():
    from adaptmg.backend import get_backend, to_host
    B, z = _constrained_case()
    be = get_backend("gpu")
    got, want = [], []
    K, _ = index_kernels.constrained_rows(be.asmatrix(B), be.xp.asarray(_ROWS), be.xp.asarray(z),
                                          lambda d, m: got.append((d, m)) or 2.5)
    W, _ = index_kernels.constrained_rows(B, _ROWS, z, lambda d, m: want.append((d, m)) or 2.5)
    for a in ("indptr", "indices", "data"):                   # copies of the same entries: exact
        np.testing.assert_array_equal(to_host(getattr(K, a)), getattr(W, a))
    assert K.has_canonical_format
    # |B_rr| summed in another order: within a few eps of the total
    assert got[0][1] == want[0][1] and abs(got[0][0] - want[0][0]) <= 8 * np.finfo(float).eps * want[0][0]


def _weight_rows_case():
    """12 nodes, 3 hanging (not first, not last) with unsorted columns and a zero weight."""
    hanging = np.array([2, 5, 11], dtype=np.int64)
    cols = np.array([[9, 1, 4, 0], [7, 3, 8, 6], [10, 0, 1, 3]], dtype=np.int32)
    W = np.array([[0.25, 0.25, 0.25, 0.25], [0.5, 0.0, 0.5, 0.0], [0.25, 0.5, 0.125, 0.125]])
    is_h = np.zeros(12, dtype=bool)
    is_h[hanging] = True
    return 12, is_h, hanging, cols, W


def test_weight_rows_csr_twin_is_the_formula():
    from adaptmg.backend import CPU
    n, is_h, hanging, cols, W = _weight_rows_case()
    H = index_kernels.weight_rows_csr(CPU, n, is_h, hanging, cols, W)
    D = np.diag((~is_h).astype(float))
    for k, h in enumerate(hanging):
        D[h, cols[k]] = W[k]
    np.testing.assert_array_equal(H.toarray(), D)
    assert H.has_canonical_format and H.nnz == 9 + 4 + 2 + 4


@pytest.mark.gpu
def test_weight_rows_csr_kernel_equals_twin():
    from adaptmg.backend import CPU, get_backend, to_host
    be = get_backend("gpu")
    n, is_h, hanging, cols, W = _weight_rows_case()
    H = index_kernels.weight_rows_csr(be, n, *[be.xp.asarray(a) for a in (is_h, hanging, cols, W)])
    want = index_kernels.weight_rows_csr(CPU, n, is_h, hanging, cols, W)
    for a in ("indptr", "indices", "data"):                   # the same canonical CSR, exactly
        np.testing.assert_array_equal(to_host(getattr(H, a)), getattr(want, a))


def _split_case(table, it=np.int32, seed=5):
    """A (40 x 60) canonical CSR with sorted rows (some empty, one full) and this rank's columns: a
    ``local`` table of random owners (rank 1 of 3), or the range 20 .. 44."""
    import scipy.sparse as sp
    rng = np.random.default_rng(seed)
    M = sp.random(40, 60, density=0.2, format="csr", random_state=rng)
    keep = np.ones(40)
    keep[5:8] = 0.0                                      # three empty rows
    full = sp.csr_matrix((np.full(60, 0.5), (np.full(60, 10), np.arange(60))), shape=(40, 60))
    M = sp.csr_matrix(sp.diags(keep) @ M + full)         # row 10: 60 entries (two warp chunks)
    M.eliminate_zeros()
    M.sort_indices()
    M.indices, M.indptr = M.indices.astype(it), M.indptr.astype(it)
    owned = rng.integers(0, 3, 60) == 1 if table else (np.arange(60) >= 20) & (np.arange(60) < 45)
    local = np.full(60, -1, dtype=np.int32)
    local[owned] = np.arange(int(owned.sum()))
    return M, owned, (local, 0, 0) if table else (None, 20, 45)


@pytest.mark.parametrize("table", [True, False])
def test_owned_ghost_rows_twin_is_the_formula(table):
    """The owned block is M's owned columns renumbered in order; the ghost block holds every
    other entry of each row, in the row's order, with its global column."""
    import scipy.sparse as sp
    M, owned, (local, lo, hi) = _split_case(table)
    optr, ocol, oval, gptr, gcol, gval = index_kernels.owned_ghost_rows(M.indptr, M.indices, M.data, local, lo, hi)
    Aoo = sp.csr_matrix((oval, ocol, optr), shape=(40, int(owned.sum())))
    np.testing.assert_array_equal(Aoo.toarray(), M[:, np.flatnonzero(owned)].toarray())
    assert gcol.dtype == np.int64 and ocol.dtype == np.int32
    for r in range(40):
        e = slice(M.indptr[r], M.indptr[r + 1])
        g = ~owned[M.indices[e]]
        np.testing.assert_array_equal(gcol[gptr[r]:gptr[r + 1]], M.indices[e][g])
        np.testing.assert_array_equal(gval[gptr[r]:gptr[r + 1]], M.data[e][g])
    assert gptr[-1] == M.nnz - Aoo.nnz > 0


#: chosen rows: out of order, a repeat, empty rows (5, 6) and the 60-entry row 10
_CHOSEN = np.array([10, 3, 5, 39, 0, 3, 6, 21], dtype=np.int64)


@pytest.mark.parametrize("table", [True, False])
@pytest.mark.parametrize("rows", [_CHOSEN, np.zeros(0, dtype=np.int64)], ids=["some", "none"])
def test_owned_ghost_rows_of_chosen_rows_are_those_rows_split(table, rows):
    """``rows=``: the split of the chosen rows read in place is the split of ``M[rows]``."""
    M, _, (local, lo, hi) = _split_case(table)
    S = M[rows]
    want = index_kernels.owned_ghost_rows(S.indptr, S.indices, S.data, local, lo, hi)
    got = index_kernels.owned_ghost_rows(M.indptr, M.indices, M.data, local, lo, hi, rows=rows)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype
        np.testing.assert_array_equal(g, w)
    assert got[0].size == rows.size + 1 and (rows.size == 0 or got[3][-1] > 0)


@pytest.mark.gpu
@pytest.mark.parametrize("table", [True, False])
@pytest.mark.parametrize("it", [np.int32, np.int64])
@pytest.mark.parametrize("lanes", ["warp", "thread"])
@pytest.mark.parametrize("chosen", [False, True])
def test_owned_ghost_rows_kernel_equals_twin(table, it, lanes, chosen, monkeypatch):
    """Both kernels -- a warp a row (row-long ballots) and a thread a row -- equal the twin,
    on every row and on chosen rows."""
    from adaptmg.backend import get_backend, to_host
    cp = get_backend("gpu").xp
    monkeypatch.setattr(index_kernels, "SPLIT_WARP_ROW", 0 if lanes == "warp" else 10 ** 9)
    M, _, (local, lo, hi) = _split_case(table, it)
    rows = _CHOSEN if chosen else None
    want = index_kernels.owned_ghost_rows(M.indptr, M.indices, M.data, local, lo, hi, rows=rows)
    got = index_kernels.owned_ghost_rows(cp.asarray(M.indptr), cp.asarray(M.indices), cp.asarray(M.data),
                                         None if local is None else cp.asarray(local), lo, hi,
                                         rows=None if rows is None else cp.asarray(rows))
    for g, w in zip(got, want):
        assert g.dtype == w.dtype
        np.testing.assert_array_equal(to_host(g), w)           # copies and counts: exact


@pytest.mark.parametrize("dim", [2, 3])
def test_hanging_search_without_a_dominant_level_reads_the_jump_cells_only(dim, monkeypatch):
    """Where no level dominates (level_jumps gives no rows) the hanging-node search looks at
    the cells with a jump vertex only: the nodes, parents, owners and (node, cell) pairs are
    those of the search over every cell, on fewer cells."""
    from adaptmg.mesh import _hanging, _touch
    rng = np.random.default_rng(7 + dim)
    m = adaptmg.Mesh.box([0.0] * dim, [1.0] * dim, [3] * dim)
    for _ in range(3):
        m = m.refine(rng.random(m.num_cells) < 0.4)
    cells, levels = m._active_cell_nodes(), m.levels
    jump, rows = _touch.level_jumps(cells, m._forest.num_nodes, levels.astype(m._forest.cell_level.dtype))
    assert rows is None                                   # the branch under test
    seen = []
    real = _touch.cells_with_vertex_in

    def spy(c, mask):
        out = real(c, mask)
        seen.append(out.size)
        return out
    monkeypatch.setattr(_touch, "cells_with_vertex_in", spy)
    got = _hanging.hanging_in_forest(m._forest, cells, levels)
    assert len(seen) == 1 and 0 < seen[0] < cells.shape[0]
    monkeypatch.setattr(_touch, "cells_with_vertex_in", lambda c, mask: np.arange(c.shape[0]))
    want = _hanging.hanging_in_forest(m._forest, cells, levels)      # every cell, as before
    assert got[0].size > 10
    for a, b in zip([*got[:3], *got[3]], [*want[:3], *want[3]]):
        np.testing.assert_array_equal(a, b)

