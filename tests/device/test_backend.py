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


def _fake(module, name="Thing", base=object):
    """An instance of a class that claims to be defined in ``module`` (no CuPy needed)."""
    cls = type(name, (base,), {"matvec": lambda self, x: x, "tocsr": lambda self: self,
                               "ndim": 1})
    cls.__module__ = module
    return cls() if base is object else cls


def test_device_predicates_by_defining_module():
    from adaptmg.backend import (is_device_array, is_device_linear_operator, is_device_sparse,
                                 is_sparse)
    arr, csr = _fake("cupy._core.core"), _fake("cupyx.scipy.sparse._csr")
    linop = _fake("cupyx.scipy.sparse.linalg._interface")
    host = (np.zeros(2), sp.eye(2, format="csr"), [1.0], None, _fake("numpy.cupy_lookalike"))
    assert all(is_device_array(a) for a in (arr, csr, linop))
    assert is_device_sparse(csr) and is_sparse(csr) and not is_device_sparse(arr)
    assert is_device_linear_operator(linop) and not is_device_linear_operator(csr)
    assert not any(f(h) for h in host for f in (is_device_array, is_device_sparse,
                                                   is_device_linear_operator))
    nomod = _fake("x")
    type(nomod).__module__ = None                 # a type that names no module: host
    assert not is_device_array(nomod) and backend_of(nomod) is CPU


def test_linalg_classifies_fake_cupyx_objects_as_before():
    """linalg's operator classification goes through the backend predicates."""
    from adaptmg.linalg._operators import _is_dense, classify, is_cupyx_sparse
    csr, linop = _fake("cupyx.scipy.sparse._csr"), _fake("cupyx.scipy.sparse.linalg._interface")
    assert is_cupyx_sparse(csr) and not is_cupyx_sparse(linop)
    assert not _is_dense(csr) and not _is_dense(linop)
    assert classify(linop, "A")[0] == "cupyx-linop" and classify(csr, "A")[0] == "sparse"


@pytest.mark.parametrize("module, name, msg, oom", [
    ("cupy.cuda.memory", "OutOfMemoryError", "out of memory allocating 8 bytes", True),
    ("cupy_backends.cuda.libs.cusparse", "CuSparseError", "CUSPARSE_STATUS_ALLOC_FAILED", True),
    ("cupy_backends.cuda.api.runtime", "CUDARuntimeError", "cudaErrorMemoryAllocation: "
     "out of memory", True),
    ("cupy_backends.cuda.libs.cusparse", "CuSparseError", "CUSPARSE_STATUS_INVALID_VALUE", False),
    ("builtins", "MemoryError", "out of memory", False),
    ("mylib", "OutOfMemoryError", "out of memory", False),
])
def test_is_gpu_oom_by_defining_module(module, name, msg, oom):
    from adaptmg.backend import is_device_error
    from adaptmg.errors import is_gpu_oom
    exc = _fake(module, name, Exception)(msg)
    assert is_device_error(exc) == module.startswith("cupy")
    assert is_gpu_oom(exc) == oom


def test_csr_from_arrays_on_the_host_is_scipys_constructor():
    from adaptmg.backend import csr_from_arrays
    A = csr_from_arrays(sp, np.array([1.0, 2.0, 3.0]), np.array([0, 2, 1]), np.array([0, 2, 2, 3]), (3, 4))
    ref = sp.csr_matrix((np.array([1.0, 2.0, 3.0]), np.array([0, 2, 1]), np.array([0, 2, 2, 3])), shape=(3, 4))
    assert A.shape == (3, 4) and A.indices.dtype == ref.indices.dtype and abs(A - ref).max() == 0
    with pytest.raises(ValueError):                  # the constructor's checks
        csr_from_arrays(sp, np.ones(2), np.array([0, 1, 2]), np.array([0, 3]), (1, 3))


@pytest.mark.gpu
@pytest.mark.parametrize("it", ["int32", "int64"])
def test_csr_from_arrays_on_the_gpu_equals_the_constructor_without_a_read(it):
    """The index dtype the constructor picks (int32: every index fits), the same arrays and
    matrix; and no device -> host read (the constructor reads the index range: the sync it
    saves).  Malformed arrays still reach the constructor's ValueError."""
    if not gpu_available():
        pytest.skip("needs CuPy and a visible CUDA device")
    from adaptmg.backend import csr_from_arrays
    from adaptmg.device.host_reads import available, count_host_reads
    be = get_backend("gpu")
    xp = be.xp
    H = sp.random(50, 70, density=0.1, format="csr", random_state=3)
    data, ind, ptr = xp.asarray(H.data), xp.asarray(H.indices.astype(it)), xp.asarray(H.indptr.astype(it))
    ref = be.sparse.csr_matrix((data, ind, ptr), shape=H.shape)
    if available():
        with count_host_reads(xp) as reads:
            A = csr_from_arrays(be.sparse, data, ind, ptr, H.shape)
        assert reads.calls == 0, reads.report()
    else:
        A = csr_from_arrays(be.sparse, data, ind, ptr, H.shape)
    assert A.shape == ref.shape and A.indices.dtype == ref.indices.dtype == A.indptr.dtype == np.int32
    assert abs(to_host(A) - H).max() == 0
    with pytest.raises(ValueError):
        csr_from_arrays(be.sparse, data[:-1], ind, ptr, H.shape)
