#!/usr/bin/env python
"""Adaptive refinement driver: solve -> estimate -> mark -> refine with geometric multigrid.

Examples::

    python scripts/adaptive.py --problem lshape --steps 14                 # residual estimator, CPU
    python scripts/adaptive.py --problem lshape --estimator dwr --steps 12
    python scripts/adaptive.py --problem lshape --strategy uniform --steps 5
    python scripts/adaptive.py --problem fichera --steps 8 --backend gpu --out out/fichera
    python scripts/adaptive.py --problem interior_layer --steps 10
    python scripts/adaptive.py --problem elasticity_corner --steps 10

Prints one line per step (cells, DoFs, hanging nodes, multigrid levels, estimate,
true error where known, multigrid iterations, solve and estimate times), writes
one VTU file per step to ``--out`` (solution, indicators, cell levels) and a PNG
convergence plot (``convergence.png``; skipped with a message when matplotlib is not
installed), and a ``history.csv``.
"""
from __future__ import annotations

import argparse
import csv
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


def write_csv(history, path):
    keys = list(dict.fromkeys(k for h in history for k in h))
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=keys)
        w.writeheader()
        for h in history:
            w.writerow(h)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--problem", choices=PROBLEMS, default="lshape")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--backend", choices=("cpu", "gpu", "auto"), default="cpu")
    ap.add_argument("--strategy", choices=("doerfler", "fixed_fraction", "uniform"), default="doerfler")
    ap.add_argument("--theta", type=float, default=0.5,
                    help="Doerfler bulk parameter, or the cell fraction for fixed_fraction")
    ap.add_argument("--estimator", choices=("residual", "dwr"), default="residual",
                    help="lshape only: residual (Kelly) or goal-oriented DWR")
    ap.add_argument("--max-dofs", type=int, default=None)
    ap.add_argument("--out", default=None, help="directory for VTU files, history.csv and convergence.png")
    ap.add_argument("--quiet", action="store_true")
    a = ap.parse_args(argv)
    if a.steps < 0:
        ap.error("--steps must be >= 0")
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
    elif a.estimator != "residual":
        ap.error("--estimator dwr is available for --problem lshape only")
    t0 = time.perf_counter()
    res = mod.run(**kw)
    total = time.perf_counter() - t0
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
    if a.out:
        write_csv(hist, os.path.join(a.out, "history.csv"))
        p = plot(hist, os.path.join(a.out, "convergence.png"), f"{a.problem} ({a.strategy})", out)
        if p:
            out(f"wrote {len(hist)} VTU files, history.csv and {p}")
    return res


if __name__ == "__main__":
    main()
