"""The fast host paths of the distributed set-up give exactly what their plain definitions give.

Each fast path (top-down curve keys, bit-spread Morton codes, ...) is compared element for
element with a reference written the direct way on adaptive 2-D and 3-D meshes with
several refinement levels, hanging nodes and every mesh of their coarsening hierarchy.
"""
import numpy as np
import pytest

from adaptmg.distributed import curve_order
from adaptmg.distributed import partition as part
from adaptmg.mesh import Mesh


def _meshes(dim, steps, seed=0):
    """A randomly refined box (levels spread over ``steps`` + 1 values) and its hierarchy."""
    rng = np.random.default_rng(seed)
    m = Mesh.box([0.0] * dim, [2.0] + [1.0] * (dim - 1), [3] + [2] * (dim - 1))
    for _ in range(steps):
        m = m.refine(rng.random(m.num_cells) < 0.3)
    return m.hierarchy()


def _morton_bitwise(q):
    """Bit ``b`` of axis ``a`` to bit ``d b + a``, one bit at a time."""
    n, d = q.shape
    key = np.zeros(n, dtype=np.uint64)
    q = q.astype(np.uint64)
    for b in range(part._BITS[d]):
        for a in range(d):
            key |= ((q[:, a] >> np.uint64(b)) & np.uint64(1)) << np.uint64(d * b + a)
    return key


@pytest.mark.parametrize("dim", [2, 3])
def test_morton_bit_spread_equals_bitwise_interleave(dim):
    rng = np.random.default_rng(dim)
    q = rng.integers(0, 2 ** part._BITS[dim], size=(2000, dim)).astype(float)
    q[:3] = [[0] * dim, [2 ** part._BITS[dim] - 1] * dim, [1] + [0] * (dim - 1)]
    k = part._morton(q)
    assert np.array_equal(k, _morton_bitwise(q))
    assert k[1] == 2 ** (dim * part._BITS[dim]) - 1 and k[2] == 1


@pytest.mark.parametrize("dim,steps", [(2, 6), (3, 3)])
def test_curve_order_top_down_equals_walk(dim, steps):
    """The top-down keys give the permutation of the walk up the tree (its lexsort of the
    digits): on every mesh of an adaptive hierarchy, coarse meshes sharing the fine forest."""
    meshes = _meshes(dim, steps)
    assert meshes[-1].levels.max() - meshes[-1].levels.min() >= 2
    for m in meshes:
        keys = part._curve_keys(m)
        assert keys is not None and np.unique(keys).size == m.num_cells
        order = curve_order(m)
        assert np.array_equal(order, part._curve_order_walk(m))
        assert np.array_equal(np.sort(order), np.arange(m.num_cells))



@pytest.mark.parametrize("dim,steps", [(2, 6), (3, 3)])
def test_walk_kernel_keys_equal_the_top_down_keys(host_gpu, dim, steps):
    """The device's keys (adaptmg.device.curve_keys: one thread a cell walks up to its root),
    its CUDA source run on host threads, are the host's top-down keys, integer for integer, on
    every mesh of an adaptive hierarchy (coarse meshes of the fine forest, whose cells are not
    all of the deepest level)."""
    from adaptmg.device import curve_keys as CK
    CK._module.cache_clear()
    try:
        for m in _meshes(dim, steps):
            F = m._forest
            ids = m.cell_ids.astype(np.int64)
            roots = np.flatnonzero(F.cell_level == 0)
            rr = np.full(roots[-1] + 1, -1, dtype=np.int64)
            rr[roots] = part._root_ranks(F, roots)
            L = int(F.cell_level[ids].max())
            got = CK.walk_keys(host_gpu.xp, ids, F.cell_parent.astype(np.int64), F.cell_child0.astype(np.int64),
                               F.cell_level.astype(np.int16), rr, dim, L)
            assert np.array_equal(got, part._curve_keys(m))
    finally:
        CK._module.cache_clear()


@pytest.mark.gpu
@pytest.mark.parametrize("dim,steps", [(2, 6), (3, 3)])
def test_device_curve_order_equals_the_host_order(dim, steps):
    """A mesh on the GPU takes the walk kernel: the same keys and order as the host mesh."""
    for m in _meshes(dim, steps):
        dm = m.to("gpu")
        assert np.array_equal(part._curve_keys(dm).get(), part._curve_keys(m))
        assert np.array_equal(curve_order(dm).get(), curve_order(m))


@pytest.mark.parametrize("dim,degree,components", [(2, 2, 1), (3, 1, 3)])
def test_dof_owners_is_the_lowest_touching_rank(dim, degree, components):
    """Every DoF's owner is the minimum rank over the cells having its node (int64 reference
    scatter), its components share it, and a rank count beyond int16 keeps int64."""
    from adaptmg.distributed import dof_owners, partition_cells
    from adaptmg.fe import Space
    m = _meshes(dim, 2 if dim == 3 else 4, seed=3)[-1]
    space = Space(m, degree, components)
    cd = space.cell_dofs
    for ranks in (partition_cells(m, 3), partition_cells(m, 7) * 5000):
        ref = np.full(space.num_nodes, np.iinfo(np.int64).max)
        np.minimum.at(ref, cd.ravel(), np.repeat(ranks, cd.shape[1]))
        own = dof_owners(space, ranks)
        assert own.dtype == np.int64 and np.array_equal(own, np.repeat(ref, components))


@pytest.mark.parametrize("dim", [2, 3])
def test_transfer_rows_whole_and_per_cell_paths_are_identical(dim):
    """A rank's rows of P and R from the whole forest-path P equal those from its cells,
    array for array (indptr, indices and their dtypes, data), and the rows of the serial P."""
    from adaptmg.distributed import coarse_cell_ranks, dof_owners, partition_cells
    from adaptmg.distributed.local import WHOLE_P_SHARE, local_transfer_rows
    from adaptmg.fe import Constraints, Space
    from adaptmg.multilevel.transfer import prolongation
    meshes = _meshes(dim, 4 if dim == 2 else 2, seed=5)
    fine, coarse = Space(meshes[-1], 1), Space(meshes[-2], 1)
    assert fine.mesh.num_hanging_nodes and coarse.mesh.num_hanging_nodes
    ff = Constraints(fine, fine.boundary_dofs()).free
    cf = Constraints(coarse, coarse.boundary_dofs()).free
    P = prolongation(coarse, fine, cf, ff)
    for size in (2, 3):
        ranks = partition_cells(fine.mesh, size)
        of = dof_owners(fine, ranks)
        oc = dof_owners(coarse, coarse_cell_ranks(fine.mesh, coarse.mesh, ranks, size))
        for r in range(size):
            a = local_transfer_rows(coarse, fine, cf, ff, oc, of, r, whole=False)
            b = local_transfer_rows(coarse, fine, cf, ff, oc, of, r, whole=True)
            auto = local_transfer_rows(coarse, fine, cf, ff, oc, of, r)
            assert auto[2] == (b[2] if np.mean(of == r) >= WHOLE_P_SHARE else a[2])
            assert a[2] < b[2] == fine.mesh.num_cells
            for x, y in zip(a[:2], b[:2]):
                assert x.shape == y.shape and x.has_sorted_indices and y.has_sorted_indices
                for name in ("indptr", "indices", "data"):
                    u, v = getattr(x, name), getattr(y, name)
                    assert u.dtype == v.dtype and np.array_equal(u, v), name
            assert abs(a[0] - P[np.flatnonzero(of == r)]).max() == 0
            assert abs(a[1] - P.T.tocsr()[np.flatnonzero(oc == r)]).max() == 0
