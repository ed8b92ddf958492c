"""The cubins shipped with the package (adaptmg.device.kernel_bundle).

On the CPU a fake CuPy compiler stands in: its compile-with-cache function names a call by a
hash of everything it compiles (this machine's paths included, as CuPy's does), looks the
name up in the cache backend and "compiles" on a miss.  What is checked: a manifest
recorded on one machine yields keys that the same call on another machine (other install
paths) finds; the cubin is served only for the exact call, versions and target; it is
stored under CuPy's name so the next lookup is a plain cache hit; a damaged file serves
nothing; the prefetch starts no workers when the files cover the manifest.  The GPU tests
build real files and check that a process with empty caches runs without NVRTC."""
import hashlib
import json
import os
import subprocess
import sys
import textwrap
import types

import numpy as np
import pytest

from adaptmg.device import kernel_bundle as kb
from adaptmg.device import kernel_cache
from adaptmg.device import kernel_manifest as km


class _Base:
    def load(self, name):
        raise NotImplementedError

    def save(self, name, cubin, source):
        raise NotImplementedError


class _Disk(_Base):
    folders = {}                                  # folder -> its files, shared like a disk

    def __init__(self, folder=None):
        self.folder = folder
        self.files = {} if folder is None else self.folders.setdefault(folder, {})

    def load(self, name):
        return self.files.get(name)

    def save(self, name, cubin, source):
        self.files[name] = cubin


def _fake_cupy(monkeypatch, root, compiled, arch="90", version="14.2.0", nvrtc=(13, 0), ptx=False):
    cupy = types.ModuleType("cupy")
    cupy.__file__ = os.path.join(root, "cupy", "__init__.py")
    cupy.__version__ = version
    cuda = types.ModuleType("cupy.cuda")
    cuda.get_cuda_path = lambda: os.path.join(root, "cuda")
    compiler = types.ModuleType("cupy.cuda.compiler")

    def compile_with_cache(source, options, arch=None, extra_source=None, backend="nvrtc",
                           enable_cooperative_groups=False, name_expressions=None, log_stream=None,
                           cache_in_memory=False, jitify=False, to_ltoir=False):
        arch = arch or compiler._get_arch()
        name = hashlib.md5(repr((source, options, arch, extra_source, name_expressions, jitify,
                                 compiler._get_arch_for_options_for_nvrtc(arch))).encode()).hexdigest()
        payload = None if cache_in_memory else compiler._kernel_cache_backend.load(name)
        if payload is None:
            payload = b"NVRTC:" + source.encode()
            compiled.append(source)
            if not cache_in_memory:
                compiler._kernel_cache_backend.save(name, payload, source)
        return payload

    compiler._compile_with_cache_cuda = compile_with_cache
    compiler._get_nvrtc_version = lambda: nvrtc
    compiler._get_arch = lambda: arch
    compiler._get_arch_for_options_for_nvrtc = (
        lambda a: (f"-arch=compute_{a}", "ptx") if ptx else (f"-arch=sm_{a}", "cubin"))
    compiler._KernelCacheBackend = _Base
    compiler._DiskKernelCacheBackend = _Disk
    compiler._kernel_cache_backend = _Disk()
    compiler._set_kernel_cache_backend = lambda b: setattr(compiler, "_kernel_cache_backend", b)
    cupy.cuda = cuda
    cuda.compiler = compiler
    for name, mod in (("cupy", cupy), ("cupy.cuda", cuda), ("cupy.cuda.compiler", compiler)):
        monkeypatch.setitem(sys.modules, name, mod)
    return compiler


@pytest.fixture
def fresh(monkeypatch, tmp_path):
    monkeypatch.setitem(kernel_cache._STATE, "installed", None)
    monkeypatch.setitem(kb._STATE, "installed", False)
    monkeypatch.setitem(kb._STATE, "paths", None)
    monkeypatch.setattr(kb, "_BUNDLES", {})
    monkeypatch.setenv("ADAPTMG_KERNEL_CACHE", str(tmp_path / "adaptmg"))
    monkeypatch.setenv("ADAPTMG_KERNEL_BUNDLE_DIR", str(tmp_path / "bundle"))
    monkeypatch.delenv("ADAPTMG_KERNEL_BUNDLE", raising=False)
    os.makedirs(tmp_path / "bundle")


def _calls(comp, root):
    inc = f"-I{root}/cupy/_core/include"
    comp._compile_with_cache_cuda("k1 src", (inc, "--std=c++17"), None, "HEADERS", "nvrtc")
    comp._compile_with_cache_cuda("k2 src", (inc,), "90", "HEADERS", "nvrtc",
                                  name_expressions=("f<double>", "f<float>"), jitify=True)
    comp._compile_with_cache_cuda(f"#include <{root}/cuda/include/x.h>\nk3 src", (), None, None, "nvrtc")


def _bundle_from_machine_a(monkeypatch, tmp_path, arch="90", **fake):
    """Record the calls on machine A, write the manifest and a bundle of A's 'compiles'."""
    root = str(tmp_path / "machine_a")
    comp = _fake_cupy(monkeypatch, root, [], arch=arch, **fake)
    with km.record(tmp_path / "a.json"):
        _calls(comp, root)
    path = km.merge({"t": str(tmp_path / "a.json")}, tmp_path / "m.json.gz")
    doc = km.load(path)
    paths = km._paths()
    payloads = {}
    for e in doc["entries"]:
        kw = km.call_kwargs(e, paths, doc["extra_sources"], arch)
        text = doc["extra_sources"][e["extra_source"]] if "extra_source" in e else None
        payloads[kb.call_key(e, arch, text, kb._target(comp, arch))] = b"SHIPPED:" + _generic(kw["source"], root)
    payloads["unused"] = payloads[next(iter(payloads))]            # a duplicate: stored once
    with open(path, "rb") as f:
        mhash = hashlib.md5(f.read()).hexdigest()
    header = kb.write(kb.bundle_path(arch), payloads, cupy_version=doc["cupy"], nvrtc_version=doc["nvrtc"],
                      arch=arch, manifest_hash=mhash)
    return path, mhash, header


def _generic(source, root):
    return source.replace(root, "{ROOT}").encode()


def _machine_b(monkeypatch, tmp_path, **fake):
    """Another install (other paths) with the layered cache and the bundle hook in place:
    (its compiler, the list of sources it compiles, its root)."""
    compiled = []
    root = str(tmp_path / "machine_b")
    comp = _fake_cupy(monkeypatch, root, compiled, **fake)
    kernel_cache.install(comp)
    kb.install(comp)
    return comp, compiled, root


def test_a_call_recorded_on_one_machine_is_served_on_another(monkeypatch, tmp_path, fresh):
    _, _, header = _bundle_from_machine_a(monkeypatch, tmp_path)
    assert len(header["keys"]) == 4
    assert header["size"] == sum(len(b"SHIPPED:") + len(s) for s in (b"k1 src", b"k2 src")) + \
        len(b"SHIPPED:#include <{ROOT}/cuda/include/x.h>\nk3 src")         # distinct payloads only
    compiled = []
    root = str(tmp_path / "machine_b")                                     # other install paths
    comp = _fake_cupy(monkeypatch, root, compiled)
    assert kernel_cache.install(comp) and kb.install(comp)
    assert kb.install(comp)                                                # idempotent
    _calls(comp, root)
    assert compiled == []                                                  # nothing compiled
    cached = comp._kernel_cache_backend.primary.files
    assert sorted(cached.values()) == sorted({b"SHIPPED:" + s for s in (
        b"k1 src", b"k2 src", b"#include <{ROOT}/cuda/include/x.h>\nk3 src")})
    # stored under CuPy's names: a later call is a plain cache hit (no key computed)
    monkeypatch.setattr(kb, "payload", lambda: pytest.fail("the bundle was asked again"))
    _calls(comp, root)
    assert compiled == []


@pytest.mark.parametrize("change", ["source", "options", "arch", "extra", "names"])
def test_a_call_that_differs_in_anything_compiled_is_not_served(monkeypatch, tmp_path, fresh, change):
    _bundle_from_machine_a(monkeypatch, tmp_path)
    comp, compiled, root = _machine_b(monkeypatch, tmp_path)
    inc = f"-I{root}/cupy/_core/include"
    args = dict(source="k2 src", options=(inc,), arch="90", extra_source="HEADERS",
                name_expressions=("f<double>", "f<float>"), jitify=True)
    comp._compile_with_cache_cuda(**args)
    assert compiled == []
    args.update({"source": dict(source="k2 src "), "options": dict(options=(inc, "-O2")),
                 "arch": dict(arch="100"), "extra": dict(extra_source="HEADERS2"),
                 "names": dict(name_expressions=("f<double>",))}[change])
    comp._compile_with_cache_cuda(**args)
    assert compiled == [args["source"]]


@pytest.mark.parametrize("other", [dict(version="14.3.0"), dict(nvrtc=(13, 1)), dict(ptx=True)])
def test_another_cupy_nvrtc_or_target_gets_nothing(monkeypatch, tmp_path, fresh, other):
    _bundle_from_machine_a(monkeypatch, tmp_path)
    comp, compiled, root = _machine_b(monkeypatch, tmp_path, **other)
    _calls(comp, root)
    assert len(compiled) == 3


def test_a_damaged_file_serves_nothing(monkeypatch, tmp_path, fresh):
    _bundle_from_machine_a(monkeypatch, tmp_path)
    path = kb.bundle_path("90")
    data = bytearray(open(path, "rb").read())
    head = data.index(b"\n") + 1
    data[head:] = __import__("lzma").compress(b"X" * 40)                   # right format, wrong bytes
    open(path, "wb").write(bytes(data))
    comp, compiled, root = _machine_b(monkeypatch, tmp_path)
    _calls(comp, root)
    assert len(compiled) == 3 and kb._BUNDLES["90"] is False


def test_turned_off_or_in_memory_calls_are_not_served(monkeypatch, tmp_path, fresh):
    _bundle_from_machine_a(monkeypatch, tmp_path)
    compiled = []
    root = str(tmp_path / "machine_b")
    comp = _fake_cupy(monkeypatch, root, compiled)
    kernel_cache.install(comp)
    monkeypatch.setenv("ADAPTMG_KERNEL_BUNDLE", "0")
    assert not kb.install(comp)
    _calls(comp, root)
    assert len(compiled) == 3
    monkeypatch.delenv("ADAPTMG_KERNEL_BUNDLE")
    assert kb.install(comp)
    comp._compile_with_cache_cuda("k1 src", (f"-I{root}/cupy/_core/include", "--std=c++17"), None,
                                  "HEADERS", "nvrtc", cache_in_memory=True)
    assert len(compiled) == 4


def test_prefetch_starts_no_workers_when_the_files_cover_the_manifest(monkeypatch, tmp_path, fresh):
    path, mhash, _ = _bundle_from_machine_a(monkeypatch, tmp_path)
    started = []

    class Worker:
        def __init__(self, cmd, **kw):
            started.append(cmd)

        def wait(self):
            return 0

    monkeypatch.setattr(km.subprocess, "Popen", Worker)
    assert kb.covers(mhash, "90") and not kb.covers("0" * 32, "90") and not kb.covers(mhash, "80")
    assert km.prefetch(path=path, jobs=2, wait=True) == [] and started == []
    assert len(km.prefetch(path=path, jobs=2, wait=True, arch="80")) == 2         # no file for sm_80
    for f in os.listdir(tmp_path / "adaptmg"):
        os.remove(tmp_path / "adaptmg" / f)
    assert len(km.prefetch(path=path, jobs=2, wait=True, bundled="compile")) == 2  # building one
    monkeypatch.setenv("ADAPTMG_KERNEL_BUNDLE", "off")
    assert not kb.covers(mhash, "90")


def test_build_compiles_the_manifest_per_architecture_and_serves_it(monkeypatch, tmp_path, fresh):
    """build(): the manifest's workers (here a stand-in that compiles every entry into the
    temporary caches the build hands them, whatever ADAPTMG_PREFETCH says) per architecture,
    then each entry's cubin under its key; a process on another install is then served."""
    root = str(tmp_path / "machine_a")
    comp = _fake_cupy(monkeypatch, root, [])
    with km.record(tmp_path / "a.json"):
        _calls(comp, root)
    path = km.merge({"t": str(tmp_path / "a.json")}, tmp_path / "m.json.gz")
    monkeypatch.setenv("ADAPTMG_PREFETCH", "0")
    seen = []

    def workers(jobs=None, path=None, wait=False, arch=None, bundled="skip"):
        assert os.environ["ADAPTMG_PREFETCH"] == "1" and bundled == "compile" and wait
        seen.append(arch)
        doc, prev = km.load(path), comp._kernel_cache_backend
        comp._kernel_cache_backend = _Disk(os.environ["ADAPTMG_KERNEL_CACHE"])
        try:
            for e in doc["entries"][:2 if arch == "80" else None]:       # sm_80: one fails
                comp._compile_with_cache_cuda(**km.call_kwargs(e, km._paths(), doc["extra_sources"], arch))
        finally:
            comp._kernel_cache_backend = prev
        return [object()]

    monkeypatch.setattr(km, "prefetch", workers)
    out = kb.build(["90", "80"], folder=str(tmp_path / "bundle"), manifest=str(path), log=lambda *a: None)
    assert seen == ["90", "80"] and out == {"90": (3, 0), "80": (2, 1)}
    assert os.environ["ADAPTMG_PREFETCH"] == "0"                          # put back
    with open(path, "rb") as f:
        mhash = hashlib.md5(f.read()).hexdigest()
    assert kb.covers(mhash, "90") and not kb.covers(mhash, "80")          # sm_80 lacks one kernel
    comp, compiled, root = _machine_b(monkeypatch, tmp_path)
    _calls(comp, root)
    assert compiled == []
    assert sorted(comp._kernel_cache_backend.primary.files.values())[0].startswith(b"NVRTC:")   # A's bytes


def test_shipped_files_match_the_shipped_manifest():
    """Every shipped file was built from the shipped manifest (else the prefetch would skip
    kernels the file lacks: re-run ``adaptmg warmup --bundle`` after re-recording)."""
    with open(km.MANIFEST, "rb") as f:
        mhash = hashlib.md5(f.read()).hexdigest()
    doc = km.load()
    here = os.path.dirname(km.MANIFEST)
    files = [f for f in os.listdir(here) if f.startswith("kernel_cubins_sm") and f.endswith(".bin")]
    assert files, "no cubin files shipped"
    for f in files:
        h = kb.read_header(os.path.join(here, f))
        assert h is not None and f == f"kernel_cubins_sm{h['arch']}.bin"
        assert h["manifest"] == mhash, f"{f} was built from another manifest"
        assert (h["cupy"], h["nvrtc"]) == (doc["cupy"], doc["nvrtc"])
        assert len(h["keys"]) == len(doc["entries"])


def test_cli_bundle_arguments(capsys):
    from adaptmg.cli import main
    for bad in (["--bundle", "sm90x"], ["--bundle", ""], ["--bundle", "90", "--manifest"], ["--out", "x"]):
        with pytest.raises(SystemExit) as e:
            main(["warmup", *bad])
        assert e.value.code == 2
        assert "--bundle" in capsys.readouterr().err


_PROBE = """
    import json, os, sys
    import cupy
    import cupy.cuda.compiler as C
    from adaptmg.backend import get_backend
    from adaptmg.device import kernel_manifest as km, kernel_bundle as kb
    km._STATE["started"] = []                  # no prefetch: only the bundle may serve
    get_backend("gpu")
    count = [0]
    real = C.nvrtc.createProgram
    def counted(src, *a, **k):                 # programs with a body (CuPy's version probe compiles
        count[0] += bool(src.strip())          # an empty one per option set)
        return real(src, *a, **k)
    C.nvrtc.createProgram = counted
    def probe():
        x = cupy.arange(5, dtype=cupy.float64)
        cupy.RawKernel({src!r}, {name!r})((1,), (1,), (x,))
        y = cupy.sqrt(x * 3.0 + 1.0)
        return [float(x[0]), float(y[4]), float(x.sum())]
    mode, where = sys.argv[1], sys.argv[2]
    if mode == "record":
        with km.record(os.path.join(where, "t.json")):
            probe()
        km.merge({{"t": os.path.join(where, "t.json")}}, os.path.join(where, "m.json.gz"))
    elif mode == "build":
        res = kb.build([C._get_arch()], folder=os.path.join(where, "bundle"), jobs=2,
                       manifest=os.path.join(where, "m.json.gz"))
        print(json.dumps(list(res.values())[0]))
    else:
        print(json.dumps(probe()))
    print(json.dumps(count[0]))
"""


@pytest.mark.gpu
def test_built_bundle_runs_a_fresh_process_without_nvrtc(tmp_path):
    """Record a RawKernel and CuPy element-wise and reduction kernels, build the bundle of
    this GPU's architecture from that manifest (worker processes, empty caches), then run
    the kernels in a process with empty caches and no prefetch: NVRTC compiles nothing and
    the numbers are right."""
    name = f"adaptmg_bundle_probe_{os.getpid()}"
    src = f'extern "C" __global__ void {name}(double* x) {{ x[0] += 1.0; }}'
    script = tmp_path / "probe.py"
    script.write_text(textwrap.dedent(_PROBE.format(src=src, name=name)))

    def run(mode, cache):
        env = dict(os.environ, CUPY_CACHE_DIR=str(tmp_path / cache / "cupy"), ADAPTMG_PREFETCH="0",
                   ADAPTMG_KERNEL_CACHE=str(tmp_path / cache / "adaptmg"),
                   ADAPTMG_KERNEL_BUNDLE_DIR=str(tmp_path / "bundle"),
                   # recorded with NVRTC (not served by the package's cubins), used with this one
                   ADAPTMG_KERNEL_BUNDLE="1" if mode == "use" else "0")
        p = subprocess.run([sys.executable, str(script), mode, str(tmp_path)], env=env,
                           capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, p.stderr[-3000:]
        return [json.loads(line) for line in p.stdout.strip().splitlines()[-2:]]

    assert run("record", "first")[-1] >= 3                   # NVRTC ran (empty caches)
    (stored, missing), _ = run("build", "second")
    assert stored >= 3 and missing == 0
    got, compiled = run("use", "third")
    assert compiled == 0
    assert np.allclose(got, [1.0, np.sqrt(13.0), 11.0], rtol=4 * np.finfo(float).eps)


@pytest.mark.gpu
@pytest.mark.parametrize("run", ["run_task('q1-2d', backend='gpu')",
                                 "from adaptmg.device.warmup import _distributed; _distributed('gpu', levels=(4,))"])
def test_shipped_bundle_serves_a_fresh_multigrid_run(tmp_path, run):
    """A fresh process with empty caches and no prefetch runs, from the shipped cubins
    (NVRTC compiles nothing), the warm-up task ``q1-2d`` (adaptive 2-D Q1 multigrid set-up,
    CG/GMRES/FGMRES solves in float64 and float32, CUDA graphs) and the small problems of
    the task ``distributed`` (the local set-up and solve on two in-process ranks: assembled
    and matrix-free levels, device and host mesh)."""
    from adaptmg.device import kernel_bundle
    import cupy.cuda.compiler as C
    if kernel_bundle.read_header(kernel_bundle.bundle_path(C._get_arch())) is None:
        pytest.skip(f"no shipped cubins for sm_{C._get_arch()}")
    code = textwrap.dedent("""
        import json
        import cupy.cuda.compiler as C
        from adaptmg.backend import get_backend
        from adaptmg.device import kernel_manifest as km
        from adaptmg.device.warmup import run_task
        km._STATE["started"] = []
        get_backend("gpu")
        count = [0]
        real = C.nvrtc.createProgram
        def counted(src, *a, **k):
            count[0] += bool(src.strip())
            return real(src, *a, **k)
        C.nvrtc.createProgram = counted
        RUN
        print(json.dumps(count[0]))
    """).replace("RUN", run)
    env = dict(os.environ, CUPY_CACHE_DIR=str(tmp_path / "cupy"), ADAPTMG_KERNEL_CACHE=str(tmp_path / "adaptmg"),
               ADAPTMG_PREFETCH="0")
    env.pop("ADAPTMG_KERNEL_BUNDLE_DIR", None)
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    assert json.loads(p.stdout.strip().splitlines()[-1]) == 0
