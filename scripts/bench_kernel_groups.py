"""Benchmark: compiling the kernel manifest -- one program per kernel vs merged programs.

Compiles the shipped manifest's kernels (``adaptmg/device/kernel_manifest.json.gz``) in
this one process, first each entry alone (what CuPy does), then the compile units of
:func:`adaptmg.device.kernel_groups.groups` (up to 16 entries that share options and
``#include`` lines in one NVRTC program), each with and without NVRTC's automatic
precompiled headers (``--pch``; the prefetch workers use them only with
``CUPY_NVRTC_USE_PCH=1``), and prints the
seconds per kind of kernel (CuPy element-wise, CUB reductions, adaptmg's own sources) and
in all.  ``--verify`` also checks every merged kernel against the one compiled alone
(:func:`adaptmg.device.kernel_groups.same_kernel`).

NVRTC: CuPy's (``--nvrtc cupy``, needs a GPU) or a ``libnvrtc.so`` through ctypes
(``--nvrtc PATH``, no GPU needed; ``--cupy-include`` then names the folder holding CuPy's
``cupy/_core/include``, e.g. an unpacked ``cupy_cuda13x`` wheel).

The last column is the time the units would take on ``--jobs`` workers that each take the
next unit when free, at this one process's speed (no contention; the precompiled headers'
reuse as in one process, more than in a worker that compiles a few units).

``--prefetch`` (GPU) instead times :func:`adaptmg.device.kernel_manifest.prefetch` into empty
kernel caches, the whole manifest: merged programs with and without precompiled headers,
and one program per kernel without them (the previous workers; ``ADAPTMG_PREFETCH_MERGE=0
CUPY_NVRTC_USE_PCH=0``), ``--jobs`` workers (default: CPU count - 1).

    python scripts/bench_kernel_groups.py --nvrtc /path/libnvrtc.so.13 --cupy-include /path/cupy --verify
    python scripts/bench_kernel_groups.py --backend gpu --prefetch
"""
import argparse
import ctypes
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from adaptmg.device import kernel_groups as kg         # noqa: E402
from adaptmg.device import kernel_manifest as km       # noqa: E402


def ctypes_compiler(path, cupy_root, arch):
    """``compile(source, options, pch) -> cubin`` through libnvrtc, with the options CuPy adds."""
    folder = os.path.dirname(os.path.abspath(path))
    for f in sorted(os.listdir(folder)):          # a pip wheel's NVRTC: its builtins beside it
        if f.startswith("libnvrtc-builtins.so") and ".alt." not in f:
            ctypes.CDLL(os.path.join(folder, f), mode=ctypes.RTLD_GLOBAL)
    lib = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
    paths = {"{CUPY}": os.path.join(cupy_root, "cupy"), "{CUDA}": "/nonexistent-cuda"}

    def compile_(source, options, pch=False):
        opts = [km._specific(o, paths) for o in options]
        opts += ["-ftz=true", f"-arch=sm_{arch}", "--device-as-default-execution-space"] + (["--pch"] if pch else [])
        prog, n = ctypes.c_void_p(), ctypes.c_size_t()
        if lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), b"kern.cu", 0, None, None):
            raise RuntimeError("nvrtcCreateProgram failed")
        try:
            arr = (ctypes.c_char_p * len(opts))(*[o.encode() for o in opts])
            if lib.nvrtcCompileProgram(prog, len(opts), arr):
                lib.nvrtcGetProgramLogSize(prog, ctypes.byref(n))
                log = ctypes.create_string_buffer(n.value)
                lib.nvrtcGetProgramLog(prog, log)
                raise RuntimeError(log.value.decode(errors="replace")[-3000:])
            lib.nvrtcGetCUBINSize(prog, ctypes.byref(n))
            out = ctypes.create_string_buffer(n.value)
            lib.nvrtcGetCUBIN(prog, out)
            return out.raw
        finally:
            lib.nvrtcDestroyProgram(ctypes.byref(prog))
    return compile_


def cupy_compiler():
    """``compile(source, options, pch) -> cubin`` through CuPy's own NVRTC call."""
    import cupy.cuda.compiler as compiler
    paths, arch = km._paths(), compiler._get_arch()

    def compile_(source, options, pch=False):
        opts = tuple(km._specific(o, paths) for o in options) + ("-ftz=true",)
        old = compiler._use_pch
        compiler._use_pch = pch
        try:
            return compiler._compile_using_nvrtc_no_warning(source, opts, arch, "kern.cu")[0]
        finally:
            compiler._use_pch = old
    return compile_


def kind(entry):
    src = entry["source"]
    return "adaptmg/raw" if not kg.includes(src) else ("CUB" if "cub/" in src else "element-wise")


def timed_compiles(entries, units, compile_, pch):
    """Seconds per kind of the units, each compiled as one program, and per unit."""
    out, each = {}, []
    for unit in units:
        src = (entries[unit[0]]["source"] if len(unit) == 1 else
               kg.merged_source([entries[i]["source"] for i in unit]))
        t = time.perf_counter()
        compile_(src, entries[unit[0]]["options"], pch)
        each.append(time.perf_counter() - t)
        k = kind(entries[unit[0]])
        n, s = out.get(k, (0, 0.0))
        out[k] = (n + len(unit), s + each[-1])
    return out, each


def makespan(seconds, jobs):
    """The last finish when ``jobs`` workers take the units in order, each the next one when
    free (what the claim files do), at the one-process speed (no contention)."""
    free = [0.0] * jobs
    for s in seconds:
        free[free.index(min(free))] += s
    return max(free)


def compile_table(args):
    doc = km.load()
    entries = km._ordered(doc)[:args.limit or None]
    if args.nvrtc == "cupy":
        compile_ = cupy_compiler()
    else:
        compile_ = ctypes_compiler(args.nvrtc, args.cupy_include, args.arch)
    merged = kg.groups(entries)
    alone = [[i] for i in range(len(entries))]
    print(f"{len(entries)} kernels, {len(merged)} compile units "
          f"({sum(len(u) > 1 for u in merged)} merged programs); seconds in one process")
    print(f"{'':<16}" + "".join(f"{k:>16}" for k in ("element-wise", "CUB", "adaptmg/raw", "all"))
          + f"   {args.jobs} workers, no contention")
    for label, units, pch in (("alone", alone, False), ("alone, --pch", alone, True),
                              ("merged", merged, False), ("merged, --pch", merged, True)):
        r, each = timed_compiles(entries, units, compile_, pch)
        cells = [r.get(k, (0, 0.0)) for k in ("element-wise", "CUB", "adaptmg/raw")]
        cells.append((sum(c[0] for c in cells), sum(c[1] for c in cells)))
        print(f"{label:<16}" + "".join(f"{s:9.1f} ({n:3d})" for n, s in cells)
              + f"   {makespan(each, args.jobs):8.1f}", flush=True)
    if args.verify:
        v = kg.verify(entries, merged, lambda s, o: compile_(s, o, True))
        print(f"verify (merged, --pch vs alone, --pch): {v['same']} kernels the same, "
              f"{len(v['different'])} different {v['different'][:10]}")


def prefetch_table(args):
    """The whole manifest into empty caches by :func:`prefetch`'s workers, per setting."""
    for merge, pch in (("1", "1"), ("1", "0"), ("0", "0")):
        with tempfile.TemporaryDirectory() as tmp:
            env = dict(os.environ, CUPY_CACHE_DIR=os.path.join(tmp, "cupy"), ADAPTMG_KERNEL_CACHE=os.path.join(tmp, "a"),
                       ADAPTMG_PREFETCH="1", ADAPTMG_PREFETCH_MERGE=merge, CUPY_NVRTC_USE_PCH=pch)
            code = ("import time; from adaptmg.device import kernel_manifest as km; t = time.perf_counter(); "
                    f"p = km.prefetch(jobs={args.jobs if args.jobs_given else None}, wait=True, bundled='compile'); "
                    "print(time.perf_counter() - t, len(p), [q.returncode for q in p])")
            out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
            secs, n, codes = out.stdout.split(maxsplit=2)
            files = sum(f.endswith(".cubin") for f in os.listdir(os.path.join(tmp, "cupy")))
            label = ("merged programs" if merge == "1" else "one program per kernel") + (", --pch" if pch == "1" else "")
            print(f"prefetch, {label:<31}: {float(secs):6.1f} s, {n} workers (exit codes {codes.strip()}), "
                  f"{files} cubins cached", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", default="cpu", help="gpu: NVRTC from CuPy (same as --nvrtc cupy)")
    ap.add_argument("--nvrtc", default=None, help="'cupy' or the path of a libnvrtc.so")
    ap.add_argument("--cupy-include", default=None, help="with --nvrtc PATH: the folder holding cupy/_core/include")
    ap.add_argument("--arch", default="90")
    ap.add_argument("--limit", type=int, default=0, help="only the first N kernels (priority order)")
    ap.add_argument("--verify", action="store_true")
    ap.add_argument("--prefetch", action="store_true", help="time the parallel prefetch (GPU)")
    ap.add_argument("--jobs", type=int, default=15, help="workers (--prefetch: default CPU count - 1)")
    args = ap.parse_args()
    args.jobs_given = "--jobs" in " ".join(sys.argv)
    if args.nvrtc is None:
        args.nvrtc = "cupy" if args.backend == "gpu" else None
    if args.prefetch:
        return prefetch_table(args)
    if args.nvrtc is None or (args.nvrtc != "cupy" and not args.cupy_include):
        ap.error("give --backend gpu (CuPy's NVRTC) or --nvrtc PATH --cupy-include DIR")
    compile_table(args)


if __name__ == "__main__":
    main()
