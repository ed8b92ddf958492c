"""A one-rank run of adaptmg.distributed.solve is the serial code path (no MPI needed)."""
import numpy as np
import pytest

import adaptmg
from adaptmg import assemble
from adaptmg.distributed import agree, get_comm, solve, solve_poisson
from adaptmg.fe import Space
from adaptmg.mesh import Mesh


class OneRank:
    """Stands in for a size-1 mpi4py communicator (the serial path makes no MPI call)."""

    def Get_rank(self):
        return 0

    def Get_size(self):
        return 1

    def Allreduce(self, *a):                     # pragma: no cover - never called on one rank
        raise AssertionError("no collective on one rank")


def _mesh():
    m = Mesh.box([0, 0], [1, 1], [4, 4]).refine().refine()
    c = m.points[m.cells].mean(1)
    return m.refine(np.linalg.norm(c - 0.3, axis=1) < 0.25)


def test_one_rank_is_multigrid_cg():
    """Same solution (to a few eps) and iteration count as multigrid().solve(accel='cg')."""
    m = _mesh()
    space = Space(m, 1)
    b = assemble.load(space, 1.0)
    res = solve(space, assemble.stiffness, b, comm=OneRank(), rtol=1e-10)
    ml = adaptmg.multigrid(space, assemble.stiffness, backend="cpu")
    its = []
    x = ml.solve(ml.constrain(b), rtol=1e-10, accel="cg", callback=lambda xk: its.append(1))
    u = ml.expand(x)
    assert res.size == 1 and res.mg is None and res.info == 0
    assert res.iterations == len(its) and 3 <= res.iterations <= 10
    assert np.abs(res.u - u).max() <= 64 * np.finfo(float).eps * np.abs(u).max()
    r2 = solve_poisson(m, 1.0, comm=OneRank(), rtol=1e-10)
    assert np.abs(r2.u - u).max() <= 64 * np.finfo(float).eps * np.abs(u).max()


def test_bad_arguments_raise_on_one_rank():
    space = Space(_mesh(), 1)
    b = assemble.load(space, 1.0)
    with pytest.raises(ValueError, match="rtol must be a positive number"):
        solve(space, assemble.stiffness, b, comm=OneRank(), rtol=-1)
    with pytest.raises(ValueError, match=r"right-hand side must have shape"):
        solve(space, assemble.stiffness, b[:-1], comm=OneRank())
    with pytest.raises(ValueError, match="accel must be"):
        solve(space, assemble.stiffness, b, comm=OneRank(), accel="bicg")
    with pytest.raises(ValueError, match="min_dofs_per_rank must be None, 'auto' or a non-negative"):
        solve(space, assemble.stiffness, b, comm=OneRank(), min_dofs_per_rank=-1)
    with pytest.raises(ValueError, match="agglomerate_below must be 'auto' or a non-negative"):
        solve(space, assemble.stiffness, b, comm=OneRank(), agglomerate_below="many")
    res = solve(space, assemble.stiffness, b, comm=OneRank(), min_dofs_per_rank=None)
    assert res.active_ranks == [1] * len(res.ml.levels)         # one rank: every level on it
    with pytest.raises(TypeError, match="mpi4py communicator"):
        get_comm(object())
    with pytest.raises(TypeError, match="adaptmg Mesh"):
        solve_poisson(space, comm=OneRank())
    with pytest.raises(ValueError, match="went wrong"):
        agree(None, False, "went wrong")


def test_level_sizes_auto_per_backend():
    from adaptmg.distributed.solve import CPU_LEVEL_SIZES, GPU_LEVEL_SIZES, level_sizes
    assert level_sizes("auto", "auto", gpu=False) == CPU_LEVEL_SIZES == (1000, 2000)
    assert level_sizes("auto", "auto", gpu=True) == GPU_LEVEL_SIZES == (2 ** 19, 2 ** 18)
    assert level_sizes(5, None, gpu=True) == (5, None)            # explicit values win


@pytest.mark.parametrize("spec", [("block_gauss_seidel", "block_jacobi"), "gauss_seidel"])
def test_distributed_smoother_names_what_it_supports(spec):
    """A per-level smoother sequence (or a smoother it lacks) gets the distributed levels' own
    message, not an error from unpacking the per-level keyword list."""
    from types import SimpleNamespace
    from adaptmg.distributed.hierarchy import _distributed_smoother
    from adaptmg.multilevel.smoothers import smoother_setup_kwargs
    ml = SimpleNamespace(_smoother_spec=spec, _smoother_kwargs=smoother_setup_kwargs(
        spec, None, block_size=1, auto_omega=True))
    with pytest.raises(ValueError, match="supports the smoothers jacobi, chebyshev and block_jacobi"):
        _distributed_smoother(ml, None, 1)
