"""Benchmark: the Q1 prolongations P_l of a geometric hierarchy (issue 36, ``transfer.prolongation``).

For each case it builds the mesh, its global-coarsening hierarchy, the Q1 spaces (``--components``)
and every level's free-DoF mask (Dirichlet on the whole boundary, as ``multigrid(..., dirichlet=
"all")``), then times ``prolongation(coarse, fine, free_c, free_f, backend=...)`` for every level
pair, fine to coarse -- the work of the set-up tasks 'transfer l' of ``multigrid()`` without
``R = P^T``.  On the GPU it synchronises after each call and runs one untimed warm-up pass first
(kernel compilation).  Columns: the finest level's DoFs, levels, nnz of the finest P, the sum
over all level pairs and the finest pair alone (fastest of ``--repeat`` runs), and whether the
SHA-1 of all P's (indptr, indices, data) equals the one recorded with the code before issue 36's
rewrite (commit 6ca4b53, CPU): 'same' means bit-identical results.

Cases:

* ``uni2``: ``Mesh.box([0,0],[1,1],[2,2])`` refined 9 times (1,050,625 nodes, no hanging nodes).
* ``lshape``: the L-shape of ``problems/lshape.py`` graded towards the re-entrant corner (cells
  with h > 40 h0 (r + h)^(2/3) refined until none is left, h0 = 8e-5: 1,619,804 nodes, 24 levels,
  hanging nodes on most levels) -- an adaptive loop's final-type mesh.
* ``adapt3``: ``make_mesh(3, 1, 2.6e6)`` of ``scripts/bench_distributed.py`` (2,657,684 nodes).

``--profile N`` prints cProfile's N functions with the most own time per case; ``--small`` runs
meshes of about 1e4 nodes (the test of this script).

Measured (CPU backend, 2-core VM shared with other jobs, one BLAS thread; the old code of commit
6ca4b53 and the new one alternated in one process, fastest of 3), seconds for all level pairs /
the finest pair:

    case      c   before          after
    uni2      1   0.218 / 0.152   0.160 / 0.116
    uni2      3   0.590 / 0.414   0.300 / 0.235
    lshape    1   0.314 / 0.176   0.202 / 0.150   (levels below 10k DoFs: 2.2-7.9 ms -> 0.2-1.2 ms)
    lshape    3   0.864 / 0.615   0.388 / 0.308
    adapt3    1   0.544 / 0.450   0.433 / 0.385
    adapt3    3   2.108 / 1.864   0.920 / 0.826

On the GPU the host part of a transfer is now the upload of the two meshes' node ids and the
masks (the forest tables once per forest); every index step runs on the device.

    OPENBLAS_NUM_THREADS=1 python scripts/bench_transfer.py
    python scripts/bench_transfer.py --backend gpu
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

# SHA-1 of every P of a case (fine to coarse) with the code of commit 6ca4b53 ("small": --small)
DIGESTS = {
           ("uni2", 1): "9eb11a63cda3f3db74a11c3a814e733a4a024df8",
           ("uni2", 3): "28c0bb726f479f535f7b31591c09a2939795efb3",
           ("lshape", 1): "1f7498520d3c845ff902cb011f57312a6d7326eb",
           ("lshape", 3): "4425499cff7d5949088de44cefe128d9d049f274",
           ("adapt3", 1): "8be60fdf4ed43477923346b92d7891f7452715fd",
           ("adapt3", 3): "38b581b322cee95c74ad217224ab3941812f0914",
           ("uni2", 1, "small"): "423c5ba4eca8ef69cb01a56143f64bb127e57386",
           ("uni2", 3, "small"): "6c57e8e65754459413ecfdb1a34b25f4588cd5d6",
           ("lshape", 1, "small"): "b52547db631bb4bc36af61cfb60948ac61ceb01c",
           ("lshape", 3, "small"): "9647ca8057cb04e8ea07cbf7bb92a6f313a0af8f",
           ("adapt3", 1, "small"): "121f5a62eac112d975b452a425ecd69aae2f76e4",
           ("adapt3", 3, "small"): "6f0b18e2da627ae44b158d9386afcefb2c02a544",
}


def lshape_mesh(h0):
    """The L-shape (12 squares of side 1/2, the coarse mesh of problems/lshape.py) graded towards
    the re-entrant corner at the origin."""
    from adaptmg import Mesh
    m = Mesh.box([-1.0, -1.0], [1.0, 1.0], [4, 4])
    c = m.cell_vertices().mean(1)
    m = Mesh.from_cells(m.points, m.cells[~((c[:, 0] > 0) & (c[:, 1] < 0))])
    while True:
        v = m.cell_vertices()
        h = v[:, -1, 0] - v[:, 0, 0]
        r = np.linalg.norm(v.mean(1), axis=1)
        marked = np.flatnonzero(h > 40 * h0 * (r + h) ** (2 / 3))
        if marked.size == 0:
            return m
        m = m.refine(marked)


def build(case, small=False):
    """The mesh of ``case``; ``small``: a version of about 1e4 nodes (for the tests)."""
    from adaptmg import Mesh
    if case == "uni2":
        m = Mesh.box([0.0, 0.0], [1.0, 1.0], [2, 2])
        for _ in range(5 if small else 9):
            m = m.refine()
        return m
    if case == "lshape":
        return lshape_mesh(2e-3 if small else 8e-5)
    if case == "adapt3":
        from bench_distributed import make_mesh
        return make_mesh(3, 1, 2e4 if small else 2.6e6)
    raise ValueError(f"unknown case {case!r}: uni2, lshape, adapt3")


def digest(mats):
    h = hashlib.sha1()
    for M in mats:
        for a in (M.indptr, M.indices, M.data):
            a = np.ascontiguousarray(a.get() if hasattr(a, "get") else a)
            h.update(str((a.dtype.str, a.shape)).encode())
            h.update(a.tobytes())
    return h.hexdigest()


def run_case(spaces, free, be, repeat, prof):
    from adaptmg.multilevel import transfer
    sync = be.xp.cuda.Device().synchronize if be.is_gpu else (lambda: None)
    L = len(spaces)
    best_all, best_fine, Ps = np.inf, np.inf, None
    for r in range(repeat + (1 if be.is_gpu else 0)):
        out, t_fine = [], 0.0
        transfer._FOREST_TABLES.clear()               # each run uploads the forest once, as multigrid() does
        sync()
        t0 = time.perf_counter()
        if prof is not None and r == repeat - 1:
            prof.enable()
        for l in range(L - 1, 0, -1):
            ta = time.perf_counter()
            out.append(transfer.prolongation(spaces[l - 1], spaces[l], free[l - 1], free[l], backend=be))
            sync()
            if l == L - 1:
                t_fine = time.perf_counter() - ta
        t = time.perf_counter() - t0
        if prof is not None:
            prof.disable()
        if be.is_gpu and r == 0:
            continue                                   # warm-up: kernel compilation
        best_all, best_fine, Ps = min(best_all, t), min(best_fine, t_fine), out
    return best_all, best_fine, Ps


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend", choices=("cpu", "gpu"), default="cpu")
    ap.add_argument("--cases", default="uni2,lshape,adapt3")
    ap.add_argument("--components", default="1,3")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--profile", type=int, default=0, metavar="N")
    ap.add_argument("--small", action="store_true", help="meshes of about 1e4 nodes (a smoke test)")
    a = ap.parse_args()
    from adaptmg import Space
    from adaptmg.backend import get_backend
    from adaptmg.multilevel.hierarchy import _level_constraints
    be = get_backend(a.backend)
    print(f"backend {a.backend}, fastest of {a.repeat}; seconds")
    print(f"{'case':8s} {'c':>2s} {'DoFs':>10s} {'levels':>6s} {'nnz(P_L)':>10s} {'mesh':>6s} "
          f"{'P all':>7s} {'P fine':>7s}  digest")
    for case in a.cases.split(","):
        t0 = time.perf_counter()
        meshes = build(case, a.small).hierarchy()
        t_mesh = time.perf_counter() - t0
        for c in map(int, a.components.split(",")):
            spaces = [Space(m, 1, c) for m in meshes]
            free = [_level_constraints(s, "all").free for s in spaces]
            prof = cProfile.Profile() if a.profile else None
            t_all, t_fine, Ps = run_case(spaces, free, be, a.repeat, prof)
            dg = digest(Ps)
            ref = DIGESTS.get((case, c) + (("small",) if a.small else ()))
            same = "same" if dg == ref else ("DIFFERS " + dg if ref else "(none recorded) " + dg)
            print(f"{case:8s} {c:2d} {spaces[-1].num_dofs:10d} {len(spaces):6d} {Ps[0].nnz:10d} "
                  f"{t_mesh:6.2f} {t_all:7.3f} {t_fine:7.3f}  {same}", flush=True)
            if prof is not None:
                s = io.StringIO()
                pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(a.profile)
                print(s.getvalue())
            del Ps, spaces, free


if __name__ == "__main__":
    main()
