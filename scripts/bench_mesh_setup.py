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

``--backend gpu --device-mesh`` also times the numbering (``mesh._node_numbering``), the
hanging-node data (``mesh._hanging``) and ``hierarchy()`` of ``mesh.to("gpu")`` -- the same
phases on CuPy arrays, after an untimed warm-up run (kernel compilation; its time is shown
as "first"), synchronised before each clock read -- next to the host mesh's, with the ratio
host / device and whether the device's cells, node ids and hanging parents equal the host's.

``--repeat N`` reports the fastest of N runs of each phase; ``--profile N`` prints cProfile's N functions with the most own time of each case's phases;
``--digest`` prints a SHA-1 of every output (cells, points, node ids, levels, hanging nodes /
parents / owners / pairs, boundary ids, regions and every mesh of the hierarchy): equal
digests before and after a change mean bit-identical outputs.

    OPENBLAS_NUM_THREADS=1 python scripts/bench_mesh_setup.py
    OPENBLAS_NUM_THREADS=1 python scripts/bench_mesh_setup.py --backend gpu --digest
    python scripts/bench_mesh_setup.py --backend gpu --device-mesh --repeat 3
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


DEVICE_PHASES = ("numbering", "hanging", "hierarchy")


def device_phases(mesh, repeat):
    """{(phase, where): seconds} of :data:`DEVICE_PHASES` on fresh copies (no cached
    properties) of the host ``mesh`` and of ``mesh.to("gpu")`` (fastest of ``repeat`` runs;
    on the device after an untimed warm-up, whose times are kept as ``(phase, "first")``),
    the seconds of the move, and whether the device's integers equal the host's.  A phase
    that fails on the device is reported with its error, not left out."""
    from adaptmg import Mesh
    from adaptmg.backend import to_host
    t0 = time.perf_counter()
    g = mesh.to("gpu")
    g.backend.synchronize()
    t_move = time.perf_counter() - t0
    t = {}
    for where, src in (("cpu", mesh), ("gpu", g)):
        be = src.backend
        for r in range(repeat + (where == "gpu")):
            m = Mesh(src._forest, src._active)
            for name, f in zip(DEVICE_PHASES, (lambda: m._node_numbering, lambda: m._hanging,
                                               lambda: m.hierarchy())):
                if isinstance(t.get((name, where)), str):
                    continue
                be.synchronize()
                t0 = time.perf_counter()
                try:
                    f()
                    be.synchronize()
                except Exception as exc:          # reported in the table: the device path lacks it
                    t[(name, where)] = f"{type(exc).__name__}: {exc}"[:60]
                    continue
                dt = time.perf_counter() - t0
                key = (name, "first") if where == "gpu" and r == 0 else (name, where)
                t[key] = min(dt, t.get(key, np.inf))
            if where == "gpu" and r == repeat:
                try:
                    same = (np.array_equal(to_host(m.cells), mesh.cells)
                            and np.array_equal(to_host(m.node_ids), mesh.node_ids)
                            and np.array_equal(to_host(m.hanging_parents), mesh.hanging_parents))
                except Exception as exc:          # the phase failed above: said there
                    same = type(exc).__name__
    return t, t_move, same


def print_device_table(rows):
    print("\ndevice mesh (mesh.to('gpu')) vs host mesh, seconds (device: synchronised, warm; "
          "first: the warm-up run)")
    print(f"{'case':>8} {'size':>7} {'cells':>9} {'phase':>10} {'host s':>8} {'gpu s':>8} {'first s':>8} "
          f"{'host/gpu':>8}  same")
    for case, size, nc, (t, t_move, same) in rows:
        print(f"{case:>8} {size:>7g} {nc:>9} {'to(gpu)':>10} {'':>8} {t_move:8.4f}")
        for ph in DEVICE_PHASES:
            h, d, f = t.get((ph, "cpu")), t.get((ph, "gpu")), t.get((ph, "first"))
            if isinstance(d, str) or isinstance(h, str):
                print(f"{case:>8} {size:>7g} {nc:>9} {ph:>10} {'':>8} failed: {d if isinstance(d, str) else h}")
                continue
            print(f"{case:>8} {size:>7g} {nc:>9} {ph:>10} {h:8.4f} {d:8.4f} {f:8.4f} {h / d:8.1f}  {same}")


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
    ap.add_argument("--device-mesh", action="store_true",
                    help="with --backend gpu: also time numbering / hanging / hierarchy on mesh.to('gpu')")
    a = ap.parse_args()
    if a.device_mesh and a.backend != "gpu":
        ap.error("--device-mesh needs --backend gpu")
    dev_rows = []
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
            if a.device_mesh:
                dev_rows.append((case, size, mesh.num_cells, device_phases(mesh, a.repeat)))
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
    if dev_rows:
        print_device_table(dev_rows)


if __name__ == "__main__":
    main()
