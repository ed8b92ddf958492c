"""Benchmark: the first ``adaptmg.amg`` set-up + solve of a fresh process with empty kernel caches.

Issue 36's cold-start target for the project's own algebraic multigrid: a process whose first
GPU work is ``adaptmg.amg(A)`` on a host-built matrix (3-D Q1 Poisson, the adaptive mesh of
``scripts/bench_distributed.py``, about ``--dofs`` DoFs, constrained on the CPU).  The parent
runs a child process with ``CUPY_CACHE_DIR`` and ``ADAPTMG_KERNEL_CACHE`` set to empty folders
(the first run on a machine: the package's shipped cubins serve what they hold, the kernel
manifest's workers start beside it for the rest, as they would; ``--no-bundle`` leaves the
shipped cubins out, as on an architecture the package has none for);
the child times ``amg`` set-up and CG solve to rtol 1e-8 twice: first (cold) and again (warm).

    python scripts/bench_cold_amg.py --dofs 3e5
"""
import argparse
import os
import subprocess
import sys
import tempfile
import time


def child(args):
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import numpy as np
    import adaptmg
    from adaptmg import assemble
    from adaptmg.backend import get_backend
    from bench_distributed import make_mesh
    mesh = make_mesh(3, 1, args.dofs)
    A = adaptmg.multigrid(adaptmg.Space(mesh, 1), assemble.stiffness, dirichlet="all", backend="cpu").A
    b = np.ones(A.shape[0])
    for label in ("first", "warm"):
        t = time.perf_counter()
        gpu = get_backend("gpu")
        amg = adaptmg.amg(A, backend=gpu)
        gpu.synchronize()
        t_setup = time.perf_counter() - t
        amg.solve(gpu.asarray(b), rtol=1e-8, accel="cg")
        gpu.synchronize()
        print(f"{label:6s} {A.shape[0]:>10,} DoFs | amg set-up {t_setup:7.3f} s | set-up + solve "
              f"{time.perf_counter() - t:7.3f} s | CG its {amg.last_iterations}", flush=True)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dofs", type=float, default=3e5)
    ap.add_argument("--no-bundle", action="store_true", help="without the package's shipped cubins")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        return child(args)
    with tempfile.TemporaryDirectory() as cupy_cache, tempfile.TemporaryDirectory() as ours:
        env = dict(os.environ, CUPY_CACHE_DIR=cupy_cache, ADAPTMG_KERNEL_CACHE=ours,
                   ADAPTMG_KERNEL_BUNDLE="0" if args.no_bundle else "1")
        return subprocess.call([sys.executable, os.path.abspath(__file__), "--child",
                                "--dofs", str(args.dofs)], env=env)


if __name__ == "__main__":
    sys.exit(main())
