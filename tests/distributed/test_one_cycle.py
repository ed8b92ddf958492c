"""The distributed levels run in the one MultilevelSolver cycle (no MPI launcher needed).

* A coarse-solver object (``MultilevelSolver(coarse=obj)``, ``obj.cycle(b, x, kind, zero)``
  and ``obj.depth``) that runs a serial hierarchy's cycle below the top levels reproduces the
  serial V-, W- and F-cycles to round-off -- only because ``depth`` makes the schedule visit it
  as the serial cycle visits that level (with ``depth = 0`` the W-cycle differs).
* :class:`adaptmg.distributed.DistributedHierarchy` on a one-rank communicator
  (``MPI.COMM_SELF``): its solver's levels are DistCSR operators, and
  :func:`adaptmg.distributed.resolve` (``adaptmg.linalg.cg`` under the reduction hook) takes
  the serial solve's iterations and solution.
"""
import importlib.util

import numpy as np
import pytest

import adaptmg
from adaptmg import assemble
from adaptmg.distributed import DistCSR, DistributedHierarchy, RankZeroCycle, partition_cells, resolve
from adaptmg.fe import Space
from adaptmg.mesh import Mesh
from adaptmg.multilevel import Level, MultilevelSolver

EPS = np.finfo(float).eps


def _space():
    m = Mesh.box([0, 0], [1, 1], [4, 4]).refine().refine().refine()
    c = m.points[m.cells].mean(1)
    return Space(m.refine(np.linalg.norm(c - 0.3, axis=1) < 0.25), 1)


def _serial(space):
    return adaptmg.multigrid(space, assemble.stiffness, backend="cpu", threads=1,
                             coarse_max_rows=None)


def _top(ml, k, coarse):
    """The levels k.. of ml as a MultilevelSolver (the same matrices and smoothers) over ``coarse``."""
    levels = [Level(ml.levels[k].A)]
    for l in range(k + 1, len(ml.levels)):
        lev = ml.levels[l]
        levels.append(Level(lev.A, lev.P, lev.R, smoother=ml._dev[l].smoother))
    return MultilevelSolver(levels, coarse=coarse, presmooth=ml.presmooth,
                            postsmooth=ml.postsmooth, backend="cpu")


class _NoDepth(RankZeroCycle):
    """RankZeroCycle that hides the levels below it from the schedule."""

    def __init__(self, ml, level):
        super().__init__(ml, level, 0)
        self.depth = 0


@pytest.mark.parametrize("kind", ["V", "W", "F"])
def test_coarse_cycle_object_reproduces_the_serial_cycle(kind):
    ml = _serial(_space())
    L = len(ml.levels)
    assert L >= 5
    k = 2                                             # levels 0..2 run by the coarse object
    top = _top(ml, k, RankZeroCycle(ml, k, 0))
    assert len(top.levels) == L - k and "RankZeroCycle" in repr(top)
    b = np.random.default_rng(1).standard_normal(ml.levels[-1].n)
    x_ser = ml.cycle(b, np.zeros_like(b), kind)
    x_top = top.cycle(b, np.zeros_like(b), kind)
    m = len(top.levels) - 1              # levels above the coarse object's
    assert top.coarse.calls == {"V": 1, "W": 2 ** m, "F": m + 1}[kind] and top.coarse.seconds > 0
    scale = np.abs(x_ser).max()
    assert np.abs(x_top - x_ser).max() <= 64 * EPS * scale
    if kind != "V":           # the schedule matters: without depth level k is visited once
        x_flat = _top(ml, k, _NoDepth(ml, k)).cycle(b, np.zeros_like(b), kind)
        assert np.abs(x_flat - x_ser).max() > 1e-6 * scale


def test_coarse_object_without_cycle_is_refused():
    ml = _serial(_space())
    with pytest.raises(ValueError, match="coarse must be 'direct', 'smoother', a CoarseOperator, a function"):
        _top(ml, 2, object())


needs_mpi4py = pytest.mark.skipif(importlib.util.find_spec("mpi4py") is None,
                                  reason="mpi4py not installed")


@needs_mpi4py
@pytest.mark.parametrize("cycle", ["V", "W"])
def test_hierarchy_on_one_rank_is_the_serial_solve(cycle):
    """DistributedHierarchy over COMM_SELF (every level "distributed" on one rank, the levels
    below agglomerate_below in the serial cycle): DistCSR levels in one MultilevelSolver,
    the serial CG iteration count and solution (to 1e-12 relative)."""
    from mpi4py import MPI
    space = _space()
    ml = _serial(space)
    b = assemble.load(space, 1.0)
    f = ml.constrain(b)
    its = []
    x = ml.solve(f, rtol=1e-10, accel="cg", cycle=cycle, callback=lambda xk: its.append(1))
    mg = DistributedHierarchy(ml, partition_cells(space.mesh, 1), MPI.COMM_SELF,
                              agglomerate_below=200)
    s = mg.solver
    assert isinstance(s, MultilevelSolver) and s.coarse.level == mg.c - 1 >= 1
    assert len(s.levels) == len(ml.levels) - mg.c + 1 >= 3
    assert all(isinstance(getattr(lev, key), DistCSR) for lev in s.levels[1:] for key in "APR")
    xd, info, nits, res = resolve(mg, mg.constrain_local(b), cycle=cycle, rtol=1e-10)
    assert info == 0 and nits == len(its) and 3 <= nits <= 12
    assert res[1] <= 1e-10 * res[0] and abs(res[0] - np.linalg.norm(f)) <= 1e-12 * res[0]
    assert np.linalg.norm(xd - x) <= 1e-12 * np.linalg.norm(x)
    # without the reported final residual (one product less): the same iterate, [||f||] only
    xq, info_q, nits_q, res_q = resolve(mg, mg.constrain_local(b), cycle=cycle, rtol=1e-10,
                                        true_residual=False)
    assert (info_q, nits_q, res_q) == (0, nits, res[:1])
    assert np.linalg.norm(xq - xd) <= 1e-14 * np.linalg.norm(xd)
