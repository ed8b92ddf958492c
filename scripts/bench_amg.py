"""Benchmark: smoothed aggregation set-up and solve -- adaptmg.amg (GPU set-up) vs pyamg vs CG+Jacobi.

Cases (one process, the same constrained matrix and right-hand side for every solver):

* 2-D Q1 Poisson on ``Mesh.box`` 1024x1024 (1.05M DoFs, Dirichlet on the whole boundary)
* 3-D Q1 Poisson on ``Mesh.box`` 128^3 (2.1M DoFs)
* a distorted hex block of 100^3 cells built with NumPy and imported with ``Mesh.from_cells``
  (no refinement history, ``--vtu``: written by meshio and read by ``adaptmg.io.read``):
  ``adaptmg.multigrid`` builds one geometric level and algebraic levels below (hybrid).

Rows: ``adaptmg`` -- :func:`adaptmg.amg` (or the hybrid ``multigrid``) with
``setup="device"`` on the GPU when present, else on the CPU (the same code path with NumPy);
``hybrid`` (``--hybrid``, boxes) -- ``adaptmg.multigrid`` on the box (one geometric level, the
device set-up below); ``geometric`` (``--geometric``) -- the purely geometric hierarchy on the
same mesh obtained by refinement (box ``4 * 2^k``, hex block ``4 * 2^k`` distorted the same
way), the reference of the 1.5x iteration bound;
``pyamg`` -- ``pyamg.smoothed_aggregation_solver(A)`` and ``ml.solve(b, accel="cg")`` on the
host; ``CG+Jacobi`` -- plain cupyx (GPU) or SciPy (CPU) CG with the diagonal preconditioner.
Everything is warmed up once, the device synchronised before each clock read, and the
median of ``--repeat`` runs printed; "SA" is the hierarchy with its smoothers
(:func:`~adaptmg.multilevel.amg.sa_levels`), "setup" the whole solver (plus the coarse
inverse and the cycle's buffers; for the hybrid also assembly and constraints).  Targets on an H100: SA set-up
<= 0.2 s (2-D) and <= 0.7 s (3-D).

Every row prints its CG iterations and operator complexity ("OC").

Usage: python scripts/bench_amg.py [--cases 2d 3d hex] [--small] [--n2d N] [--n3d N] [--nhex N]
       [--repeat 3] [--vtu] [--hybrid] [--geometric] [--front D|none] [--no-pyamg]

On the H100 (one 10-minute call each; pyamg's 3-D 2.1M set-up takes 10-12 s and its
solve about 10 s on the host):
    python scripts/bench_amg.py --cases 2d --hybrid --geometric
    python scripts/bench_amg.py --cases 3d --hybrid --geometric
    python scripts/bench_amg.py --cases hex --geometric
"""
import argparse
import os
import tempfile
import time
import warnings

import numpy as np

import adaptmg
from adaptmg import assemble
from adaptmg.backend import get_backend, gpu_available, to_host
from adaptmg.multilevel.amg import sa_levels


def median_time(f, be, repeat):
    ts, out = [], None
    for _ in range(repeat):
        be.synchronize()
        t = time.perf_counter()
        out = f()
        be.synchronize()
        ts.append(time.perf_counter() - t)
    return float(np.median(ts)), out


def distort(X):
    Y = np.array(X, dtype=float)
    d = X.shape[1]
    for i in range(d):
        Y[:, i] += 0.08 * np.sin(2 * np.pi * X[:, (i + 1) % d])
    return Y


def hex_block(n, vtu=False):
    """Distorted n^3 hex block: NumPy points/cells -> Mesh.from_cells (or meshio .vtu -> io.read)."""
    ax = np.linspace(0.0, 1.0, n + 1)
    P = distort(np.stack(np.meshgrid(ax, ax, ax, indexing="ij"), -1).reshape(-1, 3))
    idx = np.arange((n + 1) ** 3).reshape(n + 1, n + 1, n + 1)
    i, j, k = (a.ravel() for a in np.meshgrid(*[np.arange(n)] * 3, indexing="ij"))
    lex = np.stack([idx[i, j, k], idx[i + 1, j, k], idx[i, j + 1, k], idx[i + 1, j + 1, k],
                    idx[i, j, k + 1], idx[i + 1, j, k + 1], idx[i, j + 1, k + 1],
                    idx[i + 1, j + 1, k + 1]], 1)
    if not vtu:
        return adaptmg.Mesh.from_cells(P, lex)
    import meshio
    from adaptmg.io import read
    vtk = lex[:, [0, 1, 3, 2, 4, 5, 7, 6]]
    path = os.path.join(tempfile.mkdtemp(), "block.vtu")
    meshio.write(path, meshio.Mesh(P, [("hexahedron", vtk)]))
    return read(path, trusted=True, isolate=False, max_bytes=1 << 34,
                           max_points=1 << 30, max_cells=1 << 30)


def refined_like(case, n):
    """The mesh of ``case`` with ``n`` cells per side built by refinement (a full geometric
    hierarchy): ``(mesh, description)``, or ``(None, None)`` when ``n`` is not ``4 * 2^k``."""
    k = int(round(np.log2(n / 4))) if n >= 4 else -1
    if k < 0 or 4 * 2 ** k != n:
        return None, None
    dim = 2 if case == "2d" else 3
    m = adaptmg.Mesh.box([0] * dim, [1] * dim, [4] * dim)
    if case == "hex":
        m = m.map(distort)
    for _ in range(k):
        m = m.refine()
    return m, f"4^{dim} refined {k}x"


def problem(mesh):
    space = adaptmg.Space(mesh, 1)
    con = adaptmg.Constraints(space, space.boundary_dofs())
    A = assemble.stiffness(space)
    K = con.matrix(A)
    f = con.rhs(assemble.load(space, lambda x: np.exp(x[..., 0]) * (1 + x[..., 1] ** 2) + x[..., -1]))
    return space, K, f


def run_adaptmg_amg(K, f, be, repeat, front):
    Kd = be.asmatrix(K)
    kw = dict(backend=be, setup="device", front=front)
    sa_levels(Kd, **kw)                                       # warm-up (kernels, cuSPARSE)
    t_sa, _ = median_time(lambda: sa_levels(Kd, **kw), be, repeat)
    t_setup, ml = median_time(lambda: adaptmg.amg(Kd, **kw), be, repeat)
    return _solve_rows(ml, K, f, be, repeat, t_sa, t_setup)


def run_adaptmg_hybrid(space, K, f, be, repeat, front=1.0, geometric=False):
    """The hybrid hierarchy on ``space`` (device set-up below its one geometric level), or
    with ``geometric`` the purely geometric one (``space`` a refined mesh; ``K``, ``f``
    then belong to it)."""
    amg_kwargs = None if geometric else {"setup": "device", "front": front}
    build = lambda: adaptmg.multigrid(space, assemble.stiffness, backend=be,    # noqa: E731
                                      amg_kwargs=amg_kwargs, max_coarse=None if geometric else 2000)
    build()                                                                     # warm-up
    t_setup, ml = median_time(build, be, repeat)
    return _solve_rows(ml, K, f, be, repeat, float("nan"), t_setup)


def _solve_rows(ml, K, f, be, repeat, t_sa, t_setup):
    b = be.asarray(f)
    its = []

    def solve():
        its.clear()
        return ml.solve(b, rtol=1e-8, accel="cg", callback=lambda xk: its.append(1))
    solve()
    t_solve, x = median_time(solve, be, repeat)
    res = np.linalg.norm(f - K @ to_host(x)) / np.linalg.norm(f)
    oc = sum(lev.A.nnz for lev in ml.levels) / ml.levels[-1].A.nnz
    return dict(sa=t_sa, setup=t_setup, solve=t_solve, its=len(its), res=res, ml=ml, oc=oc)


def run_pyamg(K, f, repeat):
    import pyamg
    t = time.perf_counter()
    ml = pyamg.smoothed_aggregation_solver(K)
    setup = time.perf_counter() - t
    ts = []
    for _ in range(max(1, repeat // 2)):
        res = []
        t = time.perf_counter()
        x = ml.solve(f, tol=1e-8, accel="cg", residuals=res, maxiter=500)
        ts.append(time.perf_counter() - t)
    rr = np.linalg.norm(f - K @ x) / np.linalg.norm(f)
    return dict(sa=setup, setup=setup, solve=float(np.median(ts)), its=len(res) - 1, res=rr,
                oc=ml.operator_complexity())


def run_cg_jacobi(K, f, be, repeat):
    xp = be.xp
    if be.is_gpu:
        from cupyx.scipy.sparse.linalg import LinearOperator, cg
    else:
        from scipy.sparse.linalg import LinearOperator, cg
    Kd, bd = be.asmatrix(K), be.asarray(f)
    dinv = 1.0 / Kd.diagonal()
    M = LinearOperator(K.shape, matvec=lambda v: dinv * v, dtype=np.float64)
    its = []

    def solve():
        its.clear()
        kw = dict(M=M, maxiter=50000, callback=lambda xk: its.append(1))
        try:
            x, info = cg(Kd, bd, rtol=1e-8, **kw)
        except TypeError:                       # cupyx versions with the old keyword
            x, info = cg(Kd, bd, tol=1e-8, **kw)
        return x
    solve()
    t, x = median_time(solve, be, max(1, repeat // 2))
    res = float(xp.linalg.norm(bd - Kd @ x) / xp.linalg.norm(bd))
    return dict(sa=0.0, setup=0.0, solve=t, its=len(its), res=res, oc=1.0)


def report(title, rows, be):
    print(f"\n== {title} ==")
    print(f"{'solver':<38}{'SA s':>8}{'setup s':>9}{'solve s':>10}{'its':>6}{'OC':>7}{'rel.res':>10}")
    for k, r in rows.items():
        print(f"{k:<38}{r['sa']:8.3f}{r['setup']:9.3f}{r['solve']:10.4f}{r['its']:6d}{r['oc']:7.3f}"
              f"{r['res']:10.1e}")
    mine = next(k for k in rows if k.startswith("adaptmg"))
    a = rows[mine]
    for k, r in rows.items():
        if k == mine or k.startswith("adaptmg"):
            continue
        tot_a, tot_r = a["setup"] + a["solve"], r["setup"] + r["solve"]
        setup = f"setup {r['setup'] / a['setup']:.1f}x, " if r["setup"] > 0 else ""
        print(f"{mine} vs {k}: {setup}solve {r['solve'] / a['solve']:.1f}x, "
              f"set-up + solve {tot_r / tot_a:.1f}x faster")
    print(a["ml"])


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--cases", nargs="+", default=["2d", "3d", "hex"], choices=["2d", "3d", "hex"])
    ap.add_argument("--small", action="store_true", help="256^2, 32^3 and a 32^3 hex block (CPU check)")
    ap.add_argument("--n2d", type=int, help="2-D box cells per side (default 1024, --small 256)")
    ap.add_argument("--n3d", type=int, help="3-D box cells per side (default 128, --small 32)")
    ap.add_argument("--nhex", type=int, help="hex block cells per side (default 100, --small 32)")
    ap.add_argument("--hybrid", action="store_true", help="also the hybrid multigrid() row on the boxes")
    ap.add_argument("--geometric", action="store_true",
                    help="also the purely geometric hierarchy on the refined mesh of the same size")
    ap.add_argument("--front", default="1",
                    help="seed density of the finest level's front aggregation, or 'none' (random order)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--backend", default="auto", choices=["auto", "cpu", "gpu"])
    ap.add_argument("--vtu", action="store_true", help="hex block through meshio .vtu and adaptmg.io.read")
    ap.add_argument("--no-pyamg", action="store_true")
    a = ap.parse_args()
    front = None if a.front.lower() == "none" else float(a.front)
    warnings.simplefilter("ignore")
    be = get_backend(a.backend)
    tag = "adaptmg " + ("GPU" if be.is_gpu else "CPU")
    print(f"backend {be.name}; GPU available: {gpu_available()}")
    for case in a.cases:
        t = time.perf_counter()
        if case == "2d":
            n = a.n2d or (256 if a.small else 1024)
            mesh = adaptmg.Mesh.box([0, 0], [1, 1], [n, n])
            title = f"2-D Q1 Poisson, Mesh.box {n}^2"
        elif case == "3d":
            n = a.n3d or (32 if a.small else 128)
            mesh = adaptmg.Mesh.box([0] * 3, [1] * 3, [n] * 3)
            title = f"3-D Q1 Poisson, Mesh.box {n}^3"
        else:
            n = a.nhex or (32 if a.small else 100)
            mesh = hex_block(n, a.vtu)
            title = f"distorted hex block {n}^3 cells ({'vtu' if a.vtu else 'from_cells'}), hybrid"
        space, K, f = problem(mesh)
        title += f": {K.shape[0]} DoFs, nnz {K.nnz} (mesh + assembly {time.perf_counter() - t:.1f} s)"
        rows = {}
        if case == "hex":
            rows[tag + " hybrid"] = run_adaptmg_hybrid(space, K, f, be, a.repeat, front)
        else:
            rows[tag + " amg"] = run_adaptmg_amg(K, f, be, a.repeat, front)
            if a.hybrid:
                rows[tag + " hybrid"] = run_adaptmg_hybrid(space, K, f, be, a.repeat, front)
        if a.geometric:
            gmesh, gn = refined_like(case, n)
            if gmesh is None:
                print(f"(geometric row skipped: {n} is not 4 * 2^k)")
            else:
                gspace, gK, gf = problem(gmesh)
                rows[tag + f" geometric ({gn})"] = run_adaptmg_hybrid(gspace, gK, gf, be, a.repeat,
                                                                     geometric=True)
        if not a.no_pyamg:
            try:
                rows["pyamg SA+CG (host)"] = run_pyamg(K, f, a.repeat)
            except ImportError:
                print("(pyamg not installed: skipped)")
        rows[("cupyx" if be.is_gpu else "SciPy") + " CG+Jacobi"] = run_cg_jacobi(K, f, be, a.repeat)
        report(title, rows, be)


if __name__ == "__main__":
    main()
