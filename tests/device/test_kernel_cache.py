"""adaptmg's kernel cache layered under CuPy's (adaptmg.device.kernel_cache) and the warm-up."""
import abc
import hashlib
import os
import subprocess
import sys
import types

import pytest

from adaptmg.device import kernel_cache
from adaptmg.device.warmup import TASKS, run_task, warmup


class _Base(abc.ABC):
    @abc.abstractmethod
    def load(self, name): ...

    @abc.abstractmethod
    def save(self, name, cubin, source): ...


class _Disk(_Base):
    """Stand-in of CuPy's disk cache: a file holds sha1(cubin) + cubin, as CuPy writes it."""

    def __init__(self, folder):
        os.makedirs(folder, exist_ok=True)
        self.folder = folder

    def load(self, name):
        path = os.path.join(self.folder, name)
        if not os.path.exists(path):
            return None
        data = open(path, "rb").read()
        return data[40:] if hashlib.sha1(data[40:]).hexdigest().encode() == data[:40] else None

    def save(self, name, cubin, source):
        with open(os.path.join(self.folder, name), "wb") as f:
            f.write(hashlib.sha1(cubin).hexdigest().encode() + cubin)


def _fake_compiler(cupy_dir):
    mod = types.SimpleNamespace(_KernelCacheBackend=_Base, _DiskKernelCacheBackend=_Disk,
                                _kernel_cache_backend=_Disk(cupy_dir))
    mod._set_kernel_cache_backend = lambda b: setattr(mod, "_kernel_cache_backend", b)
    return mod


@pytest.fixture
def fresh_state(monkeypatch):
    monkeypatch.setitem(kernel_cache._STATE, "installed", None)


def test_layered_cache_finds_adaptmg_copy_when_cupy_cache_is_empty(tmp_path, monkeypatch, fresh_state):
    monkeypatch.setenv("ADAPTMG_KERNEL_CACHE", str(tmp_path / "adaptmg"))
    first = _fake_compiler(str(tmp_path / "cupy1"))
    assert kernel_cache.install(first) and kernel_cache.installed()
    cache = first._kernel_cache_backend
    assert cache.load("k.cubin") is None                        # nowhere yet: compile
    cache.save("k.cubin", b"CUBIN", "src")
    assert (tmp_path / "cupy1" / "k.cubin").exists() and (tmp_path / "adaptmg" / "k.cubin").exists()

    # a new process whose CuPy cache is empty finds the cubin in adaptmg's cache and copies it
    kernel_cache._STATE["installed"] = None
    second = _fake_compiler(str(tmp_path / "cupy2"))
    assert kernel_cache.install(second)
    assert second._kernel_cache_backend.load("k.cubin") == b"CUBIN"
    assert _Disk(str(tmp_path / "cupy2")).load("k.cubin") == b"CUBIN"
    assert second._kernel_cache_backend.load("other.cubin") is None


def test_corrupt_adaptmg_file_is_not_used(tmp_path, monkeypatch, fresh_state):
    monkeypatch.setenv("ADAPTMG_KERNEL_CACHE", str(tmp_path / "adaptmg"))
    comp = _fake_compiler(str(tmp_path / "cupy"))
    kernel_cache.install(comp)
    (tmp_path / "adaptmg" / "bad.cubin").write_bytes(b"0" * 40 + b"garbage")
    assert comp._kernel_cache_backend.load("bad.cubin") is None
    assert not (tmp_path / "cupy" / "bad.cubin").exists()


def test_install_is_a_no_op_without_the_hook_or_when_off(tmp_path, monkeypatch, fresh_state):
    monkeypatch.setenv("ADAPTMG_KERNEL_CACHE", str(tmp_path / "adaptmg"))
    old = types.SimpleNamespace(_kernel_cache_backend=object())    # a CuPy without the hook
    assert kernel_cache.install(old) is False
    kernel_cache._STATE["installed"] = None
    monkeypatch.setenv("ADAPTMG_KERNEL_CACHE", "off")
    comp = _fake_compiler(str(tmp_path / "cupy"))
    before = comp._kernel_cache_backend
    assert kernel_cache.install(comp) is False and comp._kernel_cache_backend is before


def test_cache_dir_defaults(monkeypatch):
    monkeypatch.delenv("ADAPTMG_KERNEL_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", "/x/cache")
    assert kernel_cache.cache_dir() == os.path.join("/x/cache", "adaptmg", "kernels")
    monkeypatch.setenv("ADAPTMG_KERNEL_CACHE", "~/k")
    assert kernel_cache.cache_dir() == os.path.expanduser("~/k")
    for off in ("off", "0", "none", ""):
        monkeypatch.setenv("ADAPTMG_KERNEL_CACHE", off)
        assert kernel_cache.cache_dir() is None


@pytest.mark.parametrize("task", ["q1-2d", "q2-2d", "smoothers-2d", "elasticity-3d", "spectral"])
def test_warmup_tasks_run_on_the_host(task):
    """The warm-up's problems are valid calls of the library (on the host here)."""
    run_task(task, backend="cpu")


@pytest.mark.parametrize("task", ["q1-3d-device-mesh-huge", "distributed-huge", "estimate-huge"])
def test_huge_warmup_tasks_run_on_a_large_gpu_only(task):
    """The ~2e7-DoF tasks (kernels with 64-bit indices) are skipped on the host and where the
    device has less than HUGE_GIB / DISTRIBUTED_HUGE_GIB free: a quick return, not a 2e7-DoF
    host solve (nor a wait for memory that a host never frees)."""
    import time
    from adaptmg.device import warmup as W
    assert W.TASKS["q1-3d-device-mesh-huge"][0] is W._huge and not W._device_fits("cpu")
    assert W.TASKS["distributed-huge"][0] is W._distributed_huge and not W._memory_frees_up("cpu", 1)
    assert W.TASKS["estimate-huge"][0] is W._estimate_huge
    t = time.perf_counter()
    run_task(task, backend="cpu")
    assert time.perf_counter() - t < 5.0


def test_estimate_huge_task_body_runs_on_the_host():
    """What ``estimate-huge`` runs on a large GPU is a valid call (a small mesh on the host)."""
    from adaptmg.device import warmup as W
    W._estimate_on_device_mesh("cpu", 3, 1, 1)


def test_large_warmup_tasks_take_turns():
    """The warm-up runs its tasks in parallel processes on one device: the large ones enter
    their problem one at a time (a file lock), so two of them never share the memory."""
    import threading
    from adaptmg.device import warmup as W
    inside, entered, release = [], threading.Event(), threading.Event()

    def task(name):
        with W._one_large_task_at_a_time():
            inside.append(name)
            entered.set()
            release.wait(10)
            inside.remove(name)

    first = threading.Thread(target=task, args=("a",))
    first.start()
    assert entered.wait(10)
    entered.clear()
    second = threading.Thread(target=task, args=("b",))
    second.start()
    assert not entered.wait(0.3) and inside == ["a"]             # b waits for a
    release.set()
    first.join(10)
    second.join(10)
    assert entered.is_set() and inside == []


def test_warmup_refuses_unknown_tasks_and_needs_a_gpu():
    with pytest.raises(ValueError, match="unknown warm-up task"):
        run_task("nope")
    from adaptmg.backend import gpu_available
    if not gpu_available():
        with pytest.raises(RuntimeError, match="backend='gpu'"):
            warmup(["q1-2d"])
    assert "amg-3d-large" in TASKS


def test_cli_warmup_without_gpu_says_so():
    from adaptmg.backend import gpu_available
    if gpu_available():
        pytest.skip("a GPU is visible")
    p = subprocess.run([sys.executable, "-m", "adaptmg", "warmup"], capture_output=True, text=True)
    assert p.returncode == 1 and "no GPU visible" in p.stderr


@pytest.mark.gpu
def test_fresh_process_with_empty_cupy_cache_compiles_nothing_after_warmup(tmp_path):
    """After a warm-up task, a new process with an empty CuPy cache loads every kernel of the
    same task from adaptmg's cache (nothing left to compile)."""
    env = dict(os.environ, ADAPTMG_KERNEL_CACHE=str(tmp_path / "adaptmg"),
               CUPY_CACHE_DIR=str(tmp_path / "cupy1"), ADAPTMG_PREFETCH="0")   # the layers alone
    code = "from adaptmg.device.warmup import run_task; run_task('q1-2d')"
    subprocess.run([sys.executable, "-c", code], env=env, check=True)
    n_adaptmg = len(os.listdir(tmp_path / "adaptmg"))
    assert n_adaptmg > 10
    env["CUPY_CACHE_DIR"] = str(tmp_path / "cupy2")
    subprocess.run([sys.executable, "-c", code], env=env, check=True)
    assert len(os.listdir(tmp_path / "adaptmg")) == n_adaptmg        # nothing new compiled
    assert len(os.listdir(tmp_path / "cupy2")) >= n_adaptmg - 1
