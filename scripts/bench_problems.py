#!/usr/bin/env python3
"""Benchmark the application problems of seed 001 §5 on GPU and CPU (Tables 1, 3, 4 layouts).

Usage (on the device machine; every part prints its table as soon as it is done)::

    python scripts/bench_problems.py --parts check,td,td-cpu,el-edge --out $OUT/bench.json
    python scripts/bench_problems.py --parts el-face,el-vertex,el-cpu,ns

Parts
-----
check     CPU and GPU agree (transport-diffusion n=6 and elasticity edge level 2, 5 steps).
td        transport-diffusion on the GPU, n = --td-n (default 7..10), 100 steps (dt = 0.02,
          T = 2); the largest n is run --repeat times and the median of each phase reported;
          the init of the largest n is broken down by function (see below); --td-mesh: the
          mesh built on the GPU (issue 36, the default of the problem), on the host, or both.
td-cpu    the same on the CPU for --td-cpu-n (default 7..9, 100 steps); n = 10 on the CPU
          with --td-cpu-steps10 steps only, rhs/solve scaled to 100 steps (marked "x").
el-edge, el-face, el-vertex
          elasticity on the GPU, 100 steps (dt = 0.025, T = 2.5), levels --el-edge etc.
el-cpu    elasticity on the CPU for small levels with --el-cpu-steps steps, rhs/solve
          scaled to 100 steps (marked "x").
ns        Navier-Stokes (:mod:`adaptmg_problems.navier_stokes`): 3-D cavity
          32x32x64, --ns-steps steps, GPU (and CPU with --ns-cpu-steps).

Init breakdown.  The hierarchy setup runs in other modules (mesh, spaces, assembly,
constraints, transfer, multigrid); to say where init goes without a profiler's overhead
the benchmark wraps a few functions with wall-clock counters for one run (the device is
synchronised only at the phase boundaries of :class:`adaptmg_problems._timing.Timer`; the
functions that launch device work -- ``MultilevelSolver`` setup, on the GPU the elasticity
assembly and ``Constraints.matrix`` of the node-block system -- are charged what the host
waits for them, which is most of it, as they read sizes and scales back).  Nested
calls are charged to both (e.g. ``assemble.mass`` inside the system-matrix callback).
Times are medians where repeated; GPU runs are preceded by a warm-up that compiles all
kernels.

Issue 15 (set-up): the elasticity system is now a node-block matrix (10 fields on the
scalar pattern, :class:`adaptmg.fe.csr_ops.NodeBlockMatrix`); ``Constraints.matrix``
forms H^T S H on the scalar pattern for all fields at once (``csr_ops.congruence_map``)
and expands once -- on the GPU backend on the device (only the fields are copied up).
CPU seconds (process time, one thread, 2-core VM) of face 5, 1 035 030 DoFs, before ->
after: Constraints.matrix 4.49 + _system_from_blocks 2.57 = 7.06 -> 2.56
(congruence_map 0.51, expansion ``NodeBlockMatrix.tocsr`` 1.68 -- on the device on the
GPU --, block_system 0.10); face 4: 1.60 -> 0.78.  The probe lists the new functions.

Latest (H100 80GB + 16 host cores, CuPy 14.2, 2026-11-22, after the device assembly
(``scalar_form(device=...)``: pattern and sums on the GPU), the threaded multigrid set-up
and the page-locked uploads; ``--parts td,el-edge,el-face --td-n 10 --el-edge 6
--el-face 5 --repeat 5``), seconds:

     transport-diffusion n=10 (1 050 625 DoFs)  init 1.50  rhs 0.05  solve 0.49  L2 5.281e-4
         (targets 2 / 0.2 / 0.9; one probed run: scalar_form 0.70, Mesh.refine 0.56,
         prolongation 0.33, Constraints.matrix 0.23, MultilevelSolver setup 0.22, the
         last three mostly on worker threads)
     elasticity edge 6 (209 910 DoFs, tol='residual')  init 2.18  solve 0.90  (target 1.5)
     elasticity face 5 (1 035 030 DoFs, tol='residual')  init 10.5  solve 2.73 (target 12)

  Before that (same day): transport-diffusion init 3.14 (scalar_form 1.65 of which the
  sparsity patterns 0.9), elasticity init 3.21 / 17.3, solves 1.00 / 2.88.
  The elasticity V-cycle costs 0.47 ms as a graph against 1.7-2.2 ms launched kernel by
  kernel (7 levels, V(2,2) block Jacobi); ``run(mg_dtype=np.float32)`` gives 0.37 ms and
  an edge-6 solve of 0.84 s.  The vertex case and the CPU columns were not re-run.

Earlier (same machine and day, before those changes; two runs of this script:
``--parts check,td,td-cpu,el-edge --el-rhs-extra`` and ``--parts check,td,td-cpu,el-edge,
el-face,el-vertex,el-cpu,ns --td-n 9 10 --td-cpu-n 9 --el-edge 4 5 6 --el-rhs-extra
--el-cpu-edge 4 --el-cpu-face 2 3 --el-cpu-vertex 3 4``), seconds, 100 steps:

  CPU/GPU agreement: transport-diffusion n=6 max|u_cpu - u_gpu| = 6.7e-16, elasticity
  edge 2 relative 1.6e-15, identical iteration counts.

  transport-diffusion, GPU (dt 0.02, GMRES rtol 1e-8 vs ||b||, 3.7 it/step)
     n      DOFs   init    rhs  solve    sum   L2 error       (paper GPU init/rhs/solve)
     9   263 169   1.95  0.024   0.59   2.56   5.280e-04       1.41 / 7.2  / 4.47
    10 1 050 625   7.37  0.048   0.84   8.08   5.281e-04       5.21 / 31.16 / 9.0
  CPU: n=9 1.87 / 1.19 / 16.44 / 19.50; n=10 (10 steps, solve scaled by iterations)
  6.55 / 6.33 / 87.0 / 99.9  ->  GPU/CPU solve 0.036 (n=9), 0.010 (n=10).
  init breakdown n=10 (GPU run): assemble.mass 2.19 (6 calls, incl. each level's sparsity
  pattern), assemble.convection 0.95, Constraints.__init__ 0.85, Mesh.refine 0.85 (8),
  assemble.stiffness 0.83, Constraints.matrix 0.76, transfer.prolongation 0.74,
  MultilevelSolver setup 0.57.

  elasticity, GPU, tol='residual' rtol=1e-6 (GMRES works in every step: ~11 it/step)
     case    level      DOFs   init   rhs  solve    sum     (paper GPU solve)
     edge      6     209 910   3.02  0.03   3.02   5.89          14.7
     edge      6 (tol='rhs', rtol=1e-8: 43 iterations in 100 steps) solve 0.23
     face      5   1 035 030  17.82  0.05   3.78  21.65         122.57
     vertex    6      22 494   0.53  0.04   3.41   3.98           7.9
  The elasticity solve costs 2.7-3.4 ms per GMRES iteration from 22k to 1.04M DoFs:
  launch/host overhead of the V-cycle and GMRES, not bandwidth.
  init breakdown face 5: Constraints.matrix 8.00 (6 levels), MultilevelSolver setup 3.16,
  our _system_from_blocks 2.70, assemble.elasticity 1.78, assemble.mass 0.89.

GMRES orthogonalisation of :func:`adaptmg_problems._stepping.gmres_step` (H100, 70k
unknowns): 0.54 ms per iteration with "cgs2" (a constant number of launches per step)
against 0.98 ms with "mgs"; hence the default "cgs2".
"""
from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import statistics
import time
import warnings

import numpy as np

from adaptmg_problems._timing import format_table

PHASES = ("init", "rhs", "solve", "sum")
RESULTS = {}


def log(*a):
    print(*a, flush=True)


# ------------------------------------------------------------------ instrumentation
@contextlib.contextmanager
def probe():
    """Wrap the main init functions of other modules with wall-clock counters."""
    import adaptmg.multilevel.hierarchy as gmg
    import adaptmg.assemble as asm
    import adaptmg.mesh.mesh as meshmod
    from adaptmg.fe import constraints as cmod
    from adaptmg.fe import csr_ops
    from adaptmg_problems import elasticity as el
    acc = {}
    patched = []

    def wrap(owner, name, label):
        orig = getattr(owner, name)

        @functools.wraps(orig)
        def f(*a, **k):
            t0 = time.perf_counter()
            try:
                return orig(*a, **k)
            finally:
                v = acc.setdefault(label, [0.0, 0])
                v[0] += time.perf_counter() - t0
                v[1] += 1
        setattr(owner, name, f)
        patched.append((owner, name, orig))

    wrap(meshmod.Mesh, "refine", "Mesh.refine (mesh construction)")
    wrap(meshmod.Mesh, "hierarchy", "Mesh.hierarchy (global coarsening)")
    wrap(gmg.Space, "__init__", "Space.__init__ (all spaces; triggers Mesh.cells)")
    wrap(gmg, "dirichlet_dofs", "gmg.dirichlet_dofs (boundary DoFs per level)")
    wrap(cmod.Constraints, "__init__", "Constraints.__init__ (per level)")
    wrap(cmod.Constraints, "matrix", "Constraints.matrix (Z H^T A H Z per level)")
    wrap(gmg, "prolongation", "transfer.prolongation (P_l per level)")
    wrap(gmg.MultilevelSolver, "__init__", "MultilevelSolver setup (smoothers, device copies, coarse inverse)")
    for nm in ("mass", "stiffness", "convection", "elasticity", "scalar_form"):
        wrap(asm, nm, f"assemble.{nm}")
    wrap(el, "_system_from_blocks", "elasticity._system_from_blocks (6-comp CSR, ours)")
    wrap(el, "block_system", "elasticity.block_system (node-block fields, ours)")
    wrap(csr_ops.NodeBlockMatrix, "tocsr", "NodeBlockMatrix.tocsr (expansion to CSR)")
    wrap(cmod, "congruence_map", "csr_ops.congruence_map (H^T S H on the node pattern)")
    wrap(cmod, "congruence_map_on", "congruence.congruence_map_on (the same map on the device)")
    from adaptmg.assemble import on_device
    wrap(on_device, "elasticity_entries", "on_device.elasticity_entries (element matrices, device)")
    from adaptmg.assemble import forms as asm_forms          # imported by name there: patched there
    wrap(asm_forms, "device_element_sums", "forms.device_element_sums (scalar forms' element matrices "
         "and their sums, device)")
    from adaptmg.mesh import _tree
    from adaptmg.multilevel import transfer
    wrap(_tree.Forest, "split", "Forest.split (inside Mesh.refine)")
    wrap(asm, "lumped_mass", "assemble.lumped_mass")
    wrap(transfer, "_q1_forest_groups", "transfer._q1_forest_groups (host index work of P_l)")
    try:
        yield acc
    finally:
        for owner, name, orig in reversed(patched):
            setattr(owner, name, orig)


def print_probe(acc, init_total, title):
    rows = [dict(fn=k, s=v[0], calls=v[1], pct=100.0 * v[0] / init_total)
            for k, v in sorted(acc.items(), key=lambda kv: -kv[1][0])]
    log(format_table(rows, [("fn", "function"), ("calls", "calls"), ("s", "seconds", ".3f"),
                            ("pct", "% of init", ".1f")],
                     title=f"{title}: init {init_total:.2f} s, by function (nested calls counted in both; "
                           "multigrid set-up tasks run on worker threads, so shares may sum past 100 %)"))
    return rows


# ------------------------------------------------------------------ helpers
def figures(r, *keys):
    """The named figures of a run's result, not the run: a held mesh, hierarchy and Krylov
    basis (~1 GB of host and device memory per 1M-DoF run) made every later repeat's set-up
    allocate fresh memory (H100, transport-diffusion n=10, bench_readme --rows td,td,td:
    totals 1.36-1.47 s while held, 1.15-1.21 s without)."""
    return {k: r[k] for k in keys if k in r}


def med_timings(runs):
    return {p: statistics.median(r["timings"][p] for r in runs) for p in PHASES}


def scaled(r, steps_full):
    """Timings with rhs/solve scaled from r['steps'] to steps_full."""
    f = steps_full / r["steps"]
    t = dict(r["timings"])
    t["rhs"] *= f
    t["solve"] *= f
    t["sum"] = t["init"] + t["rhs"] + t["solve"]
    return t


def gpu_ok():
    from adaptmg import gpu_available
    return gpu_available()


def warmup():
    from adaptmg_problems import elasticity as el
    from adaptmg_problems import transport_diffusion as td
    t0 = time.perf_counter()
    td.run(8, steps=3, backend="gpu", quiet=True)     # n >= 8: assembly takes the device path
    el.run("edge", 2, steps=2, backend="gpu", quiet=True)
    el.run("face", 2, steps=2, backend="gpu", quiet=True)
    log(f"[warm-up {time.perf_counter() - t0:.1f} s]")


# ------------------------------------------------------------------ parts
def part_check(args):
    from adaptmg_problems import elasticity as el
    from adaptmg_problems import transport_diffusion as td
    a = td.run(6, steps=5, backend="cpu", quiet=True, rtol=1e-12)
    b = td.run(6, steps=5, backend="gpu", quiet=True, rtol=1e-12)
    d1 = float(np.abs(a["u"] - b["u"]).max())
    c = el.run("edge", 2, steps=5, backend="cpu", quiet=True, rtol=1e-12)
    e = el.run("edge", 2, steps=5, backend="gpu", quiet=True, rtol=1e-12)
    d2 = float(np.abs(c["u"] - e["u"]).max() / np.abs(c["u"]).max())
    log(f"check: transport-diffusion n=6, 5 steps: max |u_cpu - u_gpu| = {d1:.2e} "
        f"(L2 cpu {a['l2']:.6e}, gpu {b['l2']:.6e}); iterations cpu {a['iterations']} gpu {b['iterations']}")
    log(f"check: elasticity edge 2, 5 steps: max |u_cpu - u_gpu| / max |u| = {d2:.2e}; "
        f"iterations cpu {c['iterations']} gpu {e['iterations']}")
    RESULTS["check"] = dict(td_maxdiff=d1, el_reldiff=d2)


def td_row(n, t, r, mark=""):
    return dict(n=n, dofs=r["dofs"], **t, iters=max(r["iterations"]),
                it_mean=float(np.mean(r["iterations"])), it_total=int(np.sum(r["iterations"])),
                l2=r.get("l2"), mark=mark)


TD_COLS = [("n", "n"), ("dofs", "DOFs"), ("init", "init"), ("rhs", "rhs"), ("solve", "solve"),
           ("sum", "sum"), ("iters", "it max"), ("it_mean", "it mean", ".2f"), ("l2", "L2 error", ".3e"),
           ("mark", "")]


def part_td(args):
    from adaptmg_problems import transport_diffusion as td
    rows = []
    meshes = ["cpu", "gpu"] if args.td_mesh == "both" else [args.td_mesh]     # device mesh last: td-cpu's peer
    for n, mb in ((n, mb) for n in args.td_n for mb in meshes):
        reps = args.repeat if n == max(args.td_n) else 1
        runs = []
        for k in range(reps):
            if n == max(args.td_n) and k == 0:
                with probe() as acc:
                    r = td.run(n, backend="gpu", quiet=True, mesh_backend=mb)
                RESULTS[f"td_init_probe_{mb}_mesh"] = print_probe(
                    acc, r["timings"]["init"], f"transport-diffusion n={n} GPU, mesh on the {mb}")
            else:
                r = td.run(n, backend="gpu", quiet=True, compute_error=(k == 0), mesh_backend=mb)
            if k == 0:
                l2 = r["l2"]
            runs.append(figures(r, "timings", "iterations", "dofs", "l2"))
            del r
        t = med_timings(runs)
        r = runs[0]
        r["l2"] = l2
        mark = f"mesh on the {mb}" + (f", median of {reps}" if reps > 1 else "")
        rows.append(td_row(n, t, r, mark))
        log(f"  td n={n} gpu ({mb} mesh): {t}  iters {max(r['iterations'])}")
    RESULTS["td_gpu"] = rows
    for n in args.td_n:
        init = {r["mark"].split(",")[0][12:]: r["init"] for r in rows if r["n"] == n}
        if len(init) == 2:
            log(f"  td n={n} init: mesh on the GPU {init['gpu']:.3f} s, on the host {init['cpu']:.3f} s "
                f"({init['cpu'] / init['gpu']:.2f}x; target <= 0.3 s)")
    log(format_table(rows, TD_COLS, title="transport-diffusion, GPU, 100 steps dt=0.02 (seconds)"))


def part_td_cpu(args):
    from adaptmg_problems import transport_diffusion as td
    rows = []
    for n in args.td_cpu_n:
        r = td.run(n, backend="cpu", quiet=True)
        rows.append(td_row(n, r["timings"], r))
        log(f"  td n={n} cpu: {r['timings']}")
    if args.td_cpu_steps10:
        r = td.run(10, backend="cpu", quiet=True, steps=args.td_cpu_steps10, compute_error=False)
        t = scaled(r, 100)
        mark = f"x: {args.td_cpu_steps10} steps scaled to 100"
        g = {row["n"]: row for row in RESULTS.get("td_gpu", [])}.get(10)
        if g is not None:
            t["solve"] = r["timings"]["solve"] * g["it_total"] / max(1, sum(r["iterations"]))
            t["sum"] = t["init"] + t["rhs"] + t["solve"]
            mark = (f"x: {args.td_cpu_steps10} steps; solve scaled by GMRES iterations "
                    f"({sum(r['iterations'])} -> {g['it_total']}), rhs by steps")
        rows.append(td_row(10, t, r, mark))
    RESULTS["td_cpu"] = rows
    log(format_table(rows, TD_COLS, title="transport-diffusion, CPU (seconds)"))
    ratio_table("transport-diffusion", RESULTS.get("td_gpu", []), rows, "n")


def ratio_table(name, grows, crows, key):
    c = {r[key]: r for r in crows}
    out = []
    for g in grows:
        if g[key] in c:
            cc = c[g[key]]
            out.append({key: g[key], "dofs": g["dofs"],
                        **{f"r_{p}": (g[p] / cc[p] if cc[p] else None) for p in PHASES},
                        **{f"s_{p}": (cc[p] / g[p] if g[p] else None) for p in ("solve", "sum")}})
    if out:
        cols = [(key, key), ("dofs", "DOFs")] + [(f"r_{p}", f"GPU/CPU {p}", ".3f") for p in PHASES] + \
               [("s_solve", "speed-up solve", ".1f"), ("s_sum", "speed-up sum", ".1f")]
        log(format_table(out, cols, title=f"{name}: GPU/CPU time ratios"))
    RESULTS.setdefault("ratios", {})[name] = out


EL_COLS = [("level", "level"), ("nodes", "nodes"), ("hanging_pct", "hanging %", ".2f"),
           ("hanging_edge_pct", "edge-hanging %", ".2f"), ("dofs", "DOFs"),
           ("init", "init"), ("rhs", "rhs"), ("solve", "solve"), ("sum", "sum"), ("iters", "it max"),
           ("it_mean", "it mean", ".2f"), ("it_total", "it total"), ("mark", "")]


def el_row(level, t, r, mark=""):
    return dict(level=level, nodes=r["nodes"], hanging_pct=r["hanging_pct"],
                hanging_edge_pct=r.get("hanging_edge_pct"), dofs=r["dofs"], **t,
                iters=max(r["iterations"]), it_mean=float(np.mean(r["iterations"])),
                it_total=int(np.sum(r["iterations"])), mark=mark)


def part_el(case, levels, args):
    from adaptmg_problems import elasticity as el
    rows = []
    top = max(levels)
    for l in levels:
        reps = args.repeat if (l == top and case == "edge") else 1
        runs = []
        for k in range(reps):
            if l == top and k == 0:
                with probe() as acc:
                    r = el.run(case, l, backend="gpu", quiet=True, tol=args.el_tol, rtol=args.el_rtol)
                RESULTS[f"el_{case}_init_probe"] = print_probe(acc, r["timings"]["init"],
                                                               f"elasticity {case} level {l} GPU")
            else:
                r = el.run(case, l, backend="gpu", quiet=True, tol=args.el_tol, rtol=args.el_rtol)
            runs.append(figures(r, "timings", "iterations", "dofs", "nodes", "hanging_pct",
                                "hanging_edge_pct", "levels"))
            del r
        t = med_timings(runs)
        rows.append(el_row(l, t, runs[0], f"median of {reps}" if reps > 1 else ""))
        log(f"  el {case} {l} gpu: {t} iters max {max(runs[0]['iterations'])} "
            f"mean {np.mean(runs[0]['iterations']):.2f} levels {runs[0]['levels']}")
        del runs
    if case == "edge" and args.el_rhs_extra:
        r = el.run(case, top, backend="gpu", quiet=True, tol="rhs", rtol=1e-8)
        rows.append(el_row(top, r["timings"], r, "tol='rhs', rtol=1e-8 (run() default)"))
    RESULTS[f"el_{case}_gpu"] = rows
    log(format_table(rows, EL_COLS, title=f"elasticity, refinement towards a {case}, GPU, 100 steps dt=0.025, "
                                          f"tol={args.el_tol!r} rtol={args.el_rtol:g} (s)"))


def part_el_cpu(args):
    from adaptmg_problems import elasticity as el
    for case, levels in (("edge", args.el_cpu_edge), ("face", args.el_cpu_face), ("vertex", args.el_cpu_vertex)):
        rows = []
        gpu = {g["level"]: g for g in RESULTS.get(f"el_{case}_gpu", []) if not g["mark"].startswith("tol=")}
        for l in levels:
            r = el.run(case, l, backend="cpu", quiet=True, steps=args.el_cpu_steps, tol=args.el_tol,
                       rtol=args.el_rtol)
            t = scaled(r, 100)
            mark = f"x: {args.el_cpu_steps} steps scaled to 100" if args.el_cpu_steps != 100 else ""
            if args.el_cpu_steps != 100 and l in gpu:
                # same algorithm, same iterations: scale solve by the GPU run's 100-step iteration total
                t["solve"] = r["timings"]["solve"] * gpu[l]["it_total"] / max(1, sum(r["iterations"]))
                t["sum"] = t["init"] + t["rhs"] + t["solve"]
                mark = (f"x: {args.el_cpu_steps} steps; solve scaled by GMRES iterations "
                        f"({sum(r['iterations'])} -> {gpu[l]['it_total']}), rhs by steps")
            rows.append(el_row(l, t, r, mark))
            log(f"  el {case} {l} cpu: {r['timings']} ({r['steps']} steps)")
        RESULTS[f"el_{case}_cpu"] = rows
        log(format_table(rows, EL_COLS, title=f"elasticity, refinement towards a {case}, CPU (s)"))
        ratio_table(f"elasticity {case}", list(gpu.values()), rows, "level")


def part_ns(args):
    from adaptmg_problems import navier_stokes as ns
    out = {}
    for be, steps in (("gpu", args.ns_steps), ("cpu", args.ns_cpu_steps)):
        if not steps:
            continue
        for phases in (False, True):
            try:
                r = ns.run(dim=3, steps=steps, backend=be, quiet=True, phases=phases)
            except TypeError:
                r = ns.run(backend=be, quiet=True)
            key = f"{be}_{'phases' if phases else 'plain'}"
            out[key] = dict(per_step=r.get("per_step"), timings=r.get("timings"), steps=r.get("steps"))
            log(f"ns 3-D 32x32x64 {be} {'with' if phases else 'without'} phase sync, {steps} steps: "
                f"{1e3 * r.get('per_step', float('nan')):.3f} ms/step; timings {r.get('timings')}")
    RESULTS["ns"] = out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--parts", default="check,td,td-cpu,el-edge,el-face,el-vertex,el-cpu,ns")
    ap.add_argument("--td-n", type=int, nargs="+", default=[7, 8, 9, 10])
    ap.add_argument("--td-cpu-n", type=int, nargs="+", default=[7, 8, 9])
    ap.add_argument("--td-mesh", default="both", choices=["gpu", "cpu", "both"],
                    help="td: where the GPU runs build their mesh (issue 36: 'gpu', the default of "
                         "transport_diffusion.run; 'both' prints a row for each)")
    ap.add_argument("--td-cpu-steps10", type=int, default=10)
    ap.add_argument("--el-edge", type=int, nargs="+", default=[3, 4, 5, 6])
    ap.add_argument("--el-face", type=int, nargs="+", default=[2, 3, 4, 5])
    ap.add_argument("--el-vertex", type=int, nargs="+", default=[3, 4, 5, 6])
    ap.add_argument("--el-cpu-edge", type=int, nargs="+", default=[3, 4])
    ap.add_argument("--el-cpu-face", type=int, nargs="+", default=[2, 3])
    ap.add_argument("--el-cpu-vertex", type=int, nargs="+", default=[3, 4])
    ap.add_argument("--el-cpu-steps", type=int, default=10)
    ap.add_argument("--ns-steps", type=int, default=200)
    ap.add_argument("--ns-cpu-steps", type=int, default=0)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--el-tol", default="residual", choices=["residual", "rhs"],
                    help="elasticity GMRES stopping test (see adaptmg_problems.elasticity.run)")
    ap.add_argument("--el-rtol", type=float, default=1e-6)
    ap.add_argument("--el-rhs-extra", action="store_true",
                    help="also run the top edge level with tol='rhs', rtol=1e-8 (the default of run())")
    ap.add_argument("--out", default=None, help="write all results as JSON here")
    args = ap.parse_args(argv)
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    os.environ.setdefault("ADAPTMG_QUIET", "1")
    warnings.simplefilter("ignore")
    need_gpu = any(p in ("check", "td", "el-edge", "el-face", "el-vertex", "ns") for p in parts)
    if need_gpu and not gpu_ok():
        log("no GPU: only CPU parts run")
        parts = [p for p in parts if p in ("td-cpu", "el-cpu")]
    t0 = time.perf_counter()
    if need_gpu and parts and any(p != "ns" for p in parts):
        try:
            warmup()
        except Exception:
            import traceback
            log(traceback.format_exc())
    table = {"check": part_check, "td": part_td, "td-cpu": part_td_cpu, "el-cpu": part_el_cpu, "ns": part_ns,
             "el-edge": lambda a: part_el("edge", a.el_edge, a),
             "el-face": lambda a: part_el("face", a.el_face, a),
             "el-vertex": lambda a: part_el("vertex", a.el_vertex, a)}
    for p in parts:
        if p not in table:
            raise SystemExit(f"unknown part {p!r}; choose from {sorted(table)}")
        t1 = time.perf_counter()
        log(f"== {p}")
        try:
            table[p](args)
        except Exception:  # report and go on with the next part
            import traceback
            log(traceback.format_exc())
        log(f"[{p}: {time.perf_counter() - t1:.1f} s, total {time.perf_counter() - t0:.1f} s]")
        if args.out:
            with open(args.out, "w") as fh:
                json.dump(RESULTS, fh, indent=1, default=float)


if __name__ == "__main__":
    main()
