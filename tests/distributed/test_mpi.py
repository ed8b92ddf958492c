"""adaptmg.distributed under ``mpiexec -n 2`` and ``-n 3`` (issue 16 must-shows, CPU/MPI).

One mpiexec launch per rank count runs every case of ``mpi_cases.py`` (Q1/Q2 Poisson and
Q1 elasticity on adaptive 2-D and 3-D meshes with Jacobi, block-Jacobi and Chebyshev
smoothers, a W-cycle, one adaptive step, the linalg reduction hook), distributed and on
a one-rank communicator (the serial code path), and writes the numbers; the tests below
assert them.  Two more launches check that a failure on one rank ends every rank.
The FOLDED cases put the coarser distributed levels on fewer ranks than the job
(``min_dofs_per_rank``, :func:`adaptmg.distributed.partition.level_ranks`).
Skipped when mpi4py or mpiexec is missing.  CI has 2 cores: ``-n 3`` oversubscribes
(MPICH's hydra allows it by default; Open MPI gets ``--oversubscribe``, and
``--allow-run-as-root`` as root: :func:`adaptmg.distributed.comm.mpiexec_flags`); the whole module takes ~20 s.

GPU backend: ``mpi_cases.py solve-gpu`` under ``mpiexec -n 2`` -- with a NumPy stand-in for
CuPy (``--fake``, ``--fake-nccl``: always run, no GPU needed) and with the real CuPy
(``test_gpu_solve_matches_serial``, marked ``gpu``: skipped where CuPy sees no device; both
ranks may share one GPU, the exchange is then host-staged).
"""
import importlib.util
import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest

from adaptmg.distributed import coarse_cell_ranks, curve_order, dof_owners, imbalance, partition_cells
from adaptmg.distributed.comm import find_mpiexec, mpiexec_command, mpiexec_flags
from adaptmg.distributed.partition import fold_cell_ranks, level_ranks
from adaptmg.fe import Space
from adaptmg.mesh import Mesh

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
WORKER = os.path.join(HERE, "mpi_cases.py")
CASES = ["q1-2d", "q1-2d-adapted", "q1-2d-wcycle", "q1-2d-replicated", "q1-3d", "q2-2d", "q2-3d", "elasticity-2d",
         "elasticity-3d"]
LINALG = ["q1-2d-gmres", "q1-2d-fgmres"]
FOLDED = ["q1-2d-folded", "elasticity-2d-folded-replicated-w", "elasticity-3d-folded"]


def _mpiexec():
    if importlib.util.find_spec("mpi4py") is None:
        return None
    return find_mpiexec()


MPIEXEC = _mpiexec()
needs_mpi = pytest.mark.skipif(MPIEXEC is None, reason="mpi4py or mpiexec not available "
                               "(pip install 'adaptmg[mpi]')")


def mpiexec_cmd(n):
    """``[mpiexec, (flags), -n, n]`` (:func:`adaptmg.distributed.comm.mpiexec_command` with the
    launcher found above)."""
    return mpiexec_command(n, MPIEXEC)


def _launch(n, args, timeout):
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1",
               ADAPTMG_THREADS="1", PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("ADAPTMG_HALO_TRANSPORT", None)          # the transport rule decides ("auto")
    env.setdefault("NCCL_NVLS_ENABLE", "0")          # no NVLink multicast (as bench_distributed)
    t0 = time.perf_counter()
    r = subprocess.run(mpiexec_cmd(n) + [sys.executable, WORKER] + args, env=env,
                       capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    return r, time.perf_counter() - t0


@pytest.fixture(scope="module", params=[2, 3], ids=["np2", "np3"])
def results(request, tmp_path_factory):
    if MPIEXEC is None:
        pytest.skip("mpi4py or mpiexec not available")
    out = tmp_path_factory.mktemp("mpi") / "out.json"
    r, _ = _launch(request.param, ["solve", str(out)], timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr
    recs = {rec["case"]: rec for rec in json.loads(out.read_text())}
    hook = recs.pop("hook")
    assert sorted(recs) == sorted(CASES + FOLDED + LINALG), sorted(recs)
    return request.param, recs, hook


@needs_mpi
@pytest.mark.parametrize("case", CASES)
def test_distributed_solution_and_iterations_match_serial(results, case):
    """The distributed multigrid-CG solution equals the serial one to 1e-10 relative (measured:
    <= 4e-14), with the same iteration count (allowed: +1)."""
    _, recs, _ = results
    rec = recs[case]
    assert rec["info"] == 0, rec
    assert rec["rel_err"] <= 1e-10, rec
    assert rec["its_serial"] <= rec["its"] <= rec["its_serial"] + 1, rec
    # multigrid-CG, not plain CG (2-D elasticity with block Jacobi: 19)
    assert rec["its"] <= (25 if case.startswith("elasticity") else 12), rec
    assert rec["distributed_levels"] >= 2, rec         # more than the finest level is distributed


@needs_mpi
@pytest.mark.parametrize("case", CASES)
def test_partition_balanced_and_hanging_nodes_cross_ranks(results, case):
    """Cells per rank within 5 % of the mean; some hanging-node constraints couple DoFs of
    different ranks (the case the partition boundary must handle)."""
    n, recs, _ = results
    rec = recs[case]
    assert len(rec["cells_per_rank"]) == n and min(rec["cells_per_rank"]) > 0
    assert rec["imbalance"] <= 0.05, rec
    assert rec["hanging"] > 0 and rec["cross_rank_hanging"] > 0, rec
    assert rec["neighbours"] >= 1


@needs_mpi
@pytest.mark.parametrize("case", [c for c in CASES if c != "q1-2d-replicated"])
def test_levels_are_set_up_from_the_ranks_cells(results, case):
    """Local set-up (the default): every geometric level with at least ``agglomerate_below``
    DoFs is built by each rank from its own cells plus a ghost layer, and its rows of K, P and
    R equal the serial rows (measured <= 5e-16).  Finest level: every rank assembles fewer
    than all cells, at least its own, within two vertex layers of them; Q1 2-D (2230 and
    3580 cells): at most 1.15 N/P per rank (measured 1.05-1.11 N/P).  Every local level of
    >= 500 cells: all ranks together assemble at most 1.3 N (measured 1.05-1.28 N; the
    replicated set-up assembled P N).  The levels below are the serial ones (same count);
    where their top has fewer than ``agglomerate_below`` (50) DoFs, so that all of them are
    agglomerated on rank 0, rank 0 alone builds them and the other ranks hold their summary."""
    n, recs, _ = results
    rec = recs[case]
    alone = rec["serial_top_dofs"] < 50
    assert alone or case != "q1-2d", rec
    assert rec["serial_kinds"] == ["GeometricMultigrid"] + [
        "SerialLevelsOnRankZero" if alone else "GeometricMultigrid"] * (n - 1), rec
    # rank 0 alone builds them: on the CPU first (nothing runs beside the finest level there),
    # while rank 1 finds the free masks and cuts the mesh
    assert rec["serial_built"] == (["before the local levels"] + [None] * (n - 1) if alone else [None] * n), rec
    assert max(rec["fine_rows_err"]) <= 1e-13, rec
    assert rec["levels"] == rec["serial_levels"], rec
    nloc = len(rec["level_cells"])
    assert nloc == rec["levels"] - 1 - rec["serial_top"] >= 2, rec     # not only the finest
    assert nloc >= rec["distributed_levels"], rec
    N = rec["cells"]
    for r, (got, own, (_, two)) in enumerate(zip(rec["cells_assembled"], rec["cells_per_rank"],
                                                 rec["cell_layers"])):
        assert own <= got <= two and got < N, (r, rec)
    if case.startswith("q1-2d"):
        assert max(rec["cells_assembled"]) <= 1.15 * N / n, rec
    for i, cells in enumerate(rec["level_cells"]):
        per_rank = [lv[i] for lv in rec["level_cells_assembled"]]
        assert max(per_rank) <= cells, (i, rec)
        if cells >= 500:
            assert sum(per_rank) <= 1.3 * cells, (i, rec)


@needs_mpi
@pytest.mark.parametrize("case", CASES)
def test_unfolded_cases_use_every_rank_on_every_distributed_level(results, case):
    """min_dofs_per_rank=0: every distributed level on all P ranks, the others on rank 0."""
    n, recs, _ = results
    rec = recs[case]
    c = rec["agglomerated"]
    assert rec["active_ranks"] == [1] * c + [n] * (rec["levels"] - c), rec


@needs_mpi
@pytest.mark.parametrize("case", FOLDED)
def test_folded_levels_on_fewer_ranks_match_serial(results, case):
    """Coarser distributed levels on P_l = min(P_{l+1}, max(1, N_l // m)) ranks 0..P_l-1 (the
    finest on all P, the levels below agglomerate_below on rank 0): ranks 1.. own no row of
    the small levels (set-up, smoothers, halo exchanges and the cycle with empty parts).
    The solution equals the serial one to 1e-10 (measured <= 3e-14), the same CG iteration
    count (allowed: +1); ranks per level as the rule says, exactly those ranks own DoFs, the
    folded cell partition is balanced to one cell."""
    n, recs, _ = results
    rec = recs[case]
    assert rec["info"] == 0 and rec["rel_err"] <= 1e-10, rec
    assert rec["its_serial"] <= rec["its"] <= rec["its_serial"] + 1, rec
    dofs, c, m = rec["level_dofs"], rec["agglomerated"], rec["min_dofs_per_rank"]
    want = [1] * len(dofs)                   # the rule written out again
    p = n
    for l in range(len(dofs) - 1, c - 1, -1):
        if l < len(dofs) - 1:
            p = min(p, max(1, dofs[l] // m))
        want[l] = p
    assert rec["active_ranks"] == want == rec["describe_ranks"], rec
    assert rec["owning_ranks"] == want, rec
    for l, owned in enumerate(rec["level_owned"]):
        assert all(k > 0 for k in owned[:want[l]]) and not any(owned[want[l]:]), (l, rec)
    assert want[-1] == n and want[c] < n                      # something folded
    expected = {"q1-2d-folded": [1, 1, 1, 1, 2, n], "elasticity-2d-folded-replicated-w": [1, 1, 1, 2, n],
                "elasticity-3d-folded": [1, 1, 2, n]}[case]
    assert want == expected, rec
    if n == 3:                                                # a middle level on 2 of 3 ranks
        assert 1 < min(w for w in want if w > 1) < n
    geo = rec["level_cell_ranks"]                             # geometric levels, coarse -> fine
    for g, counts in enumerate(geo):
        l = g + len(dofs) - len(geo)
        if l >= c:
            k = want[l]
            assert not any(counts[k:]), (l, rec)
            if k < n:                                         # folded: balanced to one cell
                assert max(counts[:k]) - min(counts[:k]) <= 1, (l, rec)


@needs_mpi
def test_replicated_setup_still_available(results):
    """local_setup=False: every rank builds the whole serial hierarchy (the first version)."""
    _, recs, _ = results
    rec = recs["q1-2d-replicated"]
    assert rec["cells_assembled"] == [-1] * len(rec["cells_assembled"])
    assert rec["rel_err"] <= 1e-10 and rec["its"] == recs["q1-2d"]["its"]


@needs_mpi
def test_vectorops_hook_reduces_over_ranks(results):
    """adaptmg.linalg._vectorops.global_reductions with an MPI Allreduce: dot, mdot (with
    accumulation) and global_norm equal the products of the gathered vectors; outside the
    block the products are local again."""
    _, _, hook = results
    for key in ("dot_err", "mdot_err", "acc_err", "norm_err", "local_err"):
        assert hook[key] <= 1e-13, hook


#: host synchronisations of one distributed CG solve (:func:`adaptmg.distributed.resolve`)
#: outside its iterations: ||b||, the true residual at convergence, the two norms resolve
#: returns.  Per iteration: 3 inner products (p.Ap, r.r, r.z) and one host copy (the stopping
#: test; with the NCCL reduction the inner products stay on the device)
SYNC_EXTRA = 4


def _check_sync(sync, transport):
    """The reduction / host-copy counts of one CG solve on every rank (``sync_counts`` of
    mpi_cases.py) against the bounds above: a reduction or a host copy more per iteration
    (e.g. the inner products taken back to the host under NCCL) fails."""
    for s in sync:
        its = s["its"]
        assert s["info"] == 0 and its >= 3, s
        assert s["reductions"] <= 3 * its + SYNC_EXTRA, s
        if transport == "mpi":                       # CPU ranks: NumPy vectors, nothing to copy
            assert s["host_copies"] == 0 and s["gets"] == 0, s
        elif transport == "nccl":                    # every reduction on the device
            assert s["host_copies"] <= its + SYNC_EXTRA, s
            assert s["nccl_allreduces"] in (0, s["reductions"]), s    # 0: real NCCL (not counted)
        else:                                        # host staging: each reduction copies
            assert s["host_copies"] >= s["reductions"], s
    if sync[0]["gets"]:                              # the stand-in device counts every get():
        for s in sync:                               # nothing bypasses to_host under NCCL
            assert transport != "nccl" or s["gets"] == s["host_copies"], s


@needs_mpi
def test_reductions_per_cg_iteration_on_cpu_ranks(results):
    """One more CG solve of q1-2d on the set-up hierarchy (CPU ranks): at most 3 Allreduce
    calls per iteration (+ SYNC_EXTRA per solve), no host copies."""
    _, _, hook = results
    _check_sync(hook["sync"], "mpi")
    assert all(s["reductions"] >= 3 * s["its"] for s in hook["sync"]), hook["sync"]


@needs_mpi
def test_not_converged_is_reported(results):
    """maxiter=2 at rtol 1e-10: info > 0 and a ConvergenceWarning (on every rank alike)."""
    _, _, hook = results
    assert hook["maxiter_info"] > 0 and hook["maxiter_warned"], hook


@needs_mpi
@pytest.mark.parametrize("case", LINALG)
def test_linalg_solvers_unchanged_over_the_hook(results, case):
    """gmres/fgmres of adaptmg.linalg on distributed vectors (_system.py takes its norms from
    _vectorops.global_norm): the same iteration counts as serial, solutions equal to 1e-10
    (measured 2e-15)."""
    _, recs, _ = results
    rec = recs[case]
    assert rec["info"] == 0 and rec["rel_err"] <= 1e-10, rec
    assert rec["its_serial"] <= rec["its"] <= rec["its_serial"] + 1, rec


@needs_mpi
def test_adaptive_step_repartitions(results):
    """After marking and refining, the new mesh is partitioned again (balanced) and solved."""
    n, recs, _ = results
    a, b = recs["q1-2d"], recs["q1-2d-adapted"]
    assert b["dofs"] > a["dofs"] and sum(b["cells_per_rank"]) > b["cells_before"]
    assert b["imbalance"] <= 0.05 and b["rel_err"] <= 1e-10


@needs_mpi
@pytest.mark.parametrize("kind,message", [
    ("bad-input", "rank(s) [1] rejected the input: rtol must be a positive number"),
    ("callback", "user callback failed on purpose"),
])
def test_failing_rank_ends_every_rank(kind, message):
    """A bad argument or a raising callback on rank 1 only: every rank exits with an error
    message instead of hanging (well inside the timeout)."""
    r, seconds = _launch(2, [kind], timeout=60)
    assert r.returncode != 0
    assert message in r.stderr, r.stderr
    # bad input: every rank raises the agreed error, the first to abort reports it;
    # a callback error: rank 1 alone fails and reports
    who = "rank 1 of 2 failed" if kind == "callback" else "of 2 failed; aborting all ranks"
    assert who in r.stderr, r.stderr
    assert "not reached" not in r.stdout
    assert seconds < 30


# ---------------------------------------------------------------- partition (no MPI needed)
def _adaptive(dim):
    m = Mesh.box([0] * dim, [1] * dim, [3] * dim).refine()
    c = m.points[m.cells].mean(1)
    return m.refine(np.linalg.norm(c - 0.2, axis=1) < 0.3)


def test_curve_order_is_morton_on_a_uniform_grid():
    """On a 2x2-root box refined twice, the curve visits the 4 children of a cell
    consecutively and the 16 grandchildren of a root before the next root."""
    m = Mesh.box([0, 0], [1, 1], [2, 2]).refine().refine()
    order = curve_order(m)
    assert np.array_equal(np.sort(order), np.arange(m.num_cells))
    cen = m.points[m.cells].mean(1)[order]
    quad = np.floor(cen * 2).astype(int)                # root cell of each visited cell
    assert (np.abs(np.diff(quad[:, 0] + 2 * quad[:, 1])) > 0).sum() == 3
    fam = np.floor(cen * 4).astype(int)                 # level-1 ancestor
    key = fam[:, 0] + 4 * fam[:, 1]
    assert (key[:-1] != key[1:]).sum() == 15
    # the first four cells form the lower-left 2x2 block, in Z order
    np.testing.assert_allclose(cen[:4], [[1 / 16, 1 / 16], [3 / 16, 1 / 16], [1 / 16, 3 / 16], [3 / 16, 3 / 16]])


@pytest.mark.parametrize("dim", [2, 3])
def test_curve_cuts_an_elongated_box_across_its_long_axis(dim):
    """Roots quantised with one scale for every axis: a box of 4 x 2 (x 2) roots, twice as
    long in x, is cut in two at x = 1 -- the cut of two unit boxes side by side (area 1 in
    3-D), not one along a short axis (area 2); with a refined ball in each unit box each of
    the two ranks holds its own ball, the hanging nodes owned half and half.  (Scaled per
    axis the first cut ran along a short axis.)"""
    u = Mesh.box([0] * dim, [2] + [1] * (dim - 1), [4] + [2] * (dim - 1)).refine()
    c = u.points[u.cells].mean(1)
    m = u.refine((np.linalg.norm(c - np.r_[0.5, [0.5] * (dim - 1)], axis=1) < 0.3)
                 | (np.linalg.norm(c - np.r_[1.5, [0.5] * (dim - 1)], axis=1) < 0.3))
    for mesh in (u, m):                                  # equal cells in each unit box
        c = mesh.points[mesh.cells].mean(1)
        assert np.array_equal(partition_cells(mesh, 2), np.floor(c[:, 0]).astype(int))
    space = Space(m, 1)
    own = dof_owners(space, partition_cells(m, 2))
    hang = np.bincount(own[space.hanging_nodes], minlength=2)
    assert hang[0] == hang[1] > 0


@pytest.mark.parametrize("dim", [2, 3])
@pytest.mark.parametrize("size", [2, 3, 7])
def test_partition_contiguous_balanced_and_owners(dim, size):
    m = _adaptive(dim)
    ranks = partition_cells(m, size)
    order = curve_order(m)
    assert np.all(np.diff(ranks[order]) >= 0)          # contiguous ranges along the curve
    cnt = np.bincount(ranks, minlength=size)
    assert cnt.max() - cnt.min() <= 1                  # so imbalance <= 1 cell / mean
    assert imbalance(ranks, size) <= 1.0 / cnt.mean() + 1e-12
    # weighted: equal weight per rank up to one cell's weight
    w = np.where(m.levels == m.levels.max(), 4.0, 1.0)
    rw = np.bincount(partition_cells(m, size, weights=w), weights=w, minlength=size)
    assert rw.max() - rw.min() <= 2 * w.max()
    # DoF owner: the lowest rank among the cells touching the node
    space = Space(m, 2)
    own = dof_owners(space, ranks)
    for node in (0, space.num_nodes // 2, space.num_nodes - 1):
        touching = np.flatnonzero((space.cell_dofs == node).any(1))
        assert own[node] == ranks[touching].min()
    # coarse cells go where most of their children are
    coarse = m.hierarchy()[-2]
    cr = coarse_cell_ranks(m, coarse, ranks, size)
    cidx, _ = m.parent_of(coarse)
    for c in (0, coarse.num_cells - 1):
        votes = np.bincount(ranks[cidx == c], minlength=size)
        assert cr[c] == np.argmax(votes)


def test_level_ranks_rule():
    """P_L = P; P_l = min(P_{l+1}, max(1, N_l // m)) for c <= l < L; 1 below c; off for m = 0/None."""
    dofs = [25, 41, 91, 224, 671, 2359]
    assert level_ranks(dofs, 3, 2, 300) == [1, 1, 1, 1, 2, 3]
    assert level_ranks(dofs, 2, 2, 300) == [1, 1, 1, 1, 2, 2]
    assert level_ranks(dofs, 8, 2, 100) == [1, 1, 1, 2, 6, 8]
    assert level_ranks(dofs, 8, 2, 0) == level_ranks(dofs, 8, 2, None) == [1, 1, 8, 8, 8, 8]
    assert level_ranks(dofs, 4, 1, 10 ** 6) == [1, 1, 1, 1, 1, 4]     # the finest keeps all ranks
    assert level_ranks(dofs, 1, 0, 1) == [1] * 6
    # non-increasing towards the coarse levels even when a coarser level is larger
    assert level_ranks([100, 5000, 800, 10000], 4, 0, 1000) == [1, 1, 1, 4]
    assert level_ranks([4000, 3000, 9000], 16, 0, 1000) == [3, 3, 16]
    with pytest.raises(ValueError, match="min_dofs_per_rank must be"):
        level_ranks(dofs, 3, 2, -1)


@pytest.mark.parametrize("dim", [2, 3])
def test_fold_cell_ranks_contiguous_and_balanced(dim):
    """Folding a voted coarse partition onto fewer ranks: ranks 0..P_l-1 only, balanced to one
    cell, contiguous along the curve; folding the finest partition = cutting it afresh."""
    m = _adaptive(dim)
    fine = partition_cells(m, 6)
    for k in (1, 2, 4, 5):
        assert np.array_equal(fold_cell_ranks(m, fine, k), partition_cells(m, k))
    assert np.array_equal(fold_cell_ranks(m, fine, 6), fine)          # nothing to fold
    coarse = m.hierarchy()[-2]
    voted = coarse_cell_ranks(m, coarse, fine, 6)
    for k in (1, 2, 3, 4):
        f = fold_cell_ranks(coarse, voted, k)
        cnt = np.bincount(f, minlength=k)
        assert f.max() < k and cnt.size == k and cnt.max() - cnt.min() <= 1, (k, cnt)
        assert np.all(np.diff(f[curve_order(coarse)]) >= 0)
        # a fold: cells of one voted rank never land on a lower rank than those of a lower one
        order = np.lexsort((f, voted))
        assert np.all(np.diff(f[order]) >= 0)


def test_partition_rejects_bad_arguments():
    m = _adaptive(2)
    with pytest.raises(ValueError, match="size must be a positive integer"):
        partition_cells(m, 0)
    with pytest.raises(ValueError, match="weights must be"):
        partition_cells(m, 2, weights=np.ones(3))


@needs_mpi
def test_cli_run_poisson_under_mpiexec_matches_the_serial_run():
    """``mpiexec -n 2 python -m adaptmg run poisson``: the problem solves distributed, the
    errors and CG iterations equal the serial run's, and only rank 0 prints."""
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", ADAPTMG_THREADS="1",
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    cmd = [sys.executable, "-m", "adaptmg", "run", "poisson", "--refine", "3", "--local", "2",
           "--backend", "cpu"]
    serial = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120, cwd=ROOT)
    dist = subprocess.run(mpiexec_cmd(2) + cmd, env=env, capture_output=True, text=True,
                          timeout=120, cwd=ROOT)
    assert serial.returncode == 0 and dist.returncode == 0, dist.stderr[-2000:]
    assert "2 MPI ranks" in dist.stdout and dist.stdout.count("done in") == 1

    def numbers(out):
        its = [line for line in out.splitlines() if "iterations to rtol" in line][0].split()[-5]
        err = [line for line in out.splitlines() if "error vs exact" in line][0]
        return int(its), err
    assert numbers(dist.stdout) == numbers(serial.stdout), (dist.stdout, serial.stdout)


# ------------------------------------------------ the GPU backend (issue 16: device path)
GPU_CASES = ["q1-2d", "q1-2d-replicated-w", "q1-2d-folded", "q2-3d", "elasticity-2d", "elasticity-3d"]


def _gpu_run(n, mode, tmp_path_factory, timeout):
    out = tmp_path_factory.mktemp("mpigpu") / "out.json"
    r, _ = _launch(n, ["solve-gpu", str(out)] + ([mode] if mode else []), timeout=timeout)
    assert r.returncode == 0, r.stdout + r.stderr
    recs = {rec["case"]: rec for rec in json.loads(out.read_text())}
    return recs, r


def _check_gpu_record(rec, transport):
    """What every GPU case must show (with a real or a stand-in device)."""
    assert rec["backend"] == "gpu" and rec["info"] == 0, rec
    assert rec["rel_err_cpu"] <= 1e-10, rec                       # the serial CPU solve
    assert rec["its_cpu"] <= rec["its"] <= rec["its_cpu"] + 1, rec
    assert rec["transports"] == [transport], rec                   # every level, mg itself
    assert rec["device"] and rec["off_device"] == [], rec          # vectors, blocks, smoothers
    assert rec["host_out"], rec                                    # u, x: NumPy, gathered
    assert rec["local_rank"] == list(range(rec["size"])), rec
    assert rec["levels"] - rec["agglomerated"] >= 2, rec
    assert all(e > 0 for e in rec["exchanges"]), rec
    # omega="auto" per distributed level (the finest one's estimate overlapped with the
    # coarser levels' set-up) as the serial CPU hierarchy's, to rounding
    for per_rank in rec["omega"]:
        for om, ref in zip(per_rank, rec["omega_cpu"]):
            if om is not None:                  # (None: no rows here, or a smoother without omega)
                assert ref is not None and abs(om / ref - 1) <= 1e-12, (om, ref)
    if rec["smoother"] != "Chebyshev":
        assert all(per_rank[-1] is not None for per_rank in rec["omega"]), rec
    if rec["smoother"] == "Jacobi":      # sweeps through DistCSR.jacobi_sweep (one-pass kernels)
        flags = [f for per_rank in rec["fused"] for f in per_rank]
        assert True in flags and all(f in (True, None) for f in flags), rec
    _check_sync(rec["sync"], transport)


@pytest.fixture(scope="module", params=["--fake", "--fake-nccl"])
def fake_gpu(request, tmp_path_factory):
    if MPIEXEC is None:
        pytest.skip("mpi4py or mpiexec not available")
    recs, _ = _gpu_run(2, request.param, tmp_path_factory, timeout=180)
    return request.param, recs


@needs_mpi
@pytest.mark.parametrize("case", GPU_CASES)
def test_device_path_with_a_stand_in_device(fake_gpu, case):
    """The GPU code path of the distributed layer under ``mpiexec -n 2`` with tests/distributed/
    fake_cupy.py standing in for CuPy (NumPy arrays that claim to be CuPy's; no GPU needed):
    the solution equals the serial CPU solve to 1e-10, the CG iterations too (+1); every
    vector, block, buffer and smoother array of the distributed levels is a "device" one;
    u and x come back as host NumPy arrays.  One device shared by both ranks: host-staged
    halo exchange with pinned buffers; one device per rank with a stand-in NCCL (its grouped
    send/recv carried out by MPI): the NCCL transport's bookkeeping.  CUDA itself is tested
    by test_gpu_solve_matches_serial below (needs a GPU)."""
    mode, recs = fake_gpu
    _check_gpu_record(recs[case], "host" if mode == "--fake" else "nccl")
    fake = recs["fake"]
    if mode == "--fake":
        assert fake["device"] == [0, 0] and min(fake["pinned"]) > 0 and fake["nccl_calls"] == [0, 0]
        # no stream waits: no NCCL, and a host mesh (no constraint blocks beside the assembly)
        assert fake["stream_waits"] == [0, 0]
        assert all(recs[c]["priority_switches"] == [0, 0] for c in GPU_CASES), recs
    else:
        assert fake["device"] == [0, 1] and min(fake["nccl_calls"]) > 0
        # NCCL on its own stream: it waits for the gather, the current stream for the group;
        # two waits for every exchange of every set-up and solve (the set-up's lambda_max
        # estimates run the device product as well) except those where the rank has nothing
        # to send or receive (skipped: "idle"), two for every reduction on the device, and
        # two for each block of a set-up run on the priority stream (it waits for the work
        # before, the current stream for it afterwards): here the coarser levels while the
        # finest one's estimate runs
        for r in range(2):
            moved = sum(recs[c]["exchanges"][r] - recs[c]["idle"][r] + recs[c]["setup_exchanges"][r]
                        - recs[c]["setup_idle"][r] + recs[c]["sync"][r]["exchanges"]
                        - recs[c]["sync"][r]["idle"] for c in GPU_CASES)
            aside = sum(recs[c]["priority_switches"][r] for c in GPU_CASES)
            assert fake["stream_waits"][r] == 2 * moved + 2 * fake["nccl_allreduces"][r] + 2 * aside, fake
        # the local set-ups queue the finest level's omega="auto" estimate aside (NCCL norms
        # on the device); Chebyshev's Lanczos bound is estimated at once
        for c in GPU_CASES:
            want = int("replicated" not in c and recs[c]["smoother"] != "Chebyshev")
            assert recs[c]["setup_aside"] == [want, want], (c, recs[c]["setup_aside"])
            assert recs[c]["priority_switches"] == [want, want], (c, recs[c]["priority_switches"])
        # where rank 0 alone builds the serial levels, it builds them beside the finest
        # level's assembly (with the levels below the second finest) -- but first in the
        # process's first local set-up (their first use hidden behind rank 1's masks and cut)
        alone = [c for c in GPU_CASES if "replicated" not in c and recs[c]["serial_top_dofs"] < 50]
        want = {c: "before the local levels" if recs[c]["first_setup"] else "beside the finest level" for c in alone}
        assert alone and all(recs[c]["serial_built"] == [want[c], None] for c in alone), recs
        assert "beside the finest level" in want.values(), want
        # fine to coarse, in the order finished: the levels below the second finest (built
        # beside the finest level's assembly, so done first), the finest, then the second
        # finest (beside the finest level's estimate); some case has three local levels
        deep = 0
        for c in GPU_CASES:
            order = recs[c]["build_order"]
            if order:
                top = max(order)
                want = list(range(top - 2, min(order) - 1, -1)) + [top, top - 1] if len(order) > 1 else [top]
                assert order == want, (c, order)
                deep += len(order) >= 3
        assert deep, {c: recs[c]["build_order"] for c in GPU_CASES}
        assert all(min(recs[c]["setup_exchanges"]) > 0 for c in GPU_CASES if "replicated" not in c), recs
        # a level folded onto rank 0: its exchanges move nothing and are skipped
        assert min(recs["q1-2d-folded"]["idle"]) > 0, recs["q1-2d-folded"]


def _check_reduce(rec, transport):
    """The Krylov reduction of device arrays: summed over the ranks to a few eps in float64,
    float32 and complex128, the result a device array of the same shape and dtype."""
    assert rec["transport"] == transport and rec["device_out"], rec
    assert all(e <= 4 for e in rec["eps_err"].values()), rec


@needs_mpi
def test_device_reductions_with_a_stand_in_device(fake_gpu):
    """allreduce_sum on "device" arrays: host-staged MPI (one device for both ranks) or the
    NCCL allreduce (stand-in NCCL, one device per rank), complex arrays as pairs of reals."""
    mode, recs = fake_gpu
    _check_reduce(recs["reduce"], "host" if mode == "--fake" else "nccl")


@pytest.fixture(scope="module")
def real_gpu(tmp_path_factory):
    if MPIEXEC is None:
        pytest.skip("mpi4py or mpiexec not available")
    recs, _ = _gpu_run(2, "", tmp_path_factory, timeout=900)
    return recs


@pytest.mark.gpu
@needs_mpi
@pytest.mark.parametrize("case", GPU_CASES)
def test_gpu_solve_matches_serial(real_gpu, case):
    """``solve(..., backend="gpu")`` under ``mpiexec -n 2`` (both ranks may share one GPU):
    the solution equals the serial GPU solve and the serial CPU solve to 1e-10 relative, the
    CG iterations the serial ones (+1 allowed); the halo exchange went through host staging
    (two ranks on one GPU: NCCL is refused); device data as in the stand-in test."""
    rec = real_gpu[case]
    # one GPU for both ranks (the H100 box): host staging; one GPU per rank: the auto rule
    transport = "host" if rec["shared_gpu"] else rec["expected_transport"]
    _check_gpu_record(rec, transport)
    assert rec["rel_err_gpu"] <= 1e-10, rec
    assert rec["its_gpu"] <= rec["its"] <= rec["its_gpu"] + 1, rec
    assert rec["serial_gpu_vs_cpu"] <= 1e-10, rec


@pytest.mark.gpu
@needs_mpi
def test_gpu_device_reductions(real_gpu):
    """allreduce_sum on CuPy arrays under ``mpiexec -n 2``: ncclAllReduce where each rank has
    its own GPU (else host staging), float64 / float32 / complex128 to a few eps."""
    rec = real_gpu["q1-2d"]
    _check_reduce(real_gpu["reduce"], "host" if rec["shared_gpu"] else rec["expected_transport"])


def test_mpiexec_flags_for_open_mpi():
    """Open MPI (``mpiexec --version``: "mpiexec (OpenRTE) 4.1.6" / "Open MPI"): --oversubscribe,
    --allow-run-as-root for root and, for GPU ranks, --bind-to none; MPICH's hydra: nothing."""
    ompi = "mpiexec (OpenRTE) 4.1.6\n\nReport bugs to http://www.open-mpi.org/community/help/"
    assert mpiexec_flags(ompi, 1000) == ["--oversubscribe"]
    assert mpiexec_flags(ompi, 0) == ["--oversubscribe", "--allow-run-as-root"]
    assert mpiexec_flags("mpirun (Open MPI) 5.0.3", 0) == ["--oversubscribe", "--allow-run-as-root"]
    hydra = "HYDRA build details:\n    Version:                                 4.2.0"
    assert mpiexec_flags(hydra, 0) == [] and mpiexec_flags("", 0) == []
    # one rank per GPU: Open MPI's binding of each rank to one core switched off
    assert mpiexec_flags(ompi, 1000, gpu=True) == ["--oversubscribe", "--bind-to", "none"]
    assert mpiexec_flags(hydra, 0, gpu=True) == []


def test_launcher_of_mpi4pys_library_is_chosen(tmp_path, monkeypatch):
    """Two launchers, Open MPI's next to Python and MPICH's on the PATH: find_mpiexec takes the
    one of mpi4py's library (the other one would start singletons), whichever that is; with
    the library unknown, the one next to Python as before."""
    from adaptmg.distributed import comm as C
    here, there = tmp_path / "venv", tmp_path / "usr"
    for d, text in ((here, "mpiexec (Open MPI) 5.0.3"), (there, "HYDRA build details:\n  Version: 4.2.0")):
        d.mkdir()
        exe = d / "mpiexec"
        exe.write_text(f"#!/bin/sh\nprintf '{text}\\n'\n")
        exe.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(here / "python"))
    monkeypatch.setenv("PATH", str(there))
    for family, want in (("mpich", there), ("openmpi", here), ("", here)):
        monkeypatch.setitem(C._FAMILY, "mpi4py", family)
        assert C.find_mpiexec() == str(want / "mpiexec"), family
    monkeypatch.setitem(C._FAMILY, "mpi4py", "openmpi")
    assert C.mpiexec_command(3)[1:] == ["--oversubscribe"] + (["--allow-run-as-root"] if os.geteuid() == 0
                                                               else []) + ["-n", "3"]


def test_singleton_launch_is_refused(monkeypatch):
    """A launcher that announced 2 processes while COMM_WORLD has 1 (another MPI library's
    mpiexec): a RuntimeError naming the cause, not two serial solves."""
    from adaptmg.distributed.comm import check_launch, mpi_family
    assert mpi_family("Open MPI v4.1.6, package: Open MPI root@host") == "openmpi"
    assert mpi_family("MPICH Version:      5.0.2\nMPICH Release date:") == "mpich"
    assert mpi_family("Intel(R) MPI Library 2021.10 for Linux* OS") == "mpich"
    assert mpi_family("something else") == ""
    check_launch(2, 2)
    check_launch(1, 1)
    with pytest.raises(RuntimeError, match="started 2 processes but each sees MPI.COMM_WORLD of size 1"):
        check_launch(1, 2)
    monkeypatch.setenv("PMI_SIZE", "4")
    with pytest.raises(RuntimeError, match="does not belong to the MPI library"):
        check_launch(1)


@needs_mpi
def test_found_launcher_belongs_to_mpi4pys_library():
    """On this machine: mpi4py's MPI library is known (MPICH or Open MPI) and the launcher the
    tests use is of the same family (else every rank would be a singleton)."""
    from adaptmg.distributed.comm import _version_text, mpi4py_family, mpi_family
    fam = mpi4py_family()
    assert fam in ("mpich", "openmpi")
    assert mpi_family(_version_text(MPIEXEC)) == fam
