#!/usr/bin/env python3
"""Reproduce every figure of the README's "Measured performance" table in one run.

Usage::

    python scripts/bench_readme.py                  # the README's sizes (needs a GPU for most rows)
    python scripts/bench_readme.py --quick          # tiny sizes: a smoke run of the whole pipeline
    python scripts/bench_readme.py --rows poisson2d,td --quick
    python scripts/bench_readme.py --cpu-fallback   # GPU figures measured on the CPU backend instead

Prints the table in the README's layout (``| what | command | result |`` markdown rows,
the README's first two columns verbatim) under a heading with the date, the device and
the CuPy version.  Each row calls the functions of the script the README names for it
(``bench_poisson.run_adaptmg`` / ``run_pyamg`` / ``run_cupyx_cg``, ``bench_pyamg_bridge.main``,
``bench_patch.pick_level`` / ``timeit`` / ``bench_solve``, ``bench_problems.part_td`` /
``part_el``, ``bench_navier_stokes.bench``, ``bench_amg.problem`` / ``hex_block`` /
``run_adaptmg_amg`` / ``run_adaptmg_hybrid`` / ``run_pyamg``, ``bench_solve_latency.problem`` /
``measure``, ``bench_elasticity_gs.part_static``, ``adaptive.timed_run``), loaded from
``scripts/`` by path.

A figure that needs the GPU is printed as ``n/a (needs GPU)`` when none is visible, unless
``--cpu-fallback`` is given: it is then measured with the CPU backend and marked
``[CPU backend]`` (for a smoke test of the plumbing, not a README figure).  Peers that run
on the host (pyamg) are always measured.  ``--quick`` shrinks every size (also the
paper comparisons then mean nothing); its figures are marked ``[quick]``.

Rows (``--rows``, comma separated; default all, in the README's order): poisson2d, poisson3d,
vcycle, bridge, patch, td, elasticity, ns, amg2d, amg3d, hex, latency, gs, adaptive, setup,
coldstart.
``--skip`` (comma separated) leaves rows out, so that a long run can be split in two.  A row
that fails prints ``error: <message>`` as its result (traceback on stderr); the others go on.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import importlib.util
import io
import os
import platform
import re
import sys
import time
import traceback
import warnings

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
if HERE not in sys.path:        # bench_solve_latency imports bench_poisson by name (appended: shadows nothing)
    sys.path.append(HERE)

NA = "n/a (needs GPU)"
ROWS = ("poisson2d", "poisson3d", "vcycle", "bridge", "patch", "td", "elasticity", "ns",
        "amg2d", "amg3d", "hex", "latency", "gs", "adaptive", "setup", "coldstart")

#: the README's first two columns, per row (verbatim)
README = {
    "poisson2d": ("2-D Q1 Poisson, 1.05M DoFs, rtol 1e-8", "`python scripts/bench_poisson.py`"),
    "poisson3d": ("3-D Q1 Poisson, 2.15M DoFs", "same"),
    "vcycle": ("V(2,2)-Jacobi cycle cost", "same / `scripts/bench_vcycle.py`"),
    "bridge": ("pyamg hierarchy on the GPU", "`python scripts/bench_pyamg_bridge.py --n 1024`"),
    "patch": ("matrix-free Q7 stiffness apply (3-D, fp64)", "`python scripts/bench_patch.py`"),
    "td": ("transport-diffusion, 1.05M DoFs, 100 steps", "`python scripts/bench_problems.py --parts td --td-n 10`"),
    "elasticity": ("elasticity on adaptive hex meshes, 100 steps, every step iterating",
                   "`python scripts/bench_problems.py --parts el-edge,el-face --el-edge 6 --el-face 5`"),
    "ns": ("3-D cavity 32x32x64 (Navier-Stokes)", "`python scripts/bench_navier_stokes.py --backend gpu`"),
    "amg2d": ("algebraic multigrid built on the GPU (`adaptmg.amg`), 2-D Q1 1.05M",
              "`python scripts/bench_amg.py --cases 2d --geometric --hybrid`"),
    "amg3d": ("same, 3-D Q1 2.15M", "`python scripts/bench_amg.py --cases 3d --geometric --hybrid`"),
    "hex": ("distorted hex block, 1.03M DoFs, one mesh level (as imported)",
            "`python scripts/bench_amg.py --cases hex --hybrid`"),
    "latency": ("`ml.solve` on small problems", "`python scripts/bench_solve_latency.py`"),
    "gs": ("block multicolour Gauss-Seidel vs block Jacobi, 3-D elasticity (edge 6)",
           "`python scripts/bench_elasticity_gs.py --backend gpu --size 6`"),
    "adaptive": ("adaptive L-shape loop (solve, estimate, mark, refine) to >= 1M DoFs, GPU (mesh on the "
                 "GPU; and on the host) vs CPU backend",
                 "`python scripts/adaptive.py --problem lshape --backend gpu --max-dofs 1000000` "
                 "(and `--mesh-backend cpu`, `--backend cpu`)"),
    "setup": ("time to solution, mesh -> x (mesh, `multigrid()`, load + constrain, solve), 3-D Q1 "
              "uniform 2.15M / adaptive 2.66M DoFs, warm",
              "`python scripts/bench_setup.py --cases uniform,adaptive --mesh-backend gpu` (and `--mesh-backend cpu`)"),
    "coldstart": ("first run in a fresh process, empty kernel caches, 3-D adaptive 340k DoFs",
                  "`python scripts/bench_setup.py --cases adaptive --dofs 3e5 --cold` (and `--mesh-backend gpu`)"),
}


def load_script(name):
    """Import ``scripts/<name>.py`` as a module (the scripts are not a package)."""
    key = f"_adaptmg_script_{name}"
    if key in sys.modules:
        return sys.modules[key]
    spec = importlib.util.spec_from_file_location(key, os.path.join(HERE, f"{name}.py"))
    mod = importlib.util.module_from_spec(spec)
    sys.modules[key] = mod
    spec.loader.exec_module(mod)
    return mod


class Ctx:
    """What a row needs to know: sizes (quick or not), GPU present, fallback allowed."""

    def __init__(self, quick, gpu, cpu_fallback, repeat):
        self.quick, self.gpu, self.cpu_fallback, self.repeat = quick, gpu, cpu_fallback, repeat
        self.cache = {}

    @property
    def backend(self):
        """Backend of the "GPU" figures, or None when they cannot be measured here."""
        if self.gpu:
            return "gpu"
        return "cpu" if self.cpu_fallback else None

    def mark(self, text):
        tags = []
        if self.backend == "cpu":
            tags.append("CPU backend")
        if self.quick:
            tags.append("quick")
        return text + (f" [{', '.join(tags)}]" if tags else "")


def fmt_t(s):
    """Seconds as the README writes them: ms below 0.1 s, else s."""
    return f"{1e3 * s:.1f} ms" if s < 0.1 else f"{s:.2f} s"


def fmt_x(r):
    """A speed-up ratio: '209x', '1.3x'."""
    return f"{r:.0f}x" if r >= 10 else f"{r:.1f}x"


# ----------------------------------------------------------------------------- Poisson
def poisson_case(ctx, dim):
    """bench_poisson's problem and its solvers' figures (memoised per dim)."""
    if dim in ctx.cache:
        return ctx.cache[dim]
    import adaptmg
    from adaptmg import assemble
    bp = load_script("bench_poisson")
    base, L = (4, 8) if dim == 2 else (2, 6)
    if ctx.quick:
        L -= 4 if dim == 2 else 3
    mesh = adaptmg.Mesh.box([0] * dim, [1] * dim, [base] * dim)
    for _ in range(L):
        mesh = mesh.refine()
    space = adaptmg.Space(mesh, 1)
    con = adaptmg.Constraints(space, space.boundary_dofs())
    K = con.matrix(assemble.stiffness(space))
    f = con.rhs(assemble.load(space, lambda x: np.exp(x[..., 0]) * (1 + x[..., 1] ** 2) + x[..., -1]))
    out = {"dofs": space.num_dofs, "pyamg": bp.run_pyamg(K, f, ctx.repeat)}
    if ctx.backend is not None:
        out["adaptmg"] = bp.run_adaptmg(mesh, ctx.backend, f, ctx.repeat)
        out["adaptmg"].pop("ml", None)
    if ctx.gpu:
        out["cupyx"] = bp.run_cupyx_cg(K, f, ctx.repeat)
    ctx.cache[dim] = out
    return out


def row_poisson2d(ctx):
    r = poisson_case(ctx, 2)
    py = r["pyamg"]
    if "adaptmg" not in r:
        return f"GPU solve {NA} vs pyamg SA+CG {fmt_t(py['solve'])} ({r['dofs']} DoFs, {py['its']} its)"
    a = r["adaptmg"]
    cupyx = f"; plain cupyx CG+Jacobi {fmt_t(r['cupyx']['solve'])}" if "cupyx" in r else \
        f"; plain cupyx CG+Jacobi {NA}"
    return ctx.mark(f"GPU solve {fmt_t(a['solve'])} ({a['its']} CG its) vs pyamg SA+CG {fmt_t(py['solve'])}: "
                    f"{py['solve'] / a['solve']:.0f}x{cupyx}")


def row_poisson3d(ctx):
    r = poisson_case(ctx, 3)
    py = r["pyamg"]
    if "adaptmg" not in r:
        return f"GPU {NA} vs pyamg {fmt_t(py['solve'])} ({r['dofs']} DoFs)"
    a = r["adaptmg"]
    return ctx.mark(f"GPU {fmt_t(a['solve'])} vs pyamg {fmt_t(py['solve'])}: {py['solve'] / a['solve']:.0f}x")


def row_vcycle(ctx):
    if ctx.backend is None:
        return NA
    a2, a3 = poisson_case(ctx, 2)["adaptmg"], poisson_case(ctx, 3)["adaptmg"]
    return ctx.mark(f"{a2['cycle'] / a2['spmv']:.1f} fine SpMVs (2-D), {a3['cycle'] / a3['spmv']:.1f} (3-D)")


# ----------------------------------------------------------------------------- pyamg bridge
def row_bridge(ctx):
    if ctx.backend is None:
        return NA
    bb = load_script("bench_pyamg_bridge")
    n = 64 if ctx.quick else 1024
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        bb.main(["--n", str(n), "--backend", ctx.backend, "--repeat", str(ctx.repeat), "--skip-gs"])
    text = buf.getvalue()
    m = re.search(r"ratio pyamg CPU solve / adaptmg \w+ solve \(same hierarchy\): ([0-9.]+)x", text)
    its = re.findall(r"^(pyamg SA-Jacobi, CPU|adaptmg from_pyamg, \w+)\s+\S+\s+\S+\s+(\d+)", text, re.M)
    if m is None:
        raise RuntimeError("bench_pyamg_bridge printed no ratio:\n" + text)
    it = {k.split(",")[0]: int(v) for k, v in its}
    same = "same CG iterations" if len(set(it.values())) == 1 else \
        f"CG iterations {it.get('pyamg SA-Jacobi')} (pyamg) vs {it.get('adaptmg from_pyamg')}"
    return ctx.mark(f"{float(m.group(1)):.1f}x pyamg's own CPU solve, {same}")


# ----------------------------------------------------------------------------- matrix-free
def row_patch(ctx):
    if not ctx.gpu:                      # CUDA kernels only: no CPU fallback
        return NA
    bpatch = load_script("bench_patch")
    from adaptmg.backend import get_backend
    from adaptmg.patch import CartesianSpace, LaplaceOperator
    be = get_backend("gpu")
    cp = be.xp
    V = CartesianSpace(3, 7, bpatch.pick_level(3, 7, 2e6 if ctx.quick else 3.0e8))

    def apply_time():
        u = cp.random.default_rng(7).standard_normal(V.n_dofs)
        A = LaplaceOperator(V, be, np.float64)
        out = cp.empty_like(u)
        return bpatch.timeit(cp, lambda: A.matvec(u, out=out), ctx.repeat)[0]
    t = apply_time()
    cp.get_default_memory_pool().free_all_blocks()
    rows = []
    args = argparse.Namespace(l2_max=0, fmg_min_cycles=[1])     # Algorithm 2.2: at least one V-cycle
    bpatch.bench_solve(args, be, rows, [4], 2e6 if ctx.quick else 1.1e9, large=True)
    fmg = {r["precision"]: r for r in rows if r["method"] == "fmg"}
    if "double" in fmg:
        d = fmg["double"]
        mixed = f"; mixed precision {fmg['mixed']['time']:.2f} s" if "mixed" in fmg else ""
        solve = f"{d['dofs']:.3g}-DoF Poisson solved by FMG in {d['time']:.2f} s (double, the default{mixed})"
    else:
        solve = "FMG solve failed (see output)"
    return ctx.mark(f"{V.n_dofs / t / 1e9:.0f} GDoF/s; {solve}")


# ----------------------------------------------------------------------------- application problems
def _problems_args(ctx, **kw):
    a = argparse.Namespace(repeat=ctx.repeat, el_tol="residual", el_rtol=1e-6, el_rhs_extra=False,
                           td_n=[10], el_edge=[6], el_face=[5], td_mesh="gpu")
    for k, v in kw.items():
        setattr(a, k, v)
    return a


def _quiet_call(fn, *a):
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        return fn(*a)


def _problems_warm(ctx):
    """bench_problems.warmup() once per run (kernel compilation before the timed runs)."""
    bpr = load_script("bench_problems")
    if not ctx.cache.get("warm"):
        _quiet_call(bpr.warmup)
        ctx.cache["warm"] = True
    return bpr


def row_td(ctx):
    n = 6 if ctx.quick else 10
    paper = " (paper: 5.2 / 31.2 / 9.0 s)" if not ctx.quick else ""
    if ctx.gpu:
        bpr = _problems_warm(ctx)
        _quiet_call(bpr.part_td, _problems_args(ctx, td_n=[n]))
        t = bpr.RESULTS["td_gpu"][-1]
    elif ctx.cpu_fallback:
        from adaptmg_problems import transport_diffusion as td
        t = td.run(n, backend="cpu", quiet=True, steps=10 if ctx.quick else 100)["timings"]
    else:
        return NA
    total = t['init'] + t['rhs'] + t['solve']
    where = ", mesh on the device" if ctx.gpu else ""
    return ctx.mark(f"init {t['init']:.2f} s{where}, rhs {t['rhs']:.2f} s, solve {t['solve']:.2f} s, "
                    f"total {total:.2f} s{paper}")


def row_elasticity(ctx):
    edge, face = (2, 2) if ctx.quick else (6, 5)
    if ctx.gpu:
        bpr = _problems_warm(ctx)
        args = _problems_args(ctx, el_edge=[edge], el_face=[face])
        _quiet_call(bpr.part_el, "edge", [edge], args)
        _quiet_call(bpr.part_el, "face", [face], args)
        e, f = bpr.RESULTS["el_edge_gpu"][-1], bpr.RESULTS["el_face_gpu"][-1]
    elif ctx.cpu_fallback:
        from adaptmg_problems import elasticity as el
        steps = 2 if ctx.quick else 100
        runs = [el.run(c, l, backend="cpu", quiet=True, steps=steps, tol="residual", rtol=1e-6)
                for c, l in (("edge", edge), ("face", face))]
        e, f = (dict(r["timings"], dofs=r["dofs"]) for r in runs)
    else:
        return NA

    def k(d):
        return f"{d / 1e6:.2f}M" if d >= 1e6 else f"{d / 1e3:.0f}k"
    paper = " (paper: 14.7 / 122.6 s)" if not ctx.quick else ""
    return ctx.mark(f"solve {e['solve']:.2f} s at {k(e['dofs'])} DoFs, {f['solve']:.2f} s at {k(f['dofs'])} DoFs"
                    f"{paper}; init {e['init']:.1f} / {f['init']:.1f} s")


def row_ns(ctx):
    if not ctx.gpu:                      # the README figure is the GPU time step
        return NA
    bns = load_script("bench_navier_stokes")
    n = "8,8,16" if ctx.quick else "32,32,64"
    steps = 20 if ctx.quick else 200
    args = argparse.Namespace(n=n, dt=1e-4, Re=1000.0, uniform=False, backend="gpu", steps=steps, warmup=10,
                              start=0, cpu_steps=0, rtol=1e-6, rtol_fast=0.0, spmv=False, mg="", variants="")
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        bns.bench(args)
    m = re.search(r"^GPU: ([0-9.]+) ms/step", buf.getvalue(), re.M)
    if m is None:
        raise RuntimeError("bench_navier_stokes printed no GPU ms/step:\n" + buf.getvalue())
    ms = float(m.group(1))
    paper = " (paper: 41.5 ms, 1660 s)" if not ctx.quick else ""
    return ctx.mark(f"{ms:.1f} ms per time step; the paper's 40 000 steps in {40000 * ms / 1e3:.0f} s{paper}")


# ----------------------------------------------------------------------------- algebraic multigrid
def _free_gpu(ctx):
    """Return the CuPy memory pool's blocks between the large rows."""
    if ctx.gpu:
        import cupy
        cupy.get_default_memory_pool().free_all_blocks()


def amg_case(ctx, case):
    """bench_amg's case ``2d`` / ``3d`` / ``hex``: the same matrix and right-hand side for
    ``run_adaptmg_amg`` (boxes), ``run_adaptmg_hybrid`` (2-D box and hex block) and ``run_pyamg``."""
    import adaptmg
    from adaptmg.backend import get_backend
    ba = load_script("bench_amg")
    if case == "2d":
        n = 64 if ctx.quick else 1024
        mesh = adaptmg.Mesh.box([0, 0], [1, 1], [n, n])
    elif case == "3d":
        n = 16 if ctx.quick else 128
        mesh = adaptmg.Mesh.box([0] * 3, [1] * 3, [n] * 3)
    else:
        n = 16 if ctx.quick else 100
        mesh = ba.hex_block(n)
    space, K, f = ba.problem(mesh)
    out = {"n": n, "dofs": K.shape[0]}
    if ctx.backend is not None:
        be = get_backend(ctx.backend)
        if case != "hex":
            out["amg"] = ba.run_adaptmg_amg(K, f, be, ctx.repeat, 1.0)
        if case in ("2d", "hex"):
            out["hybrid"] = ba.run_adaptmg_hybrid(space, K, f, be, ctx.repeat, 1.0)
        for k in ("amg", "hybrid"):
            if k in out:
                out[k].pop("ml", None)
        _free_gpu(ctx)
    out["pyamg"] = ba.run_pyamg(K, f, ctx.repeat)
    return out


def _amg_text(ctx, r):
    p = r["pyamg"]
    if "amg" not in r:
        return ctx.mark(f"SA set-up and solve {NA}; pyamg set-up {fmt_t(p['sa'])}, solve {fmt_t(p['solve'])}, "
                        f"{p['its']} its ({r['dofs']:,} DoFs)")
    a = r["amg"]
    text = (f"SA set-up {fmt_t(a['sa'])} (pyamg {fmt_t(p['sa'])}: {fmt_x(p['sa'] / a['sa'])}), "
            f"solve {fmt_t(a['solve'])} ({a['its']} its; pyamg {fmt_t(p['solve'])}, {p['its']} its): "
            f"{fmt_x(p['solve'] / a['solve'])}")
    if "hybrid" in r:
        h = r["hybrid"]
        text += f"; hybrid from the unrefined {r['n']}^2 box {fmt_t(h['solve'])}, {h['its']} its"
    return ctx.mark(text)


def row_amg2d(ctx):
    return _amg_text(ctx, amg_case(ctx, "2d"))


def row_amg3d(ctx):
    return _amg_text(ctx, amg_case(ctx, "3d"))


def row_hex(ctx):
    r = amg_case(ctx, "hex")
    p = r["pyamg"]
    if "hybrid" not in r:
        return ctx.mark(f"hybrid {NA} vs pyamg {fmt_t(p['solve'])}, {p['its']} its ({r['dofs']:,} DoFs)")
    h = r["hybrid"]
    where = "GPU" if ctx.backend == "gpu" else "CPU"
    return ctx.mark(f"hybrid (geometric + algebraic, set up on the {where}): {fmt_t(h['solve'])}, {h['its']} its "
                    f"vs pyamg {fmt_t(p['solve'])}, {p['its']} its")


# ----------------------------------------------------------------------------- solve latency
def row_latency(ctx):
    bl = load_script("bench_solve_latency")
    k_small, k_mid = (3, 5) if ctx.quick else (5, 7)          # 2-D 1,089 and 16,641 DoFs
    small, mid = bl.problem(2, k_small), bl.problem(2, k_mid)

    def ms(t):
        return f"{1e3 * t:.2f} ms"

    def us(t):
        return f"{1e6 * t:.0f} us"
    cpu = bl.measure(small, "cpu", max(3, ctx.repeat // 2))        # the script's CPU repeat
    if ctx.backend is None:
        return ctx.mark(f"2-D {cpu['n']:,} DoFs: GPU {NA}, CPU backend {ms(cpu['solve'])}")
    g1 = bl.measure(small, ctx.backend, ctx.repeat)
    g2 = bl.measure(mid, ctx.backend, ctx.repeat)
    _free_gpu(ctx)
    graph = f", CUDA-graph iteration {us(g2['graph'])}" if "graph" in g2 else ""
    return ctx.mark(f"2-D {g1['n']:,} DoFs {ms(g1['solve'])} (CPU backend {ms(cpu['solve'])}), "
                    f"{g2['n']:,} DoFs {ms(g2['solve'])} ({g2['its']} CG its; marginal iteration "
                    f"{us(g2['marginal'])}{graph})")


# ----------------------------------------------------------------------------- block Gauss-Seidel
def row_gs(ctx):
    if ctx.backend is None:
        return NA
    from adaptmg.backend import get_backend
    bg = load_script("bench_elasticity_gs")
    be = get_backend(ctx.backend)
    # the script's static part (contraction, CG iterations, solve time) with its defaults
    args = argparse.Namespace(case="edge", size=2 if ctx.quick else 6, levels=None, cycles=10, rtol=1e-8,
                              repeat=ctx.repeat)
    rows = {r["smoother"]: r for r in _quiet_call(bg.part_static, args, be, lambda s: None)}
    _free_gpu(ctx)
    g, j = rows["block_gauss_seidel"], rows["block_jacobi"]
    where = "GPU" if ctx.backend == "gpu" else "CPU"
    return ctx.mark(f"V(2,2) contraction {g['factor']:.3f} vs {j['factor']:.3f}, CG {g['cg_iters']} vs "
                    f"{j['cg_iters']} its, {fmt_x(g['solve_s'] / j['solve_s'])} the solve time on the {where} "
                    f"({fmt_t(g['solve_s'])} vs {fmt_t(j['solve_s'])}; {g['colors']} colours; {g['dofs']:,} DoFs)")


# ----------------------------------------------------------------------------- adaptive loop
def row_adaptive(ctx):
    import importlib
    ad = load_script("adaptive")
    mod = importlib.import_module("adaptmg_problems.lshape")
    max_dofs = 20_000 if ctx.quick else 1_000_000

    def run(backend, mesh_backend=None, repeat=1):
        # what `adaptive.py --problem lshape --backend B [--mesh-backend M] --max-dofs N` runs (steps
        # 200: stop at N; the mesh on the GPU with the GPU backend unless M says cpu) in a warm
        # process: the same loop once untimed first (every kernel and array size the timed loops
        # meet is then compiled, loaded and pooled), then ``repeat`` timed loops, the median kept
        kw = dict(steps=200, backend=backend, quiet=True, out=None, strategy="doerfler", theta=0.5,
                  max_dofs=max_dofs, estimator="residual", mesh_backend=mesh_backend)
        _quiet_call(lambda: ad.timed_run(mod, **kw))
        runs = []
        for _ in range(repeat):
            res, rows, total = _quiet_call(lambda: ad.timed_run(mod, **kw))
            runs.append((total, {k: sum(r[k] for r in rows) for k in ad.BREAKDOWN}))
        total, sums = sorted(runs, key=lambda r: r[0])[len(runs) // 2]
        return dict(total=total, dofs=res["history"][-1]["dofs"], solves=len(res["history"]), sums=sums,
                    all=[t for t, _ in runs])

    def parts(d):
        return ", ".join(f"{k} {d['sums'][k]:.2f}" for k in ("refine", "setup", "solve", "estimate", "error")) + " s"
    g = run(ctx.backend, repeat=3) if ctx.backend is not None else None   # mesh on the GPU
    h = run(ctx.backend, "cpu") if ctx.backend is not None else None      # host mesh, GPU solve
    _free_gpu(ctx)
    c = run("cpu")
    if g is None:
        return ctx.mark(f"GPU {NA}; CPU backend {c['total']:.2f} s to {c['dofs']:,} DoFs ({c['solves']} solves; "
                        f"{parts(c)})")
    runs = ", ".join(f"{t:.2f}" for t in g["all"])
    return ctx.mark(f"GPU, mesh on the GPU {g['total']:.2f} s (median of {runs} s) (host mesh {h['total']:.2f} s, "
                    f"{h['dofs']:,} DoFs) vs CPU backend {c['total']:.2f} s to {g['dofs']:,} DoFs ({g['solves']} "
                    f"solves): {fmt_x(c['total'] / g['total'])}; GPU breakdown, mesh on the GPU: {parts(g)}; "
                    f"host mesh: {parts(h)}")


def _setup_args(ctx, **kw):
    import argparse
    a = dict(backend=ctx.backend, refine=3 if ctx.quick else 6, dofs=3e4 if ctx.quick else 2.6e6,
             amg=True, load="device", profile=0, mesh_backend="cpu")
    a.update(kw)
    return argparse.Namespace(**a)


def _phases(r):
    return (f"{r['total']:.2f} s (mesh {r['mesh']:.2f}, multigrid {r['multigrid']:.2f}, load "
            f"{r['load']:.2f}, solve {r['solve1']:.3f})")


def row_setup(ctx):
    if ctx.backend is None:
        return NA
    bs = load_script("bench_setup")
    out = []
    # on the GPU the mesh on the device (Mesh.box(..., backend="gpu")) and, as before, on the host
    for mb in (("gpu", "cpu") if ctx.gpu else ("cpu",)):
        for case in ("uniform", "adaptive"):
            args = _setup_args(ctx, mesh_backend=mb)
            bs.run_case(case, args)                              # warm-up
            r = bs.run_case(case, args)
            out.append(f"{case} {r['dofs']:,} DoFs, mesh on the {'device' if mb == 'gpu' else 'host'}: "
                       f"{_phases(r)}; `adaptmg.amg` set-up on the same matrix {r['amg_setup']:.2f} s")
    return ctx.mark("; ".join(out))


def row_coldstart(ctx):
    if not ctx.gpu:
        return NA
    import tempfile
    bs = load_script("bench_setup")
    out = []
    for mb in ("cpu", "gpu"):                # the mesh on the host, then on the device
        args = _setup_args(ctx, dofs=3e4 if ctx.quick else 3e5, mesh_backend=mb)
        with tempfile.TemporaryDirectory() as empty:
            first = bs.cold("adaptive", args, empty)
        bs.run_case("adaptive", args)
        warm = bs.run_case("adaptive", args)
        out.append(f"mesh on the {'device' if mb == 'gpu' else 'host'}: first run on a machine "
                   f"{first['total']:.2f} s to x ({first['kernels']} kernels loaded, {first['compiled']} of them "
                   f"compiled by NVRTC; `adaptmg.amg` set-up {first['amg_setup']:.1f} s), warm process "
                   f"{warm['total']:.2f} s (target 2 x warm + 1 s = {2 * warm['total'] + 1:.2f} s)")
    return ctx.mark("; ".join(out))


ROW_FUNCS = {"poisson2d": row_poisson2d, "poisson3d": row_poisson3d, "vcycle": row_vcycle, "bridge": row_bridge,
             "patch": row_patch, "td": row_td, "elasticity": row_elasticity, "ns": row_ns,
             "amg2d": row_amg2d, "amg3d": row_amg3d, "hex": row_hex, "latency": row_latency, "gs": row_gs,
             "adaptive": row_adaptive, "setup": row_setup, "coldstart": row_coldstart}


# ----------------------------------------------------------------------------- output
def device_line(gpu):
    """'one H100 80GB, CuPy 14.2; host CPU of the same machine' style description."""
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        with open("/proc/cpuinfo") as fh:
            names = [ln.split(":", 1)[1].strip() for ln in fh if ln.startswith("model name")]
        if names:
            cpu = f"{names[0]} ({len(names)} threads)"
    if not gpu:
        return f"no GPU; host CPU {cpu}"
    import cupy
    name = cupy.cuda.runtime.getDeviceProperties(0)["name"]
    name = name.decode() if isinstance(name, bytes) else str(name)
    return f"one {name}, CuPy {cupy.__version__}; host CPU {cpu}"


def render(results, gpu, argv):
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    head = [f"## Measured performance ({device_line(gpu)})", "",
            f"Printed by `python scripts/bench_readme.py{''.join(' ' + x for x in argv)}` on {date}.", "",
            "| what | command | result |", "|---|---|---|"]
    return "\n".join(head + [f"| {README[k][0]} | {README[k][1]} | {v} |" for k, v in results.items()])


def _error_text(exc):
    """``error: <message>`` on one line (the message's first line; no '|' to break the table)."""
    msg = (str(exc).strip().splitlines() or [""])[0].replace("|", "/")
    return f"error: {type(exc).__name__}: {msg}" if msg else f"error: {type(exc).__name__}"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="tiny sizes (smoke run)")
    ap.add_argument("--rows", default=",".join(ROWS), help=f"comma separated subset of {','.join(ROWS)}")
    ap.add_argument("--skip", default="", help="comma separated rows to leave out (to split a long run)")
    ap.add_argument("--cpu-fallback", action="store_true",
                    help="measure the GPU figures with the CPU backend when no GPU is visible")
    ap.add_argument("--repeat", type=int, default=None, help="timing repetitions (default 5, quick 1)")
    argv = sys.argv[1:] if argv is None else list(argv)
    a = ap.parse_args(argv)
    rows = [r.strip() for r in a.rows.split(",") if r.strip()]
    skip = {r.strip() for r in a.skip.split(",") if r.strip()}
    bad = [r for r in rows + sorted(skip) if r not in ROWS]
    if bad:
        ap.error(f"unknown rows {bad}; choose from {list(ROWS)}")
    rows = [r for r in rows if r not in skip]
    repeat = a.repeat if a.repeat is not None else (1 if a.quick else 5)
    if repeat < 1:
        ap.error("--repeat must be >= 1")
    from adaptmg import gpu_available
    os.environ.setdefault("ADAPTMG_QUIET", "1")
    warnings.simplefilter("ignore")
    gpu = gpu_available()
    ctx = Ctx(a.quick, gpu, a.cpu_fallback, repeat)
    results = {}
    t0 = time.perf_counter()
    for r in rows:
        t1 = time.perf_counter()
        try:
            results[r] = ROW_FUNCS[r](ctx)
        except Exception as exc:                 # one row's failure must not cost the others
            traceback.print_exc(file=sys.stderr)
            results[r] = _error_text(exc)
            with contextlib.suppress(Exception):
                _free_gpu(ctx)
        print(f"[{r}: {time.perf_counter() - t1:.1f} s] {results[r]}", file=sys.stderr, flush=True)
    print(render(results, gpu, argv))
    print(f"\n({time.perf_counter() - t0:.0f} s in all)")
    return results


if __name__ == "__main__":
    main()
