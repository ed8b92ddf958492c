"""Benchmark: the adaptive loop on the distributed forest (adaptmg.distributed.adaptive) -- per
step DoFs, iterations, error, estimate and the seconds of each phase, one ``mpiexec -n P``
launch per P.

Driver::

    python scripts/bench_distributed_adaptive.py --ranks 1 2 --max-dofs 2e5                     # CPU, L-shape
    python scripts/bench_distributed_adaptive.py --problem fichera --ranks 1 2 --max-dofs 1e5   # CPU, 3-D
    python scripts/bench_distributed_adaptive.py --ranks 2 --backend gpu --max-dofs 5e6         # one GPU per rank

The problems (``--problem``): ``lshape``, the L-shape of ``adaptmg_problems.lshape`` with its
exact data (-Laplace u = 0, u = g = r^(2/3) sin(2 theta/3) on the boundary: inhomogeneous
Dirichlet values, lifted by ``solve_forest(..., g=)``), errors against the exact solution;
``fichera`` (``adaptmg_problems.fichera``, 3-D: -Laplace u = 1, u = 0), the energy error
sqrt(J_REF - J(u_h)) from the goal J(u_h) = int u_h; ``lshape0``, the L-shape variant with
zero boundary data (``*_zero_bc``).  Q1, multigrid-CG to ``--rtol``, residual indicators,
Doerfler marking (``--theta``; ``--tie-rtol``: twins of these symmetric problems marked
together, "none" for plain Doerfler), refinement with the 2:1 closure and a repartition along
the Morton curve after every step; the roots (12 squares / 7 cubes) are refined ``--uniform``
times first.  Steps run until the forest has ``--max-dofs``
global nodes (or ``--steps``).  Printed per P and step: cells, DoFs, CG iterations, the
estimate and the error, the ranks' owned leaves (min-max), and the wall seconds (max over
the ranks) of the set-up (all of ``solve_forest`` but CG: the multigrid hierarchy from the
forest, the load, ``H x``), the CG solve, estimate, the errors against the exact solution,
mark, refine and repartition.  ``--backend gpu``: the set-up's matrices, the cycle and CG on the device (one
GPU per rank, NCCL when every rank has its own); the forest, the estimator and the marking
stay on the host (``--no-errors`` skips the host quadrature of the exact solution's errors,
the largest host phase).  On a machine with fewer cores than ranks the seconds mean little.

``--mesh replicated``: :func:`adaptmg.distributed.adaptive_loop_replicated` instead -- the mesh
whole on every rank (with ``--backend gpu`` on every GPU: refinement, estimator and marking
there, rank 0's marks broadcast), the set-up (each rank its cells' rows, the Morton cut of each
step's mesh) and the solve distributed; homogeneous Dirichlet data (``lshape0``, ``fichera``).
Its phases: mesh (space and load), setup, partition (part of setup), solve, gather (the
solution on every rank), estimate, mark, refine.
"""
import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

PHASES = ("setup", "solve", "estimate", "error", "mark", "refine", "repartition")
TITLES = {"lshape": "L-shape (u = r^(2/3) sin(2 theta/3) on the boundary)", "fichera": "Fichera cube (f = 1, u = 0)",
          "lshape0": "L-shape (u = 0 on the boundary)"}


#: per problem: default uniform refinements, the error's name and its optimal slope in N
PROBLEMS = {"lshape": (3, "H1 error", -0.5), "fichera": (2, "energy", -1.0 / 3.0), "lshape0": (3, "H1 error", -0.5)}


def problem(name, errors=True):
    """(coarse mesh, adaptive_loop_forest keywords) of a problem."""
    from adaptmg_problems import fichera as Fi
    from adaptmg_problems import lshape as L
    if name == "fichera":
        return Fi.coarse_mesh(), {"f": 1.0, "goal": 1.0 if errors else None}
    if name == "lshape":
        return L.coarse_mesh(), {"f": 0.0, "g": L.exact, **({"exact": L.exact, "grad": L.grad} if errors else {})}
    return L.coarse_mesh(), {"f": L.source_zero_bc,
                             **({"exact": L.exact_zero_bc, "grad": L.grad_zero_bc} if errors else {})}


def error_of(name, h):
    """The error of a history row (nan without)."""
    if name == "fichera":
        from adaptmg_problems.fichera import J_REF
        return float(np.sqrt(max(J_REF - h["goal"], 0.0))) if "goal" in h else float("nan")
    return h.get("err_H1", float("nan"))


def replicated_worker(args, comm):
    """``--mesh replicated``: :func:`adaptmg.distributed.adaptive_loop_replicated` (the mesh whole
    on every rank -- on every GPU --, the set-up and solve distributed)."""
    from adaptmg.distributed import adaptive_loop_replicated
    from adaptmg.distributed.comm import select_device
    from adaptmg.distributed.replicated_adaptive import PHASES as REPLICATED_PHASES
    from bench_distributed import device_mb          # scripts/ is on sys.path when a script runs
    if args.backend == "gpu":
        select_device(comm)
    coarse, pkw = problem(args.problem, not args.no_errors)
    t0 = time.perf_counter()
    mesh = coarse.to(args.backend)
    for _ in range(args.uniform):
        mesh = mesh.refine()
    t_init = time.perf_counter() - t0
    kw = {} if args.agglomerate_below is None else {"agglomerate_below": args.agglomerate_below}
    tie = None if args.tie_rtol == "none" else float(args.tie_rtol)
    t0 = time.perf_counter()
    out = adaptive_loop_replicated(mesh, **pkw, comm=comm, steps=args.steps, max_dofs=int(args.max_dofs),
                                   theta=args.theta, tie_rtol=tie, rtol=args.rtol, backend=args.backend,
                                   quiet=not args.progress,
                                   printer=lambda line: print(line, file=sys.stderr, flush=True), **kw)
    total = time.perf_counter() - t0
    mb = comm.allgather(device_mb() if args.backend == "gpu" else 0.0)
    if comm.Get_rank() == 0:
        print(json.dumps({"P": comm.Get_size(), "history": out["history"], "init_s": t_init, "total_s": total,
                          "transport": None, "backend": args.backend, "phases": list(REPLICATED_PHASES),
                          "device_mb": mb}))


def worker(args):
    from mpi4py import MPI

    from adaptmg.distributed import adaptive_loop_forest
    from adaptmg.distributed.forest import DistributedForest
    comm = MPI.COMM_WORLD
    if args.mesh == "replicated":
        return replicated_worker(args, comm)
    coarse, pkw = problem(args.problem, not args.no_errors)
    t0 = time.perf_counter()
    F = DistributedForest.from_coarse(coarse, comm=comm)
    for _ in range(args.uniform):
        F = F.refine()
    F = F.repartition()
    t_init = time.perf_counter() - t0
    kw = {} if args.agglomerate_below is None else {"agglomerate_below": args.agglomerate_below}
    t0 = time.perf_counter()
    tie = None if args.tie_rtol == "none" else float(args.tie_rtol)
    out = adaptive_loop_forest(F, **pkw, steps=args.steps, max_dofs=int(args.max_dofs), theta=args.theta,
                               tie_rtol=tie, rtol=args.rtol, backend=args.backend, quiet=not args.progress,
                               printer=lambda line: print(line, file=sys.stderr, flush=True), **kw)
    total = time.perf_counter() - t0
    if comm.Get_rank() == 0:
        res = out["result"]
        print(json.dumps({"P": comm.Get_size(), "history": out["history"], "init_s": t_init, "total_s": total,
                          "transport": getattr(res.mg, "transport", None), "backend": args.backend,
                          "phases": list(PHASES)}))


def driver(args):
    from adaptmg.distributed.comm import find_mpiexec, mpiexec_command
    if find_mpiexec() is None:
        sys.exit("mpiexec not found: pip install 'adaptmg[mpi]'")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", ADAPTMG_THREADS="1",
               NCCL_NVLS_ENABLE="0", PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    name, (_, err_name, optimal) = args.problem, PROBLEMS[args.problem]
    for P in args.ranks:
        cmd = mpiexec_command(P, gpu=args.backend == "gpu") + [sys.executable, os.path.abspath(__file__), "--worker", "--problem", name,
                                    "--backend", args.backend, "--max-dofs", str(args.max_dofs),
                                    "--steps", str(args.steps), "--theta", str(args.theta), "--rtol", str(args.rtol),
                                    "--uniform", str(args.uniform), "--tie-rtol", str(args.tie_rtol),
                                    "--mesh", args.mesh] \
            + (["--no-errors"] if args.no_errors else []) + (["--progress"] if args.progress else [])
        if args.agglomerate_below is not None:
            cmd += ["--agglomerate-below", str(args.agglomerate_below)]
        t0 = time.perf_counter()
        r = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=None if args.progress else subprocess.PIPE,
                           text=True, timeout=args.timeout)
        wall = time.perf_counter() - t0
        if r.returncode != 0:
            sys.exit(f"P={P} failed:\n{r.stdout[-2000:]}\n{(r.stderr or '')[-4000:]}")
        rec = json.loads(r.stdout.strip().splitlines()[-1])
        phases = rec["phases"]
        print(f"\nP = {P}, backend {rec['backend']}, mesh {args.mesh}"
              + (f" (halo transport {rec['transport']})" if rec["backend"] == "gpu" and rec["transport"] else "")
              + f": {TITLES[name]}, Q1, Doerfler theta = {args.theta} (tie_rtol {args.tie_rtol}), CG to rtol "
              f"{args.rtol:g}; "
              f"initial {args.mesh} mesh {rec['init_s']:.2f} s, loop {rec['total_s']:.2f} s, launch {wall:.1f} s")
        print(f"{'step':>4} {'cells':>10} {'DoFs':>10} {'its':>4} {'estimate':>10} {err_name:>10} "
              f"{'owned':>15} " + " ".join(f"{p[:8]:>8}" for p in phases) + f" {'sum':>8}")
        sums = np.zeros(len(phases))
        whole = np.array([p != "partition" for p in phases])      # (a part of the set-up)
        for h in rec["history"]:
            t = np.array([h[f"t_{p}"] for p in phases])
            sums += t
            own = f"{h['owned_min']}-{h['owned_max']}" if "owned_min" in h else "-"
            print(f"{h['step']:>4} {h['cells']:>10} {h['dofs']:>10} {h['iterations']:>4} {h['estimate']:>10.3e} "
                  f"{error_of(name, h):>10.3e} {own:>15} " + " ".join(f"{x:>8.3f}" for x in t) + f" {t[whole].sum():>8.3f}")
        print(f"{'all':>4} {'':>10} {'':>10} {'':>4} {'':>10} {'':>10} {'':>15} "
              + " ".join(f"{x:>8.3f}" for x in sums) + f" {sums[whole].sum():>8.3f}")
        hist = rec["history"]
        if rec.get("device_mb") and any(rec["device_mb"]):
            print(f"device memory per rank (CuPy pool, high-water) {rec['device_mb']} MiB: "
                  f"{max(rec['device_mb']) * 2 ** 20 / hist[-1]['dofs']:.0f} B per DoF of the last mesh")
        if len(hist) >= 3 and not args.no_errors:
            n = np.array([h["dofs"] for h in hist], float)
            e = np.array([error_of(name, h) for h in hist])
            print(f"{err_name} ~ N^{np.polyfit(np.log(n), np.log(e), 1)[0]:.3f} (optimal {optimal:.3f})")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--problem", choices=sorted(PROBLEMS), default="lshape")
    ap.add_argument("--tie-rtol", default="1e-8", help="Doerfler's tie rule ('none': plain Doerfler)")
    ap.add_argument("--backend", choices=["cpu", "gpu"], default="cpu")
    ap.add_argument("--mesh", choices=["forest", "replicated"], default="forest",
                    help="forest: the distributed forest (a rank holds its cells and a ghost layer); "
                         "replicated: the whole mesh on every rank (every GPU), set-up and solve distributed")
    ap.add_argument("--max-dofs", type=float, default=2e5, help="stop once the forest has this many nodes")
    ap.add_argument("--steps", type=int, default=100, help="at most this many refinements")
    ap.add_argument("--theta", type=float, default=0.5, help="Doerfler's bulk parameter")
    ap.add_argument("--rtol", type=float, default=1e-8)
    ap.add_argument("--uniform", type=int, default=None,
                    help="uniform refinements of the roots first (default: 3 for the L-shapes, 2 for Fichera)")
    ap.add_argument("--agglomerate-below", type=int, default=None,
                    help="levels with fewer nodes on rank 0 (default: solve_forest's 'auto')")
    ap.add_argument("--no-errors", action="store_true",
                    help="skip the errors (host quadrature of the exact solution; Fichera's goal)")
    ap.add_argument("--timeout", type=float, default=1800)
    ap.add_argument("--progress", action="store_true",
                    help="rank 0 prints each step's line as it finishes (to stderr)")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.uniform is None:
        args.uniform = PROBLEMS[args.problem][0]
    if args.tie_rtol != "none":
        try:
            float(args.tie_rtol)
        except ValueError:
            ap.error(f"--tie-rtol must be a number or 'none', got {args.tie_rtol!r}")
    if args.mesh == "replicated" and args.problem == "lshape":
        ap.error("--mesh replicated solves with homogeneous Dirichlet data: --problem lshape0 or fichera")
    (worker if args.worker else driver)(args)


if __name__ == "__main__":
    main()
