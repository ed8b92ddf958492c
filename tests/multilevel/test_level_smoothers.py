"""Different smoothers on a hierarchy's levels (issue 36): ``smoother`` a sequence, finest level
first, the last entry for every coarser level -- block Gauss-Seidel on the finest level(s),
block Jacobi (``omega="auto"`` per level) below, where on the GPU a GS sweep costs one launch
per colour on launch-bound levels.

What must hold: the levels carry the classes the sequence names, the Jacobi levels the very
omegas of a pure block-Jacobi hierarchy; the mixed V-cycle contracts like its parts promise
(no worse than block Jacobi, near block GS; factors measured on the CPU) and stays a symmetric
CG preconditioner; bad sequences and keyword arguments raise naming the problem.
"""
import functools

import numpy as np
import pytest
from test_gauss_seidel import elasticity_factor      # V(2,2) factor, 3-D elasticity, 5,793 DoFs

import adaptmg
from adaptmg import assemble
from adaptmg.assemble.testing import tensor_prolongation, tensor_q1_stiffness
from adaptmg.backend import to_host
from adaptmg.mesh import Mesh
from adaptmg.multilevel import MultilevelSolver
from adaptmg.multilevel.gauss_seidel import BlockGaussSeidel, GaussSeidel
from adaptmg.multilevel.smoothers import (BlockJacobi, Jacobi, describe_level_smoothers,
                                          level_smoothers, smoother_setup_kwargs)

LAM, MU = 8e4, 2e4
GS_BJ = ("block_gauss_seidel", "block_jacobi")


@functools.lru_cache(maxsize=None)
def _elasticity_mesh(L=2):
    """3-D box, ``L`` uniform refinements and one local one (hanging nodes): L=2 5,793 DoFs
    on 4 levels (81, 252, 954, 5793), the mesh of test_gauss_seidel's ``elasticity_factor``."""
    m = Mesh.box([0] * 3, [1] * 3, [2] * 3)
    for _ in range(L):
        m = m.refine()
    return m.refine(np.flatnonzero(m.points[m.cells].mean(1)[:, 0] < 0.25))


def _elasticity(smoother, smoother_kwargs=None, backend="cpu", **kw):
    form = functools.partial(assemble.elasticity, lam=LAM, mu=MU)
    return adaptmg.multigrid(adaptmg.Space(_elasticity_mesh(), 1, 3), form, dirichlet=0,
                             smoother=smoother, smoother_kwargs=smoother_kwargs, backend=backend, **kw)


def _smoothers(ml):
    return [d.smoother for d in ml._dev]


# --------------------------------------------------------------------------- which smoother where
def test_levels_carry_the_named_smoothers_and_block_jacobi_keeps_its_omegas():
    bj = _elasticity("block_jacobi", coarse="smoother")
    mixed = _elasticity(GS_BJ, coarse="smoother")
    two = _elasticity(("block_gauss_seidel",) * 2 + ("block_jacobi",))
    assert len(mixed.levels) == len(bj.levels) == 4
    sm, ref = _smoothers(mixed), _smoothers(bj)
    assert type(sm[-1]) is BlockGaussSeidel and sm[-1].block_size == 3 and sm[-1].omega == 1.0
    assert all(type(s) is BlockJacobi and s.block_size == 3 for s in sm[:-1])  # coarse="smoother": level 0 too
    # omega="auto" per level, as in the pure block-Jacobi hierarchy: the same numbers
    # (same matrices, same seeded power iteration), and they differ between levels
    for s, r in zip(sm[:-1], ref[:-1]):
        assert abs(s.omega - r.omega) <= 64 * np.finfo(float).eps * r.omega, (s.omega, r.omega)
    assert len({round(s.omega, 6) for s in sm[:-1]}) > 1
    st = _smoothers(two)
    assert [type(s) for s in st] == [type(None), BlockJacobi, BlockGaussSeidel, BlockGaussSeidel]
    assert "on the finest 2 levels, below BlockJacobi" in repr(two)
    assert "on the finest 1 level, below BlockJacobi" in repr(mixed)
    assert "below" not in repr(bj)
    # one entry: the plain spelling
    one = _elasticity(("block_gauss_seidel",), ({"seed": 3},))
    assert all(type(s) is BlockGaussSeidel and s.seed == 3 for s in _smoothers(one)[1:])


def test_per_entry_keyword_arguments_and_defaults():
    ml = _elasticity(GS_BJ, ({"sweep": "forward", "seed": 5}, {"omega": 0.5}))
    sm = _smoothers(ml)
    assert sm[-1].sweep == "forward" and sm[-1].seed == 5
    assert all(s.omega == 0.5 for s in sm[1:-1])
    kw = smoother_setup_kwargs(GS_BJ, None, block_size=3, auto_omega=True)
    assert kw == ({"block_size": 3}, {"block_size": 3, "omega": "auto"})
    assert level_smoothers("jacobi", {"omega": 0.7}) == [("jacobi", {"omega": 0.7})]


def test_describe_level_smoothers():
    A = tensor_q1_stiffness(4, 2)
    gs, j = GaussSeidel(A), Jacobi(A)
    assert describe_level_smoothers([gs, gs, None]) == repr(gs)
    assert describe_level_smoothers([gs, j, j]) == f"{gs!r} on the finest 1 level, below Jacobi"
    assert describe_level_smoothers([None]) == "None"


# --------------------------------------------------------------------------- contraction
def test_mixed_cycle_contracts_between_block_jacobi_and_block_gs():
    """3-D elasticity, lambda = 8e4, mu = 2e4, 5,793 DoFs, 4 levels, V(2,2) factors measured on
    the CPU: block Jacobi 0.449, block GS 0.182, GS on the finest level and block Jacobi below
    0.246, GS on the two finest 0.183 (CG iterations to 1e-8: 16, 9, 11, 9).  The coarse
    levels' smoother costs little contraction; the finest level's sets most of it."""
    f = {name: elasticity_factor(sm, None) for name, sm in
         (("bj", "block_jacobi"), ("gs", "block_gauss_seidel"), ("mixed", GS_BJ),
          ("mixed2", ("block_gauss_seidel",) * 2 + ("block_jacobi",)))}
    assert 0.40 <= f["bj"] <= 0.50 and 0.15 <= f["gs"] <= 0.21, f
    assert f["mixed"] <= 0.6 * f["bj"], f                   # no worse than block Jacobi: far better
    assert f["mixed"] <= 0.28 and f["mixed"] <= 1.5 * f["gs"], f
    assert f["gs"] <= f["mixed2"] <= 1.05 * f["gs"], f      # GS on two levels: as pure GS


def test_mixed_cycle_is_a_symmetric_cg_preconditioner(backend):
    """Every level's post-smoother is the A-adjoint of its pre-smoother, so a V-cycle with GS on
    the finest level and Jacobi below is symmetric (2-D Q1 tensor hierarchy, 4 levels);
    CG with it needs fewer iterations than with Jacobi everywhere."""
    As = [tensor_q1_stiffness(4 * 2 ** k, 2) for k in range(4)]
    Ps = [tensor_prolongation(4 * 2 ** k, 2) for k in range(3)]
    its = {}
    for sm in ("jacobi", ("gauss_seidel", "jacobi")):
        ml = MultilevelSolver.from_matrices(As, Ps, smoother=sm, backend=backend, coarse="smoother")
        M = ml.aspreconditioner()
        n = As[-1].shape[0]
        rng = np.random.default_rng(1)
        u, v = backend.asarray(rng.standard_normal(n)), backend.asarray(rng.standard_normal(n))
        lhs, rhs = float(to_host(M.matvec(u)) @ to_host(v)), float(to_host(u) @ to_host(M.matvec(v)))
        assert abs(lhs - rhs) <= 1e3 * np.finfo(float).eps * abs(lhs), (sm, lhs, rhs)
        b = backend.asarray(rng.standard_normal(n))
        count = []
        ml.solve(b, rtol=1e-8, accel="cg", callback=lambda xk: count.append(1))
        its[sm if isinstance(sm, str) else "mixed"] = len(count)
    assert type(ml._dev[-1].smoother) is GaussSeidel
    assert all(type(d.smoother) is Jacobi for d in ml._dev[:-1])
    assert its["mixed"] < its["jacobi"], its


# --------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("smoother, kwargs, exc, match", [
    ((), None, ValueError, "empty sequence"),
    (("block_gauss_seidel", "no_such"), None, ValueError, "unknown smoother 'no_such'"),
    (("block_gauss_seidel", 3), None, TypeError, r"smoother\[1\] must be a registry name"),
    (GS_BJ, {"omega": 0.5}, ValueError, "sequence of 2 dicts"),
    (GS_BJ, ({},), ValueError, "sequence of 2 dicts"),
    (GS_BJ, ({}, 0.5), TypeError, r"smoother_kwargs\[1\] must be a dict"),
    ("block_jacobi", ({}, {}), TypeError, "must be a dict or None for one smoother"),
    (GS_BJ, ({"omega": "auto"}, None), ValueError, "needs no 'auto' damping"),
])
def test_bad_sequences_raise(smoother, kwargs, exc, match):
    with pytest.raises(exc, match=match):
        _elasticity(smoother, kwargs)


def test_a_built_smoother_is_no_sequence_entry():
    A = tensor_q1_stiffness(4, 2)
    with pytest.raises(TypeError, match="serves one matrix only"):
        level_smoothers(("gauss_seidel", Jacobi(A)))


# --------------------------------------------------------------------------- GPU
@pytest.mark.gpu
def test_gpu_mixed_hierarchy_matches_the_cpu_and_captures_a_graph():
    """On the device set-up: the same classes, omegas to round-off, the CPU's CG iterations
    (+-1), and the cycle recorded as one CUDA graph."""
    from adaptmg.backend import get_backend
    gpu = get_backend("gpu")
    mc = _elasticity(GS_BJ, coarse_max_rows=None)
    mg = _elasticity(GS_BJ, backend=gpu, coarse_max_rows=None)
    sc, sg = _smoothers(mc), _smoothers(mg)
    assert [type(s) for s in sg] == [type(s) for s in sc]
    for a, b in zip(sc[1:-1], sg[1:-1]):
        assert abs(a.omega - b.omega) <= 1e-6 * a.omega         # power iterations, as elsewhere
    n = mc.A.shape[0]
    b = np.random.default_rng(3).standard_normal(n)
    b[~mc.constraints[-1].free] = 0.0
    its_c, its_g = [], []
    mc.solve(b, rtol=1e-8, accel="cg", callback=lambda xk: its_c.append(1))
    x = mg.solve(gpu.asarray(b), rtol=1e-8, accel="cg", callback=lambda xk: its_g.append(1))
    assert abs(len(its_g) - len(its_c)) <= 1, (its_c, its_g)
    assert np.linalg.norm(b - mc.A @ to_host(x)) <= 1e-7 * np.linalg.norm(b)
    assert mg.aspreconditioner().graph, mg.graph_error
