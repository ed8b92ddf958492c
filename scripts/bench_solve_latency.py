"""Benchmark: the cost of ``ml.solve`` against the Krylov solve it wraps (issue 15's table).

Q1 Poisson (``Mesh.box`` refined: 2-D 1,089 / 16,641 / 1,050,625 DoFs, 3-D 274,625 /
2,146,689 DoFs), rtol 1e-8, ``b`` resident on the backend.  Per size, in one process on
the same matrix, hierarchy and right-hand side:

* ``ml.solve(b, accel="cg")`` -- what a user calls (on the GPU: one CUDA graph per CG
  iteration, stopping test on the device, :class:`adaptmg.linalg.graph_cg.GraphCG`);
* ``adaptmg.linalg.cg(A, b, M=ml.aspreconditioner())`` -- the Krylov solve with the same
  cycle as preconditioner (a CUDA-graph cycle, host-driven CG);
* ``its x (V-cycle + SpMV)`` -- the preconditioner and matrix applications alone;
* per-iteration time of ``ml.solve`` (solve time / iterations);
* the CPU backend's ``ml.solve`` on the same problem (up to ``--cpu-max`` DoFs).

Times: median of ``--repeat`` runs after a warm-up, each between two device
synchronisations (``time.perf_counter``; CUDA events give the same within 1 %).
Usage: python scripts/bench_solve_latency.py [--sizes 2:5,2:7,2:10,3:6,3:7] [--repeat 7]
(``d:k`` = the 2^d-cell unit box refined k times).
"""
import argparse
import warnings

import numpy as np

import adaptmg
from adaptmg import assemble
from adaptmg.backend import get_backend, gpu_available
from bench_poisson import median_time      # scripts/ is on sys.path when a script runs


def problem(dim, k):
    mesh = adaptmg.Mesh.box([0.0] * dim, [1.0] * dim, [1] * dim)
    for _ in range(k):
        mesh = mesh.refine()
    return mesh


def measure(mesh, backend, repeat, coarse_max_rows=None):
    be = get_backend(backend)
    ml = adaptmg.multigrid(mesh, assemble.stiffness, backend=be, coarse_max_rows=coarse_max_rows)
    n = ml.levels[-1].n
    b = be.asarray(np.random.default_rng(0).standard_normal(n))
    its = []
    ml.solve(b, rtol=1e-8, accel="cg", callback=its.append)
    ml.solve(b, rtol=1e-8, accel="cg")
    t_solve = median_time(lambda: ml.solve(b, rtol=1e-8, accel="cg"), be, repeat)
    out = dict(n=n, its=len(its), solve=t_solve)
    if be.is_gpu:
        M = ml.aspreconditioner()
        A = be.asmatrix(ml.A)
        adaptmg.linalg.cg(A, b, rtol=1e-8, M=M)
        out["cg"] = median_time(lambda: adaptmg.linalg.cg(A, b, rtol=1e-8, M=M), be, repeat)
        A @ b
        t_spmv = median_time(lambda: A @ b, be, 20)
        t_cyc = median_time(lambda: M.matvec(b), be, 20)
        out["parts"] = len(its) * (t_spmv + t_cyc)
        out["spmv"] = t_spmv
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="2:5,2:7,2:10,3:6,3:7")
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--cpu-max", type=float, default=1.1e6, help="largest size also run on the CPU")
    ap.add_argument("--coarse-max-rows", type=int, default=None,
                    help="multigrid(coarse_max_rows=...) of the GPU runs (direct solve on a ~1000-row level)")
    args = ap.parse_args()
    warnings.simplefilter("ignore")
    gpu = gpu_available()
    print("| DoFs | CG its | `ml.solve` | `linalg.cg(A, b, M=ml.aspreconditioner())` | its x (V-cycle + SpMV) "
          "| per iteration | `ml.solve` / (cg + SpMV) | CPU backend `ml.solve` |")
    print("|---|---|---|---|---|---|---|---|")
    for item in args.sizes.split(","):
        dim, k = (int(v) for v in item.split(":"))
        mesh = problem(dim, k)
        cpu = None
        g = measure(mesh, "gpu", args.repeat, args.coarse_max_rows) if gpu else None
        n = g["n"] if g else None
        if not gpu or (n or 0) <= args.cpu_max:
            cpu = measure(mesh, "cpu", max(3, args.repeat // 2))
            n = cpu["n"]
        r = g or cpu
        ms = lambda t: f"{1e3 * t:.2f} ms"     # noqa: E731
        cols = [f"{dim}-D {n:,}", str(r["its"])]
        if g:
            cols += [ms(g["solve"]), ms(g["cg"]), ms(g["parts"]),
                     f"{1e6 * g['solve'] / max(g['its'], 1):.0f} us",
                     f"{g['solve'] / (g['cg'] + g['spmv']):.2f}"]
        else:
            cols += ["n/a (no GPU)"] * 5
        cols.append(ms(cpu["solve"]) if cpu else "")
        print("| " + " | ".join(cols) + " |", flush=True)


if __name__ == "__main__":
    main()
