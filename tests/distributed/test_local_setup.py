"""Per-rank set-up of the finest level (adaptmg.distributed.local), rank by rank without MPI:
each rank's rows of K, P and R from its own cells plus ghost layer equal the serial rows,
and the cells assembled per rank are about N/P plus a ghost layer."""
import numpy as np
import pytest
import scipy.sparse as sp

from adaptmg import assemble, multigrid
from adaptmg.distributed import dof_owners, partition_cells
from adaptmg.distributed.local import (CellSubset, local_constrained_rows, local_transfer_rows,
                                       needed_cells)
from adaptmg.distributed.partition import coarse_cell_ranks
from adaptmg.fe import Space
from adaptmg.mesh import Mesh


class RankOf:
    """Stands in for rank ``rank`` of ``size``; Allreduce returns the local value (only the
    Dirichlet row scale s goes through it, so only the non-free rows differ)."""

    def __init__(self, rank, size):
        self.rank, self.size = rank, size

    def Get_rank(self):
        return self.rank

    def Get_size(self):
        return self.size

    def Allreduce(self, a, out):
        out[...] = a


#: the serial reference hierarchy on the host with every level kept, on any machine (on a GPU
#: machine the default backend is the GPU, whose coarse_max_rows="auto" ends the hierarchy in a
#: direct solve of ~2000 rows and keeps fewer levels: ml.constraints[-2] would not exist)
_ALL_LEVELS = dict(backend="cpu", coarse_max_rows=None)


def _mesh(dim, L):
    m = Mesh.box([0] * dim, [1] * dim, [4 if dim == 2 else 2] * dim)
    for _ in range(L):
        m = m.refine()
    for j in range(2):
        c = m.points[m.cells].mean(1)
        m = m.refine(np.linalg.norm(c - 0.3, axis=1) < 0.25 / (j + 1))
    return m


def _layers(mesh, mask, k):
    for _ in range(k):
        nodes = np.zeros(mesh.num_nodes, dtype=bool)
        nodes[mesh.cells[mask]] = True
        mask = nodes[mesh.cells].any(axis=1)
    return mask


def _rel(a, b):
    d = sp.csr_matrix(a) - sp.csr_matrix(b)
    return float(abs(d).max() / abs(b).max()) if d.nnz else 0.0


@pytest.mark.parametrize("dim,L,degree", [(2, 3, 1), (3, 1, 2)], ids=["q1-2d", "q2-3d"])
@pytest.mark.parametrize("size", [2, 3])
def test_rank_rows_equal_serial_rows(dim, L, degree, size):
    """For every rank: its free rows of K = Z H^T A H Z + s (I - Z), its rows of P and its rows
    of R = P^T equal the serial hierarchy's to 1e-13 (measured: <= 5e-16), while it assembled
    only owned + ghost cells (within two vertex layers of its cells, fewer than all cells)."""
    space = Space(_mesh(dim, L), degree)
    ml = multigrid(space, assemble.stiffness, threads=1, max_coarse=None, **_ALL_LEVELS)
    K, P, R = ml.levels[-1].A, ml.levels[-1].P, ml.levels[-1].R
    cons, ccons = ml.constraints[-1], ml.constraints[-2]
    ranks = partition_cells(space.mesh, size)
    owner = dof_owners(space, ranks)
    coarse = ml.spaces[-2]
    cowner = dof_owners(coarse, coarse_cell_ranks(space.mesh, coarse.mesh, ranks, size))
    N = space.mesh.num_cells
    for r in range(size):
        rows = np.flatnonzero(owner == r)
        K_o, HT_o, cells = local_constrained_rows(space, assemble.stiffness, cons.free, owner, RankOf(r, size))
        fr = cons.free[rows]
        assert _rel(K_o[fr], K[rows[fr]]) <= 1e-13
        assert np.array_equal(K_o[~fr].indices, rows[~fr])       # non-free rows: s on the diagonal
        mine = ranks == r
        assert mine[cells].sum() == mine.sum() and cells.size < N
        assert not np.setdiff1d(cells, np.flatnonzero(_layers(space.mesh, mine, 2))).size
        P_o, R_o, _ = local_transfer_rows(coarse, space, ccons.free, cons.free, cowner, owner, r)
        assert _rel(P_o, P[rows]) <= 1e-13
        assert _rel(R_o, R[np.flatnonzero(cowner == r)]) <= 1e-13
        # the right-hand side rows Z H^T b
        b = assemble.load(space, 1.0)
        f = cons.rhs(b, ml.assembled)
        fo = HT_o @ b
        fo[~fr] = 0.0
        assert np.abs(fo - f[rows]).max() <= 1e-14 * np.abs(f).max()


@pytest.mark.parametrize("size", [2, 3])
def test_cells_assembled_per_rank_is_n_over_p_plus_ghosts(size):
    """Q1 on an adaptive 2-D mesh (2230 cells): every rank assembles its N/P cells plus a ghost
    layer -- at most 1.15 N/P (measured 1.07 N/P for P = 2, 1.11 N/P for P = 3), and all ranks
    together at most 1.1 N (the replicated set-up assembled P N)."""
    space = Space(_mesh(2, 3), 1)
    N = space.mesh.num_cells
    ranks = partition_cells(space.mesh, size)
    owner = dof_owners(space, ranks)
    counts = []
    for r in range(size):
        node_own = np.zeros(space.num_nodes, dtype=bool)
        node_own[np.flatnonzero(owner == r)] = True
        counts.append(needed_cells(space, node_own).size)
    assert max(counts) <= 1.15 * N / size, counts
    assert sum(counts) <= 1.1 * N, counts
    assert min(counts) >= np.bincount(ranks).min()


def test_ghost_layer_must_reach_hanging_nodes_with_owned_parents():
    """The cells touching owned DoFs alone are not enough: a hanging node owned elsewhere whose
    parent is owned brings its own cells' contributions into the owned row of H^T A H.  On
    this mesh some rank needs such cells, and without them its rows come out wrong."""
    space = Space(_mesh(3, 1), 1)
    ml = multigrid(space, assemble.stiffness, threads=1, max_coarse=None, **_ALL_LEVELS)
    K, H = ml.levels[-1].A, space.H
    free = ml.constraints[-1].free
    ranks = partition_cells(space.mesh, 3)
    owner = dof_owners(space, ranks)
    widened = 0
    worst = 0.0
    for r in range(3):
        own = owner == r
        naive = np.flatnonzero(own[space.cell_dofs].any(axis=1))
        full = needed_cells(space, own)
        assert np.isin(naive, full).all()
        if full.size == naive.size:
            continue
        widened += 1
        rows = np.flatnonzero(own & free)
        A = sp.csr_matrix(assemble.stiffness(CellSubset(space, naive)))
        B = (H.tocsc()[:, rows].T @ (A @ H)).tocsr()
        B = B[:, free]
        worst = max(worst, _rel(B, K[rows][:, free]))
    assert widened >= 1
    assert worst > 1e-3


def test_cell_subset_view_assembles_the_rows_it_covers():
    """assemble(CellSubset(space, all cells)) is assemble(space); on a subset, the rows of
    nodes inside it are complete."""
    space = Space(_mesh(2, 2), 2)
    A = assemble.stiffness(space)
    allv = assemble.stiffness(CellSubset(space, np.arange(space.mesh.num_cells)))
    assert _rel(allv, A) <= 1e-15
    cells = np.arange(space.mesh.num_cells // 2)
    sub = sp.csr_matrix(assemble.stiffness(CellSubset(space, cells)))
    inside = np.ones(space.num_nodes, dtype=bool)
    outside = np.setdiff1d(np.arange(space.mesh.num_cells), cells)
    inside[space.cell_dofs[outside]] = False
    rows = np.flatnonzero(inside)
    assert rows.size > 0 and _rel(sub[rows], A[rows]) <= 1e-14


@pytest.mark.parametrize("components", [1, 2])
def test_constraint_blocks_are_rows_of_ZHt_and_HZ(components):
    """constraint_blocks builds, from the hanging rows of H only, the owned rows of Z H^T and
    the rows ``dofs`` of H Z (other rows empty) -- equal to the products with the global H."""
    from adaptmg.distributed.local import constraint_blocks
    space = Space(_mesh(2, 2), 2, components)
    cons = multigrid(space, assemble.stiffness, threads=1, max_coarse=None, **_ALL_LEVELS).constraints[-1]
    H, Z = space.H, sp.diags(cons.free.astype(float))
    assert space.hanging_nodes.size and (~cons.free & ~space.is_hanging).any()
    owner = dof_owners(space, partition_cells(space.mesh, 3))
    rows = np.flatnonzero(owner == 1)
    dofs = np.flatnonzero(np.random.default_rng(0).random(space.num_dofs) < 0.4)
    HZT_o, HZ = constraint_blocks(space, rows, dofs, cons.free)
    assert _rel(HZT_o, (Z @ H.T).tocsr()[rows]) == 0.0
    want = sp.csr_matrix((H @ Z).tocsr()[dofs])
    assert _rel(HZ[dofs], want) == 0.0
    other = np.setdiff1d(np.arange(space.num_dofs), dofs)
    assert HZ[other].nnz == 0 and HZ.has_canonical_format


def test_rank_rows_built_on_the_stand_in_device_equal_the_host_rows(monkeypatch):
    """local_constrained_rows(backend="gpu") with tests/distributed/fake_cupy.py standing in for
    CuPy: the rows come back as a "device" matrix (the products and masking ran through the
    backend's modules) equal to the host rows to 1e-14, for every rank."""
    import adaptmg.backend as B
    import fake_cupy
    from adaptmg.backend import is_device_sparse, to_host
    monkeypatch.setattr(B, "_cupy_status", lambda: (fake_cupy.xp, fake_cupy.csp, ""))
    space = Space(_mesh(3, 1), 1)
    free = multigrid(space, assemble.stiffness, threads=1, max_coarse=None, **_ALL_LEVELS).constraints[-1].free
    owner = dof_owners(space, partition_cells(space.mesh, 3))
    for r in range(3):
        K_h, HT_h, cells_h = local_constrained_rows(space, assemble.stiffness, free, owner, RankOf(r, 3))
        K_d, HT_d, cells_d = local_constrained_rows(space, assemble.stiffness, free, owner, RankOf(r, 3),
                                                    backend="gpu")
        assert is_device_sparse(K_d) and not is_device_sparse(K_h)
        assert _rel(to_host(K_d), K_h) <= 1e-14 and np.array_equal(cells_d, cells_h)
        assert _rel(HT_d, HT_h) == 0.0


@pytest.mark.parametrize("backend", ["cpu", "gpu"], ids=["host", "stand_in_device"])
def test_rank_owning_only_dirichlet_rows_gets_s_on_its_diagonal(monkeypatch, backend):
    """A rank whose rows are all non-free (an empty Z H^T block: no product is formed, on the
    stand-in device neither) gets exactly ``s I`` on them, ``s`` the other ranks' mean."""
    import adaptmg.backend as B
    import fake_cupy
    from adaptmg.backend import is_device_sparse, to_host
    monkeypatch.setattr(B, "_cupy_status", lambda: (fake_cupy.xp, fake_cupy.csp, ""))
    space = Space(_mesh(2, 2), 1)
    free = multigrid(space, assemble.stiffness, threads=1, max_coarse=None, **_ALL_LEVELS).constraints[-1].free
    owner = np.zeros(space.num_dofs, dtype=np.int64)
    mine = np.flatnonzero(~free & ~space.is_hanging)[::3]
    owner[mine] = 1

    class Fixed(RankOf):
        def Allreduce(self, a, out):
            out[...] = [7.0, 2.0]                 # the other rank's sum and count: s = 3.5
    K, HT, _ = local_constrained_rows(space, assemble.stiffness, free, owner, Fixed(1, 2), backend=backend)
    assert is_device_sparse(K) == (backend == "gpu") and HT.nnz == 0
    K = to_host(K)
    assert np.array_equal(K.indices, mine) and np.array_equal(K.indptr, np.arange(mine.size + 1))
    assert np.all(K.data == 3.5)


@pytest.mark.gpu
def test_rank_rows_and_blocks_built_on_the_gpu_equal_the_host_ones(monkeypatch):
    """On a real device: every rank's rows of K assembled and constrained there (device
    element path -- forced for this small mesh --, cuSPARSE SpGEMMs) equal the host rows to
    1e-13, and DistCSR's split of the device rows (owned / ghost blocks, ghost columns) equals
    the host split."""
    import adaptmg.assemble.forms as forms
    from adaptmg.backend import CPU, get_backend, is_device_sparse, to_host
    from adaptmg.distributed.csr import Layout, _split
    be = get_backend("gpu")
    monkeypatch.setattr(forms, "MIN_DEVICE_ENTRIES", 0)
    space = Space(_mesh(3, 2), 1)
    free = multigrid(space, assemble.stiffness, threads=1, max_coarse=None, **_ALL_LEVELS).constraints[-1].free
    owner = dof_owners(space, partition_cells(space.mesh, 2))
    for r in range(2):
        comm = RankOf(r, 2)
        K_h, _, cells = local_constrained_rows(space, assemble.stiffness, free, owner, comm)
        K_d, _, _ = local_constrained_rows(space, assemble.stiffness, free, owner, comm, backend=be)
        assert is_device_sparse(K_d)
        assert _rel(to_host(K_d), K_h) <= 1e-13
        lay = Layout(owner, comm)
        oo_h, og_h, g_h, c_h = _split(CPU, K_h, lay, r)
        assert c_h[r] == 0 and c_h.sum() == g_h.size > 0
        assert np.array_equal(c_h, np.bincount(owner[g_h], minlength=2))
        # a host layout (ghost owners looked up on the host) and a device one (the keys sorted
        # on the device): the same ghosts, counts and blocks as the host split
        for cols in (lay, Layout(be.asarray(owner), comm)):
            oo_d, og_d, g_d, c_d = _split(be, K_d, cols, r)
            assert np.array_equal(g_h, g_d) and np.array_equal(c_h, c_d)
            assert _rel(to_host(oo_d), oo_h) <= 1e-13 and _rel(to_host(og_d), og_h) <= 1e-13


def _unit_rows_case(seed, dup=False, n=40, N=90):
    """Unit entries in some rows, distinct other entries off them (``dup``: one repeated)."""
    rng = np.random.default_rng(seed)
    ur = np.sort(rng.choice(n, n // 2, replace=False))
    uc = rng.choice(N, ur.size, replace=False)
    pos = np.unique(rng.integers(0, n, 120) * N + rng.integers(0, N, 120))
    unit = set((ur * N + uc).tolist())
    pos = np.array([p for p in pos if p not in unit])
    rng.shuffle(pos)
    hr, hc = np.divmod(pos, N)
    hv = rng.random(hr.size) + 0.5
    if dup:
        hr, hc, hv = np.r_[hr, hr[:1]], np.r_[hc, hc[:1]], np.r_[hv, 0.25]
    return (n, N), ur, uc, hr, hc, hv


def _unit_rows_want(shape, ur, uc, hr, hc, hv):
    M = sp.coo_matrix((np.r_[np.ones(ur.size), hv], (np.r_[ur, hr], np.r_[uc, hc])), shape=shape).tocsr()
    M.sum_duplicates()
    return M


@pytest.mark.parametrize("dup", [False, True])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_unit_rows_csr_is_the_coo_conversion(seed, dup):
    """The CSR written into place (unit entry between the row's smaller and larger columns)
    equals SciPy's COO -> CSR of the same entries, canonical; a repeated position is summed
    (the conversion's path); no entries at all give an empty matrix."""
    from adaptmg.backend import CPU
    from adaptmg.distributed.local import unit_rows_csr
    case = _unit_rows_case(seed, dup)
    M = unit_rows_csr(CPU, *case)
    want = _unit_rows_want(*case)
    assert M.has_canonical_format and M.shape == want.shape
    assert np.array_equal(M.indptr, want.indptr) and np.array_equal(M.indices, want.indices)
    assert np.array_equal(M.data, want.data)              # copies (a repeat: one sum, the same)
    z = np.zeros(0, dtype=np.int64)
    E = unit_rows_csr(CPU, (5, 7), z, z, z, z, np.zeros(0))
    assert E.shape == (5, 7) and E.nnz == 0 and np.array_equal(E.indptr, np.zeros(6))


@pytest.mark.gpu
@pytest.mark.parametrize("dup", [False, True])
def test_unit_rows_csr_on_the_device_equals_the_host(dup):
    from adaptmg.backend import CPU, get_backend, to_host
    from adaptmg.distributed.local import unit_rows_csr
    be = get_backend("gpu")
    case = _unit_rows_case(3, dup)
    M = unit_rows_csr(be, case[0], *[be.asarray(a) for a in case[1:]])
    H = unit_rows_csr(CPU, *case)
    Mh = to_host(M)
    assert np.array_equal(Mh.indptr, H.indptr) and np.array_equal(Mh.indices, H.indices)
    assert np.array_equal(Mh.data, H.data)
    z = be.xp.zeros(0, dtype=np.int64)
    assert unit_rows_csr(be, (5, 7), z, z, z, z, be.xp.zeros(0)).nnz == 0
