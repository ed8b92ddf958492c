"""Benchmark: time to solution, mesh -> x, phase by phase, warm and cold.

For each case and backend it times what a user waits for: ``import adaptmg`` (cold runs),
building the mesh, the ``Space``, the ``multigrid()`` set-up, the load vector with its
constraints (``ml.constrain(assemble.load(...))``), the first solve and a second solve
(CG to rtol 1e-8), and -- as the peer in the same run -- ``adaptmg.amg``'s set-up on the
*same* constrained matrix (device set-up on the GPU, pyamg's on the CPU) and its solve.
Every phase ends with a device synchronisation.

Cases (3-D Q1 Poisson, homogeneous Dirichlet, f = 1):

* ``uniform``: the box [0,1]^3 with 2^3 cells refined uniformly ``--refine`` times
  (6: 2,146,689 DoFs).
* ``adaptive``: the mesh family of ``scripts/bench_distributed.py`` (uniform refinement to
  about ``--dofs`` DoFs plus one local refinement; 2.6e6: 2,657,684 DoFs, 3e5: 340,709).

``--cold`` runs every case first in a fresh process whose kernel caches (CuPy's
``CUPY_CACHE_DIR`` and adaptmg's ``ADAPTMG_KERNEL_CACHE``) are empty folders -- what the
first run on a new machine meets, the package's shipped cubins and the kernel manifest's
parallel compilation included (:mod:`adaptmg.device.kernel_bundle`,
:mod:`adaptmg.device.kernel_manifest`; ``ADAPTMG_BENCH_BUNDLE=0`` / ``ADAPTMG_BENCH_PREFETCH=0``
leave them out) -- and reports how many kernels it loaded and how many NVRTC compiled; on the GPU then ``adaptmg warmup`` into an adaptmg cache and each case again in
a fresh process with an empty CuPy cache (what every run after the warm-up meets); then
the same case warm in this process (after one untimed run).  ``--profile N`` prints the N functions with the most
own time of the ``multigrid()`` set-up (cProfile); ``--timeline`` the warm run's set-up tasks
(``GeometricMultigrid.setup_timeline``: which thread ran what, when -- the critical path).

    python scripts/bench_setup.py --backend gpu --cases uniform,adaptive --cold
    python scripts/bench_setup.py --backend cpu --cases uniform --refine 5
    python scripts/bench_setup.py --backend gpu --mesh-backend gpu --cases uniform,adaptive

``--mesh-backend gpu`` builds each case's mesh on the device (``Mesh.box(..., backend="gpu")``,
refined there), so that mesh / space / multigrid / load / solve run mesh -> x on the device.

``--host-reads N`` (GPU, Python 3.12+) then counts the device -> host bytes of each case's
set-up, load + constrain and solve (:mod:`adaptmg.device.host_reads`) and prints the set-up's
N call sites with the most bytes: what the GPU set-up still reads back.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

T_START = time.perf_counter()


def make_mesh(case, args):
    from adaptmg import Mesh
    if case == "uniform":
        m = Mesh.box([0.0] * 3, [1.0] * 3, [2] * 3, backend=args.mesh_backend)
        for _ in range(args.refine):
            m = m.refine()
        return m
    if case == "adaptive":
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from bench_distributed import make_mesh as family
        return family(3, 1, args.dofs, backend=args.mesh_backend)
    raise ValueError(f"unknown case {case!r}")


def run_case(case, args, profile=0):
    """Phase times (seconds) of one mesh -> x run of ``case`` in this process."""
    import numpy as np
    import adaptmg
    from adaptmg import assemble
    from adaptmg.backend import get_backend
    be = get_backend(args.backend)
    sync = be.synchronize
    out = {}

    def phase(name, fn):
        t = time.perf_counter()
        r = fn()
        sync()
        out[name] = time.perf_counter() - t
        return r

    mesh = phase("mesh", lambda: make_mesh(case, args))
    space = phase("space", lambda: adaptmg.Space(mesh, degree=1))
    if profile:
        import cProfile
        import pstats
        pr = cProfile.Profile()
        pr.enable()
    ml = phase("multigrid", lambda: adaptmg.multigrid(space, assemble.stiffness, dirichlet="all",
                                                      backend=be))
    if profile:
        pr.disable()
        pstats.Stats(pr, stream=sys.stderr).sort_stats("tottime").print_stats(profile)
        pstats.Stats(pr, stream=sys.stderr).sort_stats("cumulative").print_stats(profile)
    dev = be if args.load == "device" else None
    b = phase("load", lambda: ml.constrain(assemble.load(space, lambda x: 1.0 + 0.0 * x[..., 0],
                                                         device=dev)))
    b = be.asarray(b)
    x = phase("solve1", lambda: ml.solve(b, rtol=1e-8, accel="cg"))
    phase("solve2", lambda: ml.solve(b, rtol=1e-8, accel="cg"))
    from adaptmg.backend import to_host
    bh, xh = to_host(b), to_host(x)
    res = float(np.linalg.norm(bh - to_host(ml.A) @ xh) / np.linalg.norm(bh))
    out["total"] = sum(out[k] for k in ("mesh", "space", "multigrid", "load", "solve1"))
    if args.amg:
        amg = phase("amg_setup", lambda: adaptmg.amg(ml.A, backend=be))
        phase("amg_solve", lambda: amg.solve(b, rtol=1e-8, accel="cg"))
        if not be.is_gpu:
            import pyamg
            A = ml.A
            phase("pyamg_setup", lambda: pyamg.smoothed_aggregation_solver(A, max_coarse=500))
    out.update(dofs=int(space.num_dofs), levels=len(ml.levels), residual=res,
               timeline=getattr(ml, "setup_timeline", []))
    return out


def _count_nvrtc():
    """A counter of the NVRTC programs with a body this process compiles (CuPy also compiles
    an empty one per option set: its version probe), or None without CuPy."""
    try:
        import cupy.cuda.compiler as C
    except ImportError:
        return None
    count, real = [0], C.nvrtc.createProgram

    def counted(src, *a, **k):
        count[0] += bool(src.strip())
        return real(src, *a, **k)

    C.nvrtc.createProgram = counted
    return count


def child(args):
    t = time.perf_counter()
    import adaptmg  # noqa: F401
    imp = time.perf_counter() - t
    nvrtc = _count_nvrtc() if args.backend == "gpu" else None
    r = run_case(args.cases, args)
    r.update(import_s=imp, process_s=time.perf_counter() - T_START)
    if nvrtc is not None:
        r["nvrtc"] = nvrtc[0]
    print("RESULT " + json.dumps(r))


def _files(folder):
    return sum(1 for _, _, fs in os.walk(folder) for f in fs if f.endswith(".cubin"))


def cold(case, args, adaptmg_cache):
    """``case`` in a fresh process whose CuPy kernel cache is an empty folder and whose
    adaptmg kernel cache is ``adaptmg_cache`` (an empty one: the first run on a machine)."""
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, CUPY_CACHE_DIR=cache, ADAPTMG_KERNEL_CACHE=adaptmg_cache,
                   ADAPTMG_PREFETCH=os.environ.get("ADAPTMG_BENCH_PREFETCH", "1"),
                   ADAPTMG_KERNEL_BUNDLE=os.environ.get("ADAPTMG_BENCH_BUNDLE", "1"))
        cmd = [sys.executable, os.path.abspath(__file__), "--child", "--cases", case,
               "--backend", args.backend, "--mesh-backend", args.mesh_backend, "--load", args.load,
               "--refine", str(args.refine), "--dofs", str(args.dofs)]
        cmd.append("--amg" if args.amg else "--no-amg")        # the child's default is --amg
        before = _files(adaptmg_cache)
        p = subprocess.run(cmd, env=env, capture_output=True, text=True)
        lines = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
        if p.returncode or not lines:
            raise RuntimeError(f"cold run of {case} failed:\n{p.stdout[-2000:]}\n{p.stderr[-4000:]}")
        r = json.loads(lines[-1][7:])
        r["kernels"] = _files(cache)
        r["compiled"] = r.get("nvrtc", _files(adaptmg_cache) - before)
        return r


def warm_cache(folder):
    """``adaptmg warmup`` into ``folder`` (a fresh process); returns its wall seconds."""
    t = time.perf_counter()
    env = dict(os.environ, ADAPTMG_KERNEL_CACHE=folder)
    with tempfile.TemporaryDirectory() as cupy_cache:
        env["CUPY_CACHE_DIR"] = cupy_cache
        subprocess.run([sys.executable, "-m", "adaptmg", "warmup", "--quiet"], env=env, check=True)
    return time.perf_counter() - t


def host_reads(case, args, top):
    """Device -> host bytes of ``case``'s ``multigrid()`` set-up, load + constrain and a (second)
    solve, counted by :mod:`adaptmg.device.host_reads` (GPU, Python 3.12+; the counting slows
    the set-up: no times here), with the set-up's ``top`` call sites by bytes."""
    import numpy as np
    import adaptmg
    from adaptmg import assemble
    from adaptmg.backend import get_backend
    from adaptmg.device.host_reads import count_host_reads
    be = get_backend(args.backend)
    space = adaptmg.Space(make_mesh(case, args), degree=1)
    with count_host_reads() as setup:
        ml = adaptmg.multigrid(space, assemble.stiffness, dirichlet="all", backend=be)
        be.synchronize()
    dev = be if args.load == "device" else None
    with count_host_reads() as load:
        b = be.asarray(ml.constrain(assemble.load(space, lambda x: 1.0 + 0.0 * x[..., 0], device=dev)))
        be.synchronize()
    ml.solve(b, rtol=1e-8, accel="cg")
    with count_host_reads() as solve:
        ml.solve(b, rtol=1e-8, accel="cg")
        be.synchronize()
    its = int(np.max(ml.last_iterations))
    print(f"{case} device -> host: dofs {space.num_dofs:,} levels {len(ml.levels)} | set-up "
          f"{setup.bytes:,} B in {setup.calls} reads | load+constrain {load.bytes:,} B in "
          f"{load.calls} | solve {solve.bytes:,} B in {solve.calls} ({its} its)", flush=True)
    print("    " + setup.report(top).replace("\n", "\n    "), flush=True)


COLS = ("mesh", "space", "multigrid", "load", "solve1", "solve2", "total", "amg_setup", "amg_solve",
        "pyamg_setup")


def show(label, r):
    cells = " ".join(f"{k} {r[k]:.3f}" for k in COLS if k in r)
    extra = ""
    if "compiled" in r:
        extra = (f" | import {r['import_s']:.2f} process {r['process_s']:.2f}; {r['kernels']} kernels"
                 f" loaded, {r['compiled']} of them compiled")
    print(f"{label:<22} dofs {r['dofs']:>10,} levels {r['levels']:>2} | {cells}{extra}"
          f" | res {r['residual']:.1e}", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", default="auto")
    ap.add_argument("--cases", default="uniform,adaptive")
    ap.add_argument("--refine", type=int, default=6, help="uniform: refinements of the 2^3 box")
    ap.add_argument("--dofs", type=float, default=2.6e6, help="adaptive: about this many DoFs")
    ap.add_argument("--cold", action="store_true",
                    help="also fresh processes with empty kernel caches: the first run on a machine, "
                         "and (GPU) a first run after `adaptmg warmup`")
    ap.add_argument("--no-amg", dest="amg", action="store_false", help="skip the amg() peer")
    ap.add_argument("--amg", dest="amg", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--load", choices=("host", "device"), default="device",
                    help="the load vector: assemble.load on the host, or with device=<backend>")
    ap.add_argument("--mesh-backend", choices=("cpu", "gpu"), default="cpu",
                    help="where the mesh is built and lives (Mesh.box(..., backend=)); gpu: mesh -> x "
                         "on the device (with --backend gpu)")
    ap.add_argument("--profile", type=int, default=0, help="cProfile the set-up (top N)")
    ap.add_argument("--timeline", action="store_true",
                    help="print the warm run's multigrid() tasks: thread, start and end (host clock)")
    ap.add_argument("--host-reads", type=int, default=0, metavar="N",
                    help="GPU: also count the device -> host bytes of the set-up, load and solve "
                         "(Python 3.12+) and print the set-up's N largest call sites")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args)
    if args.cold:       # this process's own kernel prefetch would compete with the cold runs
        os.environ["ADAPTMG_PREFETCH"] = "0"
    from adaptmg.backend import get_backend
    be = get_backend(args.backend)
    args.backend = be.name
    if args.mesh_backend == "gpu" and not be.is_gpu:
        ap.error("--mesh-backend gpu needs --backend gpu")
    print(f"backend {be.name}, mesh on {args.mesh_backend}; seconds per phase (after a synchronize)")
    cases = args.cases.split(",")
    if args.cold:
        with tempfile.TemporaryDirectory() as empty, tempfile.TemporaryDirectory() as warmed:
            for case in cases:
                show(f"{case} cold", cold(case, args, empty))
                shutil.rmtree(empty)
                os.makedirs(empty)
            if be.is_gpu:
                print(f"adaptmg warmup (all tasks, parallel): {warm_cache(warmed):.1f} s", flush=True)
                for case in cases:
                    show(f"{case} cold+warmup", cold(case, args, warmed))
    for case in cases:
        run_case(case, args)                                   # warm-up (kernels, caches)
        r = run_case(case, args, profile=args.profile)
        show(f"{case} warm", r)
        if args.timeline:
            for task, thread, a, b in r["timeline"]:
                print(f"    {task:<58} {thread:<26} {a:7.3f} -> {b:7.3f}  ({b - a:.3f} s)")
        if args.host_reads and be.is_gpu:
            host_reads(case, args, args.host_reads)


if __name__ == "__main__":
    main()
