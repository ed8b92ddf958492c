"""Benchmark: the mesh's forest, refinement and global coarsening on the host and on the device.

Times, per backend in one run, building the mesh on that backend and its ``hierarchy()``
(global coarsening), for

* ``uniform``: ``Mesh.box([0,1]^3, 2^3 cells, backend=)`` refined ``k`` times (``--refine``,
  default 6: 2,146,689 nodes);
* ``adaptive``: the family of ``scripts/bench_distributed.py`` (``make_mesh(3, 1, target)``:
  the box refined uniformly while 8 x its nodes stay within ``target``, then one local
  refinement of the cells whose centre lies within 0.2 of (0.3, 0.3, 0.3)), built here on the
  backend from the forest's tables (its node counts in closed form, the centres from the
  forest's coordinates: the same numbers without the node numbering); ``--targets``, default
  3e5 and 2.6e6 (340,709 and 2,657,684 nodes).

``--backend gpu`` runs the host and the device and prints their ratio (device seconds after a
synchronisation; each device case is run once untimed first, so CuPy's kernel compilation is
not in the figures); then checks that the device's forest tables and active cells equal the
host's.  ``--backend cpu``: the host only.  ``--repeat N``: the fastest of N runs.

    python scripts/bench_mesh_device.py --backend gpu
"""
import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def uniform(be, k):
    from adaptmg import Mesh
    m = Mesh.box([0.0] * 3, [1.0] * 3, [2] * 3, backend=be)
    for _ in range(k):
        m = m.refine()
    return m


def make_mesh(be, dim, px, target):
    """``bench_distributed.make_mesh(dim, px, target)`` on the backend ``be``."""
    from adaptmg import Mesh
    from adaptmg.mesh._tree import _mean_of
    n = np.array([2 * px] + [2] * (dim - 1))
    m = Mesh.box([0.0] * dim, [float(px)] + [1.0] * (dim - 1), n.tolist(), backend=be)
    while np.prod(n + 1) * 2 ** dim <= target:       # make_mesh's rule: the uniform box's nodes
        m = m.refine()
        n = 2 * n
    acn = m._active_cell_nodes()
    c = _mean_of(m._forest.X, [acn[:, j] for j in range(acn.shape[1])])
    xp = m.backend.xp
    return m.refine(xp.sqrt(((c - 0.3) ** 2).sum(axis=1)) < 0.2)


def build(case, size, be):
    return uniform(be, int(size)) if case == "uniform" else make_mesh(be, 3, 1, size)


def timed(case, size, be, repeat):
    """(mesh, hierarchy, best mesh seconds, best hierarchy seconds) on the backend ``be``."""
    from adaptmg.backend import get_backend
    sync = get_backend(be).synchronize
    best = [np.inf, np.inf]
    mesh = hier = None
    for _ in range(repeat):
        del mesh, hier                               # the last run's memory back first
        sync()
        t0 = time.perf_counter()
        mesh = build(case, size, be)
        sync()
        t1 = time.perf_counter()
        hier = mesh.hierarchy()
        sync()
        t2 = time.perf_counter()
        best = [min(best[0], t1 - t0), min(best[1], t2 - t1)]
    return mesh, hier, best[0], best[1]


def same(a, b) -> bool:
    """Whether the forests and active cells of meshes ``a`` (device) and ``b`` (host) agree:
    integers exactly, coordinates to 4 ulps."""
    from adaptmg.backend import to_host
    from adaptmg.mesh._tree import ARRAYS
    for f in ARRAYS:
        x, y = getattr(a._forest, f), getattr(b._forest, f)
        if (x is None) != (y is None):
            return False
        if x is None:
            continue
        x = to_host(x)
        if f == "X":
            if not np.allclose(x, y, rtol=4 * np.finfo(float).eps, atol=0):
                return False
        elif x.dtype != y.dtype or not np.array_equal(x, y):
            return False
    return np.array_equal(to_host(a.cell_ids), b.cell_ids)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend", choices=("cpu", "gpu"), default="gpu")
    ap.add_argument("--cases", default="uniform,adaptive")
    ap.add_argument("--refine", default="6", help="uniform: numbers of uniform refinements")
    ap.add_argument("--targets", default="3e5,2.6e6", help="adaptive: node targets of make_mesh")
    ap.add_argument("--repeat", type=int, default=2, help="report the fastest of N runs")
    a = ap.parse_args(argv)
    backends = ["cpu"] + (["gpu"] if a.backend == "gpu" else [])
    if a.backend == "gpu":
        from adaptmg.backend import get_backend
        get_backend("gpu")                           # a clear error where there is no device
    rows = []
    for case in a.cases.split(","):
        if case not in ("uniform", "adaptive"):
            raise SystemExit(f"unknown case {case!r}: uniform or adaptive")
        sizes = [int(s) for s in a.refine.split(",")] if case == "uniform" else \
            [float(s) for s in a.targets.split(",")]
        for size in sizes:
            got = {}
            for be in backends:
                if be == "gpu":
                    build(case, size, be).hierarchy()   # CuPy's kernels compiled outside the clock
                got[be] = timed(case, size, be, a.repeat)
            host = got["cpu"]
            row = dict(case=case, size=size, cells=host[0].num_cells, levels=len(host[1]),
                       mesh_cpu=host[2], hier_cpu=host[3])
            if "gpu" in got:
                dev = got["gpu"]
                row.update(mesh_gpu=dev[2], hier_gpu=dev[3], same=same(dev[0], host[0]) and
                           all(same(d, h) for d, h in zip(dev[1], host[1])))
            rows.append(row)
            print(f"{case} {size:g}: {row['cells']} cells, {row['levels']} levels", flush=True)
    gpu = a.backend == "gpu"
    print(f"{'case':>8} {'size':>7} {'cells':>9} {'lev':>3} {'mesh cpu s':>10} {'hier cpu s':>10}"
          + (f" {'mesh gpu s':>10} {'hier gpu s':>10} {'mesh x':>7} {'hier x':>7} {'same':>4}" if gpu else ""))
    for r in rows:
        line = (f"{r['case']:>8} {r['size']:>7g} {r['cells']:>9} {r['levels']:>3} "
                f"{r['mesh_cpu']:10.3f} {r['hier_cpu']:10.3f}")
        if gpu:
            line += (f" {r['mesh_gpu']:10.3f} {r['hier_gpu']:10.3f} {r['mesh_cpu'] / r['mesh_gpu']:7.1f}"
                     f" {r['hier_cpu'] / r['hier_gpu']:7.1f} {'yes' if r['same'] else 'NO':>4}")
        print(line)
    if gpu:
        print("x: host seconds / device seconds; same: device forest tables and active cells of the "
              "mesh and of every hierarchy level == host's")
    return rows


if __name__ == "__main__":
    main()
