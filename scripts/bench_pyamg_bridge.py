"""pyamg's CPU solve against the same hierarchy cycled by adaptmg on the GPU, in one run.

    python scripts/bench_pyamg_bridge.py [--n 1024] [--dim 2] [--repeat 3] [--backend auto]
    adaptmg bench pyamg_bridge --n 512

Problem: pyamg.gallery.poisson (5-point 2-D / 7-point 3-D Laplacian, n^dim
unknowns), random right-hand side, CG to rtol 1e-8.  Hierarchy: pyamg smoothed
aggregation with weighted Jacobi (omega = 4/(3 rho(D^-1 A)), 1 pre + 1 post
sweep) -- mapped exactly by ``from_pyamg``, so both solves apply the same
preconditioner and need the same number of CG iterations.  Then pyamg's
default (symmetric lexicographic Gauss-Seidel, CPU) against the same
hierarchy through ``from_pyamg`` with its default mapping: symmetric
*multicolour* Gauss-Seidel on the device (one kernel launch per colour).

Printed: setup times, per-V-cycle times, CG iterations and solve times (median
of ``--repeat`` runs after one warm-up), and the ratio pyamg CPU / adaptmg GPU.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
import warnings

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import pyamg  # noqa: E402

import adaptmg  # noqa: E402
from adaptmg.linalg import cg  # noqa: E402
from adaptmg.multilevel.pyamg import SmootherMappingWarning  # noqa: E402

JAC = ("jacobi", {"omega": 4.0 / 3.0})


def median_time(f, repeat, sync=lambda: None):
    f()
    sync()                                   # warm-up (kernel compilation, plans)
    ts = []
    out = None
    for _ in range(repeat):
        sync()
        t0 = time.perf_counter()
        out = f()
        sync()
        ts.append(time.perf_counter() - t0)
    return float(np.median(ts)), out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1024, help="points per direction (default 1024)")
    ap.add_argument("--dim", type=int, choices=[2, 3], default=2)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--rtol", type=float, default=1e-8)
    ap.add_argument("--backend", choices=["auto", "cpu", "gpu"], default="auto")
    ap.add_argument("--skip-gs", action="store_true", help="do not time pyamg's Gauss-Seidel default")
    a = ap.parse_args(argv)
    if a.n < 4 or a.repeat < 1:
        ap.error("--n must be >= 4 and --repeat >= 1")

    be = adaptmg.get_backend(a.backend)
    A = pyamg.gallery.poisson((a.n,) * a.dim, format="csr")
    b = np.random.default_rng(0).standard_normal(A.shape[0])
    nb = np.linalg.norm(b)
    print(f"Poisson {a.dim}-D, {A.shape[0]} unknowns, nnz {A.nnz}; adaptmg backend: {be.name}")

    t0 = time.perf_counter()
    ml = pyamg.smoothed_aggregation_solver(A, presmoother=JAC, postsmoother=JAC)
    t_setup_pyamg = time.perf_counter() - t0
    print(ml)

    # ---- pyamg on the CPU
    res = []
    t_cyc_pyamg, _ = median_time(lambda: ml.aspreconditioner(cycle="V") @ b, a.repeat)

    def pyamg_solve():
        res.clear()
        return ml.solve(b, tol=a.rtol, accel="cg", residuals=res, maxiter=500)
    t_pyamg, x = median_time(pyamg_solve, a.repeat)
    it_pyamg = len(res) - 1
    rel_pyamg = np.linalg.norm(b - A @ x) / nb

    # ---- the same hierarchy through adaptmg
    t0 = time.perf_counter()
    mg = adaptmg.from_pyamg(ml, backend=be)
    be.synchronize()
    t_setup_bridge = time.perf_counter() - t0
    Ad, bd = be.asmatrix(A), be.asarray(b)
    M = mg.aspreconditioner()
    t_cyc_mg, _ = median_time(lambda: M @ bd, a.repeat, be.synchronize)
    its = []

    def mg_solve():
        its.clear()
        return cg(Ad, bd, rtol=a.rtol, M=M, maxiter=500, callback=lambda xk: its.append(1))
    t_mg, (xd, info) = median_time(mg_solve, a.repeat, be.synchronize)
    rel_mg = float(np.linalg.norm(b - A @ np.asarray(adaptmg.backend.to_host(xd))) / nb)

    rows = [("pyamg SA-Jacobi, CPU", t_setup_pyamg, t_cyc_pyamg, it_pyamg, t_pyamg, rel_pyamg),
            (f"adaptmg from_pyamg, {be.name}", t_setup_bridge, t_cyc_mg, len(its), t_mg, rel_mg)]
    if not a.skip_gs:
        t0 = time.perf_counter()
        ml_gs = pyamg.smoothed_aggregation_solver(A)
        t_setup_gs = time.perf_counter() - t0
        res_gs = []

        def gs_solve():
            res_gs.clear()
            return ml_gs.solve(b, tol=a.rtol, accel="cg", residuals=res_gs, maxiter=500)
        t_cyc_gs, _ = median_time(lambda: ml_gs.aspreconditioner(cycle="V") @ b, a.repeat)
        t_gs, xg = median_time(gs_solve, a.repeat)
        rows.append(("pyamg SA-GS (default), CPU", t_setup_gs, t_cyc_gs, len(res_gs) - 1, t_gs,
                     np.linalg.norm(b - A @ xg) / nb))
        t0 = time.perf_counter()
        with warnings.catch_warnings():          # lexicographic -> multicolour: expected
            warnings.simplefilter("ignore", SmootherMappingWarning)
            mg_gs = adaptmg.from_pyamg(ml_gs, backend=be)
        be.synchronize()
        t_setup_mgs = time.perf_counter() - t0
        Mgs = mg_gs.aspreconditioner()
        t_cyc_mgs, _ = median_time(lambda: Mgs @ bd, a.repeat, be.synchronize)
        its_gs = []

        def mgs_solve():
            its_gs.clear()
            return cg(Ad, bd, rtol=a.rtol, M=Mgs, maxiter=500, callback=lambda xk: its_gs.append(1))
        t_mgs, (xgs, _) = median_time(mgs_solve, a.repeat, be.synchronize)
        rows.append((f"adaptmg multicolour GS, {be.name}", t_setup_mgs, t_cyc_mgs, len(its_gs), t_mgs,
                     float(np.linalg.norm(b - A @ np.asarray(adaptmg.backend.to_host(xgs))) / nb)))
        print(f"multicolour GS colours per level (fine -> coarse): "
              f"{[getattr(d.smoother, 'ncolors', '-') for d in mg_gs._dev[:0:-1]]}; "
              f"graph: {Mgs.graph}")

    print(f"\n{'solver':32s} {'setup s':>9s} {'V-cycle ms':>11s} {'CG its':>7s} {'solve s':>9s} {'rel. res':>10s}")
    for name, ts, tc, it, tsol, rr in rows:
        print(f"{name:32s} {ts:9.3f} {1e3 * tc:11.3f} {it:7d} {tsol:9.4f} {rr:10.2e}")
    print(f"\nratio pyamg CPU solve / adaptmg {be.name} solve (same hierarchy): {t_pyamg / t_mg:.1f}x; "
          f"per V-cycle: {t_cyc_pyamg / t_cyc_mg:.1f}x")
    if len(rows) > 2:
        print(f"ratio pyamg default (GS) CPU solve / adaptmg {be.name} Jacobi solve: "
              f"{rows[2][4] / t_mg:.1f}x; / adaptmg {be.name} multicolour GS solve: "
              f"{rows[2][4] / rows[3][4]:.1f}x")
    print(f"(bridge setup = conversion + transfer of the hierarchy: {t_setup_bridge:.3f} s; "
          f"CPU threads: {os.cpu_count()})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
