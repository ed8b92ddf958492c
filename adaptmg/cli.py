"""The ``adaptmg`` command (also ``python -m adaptmg``).

::

    adaptmg run <problem> [problem options] [--backend auto|cpu|gpu] [--out DIR] [--quiet]
    adaptmg list                      # problems and their options
    adaptmg info                      # backend, device, versions
    adaptmg bench <name> [args...]    # runs scripts/bench_<name>.py

Problems are the modules (or subpackages) of the installed package
``adaptmg_problems`` (the repository folder ``problems/``) that define a ``run``
function; they are found at run time with :func:`pkgutil.iter_modules`.  A problem
module that fails to import is reported with its exception by ``adaptmg list`` and
makes ``adaptmg run <problem>`` exit with status 1 and the message.  A problem's
options come from its ``OPTIONS`` dict
(``{"name": {"type": int, "default": 4, "help": "..."}}``) if it has one,
else from the keyword parameters of ``run`` with int / float / str / bool
defaults or annotations (``n: int = 7`` -> ``--n 7``; bools get
``--flag/--no-flag``).  ``backend``, ``quiet`` and ``out`` are the common
options.  The CLI does not pass ``out`` to ``run`` (problems differ in what
they make of it); instead it writes the returned fields as VTU and a PNG
summary (convergence history + timing bars) into ``--out``.  Under an MPI launcher
(``mpiexec -n 4 python -m adaptmg run poisson``) every rank runs the problem (a problem
that supports it solves distributed, :mod:`adaptmg.distributed`) and only rank 0 prints
and writes the outputs.

Exit status: 0 on success, 2 for bad arguments (argparse's message), 1 when a
run fails or a problem module does not import (message on stderr, no traceback
unless ``ADAPTMG_DEBUG`` is set).
"""
from __future__ import annotations

import argparse
import importlib
import inspect
import os
import pkgutil
import re
import sys
import time
import traceback
import typing
from pathlib import Path

from .backend import to_host

__all__ = ["main", "discover_problems", "load_problem", "problem_options", "ProblemImportError",
           "PROBLEMS_PACKAGE"]

#: the installed package whose modules with a ``run()`` are the problems
PROBLEMS_PACKAGE = "adaptmg_problems"
COMMON = ("backend", "quiet", "out")
_SIMPLE = {"int": int, "float": float, "str": str, "bool": bool}


class ProblemImportError(ImportError):
    """A module of :data:`PROBLEMS_PACKAGE` raised while being imported (the cause is chained)."""


# ------------------------------------------------------------------ discovery
def _problems_package():
    """The installed problems package, or None when it is not installed."""
    try:
        return importlib.import_module(PROBLEMS_PACKAGE)
    except ModuleNotFoundError as exc:
        if exc.name != PROBLEMS_PACKAGE:
            raise
        return None


def discover_problems():
    """Names of the candidate problems, without importing them: the modules and subpackages
    of :data:`PROBLEMS_PACKAGE` whose names do not start with '_' (a candidate is a problem
    if it defines ``run``, see :func:`load_problem`)."""
    pkg = _problems_package()
    if pkg is None:
        return []
    return sorted(m.name for m in pkgutil.iter_modules(pkg.__path__) if not m.name.startswith("_"))


def load_problem(name):
    """Import ``adaptmg_problems.<name>``: the module if it defines ``run()``, else None.

    Raises :class:`ProblemImportError`, with the original exception chained, when the
    module fails to import.
    """
    modname = f"{PROBLEMS_PACKAGE}.{name}"
    try:
        mod = importlib.import_module(modname)
    # The CLI boundary with application code: a problem module may fail to import with any
    # exception (a missing optional dependency, a bug while it is being edited).  Nothing is
    # swallowed: the exception is re-raised, chained, as ProblemImportError, which
    # `adaptmg list` reports and `adaptmg run` turns into exit status 1 with the message.
    except Exception as exc:  # noqa: BLE001 - see the comment above
        raise ProblemImportError(f"problem {name!r} ({modname}) failed to import: "
                                 f"{type(exc).__name__}: {exc}", name=modname) from exc
    return mod if callable(getattr(mod, "run", None)) else None


def _annotation_type(ann, default):
    """int/float/str/bool (or None) for an annotation (possibly a string) or the default's type."""
    if isinstance(ann, str):
        parts = [s.strip() for s in re.split(r"\|", ann.replace("Optional[", "").rstrip("]"))]
        parts = [s for s in parts if s != "None"]
        if len(parts) == 1 and parts[0] in _SIMPLE:
            return _SIMPLE[parts[0]]
    elif ann in (int, float, str, bool):
        return ann
    elif ann is not inspect.Parameter.empty:
        args = [a for a in typing.get_args(ann) if a is not type(None)]
        if len(args) == 1 and args[0] in (int, float, str, bool):
            return args[0]
    if isinstance(default, bool):
        return bool
    if isinstance(default, (int, float, str)):
        return type(default)
    return None


def problem_options(mod):
    """List of (name, type, default, help) for a problem module."""
    opts = []
    declared = getattr(mod, "OPTIONS", None)
    if isinstance(declared, dict):
        for name, spec in declared.items():
            spec = spec if isinstance(spec, dict) else {"default": spec}
            default = spec.get("default")
            typ = spec.get("type") or _annotation_type(inspect.Parameter.empty, default) or str
            opts.append((name, typ, default, spec.get("help", "")))
        return opts
    sig = inspect.signature(mod.run)
    for p in sig.parameters.values():
        if p.name in COMMON or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        default = None if p.default is inspect.Parameter.empty else p.default
        typ = _annotation_type(p.annotation, default)
        if typ is None:
            continue                      # tuples, arrays, callables: not a command-line option
        opts.append((p.name, typ, default, ""))
    return opts


def _describe(mod):
    doc = inspect.getdoc(mod) or ""
    return doc.strip().splitlines()[0] if doc.strip() else ""


# ------------------------------------------------------------------ output
def _write_outputs(name, res, outdir, quiet):
    """VTU of the returned fields and a PNG summary; returns the files written."""
    import numpy as np

    from . import io
    from .fe import Space
    from .mesh import Mesh
    written = []
    os.makedirs(outdir, exist_ok=True)
    mesh = res.get("mesh")
    space = res.get("space")
    if isinstance(mesh, Mesh):
        if not isinstance(space, Space) or space.mesh is not mesh:
            space = None
        fields = dict(res.get("fields") or {})
        if not fields and res.get("u") is not None:
            fields = {"u": res["u"]}
        pd, cd = {}, {}
        for k, v in fields.items():
            a = np.asarray(to_host(v))
            if a.ndim >= 1 and a.shape[0] == mesh.num_cells and (space is None or a.shape[0] != space.num_dofs) \
                    and a.shape[0] != mesh.num_nodes:
                cd[k] = a
            else:
                pd[k] = a
        eta = res.get("eta")
        if eta is not None and getattr(eta, "shape", (0,))[0] == mesh.num_cells:
            cd.setdefault("eta", eta)
        path = Path(outdir) / f"{name}.vtu"
        try:
            io.write(path, mesh, pd, cd, space=space)
            written.append(path)
        except (ValueError, TypeError) as exc:
            print(f"adaptmg: warning: could not write {path}: {exc}", file=sys.stderr)
    try:
        from . import plot
        png = plot.summary(res, Path(outdir) / f"{name}.png", title=name)
        written.append(png)
    except ImportError as exc:
        print(f"adaptmg: warning: no PNG plot ({exc})", file=sys.stderr)
    except ValueError as exc:
        if not quiet:
            print(f"adaptmg: note: no PNG plot ({exc})", file=sys.stderr)
    return written


def _error_of(res):
    for key in ("error", "errors", "l2", "L2"):
        v = res.get(key)
        if isinstance(v, dict) and v:
            return ", ".join(f"{k} {float(x):.3e}" for k, x in v.items()
                             if isinstance(x, (int, float)))
        if isinstance(v, (int, float)):
            return f"{key} {float(v):.3e}"
    hist = res.get("history")
    if isinstance(hist, list) and hist and isinstance(hist[-1], dict):
        e = hist[-1].get("errors")
        if isinstance(e, dict) and e:
            return ", ".join(f"{k} {float(x):.3e}" for k, x in e.items() if isinstance(x, (int, float)))
    return None


# ------------------------------------------------------------------ commands
def _cmd_run(args, parser):
    names = discover_problems()
    if args.problem not in names:
        parser.error(f"unknown problem {args.problem!r}; available: {', '.join(names) or 'none'} "
                     "(see 'adaptmg list')")
    mod = load_problem(args.problem)          # ProblemImportError: exit 1 in main()
    if mod is None:
        parser.error(f"{args.problem!r} is not a problem: {PROBLEMS_PACKAGE}.{args.problem} "
                     "has no run() function")
    p = argparse.ArgumentParser(prog=f"adaptmg run {args.problem}",
                                description=_describe(mod) or None)
    p.add_argument("--backend", choices=["auto", "cpu", "gpu"], default="auto",
                   help="array backend (default: auto = GPU when CuPy sees a device)")
    p.add_argument("--out", default=None, metavar="DIR",
                   help="write <problem>.vtu and <problem>.png into DIR")
    p.add_argument("--quiet", action="store_true", help="no progress bars, no tables")
    opts = problem_options(mod)
    for name, typ, default, hlp in opts:
        flag = "--" + name.replace("_", "-")
        extra = [] if flag == f"--{name}" else [f"--{name}"]
        if typ is bool:
            p.add_argument(flag, *extra, dest=name, action=argparse.BooleanOptionalAction,
                           default=default, help=hlp or None)
        else:
            p.add_argument(flag, *extra, dest=name, type=typ, default=default,
                           required=default is None and name in _required(mod),
                           help=(hlp + " " if hlp else "") + f"(default: {default})")
    ns = p.parse_args(args.rest)
    kwargs = {name: getattr(ns, name) for name, *_ in opts if getattr(ns, name) is not None}
    sig = inspect.signature(mod.run).parameters
    if "backend" in sig:
        kwargs["backend"] = ns.backend
    elif ns.backend == "gpu":
        p.error(f"problem {args.problem!r} has no backend option")
    if "quiet" in sig:
        kwargs["quiet"] = ns.quiet
    from .errors import gpu_memory_guard
    t0 = time.perf_counter()
    try:
        with gpu_memory_guard(f"running problem {args.problem!r} with {kwargs}"):
            res = mod.run(**kwargs)
    except (ValueError, TypeError, RuntimeError, MemoryError) as exc:
        if os.environ.get("ADAPTMG_DEBUG"):
            raise
        print(f"adaptmg run {args.problem}: error: {exc}", file=sys.stderr)
        return 1
    wall = time.perf_counter() - t0
    res = res if isinstance(res, dict) else {}
    from .distributed.comm import launched_rank
    if launched_rank() > 0:         # under mpiexec: rank 0 prints and writes the outputs
        return 0
    files = _write_outputs(args.problem, res, ns.out, ns.quiet) if ns.out else []
    if not ns.quiet:
        err = _error_of(res)
        dofs = res.get("dofs")
        line = f"{args.problem}: done in {wall:.2f} s"
        if dofs is not None:
            line += f", {dofs} DoFs"
        if err:
            line += f", error: {err}"
        print(line)
        for f in files:
            print(f"  wrote {f}")
    return 0


def _required(mod):
    try:
        return {p.name for p in inspect.signature(mod.run).parameters.values()
                if p.default is inspect.Parameter.empty
                and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    except (TypeError, ValueError):
        return set()


def _cmd_list(args, parser):
    if _problems_package() is None:
        print(f"adaptmg list: the package {PROBLEMS_PACKAGE} is not installed "
              "(pip install -e . in the repository)", file=sys.stderr)
        return 1
    failed = 0
    for name in discover_problems():
        try:
            mod = load_problem(name)
        except ProblemImportError as exc:
            failed += 1
            print(f"{name:22s} (import failed: {type(exc.__cause__).__name__}: {exc.__cause__})")
            if os.environ.get("ADAPTMG_DEBUG"):
                traceback.print_exception(exc.__cause__, file=sys.stderr)
            continue
        if mod is None:                   # a helper module, not a problem
            continue
        print(f"{name:22s} {_describe(mod)}")
        opts = problem_options(mod)
        if opts:
            print(" " * 23 + " ".join(f"--{n.replace('_', '-')} {d!r}" for n, _, d, _ in opts))
    if failed:
        print(f"adaptmg list: {failed} problem module(s) failed to import "
              "(ADAPTMG_DEBUG=1 shows the tracebacks)", file=sys.stderr)
        return 1
    return 0


def _version(dist_names, module=None):
    from importlib import metadata
    for d in dist_names:
        try:
            return metadata.version(d)
        except metadata.PackageNotFoundError:
            continue
    if module is not None:
        try:
            return getattr(importlib.import_module(module), "__version__", "installed")
        except ImportError:
            pass
    return "not installed"


def _cmd_info(args, parser):
    import platform

    from . import __version__
    from .backend import _cupy_status, get_backend
    be = get_backend("auto")
    print(f"adaptmg    {__version__}")
    print(f"python     {platform.python_version()} ({platform.platform()})")
    print(f"backend    auto -> {be.name}")
    cupy, _, reason = _cupy_status()
    if cupy is not None:
        try:
            props = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)
            name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
            free, total = cupy.cuda.runtime.memGetInfo()
            print(f"device     {name}, {total / 2**30:.1f} GiB ({free / 2**30:.1f} GiB free), "
                  f"CUDA runtime {cupy.cuda.runtime.runtimeGetVersion()}")
        except cupy.cuda.runtime.CUDARuntimeError as exc:  # pragma: no cover - device specific
            print(f"device     present, properties unavailable ({exc})")
    else:
        print(f"device     none ({reason})")
    from .device.kernel_cache import cache_dir, installed
    print(f"kernels    {cache_dir() or 'adaptmg cache off'}"
          f"{' (layered under CuPy cache)' if installed() else ''}")
    for label, dists, mod in (("numpy", ["numpy"], "numpy"), ("scipy", ["scipy"], "scipy"),
                              ("cupy", ["cupy-cuda13x", "cupy-cuda12x", "cupy-cuda11x", "cupy"], None),
                              ("pyamg", ["pyamg"], "pyamg"), ("meshio", ["meshio"], "meshio"),
                              ("rich", ["rich"], None), ("matplotlib", ["matplotlib"], None)):
        v = _version(dists, mod)
        if label == "cupy" and v == "not installed" and cupy is not None:
            v = cupy.__version__
        print(f"{label:11s}{v}")
    return 0


def _cmd_warmup(args, parser):
    from .backend import gpu_available
    from .device.warmup import TASKS, warmup
    if args.manifest and (args.tasks or args.record):
        parser.error("--manifest compiles the shipped manifest: it takes neither --tasks nor --record")
    if args.bundle is not None:
        return _warmup_bundle(args, parser)
    if args.out is not None:
        parser.error("--out goes with --bundle")
    if args.manifest:                          # the GPU check below must not start them in the background
        from .device import kernel_manifest as km
        km.hold_background()
    if not gpu_available():
        print("adaptmg warmup: no GPU visible (nothing to compile)", file=sys.stderr)
        return 1
    if args.manifest:
        return _warmup_manifest(args.jobs, args.quiet)
    os.environ["ADAPTMG_PREFETCH"] = "0"       # the warm-up compiles itself (and may record)
    tasks = None if not args.tasks else args.tasks.split(",")
    if tasks:
        bad = [t for t in tasks if t not in TASKS]
        if bad:
            parser.error(f"unknown warm-up tasks {bad}; known: {', '.join(TASKS)}")
    res = warmup(tasks, jobs=args.jobs, quiet=args.quiet, record=args.record)
    return 0 if all(ok for ok, _, _ in res.values()) else 1


def _warmup_bundle(args, parser):
    """``adaptmg warmup --bundle 80,90``: the shipped manifest compiled for each architecture and
    written as the package's cubin files (:func:`adaptmg.device.kernel_bundle.build`)."""
    if args.manifest or args.tasks or args.record:
        parser.error("--bundle builds from the shipped manifest: it takes no --manifest, --tasks or --record")
    archs = [a.strip().removeprefix("sm_") for a in args.bundle.split(",") if a.strip()]
    if not archs or not all(a.isdigit() and 50 <= int(a) < 1000 for a in archs):
        parser.error(f"--bundle takes comma-separated compute capabilities such as 80,90,120, got {args.bundle!r}")
    try:
        import cupy.cuda.compiler  # noqa: F401 - NVRTC is what builds them; no GPU needed
    except ImportError as exc:
        print(f"adaptmg warmup --bundle: CuPy is needed ({exc})", file=sys.stderr)
        return 1
    from .device import kernel_bundle, kernel_manifest as km
    km.hold_background()
    folder = args.out or os.path.dirname(os.path.abspath(kernel_bundle.__file__))
    res = kernel_bundle.build(archs, folder=folder, jobs=args.jobs,
                              log=(lambda *a: None) if args.quiet else print)
    return 0 if all(missing == 0 for _, missing in res.values()) else 1


def _warmup_manifest(jobs, quiet):
    """``adaptmg warmup --manifest``: the shipped kernel manifest compiled by parallel worker
    processes (:func:`adaptmg.device.kernel_manifest.prefetch`, waited for)."""
    import time
    from .device import kernel_manifest as km
    t = time.perf_counter()
    procs = km.prefetch(jobs=jobs, wait=True)
    if not procs:
        print("adaptmg warmup --manifest: nothing started -- compiled before on this machine, "
              "shipped compiled for this GPU (adaptmg.device.kernel_bundle), "
              "adaptmg's kernel cache off (ADAPTMG_KERNEL_CACHE=off), ADAPTMG_PREFETCH=0, or a "
              f"manifest of another CuPy/NVRTC (this one: {km.versions()})", file=sys.stderr)
        return 0
    bad = [i for i, p in enumerate(procs) if p.returncode != 0]
    if not quiet:
        print(f"adaptmg warmup --manifest: {time.perf_counter() - t:.1f} s, {len(procs)} worker processes"
              + (f", {len(bad)} failed (their logs: prefetch-*.log in the kernel cache)" if bad else ""))
    return 1 if bad else 0


def _scripts_dir():
    """scripts/ of the repository: $ADAPTMG_SCRIPTS, next to the package, or below the cwd."""
    cands = []
    if os.environ.get("ADAPTMG_SCRIPTS"):
        cands.append(Path(os.environ["ADAPTMG_SCRIPTS"]))
    cands.append(Path(__file__).resolve().parent.parent / "scripts")
    cands.append(Path.cwd() / "scripts")
    for c in cands:
        if c.is_dir():
            return c
    return None


def _cmd_bench(args, parser):
    if not re.fullmatch(r"[A-Za-z0-9_]+", args.name):
        parser.error(f"bench name must be letters, digits and '_', got {args.name!r}")
    d = _scripts_dir()
    if d is None:
        parser.error("cannot find the scripts/ folder (run from the adaptmg repository, "
                     "or set ADAPTMG_SCRIPTS)")
    script = d / f"bench_{args.name}.py"
    if not script.is_file():
        have = sorted(p.stem[len("bench_"):] for p in d.glob("bench_*.py"))
        parser.error(f"no benchmark {args.name!r} ({script} does not exist); available: "
                     f"{', '.join(have) or 'none'}")
    import subprocess
    return subprocess.call([sys.executable, str(script), *args.rest], cwd=str(d.parent))


def build_parser():
    parser = argparse.ArgumentParser(
        prog="adaptmg",
        description="Adaptive finite elements with geometric multigrid on CPU and GPU.")
    sub = parser.add_subparsers(dest="command", metavar="{run,list,info,bench,warmup}")
    sub.required = True
    pr = sub.add_parser("run", help="run an application problem",
                        description="Run a problem: adaptmg run <problem> [options]; "
                                    "'adaptmg run <problem> --help' lists its options. "
                                    f"Problems: {', '.join(discover_problems())}.")
    pr.add_argument("problem", help="problem name (see 'adaptmg list')")
    pr.add_argument("rest", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    pr.set_defaults(func=_cmd_run)
    pl = sub.add_parser("list", help="list the problems and their options")
    pl.set_defaults(func=_cmd_list)
    pi = sub.add_parser("info", help="backend, device and versions")
    pi.set_defaults(func=_cmd_info)
    pb = sub.add_parser("bench", help="run scripts/bench_<name>.py")
    pb.add_argument("name")
    pb.add_argument("rest", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    pb.set_defaults(func=_cmd_bench)
    pw = sub.add_parser("warmup", help="compile the GPU kernels ahead of time (parallel)",
                        description="Compile adaptmg's GPU kernels into its kernel cache by running "
                                    "small problems in parallel processes (adaptmg.device.warmup); "
                                    "later processes load them even with an empty CuPy cache.")
    pw.add_argument("--jobs", type=int, default=None, help="processes at a time (default: CPU count)")
    pw.add_argument("--tasks", default=None, help="comma-separated subset of the tasks")
    pw.add_argument("--quiet", action="store_true")
    pw.add_argument("--record", default=None, metavar="PATH",
                    help="also write the kernel manifest (adaptmg.device.kernel_manifest) to PATH")
    pw.add_argument("--manifest", action="store_true",
                    help="compile the shipped kernel manifest in parallel worker processes instead "
                         "of running the tasks (what a machine's first GPU run starts by itself; "
                         "5.6 s on a 16-core H200 host against 43 s for the tasks)")
    pw.add_argument("--bundle", default=None, metavar="ARCHS",
                    help="build the package's cubin files (adaptmg.device.kernel_bundle) of the shipped "
                         "manifest for these compute capabilities, e.g. 80,86,89,90,100,120 (needs CuPy "
                         "and NVRTC, not a GPU of each)")
    pw.add_argument("--out", default=None, metavar="DIR",
                    help="with --bundle: write the files here (default: the package's adaptmg/device)")
    pw.set_defaults(func=_cmd_warmup)
    return parser


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args, parser) or 0)
    except ProblemImportError as exc:
        if os.environ.get("ADAPTMG_DEBUG"):
            raise
        print(f"adaptmg: error: {exc} (ADAPTMG_DEBUG=1 shows the traceback)", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("adaptmg: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
