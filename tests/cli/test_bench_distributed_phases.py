"""Smoke test of scripts/bench_distributed.py on the CPU with mpich: P = 1 and P = 2 run, the
table says where the mesh lives, and ``--phases`` prints one row of set-up phases per rank
(P = 1 too: its mesh and its serial ``multigrid()``), ``--setup-repeat`` lists its timed set-ups
and reports their median; ``--mesh-backend gpu`` needs the GPU backend."""
import os
import pathlib
import subprocess
import sys

import pytest

pytest.importorskip("mpi4py")
ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "bench_distributed.py"


def _run(*args):
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, str(SCRIPT), *args], env=env, capture_output=True, text=True,
                          timeout=240, cwd=ROOT)


def test_bench_distributed_prints_phases_per_rank():
    from adaptmg.distributed.comm import find_mpiexec
    if find_mpiexec() is None:
        pytest.skip("no mpiexec")
    r = _run("--backend", "cpu", "--ranks", "1", "2", "--dofs-per-rank", "4e3", "--setup", "local",
             "--phases", "--repeat", "1", "--dim", "2", "--setup-repeat", "3")
    assert r.returncode == 0, r.stdout + r.stderr
    out = r.stdout
    assert "mesh on the cpu" in out
    ranks = [ln for ln in out.splitlines() if ln.strip().startswith("rank ")]
    assert len(ranks) == 3, out                          # 1 row at P = 1, 2 at P = 2
    assert "mesh_s" in ranks[0] and "multigrid_s" in ranks[0]
    assert all("matrix_s" in ln and "transfer_s" in ln and "owners_s" in ln for ln in ranks[1:])
    rows = [ln.split() for ln in out.splitlines() if ln.split()[:1] in (["1"], ["2"])]
    its = [r[5] for r in rows]
    assert len(its) == 2 and its[0] == its[1], out       # the same CG iterations
    # weak scaling: P copies of the one-rank problem, so a rank has one rank's DoFs (less the
    # nodes the copies share) and the set-up ratio is printed with that size ratio
    vs = [ln for ln in out.splitlines() if "set-up vs P = 1" in ln]
    assert len(vs) == 1, out
    size = float(vs[0].split(" with ")[1].split("x")[0])
    assert 0.95 < size <= 1.0, vs
    # --setup-repeat 3: three timed set-ups listed per P, their median in the table
    runs = [ln.split(":")[-1].split() for ln in out.splitlines() if "set-up s of 3 runs" in ln]
    assert len(runs) == 2, out
    for row, rr in zip(rows, runs):
        assert len(rr) == 3 and float(row[3]) == sorted(float(t) for t in rr)[1], (row, rr)


def test_bench_distributed_mesh_backend_gpu_needs_the_gpu_backend():
    r = _run("--backend", "cpu", "--mesh-backend", "gpu", "--ranks", "1")
    assert r.returncode != 0 and "--mesh-backend gpu needs --backend gpu" in r.stderr


def test_bench_distributed_cold_runs_in_empty_cache_folders():
    from adaptmg.distributed.comm import find_mpiexec
    if find_mpiexec() is None:
        pytest.skip("no mpiexec")
    r = _run("--backend", "cpu", "--ranks", "1", "--dofs-per-rank", "2e3", "--setup", "local",
             "--repeat", "1", "--dim", "2", "--cold")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "empty kernel caches" in r.stdout


@pytest.mark.parametrize("dim", [2, 3])
def test_weak_mesh_is_copies_of_the_one_rank_mesh(dim):
    """make_mesh(copies=P) over [0, P]: the one-rank mesh P times side by side -- P times its
    cells (cells are not shared), its refined ball in every copy; one copy is the old mesh."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("bench_distributed", SCRIPT)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    n = 4e3 if dim == 2 else 3e4
    one = bench.make_mesh(dim, 1, n)
    for P in (2, 3):
        m = bench.make_mesh(dim, P, P * n, copies=P)
        assert m.num_cells == P * one.num_cells
        x = m.points[m.cells].mean(axis=1)[:, 0]
        for k in range(P):                       # each unit segment holds one copy's cells
            assert int(((x >= k) & (x < k + 1)).sum()) == one.num_cells
        single = bench.make_mesh(dim, P, P * n)  # one ball: fewer cells
        assert single.num_cells < m.num_cells
