r"""Block multicolour Gauss-Seidel vs block Jacobi in the multigrid of issue 4's 3-D elasticity.

Issue 4's problem (:mod:`adaptmg_problems.elasticity`): the unit cube, lambda = 8e4,
mu = 2e4, homogeneous Dirichlet conditions, adaptive hexahedral meshes refined towards an
edge (or a face / vertex), ``make_mesh(case, level)``.  The same geometric multigrid
(rediscretised Q1 levels down to the 4x4x4 box, direct coarse solve, V(2,2)) is built with
the node-block smoother swapped:

* ``block_jacobi``: damped block Jacobi over the node blocks, omega = 4 / (3 lambda_max)
  per level (the hierarchy default);
* ``block_gauss_seidel``: symmetric multicolour block Gauss-Seidel over the node blocks
  (:mod:`adaptmg.multilevel.gauss_seidel`, colouring of the node graph on the solver's
  backend);
* ``gsfb_fine_bj_coarse``: as ``gs_fine_bj_coarse``, with forward sweeps before the coarse
  correction and backward ones after it (``smoother_kwargs=({"sweep": "forward"}, {})``; the
  others sweep symmetrically, forward then backward, twice the launches);
* ``gs_fine_bj_coarse`` / ``gs_fine2_bj_coarse``: block GS on the finest one / two levels and
  block Jacobi (omega auto per level) below -- ``smoother=("block_gauss_seidel",
  "block_jacobi")``: on the GPU a GS sweep is one launch per colour, which the small,
  launch-bound levels pay in full.

``--smoothers`` picks the rows (default all four).

Three parts (``--parts``):

``static``  the SPD elasticity operator (3 components per node):
            - the V(2,2) contraction factor ``(||r_k|| / ||r_0||)^(1/k)`` of the stationary
              cycle on ``A x = 0`` from a random start, ``k = --cycles``;
            - CG iterations (``accel="cg"``) to ``rtol = --rtol`` (issue 4's 1e-8), the solve
              time per CG iteration and one V-cycle alone (the preconditioner's application,
              a CUDA graph on the GPU; mean of 10, median of ``--repeat``), each also as a
              ratio to the block-Jacobi row; the levels smoothed by GS, the colour-kernel
              launches per V-cycle and the passes over the finest ``A`` its GS smoothing and
              residual read (``fine_passes``: the split layout reuses half-products,
              :func:`fine_passes`);
            - set-up time of ``adaptmg.multigrid`` (assembly + hierarchy + smoothers; median
              of ``--repeat`` after a warm-up) with its split by task (``setup_timeline``:
              host wall clock of the finest level's assembly and constraining, all levels'
              assemblies, constrainings and transfers, the solver's own set-up), of the
              finest level's smoother alone (and of its colouring), and the solve time
              (median of ``--repeat`` after a warm-up; on the GPU the device is synchronised
              around each timed region).
            The form is ``functools.partial(assemble.elasticity, lam=.., mu=..)``: it takes
            ``device`` and ``keep_on_device``, so on the GPU every level is assembled and
            constrained on the device; ``--form lambda`` passes ``lambda s:
            assemble.elasticity(s, lam, mu)`` instead, which multigrid calls as is (the host
            assembly and constraining, moved up afterwards: the figures before issue 36).
``sweep``   the finest level alone: ``smooth(x, b, 2)`` of block Jacobi and of block GS for
            each ``--gs-layout`` (csr, bsr, split) and ``--gs-tpr`` (threads per node row), and each
            smoother's set-up on the device matrix (the GS kernels' tuning table);
``system``  issue 4's time-stepping system ([[M, -dt M], [dt A, M]], 6 components per node,
            GMRES + V-cycle, ``adaptmg_problems.elasticity.run``) with the smoother swapped:
            init / rhs / solve times and GMRES iterations of ``--steps`` backward-Euler steps
            (median of ``--repeat`` runs after a 2-step warm-up), and the V(2,2) contraction
            factor of the system's hierarchy.

Run on the CPU at a small size (about ten seconds)::

    python scripts/bench_elasticity_gs.py --backend cpu --size 2 --steps 3 --repeat 1

and on the GPU (the issue's device figures; ``--gs-layout bsr,csr,split`` gives a block-GS row
per layout of its colour kernels: the node rows stored as c x c blocks, the default
:data:`adaptmg.device.gs_kernels.BLOCK_LAYOUT`, as CSR slices, or as blocks split by the
colour of their column with the half-products reused across alternating sweeps)::

    python scripts/bench_elasticity_gs.py --backend gpu --size 10 --parts static --repeat 5 \
        --smoothers block_jacobi,gs_fine_bj_coarse --gs-layout bsr,split

    python scripts/bench_elasticity_gs.py --backend gpu --size 6 --out elasticity_gs.json
    python scripts/bench_elasticity_gs.py --backend gpu --size 10 --parts static --repeat 3
    python scripts/bench_elasticity_gs.py --backend gpu --size 6 --parts static --repeat 3
    python scripts/bench_elasticity_gs.py --backend gpu --case face --size 5 --parts system
"""
from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import sys
import time
import warnings

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import adaptmg  # noqa: E402
from adaptmg import Space, assemble  # noqa: E402
from adaptmg.backend import get_backend, to_host  # noqa: E402
from adaptmg.device import gs_kernels  # noqa: E402
from adaptmg.multilevel.coloring import color_graph  # noqa: E402
from adaptmg.multilevel.smoothers import make_smoother, smoother_setup_kwargs  # noqa: E402

#: the rows ``--smoothers`` selects: label -> ``multigrid``'s ``smoother`` (a sequence: finest
#: level first, the last entry for all coarser levels)
SMOOTHERS = {
    "block_jacobi": "block_jacobi",
    "block_gauss_seidel": "block_gauss_seidel",
    "gs_fine_bj_coarse": ("block_gauss_seidel", "block_jacobi"),
    "gs_fine2_bj_coarse": ("block_gauss_seidel", "block_gauss_seidel", "block_jacobi"),
    "gsfb_fine_bj_coarse": ("block_gauss_seidel", "block_jacobi"),
}
#: ``multigrid``'s ``smoother_kwargs`` of a row (None: the defaults, symmetric GS sweeps):
#: ``gsfb_fine_bj_coarse`` pre-smooths with forward sweeps and post-smooths with their adjoint,
#: backward sweeps (the cycle stays symmetric), as many one-way sweeps as block Jacobi's steps
SMOOTHER_KWARGS = {"gsfb_fine_bj_coarse": ({"sweep": "forward"}, {})}


def _el():
    from adaptmg_problems import elasticity as el
    return el


def timed(be, fn):
    """(result, seconds) of ``fn()``, the device synchronised before and after."""
    be.synchronize()
    t = time.perf_counter()
    out = fn()
    be.synchronize()
    return out, time.perf_counter() - t


def contraction(ml, cycles, seed=7):
    """V-cycle residual contraction ``(||r_k|| / ||r_0||)^(1/k)`` on ``A x = 0`` from a random
    start (zero on the constrained DoFs)."""
    n = ml.A.shape[0]
    x0 = np.random.default_rng(seed).standard_normal(n)
    x0[~ml.constraints[-1].free] = 0.0
    res = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ml.solve(np.zeros(n), x0=x0, rtol=1e-300, maxiter=cycles, residuals=res)
    return float((res[-1] / res[0]) ** (1.0 / cycles))


#: ``setup_timeline`` task kinds summed over the levels (the name up to the level number)
SPLIT_KINDS = ("assemble", "constrain", "transfer", "constraints", "space")


def setup_split(ml):
    """Seconds of the set-up's tasks from ``ml.setup_timeline`` (host wall clock, spans of
    tasks on other threads overlap): the finest level's assembly and constraining, each kind
    of :data:`SPLIT_KINDS` summed over its levels, and the solver's own set-up."""
    rows = getattr(ml, "setup_timeline", [])
    out = {}
    tasks = [(*task.rpartition(" ")[::2], a, b) for task, _, a, b in rows]
    fine = max((int(lev) for kind, lev, _, _ in tasks if kind == "assemble" and lev.isdigit()), default=-1)
    for kind, lev, a, b in tasks:
        if lev.isdigit() and kind in SPLIT_KINDS:
            out[f"{kind}_s"] = out.get(f"{kind}_s", 0.0) + (b - a)
            if int(lev) == fine and kind in ("assemble", "constrain"):
                out[f"{kind}_fine_s"] = b - a
    for task, _, a, b in rows:
        if task.startswith("solver set-up"):
            out["solver_s"] = b - a
        elif task == "algebraic levels":
            out["algebraic_s"] = b - a
    return out


def levels_of(mesh, levels):
    return None if levels == "all" else (len(mesh.hierarchy()) - 1 if levels is None else int(levels))


def runs_of(args):
    """(row label, GPU block layout) of each row: each of ``--smoothers``, those with block GS on
    a level once per ``--gs-layout``."""
    return [(name, lay) for name in args.smoothers
            for lay in (args.gs_layout if uses_gs(name) else ["csr"])]


def uses_gs(name):
    spec = SMOOTHERS[name]
    return "block_gauss_seidel" in ((spec,) if isinstance(spec, str) else spec)


def finest_spec(name):
    spec = SMOOTHERS[name]
    return spec if isinstance(spec, str) else spec[0]


def colour_launches(ml):
    """Per V-cycle: the levels smoothed by (block) Gauss-Seidel and the colour-kernel launches of
    their pre- and post-smoothing (``presmooth`` sweeps forward-backward, ``postsmooth``
    adjoint sweeps; the no-op repeats of the turning colour skipped as the smoother does)."""
    gs = [d.smoother for d in ml._dev if hasattr(d.smoother, "_orders")]
    n = sum(len(sm._orders(sm.sweep, ml.presmooth)) + len(sm._orders(sm.sweep, ml.postsmooth)) for sm in gs)
    return len(gs), n


def fine_passes(ml):
    """Passes over the finest level's ``A`` that its (block) Gauss-Seidel smoothing and the
    restriction's residual read per V-cycle (pre-smoothing from zero, post-smoothing from the
    corrected ``x``; the no-op repeats of the turning colour skipped): stored blocks read over
    stored blocks.  The split layout (:mod:`adaptmg.device.gs_split`) reads only the halves it
    does not reuse, and forms the residual from them; the others read every row of each colour
    they update, and the residual is one pass.  None when the finest level is not smoothed by GS."""
    sm = ml._dev[-1].smoother
    plan = getattr(sm, "_plan", None)
    if plan is None or not hasattr(sm, "_orders"):
        return None
    pre, post = sm._orders(sm.sweep, ml.presmooth), sm._orders(sm.sweep, ml.postsmooth)
    if hasattr(plan, "reads"):
        full = sum(nb for nb, _ in plan.blocks) + sum(plan.sizes)
        return (plan.reads(pre, True, residual=sm.forms_residual) + plan.reads(post, False)) / full \
            + (0 if sm.forms_residual else 1)
    ptr = np.asarray(to_host(sm._Acsr.indptr), dtype=np.int64)
    c = sm.block_size
    per = [float(np.sum(ptr[to_host(g) * c + c] - ptr[to_host(g) * c])) / ptr[-1] for g in sm._groups]
    return float(sum(per[k] for k in pre + post)) + 1


def add_ratios(rows, key, ref="block_jacobi"):
    """``{key}_vs_bj``: each row's ``key`` over the block-Jacobi row's (None without that row)."""
    base = next((r[key] for r in rows if r["smoother"] == ref), None)
    for r in rows:
        r[f"{key}_vs_bj"] = r[key] / base if base else None


# --------------------------------------------------------------------------- static (SPD, CG)
def part_static(args, be, log):
    el = _el()
    mesh = el.make_mesh(args.case, args.size)
    space = Space(mesh, 1, components=3)
    if args.form == "partial":      # takes device/keep_on_device: built and constrained on the GPU
        form = functools.partial(assemble.elasticity, lam=el.LAMBDA, mu=el.MU)
    else:                           # called as is: the host path
        form = lambda s: assemble.elasticity(s, el.LAMBDA, el.MU)          # noqa: E731
    rows, default = [], gs_kernels.BLOCK_LAYOUT
    for name, layout in runs_of(args):
        gs_kernels.BLOCK_LAYOUT = layout
        fine_name = finest_spec(name)
        build = lambda: adaptmg.multigrid(space, form, dirichlet="all", smoother=SMOOTHERS[name],  # noqa: E731
                                          smoother_kwargs=SMOOTHER_KWARGS.get(name), backend=be, max_levels=levels_of(mesh, args.levels),
                                          near_nullspace="rigid_body")
        ml = build()                                                    # warm-up (kernels compiled)
        runs = []
        for _ in range(args.repeat):                                    # one hierarchy alive at a time
            ml = None
            ml, t = timed(be, build)
            runs.append((t, setup_split(ml)))
        t_setup = float(np.median([t for t, _ in runs]))
        split = min(runs, key=lambda r: abs(r[0] - t_setup))[1]         # the run nearest the median
        fine = ml._dev[-1]
        kw = smoother_setup_kwargs(fine_name, (SMOOTHER_KWARGS.get(name) or (None,))[0], block_size=3,
                                   auto_omega=True)
        sm_setup = timed(be, lambda: make_smoother(fine_name, fine.A, backend=be, **kw))[1]
        # the node-graph colouring alone, on the solver's backend (kernels compiled above)
        col_s = timed(be, lambda: color_graph(fine.A, 3))[1] if fine_name.endswith("seidel") else None
        rho = contraction(ml, args.cycles)
        n = ml.A.shape[0]
        b = np.random.default_rng(3).standard_normal(n)
        b[~ml.constraints[-1].free] = 0.0
        bd = be.asarray(b)
        its = []
        x = ml.solve(bd, rtol=args.rtol, accel="cg", callback=lambda xk: its.append(1))
        r = float(np.linalg.norm(to_host(bd) - ml.A @ to_host(x)) / np.linalg.norm(b))
        ml.solve(bd, rtol=args.rtol, accel="cg")                        # warm-up (graph capture)
        ts = [timed(be, lambda: ml.solve(bd, rtol=args.rtol, accel="cg"))[1] for _ in range(args.repeat)]
        # one V-cycle alone: the preconditioner that solve() applies (a CUDA graph on the GPU)
        M = ml.aspreconditioner()
        M.matvec(bd)                                                    # warm-up (capture)
        tv = [timed(be, lambda: [M.matvec(bd) for _ in range(10)])[1] / 10 for _ in range(args.repeat)]
        sm = fine.smoother
        label = name if not uses_gs(name) or layout == default else f"{name}[{layout}]"
        gs_levels, launches = colour_launches(ml)
        solve_s = float(np.median(ts))
        row = dict(smoother=label, dofs=int(n), levels=len(ml.levels), colors=getattr(sm, "ncolors", None),
                   gs_levels=gs_levels, colour_launches=launches, fine_passes=fine_passes(ml),
                   setup_s=t_setup, smoother_setup_s=sm_setup, coloring_s=col_s, factor=rho, cg_iters=len(its),
                   rel_residual=r, solve_s=solve_s, it_ms=1e3 * solve_s / max(len(its), 1),
                   vcycle_ms=1e3 * float(np.median(tv)), **split)
        rows.append(row)
        log(f"  static {label}: {row}")
    gs_kernels.BLOCK_LAYOUT = default
    for key in ("solve_s", "it_ms", "vcycle_ms"):
        add_ratios(rows, key)
    return rows


# --------------------------------------------------------------------------- sweep (one level)
def part_sweep(args, be, log):
    """The finest level's smoothing alone: ``smooth(x, b, 2)`` (V(2,2)'s pre-smoothing) of block
    Jacobi and of symmetric block GS per ``--gs-layout`` x ``--gs-tpr``, median of ``--repeat``
    x 5 calls, and each smoother's set-up on the device matrix."""
    el = _el()
    space = Space(el.make_mesh(args.case, args.size), 1, components=3)
    form = functools.partial(assemble.elasticity, lam=el.LAMBDA, mu=el.MU)   # the device set-up
    ml = adaptmg.multigrid(space, form, dirichlet="all", smoother="block_jacobi", backend=be,
                           max_levels=1, max_coarse=None, coarse="smoother")
    A = ml._dev[-1].A
    n = A.shape[0]
    b = be.asarray(np.random.default_rng(3).standard_normal(n))
    x = be.xp.zeros(n)
    cases = [("block_jacobi", "csr", None)] + [("block_gauss_seidel", lay, tpr) for lay in args.gs_layout
                                               for tpr in args.gs_tpr]
    rows, default = [], (gs_kernels.BLOCK_LAYOUT, gs_kernels.THREADS_PER_ROW)
    for name, layout, tpr in cases:
        gs_kernels.BLOCK_LAYOUT, gs_kernels.THREADS_PER_ROW = layout, tpr
        kw = smoother_setup_kwargs(name, None, block_size=3, auto_omega=True)
        sm, t_setup = timed(be, lambda: make_smoother(name, A, backend=be, **kw))
        sm.smooth(x, b, 2)                                              # warm-up (compiles)
        ts = [timed(be, lambda: [sm.smooth(x, b, 2) for _ in range(5)])[1] / 5 for _ in range(args.repeat)]
        plan = getattr(sm, "_plan", None)
        rows.append(dict(smoother=name if plan is None else f"{name}[{layout}]", dofs=int(n),
                         tpr=getattr(plan, "_tpr", None), colors=getattr(sm, "ncolors", None),
                         setup_s=t_setup, smooth2_ms=1e3 * float(np.median(ts))))
        log(f"  sweep {rows[-1]}")
    gs_kernels.BLOCK_LAYOUT, gs_kernels.THREADS_PER_ROW = default
    for r in rows:
        r["vs_bj"] = r["smooth2_ms"] / rows[0]["smooth2_ms"]
    return rows


# --------------------------------------------------------------------------- system (GMRES)
@contextlib.contextmanager
def smoother_in_run(name, smoother_kwargs=None):
    """``adaptmg_problems.elasticity.run`` with its multigrid's smoother replaced by ``name``
    (and ``smoother_kwargs``; everything else -- levels, near-nullspace, dtype -- as the problem
    builds it)."""
    el = _el()
    orig = el.multigrid

    def mg(*a, **kw):
        kw["smoother"] = name
        kw["smoother_kwargs"] = smoother_kwargs
        return orig(*a, **kw)
    el.multigrid = mg
    try:
        yield el
    finally:
        el.multigrid = orig


def part_system(args, be, log):
    rows = []
    for name in args.smoothers:
        with smoother_in_run(SMOOTHERS[name], SMOOTHER_KWARGS.get(name)) as el:
            kw = dict(backend=be, quiet=True, tol=args.tol, rtol=args.system_rtol, levels=args.levels)
            el.run(args.case, args.size, steps=2, **kw)                 # warm-up
            runs = [el.run(args.case, args.size, steps=args.steps, **kw) for _ in range(args.repeat)]
        med = {k: float(np.median([r["timings"][k] for r in runs])) for k in ("init", "rhs", "solve")}
        r0 = runs[0]
        ml = r0["solver"]
        its = r0["iterations"]
        row = dict(smoother=name, dofs=int(r0["dofs"]), levels=r0["levels"],
                   colors=getattr(ml._dev[-1].smoother, "ncolors", None), steps=r0["steps"],
                   **{f"{k}_s": v for k, v in med.items()},
                   gmres_iters_total=int(np.sum(its)), gmres_iters_max=int(np.max(its)),
                   not_converged=int(r0["not_converged"]), factor=contraction(ml, args.cycles))
        rows.append(row)
        log(f"  system {name}: {row}")
    return rows


def table(rows, cols):
    head = " | ".join(f"{c:>18}" for c in cols)
    lines = [head, "-" * len(head)]
    for r in rows:
        cells = []
        for c in cols:
            v = r.get(c)
            cells.append(f"{v:>18.4g}" if isinstance(v, float) else f"{str(v):>18}")
        lines.append(" | ".join(cells))
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--backend", default="auto", choices=("auto", "cpu", "gpu"))
    ap.add_argument("--case", default="edge", choices=("edge", "face", "vertex"))
    ap.add_argument("--size", type=int, default=5, help="mesh level of make_mesh (issue 4: edge <= 6, face <= 5)")
    ap.add_argument("--levels", default=None, help="multigrid levels ('all' or a number; default as issue 4)")
    ap.add_argument("--parts", default="static,system")
    ap.add_argument("--form", default="partial", choices=("partial", "lambda"),
                    help="static part: the elasticity form as a partial (device set-up on the GPU) "
                         "or a lambda (host set-up)")
    ap.add_argument("--cycles", type=int, default=10, help="V-cycles for the contraction factor")
    ap.add_argument("--rtol", type=float, default=1e-8, help="CG tolerance of the static part")
    ap.add_argument("--steps", type=int, default=100, help="time steps of the system part")
    ap.add_argument("--tol", default="residual", choices=("residual", "rhs"),
                    help="GMRES stopping test of the system part (see elasticity.run)")
    ap.add_argument("--system-rtol", type=float, default=1e-6)
    ap.add_argument("--repeat", type=int, default=3, help="timed repetitions (median)")
    ap.add_argument("--smoothers", default=",".join(SMOOTHERS),
                    help="rows of the static and system parts, comma-separated: " + ", ".join(SMOOTHERS)
                    + " (gs_fine*_bj_coarse: block GS on the finest one / two levels, block Jacobi below)")
    ap.add_argument("--gs-layout", default=gs_kernels.BLOCK_LAYOUT,
                    help="block GS plan layout(s), comma-separated: bsr, csr (GPU kernels; the host "
                         "reads full rows with both), split (halves reused across alternating sweeps, "
                         "GPU and host) (default: adaptmg.device.gs_kernels.BLOCK_LAYOUT, the "
                         "library's); each gets a static row")
    ap.add_argument("--gs-tpr", default="auto",
                    help="part sweep: GPU threads per (node) row of the block GS kernels, comma-separated "
                         "(auto = gs_threads_per_row, or 1, 2, 4, 8, 16, 32)")
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    args = ap.parse_args(argv)
    if args.size < 1 or args.repeat < 1 or args.cycles < 1 or args.steps < 1:
        ap.error("--size, --repeat, --cycles and --steps must be positive")
    args.gs_layout = [g.strip() for g in args.gs_layout.split(",") if g.strip()]
    args.smoothers = [g.strip() for g in args.smoothers.split(",") if g.strip()]
    if not args.smoothers or set(args.smoothers) - set(SMOOTHERS):
        ap.error(f"--smoothers: a comma-separated list of {', '.join(SMOOTHERS)}")
    if not args.gs_layout or set(args.gs_layout) - set(gs_kernels.LAYOUTS):
        ap.error(f"--gs-layout: a comma-separated list of {', '.join(gs_kernels.LAYOUTS)}")
    try:
        args.gs_tpr = [None if t.strip() == "auto" else int(t) for t in args.gs_tpr.split(",") if t.strip()]
    except ValueError:
        ap.error("--gs-tpr: a comma-separated list of auto, 1, 2, 4, 8, 16, 32")
    if not args.gs_tpr or set(args.gs_tpr) - {None, 1, 2, 4, 8, 16, 32}:
        ap.error("--gs-tpr: a comma-separated list of auto, 1, 2, 4, 8, 16, 32")
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    bad = set(parts) - {"static", "system", "sweep"}
    if bad:
        ap.error(f"unknown parts {sorted(bad)}; choose from static, system, sweep")
    be = get_backend(args.backend)
    log = lambda s: print(s, flush=True)                                # noqa: E731
    dev = be.name
    if be.is_gpu:
        dev += f" ({be.xp.cuda.runtime.getDeviceProperties(0)['name'].decode()})"
    log(f"elasticity {args.case} level {args.size}, backend {dev}")
    out = dict(case=args.case, size=args.size, backend=be.name, args=vars(args))
    if "static" in parts:
        out["static"] = part_static(args, be, log)
        log(table(out["static"], ["smoother", "dofs", "levels", "colors", "gs_levels", "colour_launches",
                                  "fine_passes", "factor", "cg_iters", "setup_s", "smoother_setup_s", "coloring_s"]))
        log("solve (CG to --rtol), one CG iteration and one V-cycle (preconditioner application), "
            "and each over block Jacobi's:")
        log(table(out["static"], ["smoother", "cg_iters", "solve_s", "solve_s_vs_bj", "it_ms", "it_ms_vs_bj",
                                  "vcycle_ms", "vcycle_ms_vs_bj"]))
        log("set-up split (host wall clock of the tasks; kinds summed over the levels):")
        log(table(out["static"], ["smoother", "setup_s", "assemble_fine_s", "constrain_fine_s", "assemble_s",
                                  "constrain_s", "transfer_s", "constraints_s", "solver_s"]))
    if "sweep" in parts:
        out["sweep"] = part_sweep(args, be, log)
        log(table(out["sweep"], ["smoother", "dofs", "colors", "tpr", "setup_s", "smooth2_ms", "vs_bj"]))
    if "system" in parts:
        out["system"] = part_system(args, be, log)
        log(table(out["system"], ["smoother", "dofs", "colors", "factor", "gmres_iters_total",
                                  "gmres_iters_max", "init_s", "solve_s"]))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1, default=str)
    return out


if __name__ == "__main__":
    main()
