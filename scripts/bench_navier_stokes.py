#!/usr/bin/env python3
r"""Benchmark of the Navier-Stokes pressure-correction solver (seed 001 §5.3, Table 4), CPU vs GPU.

Usage::

    python scripts/bench_navier_stokes.py                      # 3-D 32x32x64, GPU (if any) + CPU
    python scripts/bench_navier_stokes.py --n 16,16,32 --steps 100 --cpu-steps 5
    python scripts/bench_navier_stokes.py --validate           # 2-D Re=100 steady state vs Ghia et al.

What is measured (all on one set of host matrices, assembled once):

* GPU (custom kernels): ``--warmup`` steps, then ``--steps`` steps with no
  synchronisation except GMRES's scalars -> **ms per step** (the figure to compare
  with the paper's 1660 s / 40 000 steps = 41.5 ms); then ``--steps`` steps with the
  phases of Table 4 timed by :class:`adaptmg_problems._timing.Timer` (it synchronises around
  every phase, so the phase sum is a little above the unperturbed time per step);
* GPU with ``--rtol-fast`` (looser pressure tolerance) per step, and GPU* (``--spmv``:
  every custom multi-matrix kernel replaced by one cuSPARSE SpMV with the
  equivalent block matrix);
* CPU: ``--cpu-steps`` steps with phases (NumPy/SciPy, one thread for SpMV).

Table columns are milliseconds per time step; the paper's columns are Table 4
divided by 40 000 steps (CPU: 8 threads EPYC 7773X; GPU: H100 PCIe).
``--validate``: 2-D cavity, Re = 100, uniform (n x n pressure, 2n x 2n velocity
cells), dt = 0.005 (explicit limits: diffusion h^2/(2 nu) = 0.012 at n = 32,
convection 2 nu/|u|^2 = 0.02), run until max|du/dt| < 1e-5; prints the deviation of
u(0.5, y) and v(x, 0.5) from Ghia, Ghia & Shin, J. Comput. Phys. 48 (1982), Re = 100.

Measured (H100 80GB HBM3, CuPy 14, 22 Nov 2026; ``--backend both --steps 500 --cpu-steps 3``;
3-D 32x32x64: 545 025 velocity nodes x 3, 70 785 pressure nodes).  Pressure solver:
FGMRES from the extrapolated start 2q^n - q^{n-1}, V(2,2) Chebyshev degree 6, 4 threads
per row, CUDA-graph cycle; ms per time step over steps 10-510:

==============  ======  =====  =====  ==========  =========
phase            CPU    GPU    GPU*   paper CPU   paper GPU
==============  ======  =====  =====  ==========  =========
mom-rhs-nonlin  346.0   0.440  0.729  131.4       3.58
mom-rhs-p        38.5   0.203  0.183   41.2       0.93
mom-rhs-visc     63.8   0.148  0.272   32.0       0.93
mom-solve         3.8   0.035  0.038   10.1       0.30
pres-rhs         52.1   0.163  0.168   34.7       1.33
pres-solve      522.8   2.22   2.26   374.2      32.6
pres-up           0.4   0.025  0.027   41.7       1.81
wall / step    1028     3.00   3.35   669        41.5
==============  ======  =====  =====  ==========  =========

FGMRES iterations per step 2.02 (rtol 1e-6; CPU 8.3 over its first 3 steps); rtol 1e-4:
2.62 ms/step.  The paper's whole run, 40 000 steps to t = 4 (one ``NavierStokes.advance``
per 10 000 steps): 2.86 / 2.72 / 2.68 / 3.06 ms per step, 113 s in all against the
paper's 1660 s; 1.45-1.50 iterations per step, no failure.  Before this solver (GMRES
from q^n, V(1,1) of degree 4): 5.8 ms/step over steps 10-110 (8.6 iterations), and
24.7 ms/step with the MultilevelSolver cycle without CUDA graph.  ``--variants`` and
``--start`` compare cycles on identical steps (each variant restarts from one snapshot).

Design measurements behind the solver (H100, same cavity, rtol 1e-6; they used to sit in
the docstrings of :mod:`adaptmg_problems.navier_stokes` and :mod:`adaptmg.device.multicsr`):

* time step: 3.0 ms over steps 10-510 (2.0 FGMRES iterations per step), 2.8 ms over
  steps 3010-3510 (``--start 3000``).  With FGMRES from q^n on steps 10-510: V(1,1) of
  degree 4 4.7 ms (6.6 iterations), V(2,2) of degree 6 3.9 ms (3.6 iterations); the
  extrapolated start 2q^n - q^{n-1} and one synchronisation less per solve give the
  3.0 ms.  About 70 % of a step is the pressure solve, launch/latency bound on its
  70 785 unknowns.
* pressure cycle: V(2,2) of degree 6 is about 3x the cost of V(1,1) of degree 4, but
  every Krylov iteration also pays a fixed ~0.3 ms (launches and the scalar transfer),
  so the stronger cycle wins (3.9 against 4.7 ms per step above).
* CUDA graph: one cycle of the adaptmg MultilevelSolver on this problem cost about 2 ms
  of Python and launch overhead; the captured cycle is one launch.
* threads per row: the fused CSR kernels ran 2x faster with 4 threads per row on 3-D Q1
  levels (:func:`adaptmg.device.kernels.threads_per_row`); with one thread per row a
  kernel on a 10k-row level took about as long as on a 70k-row one (a chain of ``width``
  dependent loads per thread).
* ELL storage of :class:`adaptmg.device.multicsr.MultiCSR`: a thread-per-row CSR loop
  over 27 entries ran at half of cuSPARSE's speed (32 cache lines per warp load); the
  slot-major ELL layout makes the loads coalesced.
"""
from __future__ import annotations

import argparse
import time

import numpy as np

from adaptmg.backend import get_backend, gpu_available
from adaptmg_problems import navier_stokes as NS
from adaptmg_problems._timing import Timer, format_table

#: seed 001 Table 4 (seconds for 40 000 steps): CPU (8 threads) and GPU (custom kernels)
PAPER = {"mom-rhs-nonlin": (5255.3, 143.1), "mom-rhs-p": (1648.0, 37.3),
         "mom-rhs-visc": (1278.6, 37.3), "mom-solve": (401.9, 11.8), "pres-rhs": (1385.8, 53.2),
         "pres-solve": (14967.4, 1303.4), "pres-up": (1667.0, 72.2), "sum": (26754.2, 1660.0)}
PAPER_STEPS = 40000


def _phase_ms(timer, steps):
    d = timer.as_dict(NS.PHASES)
    return {k: 1e3 * v / steps for k, v in d.items()}


def _its(ns, k):
    its = np.array(ns.poisson.iterations[-k:])
    return float(its.mean()), int(its.max())


def _parse_mg(spec):
    """'pre=1,deg=4,coarse=2000,smoother=chebyshev' -> multigrid options."""
    mg, skw = {}, {}
    for item in filter(None, spec.split(",")):
        k, v = item.split("=")
        if k == "pre":
            mg["presmooth"] = mg["postsmooth"] = int(v)
        elif k == "deg":
            skw["degree"] = int(v)
        elif k == "coarse":
            mg["coarse_rows"] = int(v)
        elif k == "smoother":
            mg["smoother"] = v
        elif k == "x0":
            if v not in ("extrapolate", "previous"):
                raise ValueError(f"x0 must be 'extrapolate' or 'previous', got {v!r}")
            mg["x0"] = v
        elif k == "omega":
            skw["omega"] = v if v == "auto" else float(v)
        else:
            raise ValueError(f"unknown variant key {k!r}")
    if skw:
        mg["smoother_kwargs"] = skw
    return mg


_STATE = ("U", "P", "Q", "Qprev", "PQ")


def _snapshot(ns):
    """Copy of the time-stepping state (velocity, pressure, increment, time)."""
    return dict({k: getattr(ns, k).copy() for k in _STATE}, time=ns.time, steps_done=ns.steps_done)


def _restore(ns, snap):
    for k in _STATE:
        getattr(ns, k)[...] = snap[k]
    ns.time, ns.steps_done = snap["time"], snap["steps_done"]


def bench(args):
    n = tuple(int(v) for v in args.n.split(","))
    dim = len(n)
    t0 = time.perf_counter()
    host = NS.assemble_host(dim, n, graded=not args.uniform)
    print(f"{dim}-D cavity Re={args.Re:g} dt={args.dt:g}, pressure cells {n}, "
          f"velocity nodes {host['m_u'].size} (x{dim}), pressure nodes {host['m_p'].size}; "
          f"host assembly {time.perf_counter() - t0:.1f} s", flush=True)
    cols = {}

    class _Notes(list):
        def append(self, line):
            print(line, flush=True)
            super().append(line)
    notes = _Notes()
    per_step = {}
    want_gpu = args.backend in ("gpu", "both")
    if want_gpu and not gpu_available():
        print("no GPU visible: GPU columns skipped")
        want_gpu = False
    mg_all = _parse_mg(args.mg) if args.mg else {}
    kw = dict(dt=args.dt, Re=args.Re, rtol=args.rtol, host=host,
              extrapolate=mg_all.pop("x0", "extrapolate") == "extrapolate", mg=mg_all or None)

    def run_gpu(name, uk):
        be = get_backend("gpu")
        t1 = time.perf_counter()
        ns = NS.NavierStokes(dim, backend="gpu", use_kernels=uk, **kw)
        ns.advance(args.warmup)
        setup = time.perf_counter() - t1
        if args.start:
            ns.advance(args.start)
        # every measurement below runs the same steps from this state
        snap = _snapshot(ns)
        h = ns.advance(args.steps)
        per_step[name] = 1e3 * h["wall"] / h["steps"]
        mi, ma = _its(ns, args.steps)
        notes.append(f"{name}: {per_step[name]:.3f} ms/step over {args.steps} steps "
                     f"(unsynchronised loop), GMRES iterations/step mean {mi:.2f} max {ma}, "
                     f"device setup + warm-up {setup:.1f} s, pressure V-cycle: "
                     f"{ns.poisson.mode} {ns.poisson.cycle.graph_error or ''}")
        timer = Timer(be)
        _restore(ns, snap)
        ns.advance(args.steps, timer)
        cols[name] = _phase_ms(timer, args.steps)
        notes.append(f"{name} phases (ms/step, synchronised): "
                     + ", ".join(f"{k} {v:.3f}" for k, v in cols[name].items()))
        if uk and args.rtol_fast:
            ns.poisson.rtol = args.rtol_fast
            _restore(ns, snap)
            h = ns.advance(args.steps)
            per_step[name + f" rtol={args.rtol_fast:g}"] = 1e3 * h["wall"] / h["steps"]
            mi, ma = _its(ns, args.steps)
            notes.append(f"{name} with rtol={args.rtol_fast:g}: {1e3 * h['wall'] / h['steps']:.3f} "
                         f"ms/step, GMRES iterations/step mean {mi:.2f} max {ma}")
        if uk and args.variants:
            for spec in args.variants.split(";"):
                mg = _parse_mg(spec)
                ns.extrapolate = mg.pop("x0", "extrapolate") == "extrapolate"
                for rt in (args.rtol, args.rtol_fast or args.rtol):
                    ns.set_pressure_solver(rtol=rt, **mg)
                    mg_note = f" ({ns.poisson.mode})"
                    ns.advance(args.warmup)          # kernels of the new cycle compile here
                    _restore(ns, snap)
                    h = ns.advance(args.steps)
                    mi, ma = _its(ns, args.steps)
                    notes.append(f"  variant {spec} rtol={rt:g}: {1e3 * h['wall'] / h['steps']:.3f} "
                                 f"ms/step, GMRES iterations/step mean {mi:.2f} max {ma}{mg_note}")
            ns.set_pressure_solver(rtol=args.rtol, **(kw["mg"] or {}))
            ns.extrapolate = kw["extrapolate"]
        _restore(ns, snap)
        ns.advance(args.steps)
        E = float(ns.kinetic_energy())
        notes.append(f"{name}: t = {ns.time:.4f}, kinetic energy {E:.4e}, pressure mean "
                     f"{ns.pressure_mean():.1e}, divergence predictor {ns.divergence_norm():.3e} "
                     f"-> corrected {ns.divergence_norm(ns.corrected()):.3e}, GMRES failures "
                     f"{ns.poisson.failures}")
        del ns
        be.xp.get_default_memory_pool().free_all_blocks()
    if want_gpu:
        run_gpu("GPU", True)
    if args.backend in ("cpu", "both") and args.cpu_steps > 0:
        ns = NS.NavierStokes(dim, backend="cpu", **kw)
        ns.advance(1)
        timer = Timer(None)
        h = ns.advance(args.cpu_steps, timer)
        cols["CPU"] = _phase_ms(timer, args.cpu_steps)
        its = ns.poisson.iterations[-args.cpu_steps:]
        notes.append("CPU phases (ms/step): " + ", ".join(f"{k} {v:.1f}" for k, v in cols["CPU"].items()))
        del ns
        per_step["CPU"] = 1e3 * h["wall"] / h["steps"]
        mi, ma = float(np.mean(its)), int(np.max(its))
        notes.append(f"CPU: {per_step['CPU']:.1f} ms/step over {args.cpu_steps} steps, GMRES "
                     f"iterations/step mean {mi:.2f} max {ma}")
    if want_gpu and args.spmv:
        run_gpu("GPU*", False)
    # ---- table (ms per step)
    names = [c for c in ("CPU", "GPU", "GPU*") if c in cols]
    rows = []
    for ph in NS.PHASES + ("sum",):
        r = {"phase": ph}
        for c in names:
            r[c] = cols[c].get(ph)
        if "CPU" in cols and "GPU" in cols and cols["GPU"].get(ph):
            r["CPU/GPU"] = cols["CPU"][ph] / cols["GPU"][ph]
        if dim == 3 and n == (32, 32, 64):
            r["paper CPU"] = 1e3 * PAPER[ph][0] / PAPER_STEPS
            r["paper GPU"] = 1e3 * PAPER[ph][1] / PAPER_STEPS
        rows.append(r)
    r = {"phase": "ms/step (wall, no phase sync)"}
    for c in names:
        r[c] = per_step.get(c)
    if "CPU" in per_step and "GPU" in per_step:
        r["CPU/GPU"] = per_step["CPU"] / per_step["GPU"]
    if dim == 3 and n == (32, 32, 64):
        r["paper CPU"] = 1e3 * PAPER["sum"][0] / PAPER_STEPS
        r["paper GPU"] = 1e3 * PAPER["sum"][1] / PAPER_STEPS
    rows.append(r)
    extra = [c for c in ("CPU/GPU", "paper CPU", "paper GPU") if any(c in r for r in rows)]
    print(format_table(rows, [("phase", "phase (ms/step)")] + [(c, c, ".4g") for c in names + extra],
                       title="Table 4 layout, milliseconds per time step"))
    for k, v in per_step.items():
        if k not in names:
            print(f"{k}: {v:.3f} ms/step")
    for s in notes:
        print(s)
    if "GPU" in per_step and dim == 3 and n == (32, 32, 64):
        print(f"target <= 4 ms/step on the H100: {'met' if per_step['GPU'] <= 4.0 else 'NOT met'} "
              f"({per_step['GPU']:.3f} ms); paper 41.5 ms -> speed-up {41.5 / per_step['GPU']:.1f}x")


def validate(args):
    nv = args.validate_n
    backend = "gpu" if (args.backend in ("gpu", "both") and gpu_available()) else "cpu"
    t0 = time.perf_counter()
    r = NS.run(dim=2, n=(nv, nv), steps=args.validate_steps, dt=args.validate_dt, Re=100.0,
               backend=backend, quiet=True, graded=False, monitor=50, steady_tol=1e-5,
               check_every=50, phases=False)
    wall = time.perf_counter() - t0
    u, pts = r["u"], r["points_u"]
    ug = NS.centreline(pts, u[:, 0], 0, 0.5, samples=NS.GHIA_RE100_U[:, 0])
    vg = NS.centreline(pts, u[:, 1], 1, 0.5, samples=NS.GHIA_RE100_V[:, 0])
    du = ug - NS.GHIA_RE100_U[:, 1]
    dv = vg - NS.GHIA_RE100_V[:, 1]
    print(f"2-D cavity Re=100, {nv}x{nv} pressure / {2 * nv}x{2 * nv} velocity cells (uniform), "
          f"dt={args.validate_dt:g}, backend {backend}: {r['steps']} steps to t={r['time']:.2f} "
          f"(max|du/dt| = {r['rate'][-1]:.2e}), {wall:.1f} s")
    rows = [{"y": y, "Ghia u": g, "u": v, "diff": v - g} for (y, g), v in zip(NS.GHIA_RE100_U, ug)]
    print(format_table(rows, [("y", "y", ".4f"), ("Ghia u", "Ghia u(0.5,y)", ".5f"),
                              ("u", "adaptmg", ".5f"), ("diff", "diff", "+.5f")]))
    print(f"u(0.5, y): max |diff| {np.abs(du).max():.4f}, rms {np.sqrt(np.mean(du ** 2)):.4f}; "
          f"v(x, 0.5): max |diff| {np.abs(dv).max():.4f}, rms {np.sqrt(np.mean(dv ** 2)):.4f} "
          f"(reference: Ghia, Ghia & Shin 1982, Tables I-II)")
    print(f"min u on the centreline {ug.min():.5f} (Ghia -0.21090), divergence predictor "
          f"{r['div_pred']:.2e} -> corrected {r['div_corr']:.2e}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", default="32,32,64", help="pressure cells per direction (default 32,32,64)")
    ap.add_argument("--dt", type=float, default=1e-4)
    ap.add_argument("--Re", type=float, default=1000.0)
    ap.add_argument("--uniform", action="store_true", help="uniform instead of graded cells")
    ap.add_argument("--backend", choices=("both", "gpu", "cpu"), default="both")
    ap.add_argument("--steps", type=int, default=200, help="GPU steps per measurement")
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--start", type=int, default=0,
                    help="steps run before the measured window (after the warm-up); every GPU "
                         "measurement (phases, --rtol-fast, --variants) restarts from that state")
    ap.add_argument("--cpu-steps", type=int, default=3)
    ap.add_argument("--rtol", type=float, default=1e-6, help="pressure GMRES relative tolerance")
    ap.add_argument("--rtol-fast", type=float, default=1e-4, help="second GPU run with this rtol (0: none)")
    ap.add_argument("--spmv", action=argparse.BooleanOptionalAction, default=True,
                    help="also run GPU* (plain cuSPARSE SpMV instead of the custom kernels)")
    ap.add_argument("--mg", default="", help="pressure multigrid options of all runs, e.g. 'deg=4' "
                    "(keys pre, deg, coarse, smoother, omega, x0; default: Chebyshev degree 4, 1+1 sweeps)")
    ap.add_argument("--variants", default="",
                    help="';'-separated multigrid variants timed on the GPU, e.g. 'pre=1,deg=3;pre=1,deg=4'")
    ap.add_argument("--validate", action="store_true", help="only the 2-D Re=100 comparison with Ghia et al.")
    ap.add_argument("--validate-n", type=int, default=32)
    ap.add_argument("--validate-dt", type=float, default=0.005)
    ap.add_argument("--validate-steps", type=int, default=8000)
    args = ap.parse_args(argv)
    if args.validate:
        validate(args)
    else:
        bench(args)


if __name__ == "__main__":
    main()
