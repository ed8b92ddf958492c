"""Benchmark: the distributed forest (adaptmg.distributed.forest) -- per-rank cells, memory and
set-up seconds against the rank count.

Driver (one ``mpiexec -n P`` launch per P)::

    python scripts/bench_forest.py --ranks 1 2 --mode strong --levels 6     # one 2.1M-cell box
    python scripts/bench_forest.py --ranks 1 2 --mode weak --levels 6       # 2.1M cells per rank

The mesh is the box [0, P_x] x [0, 1]^2 with 2 P_x x 2 x 2 root cells (P_x = P for weak
scaling: 8 roots per rank, 1 for strong), refined uniformly ``--levels`` times
(``DistributedForest.refine()``), then the global node numbering, one local refinement (a
ball at the origin, marked on the owning ranks; its 2:1 closure crosses ranks), a
repartition, the numbering again, the owned rows of the Q1 stiffness matrix and of its
constrained form (:mod:`adaptmg.distributed.forest_rows`) and the global-coarsening
hierarchy down to the roots (``coarsen_once``).  Printed per P: owned leaves, ghosts, the local
forest's cells and bytes (``local_nbytes``) and the process's peak resident memory (max over
ranks), and the seconds of each phase (max over ranks).  ``--serial`` also times the serial
``Mesh`` (box, the same refinements, its node numbering) in the P = 1 process.  All of it
runs on the host (the forest has no device path yet); on a machine with fewer cores than
ranks the ranks share cores and the seconds mean little.
"""
import argparse
import json
import os
import resource
import subprocess
import sys
import time

import numpy as np


def worker(args):
    from mpi4py import MPI

    from adaptmg.distributed.forest import DistributedForest
    from adaptmg.distributed.forest_rows import owned_constrained_rows, owned_rows
    from adaptmg.mesh import Mesh
    comm = MPI.COMM_WORLD
    P = comm.Get_size()
    px = P if args.mode == "weak" else 1
    box = ([0.0] * 3, [float(px), 1.0, 1.0], [2 * px, 2, 2])
    t = {}

    def phase(name, f):
        comm.Barrier()
        t0 = time.perf_counter()
        out = f()
        t[name] = time.perf_counter() - t0
        return out

    df = phase("box", lambda: DistributedForest.box(*box, comm=comm))

    def uniform():
        d = df
        for _ in range(args.levels):
            d = d.refine()
        return d
    df = phase("refine", uniform)
    phase("numbering", lambda: df.node_gid)
    n_uniform = df.global_num_cells
    nodes = df.num_global_nodes
    r = 0.15 * px
    df = phase("local refine", lambda: df.refine(lambda x: np.linalg.norm(x, axis=1) < r))
    before = (df.num_owned, df.num_ghosts)
    df = phase("repartition", lambda: df.repartition())
    phase("numbering 2", lambda: df.node_gid)
    phase("A rows", lambda: owned_rows(df))                   # Q1 stiffness, owned rows
    phase("K rows", lambda: owned_constrained_rows(df))       # constrained, Dirichlet everywhere

    def hierarchy():                              # global coarsening down to the roots
        d, levels = df, [df]
        while d.global_num_cells > 8 * px:
            d = d.coarsen_once()
            levels.append(d)
        return levels
    levels = phase("coarsen", hierarchy)
    rec = dict(P=P, cells=n_uniform, nodes=nodes, cells_adapted=df.global_num_cells,
               owned=df.num_owned, ghosts=df.num_ghosts, owned_before=before[0], ghosts_before=before[1],
               forest=df.mesh._forest.num_cells, nbytes=df.local_nbytes(), levels=len(levels),
               rss=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, t=t)
    if args.serial and P == 1:
        t0 = time.perf_counter()
        m = Mesh.box(*box)
        for _ in range(args.levels):
            m = m.refine()
        m.num_nodes
        rec["serial_uniform"] = time.perf_counter() - t0
        assert m.num_nodes == nodes and m.num_cells == n_uniform
    recs = comm.gather(rec, root=0)
    if comm.rank == 0:
        with open(args.out, "w") as f:
            json.dump(recs, f)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ranks", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--mode", choices=["weak", "strong"], default="strong")
    ap.add_argument("--levels", type=int, default=6, help="uniform refinements of the 8 P_x roots")
    ap.add_argument("--serial", action="store_true", help="also time the serial Mesh at P = 1")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(args)
    from adaptmg.distributed.comm import find_mpiexec, mpiexec_command
    mpiexec = find_mpiexec()
    if mpiexec is None:
        sys.exit("bench_forest: needs mpi4py and an mpiexec (pip install 'adaptmg[mpi]')")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", ADAPTMG_THREADS="1",
               PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    print(f"{args.mode} scaling, box of 8 P_x roots refined {args.levels} times (host)")
    phases = ["box", "refine", "numbering", "local refine", "repartition", "numbering 2", "A rows", "K rows",
              "coarsen"]
    print(f"{'P':>3} {'cells':>10} {'owned':>9} {'ghosts':>7} {'forest':>9} {'MB local':>8} {'MB rss':>7}  "
          + " ".join(f"{p:>12}" for p in phases) + "   total s")
    for P in args.ranks:
        out = os.path.join(root, "out", f"bench_forest_{P}.json")
        os.makedirs(os.path.dirname(out), exist_ok=True)
        cmd = mpiexec_command(P, mpiexec) + [sys.executable, os.path.abspath(__file__), "--worker",
                                             "--out", out, "--mode", args.mode, "--levels", str(args.levels)]
        if args.serial:
            cmd.append("--serial")
        r = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if r.returncode:
            sys.exit(r.stdout + r.stderr)
        with open(out) as f:
            recs = json.load(f)
        t = {p: max(rc["t"][p] for rc in recs) for p in phases}
        mx = {k: max(rc[k] for rc in recs) for k in ("owned", "ghosts", "forest", "nbytes", "rss")}
        print(f"{P:>3} {recs[0]['cells']:>10,} {mx['owned']:>9,} {mx['ghosts']:>7,} {mx['forest']:>9,} "
              f"{mx['nbytes'] / 2**20:>8.1f} {mx['rss'] / 2**20:>7.0f}  "
              + " ".join(f"{t[p]:>12.3f}" for p in phases) + f"   {sum(t.values()):.2f}")
        print(f"    adapted {recs[0]['cells_adapted']:,} cells; before the repartition owned "
              f"{[rc['owned_before'] for rc in recs]}, after {[rc['owned'] for rc in recs]}; "
              f"nodes {recs[0]['nodes']:,}; coarsening hierarchy of {recs[0]['levels']} levels")
        if "serial_uniform" in recs[0]:
            print(f"    serial Mesh: box + {args.levels} refinements + node numbering "
                  f"{recs[0]['serial_uniform']:.3f} s")


if __name__ == "__main__":
    main()
