"""GraphFGMRES (one CUDA graph per FGMRES iteration, the cycle's start and end on the device)
against the host-driven adaptmg.linalg.fgmres with the same preconditioner and restart."""
import numpy as np
import pytest
import scipy.sparse as sp

from adaptmg.backend import to_host
from adaptmg.linalg import fgmres

pytestmark = pytest.mark.gpu


def _problem(n=40, dtype=np.float64):
    """2-D 5-point Laplacian plus a convection term (nonsymmetric), Jacobi as preconditioner."""
    from adaptmg.backend import get_backend
    gpu = get_backend("gpu")
    T = sp.diags([-1.0, 2.0, -1.0], [-1, 0, 1], shape=(n, n))
    C = sp.diags([-0.3, 0.3], [-1, 1], shape=(n, n))
    I = sp.identity(n)
    A = (sp.kron(I, T) + sp.kron(T, I) + sp.kron(I, C)).tocsr().astype(dtype)
    A.indices = A.indices.astype(np.int32)
    A.indptr = A.indptr.astype(np.int32)
    Ad = gpu.asmatrix(A)
    dinv = gpu.asarray((1.0 / A.diagonal()).astype(dtype))
    b = np.sin(np.arange(A.shape[0]) * 0.37).astype(dtype)
    return gpu, A, Ad, dinv, b


def _solver(gpu, Ad, dinv, restart):
    from adaptmg.linalg.graph_fgmres import GraphFGMRES

    def precond(v, z):
        gpu.xp.multiply(v, dinv, out=z)
    return GraphFGMRES(gpu, Ad, precond, restart=restart)


@pytest.mark.parametrize("restart", [50, 7])
def test_graph_fgmres_equals_host_fgmres(restart):
    """One cycle (restart 50) and many restart cycles (restart 7, started by the host after
    the first): the same inner-iteration count (+-1) as fgmres, both at the tolerance."""
    gpu, A, Ad, dinv, b = _problem()
    xp = gpu.xp
    G = _solver(gpu, Ad, dinv, restart)
    bd = gpu.asarray(b)
    x, state, its = G.solve(bd, xp.zeros_like(bd), rtol=1e-10, maxiter=200)
    count = [0]

    def cb(_):
        count[0] += 1
    xh, info = fgmres(Ad, bd, x0=xp.zeros_like(bd), rtol=1e-10, restart=restart, maxiter=200,
                      M=lambda v: v * dinv, callback=cb, orthogonalization="cgs2")
    assert state == 0 and info == 0
    assert abs(its - count[0]) <= 1 and its > restart, (its, count[0])
    x, xh = to_host(x), to_host(xh)
    for v in (x, xh):
        assert np.linalg.norm(b - A @ v) <= 1e-10 * np.linalg.norm(b)
    assert np.abs(x - xh).max() <= 1e-7 * np.abs(xh).max()
    # a converged start costs no iteration and returns x as it was
    x2, state2, its2 = G.solve(bd, gpu.asarray(x), rtol=1e-10, maxiter=200)
    assert state2 == 0 and its2 == 0 and np.array_equal(to_host(x2), x)


def test_graph_fgmres_float32_and_maxiter():
    """float32: converges to a float32 tolerance; maxiter cycles exhausted: state FULL with
    maxiter * restart iterations and a residual that went down."""
    from adaptmg.linalg.graph_fgmres import FULL
    gpu, A, Ad, dinv, b = _problem(dtype=np.float32)
    xp = gpu.xp
    G = _solver(gpu, Ad, dinv, 10)
    bd = gpu.asarray(b)
    x, state, its = G.solve(bd, xp.zeros_like(bd), rtol=1e-4, maxiter=100)
    assert state == 0 and x.dtype == np.float32
    assert np.linalg.norm(b - A @ to_host(x)) <= 1e-4 * np.linalg.norm(b)
    x, state, its = G.solve(bd, xp.zeros_like(bd), rtol=1e-12, maxiter=2)
    assert state == FULL and its == 20
    assert np.linalg.norm(b - A @ to_host(x)) < 0.5 * np.linalg.norm(b)


def test_graph_fgmres_nonfinite_rhs():
    from adaptmg.linalg.graph_fgmres import NONFINITE
    gpu, A, Ad, dinv, b = _problem(n=10)
    b[3] = np.nan
    G = _solver(gpu, Ad, dinv, 5)
    x, state, its = G.solve(gpu.asarray(b), gpu.xp.zeros(b.size), rtol=1e-8, maxiter=3)
    assert state == NONFINITE and its == 0


@pytest.mark.parametrize("refuse_at, restart, maxiter", [(3, 50, 1), (3, 7, 50)])
def test_graph_fgmres_refused_capture_leaves_x(monkeypatch, refuse_at, restart, maxiter):
    """A capture refused at the third iteration, with one cycle allowed (x is not copied:
    it changes only at a cycle's end) and with restarts (x is copied and restored): solve
    returns None, x holds its initial values, graph_error says why."""
    import adaptmg.linalg.graph_fgmres as GF
    gpu, A, Ad, dinv, b = _problem()
    xp = gpu.xp
    real, calls = GF.capture, []

    def capture(be, run, inputs, output, **kw):
        calls.append(1)
        if len(calls) == refuse_at:
            return None, "refused for the test"
        return real(be, run, inputs, output, **kw)
    monkeypatch.setattr(GF, "capture", capture)
    G = _solver(gpu, Ad, dinv, restart)
    bd = gpu.asarray(b)
    x0 = xp.asarray(np.cos(np.arange(b.size) * 0.11))
    x = x0.copy()
    assert G.solve(bd, x, rtol=1e-12, maxiter=maxiter) is None
    assert len(calls) == refuse_at and G.graph_error == "refused for the test"
    assert bool((x == x0).all())
