"""The distributed forest (issue 37 item 3): owned leaves + one ghost layer per rank.

``forest_cases.py`` runs under ``mpiexec -n 1 / 2 / 3`` (one launch each, ~2-4 s): 2-D and
3-D boxes refined uniformly, locally (a callable of the centres) and locally on rank 0 only
near its cut (the 2:1 closure then refines cells of the other ranks), two meshes of data/
(unstructured, cells of several orientations) refined uniformly and locally, each compared with the
serial :class:`Mesh` of the same refinements after the refinements, after a repartition and
after a weighted repartition: (a) the gathered owned leaves (keys, vertex coordinates) equal
the serial mesh's; (b) global node ids: one id per point, as many as the serial mesh has
nodes, owned by the lowest rank touching them, each rank's ids one block; (c) hanging nodes
and their parents (points and global ids) equal the serial mesh's; (d) every rank's ghosts
are exactly the leaves owned elsewhere sharing a vertex with its owned leaves -- and the
same for the two coarser levels of global coarsening (``coarsen_once`` against
:meth:`Mesh.coarsen_once`, from a cut inside families); (e) local leaves per rank ~ n / P +
ghosts; (f) repartition balances to +-1.
Coordinates are compared exactly: the local forests compute every node as the serial forest
does (the mean of the same parents; in the same order on these meshes).
"""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from adaptmg.distributed.cellkeys import KeyCodec, build_local, forest_keys, root_positions
from adaptmg.distributed.forest import DistributedForest
from adaptmg.distributed.forest_cells import _StayingLevels, _group_pairs
from adaptmg.distributed.partition import curve_order
from adaptmg.mesh import Mesh

from test_mpi import MPIEXEC, ROOT, mpiexec_cmd, needs_mpi

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "forest_cases.py")
CASES = ["uniform-2d", "uniform-3d", "local-2d", "local-3d", "one-rank-2d", "one-rank-3d", "imported-2d",
         "imported-3d"]
STAGES = ["refined", "repartitioned", "coarsened-1", "coarsened-2", "weighted"]
ZERO = ["keys_differ", "not_contiguous", "first_wrong", "nodes_not_in_serial", "ids_with_two_points",
        "points_with_two_ids", "distinct_ids_minus_serial", "nglob_minus_serial", "ids_outside_range",
        "ghost_ids_inconsistent", "hanging_differ", "hanging_parents_differ", "hanging_parent_ids_differ",
        "ghost_layers_differ", "node_owners_differ", "owner_blocks_not_contiguous"]


def worker_records(worker, P, tmp_dir):
    """Run ``worker OUT.json`` under ``mpiexec -n P`` (one thread a rank; this folder on the
    path, for the workers' shared helpers) and return its JSON records by (case, stage)."""
    if MPIEXEC is None:
        pytest.skip("mpi4py or mpiexec not available")
    out = tmp_dir / "out.json"
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", ADAPTMG_THREADS="1",
               PYTHONPATH=os.pathsep.join([ROOT, HERE, os.environ.get("PYTHONPATH", "")]))
    r = subprocess.run(mpiexec_cmd(P) + [sys.executable, worker, str(out)], env=env,
                       capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    return {(rec["case"], rec["stage"]): rec for rec in json.loads(out.read_text())}


@pytest.fixture(scope="module", params=[1, 2, 3], ids=["np1", "np2", "np3"])
def forest_results(request, tmp_path_factory):
    return request.param, worker_records(WORKER, request.param, tmp_path_factory.mktemp("forest"))


@needs_mpi
@pytest.mark.parametrize("stage", STAGES)
@pytest.mark.parametrize("case", CASES)
def test_distributed_forest_equals_serial_mesh(forest_results, case, stage):
    """(a)-(d) on every rank count: no mismatch, vertex coordinates identical."""
    P, recs = forest_results
    rec = recs[(case, stage)]
    assert rec["P"] == P
    assert {k: rec[k] for k in ZERO} == {k: 0 for k in ZERO}, rec
    assert rec["cell_coords_max_diff"] == 0.0
    assert sum(rec["owned"]) == rec["serial_cells"]
    if not case.startswith("uniform") and not stage.startswith("coarsened"):
        assert rec["serial_hanging"] >= 20         # hanging nodes were compared
    if P > 1:
        assert all(loc > own for loc, own in zip(rec["local"], rec["owned"]))   # ghosts exist


@needs_mpi
@pytest.mark.parametrize("case", ["one-rank-2d", "one-rank-3d"])
def test_closure_refines_cells_of_other_ranks(forest_results, case):
    """Marked on rank 0 only; the serial closure reaches cells the other ranks own, and the
    distributed forest still equals the serial mesh (above)."""
    P, recs = forest_results
    if P == 1:
        pytest.skip("one rank")
    assert recs[(case, "refined")]["closure_on_other_ranks"] >= 1


@needs_mpi
def test_coarsening_met_families_cut_between_ranks(forest_results):
    """The coarsened levels above were compared after cuts inside families (some family's
    children on two ranks), so the cross-rank family logic ran."""
    P, recs = forest_results
    split = sum(recs[(c, s)]["split_families"] for c in CASES for s in ("coarsened-1", "coarsened-2"))
    assert (split > 0) == (P > 1)


@needs_mpi
def test_coarsening_blocked_family_cut_between_ranks(forest_results):
    """A cut (weighted repartition) inside a family the 2:1 rule blocks, the blocking children
    on one rank only: the coarsened level still equals the serial one."""
    P, recs = forest_results
    if P == 1:
        pytest.skip("one rank")
    rec = recs[("blocked-cut-3d", "coarsened")]
    assert rec["split_blocked"] >= 1
    assert {k: rec[k] for k in ZERO} == {k: 0 for k in ZERO}, rec


@needs_mpi
@pytest.mark.parametrize("case", CASES)
def test_repartition_balances(forest_results, case):
    """(f) counts to +-1 after repartition(); with weights, each rank's weight sum within one
    cell's weight of total / P."""
    P, recs = forest_results
    own = recs[(case, "repartitioned")]["owned"]
    assert max(own) - min(own) <= 1
    w = recs[(case, "weighted")]
    assert np.abs(np.array(w["weight_sums"]) - w["weight_total"] / P).max() <= w["max_weight"] * (1 + 1e-12)


@needs_mpi
def test_local_cells_scale_with_the_rank_share(forest_results):
    """(e) a 16^3 box refined from 2^3 roots: every rank holds its share plus a ghost layer
    (P = 2: 2304 = 2048 + 256 local leaves of 4096), never the whole mesh; its local forest
    (leaves, ancestors and their siblings) about 0.64 of the serial forest's cells."""
    P, recs = forest_results
    rec = recs[("size-16^3", "uniform")]
    n = rec["n"]
    assert n == 4096 and sum(rec["owned"]) == n
    for own, loc, fc in zip(rec["owned"], rec["local"], rec["forest"]):
        assert own <= -(-n // P) + 512             # the box's 8 roots: cut at root granularity +-
        if P > 1:
            assert loc < (0.6 if P == 2 else 0.5) * n
            assert fc < 0.7 * 4680                 # the serial forest: 4096 leaves + 584 ancestors


# ---------------------------------------------------------------------- in-process, no MPI
def _adaptive(dim):
    box = Mesh.box([0] * dim, [1] * dim, [3, 2, 2][:dim])
    m = box.refine()
    for r in (0.3, 0.15):
        c = m.points[m.cells].mean(1)
        m = m.refine(np.linalg.norm(c - 0.3, axis=1) < r)
    return box, m


@pytest.mark.parametrize("dim", [2, 3])
def test_keys_sort_along_the_curve_and_rebuild_the_mesh(dim):
    """Leaf keys sort in partition.curve_order; build_local from the keys alone gives the same
    leaves with the same vertex coordinates and hanging nodes."""
    box, m = _adaptive(dim)
    codec = KeyCodec(dim, box.num_cells)
    rp = root_positions(box._forest)
    k = forest_keys(m._forest, codec, rp)[m.cell_ids]
    assert np.array_equal(np.argsort(k), curve_order(m))
    lm, fkey = build_local(box._forest, codec, rp, k[::-1])
    k2 = fkey[lm.cell_ids]
    o1, o2 = np.argsort(k), np.argsort(k2)
    assert np.array_equal(k[o1], k2[o2])
    assert np.array_equal(m.points[m.cells][o1], lm.points[lm.cells][o2])
    assert lm.num_nodes == m.num_nodes and lm.num_hanging_nodes == m.num_hanging_nodes > 0
    # codec: parent/child round trip
    lev = codec.level(k)
    deep = k[lev == lev.max()]
    anc = codec.ancestor(deep, int(lev.max()) - 1)
    assert np.isin(deep, codec.children(np.unique(anc))).all()


def test_build_local_of_no_keys_is_an_empty_mesh():
    """A rank idle on a folded level: no leaves, an empty local mesh (no cells, no nodes)."""
    box, _ = _adaptive(2)
    m, fkey = build_local(box._forest, KeyCodec(2, box.num_cells), root_positions(box._forest),
                          np.zeros(0, dtype=np.int64))
    assert m.num_cells == m.num_nodes == fkey.size == 0 and m.cells.shape == (0, 4)


def test_build_local_rejects_nested_keys():
    box, m = _adaptive(2)
    codec = KeyCodec(2, box.num_cells)
    rp = root_positions(box._forest)
    k = forest_keys(m._forest, codec, rp)[m.cell_ids]
    with pytest.raises(ValueError, match="not the leaves"):
        build_local(box._forest, codec, rp, np.append(k, codec.ancestor(k[-1], 0)))


def test_one_rank_forest_and_bad_input():
    """comm=None: COMM_WORLD of one rank (or the serial stand-in); errors name the problem."""
    df = DistributedForest.box([0, 0], [1, 1], [2, 2]).refine().refine(lambda x: x[:, 0] < 0.3)
    serial = Mesh.box([0, 0], [1, 1], [2, 2]).refine()
    serial = serial.refine(serial.points[serial.cells].mean(1)[:, 0] < 0.3)
    assert df.num_owned == df.global_num_cells == serial.num_cells and df.num_ghosts == 0
    assert df.num_global_nodes == serial.num_nodes
    assert df.hanging[0].size == serial.num_hanging_nodes > 0
    with pytest.raises(ValueError, match="boolean mask over the 28 owned leaves"):
        df.refine(np.ones(3, dtype=bool))
    with pytest.raises(ValueError, match="unrefined mesh"):
        DistributedForest.from_coarse(serial)
    with pytest.raises(TypeError, match="adaptmg Mesh"):
        DistributedForest.from_coarse("mesh")
    with pytest.raises(ValueError, match="weights must be"):
        df.repartition(weights=-np.ones(df.num_owned))
    for bad in (0, 2):                                   # ranks outside 1..P (P = 1)
        with pytest.raises(ValueError, match="ranks must be in 1..1"):
            df.repartition(ranks=bad)
    assert df.repartition(ranks=1) is df
    with pytest.raises(ValueError, match="levels"):
        KeyCodec(3, 2 ** 58)


def test_group_pairs_is_the_cross_product_of_each_group():
    g = np.array([0, 0, 1, 3, 3, 3])
    i, j = _group_pairs(g)
    got = sorted(zip(i.tolist(), j.tolist()))
    want = sorted((a, b) for a in range(6) for b in range(6) if g[a] == g[b])
    assert got == want


def test_moved_arrays_are_kept_until_released():
    """The arrays a level moves to its backend (owned cells, owned nodes, node ids, keys) are
    moved once and kept; ``release_device(name)`` drops only that one, ``release_device()``
    all of them and the local spaces."""
    from adaptmg.backend import CPU
    df = DistributedForest.box([0, 0], [1, 1], [2, 2]).refine().refine(lambda x: x[:, 0] < 0.3)
    np.testing.assert_array_equal(df.owned_nodes_on(CPU), df.owned_nodes)
    np.testing.assert_array_equal(df._moved("owned_keys", CPU), df.owned_keys)
    df.owned_cells_on(CPU)
    df.local_space(CPU)
    cache = df.__dict__["_owned_on"]
    assert set(cache) == {("owned_nodes", "cpu"), ("owned_keys", "cpu"), ("owned_cells", "cpu")}
    df.release_device("owned_keys")
    assert set(cache) == {("owned_nodes", "cpu"), ("owned_cells", "cpu")} and "_spaces" in df.__dict__
    df.release_device()
    assert "_owned_on" not in df.__dict__ and "_spaces" not in df.__dict__


@pytest.mark.parametrize("share", [0.6, 0.95])
@pytest.mark.parametrize("dim", [2, 3])
def test_staying_levels_equal_touch_max_round_by_round(dim, share):
    """Global coarsening's incremental blocking test (:class:`_StayingLevels`) against
    :meth:`Mesh.touch_max` over every cell, round by round, as the staying cells grow: a
    candidate (level ``l``) is bad iff a staying cell touching it has a level >= ``l + 1``.
    Random graded meshes, random candidates (``share`` of the cells: the first round's
    sources many or few); after each round the bad ones (as their blocked families do) and
    some random others stay."""
    rng = np.random.default_rng(7 + dim)
    m = Mesh.box([0] * dim, [1] * dim, [2] * dim).refine()
    for _ in range(3 if dim == 2 else 2):
        m = m.refine(rng.random(m.num_cells) < 0.3)
    lv = m.levels
    assert np.ptp(lv) >= 2
    cand = rng.random(m.num_cells) < share
    stay = ~cand
    st = _StayingLevels(m._active_cell_nodes(), m._forest.num_nodes, lv, cand)
    new, found = stay.copy(), 0
    for _ in range(4):
        got = st.add(new, cand)
        want = np.flatnonzero(cand & (m.touch_max(np.where(stay, lv, -1)) >= lv + 1))
        np.testing.assert_array_equal(np.sort(got), want)
        found += want.size
        new = cand & (rng.random(m.num_cells) < 0.05)   # the bad ones and some others stay
        new[want] = True
        cand, stay = cand & ~new, stay | new
    assert found > 0


def _device_split_check(dim, be, monkeypatch):
    from adaptmg.mesh._tree import Forest
    df = DistributedForest.box([0] * dim, [1] * dim, [2] * dim).refine().refine(lambda x: x[:, 0] < 0.4)
    c = df.centres()
    marks = np.linalg.norm(c - 0.3, axis=1) < 0.3
    host = df.refine(marks)
    dev = df.refine(marks, backend=be)
    assert dev.mesh.backend.name == "cpu"
    np.testing.assert_array_equal(dev.keys, host.keys)
    np.testing.assert_array_equal(dev.owner, host.owner)
    Fh, Fd = host.mesh._forest, dev.mesh._forest
    for name in ("X", "node_par", "node_kind", "cell_nodes", "cell_parent", "cell_level", "cell_bface"):
        a, b = getattr(Fh, name), getattr(Fd, name)
        assert a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes(), name
    np.testing.assert_array_equal(dev.mesh.cell_ids, host.mesh.cell_ids)
    moves, to = [], Forest.to
    monkeypatch.setattr(Forest, "to", lambda self, b: moves.append(1) or to(self, b))
    space = dev.local_space(be)
    assert not moves and space.backend.is_gpu
    np.testing.assert_array_equal(space.mesh.cells.get(), host.mesh.cells)


@pytest.mark.parametrize("dim", [2, 3])
def test_refine_split_on_the_device_equals_the_host_split(dim, monkeypatch):
    """``refine(marks, backend="gpu")`` (the split on the device copy of the local forest,
    here on the strict NumPy stand-in for CuPy of tests/mesh, which runs the generic code) gives
    the host split's forest -- keys, owners, vertex tables, node coordinates and parents, bit
    for bit: the same additions in the same order -- and the new forest keeps the device mesh
    as its local space: its set-up copies no forest up."""
    monkeypatch.syspath_prepend(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "mesh"))
    import strict_cupy
    from adaptmg.backend import get_backend
    strict_cupy.install(monkeypatch)
    _device_split_check(dim, get_backend("gpu"), monkeypatch)


@pytest.mark.gpu
@pytest.mark.parametrize("dim", [2, 3])
def test_refine_split_on_the_gpu_equals_the_host_split(dim, monkeypatch):
    """The same on the real device."""
    from adaptmg.backend import get_backend
    _device_split_check(dim, get_backend("gpu"), monkeypatch)


@pytest.mark.parametrize("dim", [2, 3])
def test_numbering_on_the_device_equals_the_host_numbering(dim, monkeypatch):
    """A forest whose local mesh is on the device (``local_space``: the GPU set-up moves it
    first) numbers its nodes there -- on the strict CuPy stand-in of tests/mesh -- with the
    host numbering's ids, owners and owned nodes, without numbering the host mesh, and keeps
    the device ids for the set-up."""
    monkeypatch.syspath_prepend(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "mesh"))
    import strict_cupy

    def forest():
        return DistributedForest.box([0] * dim, [1] * dim, [2] * dim).refine().refine(lambda x: x[:, 1] < 0.3)
    host = forest()
    want = host._numbering
    strict_cupy.install(monkeypatch)
    from adaptmg.backend import get_backend
    be = get_backend("gpu")
    dev = forest()
    dev.local_space(be)
    got = dev._numbering
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)
    assert all(isinstance(a, np.ndarray) and not isinstance(a, strict_cupy.ndarray) for a in got if np.ndim(a))
    assert "_node_numbering" not in dev.mesh.__dict__
    assert isinstance(dev._moved("node_gid", be), strict_cupy.ndarray)
    np.testing.assert_array_equal(dev._moved("node_gid", be).get(), want[0])
