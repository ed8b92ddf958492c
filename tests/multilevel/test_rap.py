"""Galerkin triple products in row blocks (adaptmg.multilevel.rap): the blocked sum equals the
one product to rounding, on both backends; the device default blocks only past its limit."""
import numpy as np
import pytest
import scipy.sparse as sp

from adaptmg import Mesh, Space, assemble
from adaptmg.multilevel import rap as rapmod
from adaptmg.multilevel.rap import rap
from adaptmg.multilevel.transfer import prolongation


def _q1_pair(dim=3):
    coarse = Mesh.box([0.0] * dim, [1.0] * dim, [3] * dim)
    coarse = coarse.refine(np.flatnonzero(coarse.points[coarse.cells].mean(axis=1)[:, 0] < 0.4))
    fine = coarse.refine()                                   # hanging nodes on both
    cs, fs = Space(coarse, 1), Space(fine, 1)
    P = prolongation(cs, fs).tocsr()
    return P.T.tocsr(), assemble.stiffness(fs).tocsr(), P


@pytest.mark.parametrize("limit", [None, 10 ** 9, 5000, 700, 1])
def test_blocked_product_equals_the_product(limit):
    R, A, P = _q1_pair()
    want = (R @ (A @ P)).toarray()
    w = rapmod._row_work(A, P, np)
    got = rap(R, A, P, limit=limit)
    assert sp.issparse(got) and got.format == "csr" and got.shape == want.shape
    eps = np.finfo(float).eps
    assert np.abs(got.toarray() - want).max() <= 64 * eps * np.abs(want).max()
    # every row's work: the multiply-adds of its A P entries
    flops = np.array([(np.diff(P.indptr)[A.indices[A.indptr[k]:A.indptr[k + 1]]]).sum()
                      for k in range(A.shape[0])])
    assert (w == flops).all() and int(w.sum()) > 5000            # so limit 5000 does cut


def test_rectangular_and_unsymmetric_operands():
    rng = np.random.default_rng(3)
    A = sp.random(300, 300, density=0.03, random_state=rng, format="csr") + sp.identity(300)
    P = sp.random(300, 40, density=0.08, random_state=rng, format="csr")
    R = sp.random(40, 300, density=0.08, random_state=rng, format="csr")
    want = (R @ (A @ P)).toarray()
    got = rap(R, A, P, limit=200).toarray()
    assert np.abs(got - want).max() <= 64 * np.finfo(float).eps * np.abs(want).max()
    with pytest.raises(ValueError, match="shapes do not chain"):
        rap(R, A, P.T)


@pytest.mark.gpu
def test_device_blocked_product_equals_the_host_product():
    from adaptmg.backend import get_backend, to_host
    gpu = get_backend("gpu")
    R, A, P = _q1_pair()
    want = (R @ (A @ P)).toarray()
    for limit in (None, 5000, 1):
        got = to_host(rap(gpu.asmatrix(R), gpu.asmatrix(A), gpu.asmatrix(P), limit=limit)).toarray()
        assert np.abs(got - want).max() <= 64 * np.finfo(float).eps * np.abs(want).max()


def test_a_block_the_device_refuses_is_split_in_halves():
    """cuSPARSE's INSUFFICIENT_RESOURCES on a block: the memory pool's cached blocks are freed
    and the halves multiplied; the sum is the same product.  Emulated: a device error (its
    class from ``cupy_backends``) for any block of more than 40 rows."""
    import types

    class CuSparseError(RuntimeError):
        pass
    CuSparseError.__module__ = "cupy_backends.cuda.libs.cusparse"
    R, A, P = _q1_pair()
    freed = []
    xp = types.SimpleNamespace(get_default_memory_pool=lambda: types.SimpleNamespace(
        free_all_blocks=lambda: freed.append(1)))

    class Refusing:
        def __init__(self, M):
            self.M = M

        def __getitem__(self, rows):
            if rows.stop - rows.start > 40:
                raise CuSparseError("CUSPARSE_STATUS_INSUFFICIENT_RESOURCES")
            return self.M[rows]

    n = A.shape[0]
    parts = rapmod._block(R.tocsc(), Refusing(A), P, 0, n, xp)
    assert len(parts) >= n // 40 and freed
    got = sum(p.toarray() for p in parts)
    want = (R @ (A @ P)).toarray()
    assert np.abs(got - want).max() <= 64 * np.finfo(float).eps * np.abs(want).max()
    with pytest.raises(CuSparseError):                       # on the host: raised as it is
        rapmod._block(R.tocsc(), Refusing(A), P, 0, n, np)


def test_a_block_the_device_refuses_at_every_size_gets_a_clear_error():
    """Refused down to single rows (or 8 halvings): a RuntimeError that names the product and
    the way around it, with the device's error as its cause."""
    import types

    class CuSparseError(RuntimeError):
        pass
    CuSparseError.__module__ = "cupy_backends.cuda.libs.cusparse"
    R, A, P = _q1_pair()
    xp = types.SimpleNamespace(get_default_memory_pool=lambda: types.SimpleNamespace(free_all_blocks=lambda: None))

    class Refusing:
        shape = A.shape

        def __getitem__(self, rows):
            raise CuSparseError("CUSPARSE_STATUS_INSUFFICIENT_RESOURCES")

    with pytest.raises(RuntimeError, match="could not form rows .* Galerkin product .* setup='pyamg'") as e:
        rapmod._block(R.tocsc(), Refusing(), P, 0, A.shape[0], xp)
    assert isinstance(e.value.__cause__, CuSparseError)
