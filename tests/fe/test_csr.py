"""O(nnz) CSR helpers used by constraints and transfer, against their definitions."""
import numpy as np
import pytest
import scipy.sparse as sp

from adaptmg import assemble
from adaptmg.fe.csr_ops import (add_to_diagonal, congruence_with_constraints, csr_diagonal, diagonal_by_search,
                                 mask_rows_cols, row_positions)
from adaptmg.fe import Space
from adaptmg.mesh import Mesh


@pytest.mark.parametrize("seed", range(5))
def test_mask_rows_cols_matches_diagonal_products(seed):
    rng = np.random.default_rng(seed)
    A = sp.random(60, 60, density=0.1, format="csr", random_state=seed) + sp.identity(60)
    r, c = rng.random(60) < 0.6, rng.random(60) < 0.6
    ref = sp.diags(r * 1.0) @ A @ sp.diags(c * 1.0)
    assert abs(mask_rows_cols(A, r, c) - ref).max() == 0
    ref2 = sp.diags(r * 1.0) @ A @ sp.diags(r * 1.0) + sp.diags(3.0 * ~r)
    assert abs(mask_rows_cols(A, r, r, diagonal=3.0) - ref2).max() == 0
    # a missing diagonal entry falls back to an explicit addition
    B = A.tolil()
    B[np.flatnonzero(~r)[0], np.flatnonzero(~r)[0]] = 0
    B = B.tocsr()
    B.eliminate_zeros()
    assert abs(mask_rows_cols(B, r, r, diagonal=3.0) - (sp.diags(r * 1.0) @ B @ sp.diags(r * 1.0)
                                                        + sp.diags(3.0 * ~r))).max() == 0
    assert abs(add_to_diagonal(A, np.arange(60.0)) - (A + sp.diags(np.arange(60.0)))).max() == 0


def _mask_rows_cols_reference(A, rows, cols, diagonal=None):
    """Entry-by-entry definition: kept entries in order, removed rows -> one diagonal entry."""
    A = sp.csr_matrix(A)
    data, indices, indptr = [], [], [0]
    for r in range(A.shape[0]):
        lo, hi = A.indptr[r], A.indptr[r + 1]
        if rows[r]:
            m = cols[A.indices[lo:hi]]
            data += list(A.data[lo:hi][m])
            indices += list(A.indices[lo:hi][m])
        elif diagonal is not None:
            data.append(diagonal)
            indices.append(r)
        indptr.append(len(indices))
    return np.array(data, dtype=float), np.array(indices), np.array(indptr)


@pytest.mark.parametrize("seed", range(4))
def test_mask_rows_cols_structure_matches_reference(seed):
    """Exact CSR arrays: removed rows with one, no or a duplicated diagonal entry, empty rows,
    unsorted rows (kept order)."""
    rng = np.random.default_rng(seed)
    n = 50
    A = sp.random(n, n, density=0.15, format="csr", random_state=seed) + sp.identity(n)
    A = A.tolil()
    for r in rng.choice(n, 8, replace=False):      # rows without diagonal entry / empty rows
        A[r, r] = 0
        if r % 2:
            A[r, :] = 0
    A = sp.csr_matrix(A)
    A.eliminate_zeros()
    # duplicated diagonal entries in a few rows (non-canonical input), unsorted rows
    coo = A.tocoo()
    dup = rng.choice(n, 4, replace=False)
    i = np.concatenate([coo.row, dup])
    j = np.concatenate([coo.col, dup])
    v = np.concatenate([coo.data, np.full(dup.size, 0.5)])
    perm = rng.permutation(i.size)
    B = sp.csr_matrix((v[perm], j[perm], np.searchsorted(np.sort(i[perm]), np.arange(n + 1))), shape=(n, n))
    order = np.argsort(i[perm], kind="stable")
    B = sp.csr_matrix((v[perm][order], j[perm][order], B.indptr), shape=(n, n))
    for M, dens in ((A, 0.6), (B, 0.6), (A, 0.95), (B, 0.95)):   # most entries dropped / kept
        r, c = rng.random(n) < dens, rng.random(n) < dens
        for diagonal in (None, 3.0):
            out = mask_rows_cols(M, r, c, diagonal=diagonal)
            d, ind, ptr = _mask_rows_cols_reference(M, r, c, diagonal)
            assert np.array_equal(out.indptr, ptr) and np.array_equal(out.indices, ind)
            assert np.array_equal(out.data, d)


@pytest.mark.parametrize("components", [1, 3])
def test_congruence_equals_full_product_for_nonsymmetric_matrix(components):
    m = Mesh.box([0] * 3, [1] * 3, [2] * 3).refine()
    m = m.refine(np.flatnonzero(m.points[m.cells].mean(1)[:, 0] < 0.3))
    s = Space(m, 1, components)
    A = assemble.mass(s) + assemble.convection(s, np.array([1.0, 0.5, -0.2]))
    K1 = (s.H.T @ A @ s.H).tocsr()
    K2 = congruence_with_constraints(A, s.H, np.flatnonzero(s.is_hanging))
    assert abs(K1 - K2).max() <= 1e-14 * abs(K1).max()


@pytest.mark.parametrize("dens", [0.97, 0.5])
def test_mask_rows_cols_blocks_and_drop_zeros(dens):
    """Matrices above the block size of the entry mask (block-wise column gather), with explicit
    zeros: ``drop_zeros=True`` equals masking and then ``eliminate_zeros()``, array for array;
    a canonical input gives an output flagged canonical (and really canonical)."""
    from adaptmg.fe import csr_ops
    rng = np.random.default_rng(7)
    n = 3000
    A = sp.random(n, n, density=0.05, format="csr", random_state=3) + sp.identity(n)
    A = sp.csr_matrix(A)
    A.data[rng.random(A.nnz) < 0.05] = 0.0                 # explicit zeros
    assert A.nnz > 2 * csr_ops._MASK_BLOCK
    A.has_canonical_format = True
    for rows_all in (False, True):
        r = np.ones(n, bool) if rows_all else rng.random(n) < dens
        c = rng.random(n) < dens
        for diagonal in (None, 3.0):
            if rows_all and diagonal is not None:
                continue
            ref = mask_rows_cols(A, r, c, diagonal=diagonal)
            d, ind, ptr = _mask_rows_cols_reference(A, r, c, diagonal)
            assert np.array_equal(ref.indptr, ptr) and np.array_equal(ref.indices, ind)
            assert np.array_equal(ref.data, d)
            ref.eliminate_zeros()
            out = mask_rows_cols(A, r, c, diagonal=diagonal, drop_zeros=True)
            assert np.array_equal(out.indptr, ref.indptr) and np.array_equal(out.indices, ref.indices)
            assert np.array_equal(out.data, ref.data)
            assert out.__dict__.get("_has_canonical_format") is True
            chk = sp.csr_matrix((out.data, out.indices, out.indptr), shape=out.shape)
            assert chk.has_canonical_format


@pytest.mark.gpu
def test_mask_rows_cols_on_the_device_equals_the_host():
    """A cupyx matrix is masked on the device: the host result's arrays (selection only, no
    arithmetic), with and without a row mask and drop_zeros, and with diagonal= where every
    removed row stores its diagonal entry (else a ValueError)."""
    from adaptmg.backend import get_backend, is_device_sparse, to_host
    gpu = get_backend("gpu")
    rng = np.random.default_rng(8)
    n = 3000
    A = sp.csr_matrix(sp.random(n, n, density=0.01, format="csr", random_state=4) + sp.identity(n))
    A.data[rng.random(A.nnz) < 0.05] = 0.0                 # explicit zeros
    A.has_canonical_format = True
    Ad = gpu.asmatrix(A)
    for r in (np.ones(n, bool), rng.random(n) < 0.7):
        c = rng.random(n) < 0.3
        for drop in (False, True):
            ref = mask_rows_cols(A, r, c, drop_zeros=drop)
            out = mask_rows_cols(Ad, r, c, drop_zeros=drop)
            assert is_device_sparse(out)
            out = to_host(out)
            for attr in ("indptr", "indices", "data"):
                assert np.array_equal(getattr(out, attr), getattr(ref, attr)), (attr, drop)
    # diagonal=: each removed row keeps its stored diagonal entry, set to the value (the host
    # result wherever a removed row stores its diagonal, as the identity here makes sure)
    for drop in (False, True):
        ref = mask_rows_cols(A, r, c | r, diagonal=2.5, drop_zeros=drop)
        out = to_host(mask_rows_cols(Ad, r, c | r, diagonal=2.5, drop_zeros=drop))
        for attr in ("indptr", "indices", "data"):
            assert np.array_equal(getattr(out, attr), getattr(ref, attr)), (attr, drop)
    B = sp.csr_matrix(sp.random(n, n, density=0.01, format="csr", random_state=5))
    B.setdiag(0.0)
    B.eliminate_zeros()                                     # no stored diagonal entry
    with pytest.raises(ValueError, match="diagonal"):
        mask_rows_cols(gpu.asmatrix(B), r, r, diagonal=1.0)


@pytest.mark.gpu
@pytest.mark.parametrize("components", [1, 3])
def test_congruence_on_the_device_equals_the_host(components):
    """H^T A H of a device matrix (hanging rows and columns only, no SpGEMM of the whole
    matrix) equals the host congruence to rounding, and so does the constrained matrix K of
    the device path, s on the diagonal of every non-free row."""
    from adaptmg.backend import get_backend, to_host
    from adaptmg.fe import Constraints
    gpu = get_backend("gpu")
    m = Mesh.box([0] * 3, [1] * 3, [2] * 3).refine()
    m = m.refine(np.flatnonzero(m.points[m.cells].mean(1)[:, 0] < 0.3))
    s = Space(m, 1, components)
    A = assemble.mass(s) + assemble.convection(s, np.array([1.0, 0.5, -0.2]))
    h = np.flatnonzero(s.is_hanging)
    K1 = congruence_with_constraints(A, s.H, h)
    K2 = to_host(congruence_with_constraints(gpu.asmatrix(A), s.H, h))
    assert abs(K1 - K2).max() <= 64 * np.finfo(float).eps * abs(K1).max()
    from adaptmg.fe.congruence import congruence_by_expansion, congruence_by_products
    for f in (congruence_by_expansion, congruence_by_products):   # both device paths
        K3 = to_host(f(gpu.asmatrix(A), s.H, h))
        assert abs(K1 - K3).max() <= 64 * np.finfo(float).eps * abs(K1).max(), f.__name__
        coo = K3.tocoo()                 # every hanging row keeps a stored (zero) diagonal entry
        assert np.all(np.isin(h, coo.row[coo.row == coo.col])), f.__name__
    cons = Constraints(s, s.boundary_dofs())
    Kh = cons.matrix(A)
    Kd = to_host(cons.matrix(gpu.asmatrix(A)))
    assert abs(Kh - Kd).max() <= 64 * np.finfo(float).eps * abs(Kh).max()
    assert np.array_equal(Kd.diagonal()[~cons.free], np.full((~cons.free).sum(), cons.scale))


def test_constraints_matrix_without_hanging_nodes_equals_products():
    """No hanging nodes: H = I, and K = Z A Z + s (I - Z) (no product formed) equals the
    product formula with an explicit identity H, array for array; with hanging nodes the
    general congruence still runs and agrees with the products."""
    from adaptmg.fe import Constraints
    for m in (Mesh.box([0, 0], [1, 1], [5, 4]).refine(), Mesh.box([0] * 3, [1] * 3, [2, 3, 2])):
        s = Space(m, 1)
        assert s.hanging_nodes.size == 0
        A = assemble.scalar_form(s, mass=1.0, diffusion=0.1, convection=np.full(m.dim, 0.3))
        cons = Constraints(s, s.boundary_dofs())
        K = cons.matrix(A)
        H = s.H
        assert (H != sp.identity(s.num_dofs)).nnz == 0 and H.has_canonical_format
        assert cons.project(A) is A                         # no product, no copy
        z = cons.free * 1.0
        B = (H.T @ A @ H).tocsr()
        sc = float(np.abs(B.diagonal()[cons.free]).mean())
        ref = (sp.diags(z) @ B @ sp.diags(z) + sp.diags(sc * (1 - z))).tocsr()
        ref.eliminate_zeros()
        ref.sort_indices()
        assert cons._scale == sc
        assert np.array_equal(K.indptr, ref.indptr) and np.array_equal(K.indices, ref.indices)
        assert np.array_equal(K.data, ref.data)
        assert K.has_canonical_format
    m = Mesh.box([0, 0], [1, 1], [4, 4]).refine()
    m = m.refine(np.flatnonzero(m.cell_vertices().mean(1)[:, 0] < 0.3))
    s = Space(m, 1)
    assert s.hanging_nodes.size > 0
    A = assemble.scalar_form(s, mass=1.0, diffusion=0.1, convection=np.array([0.3, -0.2]))
    cons = Constraints(s, s.boundary_dofs())
    K = cons.matrix(A)
    z = cons.free * 1.0
    B = (s.H.T @ A @ s.H).tocsr()
    ref = sp.diags(z) @ B @ sp.diags(z) + sp.diags(cons._scale * (1 - z))
    assert abs(K - ref).max() <= 1e-14 * abs(ref).max()


@pytest.mark.parametrize("how", ["expansion", "products"])
@pytest.mark.parametrize("dim,degree,components", [(2, 1, 1), (2, 2, 1), (3, 1, 1), (3, 1, 3), (3, 2, 1)])
def test_congruence_by_expansion_equals_the_products(dim, degree, components, how):
    """The device's congruences -- hanging entries expanded and rows spliced, or two products
    with H built from its hanging rows (explicit zero diagonal); run here with NumPy/SciPy --
    equal SciPy's products of the hanging part to rounding on 2:1 meshes with hanging nodes
    (non-symmetric A), their outputs are canonical, and the hanging rows keep a stored (zero)
    diagonal entry."""
    from adaptmg.fe import congruence as cg
    congruence_by_expansion = getattr(cg, f"congruence_by_{how}")
    m = Mesh.box([0] * dim, [1] * dim, [2] * dim).refine()
    m = m.refine(np.flatnonzero(m.points[m.cells].mean(1)[:, 0] < 0.3))
    m = m.refine(np.flatnonzero(np.linalg.norm(m.points[m.cells].mean(1) - 0.2, axis=1) < 0.2))
    s = Space(m, degree, components)
    h = np.flatnonzero(s.is_hanging)
    assert h.size
    A = assemble.mass(s) + assemble.convection(s, np.array([1.0, 0.5, -0.2])[:dim])
    ref = congruence_with_constraints(A, s.H, h)
    out = congruence_by_expansion(A, s.H, h)
    assert abs(ref - out).max() <= 16 * np.finfo(float).eps * abs(ref).max()
    chk = sp.csr_matrix((out.data, out.indices, out.indptr), shape=out.shape)
    assert chk.has_canonical_format
    if how == "products":     # SciPy's products drop zeros (cuSPARSE keeps them: the GPU test)
        return
    # the pattern: A's entries all kept (their union with the parents' couplings)
    assert (abs(sp.csr_matrix((np.ones(out.nnz), out.indices, out.indptr), shape=out.shape))
            - (abs(A) > 0)).min() >= 0
    assert np.all(out[h, h] == 0) and np.all(np.isin(h, chk.tocoo().row[chk.tocoo().row == chk.tocoo().col]))


def test_congruence_on_device_falls_back_to_the_expansion(monkeypatch):
    """congruence_on_device: the products while A is small enough; the expansion above
    SPGEMM_MAX_NNZ or when the products raise a device error (cuSPARSE out of resources);
    any other error is raised, not swallowed."""
    from adaptmg.fe import congruence as cg
    m = Mesh.box([0, 0], [1, 1], [2, 2]).refine()
    m = m.refine(np.flatnonzero(m.points[m.cells].mean(1)[:, 0] < 0.3))
    s = Space(m, 1)
    h = np.flatnonzero(s.is_hanging)
    A = assemble.stiffness(s)
    calls = []
    monkeypatch.setattr(cg, "congruence_by_expansion",
                        lambda *a: calls.append("expansion") or "E")
    monkeypatch.setattr(cg, "congruence_by_products", lambda *a: calls.append("products") or "P")
    assert cg.congruence_on_device(A, s.H, h) == "P"
    monkeypatch.setattr(cg, "SPGEMM_MAX_NNZ", A.nnz - 1)
    assert cg.congruence_on_device(A, s.H, h) == "E"
    monkeypatch.setattr(cg, "SPGEMM_MAX_NNZ", A.nnz)
    DeviceError = type("CuSparseError", (RuntimeError,), {"__module__": "cupy_backends.cuda.libs.cusparse"})

    def refuse(*a):
        calls.append("products")
        raise DeviceError("CUSPARSE_STATUS_INSUFFICIENT_RESOURCES")
    monkeypatch.setattr(cg, "congruence_by_products", refuse)
    assert cg.congruence_on_device(A, s.H, h) == "E"
    assert calls == ["products", "expansion", "products", "expansion"]

    def broken(*a):
        raise IndexError("a bug, not a device limit")
    monkeypatch.setattr(cg, "congruence_by_products", broken)
    with pytest.raises(IndexError, match="a bug"):
        cg.congruence_on_device(A, s.H, h)


def test_row_positions_find_each_rows_entry_or_none():
    """The vectorised per-row binary search finds (i, cols[i]) in sorted CSR rows exactly where
    a linear scan does, -1 where the row lacks it (empty rows, missing diagonals, first and last
    entries of rows)."""
    rng = np.random.default_rng(3)
    A = sp.random(300, 500, density=0.03, format="csr", random_state=rng)
    A = (sp.diags((np.arange(300) % 10 != 0).astype(float)) @ A).tocsr()   # every tenth row empty
    A.eliminate_zeros()
    A.sort_indices()
    cols = rng.integers(0, 500, 300)
    present = rng.random(300) < 0.6
    for i in np.flatnonzero(present):          # put some targets on first/last/middle entries
        row = A.indices[A.indptr[i]:A.indptr[i + 1]]
        if row.size:
            cols[i] = row[[0, -1, row.size // 2][i % 3]]
    pos = row_positions(np, A.indptr, A.indices, cols)
    want = np.full(300, -1)
    for i in range(300):
        hit = np.flatnonzero(A.indices[A.indptr[i]:A.indptr[i + 1]] == cols[i])
        if hit.size:
            want[i] = A.indptr[i] + hit[0]
    assert np.array_equal(pos, want)
    assert (want >= 0).sum() > 100 and (want < 0).sum() > 50 and (np.diff(A.indptr) == 0).any()


@pytest.mark.parametrize("shape", [(40, 40), (30, 45), (45, 30)])
def test_diagonal_by_search_equals_scipy(shape):
    """The search path of csr_diagonal (taken on the device past 2^30 entries) gives the
    stored diagonal, 0 where a row stores none, as SciPy does (the same values: copies)."""
    rng = np.random.default_rng(sum(shape))
    A = sp.random(*shape, density=0.2, format="csr", random_state=rng) + sp.eye(*shape, format="csr")
    A = A.tocsr()
    A.data[A.indices == np.repeat(np.arange(shape[0]), np.diff(A.indptr))] *= 3.0
    A = (sp.diags((np.arange(shape[0]) % 7 != 0).astype(float)) @ A).tocsr()   # some empty rows
    A.eliminate_zeros()
    A.sort_indices()
    d = diagonal_by_search(A)
    assert np.array_equal(d, A.diagonal()) and (d == 0).sum() >= min(shape) // 7 and (d != 0).sum() > 20
    assert np.array_equal(csr_diagonal(A), A.diagonal())      # host: SciPy's own


@pytest.mark.gpu
@pytest.mark.parametrize("order", ["sorted", "reversed"])
def test_device_diagonal_search_path_equals_cupyx(monkeypatch, order):
    """On the device the search path (forced here below its 2^30-entry threshold) gives SciPy's
    diagonal, and cupyx's on sorted rows (a matrix small enough for cupyx's 32-bit bisection);
    rows stored in reverse column order are sorted first."""
    from adaptmg.backend import get_backend
    from adaptmg.fe import csr_ops
    be = get_backend("gpu")
    A = (sp.random(500, 500, density=0.05, format="csr", random_state=np.random.default_rng(1))
         + sp.eye(500, format="csr")).tocsr()
    A.data[::5] = 0.0                                 # stored zeros stay stored zeros
    want = A.diagonal()
    if order == "reversed":                           # every row's entries in reverse order
        rows = np.repeat(np.arange(500), np.diff(A.indptr))
        rev = A.indptr[rows] + A.indptr[rows + 1] - 1 - np.arange(A.nnz)
        A = sp.csr_matrix((A.data[rev], A.indices[rev], A.indptr), shape=A.shape)
        A.has_sorted_indices = False
    Ad = be.sparse.csr_matrix(A)
    if order == "sorted":
        assert np.array_equal(be.xp.asnumpy(Ad.diagonal()), want)
    monkeypatch.setattr(csr_ops, "DIAGONAL_SEARCH_NNZ", 0)
    got = be.xp.asnumpy(csr_ops.csr_diagonal(Ad))
    assert np.array_equal(got, want) and (want == 0).sum() > 10
