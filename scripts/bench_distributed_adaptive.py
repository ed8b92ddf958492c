"""Benchmark: the adaptive loop on the distributed forest (adaptmg.distributed.adaptive) -- per
step DoFs, iterations, error, estimate and the seconds of each phase, one ``mpiexec -n P``
launch per P.

Driver::

    python scripts/bench_distributed_adaptive.py --ranks 1 2 --max-dofs 2e5               # CPU
    python scripts/bench_distributed_adaptive.py --ranks 2 --backend gpu --max-dofs 5e6   # one GPU per rank

The problem: the L-shape with homogeneous Dirichlet data (``adaptmg_problems.lshape``'s
``*_zero_bc``: the corner singularity r^(2/3) sin(2 theta/3) times a smooth weight), Q1,
multigrid-CG to ``--rtol``, residual indicators, Doerfler marking (``--theta``), refinement
with the 2:1 closure and a repartition along the Morton curve after every step; the 12
roots are refined ``--uniform`` times first.  Steps run until the forest has ``--max-dofs``
global nodes (or ``--steps``).  Printed per P and step: cells, DoFs, CG iterations, the
estimate and the H1 error, the ranks' owned leaves (min-max), and the wall seconds (max over
the ranks) of the set-up (all of ``solve_forest`` but CG: the multigrid hierarchy from the
forest, the load, ``H x``), the CG solve, estimate, the errors against the exact solution,
mark, refine and repartition.  ``--backend gpu``: the set-up's matrices, the cycle and CG on the device (one
GPU per rank, NCCL when every rank has its own); the forest, the estimator and the marking
stay on the host (``--no-errors`` skips the host quadrature of the exact solution's errors,
the largest host phase).  On a machine with fewer cores than ranks the seconds mean little.
"""
import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

PHASES = ("setup", "solve", "estimate", "error", "mark", "refine", "repartition")


def worker(args):
    from mpi4py import MPI

    from adaptmg.distributed import adaptive_loop_forest
    from adaptmg.distributed.forest import DistributedForest
    from adaptmg_problems import lshape as L
    comm = MPI.COMM_WORLD
    t0 = time.perf_counter()
    F = DistributedForest.from_coarse(L.coarse_mesh(), comm=comm)
    for _ in range(args.uniform):
        F = F.refine()
    F = F.repartition()
    t_init = time.perf_counter() - t0
    kw = {} if args.agglomerate_below is None else {"agglomerate_below": args.agglomerate_below}
    t0 = time.perf_counter()
    ex = {} if args.no_errors else {"exact": L.exact_zero_bc, "grad": L.grad_zero_bc}
    out = adaptive_loop_forest(F, L.source_zero_bc, **ex,
                               steps=args.steps, max_dofs=int(args.max_dofs), theta=args.theta, rtol=args.rtol,
                               backend=args.backend, **kw)
    total = time.perf_counter() - t0
    if comm.Get_rank() == 0:
        res = out["result"]
        print(json.dumps({"P": comm.Get_size(), "history": out["history"], "init_s": t_init, "total_s": total,
                          "transport": getattr(res.mg, "transport", None), "backend": args.backend}))


def driver(args):
    from adaptmg.distributed.comm import find_mpiexec, mpiexec_command
    if find_mpiexec() is None:
        sys.exit("mpiexec not found: pip install 'adaptmg[mpi]'")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", ADAPTMG_THREADS="1",
               NCCL_NVLS_ENABLE="0", PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    for P in args.ranks:
        cmd = mpiexec_command(P) + [sys.executable, os.path.abspath(__file__), "--worker",
                                    "--backend", args.backend, "--max-dofs", str(args.max_dofs),
                                    "--steps", str(args.steps), "--theta", str(args.theta), "--rtol", str(args.rtol),
                                    "--uniform", str(args.uniform)] + (["--no-errors"] if args.no_errors else [])
        if args.agglomerate_below is not None:
            cmd += ["--agglomerate-below", str(args.agglomerate_below)]
        t0 = time.perf_counter()
        r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
        wall = time.perf_counter() - t0
        if r.returncode != 0:
            sys.exit(f"P={P} failed:\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}")
        rec = json.loads(r.stdout.strip().splitlines()[-1])
        print(f"\nP = {P}, backend {rec['backend']}"
              + (f" (halo transport {rec['transport']})" if rec["backend"] == "gpu" else "")
              + f": L-shape (u = 0 on the boundary), Q1, Doerfler theta = {args.theta}, CG to rtol {args.rtol:g}; "
              f"initial forest {rec['init_s']:.2f} s, loop {rec['total_s']:.2f} s, launch {wall:.1f} s")
        print(f"{'step':>4} {'cells':>10} {'DoFs':>10} {'its':>4} {'estimate':>10} {'H1 error':>10} "
              f"{'owned':>15} " + " ".join(f"{p[:8]:>8}" for p in PHASES) + f" {'sum':>8}")
        sums = np.zeros(len(PHASES))
        for h in rec["history"]:
            t = np.array([h[f"t_{p}"] for p in PHASES])
            sums += t
            own = f"{h['owned_min']}-{h['owned_max']}"
            print(f"{h['step']:>4} {h['cells']:>10} {h['dofs']:>10} {h['iterations']:>4} {h['estimate']:>10.3e} "
                  f"{h.get('err_H1', float('nan')):>10.3e} {own:>15} " + " ".join(f"{x:>8.3f}" for x in t) + f" {t.sum():>8.3f}")
        print(f"{'all':>4} {'':>10} {'':>10} {'':>4} {'':>10} {'':>10} {'':>15} "
              + " ".join(f"{x:>8.3f}" for x in sums) + f" {sums.sum():>8.3f}")
        hist = rec["history"]
        if len(hist) >= 3 and not args.no_errors:
            n = np.array([h["dofs"] for h in hist], float)
            e = np.array([h["err_H1"] for h in hist])
            print(f"H1 error ~ N^{np.polyfit(np.log(n), np.log(e), 1)[0]:.3f} (optimal -0.5; uniform -1/3)")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--backend", choices=["cpu", "gpu"], default="cpu")
    ap.add_argument("--max-dofs", type=float, default=2e5, help="stop once the forest has this many nodes")
    ap.add_argument("--steps", type=int, default=100, help="at most this many refinements")
    ap.add_argument("--theta", type=float, default=0.5, help="Doerfler's bulk parameter")
    ap.add_argument("--rtol", type=float, default=1e-8)
    ap.add_argument("--uniform", type=int, default=3, help="uniform refinements of the 12 roots first")
    ap.add_argument("--agglomerate-below", type=int, default=None,
                    help="levels with fewer nodes on rank 0 (default: solve_forest's 'auto')")
    ap.add_argument("--no-errors", action="store_true",
                    help="skip the errors against the exact solution (host quadrature of r^(2/3)...)")
    ap.add_argument("--timeout", type=float, default=1800)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    (worker if args.worker else driver)(args)


if __name__ == "__main__":
    main()
