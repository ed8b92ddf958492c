"""The constrained matrix K = Z H^T A H Z + s (I - Z) by the two row kernels of
``adaptmg.device.congruence_rows``: their own CUDA source on host threads (g++, no GPU) and
on the GPU, against SciPy's products (the twin) and the Constraints' host path."""
import numpy as np
import pytest
import scipy.sparse as sp

import adaptmg.device.congruence_rows as CR
from adaptmg import Constraints, Mesh, Space, assemble

EPS = np.finfo(float).eps


def _ball(m, r, c=0.3):
    x = m.points[m.cells].mean(axis=1)
    return np.flatnonzero(np.linalg.norm(x - c, axis=1) < r)


def _problem(dim, q=1):
    """A (unconstrained stiffness), H, the free mask and the host K of an adaptive mesh with
    hanging nodes (2-D: two local refinements; 3-D: two fronts)."""
    if dim == 2:
        m = Mesh.box([0.0, 0.0], [1.0, 1.0], [3, 2]).refine()
        m = m.refine(_ball(m, 0.3))
        m = m.refine(_ball(m, 0.15))
    else:
        m = Mesh.box([0.0] * 3, [1.0] * 3, [2] * 3).refine()
        m = m.refine(_ball(m, 0.4))
        m = m.refine(_ball(m, 0.2))
    space = Space(m, q)
    cons = Constraints(space, space.boundary_dofs())
    A = assemble.stiffness(space).tocsr()
    A.sum_duplicates()
    assert space.hanging_nodes.size > 0
    return A, sp.csr_matrix(space.H), cons.free, cons.matrix(A), cons.scale


def _int32(M):
    M = sp.csr_matrix(M)
    return (M.indptr.astype(np.int32), M.indices.astype(np.int32), M.data.astype(np.float64))


def _check(K, s, K_ref, s_ref):
    """Same pattern and entries to rounding (sums in another order), same row scale."""
    assert abs(s - s_ref) <= 8 * EPS * s_ref
    K, K_ref = sp.csr_matrix(K), sp.csr_matrix(K_ref)
    inside = np.ones(max(K.nnz - 1, 0), dtype=bool)            # canonical: columns strictly
    b = K.indptr[1:-1] - 1                                      # increasing inside every row
    inside[b[(b >= 0) & (b < inside.size)]] = False
    assert np.all(np.diff(K.indices)[inside] > 0)
    Kd, Rd = K.toarray(), K_ref.toarray()                   # small problems: dense
    scale = np.abs(Rd).max()
    assert np.abs(Kd - Rd).max() <= 64 * EPS * scale
    # an entry stored on one side only is round-off sized (a sum that cancels)
    only = (Kd != 0) != (Rd != 0)
    assert np.abs(Kd + Rd)[only].max(initial=0.0) <= 64 * EPS * scale
    assert K.nnz >= 0.999 * K_ref.nnz


@pytest.mark.parametrize("dim, q", [(2, 1), (3, 1), (2, 2)])
def test_twin_equals_the_constraints_host_path(dim, q):
    A, H, free, K_ref, s_ref = _problem(dim, q)
    K, s = CR.twin(A, H, free)
    _check(K, s, K_ref, s_ref)


class _HostXP:
    """tests/host_cuda.py's host stand-in for CuPy's RawModule, with NumPy for the rest."""

    def __init__(self, inner):
        self.inner = inner

    def RawModule(self, code):
        return self.inner.RawModule(code)

    empty = staticmethod(lambda shape, dtype: np.full(shape, -7, dtype=dtype))

    def __getattr__(self, name):
        return getattr(np, name)


@pytest.mark.parametrize("dim, q, cap", [(2, 1, 64), (3, 1, 64), (2, 2, 64), (2, 2, 6), (3, 1, 12)])
def test_row_kernels_on_host_threads(host_gpu, monkeypatch, dim, q, cap):
    """cap: the columns a row keeps in shared memory (the kernels' 64, or fewer: the rows past
    it take the term-by-term path)."""
    A, H, free, K_ref, s_ref = _problem(dim, q)
    if cap != 64:
        assert np.diff(K_ref.indptr).max() > cap                 # some rows take the other path
        monkeypatch.setattr(CR, "_SRC", CR._SRC.replace("#define ADAPTMG_CONG_CAP 64",
                                                        f"#define ADAPTMG_CONG_CAP {cap}"))
    xp = _HostXP(host_gpu.xp)
    CR._module.cache_clear()
    try:
        ptr, col, val, s = CR.kernel_rows(xp, _int32(A), _int32(H), _int32(H.T.tocsr()), free)
    finally:
        CR._module.cache_clear()
    K = sp.csr_matrix((val, col, ptr), shape=A.shape)
    _check(K, s, K_ref, s_ref)


def _some_rows(free, seed=0):
    """Sorted distinct rows: a third of the DoFs, fixed and hanging ones among them."""
    rng = np.random.default_rng(seed)
    rows = np.flatnonzero(rng.random(free.size) < 0.35)
    assert (~free[rows]).any() and free[rows].any()
    return rows


def _rows_problem(dim, q=1):
    """:func:`_problem` with :func:`_some_rows` and H^T's rows of them, Z-masked as
    adaptmg.distributed passes them."""
    A, H, free, K_ref, s_ref = _problem(dim, q)
    rows = _some_rows(free)
    return A, H, free, K_ref, s_ref, rows, sp.csr_matrix(H.T.tocsr()[rows].multiply(free[rows][:, None]))


def _dev(M):
    """A host sparse matrix as cupyx CSR."""
    import cupyx.scipy.sparse as csp
    return csp.csr_matrix(sp.csr_matrix(M))


def _set_cap(monkeypatch, cap):
    """The kernels' column slots a row set to ``cap`` (64: the source as it is)."""
    if cap != 64:
        monkeypatch.setattr(CR, "_SRC", CR._SRC.replace("#define ADAPTMG_CONG_CAP 64",
                                                        f"#define ADAPTMG_CONG_CAP {cap}"))


def _check_rows(K, s, d, m, rows, free, K_ref, s_ref):
    """Rows ``rows`` of K_ref with the scale the callback returned (s_ref), and the callback given
    the sum of |B_pp| over the free rows among them and their number."""
    assert s == s_ref
    assert m == int(free[rows].sum())
    d_ref = np.abs(K_ref.diagonal()[rows][free[rows]]).sum()
    assert abs(d - d_ref) <= 64 * EPS * d_ref
    _check(K, s, K_ref[rows], s_ref)


@pytest.mark.parametrize("dim, q, cap", [(2, 1, 64), (3, 1, 64), (2, 2, 6)])
def test_chosen_rows_on_host_threads(host_gpu, monkeypatch, dim, q, cap):
    """Only some rows (a rank's owned rows): H^T's rows of them alone, Z-masked as
    adaptmg.distributed passes them, and the row scale from the caller's reduction."""
    A, H, free, K_ref, s_ref, rows, HT = _rows_problem(dim, q)
    _set_cap(monkeypatch, cap)
    got = []
    xp = _HostXP(host_gpu.xp)
    CR._module.cache_clear()
    try:
        ptr, col, val, s = CR.kernel_rows(xp, _int32(A), _int32(H), _int32(HT), free, rows=rows,
                                          scale=lambda d, m: got.append((d, m)) or s_ref)
    finally:
        CR._module.cache_clear()
    K = sp.csr_matrix((val, col, ptr), shape=(rows.size, A.shape[0]))
    _check_rows(K, s, *got[0], rows, free, K_ref, s_ref)
    got.clear()                                          # the twin: the same rows and sums
    K, s = CR.twin(A, H, free, rows=rows, scale=lambda d, m: got.append((d, m)) or s_ref)
    _check_rows(K, s, *got[0], rows, free, K_ref, s_ref)


@pytest.mark.parametrize("dim", [2, 3])
def test_a_rectangular_expansion_on_host_threads(host_gpu, dim):
    """H as an expansion E (n x k) into the k unknowns its columns reach (how the distributed
    forest passes a rank's local nodes into the global ones): K is k x k, the rows and columns
    of K_ref at those unknowns; a non-free row the single entry of the caller's scale."""
    A, H, free, K_ref, s_ref = _problem(dim)
    cols = np.unique(H.indices)
    assert cols.size < H.shape[1]                      # hanging nodes are no column
    E = sp.csr_matrix(H[:, cols])
    z = free[cols]
    xp = _HostXP(host_gpu.xp)
    CR._module.cache_clear()
    try:
        ptr, col, val, s = CR.kernel_rows(xp, _int32(A), _int32(E), _int32(E.T.tocsr()), z,
                                          scale=lambda d, m: s_ref)
    finally:
        CR._module.cache_clear()
    K = sp.csr_matrix((val, col, ptr), shape=(cols.size, cols.size))
    _check(K, s, K_ref[cols][:, cols], s_ref)
    K2, _ = CR.twin(A, E, z, scale=lambda d, m: s_ref)
    _check(K2, s, K_ref[cols][:, cols], s_ref)


def test_host_arrays_take_the_twin_and_a_wrong_mask_is_refused():
    A, H, free, K_ref, s_ref = _problem(2)
    K, s = CR.constrained_congruence(A, H, H.T.tocsr(), free)       # host arrays: the twin
    _check(K, s, K_ref, s_ref)
    with pytest.raises(ValueError, match="free mask has shape"):
        CR.constrained_congruence(A, H, H.T.tocsr(), free[:-1])
    rows = _some_rows(free)
    with pytest.raises(ValueError, match="H\\^T has shape"):        # all rows of H^T for some rows
        CR.constrained_congruence(A, H, H.T.tocsr(), free, rows=rows)


@pytest.mark.gpu
@pytest.mark.parametrize("dim, q", [(2, 1), (3, 1), (2, 2)])
def test_on_the_device_equals_the_host(dim, q):
    A, H, free, K_ref, s_ref = _problem(dim, q)
    import cupy as cp
    K, s = CR.constrained_congruence(_dev(A), _dev(H), _dev(H.T.tocsr()), cp.asarray(free))
    assert K.has_canonical_format
    _check(K.get(), s, K_ref, s_ref)
    with pytest.raises(ValueError, match="float64 with int32"):
        CR.constrained_congruence(_dev(A).astype(np.float32), _dev(H), _dev(H.T.tocsr()), cp.asarray(free))


@pytest.mark.gpu
@pytest.mark.parametrize("dim, q", [(2, 1), (3, 1)])
def test_chosen_rows_on_the_device(dim, q):
    import cupy as cp
    A, H, free, K_ref, s_ref, rows, HT = _rows_problem(dim, q)
    got = []
    K, s = CR.constrained_congruence(_dev(A), _dev(H), _dev(HT), cp.asarray(free), rows=cp.asarray(rows),
                                     scale=lambda d, m: got.append((d, m)) or s_ref)
    assert K.has_canonical_format and K.shape == (rows.size, A.shape[0])
    _check_rows(K.get(), s, *got[0], rows, free, K_ref, s_ref)


@pytest.mark.gpu
def test_a_rectangular_expansion_on_the_device():
    import cupy as cp
    A, H, free, K_ref, s_ref = _problem(3)
    cols = np.unique(H.indices)
    E = sp.csr_matrix(H[:, cols])
    K, s = CR.constrained_congruence(_dev(A), _dev(E), _dev(E.T.tocsr()), cp.asarray(free[cols]),
                                     scale=lambda d, m: s_ref)
    assert K.shape == (cols.size, cols.size)
    _check(K.get(), s, K_ref[cols][:, cols], s_ref)


def _local_table(n, rows, seed=1):
    """A rank's local column table: the owned columns (the asked rows and a random half of the
    others) numbered in increasing order, -1 for the rest (the ghosts)."""
    rng = np.random.default_rng(seed)
    own = rng.random(n) < 0.5
    own[rows] = True
    local = np.full(n, -1, dtype=np.int32)
    local[own] = np.arange(int(own.sum()), dtype=np.int32)
    return local


def _same_parts(got, want, units=0):
    """The split of the same rows: the row pointers and columns exactly, the values exactly
    (``units`` 0: the same sums in the same order, moved) or within ``units`` eps of the
    largest (two kernels compiled apart, whose compiler may contract the sums differently)."""
    for i, (g, w) in enumerate(zip(got, want)):
        g = np.asarray(g.get() if hasattr(g, "get") else g)
        assert g.shape == w.shape
        if i in (2, 5) and units:
            assert np.abs(g - w).max(initial=0.0) <= units * EPS * np.abs(w).max(initial=0.0)
        else:
            assert np.array_equal(g, w)


@pytest.mark.parametrize("dim, q, cap", [(2, 1, 64), (3, 1, 64), (2, 2, 6), (3, 1, 12)])
def test_split_fill_on_host_threads_is_the_split_of_the_rows(host_gpu, monkeypatch, dim, q, cap):
    """The split kernels write the owned (local columns) and ghost (global columns) parts of
    the rows the plain kernels write, each part of a row sorted -- exactly what
    ``owned_ghost_rows`` makes of them, the row pointers and the row scale too; also the rows
    past ``cap`` columns, which sort their parts after the term-by-term path."""
    from adaptmg.device.index_kernels import owned_ghost_rows
    A, H, free, K_ref, s_ref, rows, HT = _rows_problem(dim, q)
    local = _local_table(A.shape[0], rows)
    _set_cap(monkeypatch, cap)
    xp = _HostXP(host_gpu.xp)
    CR._module.cache_clear()
    try:
        ptr, col, val, s = CR.kernel_rows(xp, _int32(A), _int32(H), _int32(HT), free, rows=rows,
                                          scale=lambda d, m: s_ref)
        parts, s2 = CR.kernel_split_rows(xp, _int32(A), _int32(H), _int32(HT), free, local, rows=rows,
                                         scale=lambda d, m: s_ref)
    finally:
        CR._module.cache_clear()
    assert s2 == s == s_ref
    if cap != 64:
        assert np.diff(ptr).max() > cap                        # some rows took the other path
    want = owned_ghost_rows(ptr, col, val, local)
    assert want[3][-1] > 0 and want[0][-1] > 0                 # ghosts and owned entries
    _same_parts(parts, want)


def test_split_rows_on_the_host_are_the_split_twin_and_bad_tables_are_refused():
    from adaptmg.device.index_kernels import owned_ghost_rows
    A, H, free, K_ref, s_ref, rows, HT = _rows_problem(2)
    local = _local_table(A.shape[0], rows)
    parts, s = CR.constrained_split_rows(A, H, HT, free, local, rows=rows, scale=lambda d, m: s_ref)
    K, _ = CR.twin(A, H, free, rows=rows, scale=lambda d, m: s_ref)
    _same_parts(parts, owned_ghost_rows(K.indptr, K.indices, K.data, local))
    with pytest.raises(ValueError, match="local table has shape"):
        CR.constrained_split_rows(A, H, HT, free, local[:-1], rows=rows)


@pytest.mark.gpu
@pytest.mark.parametrize("dim, q", [(2, 1), (3, 1)])
def test_split_rows_on_the_device_are_the_split_of_the_rows(dim, q):
    import cupy as cp
    from adaptmg.device.index_kernels import owned_ghost_rows
    A, H, free, K_ref, s_ref, rows, HT = _rows_problem(dim, q)
    local = _local_table(A.shape[0], rows)
    args = (_dev(A), _dev(H), _dev(HT), cp.asarray(free))
    K, _ = CR.constrained_congruence(*args, rows=cp.asarray(rows), scale=lambda d, m: s_ref)
    parts, s = CR.constrained_split_rows(*args, cp.asarray(local), rows=cp.asarray(rows),
                                         scale=lambda d, m: s_ref)
    K = K.get()
    _same_parts(parts, owned_ghost_rows(K.indptr.astype(np.int64), K.indices, K.data, local), units=8)
    with pytest.raises(ValueError, match="int32 local table"):
        CR.constrained_split_rows(*args, cp.asarray(local, dtype=np.int64), rows=cp.asarray(rows))
