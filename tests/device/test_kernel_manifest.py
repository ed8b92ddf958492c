"""The recorded kernel manifest and its parallel replay (adaptmg.device.kernel_manifest).

On the CPU a fake ``cupy.cuda.compiler`` stands in for CuPy's: what is checked is that the
replay hands CuPy's compile function exactly the arguments the recorded process gave it,
with the recording machine's paths swapped for this machine's, and that :func:`prefetch`
declines where it must.  The GPU test replays a real manifest into empty caches and checks
that the kernel is then loaded, not compiled."""
import json
import os
import re
import subprocess
import sys
import textwrap
import types

import numpy as np
import pytest

from adaptmg.device import kernel_groups as kg
from adaptmg.device import kernel_manifest as km


def _fake_cupy(monkeypatch, root, calls, arch="90", version="14.2.0"):
    cupy = types.ModuleType("cupy")
    cupy.__file__ = os.path.join(root, "cupy", "__init__.py")
    cupy.__version__ = version
    cuda = types.ModuleType("cupy.cuda")
    cuda.get_cuda_path = lambda: os.path.join(root, "cuda")
    compiler = types.ModuleType("cupy.cuda.compiler")

    def compile_with_cache(source, options, arch, cache_dir, extra_source=None, backend="nvrtc",
                           enable_cooperative_groups=False, name_expressions=None, log_stream=None,
                           cache_in_memory=False, jitify=False):
        calls.append(dict(source=source, options=options, arch=arch, extra_source=extra_source,
                          backend=backend, name_expressions=name_expressions, jitify=jitify))

    compiler._compile_with_cache_cuda = compile_with_cache
    compiler._get_nvrtc_version = lambda: (13, 2)
    compiler._get_arch = lambda: arch
    compiler.function = types.ModuleType("cupy.cuda.function")
    compiler.function.Module = object
    cupy.cuda = cuda
    cuda.compiler = compiler
    for name, mod in (("cupy", cupy), ("cupy.cuda", cuda), ("cupy.cuda.compiler", compiler)):
        monkeypatch.setitem(sys.modules, name, mod)
    return compiler


def _record_two_tasks(monkeypatch, tmp_path):
    calls = []
    root = str(tmp_path / "machine_a")
    comp = _fake_cupy(monkeypatch, root, calls)
    inc = f"-I{root}/cupy/_core/include"
    parts = {}
    with km.record(tmp_path / "a.json"):
        comp._compile_with_cache_cuda("k1 src", (inc, "--std=c++17"), None, None, "HEADERS", "nvrtc")
        comp._compile_with_cache_cuda("k2 src", (inc,), "90", None, "HEADERS", "nvrtc",
                                      name_expressions=("f<double>", "f<float>"), jitify=True)
        comp._compile_with_cache_cuda("k1 src", (inc, "--std=c++17"), None, None, "HEADERS", "nvrtc")
    parts["a"] = str(tmp_path / "a.json")
    with km.record(tmp_path / "b.json"):
        comp._compile_with_cache_cuda("k3 src", (f"-I{root}/cuda/include",), None, None, None, "nvrtc")
        comp._compile_with_cache_cuda("k1 src", (inc, "--std=c++17"), None, None, "HEADERS", "nvrtc")
    parts["b"] = str(tmp_path / "b.json")
    return calls, parts


def test_record_merge_order_and_placeholders(monkeypatch, tmp_path):
    calls, parts = _record_two_tasks(monkeypatch, tmp_path)
    assert len(calls) == 5                            # the recorder passes every call through
    out = km.merge(parts, tmp_path / "m.json.gz")
    doc = km.load(out)
    assert doc["cupy"] == "14.2.0" and doc["nvrtc"] == [13, 2]
    assert doc["extra_sources"] == ["HEADERS"]         # stored once
    task = {t: [doc["entries"][i] for i in ix] for t, ix in doc["tasks"].items()}
    assert [e["source"] for e in task["a"]] == ["k1 src", "k2 src"]    # duplicates dropped
    assert [e["source"] for e in task["b"]] == ["k3 src", "k1 src"]
    assert len(doc["entries"]) == 3                                      # each call stored once
    assert task["a"][0]["options"] == ["-I{CUPY}/_core/include", "--std=c++17"]
    assert task["b"][0]["options"] == ["-I{CUDA}/include"]
    assert "arch" not in task["a"][1]          # the recording machine's arch: not stored
    assert [e["source"] for e in km._ordered(doc)] == ["k1 src", "k2 src", "k3 src"]
    assert [e["source"] for e in km._ordered(doc, first=("b",))] == ["k3 src", "k1 src", "k2 src"]


def test_worker_replays_the_recorded_calls_on_another_install(monkeypatch, tmp_path):
    _, parts = _record_two_tasks(monkeypatch, tmp_path)
    doc = km.load(km.merge(parts, tmp_path / "m.json.gz"))
    calls = []
    root = str(tmp_path / "machine_b")
    _fake_cupy(monkeypatch, root, calls, arch="100")
    order = tmp_path / "order.json"
    order.write_text(json.dumps({"entries": km._ordered(doc), "extra_sources": doc["extra_sources"]}))
    for i in range(2):                                 # two workers, entries i::2
        km._worker(str(order), i, 2, "100")
    got = {c["source"]: c for c in calls}
    assert sorted(got) == ["k1 src", "k2 src", "k3 src"]
    assert got["k1 src"]["options"] == (f"-I{root}/cupy/_core/include", "--std=c++17")
    assert got["k1 src"]["extra_source"] == "HEADERS" and got["k3 src"]["extra_source"] is None
    assert got["k3 src"]["options"] == (f"-I{root}/cuda/include",)
    assert got["k2 src"]["name_expressions"] == ("f<double>", "f<float>") and got["k2 src"]["jitify"] is True
    assert {c["arch"] for c in calls} == {"100"}       # this machine's architecture


def test_prefetch_declines(monkeypatch, tmp_path):
    _, parts = _record_two_tasks(monkeypatch, tmp_path)
    path = km.merge(parts, tmp_path / "m.json.gz")
    monkeypatch.setenv("ADAPTMG_KERNEL_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("ADAPTMG_PREFETCH", "0")
    assert km.prefetch(path=path, wait=True) == []
    monkeypatch.setenv("ADAPTMG_PREFETCH", "1")
    _fake_cupy(monkeypatch, str(tmp_path / "c"), [], version="15.0.0")     # another CuPy
    assert km.prefetch(path=path, wait=True) == []
    assert km.prefetch(path=tmp_path / "missing.json.gz", wait=True) == []
    monkeypatch.setenv("ADAPTMG_KERNEL_CACHE", "off")
    _fake_cupy(monkeypatch, str(tmp_path / "c"), [])
    assert km.prefetch(path=path, wait=True) == []
    assert not (tmp_path / "cache").exists()


def _nvrtc_fake(monkeypatch, root, programs, saved, fail=lambda src: False, drop=()):
    """A fake CuPy whose compile-with-cache does what CuPy 14's does around NVRTC: options +
    -ftz, the NVRTC call, the fresh module's mapping set, the payload saved under the
    entry's own key (here: its source).  The fake NVRTC's "cubin" names a code section per
    ``extern "C"`` kernel of the program, less those in ``drop``."""
    comp = _fake_cupy(monkeypatch, root, [])

    def nvrtc(source, options, arch, filename, *rest):
        programs.append((source, tuple(options), arch))
        if fail(source):
            raise RuntimeError("nvrtc: error: something the merge broke")
        names = [n for n in re.findall(r'extern "C" __global__ void (\w+)', source) if n not in drop]
        return b"\0" + b"".join(b".text." + n.encode() + b"\0" for n in names), None

    def compile_with_cache(source, options, arch, extra_source=None, backend="nvrtc", **kw):
        cubin, mapping = comp._compile_using_nvrtc_no_warning(source, tuple(options) + ("-ftz=true",), arch,
                                                             "key.cu", None, None, False, False, None)
        comp.function.Module()._set_mapping(mapping)
        saved.append((source, cubin))

    comp._compile_with_cache_cuda = compile_with_cache
    comp._compile_using_nvrtc_no_warning = nvrtc
    comp._get_max_compute_capability = lambda: "121"
    return comp


def _ew(name, t="int"):
    return {"source": f'#include <cupy/carray.cuh>\ntypedef {t} T;\nextern "C" __global__ void {name}(T* x) {{}}\n',
            "options": ["-I{CUPY}/_core/include"], "backend": "nvrtc", "extra_source": 0}


def _order(tmp_path, entries, units=None, claims=None, group_size=16):
    order = tmp_path / "order.json"
    doc = {"entries": entries, "claims": claims, "extra_sources": ["H"], "group_size": group_size}
    if units is not None:
        doc["units"] = units
    order.write_text(json.dumps(doc))
    return str(order)


def test_worker_compiles_a_unit_once_and_saves_it_under_every_key(monkeypatch, tmp_path):
    entries = [_ew("ka"), _ew("kb"), _ew("ka", "long"), {"source": 'extern "C" __global__ void raw() {}',
                                                          "options": [], "backend": "nvrtc"}]
    units = kg.groups(entries)
    assert units == [[0, 1], [2], [3]]
    programs, saved = [], []
    _nvrtc_fake(monkeypatch, str(tmp_path / "m"), programs, saved)
    km._worker(_order(tmp_path, entries, claims=str(tmp_path)), 0, 1, "90")   # groups them itself
    assert len(programs) == 3                                  # 4 kernels, 3 NVRTC programs
    merged = programs[0][0]
    assert merged == kg.merged_source([e["source"] for e in entries[:2]])
    assert programs[0][1] == (f"-I{tmp_path}/m/cupy/_core/include", "-ftz=true") and programs[0][2] == "90"
    assert [s for s, _ in saved] == [e["source"] for e in entries]    # every entry under its own key
    assert saved[0][1] == saved[1][1] and kg.has_kernels(saved[0][1], ["ka", "kb"])
    assert programs[1][0] == entries[2]["source"]              # the unit of one: its own source
    assert sorted(os.listdir(tmp_path))[:3] == ["0", "1", "2"]  # each unit claimed once
    saved.clear()
    km._worker(_order(tmp_path, entries, units, claims=str(tmp_path)), 1, 2, "90")
    assert saved == []                                         # a second worker finds them claimed
    programs.clear()
    km._worker(_order(tmp_path, entries, units), 0, 1, "200")  # beyond NVRTC's archs: PTX, unmerged
    assert [p[0] for p in programs] == [e["source"] for e in entries]
    programs.clear()
    km._worker(_order(tmp_path, entries, group_size=1), 0, 1, "90")    # ADAPTMG_PREFETCH_MERGE=0
    assert [p[0] for p in programs] == [e["source"] for e in entries]


@pytest.mark.parametrize("how", ["nvrtc fails", "kernel missing"])
def test_worker_falls_back_to_one_program_per_kernel(monkeypatch, tmp_path, capfd, how):
    entries = [_ew("ka"), _ew("kb"), _ew("kc")]
    programs, saved = [], []
    if how == "nvrtc fails":
        _nvrtc_fake(monkeypatch, str(tmp_path / "m"), programs, saved, fail=lambda src: "adaptmg_merged" in src)
    else:
        _nvrtc_fake(monkeypatch, str(tmp_path / "m"), programs, saved, drop=("kb",))
    km._worker(_order(tmp_path, entries, [[0, 1, 2]]), 0, 1, "90")
    assert [p[0] for p in programs[1:]] == [e["source"] for e in entries]    # then each one alone
    assert [s for s, _ in saved] == [e["source"] for e in entries]
    for (src, cubin), e in zip(saved, entries):
        name = kg.kernel_names(e)[0]
        assert cubin == b"\0.text." + name.encode() + b"\0" or (how == "kernel missing" and name == "kb")
    assert ("compiling them alone" in capfd.readouterr().err) == (how == "nvrtc fails")


def test_prefetch_hands_the_workers_units_and_the_callers_header_setting(monkeypatch, tmp_path):
    _, parts = _record_two_tasks(monkeypatch, tmp_path)
    path = km.merge(parts, tmp_path / "m.json.gz")
    monkeypatch.setenv("ADAPTMG_KERNEL_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("ADAPTMG_PREFETCH", "1")
    monkeypatch.delenv("CUPY_NVRTC_USE_PCH", raising=False)
    seen = []

    class Worker:
        returncode = 0

        def __init__(self, cmd, env, **kw):
            with open(cmd[4]) as f:
                seen.append((json.load(f), env))

        def wait(self):
            return 0

    monkeypatch.setattr(km.subprocess, "Popen", Worker)
    for merge in ("1", "0"):
        monkeypatch.setenv("ADAPTMG_PREFETCH_MERGE", merge)
        assert len(km.prefetch(path=path, jobs=2, wait=True)) == 2
        doc, env = seen[-1]
        assert "CUPY_NVRTC_USE_PCH" not in env                    # off unless the caller sets it
        assert doc["group_size"] == (kg.GROUP_SIZE if merge == "1" else 1)
        assert os.path.isdir(doc["claims"]) is False               # removed when the workers are done
        files = os.listdir(tmp_path / "cache")
        assert len(files) == 1 and files[0].startswith("prefetched-")       # the marker only
        os.remove(tmp_path / "cache" / files[0])


@pytest.mark.gpu
def test_prefetch_fills_empty_caches(tmp_path):
    """Record a RawKernel and a few CuPy element-wise kernels (sin and cos among them: they
    read the module's address table, which merging lays out differently) in a process with
    empty caches, replay the manifest into new empty caches in worker processes, merged
    programs included; a third process then runs them without NVRTC and gets the right
    numbers (NVRTC programs with a body counted; the recording process's count shows the
    counter counts)."""
    name = f"adaptmg_manifest_probe_{os.getpid()}"
    src = f'extern "C" __global__ void {name}(double* x) {{ x[0] += 1.0; }}'
    script = tmp_path / "probe.py"
    script.write_text(textwrap.dedent(f"""
        import json, os, sys
        import cupy
        import cupy.cuda.compiler as C
        from adaptmg.backend import get_backend
        from adaptmg.device import kernel_manifest as km
        km._STATE["started"] = []              # not the package's manifest: only this test's
        get_backend("gpu")
        count = [0]
        real = C.nvrtc.createProgram
        def counted(src, *a, **k):          # programs with a body (CuPy also compiles an empty
            count[0] += bool(src.strip())   # one per option set: its NVRTC version probe)
            return real(src, *a, **k)
        C.nvrtc.createProgram = counted
        mode, where = sys.argv[1], sys.argv[2]
        def probe():
            x = cupy.arange(5, dtype=cupy.float64)
            cupy.RawKernel({src!r}, {name!r})((1,), (1,), (x,))
            y = cupy.sqrt(x * 3.0 + 1.0)
            z = cupy.sin(x) + cupy.cos(x) * 2.0
            return [float(x[0]), float(y[4]), float(z[2]), int((x > 1.5).sum())]
        if mode == "record":
            with km.record(os.path.join(where, "t.json")):
                probe()
            km.merge({{"t": os.path.join(where, "t.json")}}, os.path.join(where, "m.json.gz"))
        elif mode == "replay":
            procs = km.prefetch(path=os.path.join(where, "m.json.gz"), jobs=2, wait=True)
            print(json.dumps([p.returncode for p in procs]))
        else:
            print(json.dumps(probe()))
        print(json.dumps(count[0]))
    """))

    def run(mode, cache, prefetch="0"):
        env = dict(os.environ, CUPY_CACHE_DIR=str(tmp_path / cache / "cupy"),
                   ADAPTMG_KERNEL_CACHE=str(tmp_path / cache / "adaptmg"), ADAPTMG_PREFETCH=prefetch,
                   ADAPTMG_KERNEL_BUNDLE="0")     # the replay is tested, not the shipped cubins
        p = subprocess.run([sys.executable, str(script), mode, str(tmp_path)], env=env,
                           capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, p.stderr[-3000:]
        return [json.loads(line) for line in p.stdout.strip().splitlines()[-2:]]

    assert run("record", "first")[-1] >= 5                  # NVRTC ran (empty caches)
    doc = km.load(str(tmp_path / "m.json.gz"))
    units = kg.groups(km._ordered(doc))
    assert any(len(u) >= 3 for u in units), units            # merged programs in the replay
    codes, _ = run("replay", "second", prefetch="1")
    assert codes and all(c == 0 for c in codes)
    files = os.listdir(tmp_path / "second" / "adaptmg")
    assert any(f.startswith("prefetched-") for f in files), files
    got, compiled = run("use", "second")
    assert compiled == 0                                      # every kernel loaded, none compiled
    want = [1.0, np.sqrt(13.0), np.sin(2.0) + 2 * np.cos(2.0), 3]
    eps = np.finfo(float).eps                                 # sin, cos: CUDA's vs the host's libm
    assert np.allclose(got, want, rtol=4 * eps, atol=8 * eps), (got, want)


def test_cli_warmup_manifest_waits_for_the_workers_and_reports_failures(monkeypatch, capsys):
    """``adaptmg warmup --manifest``: the prefetch waited for, exit 1 when a worker failed, 0
    with a reason when nothing was started; --tasks/--record are refused with it."""
    from adaptmg import backend, cli
    monkeypatch.setitem(km._STATE, "started", None)

    def gpu_check():          # as backend's: the first GPU use calls start_once
        km.start_once()
        return True
    monkeypatch.setattr(backend, "gpu_available", gpu_check)
    calls = []

    def fake_prefetch(codes):
        def run(jobs=None, wait=False, **kw):
            calls.append((jobs, wait))
            return [types.SimpleNamespace(returncode=c) for c in codes]
        return run

    monkeypatch.setattr(km, "versions", lambda compiler=None: ("x", [13, 0]))
    for codes, rc in (([0, 0], 0), ([0, 3], 1), ([], 0)):
        monkeypatch.setattr(km, "prefetch", fake_prefetch(codes))
        km._STATE["started"] = None
        assert cli.main(["warmup", "--manifest", "--jobs", "2"]) == rc
        # one prefetch, the command's own (waited for): the GPU check started none in the background
        assert calls[-1] == (2, True) and len(calls) == 1
        calls.clear()
        out = capsys.readouterr()
        if codes:
            assert "2 worker processes" in out.out and (("1 failed" in out.out) == (rc == 1))
        else:
            assert "nothing started" in out.err
    with pytest.raises(SystemExit):
        cli.main(["warmup", "--manifest", "--tasks", "q1-2d"])
