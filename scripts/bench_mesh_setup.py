"""Benchmark: the host time of the mesh part of the set-up, phase by phase (issue 36).

For each case it times building the mesh (``Mesh.box`` + ``refine()`` x k, and for the
adaptive family one local refinement), the hanging-node data (``mesh._hanging``: nodes,
parents, owners, the (node, cell) pairs), ``mesh.hierarchy()`` (global coarsening) and
``Space(mesh, 1).cell_dofs`` (the node numbering).  All of it is host NumPy code that the
GPU backend runs too, so ``--backend`` only selects where ``import adaptmg`` checks for a
device; the numbers are host seconds.

Cases:

* ``adaptive``: the family of ``scripts/bench_distributed.py`` (``make_mesh(3, 1, target)``:
  uniform refinement to about ``target`` DoFs plus one local refinement) for every target of
  ``--targets`` (default 3e5 and 2.6e6: 340,709 and 2,657,684 DoFs).
* ``uniform``: the box [0,1]^3 with 2^3 cells refined ``--refine`` times (default 5 and 6).

``--repeat N`` reports the fastest of N runs of each phase; ``--profile N`` prints cProfile's N functions with the most own time of each case's phases;
``--digest`` prints a SHA-1 of every output (cells, points, node ids, levels, hanging nodes /
parents / owners / pairs, boundary ids, regions and every mesh of the hierarchy): equal
digests before and after a change mean bit-identical outputs.

    OPENBLAS_NUM_THREADS=1 python scripts/bench_mesh_setup.py
    OPENBLAS_NUM_THREADS=1 python scripts/bench_mesh_setup.py --backend gpu --digest
"""
import argparse
import cProfile
import hashlib
import io
import os
import pstats
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def mesh_digest(mesh) -> str:
    """SHA-1 of everything the mesh set-up produces for ``mesh`` (its hierarchy included)."""
    h = hashlib.sha1()

    def add(*arrays):
        for a in arrays:
            a = np.ascontiguousarray(a)
            h.update(str((a.dtype.str, a.shape)).encode())
            h.update(a.tobytes())

    for m in mesh.hierarchy():
        hn, hp, ho, (pn, pc) = m._hanging
        add(m.cells, m.points, m.node_ids, m.cell_ids, m.levels, m.boundary_ids, m.regions,
            hn, hp, ho, pn, pc)
    return h.hexdigest()


def build(case, size):
    from adaptmg import Mesh
    if case == "adaptive":
        from bench_distributed import make_mesh
        return make_mesh(3, 1, size)
    m = Mesh.box([0.0] * 3, [1.0] * 3, [2] * 3)
    for _ in range(int(size)):
        m = m.refine()
    return m


def run(case, size, profile):
    from adaptmg import Space
    prof = cProfile.Profile() if profile else None
    t = {}

    def phase(name, f):
        if prof:
            prof.enable()
        t0 = time.perf_counter()
        out = f()
        t[name] = time.perf_counter() - t0
        if prof:
            prof.disable()
        return out

    mesh = phase("mesh", lambda: build(case, size))
    phase("cell_dofs", lambda: Space(mesh, 1).cell_dofs)
    phase("hanging", lambda: mesh._hanging)
    hier = phase("hierarchy", lambda: mesh.hierarchy())
    return mesh, hier, t, prof


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend", choices=("cpu", "gpu"), default="cpu",
                    help="gpu: check that a device is there (the timed code is host NumPy either way)")
    ap.add_argument("--cases", default="adaptive,uniform")
    ap.add_argument("--targets", default="3e5,2.6e6", help="adaptive: DoF targets of make_mesh")
    ap.add_argument("--refine", default="5,6", help="uniform: numbers of uniform refinements")
    ap.add_argument("--profile", type=int, default=0, metavar="N")
    ap.add_argument("--repeat", type=int, default=1, help="report each phase's fastest of N runs")
    ap.add_argument("--digest", action="store_true", help="print a SHA-1 of all outputs")
    a = ap.parse_args()
    if a.backend == "gpu":
        from adaptmg.backend import get_backend
        get_backend("gpu")
    rows = []
    for case in a.cases.split(","):
        sizes = [float(s) for s in a.targets.split(",")] if case == "adaptive" else \
            [int(s) for s in a.refine.split(",")]
        for size in sizes:
            mesh, hier, t, prof = run(case, size, a.profile)
            for _ in range(a.repeat - 1):                  # the fastest of the repeats, phase by phase
                del mesh, hier
                mesh, hier, t2, _ = run(case, size, 0)
                t = {k: min(v, t2[k]) for k, v in t.items()}
            dg = mesh_digest(mesh)[:12] if a.digest else ""
            rows.append((case, size, mesh.num_nodes, mesh.num_cells, mesh.num_hanging_nodes, len(hier), t, dg))
            print(f"{case} {size:g}: {mesh}, {len(hier)} levels", flush=True)
            if prof:
                s = io.StringIO()
                pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(a.profile)
                print(s.getvalue())
    print(f"{'case':>8} {'size':>7} {'DoFs':>9} {'cells':>9} {'hanging':>7} {'lev':>3} {'mesh s':>7} "
          f"{'hanging s':>9} {'hier s':>7} {'cell_dofs s':>11} {'total s':>7}" + ("  digest" if a.digest else ""))
    for case, size, nn, nc, nh, nl, t, dg in rows:
        print(f"{case:>8} {size:>7g} {nn:>9} {nc:>9} {nh:>7} {nl:>3} {t['mesh']:7.3f} {t['hanging']:9.3f} "
              f"{t['hierarchy']:7.3f} {t['cell_dofs']:11.3f} {sum(t.values()):7.3f}  {dg}")


if __name__ == "__main__":
    main()
