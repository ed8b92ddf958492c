"""Many right-hand sides: k solves of 2-D Q1 Poisson as one block vs one at a time.

    python scripts/bench_block.py --backend gpu --n 1024 --k 32     # 1.05M DoFs on the H200
    python scripts/bench_block.py --backend cpu --n 256 --k 32      # 66k DoFs on a host

The mesh is ``Mesh.box`` on the unit square with ``--n`` cells a side made by uniform
refinement of a 4 x 4 box, the hierarchy ``adaptmg.multigrid`` (Dirichlet on the whole
boundary), the right-hand sides ``k`` random load vectors.  Every solve is multigrid-CG
(``accel="cg"``, V-cycle) to ``rtol``; the block solve is ``ml.solve(B)`` with ``B`` of
shape ``(n, k)``.  Times are medians of ``--repeat`` runs after one warm-up; the table
prints one solve, k solves one at a time, the block solve, and the ratio block / one
(the target: <= 6 on the H200 at 1.05M DoFs and k = 32, <= 12 on the CPU backend).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def _timed(be, f, repeat):
    ts = []
    for _ in range(repeat + 1):                # the first run warms up (plans, graphs)
        be.synchronize()
        t = time.perf_counter()
        out = f()
        be.synchronize()
        ts.append(time.perf_counter() - t)
    return float(np.median(ts[1:])), out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", choices=("cpu", "gpu"), default="cpu")
    ap.add_argument("--n", type=int, default=256, help="cells a side (a power of two >= 4)")
    ap.add_argument("--k", type=int, default=32, help="right-hand sides")
    ap.add_argument("--rtol", type=float, default=1e-8)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args(argv)
    if a.n < 4 or a.n & (a.n - 1):
        ap.error(f"--n must be a power of two >= 4, got {a.n}")
    if a.k < 2:
        ap.error(f"--k must be at least 2, got {a.k}")
    import adaptmg
    from adaptmg import assemble
    from adaptmg.backend import get_backend
    be = get_backend(a.backend)
    mesh = adaptmg.Mesh.box([0, 0], [1, 1], [4, 4])
    for _ in range(int(np.log2(a.n // 4))):
        mesh = mesh.refine()
    space = adaptmg.Space(mesh, degree=1)
    ml = adaptmg.multigrid(space, assemble.stiffness, dirichlet="all", backend=be)
    n = ml.levels[-1].n
    rng = np.random.default_rng(0)
    B = be.asarray(rng.standard_normal((n, a.k)))
    cols = [be.xp.ascontiguousarray(B[:, j]) for j in range(a.k)]
    t1, _ = _timed(be, lambda: ml.solve(cols[0], rtol=a.rtol, accel="cg"), a.repeat)
    it1 = ml.last_iterations
    tk, _ = _timed(be, lambda: [ml.solve(c, rtol=a.rtol, accel="cg") for c in cols], a.repeat)
    tb, X = _timed(be, lambda: ml.solve(B, rtol=a.rtol, accel="cg"), a.repeat)
    its = np.asarray(ml.last_iterations)
    R = B - ml._A_outer @ X
    rel = be.xp.linalg.norm(R, axis=0) / be.xp.linalg.norm(B, axis=0)
    worst = float(be.xp.max(rel))
    print(f"## Block multigrid-CG, 2-D Q1 Poisson, {n:,} DoFs, k = {a.k}, rtol = {a.rtol:g}, "
          f"backend {be.name}, {len(ml.levels)} levels")
    print("| solve | time [ms] | iterations | per right-hand side [ms] |")
    print("|---|---:|---:|---:|")
    print(f"| one right-hand side | {1e3 * t1:.2f} | {it1} | {1e3 * t1:.2f} |")
    print(f"| {a.k} one at a time | {1e3 * tk:.2f} | {it1} each | {1e3 * tk / a.k:.2f} |")
    print(f"| {a.k} as one block | {1e3 * tb:.2f} | {its.min()}-{its.max()} | "
          f"{1e3 * tb / a.k:.2f} |")
    print(f"\nblock / one solve = {tb / t1:.2f}x (one at a time: {tk / t1:.1f}x); "
          f"worst relative residual of a column {worst:.2e}")
    plan = ml._preconditioners[("block", "V")].levels[-1].Aplan
    print(f"fine-level SpMM: {type(plan).__name__}"
          f"{'' if getattr(plan, 'why', None) is None else ' -- ' + plan.why}")
    return {"one": t1, "loop": tk, "block": tb, "ratio": tb / t1, "worst": worst}


if __name__ == "__main__":
    main()
