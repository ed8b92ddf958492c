#!/usr/bin/env python3
"""Benchmark of the matrix-free Cartesian Q_k path (adaptmg.patch) on the GPU.

Sections (``--sections``, comma separated):
  op      throughput (DoF/s) of the matrix-free operator, fp64 and fp32, k = 1..8,
          2D and 3D, at the largest level under --max-dofs-2d / --max-dofs-3d
  smooth  throughput of one smoothing step (all 2^d colours), fp64 and fp32, and the
          kernel's FLOP rate against the assumed peaks
  solve   3D Poisson, u = prod sin(pi x_i), to ||r|| <= 1e-9 ||b||: full multigrid
          in double and in mixed precision (float32 V-cycles, float64 residuals),
          and GMRES + V-cycle in double and mixed
  tune    3D smoother forms and register caps (column, pencil 1/2/3, Boundary 1..4 x unroll)
  large   the largest problem: mixed-precision memory-lean FMG at ~1.07e9 DoFs
  table7  seed 000's Table 7: GMRES (float64, restart --table7-restart) preconditioned
          by one V(1,1) in double vs in single precision, 3D, u = prod sin(pi x_i),
          rtol 1e-9, at the paper's sizes (--table7 k:level,..., default 1:9,3:8,7:7 =
          134M / 452M / 718M DoFs; the last two need an H200's memory): L2 error,
          iterations, time, speedup, next to the paper's row
  breakdown  where a Table 7 GMRES iteration goes (--breakdown k:level,...): A x, one
          V(1,1) and one finest smoothing step in double and in mixed, the GMRES time
          per iteration
  rounding  what float32 does to one V(1,1) (--rounding k:level,..., --rounding-forms):
          ||v - A z|| for v = b / ||b|| (the sine problem) and z the double cycle's output,
          that output rounded to float32, and the float32 cycle's output; the extra
          residual sqrt(||r||^2 - ||r_double||^2) that rounding adds (it grows with the
          condition number of A, ~4.5x a level at k = 7).  --backend cpu runs it too
  tables  seed 000's Tables 1-3: FMG steps (Algorithm 2.2, at least one V-cycle) to
          1e-9 for the tables' right-hand side (vector of ones), per level and degree,
          next to the paper's rows; --table-dims, --table-levels-2d/-3d, --table-ks-2d/-3d,
          --table-variants (paper, seed-code), --table-smoothers (patch, point_gs),
          --table-max-dofs; "n!" = not converged in 60 cycles, "n~" = stagnated at
          the rounding floor above 1e-9; --backend cpu runs it without a GPU.  E.g.
            python scripts/bench_patch.py --sections tables --backend cpu \
                --table-levels-2d 4,5,6 --table-levels-3d 3,4

Timing: CUDA events around the region, one warm-up, median of --reps runs.
Peaks assumed (H100 SXM5, 132 SMs, 1.98 GHz boost): FP64 on CUDA cores 33.5 TFLOP/s
(64 FP64 FMA/clk/SM), FP32 66.9 TFLOP/s; the 67 TFLOP/s FP64 figure is the tensor-
core rate, which these kernels do not use.  FLOPs are counted analytically from the
kernels' contractions (an FMA counts 2).

  python scripts/bench_patch.py --build-cubins .patch_cubin     # here, with nvcc
  ADAPTMG_PATCH_CUBIN=.patch_cubin python scripts/bench_patch.py --out $OUT
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

PEAK = {"float64": 33.5e12, "float32": 66.9e12}


def smoother_flops(dim, k, npatch):
    NP, NI = 2 * k + 1, 2 * k - 1
    if dim == 3:
        f = 4 * NI * NP ** 3 + 6 * NI ** 2 * NP ** 2 + 4 * NI ** 3 * NP + 12 * NI ** 4
    else:
        f = 4 * NI * NP ** 2 + 4 * NI ** 2 * NP + 8 * NI ** 3
    return f * npatch


def q1_nominal_bytes(kind, dim, N, itemsize):
    """k = 1 runs the memory-bound stencil kernels (adaptmg.patch.stencil); their nominal
    DRAM traffic: the operator reads x and writes y once; a smoothing step reads x once
    per launch (two colours a launch: 2^(d-1) launches) and reads b / writes x once."""
    return (2 if kind == "op" else 2 ** (dim - 1) + 2) * N * itemsize


def operator_flops(dim, k, ncell):
    K1 = k + 1
    return (14 * K1 ** 4 if dim == 3 else 8 * K1 ** 3) * ncell


def pick_level(dim, k, max_dofs, base=1):
    from adaptmg.patch import CartesianSpace
    lvl = 1
    while CartesianSpace(dim, k, lvl + 1).n_dofs <= max_dofs:
        lvl += 1
    return lvl


def timeit(cp, fn, reps):
    fn()
    cp.cuda.Device().synchronize()
    ts = []
    for _ in range(reps):
        a, b = cp.cuda.Event(), cp.cuda.Event()
        a.record()
        fn()
        b.record()
        b.synchronize()
        ts.append(cp.cuda.get_elapsed_time(a, b) * 1e-3)
    return float(np.median(ts)), float(np.min(ts)), float(np.max(ts))


def bench_kernels(args, be, rows):
    cp = be.xp
    from adaptmg.patch import CartesianSpace, LaplaceOperator, PatchSmoother
    for dim in _ints(args.kernel_dims):
        for k in _ints(args.kernel_ks):
            maxd = args.max_dofs_2d if dim == 2 else args.max_dofs_3d
            lvl = pick_level(dim, k, maxd)
            V = CartesianSpace(dim, k, lvl)
            N = V.n_dofs
            ncell = int(np.prod(V.cells))
            npatch = int(np.prod([n - 1 for n in V.cells]))
            for dt in (np.float64, np.float32):
                rng = cp.random.default_rng(k)
                u = rng.standard_normal(N, dtype=np.float64).astype(dt)
                if "op" in args.sections:
                    A = LaplaceOperator(V, be, dt)
                    out = cp.empty_like(u)
                    t, tmin, tmax = timeit(cp, lambda: A.matvec(u, out=out), args.reps)
                    fl = operator_flops(dim, k, ncell)
                    rows.append(dict(kind="op", dim=dim, k=k, level=lvl, dofs=N, dtype=np.dtype(dt).name,
                                     time=t, tmin=tmin, tmax=tmax, gdofs=N / t / 1e9,
                                     tflops=fl / t / 1e12, peak_frac=fl / t / PEAK[np.dtype(dt).name]))
                    if k == 1:
                        rows[-1]["gbs"] = q1_nominal_bytes("op", dim, N, np.dtype(dt).itemsize) / t / 1e9
                    print(fmt(rows[-1]), flush=True)
                    del A, out
                if "smooth" in args.sections:
                    S = PatchSmoother(V, be, dt)
                    b = rng.standard_normal(N, dtype=np.float64).astype(dt)
                    x = u.copy()
                    t, tmin, tmax = timeit(cp, lambda: S.smooth(x, b, 1), args.reps)
                    fl = smoother_flops(dim, k, npatch)
                    assert bool(cp.isfinite(x).all())
                    rows.append(dict(kind="smooth", dim=dim, k=k, level=lvl, dofs=N,
                                     dtype=np.dtype(dt).name, time=t, tmin=tmin, tmax=tmax,
                                     gdofs=N / t / 1e9, tflops=fl / t / 1e12,
                                     peak_frac=fl / t / PEAK[np.dtype(dt).name]))
                    if k == 1:
                        rows[-1]["gbs"] = q1_nominal_bytes("smooth", dim, N, np.dtype(dt).itemsize) / t / 1e9
                    print(fmt(rows[-1]), flush=True)
                    del S, b, x
                del u
                cp.get_default_memory_pool().free_all_blocks()


def bench_tune(args, be, rows):
    """3D smoother forms and register caps (minimum blocks per SM): the column
    form with its tuned cap, the pencil form with caps 1, 2, 3 and the Boundary
    form with caps 1..4 and residual-stage unroll full / 1 / 2 (--tune-forms
    picks the forms), for the degrees of --kernel-ks; each result is compared
    with the first one's.  The nominal flops (``smoother_flops``, the pencil
    form's count) give every form's TFLOP/s, so the Boundary form, which does
    fewer, reads as the rate the pencil form would need for the same time."""
    cp = be.xp
    from adaptmg.patch import CartesianSpace, PatchSmoother
    from adaptmg.patch.kernels import GpuPatchSmoother
    for k in _ints(args.kernel_ks):
        V = CartesianSpace(3, k, pick_level(3, k, args.max_dofs_3d))
        N = V.n_dofs
        npatch = int(np.prod([n - 1 for n in V.cells]))
        for dt in (np.float64, np.float32):
            rng = cp.random.default_rng(k)
            b = rng.standard_normal(N, dtype=np.float64).astype(dt)
            x0 = rng.standard_normal(N, dtype=np.float64).astype(dt)
            S = PatchSmoother(V, be, dt)
            ref = None
            forms = args.tune_forms.split(",")
            cands = ([("column", None, None)] if "column" in forms else []) \
                + ([("pencil", m, None) for m in (1, 2, 3)] if "pencil" in forms else []) \
                + ([("boundary", m, u) for u in ("", "1", "2") for m in (1, 2, 3, 4)]
                   if "boundary" in forms else [])
            for variant, minb, unroll in cands:
                S._gpu = GpuPatchSmoother(V, dt, minb, variant=variant, unroll=unroll)
                x = x0.copy()
                S.smooth(x, b, 1)
                err = 0.0 if ref is None else float(cp.linalg.norm(x - ref) / cp.linalg.norm(ref))
                ref = x if ref is None else ref
                x = x0.copy()
                t, tmin, tmax = timeit(cp, lambda: S.smooth(x, b, 1), args.reps)
                fl = smoother_flops(3, k, npatch)
                rows.append(dict(kind="smooth", dim=3, k=k, level=V.level, dofs=N,
                                 dtype=np.dtype(dt).name + f"/{variant}/mb{minb or 'default'}"
                                 + (f"/u{unroll or 'full'}" if variant == "boundary" else ""),
                                 time=t, tmin=tmin, tmax=tmax, gdofs=N / t / 1e9,
                                 tflops=fl / t / 1e12, peak_frac=fl / t / PEAK[np.dtype(dt).name],
                                 diff=err))
                print(fmt(rows[-1]), f"diff vs first {err:.1e}", flush=True)
            del S, b, x, x0, ref
            cp.get_default_memory_pool().free_all_blocks()


def bench_solve(args, be, rows, ks, max_dofs, large=False):
    cp = be.xp
    from adaptmg.patch import CartesianSpace, PatchMultigrid
    for k in ks:
        lvl = pick_level(3, k, max_dofs)
        V = CartesianSpace(3, k, lvl)
        mg = PatchMultigrid(V, be)
        b, _ = V.sine_problem(backend=be)
        fmg = [("fmg", p, c) for p in (("mixed", "double") if large else ("double", "mixed"))
               for c in args.fmg_min_cycles]
        combos = fmg if large else fmg + [("gmres", "double", 1), ("gmres", "mixed", 1)]
        # warm-up on a small level: the kernels compile (NVRTC) on their first launch, which
        # must not count in the timed solve -- also at the large size
        Vs = CartesianSpace(3, k, max(2, min(lvl - 2, 3)))
        ms = PatchMultigrid(Vs, be)
        bs, _ = Vs.sine_problem(backend=be)
        for m, p, _ in combos:
            ms.solve(bs, rtol=1e-9, method=m, precision=p)
        del ms, bs
        for method, prec, mc in combos:
            cp.get_default_memory_pool().free_all_blocks()
            kw = dict(min_cycles=mc) if method == "fmg" else {}
            try:
                if not large:
                    # one untimed solve first: CuPy's pool then holds the solve's memory, as
                    # in a user's second solve.  Timed straight after free_all_blocks, the
                    # device allocations (GMRES: 2 (restart + 1) vectors, 10-35 GB here)
                    # took 0.1-0.3 s of a 0.1-0.4 s solve.
                    mg.solve(b, rtol=1e-9, method=method, precision=prec, maxiter=30, **kw)
                # the median of --solve-reps timed solves (one at the large size): one FMG
                # solve at k = 4, 133M DoFs, read 0.085 / 0.097 / 0.115 s in three runs
                times = []
                for _ in range(1 if large else args.solve_reps):
                    x, info = mg.solve(b, rtol=1e-9, method=method, precision=prec, maxiter=30, **kw)
                    times.append(info["time"])
                info["time"] = float(np.median(times))
            except cp.cuda.memory.OutOfMemoryError as exc:
                print(f"solve 3D k={k} N={V.n_dofs:.3e} {method} {prec}: out of memory ({exc})")
                mg._cycles.clear()         # drop the preallocated cycle vectors
                cp.get_default_memory_pool().free_all_blocks()
                continue
            peak = cp.get_default_memory_pool().total_bytes()
            row = dict(kind="solve", dim=3, k=k, level=lvl, dofs=V.n_dofs, method=method,
                       precision=prec, iterations=info["iterations"], converged=info["converged"],
                       time=info["time"], gdofs=V.n_dofs / info["time"] / 1e9,
                       final_res=info["residuals"][-1], pool_gb=peak / 1e9)
            if method == "fmg":
                row["min_cycles"] = mc
            if V.n_dofs <= args.l2_max:
                row["l2_error"] = V.l2_error_sine(x)
            rows.append(row)
            print(fmt(row), flush=True)
            del x
        del mg, b
        cp.get_default_memory_pool().free_all_blocks()


def bench_breakdown(args, be, rows):
    """Where a GMRES iteration of Table 7 goes: A x, one V(1,1) preconditioner application
    and one finest-level smoothing step in double and in mixed precision, and the GMRES
    solve (restart --table7-restart) per iteration; CUDA events, median of --reps."""
    cp = be.xp
    from adaptmg.patch import CartesianSpace, PatchMultigrid

    def t_ms(f):
        f()
        t, _, _ = timeit(cp, f, args.reps)
        return t * 1e3
    for spec in args.breakdown.split(","):
        k, level = (int(t) for t in spec.split(":"))
        V = CartesianSpace(3, k, level)
        mg = PatchMultigrid(V, be)
        b, _ = V.sine_problem(backend=be)
        A = mg.A[-1]
        x = cp.random.default_rng(k).standard_normal(V.n_dofs)
        y = cp.empty_like(x)
        row = dict(kind="breakdown", k=k, level=level, dofs=V.n_dofs,
                   Ax_ms=t_ms(lambda: A.matvec(x, out=y)))
        for prec, dt in (("double", np.float64), ("mixed", np.float32)):
            cyc = mg._cycles_for(dt)
            M = cyc.preconditioner()
            xs, bs = x.astype(dt), b.astype(dt)
            row[f"V_{prec}_ms"] = t_ms(lambda: M.matvec(x))
            row[f"S_{prec}_ms"] = t_ms(lambda: cyc.levels[-1].smoother.smooth(xs, bs, 1))
            del xs, bs
            cp.get_default_memory_pool().free_all_blocks()
            for _ in range(2):          # the second solve is timed (first: allocations)
                xx, info = mg.solve(b, rtol=1e-9, method="gmres", precision=prec, maxiter=30,
                                    restart=args.table7_restart)
                del xx
            row[f"its_{prec}"] = info["iterations"]
            row[f"it_{prec}_ms"] = info["time"] * 1e3 / max(info["iterations"], 1)
        rows.append(row)
        print(f"breakdown k={k} L={level} N={V.n_dofs:.3e} | A x {row['Ax_ms']:.2f} ms | V double / mixed "
              f"{row['V_double_ms']:.2f} / {row['V_mixed_ms']:.2f} ms | S {row['S_double_ms']:.2f} / "
              f"{row['S_mixed_ms']:.2f} ms | GMRES iteration {row['it_double_ms']:.1f} / "
              f"{row['it_mixed_ms']:.1f} ms ({row['its_double']} / {row['its_mixed']} its)", flush=True)
        del mg, b, x, y
        cp.get_default_memory_pool().free_all_blocks()


# seed 000: Table 1 (2D; L = 4, Q1 reaches 7 at L = 11), Table 2 (3D, L = 4..7), Table 3 (3D)
PAPER_TABLES = {("patch", 2): [9, 5, 3, 3, 3, 2, 2, 2, 2, 2],
                ("patch", 3): [6, 5, 3, 3, 3, 3, 2, 2],
                ("point_gs", 3): [6, 8, 11, 13, 19, 20, 27, 30]}


def _ints(text):
    return [int(t) for t in str(text).split(",") if t.strip()]


def bench_tables(args, be, rows):
    """Seed 000 Tables 1-3: one row of FMG step counts per level (columns: k)."""
    from adaptmg.patch import CartesianSpace
    from adaptmg.patch.solver import seed_table_iterations
    sync = be.synchronize
    for dim in _ints(args.table_dims):
        levels = _ints(args.table_levels_2d if dim == 2 else args.table_levels_3d)
        ks = _ints(args.table_ks_2d if dim == 2 else args.table_ks_3d)
        for smoother in args.table_smoothers.split(","):
            for variant in args.table_variants.split(","):
                head = f"{dim}D {smoother:8s} {variant:9s}"
                print(f"{head} L\\k " + " ".join(f"{k:3d}" for k in ks), flush=True)
                paper = PAPER_TABLES.get((smoother, dim))
                if paper:
                    print(f"{head} pap " + " ".join(f"{paper[k - 1]:3d}" if k <= len(paper)
                                                    else "  -" for k in ks), flush=True)
                for level in levels:
                    cells = []
                    for k in ks:
                        try:
                            n = CartesianSpace(dim, k, level).n_dofs
                        except ValueError:
                            cells.append("  -")
                            continue
                        if n > args.table_max_dofs or (smoother == "point_gs"
                                                       and n * (2 * k + 1) ** dim > 4e8):
                            cells.append("  .")
                            continue
                        sync()
                        t0 = time.perf_counter()
                        try:
                            it, info = seed_table_iterations(dim, k, level, backend=be,
                                                             variant=variant, smoother=smoother)
                        except MemoryError as exc:          # cupy's OutOfMemoryError too
                            print(f"  {dim}D k={k} L={level}: out of memory ({exc})", flush=True)
                            cells.append("  M")
                            if be.is_gpu:
                                be.xp.get_default_memory_pool().free_all_blocks()
                            continue
                        sync()
                        if be.is_gpu:
                            be.xp.get_default_memory_pool().free_all_blocks()
                        rows.append(dict(kind="table", dim=dim, k=k, level=level, dofs=n,
                                         smoother=smoother, variant=variant, iterations=it,
                                         converged=info["converged"],
                                         final_res=info["residuals"][-1],
                                         time=time.perf_counter() - t0,
                                         paper=paper[k - 1] if paper and k <= len(paper) else None))
                        cells.append(f"{it:3d}" if info["converged"] else
                                     f"{it:2d}~" if info.get("stagnated") else f"{it:2d}!")
                    print(f"{head} {level:3d} " + " ".join(cells), flush=True)


# seed 000 Table 7 (A100): k -> (DoFs, L2 error, iterations, double s, mixed s, speedup)
PAPER_TABLE7 = {1: ("135M", 1.12e-06, 5, 3.391, 2.385, 1.42), 3: ("454M", 2.30e-13, 3, 3.941, 2.418, 1.59),
                7: ("721M", 2.89e-16, 2, 5.891, 3.326, 1.77)}


def bench_table7(args, be, rows):
    """Seed 000 Table 7: GMRES + one V(1,1) cycle in double vs single precision (3D)."""
    cp = be.xp
    from adaptmg.patch import CartesianSpace, PatchMultigrid
    for spec in args.table7.split(","):
        k, level = (int(t) for t in spec.split(":"))
        V = CartesianSpace(3, k, level)
        Vs = CartesianSpace(3, k, max(2, min(level - 2, 3)))   # warm-up: kernels compile on first use
        ms = PatchMultigrid(Vs, be)
        bs, _ = Vs.sine_problem(backend=be)
        for p in ("double", "mixed"):
            ms.solve(bs, rtol=1e-9, method="gmres", precision=p, restart=args.table7_restart)
        del ms, bs
        mg = PatchMultigrid(V, be)
        b, _ = V.sine_problem(backend=be)
        res = {}
        for prec in ("double", "mixed"):
            cp.get_default_memory_pool().free_all_blocks()
            try:
                for _ in range(2):           # the first solve fills CuPy's pool (see bench_solve)
                    x, info = mg.solve(b, rtol=1e-9, method="gmres", precision=prec, maxiter=30,
                                       restart=args.table7_restart)
            except cp.cuda.memory.OutOfMemoryError as exc:
                print(f"table7 k={k} N={V.n_dofs:.3e} {prec}: out of memory ({exc})", flush=True)
                mg._cycles.clear()
                continue
            peak = cp.get_default_memory_pool().total_bytes()
            row = dict(kind="solve", dim=3, k=k, level=level, dofs=V.n_dofs, method="gmres",
                       precision=prec, iterations=info["iterations"], converged=info["converged"],
                       time=info["time"], gdofs=V.n_dofs / info["time"] / 1e9,
                       final_res=info["residuals"][-1], pool_gb=peak / 1e9, table7=True)
            row["l2_error"] = V.l2_error_sine(x)     # on the device, in slabs (after the timing)
            del x
            res[prec] = row
            rows.append(row)
            print(fmt(row), flush=True)
        pap = PAPER_TABLE7.get(k)
        if len(res) == 2:
            d, m = res["double"], res["mixed"]
            print(f"table7 k={k} N={V.n_dofs/1e6:.0f}M | double L2 {d['l2_error']:.2e} it {d['iterations']} "
                  f"{d['time']:.3f} s | mixed L2 {m['l2_error']:.2e} it {m['iterations']} {m['time']:.3f} s "
                  f"| speedup {d['time'] / m['time']:.2f}"
                  + (f" || paper {pap[0]}: L2 {pap[1]:.2e} it {pap[2]} {pap[3]} / {pap[4]} s, {pap[5]}"
                     if pap else ""), flush=True)
        del mg, b
        cp.get_default_memory_pool().free_all_blocks()


def bench_rounding(args, be, rows):
    """Residual of one V(1,1) applied to v = b / ||b|| in double, the double output
    rounded to float32, and in float32 (see the module docstring)."""
    from adaptmg.patch import CartesianSpace, PatchMultigrid
    import adaptmg.patch.kernels as patch_kernels
    xp = be.xp
    default = patch_kernels.SMOOTH3D_VARIANT
    for spec in args.rounding.split(","):
        k, level = (int(t) for t in spec.split(":"))
        V = CartesianSpace(3, k, level)
        for form in (args.rounding_forms.split(",") if be.is_gpu else ["numpy"]):
            if be.is_gpu:
                patch_kernels.SMOOTH3D_VARIANT = form
            mg = PatchMultigrid(V, be)
            b, _ = V.sine_problem(backend=be)
            A = mg.A[-1]
            v = b / xp.linalg.norm(b)
            del b

            def res(z):
                return float(xp.linalg.norm(v - A.matvec(z)))
            z = mg._cycles_for(np.float64).preconditioner().matvec(v).copy()
            r64 = res(z)
            r64_32 = res(z.astype(np.float32).astype(np.float64))
            del z
            r32 = res(mg._cycles_for(np.float32).preconditioner().matvec(v))
            extra = lambda r: float(np.sqrt(max(r * r - r64 * r64, 0.0)))
            rows.append(dict(kind="rounding", k=k, level=level, dofs=V.n_dofs, form=form,
                             r_double=r64, r_rounded=r64_32, r_float32=r32,
                             extra_rounded=extra(r64_32), extra_float32=extra(r32)))
            print(fmt(rows[-1]), flush=True)
            del mg, v, A
            if be.is_gpu:
                xp.get_default_memory_pool().free_all_blocks()
    patch_kernels.SMOOTH3D_VARIANT = default


def fmt(r):
    if r["kind"] == "rounding":
        return (f"rounding 3D k={r['k']} L={r['level']} N={r['dofs']:.3e} {r['form']}: ||v - A z|| "
                f"double {r['r_double']:.4e}, double rounded to float32 {r['r_rounded']:.4e} (extra "
                f"{r['extra_rounded']:.2e}), float32 cycle {r['r_float32']:.4e} (extra "
                f"{r['extra_float32']:.2e})")
    if r["kind"] == "table":
        return (f"table  {r['dim']}D k={r['k']} L={r['level']} N={r['dofs']:.3e} {r['smoother']} "
                f"{r['variant']}: {r['iterations']} steps (paper {r['paper']}) "
                f"res={r['final_res']:.1e} {r['time']:.2f} s")
    if r["kind"] == "breakdown":
        return (f"breakdown k={r['k']} L={r['level']}: A x {r['Ax_ms']:.2f} ms, V {r['V_double_ms']:.2f} / "
                f"{r['V_mixed_ms']:.2f} ms, S {r['S_double_ms']:.2f} / {r['S_mixed_ms']:.2f} ms, GMRES "
                f"iteration {r['it_double_ms']:.1f} / {r['it_mixed_ms']:.1f} ms (double / mixed)")
    if r["kind"] in ("op", "smooth"):
        if "gbs" in r:        # k = 1: the stencil kernels are memory-bound
            tail = f"{r['gbs']:7.0f} GB/s nominal (stencil kernel)"
        else:
            tail = f"{r['tflops']:6.2f} TFLOP/s ({100*r['peak_frac']:5.1f}% of peak)"
        return (f"{r['kind']:6s} {r['dim']}D k={r['k']} L={r['level']:2d} N={r['dofs']:.3e} "
                f"{r['dtype']:12s} {r['time']*1e3:9.3f} ms  {r['gdofs']:7.3f} GDoF/s  " + tail)
    s = (f"solve  3D k={r['k']} L={r['level']} N={r['dofs']:.3e} {r['method']:5s} {r['precision']:6s} "
         f"it={r['iterations']:2d} conv={r['converged']} {r['time']:8.3f} s {r['gdofs']:6.3f} GDoF/s "
         f"res={r['final_res']:.1e} pool={r['pool_gb']:.1f}GB")
    if r.get("min_cycles", 1) != 1:
        s += f" min_cycles={r['min_cycles']}"
    if "l2_error" in r:
        s += f" L2={r['l2_error']:.3e}"
    return s


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sections", default="op,smooth,solve,large")
    ap.add_argument("--max-dofs-2d", type=float, default=1.6e8)
    ap.add_argument("--max-dofs-3d", type=float, default=3.0e8)
    ap.add_argument("--solve-max-dofs", type=float, default=2.0e8)
    ap.add_argument("--solve-ks", default="1,2,3,4,5,6,7,8")
    ap.add_argument("--solve-reps", type=int, default=5,
                    help="solve section: timed solves per case (the median is reported)")
    ap.add_argument("--fmg-min-cycles", type=_ints, default=[1],
                    help="solve/large sections: FMG's min_cycles values to run (1: Algorithm "
                         "2.2, at least one V-cycle after the FMG start; 0: stop right after "
                         "the start when it already meets rtol), e.g. 1,0")
    ap.add_argument("--large-k", type=int, default=4)
    ap.add_argument("--large-dofs", type=float, default=1.1e9)
    ap.add_argument("--l2-max", type=float, default=3e9,
                    help="L2 error (on the device, in slabs) up to this many DoFs")
    ap.add_argument("--kernel-dims", default="2,3", help="op/smooth sections: dimensions")
    ap.add_argument("--kernel-ks", default="1,2,3,4,5,6,7,8", help="op/smooth sections: degrees")
    ap.add_argument("--table7", default="1:9,3:8,7:7", help="table7 section: k:level,...")
    ap.add_argument("--table7-restart", type=int, default=4)
    ap.add_argument("--breakdown", default="1:9,4:7,7:6",
                    help="breakdown section: k:level,... (the H100 fits these)")
    ap.add_argument("--rounding", default="7:5,7:6",
                    help="rounding section: k:level,... (7:7 needs an H200's memory)")
    ap.add_argument("--rounding-forms", default="tuned,pencil",
                    help="rounding section: 3D smoother forms of the float32 cycle (GPU)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--smooth-form", choices=("column", "pencil", "boundary", "tuned"), default=None,
                    help="form of the 3D smoothing kernel (default: adaptmg's, tuned)")
    ap.add_argument("--tune-forms", default="column,pencil,boundary",
                    help="tune section: the 3D smoother forms to try")
    ap.add_argument("--out", default=None)
    ap.add_argument("--build-cubins", metavar="DIR", default=None,
                    help="compile all kernels with nvcc into DIR and exit")
    ap.add_argument("--backend", default="gpu", choices=("gpu", "cpu"),
                    help="cpu: only the tables and rounding sections (no device needed)")
    ap.add_argument("--table-dims", default="2,3")
    ap.add_argument("--table-levels-2d", default="4,5,6,7,8")
    ap.add_argument("--table-levels-3d", default="3,4,5,6")
    ap.add_argument("--table-ks-2d", default="1,2,3,4,5,6,7,8")
    ap.add_argument("--table-ks-3d", default="1,2,3,4,5,6,7,8")
    ap.add_argument("--table-variants", default="paper,seed-code")
    ap.add_argument("--table-smoothers", default="patch")
    ap.add_argument("--table-max-dofs", type=float, default=3e8)
    args = ap.parse_args()
    if args.build_cubins:
        from adaptmg.patch.kernels import build_cubins
        rc = build_cubins(args.build_cubins)
        print("built", len(rc), "cubins, failures:", sum(1 for r in rc if r))
        return
    from adaptmg.backend import get_backend
    if args.smooth_form:
        import adaptmg.patch.kernels as patch_kernels
        patch_kernels.SMOOTH3D_VARIANT = args.smooth_form
    if args.backend == "cpu":
        if "tables" not in args.sections and "rounding" not in args.sections:
            ap.error("--backend cpu runs the tables and rounding sections only: name them in --sections")
        rows = []
        try:
            if "tables" in args.sections:
                bench_tables(args, get_backend("cpu"), rows)
            if "rounding" in args.sections:
                bench_rounding(args, get_backend("cpu"), rows)
        finally:
            if args.out:
                with open(os.path.join(args.out, "bench_patch.json"), "w") as f:
                    json.dump(rows, f, indent=1)
        return
    be = get_backend("gpu")
    cp = be.xp
    props = cp.cuda.runtime.getDeviceProperties(0)
    print("device:", props["name"].decode(), "SMs", props["multiProcessorCount"],
          "clock(kHz)", props.get("clockRate"), flush=True)
    rows = []
    t0 = time.time()
    try:
        if "op" in args.sections or "smooth" in args.sections:
            bench_kernels(args, be, rows)
        if "tune" in args.sections:
            bench_tune(args, be, rows)
        if "solve" in args.sections:
            ks = [int(s) for s in args.solve_ks.split(",") if s]
            bench_solve(args, be, rows, ks, args.solve_max_dofs)
        if "large" in args.sections:
            bench_solve(args, be, rows, [args.large_k], args.large_dofs, large=True)
        if "tables" in args.sections:
            bench_tables(args, be, rows)
        if "table7" in args.sections:
            bench_table7(args, be, rows)
        if "breakdown" in args.sections:
            bench_breakdown(args, be, rows)
        if "rounding" in args.sections:
            bench_rounding(args, be, rows)
    finally:
        if args.out:
            with open(os.path.join(args.out, "bench_patch.json"), "w") as f:
                json.dump(rows, f, indent=1)
        print(f"--- summary ({time.time() - t0:.0f} s) ---")
        for r in rows:
            print(fmt(r))


if __name__ == "__main__":
    main()
