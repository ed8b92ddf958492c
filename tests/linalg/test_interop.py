"""Interoperability with scipy.sparse.linalg and cupyx.scipy.sparse.linalg, both ways.

* adaptmg's solvers take SciPy ``LinearOperator`` objects as ``A`` and ``M``
  (also with ``b`` on the GPU: the operator's vectors go through the host) and,
  on the device, cupyx ``LinearOperator`` objects;
* SciPy's ``cg``/``gmres`` (and, on the device, cupyx's) take the multigrid
  preconditioner ``ml.aspreconditioner()`` of ``adaptmg.multigrid(...)`` and
  converge in a few iterations, as adaptmg's own solvers do with it.
"""
import inspect
import warnings

import numpy as np
import pytest
import scipy.sparse as sp
import scipy.sparse.linalg as spla

import adaptmg
from adaptmg import assemble
from adaptmg.backend import to_host
from adaptmg.linalg import ConvergenceWarning, bicgstab, cg, fgmres, gmres, minres

OURS = {"cg": cg, "gmres": gmres, "fgmres": fgmres, "bicgstab": bicgstab, "minres": minres}


def poisson(m=12):
    T = sp.diags([-1.0, 2.0, -1.0], [-1, 0, 1], shape=(m, m))
    return (sp.kron(sp.eye(m), T) + sp.kron(T, sp.eye(m))).tocsr()


A = poisson()
N = A.shape[0]
B = np.random.default_rng(3).standard_normal(N)
JACOBI = sp.diags(1.0 / A.diagonal()).tocsr()


def relres(Amat, x, b):
    return np.linalg.norm(b - Amat @ to_host(x)) / np.linalg.norm(b)


def kw_for(name):
    return {"callback_type": "pr_norm"} if name == "gmres" else {}


# ----------------------------------------------------------------------------- adaptmg takes theirs
@pytest.mark.parametrize("name", OURS)
def test_adaptmg_takes_scipy_linear_operators(backend, name):
    ops = [spla.aslinearoperator(A),
           spla.LinearOperator(A.shape, matvec=lambda v: A @ v, dtype=A.dtype)]
    M = spla.LinearOperator(A.shape, matvec=lambda v: JACOBI @ v, dtype=A.dtype)
    for op in ops:
        count = []
        x, info = OURS[name](op, backend.asarray(B), rtol=1e-10, M=M, callback=count.append,
                             **kw_for(name))
        assert info == 0 and isinstance(x, backend.xp.ndarray)
        assert relres(A, x, B) <= 1e-10 and len(count) > 0


@pytest.mark.gpu
@pytest.mark.parametrize("name", OURS)
def test_adaptmg_takes_cupyx_linear_operators(name):
    import cupy as cp
    import cupyx.scipy.sparse as csp
    import cupyx.scipy.sparse.linalg as csla
    Ad, Md = csp.csr_matrix(A), csp.csr_matrix(JACOBI)
    ops = [csla.aslinearoperator(Ad),
           csla.LinearOperator(A.shape, matvec=lambda v: Ad @ v, dtype=A.dtype)]
    M = csla.LinearOperator(A.shape, matvec=lambda v: Md @ v, dtype=A.dtype)
    for op in ops:
        for b in (cp.asarray(B), B):                    # the result follows b
            x, info = OURS[name](op, b, rtol=1e-10, M=M)
            assert info == 0 and isinstance(x, type(b))
            assert relres(A, x, B) <= 1e-10


# ----------------------------------------------------------------------------- they take ours
def multigrid(backend_name):
    mesh = adaptmg.Mesh.box([0, 0], [1, 1], [4, 4]).refine().refine().refine()
    space = adaptmg.Space(mesh, degree=1)
    ml = adaptmg.multigrid(space, assemble.stiffness, dirichlet="all", backend=backend_name)
    Ah = to_host(ml.levels[-1].A).tocsr()
    b = np.random.default_rng(4).standard_normal(Ah.shape[0])
    return ml, Ah, b


def counted(solver, *args, **kw):
    calls = []
    x, info = solver(*args, callback=lambda _: calls.append(1), **kw)
    return x, info, len(calls)


def test_scipy_solvers_take_the_multigrid_preconditioner():
    ml, Ah, b = multigrid("cpu")
    M = ml.aspreconditioner()
    assert isinstance(M, spla.LinearOperator) and M.shape == Ah.shape
    x, info, its = counted(spla.cg, Ah, b, rtol=1e-10, M=M)
    assert info == 0 and relres(Ah, x, b) <= 1e-10 and its <= 15
    x, info, its = counted(spla.gmres, Ah, b, rtol=1e-10, M=M, callback_type="pr_norm")
    assert info == 0 and relres(Ah, x, b) <= 1e-10 and its <= 15
    # without a preconditioner SciPy's cg needs many more iterations
    assert counted(spla.cg, Ah, b, rtol=1e-10)[2] > 3 * its


@pytest.mark.gpu
def test_cupyx_solvers_take_the_multigrid_preconditioner():
    import cupy as cp
    import cupyx.scipy.sparse as csp
    import cupyx.scipy.sparse.linalg as csla
    ml, Ah, b = multigrid("gpu")
    M = ml.aspreconditioner()
    assert isinstance(M, csla.LinearOperator)
    Ad, bd = csp.csr_matrix(Ah), cp.asarray(b)
    for solver in (csla.cg, csla.gmres):
        # CuPy's solvers take rtol (newer) or tol (older)
        tol = "rtol" if "rtol" in inspect.signature(solver).parameters else "tol"
        x, info = solver(Ad, bd, M=M, maxiter=50, **{tol: 1e-10})
        assert info == 0 and isinstance(x, cp.ndarray)
        assert relres(Ah, x, b) <= 1e-9


@pytest.mark.parametrize("name", OURS)
def test_adaptmg_solvers_take_the_multigrid_preconditioner(backend, name):
    ml, Ah, b = multigrid(backend.name)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)
        x, info, its = counted(OURS[name], backend.asmatrix(Ah), backend.asarray(b), rtol=1e-10,
                               M=ml.aspreconditioner(), **kw_for(name))
    assert info == 0 and relres(Ah, x, b) <= 1e-10 and its <= 15
