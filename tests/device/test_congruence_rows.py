"""The constrained matrix K = Z H^T A H Z + s (I - Z) by the two row kernels of
``adaptmg.device.congruence_rows``: their own CUDA source on host threads (g++, no GPU) and
on the GPU, against SciPy's products (the twin) and the Constraints' host path."""
import numpy as np
import pytest
import scipy.sparse as sp

import adaptmg.device.congruence_rows as CR
from adaptmg import Constraints, Mesh, Space, assemble

EPS = np.finfo(float).eps


def _ball(m, r, c=0.3):
    x = m.points[m.cells].mean(axis=1)
    return np.flatnonzero(np.linalg.norm(x - c, axis=1) < r)


def _problem(dim, q=1):
    """A (unconstrained stiffness), H, the free mask and the host K of an adaptive mesh with
    hanging nodes (2-D: two local refinements; 3-D: two fronts)."""
    if dim == 2:
        m = Mesh.box([0.0, 0.0], [1.0, 1.0], [3, 2]).refine()
        m = m.refine(_ball(m, 0.3))
        m = m.refine(_ball(m, 0.15))
    else:
        m = Mesh.box([0.0] * 3, [1.0] * 3, [2] * 3).refine()
        m = m.refine(_ball(m, 0.4))
        m = m.refine(_ball(m, 0.2))
    space = Space(m, q)
    cons = Constraints(space, space.boundary_dofs())
    A = assemble.stiffness(space).tocsr()
    A.sum_duplicates()
    assert space.hanging_nodes.size > 0
    return A, sp.csr_matrix(space.H), cons.free, cons.matrix(A), cons.scale


def _int32(M):
    M = sp.csr_matrix(M)
    return (M.indptr.astype(np.int32), M.indices.astype(np.int32), M.data.astype(np.float64))


def _check(K, s, K_ref, s_ref):
    """Same pattern and entries to rounding (sums in another order), same row scale."""
    assert abs(s - s_ref) <= 8 * EPS * s_ref
    K, K_ref = sp.csr_matrix(K), sp.csr_matrix(K_ref)
    inside = np.ones(max(K.nnz - 1, 0), dtype=bool)            # canonical: columns strictly
    b = K.indptr[1:-1] - 1                                      # increasing inside every row
    inside[b[(b >= 0) & (b < inside.size)]] = False
    assert np.all(np.diff(K.indices)[inside] > 0)
    Kd, Rd = K.toarray(), K_ref.toarray()                   # small problems: dense
    scale = np.abs(Rd).max()
    assert np.abs(Kd - Rd).max() <= 64 * EPS * scale
    # an entry stored on one side only is round-off sized (a sum that cancels)
    only = (Kd != 0) != (Rd != 0)
    assert np.abs(Kd + Rd)[only].max(initial=0.0) <= 64 * EPS * scale
    assert K.nnz >= 0.999 * K_ref.nnz


@pytest.mark.parametrize("dim, q", [(2, 1), (3, 1), (2, 2)])
def test_twin_equals_the_constraints_host_path(dim, q):
    A, H, free, K_ref, s_ref = _problem(dim, q)
    K, s = CR.twin(A, H, free)
    _check(K, s, K_ref, s_ref)


class _HostXP:
    """tests/host_cuda.py's host stand-in for CuPy's RawModule, with NumPy for the rest."""

    def __init__(self, inner):
        self.inner = inner

    def RawModule(self, code):
        return self.inner.RawModule(code)

    empty = staticmethod(lambda shape, dtype: np.full(shape, -7, dtype=dtype))

    def __getattr__(self, name):
        return getattr(np, name)


@pytest.mark.parametrize("dim, q, cap", [(2, 1, 64), (3, 1, 64), (2, 2, 64), (2, 2, 6), (3, 1, 12)])
def test_row_kernels_on_host_threads(host_gpu, monkeypatch, dim, q, cap):
    """cap: the columns a row keeps in shared memory (the kernels' 64, or fewer: the rows past
    it take the term-by-term path)."""
    A, H, free, K_ref, s_ref = _problem(dim, q)
    if cap != 64:
        assert np.diff(K_ref.indptr).max() > cap                 # some rows take the other path
        monkeypatch.setattr(CR, "_SRC", CR._SRC.replace("#define ADAPTMG_CONG_CAP 64",
                                                        f"#define ADAPTMG_CONG_CAP {cap}"))
    xp = _HostXP(host_gpu.xp)
    CR._module.cache_clear()
    try:
        ptr, col, val, s = CR.rows(xp, _int32(A), _int32(H), _int32(H.T.tocsr()), free)
    finally:
        CR._module.cache_clear()
    K = sp.csr_matrix((val, col, ptr), shape=A.shape)
    _check(K, s, K_ref, s_ref)


def test_host_arrays_take_the_twin_and_a_wrong_mask_is_refused():
    A, H, free, K_ref, s_ref = _problem(2)
    K, s = CR.constrained_congruence(A, H, H.T.tocsr(), free)       # host arrays: the twin
    _check(K, s, K_ref, s_ref)
    with pytest.raises(ValueError, match="free mask has shape"):
        CR.constrained_congruence(A, H, H.T.tocsr(), free[:-1])


@pytest.mark.gpu
@pytest.mark.parametrize("dim, q", [(2, 1), (3, 1), (2, 2)])
def test_on_the_device_equals_the_host(dim, q):
    import cupyx.scipy.sparse as csp
    A, H, free, K_ref, s_ref = _problem(dim, q)
    dev = lambda M: csp.csr_matrix(sp.csr_matrix(M))
    import cupy as cp
    K, s = CR.constrained_congruence(dev(A), dev(H), dev(H.T.tocsr()), cp.asarray(free))
    assert K.has_canonical_format
    _check(K.get(), s, K_ref, s_ref)
    with pytest.raises(ValueError, match="float64 with int32"):
        CR.constrained_congruence(dev(A).astype(np.float32), dev(H), dev(H.T.tocsr()), cp.asarray(free))
