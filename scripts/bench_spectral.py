#!/usr/bin/env python3
"""Benchmark of the spectral-element path (adaptmg.spectral; seeds 004 and 002).

Sections (``--sections``, comma separated; all by default):
  table1  seed 004 Table 1: CG iterations (rtol --rtol) of -Laplace u = f, degree --degree,
          two-scale P = P^c + P^f vs the fine scale P^f alone (and p-multigrid, "pmg"),
          on three meshes refined
          over --sizes N: "cartesian" (the unit cube, N^3 cells), "distorted" (the cube
          moved by a smooth non-affine map, every cell's vertex list rotated at random),
          "ogrid" (an O-grid of a cylinder of radius 1 and height --ogrid-height, default 2:
          cells of aspect ratio <= 1.7; 0.75 N^3 cells, vertex valence 6, built by refinement
          from N/2^L, so its Q1 coarse scale has geometric levels), with the paper's rows
          (N = 8..128) beside; each mesh's SpectralSpace is built once ("space s"), "setup" is
          the two-scale problem's set-up (operator, P^f, P^c), "B/DoF" the bytes it holds on
          the backend a DoF (SpectralProblem.nbytes: factors, P^f, P^c, 6 CG vectors)
  table4  seed 004 Table 4: heat equation, backward Euler, 70 steps (--steps) of
          (M/dt + kappa K) u = M (u_old/dt + q(t)), kappa = 1e-2, dt = 0.04, a moving
          Gaussian source, on the O-grid (--table4-n), degrees --table4-degrees, rows
          --table4-precisions: float64, mixed (float32 PCG inside float64 iterative refinement,
          SpectralProblem.solve(inner_dtype=np.float32)), float32 (plain; it stops at float32's
          attainable accuracy at ~1e7 DoFs); two-scale PCG warm-started from the last step, rtol 1e-6; total wall
          time of the steps next to the paper's CUDA column (GTX 980, float32)
  parts   where a two-scale PCG iteration of table4 goes (not in the default sections):
          for --table4-degrees, float64 and float32, the median ms (--parts-reps) of one
          operator apply, the masked PCG operator, P^f (fused kernel and batched path), P^c
          and its cycle alone, P, one whole PCG iteration, and --parts-steps time steps
  op      operator throughput (GDoF/s = global DoFs / apply time) on the distorted cube
          with about --op-dofs DoFs (at most --op-max-cells N^3 cells) for k in --op-degrees: BK1 (mass, Gauss k+2), BK3 (Helmholtz
          M + K, Gauss k+2), BP3-type stiffness (GLL collocated) with stored geometry
          (on the GPU the fused element kernel and the scatter kernel; "K spmv" the scatter
          matrix's SpMV instead, "K xp" the batched matmuls, fused=False)
          and on-the-fly geometry, float64 and float32 (columns: --op-kinds), beside the Cartesian matrix-free
          patch operator (adaptmg.patch.LaplaceOperator) at about the same DoF count; then, with
          bk1/bk3 among the kinds, seed 002 §4's view: BK1 / BK3 throughput against the degree in
          elemental DoF/s (y_e = A_e x_e, no gather/scatter) and global DoF/s
  adaptive  issue 39 item 5: Q_k (degree --degree) on 2:1 adaptive meshes, the distorted
          cube N^3 (--sizes) with the cells near the corner (0.3, 0.3, 0.3) refined twice
          more (nested balls of radius 0.45 and 0.3: hanging faces of two levels); CG
          iterations (rtol --rtol) of two-scale / fine / p-multigrid, the L2 error of a smooth
          solution and its rate, set-up + solve seconds (not in the default sections)

Times of table1 and adaptive are set-up plus solve (one call of adaptmg.spectral.poisson).
Seed 004's largest meshes (128^3, 57M DoFs at degree 3; H200), one mesh a call, fine-only
(~400 CG iterations) left out:
  python scripts/bench_spectral.py --backend gpu --sections table1 --sizes 128 --meshes cartesian \
    --preconditioners two-scale,pmg       (then --meshes distorted, --meshes ogrid)
BK1/BK3 over the degrees (seed 002 §4 style; warm kernel cache: run `adaptmg warmup` first):
  python scripts/bench_spectral.py --backend gpu --sections op --op-degrees 1,2,3,4,5,6,7,8
Timing: synchronise, one warm-up, median of --reps runs.  Example (H200, ~2 min):
  python scripts/bench_spectral.py --backend gpu
Table 4 and where its iterations go (the paper's mesh size):
  python scripts/bench_spectral.py --backend gpu --sections parts,table4 --table4-n 44 --reps 1
Table 4 at degrees 6 and 7 (13.9M / 22M DoFs), float64 and mixed precision:
  python scripts/bench_spectral.py --backend gpu --sections table4 --table4-n 44 --table4-degrees 6,7 --reps 1
CPU check (small): python scripts/bench_spectral.py --backend cpu --sizes 4,8 \\
  --table4-n 8 --table4-degrees 2,3 --steps 5 --op-dofs 2e4 --op-degrees 2,4
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

import adaptmg
from adaptmg.backend import get_backend
from adaptmg.spectral import SpectralOperator, SpectralProblem, SpectralSpace, poisson
from adaptmg.spectral.meshes import distorted_box, ogrid_cylinder

PAPER_T1 = {  # seed 004 Table 1, degree 3, N = 8, 16, 32, 64, 128
    "cartesian": ((10, 11, 13, 13, 13), (10, 16, 28, 52, 103)),
    "distorted": ((10, 13, 15, 15, 15), (13, 20, 32, 60, 118)),
    "ogrid": ((12, 18, 21, 21, 21), (14, 23, 41, 94, 185)),
}
PAPER_T4_CUDA = {2: 13.4, 3: 14.8, 4: 32.1, 5: 53.6, 6: 90.3, 7: 134.9}


def ints(s):
    return [int(v) for v in s.split(",") if v]


def names(s):
    return [v for v in s.split(",") if v]


def timed(fn, be, reps):
    fn()
    be.synchronize()
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        be.synchronize()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts)


def make_mesh(kind, n, ogrid_height=2.0):
    if kind == "cartesian":
        return adaptmg.Mesh.box([0, 0, 0], [1, 1, 1], [n, n, n])
    if kind == "distorted":
        return distorted_box(3, n, amplitude=0.06, seed=n)
    if kind == "ogrid":
        return ogrid_cylinder(max(4, 4 * round(n / 4)), n, height=ogrid_height)
    raise ValueError(kind)


def rhs(x):
    return 1.0 + x[..., 0] * np.exp(x[..., 1])


T1_MESHES = ("cartesian", "distorted", "ogrid")
T1_PRECONDITIONERS = ("two-scale", "fine", "pmg")


def table1(args, be):
    print(f"\n## Table 1: CG iterations, degree {args.degree}, rtol {args.rtol:g} ({be.name}); space s: the "
          "SpectralSpace (numbering, geometry check), once a mesh; setup: the first preconditioner's problem "
          f"({args.preconditioners[0]}: operator and preconditioner); s: set-up + solve of each; B/DoF: bytes "
          "that problem holds on the backend a DoF (operator factors, preconditioner -- two-scale: P^f and the "
          "P^c hierarchy --, 6 CG vectors); '-': not run (--preconditioners)")
    print(f"{'mesh':10s} {'N':>4s} {'cells':>9s} {'DoFs':>10s} {'two-scale':>9s} {'fine':>6s} {'pmg':>5s} "
          f"{'paper ts/fine':>14s} {'space s':>7s} {'setup':>6s} {'s (ts)':>7s} {'s (fine)':>8s} {'s (pmg)':>7s} "
          f"{'B/DoF':>6s}")
    pcs = args.preconditioners
    for kind in args.meshes:
        for n in args.sizes:
            mesh = make_mesh(kind, n, args.ogrid_height)
            t = time.perf_counter()
            V = SpectralSpace(mesh, args.degree, backend=be)
            tspace = time.perf_counter() - t
            its, secs, setup, nbytes = dict.fromkeys(T1_PRECONDITIONERS, "-"), {}, None, 0
            for pc in pcs:
                t = time.perf_counter()
                s = poisson(V, args.degree, rhs, preconditioner=pc, rtol=args.rtol, backend=be,
                            maxiter=2000)
                be.synchronize()
                secs[pc] = time.perf_counter() - t
                its[pc] = f"{s.iterations}{'' if s.info == 0 else '!'}"
                if setup is None:                          # the first preconditioner's
                    setup, nbytes = s.seconds["setup"], s.nbytes
                s = None                                   # free the device memory
            col = {8: 0, 16: 1, 32: 2, 64: 3, 128: 4}.get(n)
            paper = "" if col is None or args.degree != 3 else \
                f"{PAPER_T1[kind][0][col]}/{PAPER_T1[kind][1][col]}"
            print(f"{kind:10s} {n:4d} {mesh.num_cells:9d} {V.num_dofs:10d} {its['two-scale']:>9s} "
                  f"{its['fine']:>6s} {its['pmg']:>5s} {paper:>14s} {tspace:7.2f} {setup:6.2f} "
                  + " ".join(f"{secs[pc]:{w}.2f}" if pc in secs else f"{'-':>{w}s}"
                             for pc, w in zip(T1_PRECONDITIONERS, (7, 8, 7)))
                  + f" {nbytes / V.num_dofs:6.0f}", flush=True)
            V = None


def adaptive_mesh(n):
    """The distorted cube n^3 with two nested refinements near (0.3, 0.3, 0.3)."""
    m = make_mesh("distorted", n)
    for r in (0.45, 0.3):
        c = m.points[m.cells].mean(1)
        m = m.refine(np.flatnonzero(np.linalg.norm(c - 0.3, axis=1) < r))
    return m


def adaptive(args, be):
    def exact(x):
        return np.sin(np.pi * x[..., 0]) * np.cos(1.3 * x[..., 1]) * np.exp(0.5 * x[..., 2])

    def f(x):
        return (np.pi ** 2 + 1.69 - 0.25) * exact(x)
    print(f"\n## Adaptive 2:1 meshes (hanging nodes), degree {args.degree}, rtol {args.rtol:g} ({be.name})")
    print(f"{'N':>4s} {'cells':>9s} {'hanging':>8s} {'DoFs':>10s} {'two-scale':>9s} {'fine':>6s} {'pmg':>5s} "
          f"{'L2 error':>10s} {'rate':>5s} {'s (ts)':>7s} {'s (pmg)':>7s}")
    last = None
    for n in args.sizes:
        mesh = adaptive_mesh(n)
        its, secs = {}, {}
        for pc in ("two-scale", "fine", "pmg"):
            t = time.perf_counter()
            s = poisson(mesh, args.degree, f, g=exact, preconditioner=pc, rtol=args.rtol, backend=be,
                        maxiter=2000)
            be.synchronize()
            secs[pc] = time.perf_counter() - t
            its[pc] = f"{s.iterations}{'' if s.info == 0 else '!'}"
            if pc == "two-scale":
                err = s.l2_error(exact)
        rate = "" if last is None else f"{np.log2(last / err):5.2f}"
        last = err
        print(f"{n:4d} {mesh.num_cells:9d} {mesh.num_hanging_nodes:8d} {s.num_dofs:10d} {its['two-scale']:>9s} "
              f"{its['fine']:>6s} {its['pmg']:>5s} {err:10.3e} {rate:>5s} {secs['two-scale']:7.2f} "
              f"{secs['pmg']:7.2f}", flush=True)


KAPPA, DT = 1e-2, 0.04          # Table 4's heat equation
STEP_MAXITER = 300              # a step's CG iterations at most (measured: 8-13)


def heat_problem(V, dtype, be, prob=None, Mop=None):
    """The backward-Euler step's two-scale problem (M/dt + kappa K), the mass operator and
    the GLL points on the device; converted from ``prob``, ``Mop`` of another dtype when
    given (the float32 row from the float64 set-up)."""
    if prob is not None:
        prob, Mop = prob.astype(dtype), Mop.astype(dtype)
    else:
        prob = SpectralProblem(V, mass=1.0 / DT, stiffness=KAPPA, dtype=dtype, backend=be)
        Mop = SpectralOperator(V, mass=1.0, stiffness=0.0, dtype=dtype, backend=be)
    return prob, Mop, V.on_backend(be, "points").astype(dtype)


def heat_steps(prob, Mop, X, u, first, last, total, inner_dtype=None, inner_rtol=1e-3):
    """Steps first..last of (M/dt + kappa K) u = M (u_old/dt + q(t)), the Gaussian source
    moving over ``total`` steps; two-scale PCG warm-started, rtol 1e-6, at most STEP_MAXITER
    iterations a step (SciPy's default 10 N would hide a stagnating float32 solve for hours);
    ``inner_dtype``: mixed-precision refinement (SpectralProblem.solve), STEP_MAXITER inner
    iterations.  Returns (u, its, outer); its is "its!f" when f steps stopped at STEP_MAXITER,
    outer the outer steps of all time steps (one a time step without refinement)."""
    xp, dtype = prob.xp, prob.dtype
    its = failed = outer = 0
    for step in range(first, last + 1):
        t = step * DT
        c = xp.asarray([0.5 * np.cos(t), 0.5 * np.sin(t), 2.0 * t / (total * DT)], dtype=dtype)
        q = (1000.0 / (7000.0 * 0.8)) * xp.exp(-((X - c) ** 2).sum(1) / 0.02)
        b = prob.free * Mop.matvec(u / DT + q)
        u, n, info = prob.solve(b, x0=u, rtol=1e-6, maxiter=STEP_MAXITER, inner_dtype=inner_dtype,
                                inner_rtol=inner_rtol)
        its += n
        outer += prob.last_outer_steps
        failed += info != 0
    return u, its if not failed else f"{its}!{failed}", outer


PRECISIONS = {"float64": "fp64", "mixed": "fp32/64", "float32": "fp32"}


def table4_problem(V, prec, be, prob64, Mop64):
    """(problem, mass operator, points, inner dtype) of a Table 4 row: "float64"; "mixed" the
    float64 problem solved with float32 PCG inside (its inner problem made here); "float32"
    that inner problem alone (converted from the float64 set-up, SpectralProblem.inner)."""
    if prec == "float64":
        prob, Mop, inner = prob64, Mop64, None
    elif prec == "mixed":
        prob, Mop, inner = prob64, Mop64, np.float32
        prob64.inner(np.float32)
    else:
        prob, Mop, inner = prob64.inner(np.float32), Mop64.astype(np.float32), None
    return prob, Mop, V.on_backend(be, "points").astype(prob.dtype), inner


def table4(args, be):
    mesh = ogrid_cylinder(args.table4_n, args.table4_n, height=2.0)
    print(f"\n## Table 4: heat equation, {args.steps} backward-Euler steps, O-grid "
          f"{mesh.num_cells} hexes ({be.name}); wall s of the steps (setup apart), after one untimed "
          f"step ('1st s': that step, kernel compilation and graph recording included); setup s: a "
          f"degree's first row the space and the float64 problem, the next ones the float32 problem "
          f"converted from it (SpectralProblem.inner, made once); B/DoF: the problem (fp32/64: both "
          f"precisions, index structures once) and the mass operator on the backend a DoF")
    print("prec: fp64 all float64; fp32/64 mixed-precision iterative refinement "
          "(SpectralProblem.solve(inner_dtype=np.float32)): float32 operator and two-scale "
          f"preconditioner inside (PCG to {args.inner_rtol:g} of each residual), float64 residual, "
          "solution and right-hand side outside, CG its the inner ones, outer the refinement steps; "
          "fp32 all float32 (--table4-precisions float32: stops at float32's attainable accuracy, "
          "'its!f' when f steps hit the cap of 300 iterations)")
    print(f"{'n':>2s} {'DoFs':>10s} {'prec':>7s} {'setup s':>8s} {'1st s':>8s} {'steps s':>8s} {'CG its':>7s} "
          f"{'outer':>5s} {'paper CUDA s':>12s} {'speed-up':>8s} {'max u':>9s} {'B/DoF':>6s}")
    xp = be.xp
    for k in args.table4_degrees:
        t0 = time.perf_counter()
        V = SpectralSpace(mesh, k, backend=be)
        prob64 = Mop64 = None
        for prec in args.table4_precisions:
            if prob64 is None:
                prob64 = SpectralProblem(V, mass=1.0 / DT, stiffness=KAPPA, backend=be)
                Mop64 = SpectralOperator(V, mass=1.0, stiffness=0.0, backend=be)
            prob, Mop, X, inner = table4_problem(V, prec, be, prob64, Mop64)
            u = xp.zeros(V.num_dofs, dtype=prob.dtype)
            be.synchronize()
            setup = time.perf_counter() - t0
            kw = dict(inner_dtype=inner, inner_rtol=args.inner_rtol)
            t0 = time.perf_counter()                 # one untimed step: kernels compiled, graphs made
            heat_steps(prob, Mop, X, u.copy(), 1, 1, args.steps, **kw)
            be.synchronize()
            first = time.perf_counter() - t0
            t0 = time.perf_counter()
            u, its, outer = heat_steps(prob, Mop, X, u, 1, args.steps, args.steps, **kw)
            be.synchronize()
            wall = time.perf_counter() - t0
            ref = PAPER_T4_CUDA.get(k) if args.steps == 70 else None
            nbytes = prob.nbytes() + Mop.nbytes()
            print(f"{k:2d} {V.num_dofs:10d} {PRECISIONS[prec]:>7s} {setup:8.2f} {first:8.2f} {wall:8.2f} "
                  f"{its:>7} {outer:5d} {'' if ref is None else f'{ref:.1f}':>12s} "
                  f"{'' if ref is None else f'{ref / wall:.1f}x':>8s} {float(u.max()):9.3e} "
                  f"{nbytes / V.num_dofs:6.0f}", flush=True)
            u = X = prob = Mop = None
            t0 = time.perf_counter()
        prob64 = Mop64 = V = None                    # free the device memory


def parts(args, be):
    """Where a two-scale PCG iteration of Table 4 goes: median ms of each part."""
    import warnings
    from adaptmg.linalg import ConvergenceWarning
    mesh = ogrid_cylinder(args.table4_n, args.table4_n, height=2.0)
    print(f"\n## Parts of a two-scale PCG iteration, Table 4's problem, O-grid {mesh.num_cells} hexes "
          f"({be.name}); median ms of {args.parts_reps}")
    print("A: the spectral operator's matvec; A masked: the PCG's operator (free-DoF mask around A); "
          "P^f: the fine scale (on the GPU the fused kernel, fdm_kernels.py), P^f xp: its batched-matmul "
          "path (fused=False); P^c: the coarse scale (transfers and one cycle), cycle: the cycle alone; "
          "P: P^f + P^c (on the GPU P^c on a second stream, TwoScale(concurrent=True)), P seq: the same "
          "one part after the other (concurrent=False; P seq - P is the overlap gained); PCG it: one whole iteration (difference of two solves of 5 and 25 "
          f"iterations / 20, median of 3); steps s: {args.parts_steps} time steps (its: their CG iterations), "
          "s/it: steps s over its")
    print(f"{'n':>2s} {'DoFs':>9s} {'Q1 DoFs':>8s} {'prec':>7s} {'A':>7s} {'A masked':>8s} {'P^f':>7s} "
          f"{'P^f xp':>7s} {'P^c':>7s} {'cycle':>7s} {'P':>7s} {'P seq':>7s} {'PCG it':>7s} {'steps s':>8s} {'its':>5s} "
          f"{'s/it ms':>7s}")
    xp = be.xp
    for k in args.table4_degrees:
        V = SpectralSpace(mesh, k, backend=be)
        prob = Mop = None
        for dtype in (np.float64, np.float32):
            prob, Mop, X = heat_problem(V, dtype, be, prob, Mop)
            fine, coarse = prob.M.fine, prob.M.coarse
            r = prob.free * xp.asarray(np.random.default_rng(0).standard_normal(V.num_dofs), dtype=dtype)

            def ms(fn, reps=args.parts_reps):
                return 1e3 * timed(fn, be, reps)
            t = {"A": ms(lambda: prob.op.matvec(r)), "A masked": ms(lambda: prob.matvec(r)),
                 "P^f": ms(lambda: fine(r)), "P^c": ms(lambda: coarse(r)),
                 "cycle": ms(coarse.cycle), "P": ms(lambda: prob.M(r))}
            fused = getattr(fine, "fused", False)
            fine.fused = False
            t["P^f xp"] = ms(lambda: fine(r))
            fine.fused = fused
            conc = prob.M.concurrent
            prob.M.concurrent = False
            t["P seq"] = ms(lambda: prob.M(r))
            prob.M.concurrent = conc
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", ConvergenceWarning)
                short = ms(lambda: prob.solve(r, rtol=1e-30, maxiter=5), 3)
                long_ = ms(lambda: prob.solve(r, rtol=1e-30, maxiter=25), 3)
            t["PCG it"] = (long_ - short) / 20
            u = xp.zeros(V.num_dofs, dtype=dtype)
            u, _, _ = heat_steps(prob, Mop, X, u, 1, 1, args.steps)        # warm-up: compile, first step
            be.synchronize()
            t0 = time.perf_counter()
            u, its, _ = heat_steps(prob, Mop, X, u, 2, args.parts_steps + 1, args.steps)
            be.synchronize()
            wall = time.perf_counter() - t0
            print(f"{k:2d} {V.num_dofs:9d} {coarse.R.shape[0]:8d} {np.dtype(dtype).name:>7s} "
                  + " ".join(f"{t[c]:{max(7, len(c))}.3f}" for c in
                             ("A", "A masked", "P^f", "P^f xp", "P^c", "cycle", "P", "P seq", "PCG it"))
                  + f" {wall:8.3f} {its:>5} {1e3 * wall / max(int(str(its).split('!')[0]), 1):7.3f}", flush=True)
            X = fine = coarse = r = u = None
        prob = Mop = V = None                                     # free the device memory


OP_KINDS = {"bk1": ("BK1", dict(mass=1.0, stiffness=0.0, quadrature="gauss")),
            "bk3": ("BK3", dict(mass=1.0, stiffness=1.0, quadrature="gauss")),
            "stored": ("K stored", dict()),
            "spmv": ("K spmv", dict(scatter="spmv")),
            "xp": ("K xp", dict(fused=False)),
            "otf": ("K on-fly", dict(geometry="on_the_fly"))}


def op_table(args, be):
    from adaptmg.patch import CartesianSpace, LaplaceOperator
    kinds = args.op_kinds
    t_section = time.perf_counter()
    print(f"\n## Operator throughput, distorted cube, about {args.op_dofs:.3g} DoFs ({be.name}), GDoF/s")
    print("K stored: the default GLL stiffness (on the GPU the fused element kernel, "
          "adaptmg/spectral/kernels.py, and the scatter kernel); K spmv: the same with the scatter "
          "matrix's SpMV (scatter='spmv'); K xp: the same with fused=False (batched matmuls); "
          f"K GB/s: of K stored, counting G (6 a node), the gather index, x and y; BW%: of {args.peak_gbs:g} GB/s; "
          "s: wall seconds of the degree's rows (mesh, space, every operator's set-up and timing)")
    print(f"{'k':>2s} {'cells':>8s} {'DoFs':>10s} {'prec':>7s} "
          + " ".join(f"{OP_KINDS[c][0]:>9s}" for c in kinds)
          + f" {'patch K':>8s} {'patch DoFs':>10s} {'K GB/s':>7s} {'BW%':>5s} {'s':>6s}")
    xp = be.xp
    mesh, bk = None, {}                            # bk[(k, dtype, kind)]: (elemental, global) GDoF/s
    for k in args.op_degrees:
        t_degree = time.perf_counter()
        n = max(2, min(args.op_max_cells, round(args.op_dofs ** (1 / 3) / k)))
        if mesh is None or mesh.num_cells != n ** 3:   # k = 1..3 share the capped mesh
            mesh = None
            mesh = distorted_box(3, n, seed=1)
        V = SpectralSpace(mesh, k, backend=be)
        N = V.num_dofs
        lvl = 0                                   # the Cartesian level closest to N DoFs
        while CartesianSpace(3, k, lvl + 1).n_dofs <= N:
            lvl += 1
        if CartesianSpace(3, k, lvl + 1).n_dofs / N < N / CartesianSpace(3, k, lvl).n_dofs:
            lvl += 1
        rows = []
        for dtype in (np.float64, np.float32):
            x = xp.asarray(np.random.default_rng(0).standard_normal(N), dtype=dtype)
            rates, gbs = {}, float("nan")
            for c in kinds:
                op = SpectralOperator(V, dtype=dtype, backend=be, **OP_KINDS[c][1])
                rates[c] = N / timed(lambda: op.matvec(x), be, args.reps) / 1e9
                if c in ("bk1", "bk3"):            # seed 002's BK: y_e = A_e x_e, no gather/scatter
                    uc = x[op.cell_dofs].reshape(op._cshape)
                    bk[k, np.dtype(dtype).name, c] = (uc.size / timed(lambda: op.cell_apply(uc), be, args.reps) / 1e9,
                                                      rates[c], uc.size)
                    del uc
                if c == "stored":
                    # bytes of the stored-geometry stiffness: G (6) a node, x, y, the gather index
                    nbytes = V.cell_dofs.size * (6 * np.dtype(dtype).itemsize + 4) + 2 * N * np.dtype(dtype).itemsize
                    gbs = nbytes / (N / rates[c] / 1e9) / 1e9
                del op
            Vc = CartesianSpace(3, k, lvl)
            pc = LaplaceOperator(Vc, backend=be, dtype=dtype)
            xc = xp.asarray(np.random.default_rng(0).standard_normal(Vc.n_dofs), dtype=dtype)
            prate = Vc.n_dofs / timed(lambda: pc.matvec(xc), be, args.reps) / 1e9
            rows.append(f"{k:2d} {mesh.num_cells:8d} {N:10d} {np.dtype(dtype).name:>7s} "
                        + " ".join(f"{rates[c]:9.3f}" for c in kinds)
                        + f" {prate:8.3f} {Vc.n_dofs:10d} {gbs:7.0f} {100 * gbs / args.peak_gbs:5.1f}")
            del pc, xc, x
        be.synchronize()
        wall = time.perf_counter() - t_degree
        for row in rows:
            print(f"{row} {wall:6.1f}", flush=True)
        V = None
    if bk:
        bk_table(bk, args, be)
    print(f"op section: {time.perf_counter() - t_section:.1f} s", flush=True)


def bk_table(bk, args, be):
    """Seed 002 §4's view of BK1 (mass) and BK3 (Helmholtz M + K), Gauss k+2 points a
    direction, deformed hexahedra: throughput against the polynomial degree, in elemental
    DoF/s (the E-vector y_e = A_e x_e of every element, cell_apply: what seed 002 and CEED's BKs
    count) and, for comparison, global DoF/s of the assembled apply y = sum_e A_e x_e."""
    kinds = [c for c in ("bk1", "bk3") if c in args.op_kinds]
    print(f"\n## BK1 / BK3 throughput vs polynomial degree (seed 002 §4, Figures 5-6 style; hexahedra, "
          f"deformed, {be.name}), 1e9 DoF/s: 'elem' the elemental DoFs (cells (k+1)^3) of y_e = A_e x_e "
          "without gather/scatter, 'glob' the global DoFs of the assembled y = A x")
    cols = [(c, dt) for dt in ("float64", "float32") for c in kinds]
    print(f"{'P':>2s} {'elem DoFs':>10s} " + " ".join(
        f"{OP_KINDS[c][0] + (' fp64' if dt == 'float64' else ' fp32'):>16s}" for c, dt in cols))
    print(f"{'':>2s} {'':>10s} " + " ".join(f"{'elem':>7s} {'glob':>8s}" for _ in cols))
    for k in args.op_degrees:
        got = [bk.get((k, dt, c)) for c, dt in cols]
        size = next(g[2] for g in got if g is not None)
        print(f"{k:2d} {size:10d} " + " ".join(f"{g[0]:7.3f} {g[1]:8.3f}" for g in got), flush=True)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backend", default="auto", choices=("auto", "cpu", "gpu"))
    p.add_argument("--sections", default="table1,table4,op")
    p.add_argument("--sizes", type=ints, default=[8, 16, 32])
    p.add_argument("--meshes", type=names, default=list(T1_MESHES),
                   help=f"table1's meshes, from {','.join(T1_MESHES)} (one a device call at 128^3)")
    p.add_argument("--preconditioners", type=names, default=list(T1_PRECONDITIONERS),
                   help=f"table1's columns, from {','.join(T1_PRECONDITIONERS)} (fine alone needs ~400 "
                        "CG iterations at 128^3)")
    p.add_argument("--degree", type=int, default=3)
    p.add_argument("--rtol", type=float, default=1e-8)
    p.add_argument("--ogrid-height", type=float, default=2.0,
                   help="table1's O-grid cylinder height (radius 1; 2.0: cell aspect ratios <= 1.7, 1.0: <= 3.1)")
    p.add_argument("--table4-n", type=int, default=32, help="O-grid size (44: ~64k hexes, the paper's DoF counts)")
    p.add_argument("--table4-degrees", type=ints, default=[2, 3, 4, 5, 6, 7])
    p.add_argument("--table4-precisions", type=names,
                   default=["float64", "mixed"],
                   help="rows of table4 a degree, from float64,mixed,float32 (mixed: float32 PCG "
                        "inside float64 iterative refinement; float32: plain float32 PCG)")
    p.add_argument("--inner-rtol", type=float, default=1e-3,
                   help="table4's mixed rows: the inner float32 PCG's tolerance relative to each residual")
    p.add_argument("--steps", type=int, default=70)
    p.add_argument("--parts-steps", type=int, default=5, help="time steps the parts section times")
    p.add_argument("--parts-reps", type=int, default=20, help="repetitions (median) of each part")
    p.add_argument("--op-dofs", type=float, default=8e6)
    p.add_argument("--op-max-cells", type=int, default=64, help="at most N^3 cells (host set-up time)")
    p.add_argument("--op-degrees", type=ints, default=[1, 2, 3, 4, 5, 6, 7, 8])
    p.add_argument("--op-kinds", type=names,
                   default=list(OP_KINDS), help=f"columns of the op table, from {','.join(OP_KINDS)}")
    p.add_argument("--peak-gbs", type=float, default=4800.0, help="memory bandwidth for BW%% (H200: 4.8 TB/s)")
    p.add_argument("--reps", type=int, default=5)
    args = p.parse_args(argv)
    be = get_backend(args.backend)
    sections = [s for s in args.sections.split(",") if s]
    for opt, known in (("meshes", T1_MESHES), ("preconditioners", T1_PRECONDITIONERS)):
        if set(getattr(args, opt)) - set(known) or not getattr(args, opt):
            p.error(f"--{opt}: choose from {','.join(known)}, got {getattr(args, opt)}")
    if set(args.table4_precisions) - set(PRECISIONS) or not args.table4_precisions:
        p.error(f"--table4-precisions: choose from {','.join(PRECISIONS)}, got {args.table4_precisions}")
    if set(args.op_kinds) - set(OP_KINDS) or not args.op_kinds:
        p.error(f"--op-kinds: choose from {','.join(OP_KINDS)}, got {args.op_kinds}")
    run = {"table1": table1, "table4": table4, "parts": parts, "op": op_table, "adaptive": adaptive}
    bad = set(sections) - set(run)
    if bad:
        p.error(f"unknown sections {sorted(bad)}; choose from {', '.join(run)}")
    for s in sections:
        run[s](args, be)


if __name__ == "__main__":
    main()
