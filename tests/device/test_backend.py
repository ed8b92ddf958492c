import numpy as np
import pytest
import scipy.sparse as sp

from adaptmg.backend import CPU, backend_of, get_backend, gpu_available, to_host


def test_cpu_backend_is_numpy():
    be = get_backend("cpu")
    assert be.xp is np and be.sparse is sp and not be.is_gpu


def test_auto_matches_availability():
    assert get_backend("auto").is_gpu == gpu_available()


def test_gpu_without_device_raises_clear_error():
    if gpu_available():
        pytest.skip("a device is visible")
    with pytest.raises(RuntimeError, match="backend='gpu'"):
        get_backend("gpu")


@pytest.mark.parametrize("bad", ["tpu", "", "GPUU"])
def test_unknown_backend_name(bad):
    with pytest.raises(ValueError, match="backend must be"):
        get_backend(bad)


def test_backend_type_error():
    with pytest.raises(TypeError):
        get_backend(3)


def test_round_trip(backend):
    a = np.arange(5.0)
    d = backend.asarray(a)
    assert backend_of(d) == backend
    np.testing.assert_array_equal(to_host(d), a)
    A = sp.random(6, 6, density=0.5, format="csr", random_state=0)
    M = backend.asmatrix(A)
    np.testing.assert_allclose(to_host(M).toarray(), A.toarray())
    assert backend_of(M) == backend
    assert CPU.asarray(d) is not None


@pytest.mark.gpu
def test_large_uploads_page_locked_and_fallback():
    """Arrays above PIN_MIN_BYTES go up through a page-locked copy; the values, dtype and
    shape are exact, also for a dtype conversion, a strided view and pages that are already
    registered (plain-copy fallback); a large CSR matrix arrives identical."""
    import cupy

    from adaptmg import backend as B
    n = 7 * (B.PIN_MIN_BYTES // 56 + 200)
    a = np.random.default_rng(0).standard_normal(n)
    gpu = get_backend("gpu")
    for src, dtype in ((a, None), (a, np.float32), (a[::2], None), (a.reshape(-1, 7)[:, 1:], None)):
        d = gpu.asarray(src, dtype=dtype)
        ref = np.asarray(src, dtype=dtype)
        assert d.shape == ref.shape and d.dtype == ref.dtype and np.array_equal(d.get(), ref)
    with cupy.cuda.Stream(non_blocking=True):             # copies on the current stream
        b = cupy.zeros(n)
        b += 1.0
        d = gpu.asarray(a)
        d += b
        assert np.array_equal(d.get(), a + 1.0)
    rt = cupy.cuda.runtime
    rt.hostRegister(a.ctypes.data, a.nbytes, 0)
    try:
        assert np.array_equal(gpu.asarray(a).get(), a)
    finally:
        rt.hostUnregister(a.ctypes.data)
    rows, per = B.PIN_MIN_BYTES // 64 + 5000, 8          # 8 sorted random columns per row
    rng = np.random.default_rng(1)
    A = sp.csr_matrix((rng.standard_normal(rows * per), np.sort(rng.integers(0, rows, (rows, per)), axis=1).ravel(),
                       np.arange(0, rows * per + 1, per)), shape=(rows, rows))
    assert A.data.nbytes >= B.PIN_MIN_BYTES
    M = gpu.asmatrix(A).get()
    assert np.array_equal(M.indptr, A.indptr) and np.array_equal(M.indices, A.indices)
    assert np.array_equal(M.data, A.data)
