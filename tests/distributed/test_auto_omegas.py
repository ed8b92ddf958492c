"""The local levels' omega="auto" estimated together (adaptmg.distributed.hierarchy._auto_omegas:
the power iterations of several levels interleaved, one reduction of their norms a step): each
level's omega is the one it gets alone, and the serial Jacobi's to rounding.  Two and three
ranks on threads, owners interleaved; one rank owns no row of the smallest level."""
from types import SimpleNamespace

import numpy as np
import pytest
import scipy.sparse as sp
from pyamg.gallery import poisson

from adaptmg.distributed.csr import DistCSR
from adaptmg.distributed.hierarchy import _auto_omegas, _distributed_smoother
from adaptmg.distributed.layout import Layout
from adaptmg.distributed.thread_comm import run_ranks
from adaptmg.multilevel.smoothers import Jacobi

ML = SimpleNamespace(_smoother_spec="jacobi", _smoother_kwargs={"omega": "auto"})
OPS = [sp.csr_matrix(poisson((24, 24))), sp.csr_matrix(poisson((10, 9))), sp.csr_matrix(2.0 * poisson((12,)))]


def _levels(comm):
    """The three operators as DistCSR over random owners (the last one on rank 0 only)."""
    size = comm.Get_size()
    out = []
    for k, M in enumerate(OPS):
        owner = np.random.default_rng(k).integers(0, size, M.shape[0]) if k < 2 else np.zeros(M.shape[0], int)
        lay = Layout(owner, comm)
        out.append(DistCSR(M, lay, lay))
    return out


def _omegas(comm):
    levels = _levels(comm)
    pending = []
    together = [_distributed_smoother(ML, A, 1, pending) for A in levels]
    assert [p[1] for p in pending] == together
    _auto_omegas(comm, pending)
    alone = [_distributed_smoother(ML, A, 1) for A in _levels(comm)]
    return [sm.omega for sm in together], [sm.omega for sm in alone]


@pytest.mark.parametrize("size", [2, 3])
def test_levels_estimated_together_get_their_own_omegas(size):
    serial = [Jacobi(M, omega="auto").omega for M in OPS]
    for together, alone in run_ranks(size, _omegas, timeout=60):
        assert together == alone                        # the same operations, level by level
        assert np.allclose(together, serial, rtol=64 * np.finfo(float).eps, atol=0)
        assert len(set(together)) == 3
