"""Shared pytest configuration: the ``gpu`` marker skips where no device is visible."""
import pytest

from adaptmg.backend import gpu_available


def pytest_collection_modifyitems(config, items):
    if gpu_available():
        return
    skip = pytest.mark.skip(reason="needs CuPy and a visible CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(params=["cpu", pytest.param("gpu", marks=pytest.mark.gpu)])
def backend(request):
    """Run a test body once on NumPy and once on CuPy (the latter only with -m gpu)."""
    from adaptmg.backend import get_backend
    return get_backend(request.param)


@pytest.fixture
def host_gpu(monkeypatch, tmp_path):
    """``get_backend("gpu")`` answers a backend whose ``xp`` runs adaptmg's RawModules on the
    host (``tests/host_cuda.py``: g++, one thread per CUDA thread); skipped without g++."""
    import adaptmg.backend as backend
    from host_cuda import HAVE_GXX, HostXP
    if not HAVE_GXX:
        pytest.skip("needs g++ (C++20)")
    fake = backend.Backend("gpu", HostXP(tmp_path), None)
    real = backend.get_backend
    monkeypatch.setattr(backend, "get_backend", lambda name="auto": fake if name == "gpu" else real(name))
    return fake


@pytest.fixture
def fake_gpu(monkeypatch):
    """``get_backend("gpu")`` answers the stand-in CuPy of ``tests/distributed/fake_cupy.py``
    (SciPy matrices and NumPy arrays that claim to be cupyx / CuPy ones, whose ``get`` is
    counted): the device branches of the set-up run with NumPy -- their arithmetic and their
    device -> host copies, not CUDA.  Returns the ``fake_cupy`` module."""
    import pathlib
    import adaptmg.backend as backend
    monkeypatch.syspath_prepend(str(pathlib.Path(__file__).resolve().parent / "distributed"))
    import fake_cupy
    monkeypatch.setattr(backend, "_cupy_status", lambda: (fake_cupy.xp, fake_cupy.csp, ""))
    return fake_cupy
