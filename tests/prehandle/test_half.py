"""Half-precision CG (adaptmg.prehandle.half_cg) and seed 003's Figure 5 effect: fp16 loses the
discretisation accuracy on the nodal matrix a level where the prehandled one keeps it."""
import warnings

import numpy as np
import pytest
import scipy.sparse as sp
import scipy.sparse.linalg as sla

from adaptmg import assemble
from adaptmg.fe import Space
from adaptmg.fe.norms import errors as fe_errors
from adaptmg.mesh import Mesh
from adaptmg.prehandle import (RefinedMacroMesh, SchurSolver, half_cg, macro_square, prehandled_matrix,
                               round_half)
from adaptmg.prehandle.half import _Fp16SpMV


def chirp(a):
    """u = g(x) g(y), g(t) = sin(c t^2), c = a pi / 2 (scripts/bench_prehandling.py's --err-u chirp)."""
    c = a * np.pi / 2
    g = lambda t: np.sin(c * t * t)
    g2 = lambda t: 2 * c * np.cos(c * t * t) - (2 * c * t) ** 2 * np.sin(c * t * t)
    return (lambda x: g(x[..., 0]) * g(x[..., 1]),
            lambda x: -(g2(x[..., 0]) * g(x[..., 1]) + g(x[..., 0]) * g2(x[..., 1])))


def laplace_1d(n):
    return sp.diags([-np.ones(n - 1), 2 * np.ones(n), -np.ones(n - 1)], [-1, 0, 1], format="csr")


def test_half_cg_stores_fp16_and_meets_a_reachable_tolerance():
    A = laplace_1d(30) + 2 * sp.identity(30, format="csr")          # kappa = 3 - ~1
    b = np.linspace(1.0, 3.0, 30) * 1e-3
    r = half_cg(A, b, rtol=1e-3)
    assert r.status == "rtol" and r.iterations < 15 and r.residuals[r.best] <= 1e-3
    scale = 2.0 ** np.ceil(np.log2(np.abs(b).max()))
    assert np.array_equal(round_half(r.x / scale), r.x / scale)     # x was held in fp16
    x = sla.spsolve(A.tocsc(), b)
    err = np.abs(r.x - x).max() / np.abs(x).max()
    assert 1e-6 < err < 4e-3, err       # fp16 accuracy: more than fp32 rounding, a few u at most


def test_half_cg_stops_by_stagnation_and_says_so():
    T = laplace_1d(100)
    A = (sp.kron(T, sp.identity(100)) + sp.kron(sp.identity(100), T)).tocsr()   # kappa ~ 4.1e3
    b = np.ones(A.shape[0])
    with pytest.warns(RuntimeWarning, match="stagnation"):
        r = half_cg(A, b, rtol=0, stagnation=30)
    assert r.status == "stagnation" and r.iterations == r.best + 30
    x = sla.spsolve(A.tocsc(), b)
    err = np.abs(r.x - x).max() / np.abs(x).max()
    assert 1e-4 < err < 0.1, err        # fp16 on kappa 4e3: far from fp32 accuracy, still a solution
    with pytest.warns(RuntimeWarning, match="maxiter"):
        assert half_cg(A, b, rtol=0, maxiter=5).status == "maxiter"


def test_half_cg_bad_input():
    A = laplace_1d(5)
    with pytest.raises(TypeError, match="sparse"):
        half_cg(A.toarray(), np.ones(5))
    with pytest.raises(ValueError, match="shape|need A"):
        half_cg(A, np.ones((5, 2)))
    with pytest.raises(ValueError, match="rtol"):
        half_cg(A, np.ones(5), rtol=1.0)
    with pytest.raises(ValueError, match="stagnation"):
        half_cg(A, np.ones(5), stagnation=0)
    with pytest.raises(ValueError, match="accumulate"):
        half_cg(A, np.ones(5), accumulate="float64")
    with pytest.raises(ValueError, match="residual"):
        half_cg(A, np.ones(5), residual="exact")
    with pytest.raises(ValueError, match="overflow fp16"):
        half_cg(A * 1e5, np.ones(5))
    r = half_cg(A, np.zeros(5))
    assert r.status == "rtol" and not r.x.any()


def test_fp16_accumulation_rounds_every_partial_sum():
    """_Fp16SpMV: exact for small integers, fp16-accurate (~log2(k) u) otherwise, and not fp32 sums."""
    rng = np.random.default_rng(1)
    A = sp.random(300, 300, density=0.2, random_state=2, format="csr") + sp.identity(300, format="csr")
    A.data[:] = round_half(A.data.astype(np.float32))
    A = A.astype(np.float32)
    A.sort_indices()
    mv = _Fp16SpMV(A, np)
    assert len(mv.passes) == int(np.ceil(np.log2(np.diff(A.indptr).max())))
    ints = sp.csr_matrix((np.round(A.data * 4), A.indices, A.indptr), shape=A.shape)
    p = rng.integers(-4, 5, 300).astype(np.float32)
    assert np.array_equal(_Fp16SpMV(ints, np) @ p, ints @ p)        # sums < 2048: exact in fp16
    p = round_half(rng.standard_normal(300).astype(np.float32))
    ex = A.astype(np.float64) @ p.astype(np.float64)
    err = np.abs(mv @ p - ex) / (np.abs(A) @ np.abs(p))
    assert err.max() < 7 * 2.0 ** -11 and err.max() > 2.0 ** -12    # rounded partial sums, not fp32
    assert np.array_equal(round_half(mv @ p), mv @ p)


@pytest.fixture(scope="module")
def level7():
    """Level 7 (h = 1/128, h0 = 1/4, 16,129 unknowns), u the chirp with a = 16."""
    rm = RefinedMacroMesh(*macro_square(4), 5)
    u, f = chirp(16)
    space = Space(Mesh.from_cells(rm.points, rm.cells), 1)
    b = assemble.load(space, f)[:rm.N]
    pad = np.zeros(len(rm.points) - rm.N)
    l2 = lambda x: float(fe_errors(space, np.concatenate([x, pad]), u)["L2"])
    A_h, _, A, _ = prehandled_matrix(rm)
    return A_h, A, SchurSolver(rm), b, l2, l2(sla.spsolve(A_h.tocsc(), b))


@pytest.mark.parametrize("kw, nodal_min, pre_max", [
    (dict(), 1.10, 1.04),                                            # measured 1.17x, 1.01x
    (dict(accumulate="float16", residual="true"), 5.0, 1.04)])       # measured 9.8x, 1.01x
def test_figure_5_prehandling_keeps_half_precision_accurate(level7, kw, nodal_min, pre_max):
    """The fp16 CG error on A_h is far above the fp64 discretisation error at level 7, on the
    prehandled A it is not.  Without the prehandling both columns would be the nodal one."""
    A_h, A, s, b, l2, e64 = level7
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        nodal = half_cg(A_h, b, rtol=1e-6, stagnation=50, **kw)
        pre = half_cg(A, s.rhs(b), rtol=1e-6, stagnation=50, **kw)
    e_nod, e_pre = l2(nodal.x), l2(s.back_transform(pre.x))
    assert e_nod > nodal_min * e64, (e_nod / e64, e_pre / e64)
    assert e_pre < pre_max * e64, (e_nod / e64, e_pre / e64)


@pytest.mark.gpu
@pytest.mark.parametrize("kw", [dict(), dict(accumulate="float16", residual="true")])
def test_half_cg_on_the_gpu_matches_the_cpu(kw):
    """Same arithmetic on CuPy (other fp32 summation orders): same stopping reason, errors alike."""
    import cupy
    from adaptmg.backend import get_backend, to_host
    T = laplace_1d(100)
    A = (sp.kron(T, sp.identity(100)) + sp.kron(sp.identity(100), T)).tocsr()
    b = np.ones(A.shape[0])
    x = sla.spsolve(A.tocsc(), b)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        rc = half_cg(A, b, rtol=0, stagnation=30, **kw)
        rg = half_cg(get_backend("gpu").asmatrix(A), cupy.asarray(b), rtol=0, stagnation=30, **kw)
    ec, eg = (np.abs(to_host(r.x) - x).max() / np.abs(x).max() for r in (rc, rg))
    assert rc.status == rg.status == "stagnation" and 0.5 < eg / ec < 2, (ec, eg)
