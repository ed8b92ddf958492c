"""Benchmark of seed 003: prehandling (hierarchical basis + partial Cholesky) and method M1.

Sections (``--sections``, default all):

* ``table``  -- Table 1: |C|, |E|, |I|, kappa(C_i), kappa(Pi), NNZ(C_i^-1), NNZ(Pi^-1) / NNZ_FEM on
  the unit square next to the paper's values; and kappa(A_h), kappa(S^T A_h S), kappa(A) for one
  (h, h0) (Lanczos: the largest eigenvalue of the operator and of its inverse, applied by M1).
* ``errors`` -- Figure 5: L2 errors vs level (h = 2^-level) for a strongly oscillating u (``--err-u``):
  half-precision CG (``adaptmg.prehandle.half_cg``: fp16 storage; HP16: fp16 arithmetic and the
  defect b - A x recomputed in fp16, HP32: fp32 accumulators and the recursive residual; stopped
  by stagnation) on the nodal A_h and on the prehandled A (the effect of Figure 5), next to the fp64
  discretisation error; method M1 in fp32 / fp16 with and without prehandling (the direct method's
  accuracy; ``prehandle=False``: the same Schur method on the nodal matrix); the first level where
  each curve is more than ``--deviation`` above fp64; the plot goes through ``adaptmg.plot`` (``--plot``).
* ``speed``  -- MDof/s (N * N_rhs / time) of the M1 solve of the prehandled system
  (``solve_prehandled``, and the whole ``solve`` with the transforms in double) in
  fp64 / fp32 / fp16 for N_rhs = 1 and N_rhs >> 1, the L2 error of the first column, and
  adaptmg's block multigrid-CG in double (``ml.solve(B, accel="cg")`` on ``--mg-rhs`` columns
  at once, rtol 1e-8)
  on the same problem in the same process.

Usage: python scripts/bench_prehandling.py [--backend cpu|gpu] [--sections table,errors,speed]
       [--speed-h 256,512,1024] [--nrhs 1,256] [--h0 16] ...  (defaults depend on the backend)
"""
import argparse
import functools
import time
import warnings

import numpy as np

import adaptmg
from adaptmg import assemble
from adaptmg.backend import get_backend
from adaptmg.fe import Space
from adaptmg.fe.norms import errors as fe_errors
from adaptmg.mesh import Mesh
from adaptmg.prehandle import (RefinedMacroMesh, SchurSolver, condition_number, fine_stiffness, half_cg,
                               lanczos_max, macro_square, prehandled_matrix)

# Table 1 of seed 003: (1/h, 1/h0) -> kappa(C_i), kappa(Pi), NNZ(C_i^-1)/NNZ_FEM, NNZ(Pi^-1)/NNZ_FEM
TABLE1 = {(256, 4): (23.9, 24.1, 27.06, 3.93), (256, 8): (16.9, 19.5, 1.59, 20.71),
          (256, 16): (11.1, 14.5, 0.09, 89.05), (256, 32): (6.6, 10.1, 0.004, 331.31),
          (512, 4): (32.2, 30.7, 110.99, 3.96), (512, 8): (23.9, 25.5, 6.72, 21.24),
          (512, 16): (16.9, 19.8, 0.39, 94.46), (512, 32): (11.1, 14.6, 0.02, 377.85),
          (1024, 4): (41.8, 37.9, 449.50, 3.98), (1024, 8): (32.2, 32.3, 27.66, 21.51),
          (1024, 16): (23.9, 25.9, 1.67, 97.22), (1024, 32): (16.9, 19.9, 0.10, 402.14)}
PAPER_FULL = {(256, 16): (13280, 100, 22)}


def ints(s):
    return [int(v) for v in s.split(",") if v]


def square(inv_h, inv_h0):
    J = int(np.log2(inv_h // inv_h0))
    if inv_h0 << J != inv_h:
        raise SystemExit(f"1/h = {inv_h} must be 1/h0 = {inv_h0} times a power of two")
    return RefinedMacroMesh(*macro_square(inv_h0), J)


def timed(f, be, repeat):
    f()
    be.synchronize()
    ts = []
    for _ in range(repeat):
        t = time.perf_counter()
        f()
        be.synchronize()
        ts.append(time.perf_counter() - t)
    return min(ts)


def section_table(args, be):
    print("\n## Table 1 (unit square, Q1): condition numbers of C_i and Pi (paper in brackets)")
    print(f"{'1/h':>5} {'1/h0':>5} {'|C|':>6} {'|E|':>7} {'|I|':>9} {'kappa(C_i)':>15} {'kappa(Pi)':>15} "
          f"{'NNZ(C_i^-1)/FEM':>18} {'NNZ(Pi^-1)/FEM':>18} {'setup s':>8}")
    for ih in args.table_h:
        for ih0 in args.table_h0:
            if ih0 >= ih:
                continue
            rm = square(ih, ih0)
            if rm.n_E > args.max_edge or len(rm.interior_local) > args.max_edge:
                print(f"{ih:5d} {ih0:5d}  skipped (|E| = {rm.n_E}, C_i {len(rm.interior_local)} rows > --max-edge)")
                continue
            t = time.perf_counter()
            s = SchurSolver(rm, backend=be, keep_factors=True)
            be.synchronize()
            t = time.perf_counter() - t
            kc = condition_number(s.C_blocks[0], inverse=s.C_inv[0], dense_max=2000)
            kp = condition_number(s.Pi, inverse=s.Pi_inv, dense_max=2000)
            M = ih - 1
            fem = (3 * M - 2) ** 2
            ref = TABLE1.get((ih, ih0))
            r = (lambda i, v: f"{v:7.1f} [{ref[i]:5.1f}]" if ref else f"{v:7.1f}        ")
            rn = (lambda i, v: f"{v:9.3f} [{ref[i]:6.2f}]" if ref else f"{v:9.3f}         ")
            print(f"{ih:5d} {ih0:5d} {rm.n_C:6d} {rm.n_E:7d} {rm.n_I:9d} {r(0, kc):>15} {r(1, kp):>15} "
                  f"{rn(2, len(rm.interior_local) ** 2 / fem):>18} {rn(3, rm.n_E ** 2 / fem):>18} {t:8.1f}")
            del s
    for ih, ih0 in args.kappa_full:
        rm = square(ih, ih0)
        s = SchurSolver(rm, backend=be)
        xp = be.xp
        N = rm.N
        A_h = be.asmatrix(fine_stiffness(rm)[:N, :N])
        S, ST = s.transforms()
        L = s.L
        At = lambda v: ST @ (A_h @ (S @ v))
        A = lambda v: L.apply_inv(At(L.apply_inv_t(v)))
        kh = lanczos_max(lambda v: A_h @ v, N, xp) * lanczos_max(s.solve, N, xp)
        kt = lanczos_max(At, N, xp) * lanczos_max(lambda v: L.apply_inv_t(s.solve_prehandled(L.apply_inv(v))), N, xp)
        ka = lanczos_max(A, N, xp) * lanczos_max(s.solve_prehandled, N, xp)
        p = PAPER_FULL.get((ih, ih0))
        print(f"h = 1/{ih}, h0 = 1/{ih0}: kappa(A_h) = {kh:,.0f}, kappa(S^T A_h S) = {kt:.1f}, "
              f"kappa(L^-1 S^T A_h S L^-T) = {ka:.1f}" + (f"   [paper: {p[0]:,}, {p[1]}, {p[2]}]" if p else ""))


def problem(a, kind="sin"):
    """u = g(x) g(y), u = 0 on the boundary: g(t) = sin(a pi t) ("sin": an eigenfunction of the
    Laplacian, so CG converges in one or two steps and hides the precision), or the chirp
    g(t) = sin(a pi t^2 / 2) ("chirp": local frequency a pi t, up to sin(a pi t)'s; a even)."""
    k = a * np.pi
    if kind == "sin":
        g = lambda t: np.sin(k * t)
        g2 = lambda t: -k * k * np.sin(k * t)
    elif kind == "chirp":
        if a % 2:
            raise SystemExit(f"--a {a}: the chirp sin(a pi t^2 / 2) vanishes at t = 1 only for even a")
        c = k / 2
        g = lambda t: np.sin(c * t * t)
        g2 = lambda t: 2 * c * np.cos(c * t * t) - (2 * c * t) ** 2 * np.sin(c * t * t)
    else:
        raise SystemExit(f"unknown exact solution {kind!r} (sin, chirp)")
    u = lambda x: g(x[..., 0]) * g(x[..., 1])
    f = lambda x: -(g2(x[..., 0]) * g(x[..., 1]) + g(x[..., 0]) * g2(x[..., 1]))
    return u, f


class Discrete:
    """The fine space of a refined macro mesh, its load vector and L2 errors."""

    def __init__(self, rm, a, be, kind="sin"):
        self.rm, self.be = rm, be
        self.u, f = problem(a, kind)
        self.space = Space(Mesh.from_cells(rm.points, rm.cells), 1)
        self.b = be.asarray(assemble.load(self.space, f)[:rm.N])

    def l2(self, x):
        xp = self.be.xp
        full = xp.concatenate([xp.asarray(x, dtype=np.float64), xp.zeros(len(self.rm.points) - self.rm.N)])
        return float(fe_errors(self.space, full, self.u, backend=self.be)["L2"])


# the two half-precision CG variants: (label, half_cg keywords)
HP_VARIANTS = (("HP16", dict(accumulate="float16", residual="true")),
               ("HP32", dict(accumulate="float32", residual="recursive")))


def hp_cg(A, b, args, kw):
    """half_cg with the bench's stopping rule; (x, 'iterations + r/s/m')."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        r = half_cg(A, b, rtol=args.hp_rtol, stagnation=args.hp_stagnation, maxiter=args.cg_maxiter, **kw)
    return r.x, f"{r.iterations}{'r' if r.status == 'rtol' else 's' if r.status == 'stagnation' else 'm'}"


def section_errors(args, be):
    print(f"\n## Figure 5: L2 error vs level, {args.err_u} u, a = {args.a:g}, h0 = max(1/{args.err_h0}, {args.err_n} h)")
    print("fp64: M1 in double (the discretisation error).  M1 32/pre, 16/nod, 16/pre: method M1 (direct; inverses "
          "made in double, applied in fp32 / fp16) on the prehandled / nodal matrix: the direct method's accuracy, "
          "not Figure 5's.  HP16 / HP32 nod, pre: CG in half precision (adaptmg.prehandle.half_cg; fp16 matrix and "
          "vectors, fp32 inner products) on A_h / on L^-1 S^T A_h S L^-T, Figure 5's blue / red curves -- HP16: "
          "fp16 arithmetic throughout (fp16 partial sums in A x, the residual recomputed as b - A x in fp16 every "
          "iteration: the defect of an HP iterative solver); HP32: fp32 accumulators (tensor-core style), "
          f"recursive residual.  Stopped at rtol {args.hp_rtol:g} or {args.hp_stagnation} iterations without a "
          "new residual minimum.")
    cols = [("float64", True), ("float32", True), ("float16", False), ("float16", True)]
    names = ["fp64 (discretisation)", "M1 fp32 prehandled", "M1 fp16 nodal", "M1 fp16 prehandled"]
    for label, _ in HP_VARIANTS:
        names += [f"{label} CG nodal", f"{label} CG prehandled"]
    head = "".join(f" {label + ' ' + k:>10} {'/fp64':>7} {'its':>5}" for label, _ in HP_VARIANTS for k in ("nod", "pre"))
    print(f"{'level':>5} {'N':>9} {'fp64':>10} {'M1 32/pre':>10} {'M1 16/nod':>10} {'M1 16/pre':>10}{head} {'s':>6}")
    curves = {k: ([], []) for k in names}
    for lev in args.levels:
        if (1 << lev) <= args.err_h0:
            continue
        rm = square(1 << lev, max(args.err_h0, (1 << lev) // args.err_n))
        d = Discrete(rm, args.a, be, args.err_u)
        row = []
        for dt, pre in cols:
            row.append(d.l2(SchurSolver(rm, dtype=dt, prehandle=pre, backend=be).solve(d.b)))
        hp = ""
        if lev <= args.cg_max_level:
            t = time.perf_counter()
            A_h, _, A, L = prehandled_matrix(rm)
            A_h, A = be.asmatrix(A_h), be.asmatrix(A)
            s64 = SchurSolver(rm, backend=be)
            b = s64.rhs(d.b)
            for _, kw in HP_VARIANTS:
                x, mn = hp_cg(A_h, d.b, args, kw)
                row.append(d.l2(x))
                x, mp = hp_cg(A, b, args, kw)
                row.append(d.l2(s64.back_transform(x)))
                hp += "".join(f" {e:10.3e} {e / row[0]:7.2f} {m:>5}" for e, m in zip(row[-2:], (mn, mp)))
            hp += f" {time.perf_counter() - t:6.1f}"
        for name, e in zip(names, row):
            curves[name][0].append(lev)
            curves[name][1].append(e)
        print(f"{lev:5d} {rm.N:9d} " + " ".join(f"{e:10.3e}" for e in row[:4]) + hp, flush=True)
    print("(its: HP-CG iterations, r = rtol met, s = stopped by stagnation, m = --cg-maxiter; s: seconds of the "
          "HP columns, prehandled_matrix's SciPy assembly included)")
    lv, e64 = curves[names[0]]
    for name in names[2:]:
        lev_e = dict(zip(*curves[name]))
        off = [l for l, e in zip(lv, e64) if l in lev_e and lev_e[l] > (1 + args.deviation) * e]
        print(f"{name:>22}: first level more than {args.deviation:.0%} above fp64: "
              f"{off[0] if off else 'none'} (levels {min(lev_e, default='-')}..{max(lev_e, default='-')})")
    if args.plot and any(v[0] for v in curves.values()):
        try:
            from adaptmg import plot
            keep = {k: curves[k] for k in [names[0]] + names[4:] if curves[k][0]}
            p = plot.convergence(keep, args.plot, xlabel="level (h = 2^-level)", ylabel="L2 error",
                                 title="fp16 CG, nodal vs prehandled (seed 003 Fig. 5)")
            print(f"plot: {p}")
        except Exception as exc:       # plotting is optional (extra 'plot')
            print(f"plot skipped: {type(exc).__name__}: {exc}")


def multigrid_cg(ih, ih0, a, be, ncols):
    u, f = problem(a)
    mesh = Mesh.box([0, 0], [1, 1], [ih0, ih0])
    for _ in range(int(np.log2(ih // ih0))):
        mesh = mesh.refine()
    t = time.perf_counter()
    ml = adaptmg.multigrid(mesh, assemble.stiffness, backend=be)
    be.synchronize()
    setup = time.perf_counter() - t
    space = Space(mesh, 1)
    b = be.asarray(ml.constrain(assemble.load(space, f)))
    B = b[:, None] * (1.0 + be.xp.arange(ncols) / ncols)[None, :]
    solve = (lambda: ml.solve(B, rtol=1e-8, accel="cg")) if ncols > 1 else \
        (lambda: ml.solve(b, rtol=1e-8, accel="cg"))
    solve()
    ts = timed(solve, be, 2)
    X = solve()
    x = X[:, 0] if ncols > 1 else X
    err = float(fe_errors(space, ml.expand(x), u, backend=be)["L2"])
    n = int(b.shape[0])
    return setup, ts, n, int(np.max(ml.last_iterations)), err


def section_speed(args, be):
    print(f"\n## M1 speed (MDof/s = N N_rhs / time), u = sin({args.a} pi x) sin({args.a} pi y); "
          f"backend {be.name}; L2 error of column 0")
    print(f"{'1/h':>5} {'1/h0':>5} {'N':>9} {'dtype':>8} {'N_rhs':>6} {'setup s':>8} {'M1 ms':>9} "
          f"{'MDof/s':>10} {'+transf ms':>11} {'MDof/s':>9} {'L2 error':>10} {'/ L2 fp64':>9}")
    xp = be.xp
    for ih in args.speed_h:
        ih0 = min(args.h0, ih // 2)
        rm = square(ih, ih0)
        d = Discrete(rm, args.a, be)
        e64 = None
        for dt in args.dtypes:
            t = time.perf_counter()
            s = SchurSolver(rm, dtype=dt, backend=be)
            be.synchronize()
            setup = time.perf_counter() - t
            for k in args.nrhs:
                Bh = d.b[:, None] * (1.0 + xp.arange(k) / k)[None, :]
                b = s.rhs(Bh)
                scale = xp.max(xp.abs(b), axis=0)
                bp = xp.ascontiguousarray((b / scale).astype(dt))
                tc = timed(functools.partial(s.solve_prehandled, bp), be, args.repeat)
                tt = timed(functools.partial(s.solve, Bh), be, max(1, args.repeat // 2))
                e = d.l2(s.solve(Bh)[:, 0])
                if e64 is None:
                    e64 = d.l2(SchurSolver(rm, backend=be).solve(d.b)) if dt != "float64" else e
                mdofs = rm.N * k / tc / 1e6
                print(f"{ih:5d} {ih0:5d} {rm.N:9d} {dt:>8} {k:6d} {setup:8.2f} {tc * 1e3:9.3f} {mdofs:10.1f} "
                      f"{tt * 1e3:11.3f} {rm.N * k / tt / 1e6:9.1f} {e:10.3e} {e / e64:9.3f}", flush=True)
                del Bh, b, bp
            del s
            if be.is_gpu:
                xp.get_default_memory_pool().free_all_blocks()
        if args.mg_rhs:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                setup, ts, n, its, err = multigrid_cg(ih, ih0, args.a, be, args.mg_rhs)
            print(f"{ih:5d} {ih0:5d} {n:9d} {'mg-CG64':>8} {args.mg_rhs:6d} {setup:8.2f} {ts * 1e3:9.3f} "
                  f"{n * args.mg_rhs / ts / 1e6:10.1f} {'':>11} {'':>9} {err:10.3e} {err / e64:9.3f}"
                  f"   ({its} CG its, {'one block' if args.mg_rhs > 1 else 'one column'})",
                  flush=True)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--backend", default="auto", choices=["auto", "cpu", "gpu"])
    p.add_argument("--sections", default="table,errors,speed")
    p.add_argument("--table-h", type=ints, default=None, help="1/h of Table 1 rows")
    p.add_argument("--table-h0", type=ints, default=[4, 8, 16, 32])
    p.add_argument("--max-edge", type=int, default=None, help="skip Table 1 rows with larger dense blocks")
    p.add_argument("--kappa-full", default=None, help="1/h:1/h0 pairs for kappa(A_h), kappa(A~), kappa(A)")
    p.add_argument("--levels", type=ints, default=None, help="Figure 5 levels (h = 2^-level)")
    p.add_argument("--err-h0", type=int, default=4, help="1/h0 of the Figure 5 runs (at most)")
    p.add_argument("--err-n", type=int, default=64, help="Figure 5: at most this many fine cells per macro edge")
    p.add_argument("--a", type=float, default=16.0, help="frequency of u: sin(a pi x) sin(a pi y), or the chirp of --err-u (strongly oscillating, as in Fig. 5)")
    p.add_argument("--plot", default="out/prehandling_fig5.png")
    p.add_argument("--err-u", default="chirp", choices=["chirp", "sin"],
                   help="Figure 5's exact solution (sin is an eigenfunction: CG needs 1-2 steps)")
    p.add_argument("--cg-max-level", type=int, default=None, help="largest level of the HP-CG columns")
    p.add_argument("--cg-maxiter", type=int, default=20000)
    p.add_argument("--hp-rtol", type=float, default=1e-6, help="HP-CG: relative recursive residual to stop at")
    p.add_argument("--hp-stagnation", type=int, default=50,
                   help="HP-CG: stop after this many iterations without a new residual minimum")
    p.add_argument("--deviation", type=float, default=0.1, help="Figure 5: report the first level this far above fp64")
    p.add_argument("--speed-h", type=ints, default=None)
    p.add_argument("--h0", type=int, default=16, help="1/h0 of the speed runs")
    p.add_argument("--nrhs", type=ints, default=None)
    p.add_argument("--mg-rhs", type=int, default=32,
                   help="columns solved as one block by multigrid-CG (0: skip)")
    p.add_argument("--dtypes", type=lambda v: v.split(","), default=["float64", "float32", "float16"])
    p.add_argument("--repeat", type=int, default=5)
    args = p.parse_args(argv)
    be = get_backend(args.backend)
    gpu = be.is_gpu
    args.table_h = args.table_h or ([256, 512, 1024] if gpu else [64, 128])
    args.max_edge = args.max_edge or (32000 if gpu else 4000)
    args.cg_max_level = args.cg_max_level if args.cg_max_level is not None else (10 if gpu else 8)
    args.levels = args.levels or (list(range(4, 11)) if gpu else list(range(4, 9)))
    args.speed_h = args.speed_h or ([256, 512, 1024] if gpu else [64, 128])
    args.nrhs = args.nrhs or ([1, 256] if gpu else [1, 16])
    kf = args.kappa_full if args.kappa_full is not None else ("256:16" if gpu else "64:8")
    args.kappa_full = [tuple(int(v) for v in pair.split(":")) for pair in kf.split(",") if pair]
    print(f"# bench_prehandling: backend {be.name}, adaptmg {getattr(adaptmg, '__version__', '?')}")
    secs = args.sections.split(",")
    for name in secs:
        if name not in ("table", "errors", "speed"):
            raise SystemExit(f"unknown section {name!r} (table, errors, speed)")
    t0 = time.perf_counter()
    if "table" in secs:
        section_table(args, be)
    if "errors" in secs:
        section_errors(args, be)
    if "speed" in secs:
        section_speed(args, be)
    print(f"\ntotal {time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()
