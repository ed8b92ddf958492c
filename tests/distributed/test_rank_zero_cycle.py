"""The coarse solver of the distributed cycle (adaptmg.distributed.rank_zero.RankZeroCycle):
rank 0 runs the serial hierarchy's cycle from the given level, the other ranks nothing; on the
GPU a visit replays a CUDA graph recorded on the first visit with those buffers, which gives
the eager cycle's x (within a few eps) and leaves the caller's right-hand side as it was."""
import numpy as np
import pytest

from adaptmg import assemble, multigrid
from adaptmg.distributed.rank_zero import MAX_GRAPHS, RankZeroCycle
from adaptmg.fe import Space
from test_local_setup import _mesh


def _ml(backend):
    # every geometric level kept (the GPU's default would end in a direct solve of this size)
    ml = multigrid(Space(_mesh(3, 1), 1), assemble.stiffness, dirichlet="all", backend=backend,
                   coarse_max_rows=None)
    assert len(ml.levels) >= 3
    return ml, len(ml.levels) - 2                    # a serial top with levels below it


def test_other_ranks_do_nothing_and_the_graph_flag_is_checked():
    ml, lev = _ml("cpu")
    rz = RankZeroCycle(ml, lev, rank=1)
    b = np.ones(ml.levels[lev].n)
    x = np.zeros_like(b)
    assert rz.cycle(b, x, "V", True) is x and not x.any() and rz.calls == 0
    with pytest.raises(ValueError, match="graph"):
        RankZeroCycle(ml, lev, 0, graph="yes")


@pytest.mark.parametrize("kind", ["V", "W"])
def test_rank_zero_runs_the_serial_cycle_from_its_level(kind):
    ml, lev = _ml("cpu")
    rz = RankZeroCycle(ml, lev, 0)
    n = ml.levels[lev].n
    rng = np.random.default_rng(0)
    b, x0 = rng.standard_normal(n), rng.standard_normal(n)
    x = x0.copy()
    rz.cycle(b, x, kind, False)
    want = ml._run(b, x0.copy(), kind, False, level=lev)
    assert np.array_equal(x, want) and rz.calls == 1 and not rz._graphs     # the same calls
    assert np.abs(x - x0).max() > 0


@pytest.mark.gpu
@pytest.mark.parametrize("kind,zero", [("V", True), ("W", True), ("V", False)])
def test_gpu_visits_replay_a_graph_equal_to_the_eager_cycle(kind, zero):
    import cupy
    ml, lev = _ml("gpu")
    rz = RankZeroCycle(ml, lev, 0)
    n = ml.levels[lev].n
    rng = np.random.default_rng(1)
    b = cupy.asarray(rng.standard_normal(n))
    x0 = cupy.asarray(rng.standard_normal(n))
    b_in = b.copy()
    x = cupy.empty(n)                                 # the solver's fixed buffers
    for visit in range(3):                            # the first records, the others replay
        x[...] = x0
        rz.cycle(b, x, kind, zero)
        want = ml._run(b_in.copy(), x0.copy(), kind, zero, level=lev)
        scale = float(cupy.abs(want).max())
        assert float(cupy.abs(x - want).max()) <= 16 * np.finfo(float).eps * scale, visit
        assert bool((b == b_in).all())                # the capture's check left b as it was
    assert len(rz._graphs) == 1 and next(iter(rz._graphs.values())) is not None, rz.graph_error
    many = RankZeroCycle(ml, lev, 0)                  # new buffers on every visit: recorded up to a cap
    for _ in range(MAX_GRAPHS + 2):
        many.cycle(b, cupy.zeros(n + 0), kind, zero)
    assert len(many._graphs) <= MAX_GRAPHS
    off = RankZeroCycle(ml, lev, 0, graph=False)
    x[...] = x0
    off.cycle(b, x, kind, zero)
    assert not off._graphs and float(cupy.abs(x - want).max()) <= 16 * np.finfo(float).eps * scale
