"""Benchmark: the cost of ``ml.solve`` against the Krylov solve it wraps (issue 15's table).

Q1 Poisson (``Mesh.box`` refined: 2-D 1,089 / 16,641 / 1,050,625 DoFs, 3-D 274,625 /
2,146,689 DoFs), rtol 1e-8, ``b`` resident on the backend.  Per size, in one process on
the same matrix, hierarchy and right-hand side:

* ``ml.solve(b, accel="cg")`` -- what a user calls (on the GPU: one CUDA graph per CG
  iteration, stopping test on the device, :class:`adaptmg.linalg.graph_cg.GraphCG`);
* ``adaptmg.linalg.cg(A, b, M=ml.aspreconditioner())`` -- the Krylov solve with the same
  cycle as preconditioner (a CUDA-graph cycle, host-driven CG);
* ``its x (V-cycle + SpMV)`` -- the preconditioner and matrix applications alone;
* per-iteration time of ``ml.solve``: solve time / iterations, and the marginal cost of
  one more iteration (``maxiter=12`` minus ``maxiter=2`` solves at ``rtol=0``, over 10);
* on the GPU, the device time of one CUDA-graph CG iteration (50 graph launches back to back);
* the CPU backend's ``ml.solve`` on the same problem (up to ``--cpu-max`` DoFs).

Times: median of ``--repeat`` runs after a warm-up, each between two device
synchronisations (``time.perf_counter``; CUDA events give the same within 1 %); ``ml.solve``
and the ``linalg.cg`` solve are timed alternately.
Usage: python scripts/bench_solve_latency.py [--sizes 2:5,2:7,2:10,3:6,3:7] [--repeat 7]
[--coarse-max-rows auto|none|N] (``d:k`` = the 2^d-cell unit box refined k times; the
coarse level is :func:`adaptmg.multigrid`'s, by default "auto").
"""
import argparse
import time
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


def interleaved_medians(fs, be, repeat):
    """Median seconds of each callable of ``fs``, timed in turn (f0, f1, f0, f1, ...), each
    call between two device synchronisations."""
    ts = [[] for _ in fs]
    for _ in range(repeat):
        for f, t in zip(fs, ts):
            be.synchronize()
            t0 = time.perf_counter()
            f()
            be.synchronize()
            t.append(time.perf_counter() - t0)
    return [float(np.median(t)) for t in ts]


def measure(mesh, backend, repeat, coarse_max_rows="auto"):
    be = get_backend(backend)
    ml = adaptmg.multigrid(mesh, assemble.stiffness, backend=be, coarse_max_rows=coarse_max_rows)
    n = ml.levels[-1].n
    b = be.asarray(np.random.default_rng(0).standard_normal(n))
    its = []
    ml.solve(b, rtol=1e-8, accel="cg", callback=its.append)
    solve = lambda: ml.solve(b, rtol=1e-8, accel="cg")       # noqa: E731
    solve()
    if be.is_gpu:
        # the wrapped Krylov solve, timed in turn with ml.solve (a drift of the host's
        # speed during the run then hits both alike: measured one after the other, the
        # ratio of the 3-D 274,625 row moved between 1.03 and 1.21 on one machine)
        M = ml.aspreconditioner()
        A = be.asmatrix(ml.A)
        cg = lambda: adaptmg.linalg.cg(A, b, rtol=1e-8, M=M)   # noqa: E731
        cg()
        t_solve, t_cg = interleaved_medians([solve, cg], be, repeat)
    else:
        t_solve = median_time(solve, be, repeat)
    out = dict(n=n, its=len(its), solve=t_solve, levels=len(ml.levels))
    # marginal cost of an iteration: rtol=0 runs exactly maxiter iterations (a warning each)
    t_k = {}
    for k in (2, 12):
        ml.solve(b, rtol=0.0, accel="cg", maxiter=k)
        t_k[k] = median_time(lambda: ml.solve(b, rtol=0.0, accel="cg", maxiter=k), be, repeat)
    out["marginal"] = (t_k[12] - t_k[2]) / 10
    g = ml._preconditioners.get(("graph_cg", "V")) if be.is_gpu else None
    if g is not None:
        g.graph.launch()
        out["graph"] = median_time(lambda: [g.graph.launch() for _ in range(50)], be, 3) / 50
    if be.is_gpu:
        out["cg"] = t_cg
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
    ap.add_argument("--coarse-max-rows", default="auto",
                    help="multigrid(coarse_max_rows=...) of the GPU runs: auto (default), none or a row count")
    args = ap.parse_args()
    warnings.simplefilter("ignore")
    cmr = args.coarse_max_rows
    cmr = None if cmr == "none" else (cmr if cmr == "auto" else int(cmr))
    gpu = gpu_available()
    print("| DoFs | levels | CG its | `ml.solve` | `linalg.cg(A, b, M=ml.aspreconditioner())` "
          "| its x (V-cycle + SpMV) | per iteration | marginal iteration | graph iteration "
          "| `ml.solve` / (cg + SpMV) | CPU backend `ml.solve` |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for item in args.sizes.split(","):
        dim, k = (int(v) for v in item.split(":"))
        mesh = problem(dim, k)
        cpu = None
        g = measure(mesh, "gpu", args.repeat, cmr) if gpu else None
        n = g["n"] if g else None
        if not gpu or (n or 0) <= args.cpu_max:
            cpu = measure(mesh, "cpu", max(3, args.repeat // 2))
            n = cpu["n"]
        r = g or cpu
        ms = lambda t: f"{1e3 * t:.2f} ms"     # noqa: E731
        us = lambda t: f"{1e6 * t:.0f} us"     # noqa: E731
        cols = [f"{dim}-D {n:,}", str(r["levels"]), str(r["its"])]
        if g:
            cols += [ms(g["solve"]), ms(g["cg"]), ms(g["parts"]), us(g["solve"] / max(g["its"], 1)),
                     us(g["marginal"]), us(g["graph"]) if "graph" in g else "-",
                     f"{g['solve'] / (g['cg'] + g['spmv']):.2f}"]
        else:
            cols += ["n/a (no GPU)"] * 7
        cols.append(ms(cpu["solve"]) if cpu else "")
        print("| " + " | ".join(cols) + " |", flush=True)


if __name__ == "__main__":
    main()
