"""Compile a machine's kernels ahead of need, in parallel processes, from a recorded manifest.

A process that meets empty kernel caches compiles every kernel it uses with NVRTC, one
after another on its own thread, on first use: about 0.24 s each (median), 257 calls for
a 340k-DoF ``multigrid()`` set-up, solve and ``adaptmg.amg`` set-up -- 55 s for that run
(``scripts/bench_setup.py --cold``, one H200 host, CuPy 14.2 / CUDA 13).  Threads do not
help: 16 threads replaying the same calls took 49.6 s, 2.6 s a call (NVRTC serialises
inside one process).  Processes do: 15 worker processes compile the whole
manifest (358 kernels) in 21.5 s, and the 340k-DoF run from empty caches, with the workers
started beside it, takes 9.1 s to the solution instead of 35.9 s.

The *manifest* (``kernel_manifest.json.gz`` beside this file) lists what NVRTC was asked to
compile while the tasks of :mod:`.warmup` ran -- per task, in first-use order: the source,
the options, the cache-key ``extra_source`` (CuPy's headers, stored once) and the rest of
CuPy's compile arguments -- together with the CuPy and NVRTC versions it was recorded with.
Paths of the recording machine (CuPy's and CUDA's include folders) are stored as
placeholders and put back for this machine's install, so the replayed call is the one a
process here would make.  ``python -m adaptmg warmup --record`` writes it (on a GPU machine).

:func:`prefetch` (started once per process by :func:`adaptmg.backend.get_backend` the first
time it hands out the GPU) starts ``jobs`` worker processes that compile the manifest's
kernels -- the caller's first tasks first, then every other -- into the kernel caches
(:mod:`.kernel_cache`: CuPy's and adaptmg's) and return at once.  The calling process goes on:
a kernel it needs is loaded from the cache when a worker has written it, else compiled by the
caller as before, so the prefetch never makes a run slower than without it apart from the
CPU the workers take.  When all workers succeed, a marker file in adaptmg's cache
(``prefetched-<manifest hash>-sm<arch>``; a failed worker leaves its ``prefetch-*.log``
there) keeps later processes from starting them again; a
lock file beside it keeps the ranks of one ``mpiexec`` from starting a set each.
Nothing happens when the manifest was recorded with another CuPy or NVRTC version (its
sources would not be the ones this CuPy generates), when adaptmg's cache is off
(``ADAPTMG_KERNEL_CACHE=off``) or with ``ADAPTMG_PREFETCH=0``.

The workers compile *units* (:mod:`.kernel_groups`): up to 16 entries that share their
options and ``#include`` lines as one NVRTC program, whose cubin CuPy stores under each
entry's own cache key (the worker swaps the source CuPy hands NVRTC for the merged one and
lets CuPy do the rest: the key, the payload, the save); every other entry alone.  CuPy's
headers are most of a kernel's compile, so this and NVRTC's automatic precompiled headers
(``CUPY_NVRTC_USE_PCH=1``, CuPy's own switch: not part of the cache key) cut the manifest's
compile in one process from 106-117 s to 30-43 s (NVRTC 13.0.88 through ctypes, sm_90, a
shared 2-core machine, ``scripts/bench_kernel_groups.py``: CuPy's element-wise kernels 33 ->
12 s, its CUB reduction passes 73 -> 11 s, adaptmg's 39 sources without headers 12 s either
way); a unit whose merged program fails, or lacks one of its kernels, is compiled entry by
entry.  On the 16-core H200 host, 15 workers compile the whole manifest in 5.6 s with the
merged units, 5.7 s with the precompiled headers as well, and 9.8 s one program per kernel
(``python scripts/bench_kernel_groups.py --prefetch``; 21.5 s before the workers got CuPy's
``_set_mapping``): the workers leave the headers as the environment has them (off unless
``CUPY_NVRTC_USE_PCH=1``), which spares ``$TMPDIR`` NVRTC's ``__nvrtc_auto_pch_<pid>_0``
files (14 MB for CuPy's element-wise headers, 170 MB per option set for CUB's, per worker).  Every worker forms the same units from the order file
(the calling process does not spend the time) and takes them in priority order, each the
first one no other worker has claimed (a claim file per unit).  ``ADAPTMG_PREFETCH_MERGE=0`` compiles one program
per entry; ``CUPY_NVRTC_USE_PCH=1`` in the environment turns the precompiled headers on.

The workers import only CuPy's compiler, :mod:`.kernel_cache` and :mod:`.kernel_groups`
(this file run as a script) and hand CuPy a stand-in for its module loader, so that they
need no CUDA context and take no GPU memory (a worker where that does not work takes a
context of the visible device and goes on).  They outlive a calling process that ends first and finish filling the cache; the
marker is then not written, and a process after the lock's ten minutes starts the workers
again, which find the kernels cached.

Reaching into CuPy: the recorder wraps and the workers call
``cupy.cuda.compiler._compile_with_cache_cuda`` (a private function of CuPy 14).  Where it is
missing, recording raises and :func:`prefetch` does nothing.
"""
from __future__ import annotations

import gzip
import hashlib
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from contextlib import contextmanager

__all__ = ["MANIFEST", "record", "merge", "load", "prefetch", "versions"]

MANIFEST = os.path.join(os.path.dirname(os.path.abspath(__file__)), "kernel_manifest.json.gz")
FORMAT = 2
_STATE = {"started": None}
_OFF = ("0", "off", "no", "false")


def _paths():
    """Placeholder -> this machine's path (CuPy's package folder, the CUDA toolkit)."""
    import cupy
    out = {"{CUPY}": os.path.dirname(os.path.abspath(cupy.__file__))}
    try:
        cuda = cupy.cuda.get_cuda_path()
    except Exception:                                   # pragma: no cover - no toolkit path
        cuda = None
    if cuda:
        out["{CUDA}"] = cuda
    return out


def _generic(text, paths):
    for ph, p in paths.items():
        text = text.replace(p, ph)
    return text


def _specific(text, paths):
    for ph, p in paths.items():
        text = text.replace(ph, p)
    return text


def versions(compiler=None):
    """``(cupy version, nvrtc version)`` of this process, as the manifest stores them."""
    import cupy
    if compiler is None:
        import cupy.cuda.compiler as compiler
    return cupy.__version__, list(compiler._get_nvrtc_version())


_SKIP = ("log_stream", "cache_in_memory")     # not part of what is compiled (nor folders: "dir")


def call_entry(arguments, paths):
    """A call of CuPy's compile-with-cache function (its bound ``arguments`` by name) as a
    manifest entry: this machine's ``paths`` in the source and options as placeholders, the
    arguments that do not change what is compiled (and None/False ones) left out, tuples
    kept as ``{"tuple": [...]}``, the ``extra_source`` text as it is."""
    entry = {}
    for name, v in arguments.items():
        if name in _SKIP or "dir" in name or (name not in ("source", "options") and v in (None, False)):
            continue
        if name == "source":
            v = _generic(v, paths)
        elif name == "options":
            v = [_generic(o, paths) for o in v]
        elif isinstance(v, tuple):                 # kept a tuple on replay
            v = {"tuple": list(v)}
        entry[name] = v
    return entry


def call_kwargs(e, paths, extras, arch, folders=None):
    """The keyword arguments of CuPy's compile-with-cache function for manifest entry ``e``
    on this machine (``paths``: :func:`_paths`; ``extras``: the manifest's ``extra_sources``;
    ``arch``: the architecture of entries recorded without one; ``folders``: the cache-folder
    arguments, None for CuPy's default)."""
    kw = {k: (tuple(v["tuple"]) if isinstance(v, dict) else v) for k, v in e.items()}
    kw["source"] = _specific(e["source"], paths)
    kw["options"] = tuple(_specific(o, paths) for o in e["options"])
    kw["arch"] = e.get("arch") or arch
    kw.update(folders or {})
    if "extra_source" in e:
        kw["extra_source"] = extras[e["extra_source"]]
    return kw


@contextmanager
def record(path):
    """Within the block, log every call of CuPy's compile-with-cache function (hits
    included: first-use order), its arguments by name, and write them as JSON to ``path``
    at the end."""
    import inspect

    import cupy.cuda.compiler as compiler
    orig = compiler._compile_with_cache_cuda
    sig = inspect.signature(orig)
    paths, log, lock = _paths(), [], threading.Lock()
    here_arch = compiler._get_arch()            # not stored: the replay uses its machine's

    def logged(*args, **kw):
        entry = call_entry(sig.bind(*args, **kw).arguments, paths)
        if str(entry.get("arch")) == str(here_arch):
            del entry["arch"]
        with lock:
            log.append(entry)
        return orig(*args, **kw)

    compiler._compile_with_cache_cuda = logged
    try:
        yield log
    finally:
        compiler._compile_with_cache_cuda = orig
        with open(path, "w") as f:
            json.dump({"versions": versions(compiler), "entries": log}, f)


def merge(parts: dict, out=MANIFEST):
    """Write the manifest from ``{task: path of a record() file}`` (tasks in priority order):
    every distinct compile call once (``entries``), each task as the indices of its calls in
    first-use order, the ``extra_source`` texts (CuPy's headers) once."""
    extras, entries, index, tasks, vers = [], [], {}, {}, None
    for task, path in parts.items():
        with open(path) as f:
            rec = json.load(f)
        if vers is None:
            vers = rec["versions"]
        elif rec["versions"] != vers:
            raise ValueError(f"task {task!r} was recorded with {rec['versions']}, others with {vers}")
        mine = []
        for e in rec["entries"]:
            x = e.pop("extra_source", None)
            if x is not None:
                if x not in extras:
                    extras.append(x)
                e["extra_source"] = extras.index(x)     # an index into extra_sources
            key = json.dumps(e, sort_keys=True)
            if key not in index:
                index[key] = len(entries)
                entries.append(e)
            if index[key] not in mine:
                mine.append(index[key])
        tasks[task] = mine
    doc = {"format": FORMAT, "cupy": vers[0], "nvrtc": vers[1], "extra_sources": extras,
           "entries": entries, "tasks": tasks}
    with gzip.open(out, "wt", compresslevel=9) as f:
        json.dump(doc, f, separators=(",", ":"))
    return out


def load(path=MANIFEST):
    """The manifest as a dict, or None when there is none or its format is not this one's."""
    try:
        with gzip.open(path, "rt") as f:
            doc = json.load(f)
    except (OSError, ValueError):
        return None
    return doc if doc.get("format") == FORMAT else None


def _ordered(doc, first=()):
    """The distinct entries, those of the tasks in ``first`` before the others (each task in
    its first-use order)."""
    names = [t for t in first if t in doc["tasks"]] + [t for t in doc["tasks"] if t not in first]
    seen, out = set(), []
    for t in names:
        for i in doc["tasks"][t]:
            if i not in seen:
                seen.add(i)
                out.append(doc["entries"][i])
    return out


def _marker(folder, doc_hash, arch):
    return os.path.join(folder, f"prefetched-{doc_hash[:16]}-sm{arch}")


def prefetch(first=(), jobs=None, path=MANIFEST, wait=False, arch=None, bundled="skip"):
    """Start compiling the manifest's kernels in ``jobs`` worker processes (default: CPU
    count - 1) unless done before on this machine; see the module docstring.  ``first``:
    warm-up task names whose kernels go first.  ``arch``: compile for this architecture
    (default: the visible device's).  ``bundled="skip"``: start nothing when the package's
    cubins of ``arch`` (:mod:`.kernel_bundle`) cover the manifest ("compile" to compile
    anyway).  Returns the list of worker processes (empty when nothing was started);
    ``wait=True`` waits for them."""
    from .kernel_cache import cache_dir
    from .kernel_groups import GROUP_SIZE
    folder = cache_dir()
    if folder is None or os.environ.get("ADAPTMG_PREFETCH", "1").strip().lower() in _OFF:
        return []
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError:
        return []
    try:
        import cupy.cuda.compiler as compiler
    except ImportError:
        return []
    if not hasattr(compiler, "_compile_with_cache_cuda"):
        return []
    arch = str(arch or compiler._get_arch())
    doc_hash = hashlib.md5(raw).hexdigest()
    marker = _marker(folder, doc_hash, arch)
    if os.path.exists(marker):                # done on this machine: the manifest not even parsed
        return []
    if bundled == "skip" and __package__:     # not in a worker (a script): no package to ask
        from .kernel_bundle import covers
        if covers(doc_hash, arch):
            return []                         # every manifest kernel ships compiled
    doc = load(path)
    if doc is None:
        return []
    cupy_v, nvrtc_v = versions(compiler)
    if doc["cupy"] != cupy_v or list(doc["nvrtc"]) != nvrtc_v:
        return []
    os.makedirs(folder, exist_ok=True)
    lock = marker + ".lock"                   # one prefetch per machine at a time (mpiexec ranks)
    try:
        if time.time() - os.path.getmtime(lock) > 600:   # left by a process that died
            os.remove(lock)
    except OSError:
        pass
    try:
        os.close(os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except OSError:
        return []
    order = os.path.join(folder, f"prefetch-order-{os.getpid()}.json")
    claims = os.path.join(folder, f"prefetch-claims-{os.getpid()}")
    merge = os.environ.get("ADAPTMG_PREFETCH_MERGE", "1").strip().lower() not in _OFF
    os.makedirs(claims, exist_ok=True)
    with open(order, "w") as f:         # the workers group the entries (not this process's time)
        json.dump({"entries": _ordered(doc, first), "group_size": GROUP_SIZE if merge else 1, "claims": claims,
                   "extra_sources": doc["extra_sources"]}, f)
    if jobs is None:
        jobs = max(1, (os.cpu_count() or 2) - 1)
    # NVRTC's automatic precompiled headers stay as the caller's environment has them (CuPy's
    # CUPY_NVRTC_USE_PCH, off by default): with the merged units 15 workers took 5.7 s for the
    # whole manifest with them and 5.6 s without (H200 host), and they need up to ~170 MB of
    # $TMPDIR per worker and CUB option set
    env = dict(os.environ)
    # run as a script by path (runpy: the package folder is not put on sys.path): the
    # workers import neither adaptmg nor anything but CuPy's compiler
    boot = "import runpy, sys; runpy.run_path(sys.argv[1], run_name='__main__')"
    logs = [os.path.join(folder, f"prefetch-{os.getpid()}-{i}.log") for i in range(jobs)]
    procs = []
    for i, log in enumerate(logs):
        with open(log, "w") as err:
            procs.append(subprocess.Popen([sys.executable, "-c", boot, os.path.abspath(__file__), order, str(i),
                                           str(jobs), str(arch)], stdout=subprocess.DEVNULL, stderr=err, env=env))

    def settle():
        codes = [p.wait() for p in procs]
        for code, log in zip(codes, logs):     # a failed worker's log stays for whoever asks why
            if code == 0:
                try:
                    os.remove(log)
                except OSError:
                    pass
        if all(c == 0 for c in codes):
            with open(marker, "w") as f:
                f.write(f"{len(doc['entries'])} kernels, CuPy {cupy_v}, NVRTC {nvrtc_v}\n")
        shutil.rmtree(claims, ignore_errors=True)
        for f in (order, lock):
            try:
                os.remove(f)
            except OSError:
                pass

    if wait:
        settle()
    else:
        threading.Thread(target=settle, name="adaptmg-prefetch", daemon=True).start()
    return procs


def hold_background():
    """Keep :func:`start_once` from starting workers in this process: for a caller that runs
    :func:`prefetch` itself and waits for it (``adaptmg warmup --manifest``; otherwise its own
    GPU check would start a background set first, holding the lock its prefetch then meets)."""
    if _STATE["started"] is None:
        _STATE["started"] = []


def start_once(first=()):
    """:func:`prefetch` at most once per process (errors are swallowed: a prefetch is only an
    optimisation, the kernels then compile on first use as without it)."""
    if _STATE["started"] is None:
        _STATE["started"] = []
        try:
            _STATE["started"] = prefetch(first)
        except Exception:                                # pragma: no cover - defensive
            pass
    return _STATE["started"]


class _Unloaded:
    """Stand-in for ``cupy.cuda.function.Module`` in a worker: the cubin is written to the
    caches by the compile call, nobody here launches it, so it is not loaded (no context)."""

    def load(self, cubin):
        pass

    def load_file(self, path):
        pass

    def _set_mapping(self, mapping):      # CuPy 14 sets the (name-expression) mapping of a
        pass                              # freshly compiled module before it saves it


def _sibling(name):
    """A module of this folder loaded by path (the worker runs as a script, not in adaptmg)."""
    import importlib.util
    here = os.path.dirname(os.path.abspath(__file__))
    spec = importlib.util.spec_from_file_location(f"_adaptmg_{name}", os.path.join(here, f"{name}.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@contextmanager
def _merged(compiler, sources, names, kg):
    """Within the block, CuPy's NVRTC call for any of ``sources`` compiles them all as one
    program (:func:`.kernel_groups.merged_source`) once per option set and returns that
    cubin, so CuPy stores it under each source's own cache key; where the merged program
    does not compile, or lacks one of ``names``, each source is compiled alone as before."""
    orig = compiler._compile_using_nvrtc_no_warning
    mine, built = set(sources), {}

    def one_for_all(source, options=(), arch=None, filename="kern.cu", *args, **kw):
        if source not in mine:
            return orig(source, options, arch, filename, *args, **kw)
        key = (tuple(options), arch)
        if key not in built:
            built[key] = None
            try:
                out = orig(kg.merged_source(sources), options, arch, "adaptmg_merged.cu", *args, **kw)
                if isinstance(out[0], bytes) and kg.has_kernels(out[0], names):
                    built[key] = out
            except Exception as e:                       # noqa: BLE001 - then one by one
                print(f"merged program of {len(sources)} kernels failed, compiling them alone: "
                      f"{type(e).__name__}: {str(e)[:2000]}", file=sys.stderr, flush=True)
        if built[key] is None:
            return orig(source, options, arch, filename, *args, **kw)
        return built[key]

    compiler._compile_using_nvrtc_no_warning = one_for_all
    try:
        yield
    finally:
        compiler._compile_using_nvrtc_no_warning = orig


def _claim(claims, u, index, jobs):
    """Whether this worker compiles unit ``u``: the first to create its claim file (units go
    to whichever worker is free), or ``u % jobs == index`` without a claims folder."""
    if not claims:
        return u % jobs == index
    try:
        os.close(os.open(os.path.join(claims, str(u)), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        return True
    except FileExistsError:
        return False


def _worker(order, index, jobs, arch):
    """Compile the order file's units (:func:`prefetch`) into the caches; see above."""
    import inspect
    import types

    import cupy.cuda.compiler as compiler
    _sibling("kernel_cache").install(compiler)
    kg = _sibling("kernel_groups")
    real = compiler.function
    shim = types.ModuleType("function_without_load")
    shim.__dict__.update({k: getattr(real, k) for k in dir(real) if not k.startswith("__")})
    shim.Module = _Unloaded
    compiler.function = shim
    with open(order) as f:
        doc = json.load(f)
    paths, extras = _paths(), doc["extra_sources"]
    # the cache folder argument (its name varies across CuPy versions): None, CuPy's default
    folders = {n: None for n, p in inspect.signature(compiler._compile_with_cache_cuda).parameters.items()
               if "dir" in n}

    def compile_one(kw):
        try:
            compiler._compile_with_cache_cuda(**kw)
        except Exception:
            if compiler.function is shim:            # the stand-in was not enough: the real
                import cupy                            # one, in a context of the visible device
                compiler.function = real
                cupy.cuda.runtime.free(0)
                compiler._compile_with_cache_cuda(**kw)
            else:
                raise

    units = doc.get("units") or kg.groups(doc["entries"], doc.get("group_size", 1))
    try:                         # PTX (CuPy's CUPY_COMPILE_WITH_PTX, an arch beyond NVRTC's):
        ptx = bool(getattr(compiler, "_use_ptx", False)) or int(arch) > int(compiler._get_max_compute_capability())
    except Exception:            # noqa: BLE001 - a merged module would be JIT-compiled whole
        ptx = True               # at each load: one program per entry
    for u, unit in enumerate(units):
        if not _claim(doc.get("claims"), u, index, jobs):
            continue
        entries = [doc["entries"][i] for i in unit]
        kws = [call_kwargs(e, paths, extras, arch, folders) for e in entries]
        if len(kws) == 1 or ptx:
            for kw in kws:
                compile_one(kw)
            continue
        names = [n for e in entries for n in (kg.kernel_names(e) or ())]
        with _merged(compiler, [kw["source"] for kw in kws], names, kg):
            for kw in kws:
                compile_one(kw)


if __name__ == "__main__":
    _worker(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5])
