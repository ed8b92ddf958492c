#!/usr/bin/env python
"""Adaptive refinement driver: solve -> estimate -> mark -> refine with geometric multigrid.

Examples::

    python scripts/adaptive.py --problem lshape --steps 14                 # residual estimator, CPU
    python scripts/adaptive.py --problem lshape --estimator dwr --steps 12
    python scripts/adaptive.py --problem lshape --strategy uniform --steps 5
    python scripts/adaptive.py --problem fichera --steps 8 --backend gpu --out out/fichera
    python scripts/adaptive.py --problem interior_layer --steps 10
    python scripts/adaptive.py --problem elasticity_corner --steps 10

    python scripts/adaptive.py --problem lshape --backend cpu --max-dofs 100000   # to 1e5 DoFs
    python scripts/adaptive.py --problem lshape --backend gpu --max-dofs 1000000  # mesh on the GPU
    python scripts/adaptive.py --problem lshape --backend gpu --mesh-backend cpu  # host mesh, GPU solve
    python scripts/adaptive.py --problem lshape --backend gpu --max-dofs 1000000 --repeat 2 --out DIR
                                                     # the second (warm) loop, a VTU file per step
    python scripts/adaptive.py --problem lshape --backend gpu --max-dofs 1000000 --repeat 3 --cold
                                                     # first run on a machine (empty kernel caches)

With ``--backend gpu`` the L-shape and Fichera problems build their mesh on the device
(``--mesh-backend``, default: the solver's backend): refinement, set-up, Dirichlet values,
estimator, marking and error norms then run on CuPy arrays; ``--mesh-backend cpu`` keeps
the host mesh (the loop as before issue 36).

Prints one line per step (cells, DoFs, hanging nodes, multigrid levels, estimate,
true error where known, multigrid iterations, solve and estimate times), then the
total wall time and a per-step breakdown table (refine, set-up, solve, estimate,
true error, other; see :func:`timed_run`), writes
one VTU file per step to ``--out`` (solution, indicators, cell levels; raw appended VTU written
by a background thread, :mod:`adaptmg.io.vtu_raw`) and a PNG
convergence plot (``convergence.png``; skipped with a message when matplotlib is not
installed), and a ``history.csv``.
"""
from __future__ import annotations

import argparse
import contextlib
import csv
import functools
import importlib
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

PROBLEMS = ("lshape", "fichera", "interior_layer", "elasticity_corner")
DEVICE_MESH = ("lshape", "fichera")          # problems whose run() takes mesh_backend


def _printer(quiet):
    """Progress output: adaptmg.progress when it exists, else plain prints."""
    if quiet:
        return lambda *a, **k: None
    try:
        from adaptmg import progress  # type: ignore
        log = getattr(progress, "log", None) or getattr(progress, "print", None)
        if callable(log):
            return log
    except ImportError:
        pass
    return lambda *a, **k: print(*a, **k, flush=True)


def plot(history, path, title="", printer=print):
    """Log-log plot of estimate and errors against DoFs, with the N^(-1/2) / N^(-1/3) guides."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        printer("matplotlib is not installed: skipping the convergence plot "
                "(pip install 'adaptmg[plot]')")
        return None
    N = np.array([h["dofs"] for h in history], float)
    fig, ax = plt.subplots(figsize=(6, 4.5))
    ax.loglog(N, [h["estimate"] for h in history], "o-", label="estimate")
    for key in sorted(k for k in history[0] if k.startswith("err_")):
        ax.loglog(N, [h[key] for h in history], "s--", label=key[4:] + " error")
    if "goal_error" in history[0]:
        ax.loglog(N, [abs(h["goal_error"]) for h in history], "^--", label="|J(u) - J(u_h)|")
    e0 = history[0]["estimate"]
    for p, style in ((0.5, ":"), (1.0 / 3.0, "-.")):
        ax.loglog(N, e0 * (N / N[0]) ** (-p), "k" + style, lw=0.8, label=f"N^(-{p:.2g})")
    ax.set_xlabel("DoFs")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


@contextlib.contextmanager
def _timed_problem(mod, acc):
    """Wrap, for one run, the callables of the :class:`AdaptiveProblem` that ``mod.run`` hands to
    ``adaptive_loop`` (solve, estimate, error) and :meth:`adaptmg.Mesh.refine` with wall-clock
    counters: ``acc[name]`` is the list of per-call seconds, ``acc["start"]`` the start time
    of every solve (= of every step)."""
    from adaptmg.mesh import mesh as meshmod
    orig_loop = mod.adaptive_loop
    orig_refine = meshmod.Mesh.refine
    depth = [0]

    def timed(name, fn):
        if fn is None:
            return None

        @functools.wraps(fn)
        def f(*a, **k):
            t0 = time.perf_counter()
            if name == "solve":
                acc["start"].append(t0)
            try:
                return fn(*a, **k)
            finally:
                acc[name].append(time.perf_counter() - t0)
        return f

    @functools.wraps(orig_refine)
    def refine(self, *a, **k):
        depth[0] += 1
        t0 = time.perf_counter()
        try:
            return orig_refine(self, *a, **k)
        finally:
            depth[0] -= 1
            if depth[0] == 0:                        # outermost call only
                acc["refine"].append(time.perf_counter() - t0)

    @functools.wraps(orig_loop)
    def loop(problem, *a, **k):
        import dataclasses
        problem = dataclasses.replace(problem, solve=timed("solve", problem.solve),
                                      estimate=timed("estimate", problem.estimate),
                                      error=timed("error", problem.error))
        return orig_loop(problem, *a, **k)

    for key in ("start", "solve", "estimate", "error", "refine"):
        acc[key] = []
    mod.adaptive_loop = loop
    meshmod.Mesh.refine = refine
    try:
        yield acc
    finally:
        mod.adaptive_loop = orig_loop
        meshmod.Mesh.refine = orig_refine


def timed_run(mod, **kw):
    """``mod.run(**kw)`` with the per-step breakdown: returns (result, rows, total seconds).

    Row of step k: ``refine`` (the refinement that made this step's mesh, 0 for step 0),
    ``setup`` (space, hierarchy, assembly, constraints, device copies: the solve call less
    the multigrid solve), ``solve`` (the multigrid solve, ``t_mg``), ``estimate``
    (indicators), ``error`` (the true error, where known), ``other`` (marking, output,
    printing: the rest of the step's wall time) and ``step`` (wall time of the step).
    """
    acc = {}
    t0 = time.perf_counter()
    with _timed_problem(mod, acc):
        res = mod.run(**kw)
    total = time.perf_counter() - t0
    hist = res["history"]
    starts = acc["start"] + [t0 + total]
    rows = []
    for k, h in enumerate(hist):
        wall = (starts[k + 1] - starts[k]) if k + 1 < len(starts) else float("nan")
        ref_next = acc["refine"][k] if k < len(acc["refine"]) else 0.0   # refine at the end of step k
        ref_this = acc["refine"][k - 1] if 0 < k <= len(acc["refine"]) else 0.0
        setup = h["t_solve"] - h["t_mg"]
        err = acc["error"][k] if k < len(acc["error"]) else 0.0
        parts = setup + h["t_mg"] + h["t_estimate"] + err + ref_next
        rows.append(dict(step=h["step"], cells=h["cells"], dofs=h["dofs"], iterations=h["iterations"],
                         refine=ref_this, setup=setup, solve=h["t_mg"], estimate=h["t_estimate"],
                         error=err, other=max(0.0, wall - parts), step_wall=wall - ref_next + ref_this))
    # the time before the first solve (imports, coarse mesh) counts as "other" of step 0
    if rows:
        rows[0]["other"] += acc["start"][0] - t0 if acc["start"] else 0.0
        rows[0]["step_wall"] += acc["start"][0] - t0 if acc["start"] else 0.0
    return res, rows, total


BREAKDOWN = ("refine", "setup", "solve", "estimate", "error", "other")


def breakdown_table(rows, total, backend):
    """Markdown table: one row per step and a total row (seconds)."""
    head = ["step", "cells", "DoFs", "MG its"] + list(BREAKDOWN) + ["step total"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        lines.append("| " + " | ".join([str(r["step"]), str(r["cells"]), str(r["dofs"]), str(r["iterations"])]
                                       + [f"{r[k]:.3f}" for k in BREAKDOWN] + [f"{r['step_wall']:.3f}"]) + " |")
    sums = {k: sum(r[k] for r in rows) for k in BREAKDOWN}
    lines.append("| **total** | | | | " + " | ".join(f"{sums[k]:.3f}" for k in BREAKDOWN)
                 + f" | **{total:.3f}** |")
    share = ", ".join(f"{k} {100 * sums[k] / total:.0f} %" for k in BREAKDOWN if total > 0)
    return "\n".join(lines) + f"\n\ntotal wall time {total:.2f} s on backend {backend} ({share})"


def write_csv(history, path):
    keys = list(dict.fromkeys(k for h in history for k in h))
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=keys)
        w.writeheader()
        for h in history:
            w.writerow(h)


def _cold(argv):
    """This command again, without ``--cold``, in a child process with empty kernel caches."""
    import subprocess
    import sys
    import tempfile
    args = [x for x in (sys.argv[1:] if argv is None else argv) if x != "--cold"]
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, CUPY_CACHE_DIR=os.path.join(tmp, "cupy"),
                   ADAPTMG_KERNEL_CACHE=os.path.join(tmp, "adaptmg"))
        print(f"cold run: empty kernel caches in {tmp}", flush=True)
        p = subprocess.run([sys.executable, os.path.abspath(__file__), *args], env=env)
    if p.returncode:
        raise SystemExit(p.returncode)
    return None


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--problem", choices=PROBLEMS, default="lshape")
    ap.add_argument("--steps", type=int, default=None,
                    help="refinement steps (default 10, or 200 with --max-dofs: stop at that size)")
    ap.add_argument("--backend", choices=("cpu", "gpu", "auto"), default="cpu")
    ap.add_argument("--strategy", choices=("doerfler", "fixed_fraction", "uniform"), default="doerfler")
    ap.add_argument("--theta", type=float, default=0.5,
                    help="Doerfler bulk parameter, or the cell fraction for fixed_fraction")
    ap.add_argument("--estimator", choices=("residual", "dwr"), default="residual",
                    help="lshape only: residual (Kelly) or goal-oriented DWR")
    ap.add_argument("--mesh-backend", choices=("cpu", "gpu"), default=None,
                    help="where the mesh lives (lshape, fichera): default gpu with --backend gpu, else cpu")
    ap.add_argument("--max-dofs", type=int, default=None)
    ap.add_argument("--out", default=None, help="directory for VTU files, history.csv and convergence.png")
    ap.add_argument("--repeat", type=int, default=1,
                    help="run the whole loop N times in this process and report the last run "
                         "(the earlier ones, quiet, compile the kernels: a warm loop's figures)")
    ap.add_argument("--cold", action="store_true",
                    help="run in a fresh child process whose kernel caches (CUPY_CACHE_DIR, "
                         "ADAPTMG_KERNEL_CACHE) are empty folders: the first run on a machine "
                         "(with --repeat N its first loop is the cold one, the others warm)")
    ap.add_argument("--quiet", action="store_true")
    a = ap.parse_args(argv)
    if a.cold:
        return _cold(argv)
    if a.steps is None:
        a.steps = 200 if a.max_dofs is not None else 10
    if a.steps < 0:
        ap.error("--steps must be >= 0")
    if a.repeat < 1:
        ap.error("--repeat must be >= 1")
    if a.max_dofs is not None and a.max_dofs < 1:
        ap.error("--max-dofs must be a positive integer")
    if a.backend == "gpu":
        from adaptmg import gpu_available
        if not gpu_available():
            ap.error("--backend gpu: CuPy or a CUDA device is not available")
    out = _printer(a.quiet)
    mod = importlib.import_module(f"adaptmg_problems.{a.problem}")
    kw = dict(steps=a.steps, backend=a.backend, quiet=a.quiet, out=a.out, strategy=a.strategy,
              theta=a.theta, max_dofs=a.max_dofs)
    if a.problem == "lshape":
        kw["estimator"] = a.estimator
    if a.mesh_backend is not None:
        if a.problem not in DEVICE_MESH:
            ap.error(f"--mesh-backend is available for {', '.join(DEVICE_MESH)} only")
        if a.mesh_backend == "gpu" and a.backend == "cpu":
            ap.error("--mesh-backend gpu needs --backend gpu")
        if a.mesh_backend == "gpu" and a.estimator == "dwr":
            ap.error("--estimator dwr (a Q2 dual space) needs --mesh-backend cpu")
        kw["mesh_backend"] = a.mesh_backend
    elif a.estimator != "residual":
        ap.error("--estimator dwr is available for --problem lshape only")
    for r in range(a.repeat - 1):                   # warm-up runs: same loop, same output
        t_w = timed_run(mod, **{**kw, "quiet": True})[2]
        out(f"warm-up run {r + 1} of {a.repeat - 1}: {t_w:.2f} s")
    res, rows, total = timed_run(mod, **kw)
    hist = res["history"]
    out(f"total {total:.2f} s for {len(hist)} solves; final DoFs {hist[-1]['dofs']}, "
        f"multigrid iterations {min(h['iterations'] for h in hist[1:] or hist)}.."
        f"{max(h['iterations'] for h in hist)}")
    if len(hist) >= 4:
        from adaptmg.estimate import fitted_slope
        late = hist[len(hist) // 2:]
        N = [h["dofs"] for h in late]
        msg = f"fitted slope vs DoFs over steps {late[0]['step']}..{late[-1]['step']}: estimate " \
              f"{fitted_slope(N, [h['estimate'] for h in late]):+.3f}"
        for k in (k for k in late[0] if k.startswith("err_")):
            msg += f", {k[4:]} {fitted_slope(N, [h[k] for h in late]):+.3f}"
        out(msg)
    table = breakdown_table(rows, total, a.backend)
    if not a.quiet:
        print(f"\nper-step breakdown (seconds), {a.problem}, backend {a.backend}, mesh on "
              f"{res['mesh'].backend.name}:\n" + table, flush=True)
    res["breakdown"] = rows
    res["total"] = total
    if a.out:
        write_csv(hist, os.path.join(a.out, "history.csv"))
        p = plot(hist, os.path.join(a.out, "convergence.png"), f"{a.problem} ({a.strategy})", out)
        if p:
            out(f"wrote {len(hist)} VTU files, history.csv and {p}")
    return res


if __name__ == "__main__":
    main()
