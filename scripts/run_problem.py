#!/usr/bin/env python3
"""Run one application problem of seed 001 §5 and print the paper's timing table.

Examples::

    python scripts/run_problem.py transport-diffusion --n 7 8 --backend cpu gpu
    python scripts/run_problem.py elasticity --case edge --level 3 4 5 6 --backend gpu
    python scripts/run_problem.py elasticity --case face --level 2 3 --steps 10 --backend cpu

Columns: mesh level (n for transport-diffusion), DOFs (elasticity: also nodes and
the fraction of hanging nodes, Table 2), then init / rhs / solve / sum per
backend (Tables 1 and 3), the largest number of GMRES iterations in a step and,
for transport-diffusion, the L2 error at T against the exact solution.
With two backends a GPU/CPU ratio of the sums is added.
"""
from __future__ import annotations

import argparse

from adaptmg_problems._timing import format_table

PHASES = ("init", "rhs", "solve", "sum")


def _time_stepping_kwargs(args, default_dt, backend):
    """Keyword arguments of a problem's run() from the command line (dt, steps or T, rtol, tol)."""
    kw = dict(dt=args.dt if args.dt is not None else default_dt, backend=backend, quiet=args.quiet)
    if args.steps is not None:
        kw["steps"] = args.steps
    elif args.T is not None:
        kw["T"] = args.T
    if args.rtol is not None:
        kw["rtol"] = args.rtol
    if args.tol is not None:
        kw["tol"] = args.tol
    return kw


def run_td(n, backend, args):
    from adaptmg_problems import transport_diffusion as td
    kw = _time_stepping_kwargs(args, 0.02, backend)
    r = td.run(n, **{**kw, "quiet": True}, compute_error=not args.no_error) if args.quiet else \
        _run_verbose(td.run, n, kw, compute_error=not args.no_error)
    return r


def _run_verbose(fn, size, kw, **extra):
    # show the progress bar but not the single-row table printed by run(): we print our own
    import contextlib
    import io
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        return fn(size, **kw, **extra)


def run_el(case, level, backend, args):
    from adaptmg_problems import elasticity as el
    kw = _time_stepping_kwargs(args, 0.025, backend)
    if args.quiet:
        return el.run(case, level, **kw)
    return _run_verbose(lambda lv, **k: el.run(case, lv, **k), level, kw)


def table(problem, sizes, backends, results, extra_cols):
    rows = []
    for s in sizes:
        row = {}
        for be in backends:
            r = results[(s, be)]
            row.update({f"{be}_{p}": r["timings"][p] for p in PHASES})
            row.update({k: r.get(k) for k, _ in extra_cols})
            row["iters"] = max(r["iterations"])
            if "l2" in r:
                row["l2"] = r["l2"]
        if len(backends) == 2:
            a, b = (results[(s, "gpu")]["timings"], results[(s, "cpu")]["timings"])
            row["ratio_solve"] = a["solve"] / b["solve"] if b["solve"] else None
            row["ratio_sum"] = a["sum"] / b["sum"] if b["sum"] else None
        row["size"] = s
        rows.append(row)
    cols = [("size", "level" if problem == "elasticity" else "n")] + list(extra_cols)
    for be in backends:
        cols += [(f"{be}_{p}", f"{be.upper()} {p}") for p in PHASES]
    cols.append(("iters", "it/step"))
    if problem == "transport-diffusion":
        cols.append(("l2", "L2 error", ".3e"))
    if len(backends) == 2:
        cols += [("ratio_solve", "GPU/CPU solve", ".3f"), ("ratio_sum", "GPU/CPU sum", ".3f")]
    return rows, cols


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("problem", choices=["transport-diffusion", "td", "elasticity", "el"])
    ap.add_argument("--backend", nargs="+", default=["auto"], choices=["auto", "cpu", "gpu"])
    ap.add_argument("--n", type=int, nargs="+", default=[7], help="transport-diffusion: h = 2^-n")
    ap.add_argument("--case", default="edge", choices=["face", "edge", "vertex"])
    ap.add_argument("--level", type=int, nargs="+", default=[3], help="elasticity mesh levels")
    ap.add_argument("--dt", type=float, default=None)
    ap.add_argument("--T", type=float, default=None)
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--rtol", type=float, default=None)
    ap.add_argument("--tol", default=None, choices=["rhs", "residual"],
                    help="GMRES stopping test: ||r|| <= rtol ||b|| (rhs, default) or per-step "
                         "reduction of the initial residual by rtol (residual)")
    ap.add_argument("--no-error", action="store_true", help="skip the host L2 error")
    ap.add_argument("--quiet", action="store_true", help="no progress bar")
    args = ap.parse_args(argv)
    problem = {"td": "transport-diffusion", "el": "elasticity"}.get(args.problem, args.problem)
    from adaptmg.backend import get_backend
    backends = []
    for b in args.backend:
        name = get_backend(b).name
        if name not in backends:
            backends.append(name)
    results = {}
    if problem == "transport-diffusion":
        sizes, extra = args.n, [("dofs", "DOFs")]
        for s in sizes:
            for be in backends:
                results[(s, be)] = run_td(s, be, args)
        title = f"transport-diffusion (seed 001 Table 1 layout), seconds"
    else:
        sizes = args.level
        extra = [("nodes", "nodes"), ("hanging_pct", "hanging %"),
                 ("hanging_edge_pct", "edge-hanging %"), ("dofs", "DOFs")]
        for s in sizes:
            for be in backends:
                results[(s, be)] = run_el(args.case, s, be, args)
        title = f"elasticity, refinement towards a {args.case} (seed 001 Table 3 layout), seconds"
    r0 = results[(sizes[0], backends[0])]
    title += f"; {r0['steps']} steps, dt={r0['dt']}"
    rows, cols = table(problem, sizes, backends, results, extra)
    print(format_table(rows, cols, title=title))
    return results


if __name__ == "__main__":
    main()
