"""Benchmark: Q1 Poisson to rtol 1e-8 -- adaptmg (GPU, CPU) vs pyamg SA + CG vs cupyx CG + Jacobi.

2-D: about 1.05M DoFs (4x4 cells refined 8 times); 3-D: about 2.1M DoFs (2^3 cells
refined 6 times).  All solvers get the same constrained matrix and right-hand
side in one process.  Prints setup/solve times, iterations, ratios and the cost
of one V-cycle in units of one fine-grid SpMV.
Usage: python scripts/bench_poisson.py [--dims 2 3] [--small] [--repeat 5]
"""
import argparse
import time
import warnings

import numpy as np

import adaptmg
from adaptmg import assemble
from adaptmg.backend import get_backend, gpu_available, to_host


def median_time(f, be, repeat):
    ts = []
    for _ in range(repeat):
        be.synchronize()
        t = time.perf_counter()
        f()
        be.synchronize()
        ts.append(time.perf_counter() - t)
    return float(np.median(ts))


def run_adaptmg(mesh, backend, rhs_host, repeat):
    be = get_backend(backend)
    t = time.perf_counter()
    ml = adaptmg.multigrid(mesh, assemble.stiffness, backend=be)
    be.synchronize()
    setup = time.perf_counter() - t
    b = be.asarray(rhs_host)
    its = []
    ml.solve(b, rtol=1e-8, accel="cg", callback=its.append)        # iterations (a callback run)
    ml.solve(b, rtol=1e-8, accel="cg")                             # warm-up (kernels, graphs)

    def solve():       # what a user calls: no callback (on the GPU one CUDA graph per iteration)
        return ml.solve(b, rtol=1e-8, accel="cg")
    t_solve = median_time(solve, be, repeat)
    x = solve()
    res = np.linalg.norm(rhs_host - ml.A @ to_host(x)) / np.linalg.norm(rhs_host)
    # cost of one V-cycle (preconditioner apply) in fine SpMVs
    M = ml.aspreconditioner()
    A = be.asmatrix(ml.A)
    A @ b                                   # warm-up (cuSPARSE handle, descriptors)
    t_spmv = median_time(lambda: A @ b, be, 50)
    t_cycle = median_time(lambda: M.matvec(b), be, 20)
    return dict(setup=setup, solve=t_solve, its=len(its), res=res, spmv=t_spmv, cycle=t_cycle,
                levels=len(ml.levels), ml=ml)


def run_pyamg(A, b, repeat):
    import pyamg
    import scipy.sparse.linalg as spla
    t = time.perf_counter()
    ml = pyamg.smoothed_aggregation_solver(A.tocsr())
    setup = time.perf_counter() - t
    M = ml.aspreconditioner(cycle="V")
    its = []

    def solve():
        its.clear()
        x, info = spla.cg(A, b, rtol=1e-8, M=M, callback=lambda xk: its.append(1))
        return x
    ts = []
    for _ in range(max(1, repeat // 2)):
        t = time.perf_counter()
        x = solve()
        ts.append(time.perf_counter() - t)
    res = np.linalg.norm(b - A @ x) / np.linalg.norm(b)
    return dict(setup=setup, solve=float(np.median(ts)), its=len(its), res=res)


def run_cupyx_cg(A, b, repeat):
    be = get_backend("gpu")
    xp = be.xp
    from cupyx.scipy.sparse.linalg import LinearOperator, cg
    Ad = be.asmatrix(A)
    bd = be.asarray(b)
    dinv = 1.0 / Ad.diagonal()
    M = LinearOperator(A.shape, matvec=lambda v: dinv * v, dtype=np.float64)
    its = []

    def solve():
        its.clear()
        try:
            x, info = cg(Ad, bd, tol=1e-8, M=M, maxiter=20000, callback=lambda xk: its.append(1))
        except TypeError:
            x, info = cg(Ad, bd, rtol=1e-8, M=M, maxiter=20000, callback=lambda xk: its.append(1))
        return x
    solve()
    t = median_time(solve, be, max(1, repeat // 2))
    x = solve()
    res = float(xp.linalg.norm(bd - Ad @ x) / xp.linalg.norm(bd))
    return dict(setup=0.0, solve=t, its=len(its), res=res)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--dims", type=int, nargs="+", default=[2, 3])
    ap.add_argument("--small", action="store_true", help="about 1/16 of the DoFs (smoke test)")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--no-cpu", action="store_true", help="skip adaptmg on the CPU")
    a = ap.parse_args()
    warnings.simplefilter("ignore")
    for dim in a.dims:
        base, L = ((4, 8) if dim == 2 else (2, 6))
        if a.small:
            L -= 2 if dim == 2 else 1
        t = time.perf_counter()
        mesh = adaptmg.Mesh.box([0] * dim, [1] * dim, [base] * dim)
        for _ in range(L):
            mesh = mesh.refine()
        t_mesh = time.perf_counter() - t
        space = adaptmg.Space(mesh, 1)
        con = adaptmg.Constraints(space, space.boundary_dofs())
        A = assemble.stiffness(space)
        K = con.matrix(A)
        # a generic load: sin(pi x) sin(pi y) would be a discrete eigenvector on a uniform
        # grid, on which Jacobi-CG converges in one step
        f = con.rhs(assemble.load(space, lambda x: np.exp(x[..., 0]) * (1 + x[..., 1] ** 2) + x[..., -1]))
        print(f"\n== {dim}-D Q1 Poisson, {space.num_dofs} DoFs, nnz {K.nnz} (mesh {t_mesh:.1f} s) ==")
        rows = {}
        if gpu_available():
            rows["adaptmg GPU"] = run_adaptmg(mesh, "gpu", f, a.repeat)
        if not a.no_cpu:
            rows["adaptmg CPU"] = run_adaptmg(mesh, "cpu", f, max(1, a.repeat // 3))
        try:
            rows["pyamg SA+CG CPU"] = run_pyamg(K, f, a.repeat)
        except ImportError:
            print("(pyamg not installed: skipped)")
        if gpu_available():
            rows["cupyx CG+Jacobi GPU"] = run_cupyx_cg(K, f, a.repeat)
        print(f"{'solver':<22}{'setup s':>9}{'solve s':>10}{'its':>6}{'rel.res':>10}")
        for k, r in rows.items():
            print(f"{k:<22}{r['setup']:9.3f}{r['solve']:10.4f}{r['its']:6d}{r['res']:10.1e}")
        for k in ("adaptmg GPU", "adaptmg CPU"):
            if k in rows:
                r = rows[k]
                print(f"{k}: {r['levels']} levels; V-cycle = {r['cycle'] * 1e3:.3f} ms = "
                      f"{r['cycle'] / r['spmv']:.1f} fine SpMVs (SpMV {r['spmv'] * 1e6:.0f} us)")
        ref = rows.get("pyamg SA+CG CPU")
        if ref:
            for k, r in rows.items():
                if k != "pyamg SA+CG CPU":
                    print(f"solve speed-up of {k} over pyamg: {ref['solve'] / r['solve']:.1f}x")
        if "adaptmg GPU" in rows:
            print(rows["adaptmg GPU"]["ml"])


if __name__ == "__main__":
    main()
