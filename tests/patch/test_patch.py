"""Tests of the matrix-free Cartesian Q_k path (adaptmg.patch), CPU only.

The reference stiffness matrix is assembled here, element by element, from an
independent Lagrange basis (product formula on Gauss-Lobatto points) and a
d-dimensional Gauss rule, so that the sum-factorised operator is checked
against the textbook definition a_ij = int grad phi_j . grad phi_i.
"""
import itertools

import numpy as np
import pytest
import scipy.sparse as sp
from numpy.polynomial import legendre as L

from adaptmg.patch import (CartesianSpace, LaplaceOperator, PatchMultigrid, PatchSmoother,
                           patch_levels, prolongation, restriction)


# ---------------------------------------------------------------- reference
def _gl_points(k):
    inner = np.sort(L.Legendre.basis(k).deriv().roots().real) if k > 1 else np.array([])
    return 0.5 * (np.concatenate([[-1.0], inner, [1.0]]) + 1.0)


def _lagrange_1d(k, x):
    """Values and derivatives of the GL Lagrange basis at x (product formula)."""
    z = _gl_points(k)
    V = np.ones((x.size, k + 1))
    D = np.zeros((x.size, k + 1))
    for i in range(k + 1):
        others = [j for j in range(k + 1) if j != i]
        den = np.prod([z[i] - z[j] for j in others])
        V[:, i] = np.prod([x - z[j] for j in others], axis=0) / den
        for m in others:
            D[:, i] += np.prod([x - z[j] for j in others if j != m], axis=0) / den
    return V, D


def assembled_stiffness(space):
    """CSR stiffness of Q_k on the Cartesian mesh, element by element."""
    k, d, h = space.k, space.dim, space.h
    q, w = L.leggauss(k + 2)
    xq, wq = 0.5 * (q + 1), 0.5 * w
    B, Dr = _lagrange_1d(k, xq)
    # element matrix by a d-dimensional Gauss rule (x is the last tensor factor):
    # K_e = sum_q w_q |J| grad phi(x_q)^T grad phi(x_q), gradients as Kronecker rows
    nloc = (k + 1) ** d
    Ke = np.zeros((nloc, nloc))
    wts = np.array([1.0])
    for ax in range(d):
        wts = np.kron(wts, wq)
    wts = wts * np.prod(h)
    for dd in range(d):                                            # direction dd (x = 0)
        G = np.array([[1.0]])
        for ax in range(d):
            dirn = d - 1 - ax
            G = np.kron(G, Dr / h[dirn] if dirn == dd else B)      # (nq^d, nloc)
        Ke += G.T @ (wts[:, None] * G)
    # global lexicographic numbering of full nodes, Dirichlet removed
    full = [n * k + 1 for n in space.cells]                       # x first
    loc = np.array(list(itertools.product(range(k + 1), repeat=d)))  # (nloc, d) z..x
    rows, cols, vals = [], [], []
    for cell in itertools.product(*[range(n) for n in reversed(space.cells)]):
        node = np.array(cell)[None, :] * k + loc                  # numpy order
        ok = np.all((node > 0) & (node < np.array(list(reversed(full))) - 1), axis=1)
        gid = np.ravel_multi_index(tuple((node - 1).T), space.shape, mode="clip")
        gid = np.where(ok, gid, -1)
        r, c = np.meshgrid(gid, gid, indexing="ij")
        m = (r >= 0) & (c >= 0)
        rows.append(r[m]); cols.append(c[m]); vals.append(Ke[m])
    n = space.n_dofs
    return sp.coo_matrix((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))),
                         (n, n)).tocsr()


# ---------------------------------------------------------------- operator
@pytest.mark.parametrize("dim,k,level,lengths,base", [
    (2, 1, 3, (1.0, 2.0), (1, 1)), (2, 2, 2, (1.0, 1.0), (2, 1)), (2, 4, 2, (0.5, 1.0), (1, 1)),
    (2, 10, 1, (1.0, 1.0), (1, 1)), (3, 1, 2, (1.0, 2.0, 3.0), (1, 1, 1)),
    (3, 3, 1, (1.0, 1.0, 0.5), (1, 2, 1)), (3, 5, 1, (1.0, 1.0, 1.0), (1, 1, 1)),
    (3, 8, 1, (2.0, 1.0, 1.0), (1, 1, 1)),
])
def test_operator_matches_assembled_csr(dim, k, level, lengths, base):
    V = CartesianSpace(dim, k, level, lengths, base)
    A = LaplaceOperator(V)
    Aref = assembled_stiffness(V)
    rng = np.random.default_rng(k + 10 * dim)
    for _ in range(2):
        u = rng.standard_normal(V.n_dofs)
        ref = Aref @ u
        assert np.linalg.norm(A @ u - ref) <= 1e-12 * np.linalg.norm(ref)


def test_operator_float32():
    V = CartesianSpace(3, 3, 2)
    u = np.random.default_rng(0).standard_normal(V.n_dofs)
    ref = LaplaceOperator(V) @ u
    v = LaplaceOperator(V, dtype=np.float32) @ u.astype(np.float32)
    assert v.dtype == np.float32
    assert np.linalg.norm(v - ref) <= 1e-5 * np.linalg.norm(ref)


# ---------------------------------------------------------------- Q1 stencil, spmv
def _stencil_apply(w, u, shape):
    """``sum_o w_o u_{i+o}`` with zero outside the domain (NumPy, independent of the kernels)."""
    d = len(shape)
    U = np.pad(u.reshape(shape), 1)
    out = np.zeros(shape)
    for o in itertools.product(range(3), repeat=d):
        out += (w[(1,) + o] if d == 2 else w[o]) * U[tuple(slice(a, a + n) for a, n in zip(o, shape))]
    return out.ravel()


@pytest.mark.parametrize("dim,lengths,base", [(2, (1.0, 2.0), (1, 2)),
                                              (3, (1.0, 2.0, 0.5), (2, 1, 3))])
def test_q1_stencil_is_the_assembled_operator(dim, lengths, base):
    """The stencil the k = 1 GPU kernels use reproduces the independently assembled
    Q1 stiffness on every row (boundary rows included), on anisotropic cells, where
    the order of the coefficients c_d matters; in 2D the off-centre planes are zero."""
    from adaptmg.patch.stencil import distinct_weights, q1_stencil
    V = CartesianSpace(dim, 1, 2, lengths, base)
    w = q1_stencil(V)
    assert w.shape == (3, 3, 3)
    if dim == 2:
        assert not w[0].any() and not w[2].any()
    u = np.random.default_rng(dim).standard_normal(V.n_dofs)
    ref = assembled_stiffness(V) @ u
    assert np.linalg.norm(_stencil_apply(w, u, V.shape) - ref) <= 1e-13 * np.linalg.norm(ref)
    with pytest.raises(ValueError, match="k = 1"):
        q1_stencil(CartesianSpace(dim, 2, 1))
    wd = distinct_weights(w)              # what the kernels keep: 8 values, w even in each axis
    for o in itertools.product((-1, 0, 1), repeat=3):
        assert w[tuple(a + 1 for a in o)] == wd[4 * abs(o[0]) + 2 * abs(o[1]) + abs(o[2])]
    w[0, 1, 2] += 1.0
    with pytest.raises(ValueError, match="even"):
        distinct_weights(w)


def test_kron_gather_layout():
    """The ELL form behind the transfer kernels (rows padded with weight 0) and the
    gather widths that pick the one-pass kernel: Q1 prolongation 2^3, restriction 3^3."""
    import scipy.sparse as sp
    from adaptmg.patch.kron_gather import MAX_GATHER, gather_width, kron_gather_source
    from adaptmg.patch.tensor import ell_form, prolongation_1d
    M = sp.csr_matrix(np.array([[1.0, 0, 2], [0, 0, 0], [0, 3, 0]]))
    cols, vals, width = ell_form(M)
    assert width == 2 and cols.dtype == np.int32
    dense = np.zeros((3, 3))
    np.add.at(dense, (np.repeat(np.arange(3), width), cols.ravel()), vals.ravel())
    np.testing.assert_array_equal(dense, M.toarray())      # a copy (padding adds exact 0s)
    P = [prolongation_1d(1, 8)] * 3
    assert gather_width(P) == 8 and gather_width([p.T.tocsr() for p in P]) == 27 == MAX_GATHER
    assert gather_width([prolongation_1d(2, 8).T.tocsr()] * 3) > MAX_GATHER
    for dt, T in ((np.float64, "double"), (np.float32, "float")):
        src, name = kron_gather_source(dt, (2, 3, 1))
        assert f"typedef {T} T;" in src and "$" not in src and f"\n{name}(" in src
        assert "#define W0 2\n#define W1 3\n#define W2 1\n" in src


def test_stencil_kernel_source():
    from adaptmg.patch.stencil import _PAIR_MINB, stencil_source
    for dt, T in ((np.float64, "double"), (np.float32, "float")):
        src, names = stencil_source(dt)
        assert f"typedef {T} T;" in src and "$" not in src
        assert all(f"void __launch_bounds__(128)\n{n}(" in src for n in names[:3])
        assert f"void __launch_bounds__(1024, {_PAIR_MINB})\n{names[3]}(" in src


@pytest.mark.parametrize("dim,k", [(2, 1), (3, 1), (3, 2)])
def test_spmv_operator_and_transfer(dim, k):
    """``spmv`` (y <- alpha A x + beta y in place) of the operator and the transfers:
    the same values as ``alpha * (A @ x) + beta * y`` (up to rounding of the fused
    update), ``beta = 0`` ignores what ``y`` held (NaN), and the multilevel SpMV plan
    of a matrix-free level uses it."""
    from adaptmg.device.kernels import make_spmv
    V = CartesianSpace(dim, k, 2)
    rng = np.random.default_rng(k)
    eps = np.finfo(np.float64).eps
    for T, n_in in ((LaplaceOperator(V), V.n_dofs), (prolongation(V), V.n_dofs),
                    (restriction(V), V.refine().n_dofs)):
        u = rng.standard_normal(n_in)
        y0 = rng.standard_normal(T.shape[0])
        Tu = T @ u
        for alpha, beta in ((1.0, 0.0), (-1.0, 1.0), (2.5, -0.5)):
            y = y0.copy() if beta else np.full(T.shape[0], np.nan)
            assert T.spmv(u, y, alpha, beta) is y
            ref = alpha * Tu + beta * y0
            np.testing.assert_allclose(y, ref, rtol=0, atol=8 * eps * np.abs(ref).max())
    plan = make_spmv(LaplaceOperator(V))
    assert type(plan).__name__ == "_OperatorPlan"
    u, y = rng.standard_normal(V.n_dofs), np.zeros(V.n_dofs)
    plan(u, y, -1.0, 1.0)
    np.testing.assert_allclose(y, -(LaplaceOperator(V) @ u), rtol=1e-14)
    with pytest.raises(ValueError, match="spmv output"):
        prolongation(V).spmv(rng.standard_normal(V.n_dofs), np.zeros(3))
    # the residual r <- b - A u of the operator and of its plan (the V-cycle's)
    A = LaplaceOperator(V)
    u, b, r = rng.standard_normal(V.n_dofs), rng.standard_normal(V.n_dofs), np.full(V.n_dofs, np.nan)
    ref = b - A @ u
    assert A.residual(u, b, r) is r
    np.testing.assert_allclose(r, ref, rtol=0, atol=8 * eps * np.abs(ref).max())
    r[...] = np.nan
    assert plan.residual(u, b, r) is r
    np.testing.assert_allclose(r, ref, rtol=0, atol=8 * eps * np.abs(ref).max())
    with pytest.raises(ValueError, match="r must be a vector other"):
        A.residual(u, b, b)


def test_operators_declare_fresh_results():
    """The patch operator and multigrid preconditioners return new arrays and say so,
    so the Krylov solvers use ``A v`` / ``M v`` without a defensive copy."""
    from adaptmg.backend import get_backend
    from adaptmg.linalg._operators import as_operator
    V = CartesianSpace(2, 2, 2)
    cpu = get_backend("cpu")
    assert as_operator(LaplaceOperator(V), V.n_dofs, np.float64, cpu).fresh
    M = PatchMultigrid(V).aspreconditioner()
    assert as_operator(M, V.n_dofs, np.float64, cpu).fresh

    class Aliasing:                         # returns its own buffer: must be copied
        shape = (V.n_dofs, V.n_dofs)

        def matvec(self, u):
            return u
    assert not as_operator(Aliasing(), V.n_dofs, np.float64, cpu).fresh


# ---------------------------------------------------------------- transfer
@pytest.mark.parametrize("dim,k", [(2, 1), (2, 3), (3, 2)])
def test_galerkin_and_transpose(dim, k):
    Vc = CartesianSpace(dim, k, 1, base=(1,) * (dim - 1) + (2,))
    Vf = Vc.refine()
    P, R = prolongation(Vc), restriction(Vc)
    Af, Ac = assembled_stiffness(Vf), assembled_stiffness(Vc)
    Pd = np.column_stack([P @ e for e in np.eye(Vc.n_dofs)])
    Rd = np.column_stack([R @ e for e in np.eye(Vf.n_dofs)])
    np.testing.assert_allclose(Rd, Pd.T, atol=1e-14)
    # nested conforming spaces: R A_f P = A_c exactly
    np.testing.assert_allclose(Pd.T @ (Af @ Pd), Ac.toarray(), atol=1e-11 * abs(Ac).max())


def test_prolongation_interpolates_polynomials():
    Vc = CartesianSpace(2, 3, 2)
    Vf = Vc.refine()
    f = lambda x: x * (1 - x) * (x - 0.3)       # cubic, zero on the boundary
    def interp(V):
        y, x = np.meshgrid(V.nodes_1d(1), V.nodes_1d(0), indexing="ij")
        return (f(x) * f(y)).ravel()
    np.testing.assert_allclose(prolongation(Vc) @ interp(Vc), interp(Vf), atol=1e-13)


# ---------------------------------------------------------------- smoother
@pytest.mark.parametrize("dim,k,level,lengths,base", [
    (2, 1, 2, (1.0, 1.0), (1, 1)), (2, 3, 1, (1.0, 2.0), (3, 2)), (3, 2, 1, (1.0, 1.0, 1.0), (2, 2, 2)), (2, 2, 2, (1.0, 1.0), (1, 1)),
    (3, 2, 1, (1.0, 1.0, 2.0), (1, 2, 2)), (3, 1, 2, (1.0, 1.0, 1.0), (1, 1, 1)),
])
def test_smoother_matches_dense_reference(dim, k, level, lengths, base):
    V = CartesianSpace(dim, k, level, lengths, base)
    A = assembled_stiffness(V).toarray()
    S = PatchSmoother(V)
    rng = np.random.default_rng(3)
    x, b = rng.standard_normal(V.n_dofs), rng.standard_normal(V.n_dofs)
    for reverse in (False, True):
        y = x.copy()
        S.smooth(y, b, sweeps=2, reverse=reverse)
        # dense reference: patch by patch (eq. 2.6, global residual, explicit inverses)
        z = x.copy()
        ids = np.arange(V.n_dofs).reshape(V.shape)
        colors = S.colors[::-1] if reverse else S.colors
        assert len(S.colors) == (2 ** dim if min(V.cells) >= 3 else len(S.colors))
        for _ in range(2):
            for col, cnt in colors:
                for m in itertools.product(*[range(c) for c in reversed(cnt)]):
                    p = [1 + cc + 2 * mm for cc, mm in zip(reversed(col), m)]
                    I = ids[tuple(slice((pp - 1) * k, (pp + 1) * k - 1) for pp in p)].ravel()
                    assert I.size == (2 * k - 1) ** dim
                    Ainv = np.linalg.inv(A[np.ix_(I, I)])
                    z[I] += Ainv @ (b - A @ z)[I]
        assert np.linalg.norm(y - z) <= 1e-12 * np.linalg.norm(z)


def test_smoother_is_exact_on_one_patch():
    V = CartesianSpace(3, 3, 1)
    b = np.random.default_rng(1).standard_normal(V.n_dofs)
    x = np.zeros_like(b)
    PatchSmoother(V).smooth(x, b)
    A = LaplaceOperator(V)
    assert np.linalg.norm(A @ x - b) <= 1e-12 * np.linalg.norm(b)


# ---------------------------------------------------------------- multigrid
def _fmg_iterations(dim, k, level):
    V = CartesianSpace(dim, k, level)
    b = V.load_separable([np.ones_like] * dim)                     # f = 1 (seed Tables 1-2)
    x, info = PatchMultigrid(V).solve(b, rtol=1e-9)
    assert info["converged"]
    assert np.linalg.norm(b - LaplaceOperator(V) @ x) <= 1e-9 * np.linalg.norm(b)
    return info["iterations"]


def test_fmg_iterations_level_independent_and_fall_with_k():
    # 2D: k = 1..6 on levels 5..7
    ks2 = [1, 2, 3, 4, 6]
    its2 = {k: [_fmg_iterations(2, k, l) for l in (5, 6, 7)] for k in ks2}
    # 3D: k = 2..4 on levels 3..4
    ks3 = [2, 3, 4]
    its3 = {k: [_fmg_iterations(3, k, l) for l in (3, 4)] for k in ks3}
    print("FMG iterations 2D", its2, "3D", its3)
    for its in (its2, its3):
        for k, row in its.items():
            assert all(b <= a for a, b in zip(row, row[1:])), (k, row)   # no growth with level
        ks = sorted(its)
        for k0, k1 in zip(ks, ks[1:]):
            assert max(its[k1]) <= max(its[k0]), its                    # falls with k
        assert max(its[ks[-1]]) < max(its[ks[0]])
    # measured with the default (post-smoothing colours forward, at least one V-cycle after
    # the FMG start; load vector of f = 1): 2D Q1 5, Q2 2, Q3 2->1, Q4+ 1; 3D Q2 4, Q3 3->2,
    # Q4 2 (the former symmetric cycle needed 11 / 4 / 4 / 2 and 6 / 4 / 2, patch/NOTES.md)
    assert max(its2[1]) <= 6 and max(its2[2]) <= 3 and max(its2[3]) <= 2 and max(its2[6]) == 1
    assert max(its3[2]) <= 5 and max(its3[3]) <= 3 and max(its3[4]) <= 2
    assert min(min(r) for r in its2.values()) >= 1      # Algorithm 2.2: at least one V-cycle


@pytest.mark.parametrize("dim,k,level", [(2, 3, 4), (3, 2, 3)])
def test_mixed_precision_same_l2_error(dim, k, level):
    V = CartesianSpace(dim, k, level)
    b, _ = V.sine_problem()
    mg = PatchMultigrid(V)
    errs = {}
    for method in ("fmg", "gmres"):
        for prec in ("double", "mixed"):
            x, info = mg.solve(b, rtol=1e-9, method=method, precision=prec)
            assert info["converged"], (method, prec, info["residuals"])
            errs[method, prec] = V.l2_error_sine(x)
    e = errs["fmg", "double"]
    assert e < 1e-3
    for key, val in errs.items():
        assert abs(val - e) <= 1e-6 * e, (key, errs)


def test_l2_error_converges_at_order_k_plus_1():
    errs = []
    for level in (2, 3, 4):
        V = CartesianSpace(2, 2, level)
        b, _ = V.sine_problem()
        x, _ = PatchMultigrid(V).solve(b, rtol=1e-11)
        errs.append(V.l2_error_sine(x))
    rates = np.log2(np.array(errs[:-1]) / np.array(errs[1:]))
    assert np.all(rates > 2.8), rates


@pytest.mark.parametrize("dim, k, level, base", [(2, 3, 2, (2, 3)), (3, 2, 2, None), (3, 4, 1, (1, 2, 3))])
def test_l2_error_slabs_and_exact_value(dim, k, level, base):
    """The slab-wise error equals the one-slab error (summation order aside), and for
    u_h = 0 it is the exact norm of prod sin(pi x_d / L_d): prod_d sqrt(L_d / 2)."""
    V = CartesianSpace(dim, k, level, lengths=(1.0, 2.0, 0.5)[:dim], base=base)
    u = np.random.default_rng(3).standard_normal(V.n_dofs)
    one = V.l2_error_sine(u, slab_points=1 << 40)
    assert abs(V.l2_error_sine(u, slab_points=1) - one) <= 1e-14 * one
    zero = V.l2_error_sine(np.zeros(V.n_dofs))
    assert abs(zero - np.prod(np.sqrt(np.array(V.lengths) / 2))) <= 1e-13
    with pytest.raises(TypeError, match="floating"):
        V.l2_error_sine(np.zeros(V.n_dofs, dtype=np.int64))


def test_vcycle_is_symmetric_with_reverse_post_smoothing():
    # post="reverse" (adjoint post-sweep) gives a symmetric V-cycle (CG preconditioner);
    # the default post="forward" (seed 000's code) does not
    V = CartesianSpace(2, 2, 3)
    rng = np.random.default_rng(5)
    u, v = rng.standard_normal(V.n_dofs), rng.standard_normal(V.n_dofs)
    mg = PatchMultigrid(V, post="reverse")
    assert abs(u @ mg.vcycle(v) - v @ mg.vcycle(u)) <= 1e-12 * abs(u @ mg.vcycle(u))
    mg = PatchMultigrid(V)
    assert mg.post == "forward"
    assert abs(u @ mg.vcycle(v) - v @ mg.vcycle(u)) > 1e-4 * abs(u @ mg.vcycle(u))


def test_patch_levels_interface():
    V = CartesianSpace(2, 2, 3)
    levels = patch_levels(V)
    assert [lv.A.shape[0] for lv in levels] == [V.with_level(l).n_dofs for l in (3, 2, 1)]
    for fine, coarse in zip(levels, levels[1:]):
        assert fine.P.shape == (fine.A.shape[0], coarse.A.shape[0])
        assert fine.R.shape == (coarse.A.shape[0], fine.A.shape[0])
    assert levels[-1].P is None
    b = np.ones(levels[-1].A.shape[0])
    x = np.zeros_like(b)
    levels[-1].smoother.smooth(x, b)
    assert np.linalg.norm(levels[-1].A @ x - b) < 1e-12 * np.linalg.norm(b)


# ---------------------------------------------------------------- errors
def test_bad_input():
    with pytest.raises(ValueError, match="degree"):
        CartesianSpace(3, 9, 1)
    with pytest.raises(ValueError, match="degree"):
        CartesianSpace(2, 0, 1)
    with pytest.raises(TypeError, match="degree"):
        CartesianSpace(2, 2.0, 1)
    with pytest.raises(ValueError, match="dim"):
        CartesianSpace(4, 2, 1)
    with pytest.raises(ValueError, match="level"):
        CartesianSpace(2, 2, -1)
    with pytest.raises(ValueError, match="no degree of freedom"):
        CartesianSpace(2, 1, 0)
    V = CartesianSpace(2, 2, 2)
    with pytest.raises(TypeError, match="dtype"):
        LaplaceOperator(V, dtype=np.int32)
    A = LaplaceOperator(V)
    with pytest.raises(ValueError, match="shape"):
        A @ np.ones(V.n_dofs + 1)
    with pytest.raises(TypeError, match="dtype"):
        A @ np.ones(V.n_dofs, dtype=np.float32)
    with pytest.raises(ValueError, match="no interior vertex"):
        PatchSmoother(CartesianSpace(2, 2, 0))
    with pytest.raises(ValueError, match="coarse_level"):
        PatchMultigrid(V, coarse_level=5)
    with pytest.raises(ValueError, match="method"):
        PatchMultigrid(V).solve(np.ones(V.n_dofs), method="jacobi")
    with pytest.raises(ValueError, match="krylov"):       # the private GMRES is gone
        PatchMultigrid(V).solve(np.ones(V.n_dofs), method="gmres", krylov="private")


# ---------------------------------------------------------------- shared driver
@pytest.mark.parametrize("coarse", ["direct", "smoother"])
@pytest.mark.parametrize("accel", [None, "gmres"])
def test_patch_levels_in_multilevel_solver(coarse, accel):
    ml_mod = pytest.importorskip("adaptmg.multilevel")
    V = CartesianSpace(2, 3, 4)
    b, _ = V.sine_problem()
    levels = patch_levels(V)                               # the one-argument switch
    ml = ml_mod.MultilevelSolver(levels, coarse=coarse, coarse_sweeps=1, presmooth=1,
                                 postsmooth=1, backend="cpu")
    res = []
    x = ml.solve(b, rtol=1e-9, accel=accel, maxiter=30, residuals=res)
    assert np.linalg.norm(b - LaplaceOperator(V) @ x) <= 1e-9 * np.linalg.norm(b)
    # same cycle as PatchMultigrid's: the stationary iteration needs as many steps
    mg = PatchMultigrid(V)
    assert len(res) - 1 <= 10
    if accel is None:
        xx = np.zeros_like(b)
        r = b.copy()
        its = 0
        while np.linalg.norm(r) > 1e-9 * np.linalg.norm(b):
            xx += mg.vcycle(r)
            r = b - LaplaceOperator(V) @ xx
            its += 1
        # exact although the two drivers round differently: the residuals bracketing the stop
        # are about 12.5 and 0.79 times the tolerance, far from it
        assert its == len(res) - 1


# The cycle is MultilevelSolver's: PatchMultigrid runs the patch levels with it, in
# double and (float32 copies of the levels) in single precision.
CYCLE = dict(coarse="smoother", coarse_sweeps=1, presmooth=1, postsmooth=1)


@pytest.mark.parametrize("dim,k,level", [(2, 2, 3), (3, 2, 2)])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_patch_multigrid_cycle_is_multilevel_solver(dim, k, level, dtype):
    from adaptmg.multilevel import MultilevelSolver
    V = CartesianSpace(dim, k, level)
    mg = PatchMultigrid(V, dtype=dtype)
    assert isinstance(mg.multilevel, MultilevelSolver) and mg.multilevel.dtype == dtype
    ml = MultilevelSolver(patch_levels(V, dtype=dtype), dtype=dtype, **CYCLE)
    rng = np.random.default_rng(7)
    b = rng.standard_normal(V.n_dofs).astype(dtype)
    x0 = rng.standard_normal(V.n_dofs).astype(dtype)
    np.testing.assert_array_equal(mg.vcycle(b), ml.cycle(b, np.zeros_like(b)))
    np.testing.assert_array_equal(mg.vcycle(b, x0.copy()), ml.cycle(b, x0.copy()))
    M = mg.aspreconditioner()
    np.testing.assert_array_equal(M(b.astype(np.float64)), mg.vcycle(b).astype(np.float64))


def test_mixed_precision_cycle_runs_on_float32_levels():
    from adaptmg.multilevel import MultilevelSolver
    V = CartesianSpace(2, 3, 3)
    b, _ = V.sine_problem()
    mg = PatchMultigrid(V)
    x, info = mg.solve(b, method="gmres", precision="mixed")
    assert info["converged"]
    ml32 = mg._cycles_for(np.float32).ml
    assert isinstance(ml32, MultilevelSolver) and ml32.dtype == np.float32
    for lev in ml32.levels:
        parts = [lev.A, lev.smoother] + ([lev.P, lev.R] if lev.P is not None else [])
        assert all(p.dtype == np.float32 for p in parts)
    # the float32 levels are the float64 ones cast with .to(): same cycle as built in float32
    ref = PatchMultigrid(V, dtype=np.float32)
    b32 = b.astype(np.float32)
    np.testing.assert_array_equal(ml32.cycle(b32, np.zeros_like(b32)), ref.vcycle(b32))


def test_to_changes_dtype_and_keeps_self():
    from adaptmg.patch import FastDiagSolver
    V = CartesianSpace(2, 2, 2)
    objs = [LaplaceOperator(V), PatchSmoother(V), FastDiagSolver(V), prolongation(V), restriction(V)]
    for obj in objs:
        assert obj.to("cpu", np.float64) is obj and obj.to() is obj
        o32 = obj.to("cpu", np.float32)
        assert type(o32) is type(obj) and o32.dtype == np.float32
        assert getattr(o32, "shape", None) == getattr(obj, "shape", None)
    u = np.random.default_rng(0).standard_normal(V.n_dofs)
    A32 = objs[0].to(dtype=np.float32)
    assert np.linalg.norm(A32 @ u.astype(np.float32) - objs[0] @ u) <= 1e-5 * np.linalg.norm(objs[0] @ u)
    P32 = objs[3].to(dtype=np.float32)
    uc = np.random.default_rng(1).standard_normal(P32.shape[1])
    assert np.linalg.norm(P32 @ uc.astype(np.float32) - objs[3] @ uc) <= 1e-6 * np.linalg.norm(objs[3] @ uc)


def test_fmg_stops_at_the_rounding_floor_and_warns():
    """rtol below what double precision reaches: FMG stops as stagnated after a few cycles
    (not after maxiter) and says so; a cycle cap that is too small says that instead."""
    from adaptmg.linalg import ConvergenceWarning
    V = CartesianSpace(2, 2, 3)
    b, _ = V.sine_problem()
    mg = PatchMultigrid(V)
    with pytest.warns(ConvergenceWarning, match="stagnated"):
        x, info = mg.solve(b, rtol=1e-19, maxiter=50)
    assert info["stagnated"] and not info["converged"]
    assert info["iterations"] < 20
    assert info["residuals"][-1] < 1e-13                # it did reach the floor
    with pytest.warns(ConvergenceWarning, match="V-cycles reached"):
        _, info = mg.solve(b, rtol=1e-19, maxiter=1)
    assert info["iterations"] == 1 and not info["stagnated"]
    _, info = mg.solve(b, rtol=1e-9)
    assert info["converged"] and not info["stagnated"]


def _assert_compiled_matrices(src, k, dtype):
    """The 1D matrices compiled into a smoother's source as ``__constant__``
    arrays are exactly the patch matrices rounded to ``dtype``."""
    import re
    from adaptmg.patch.tensor import patch_fast_diag, patch_matrices
    Mb, Ab, _, _ = patch_matrices(k)
    S, lam = patch_fast_diag(k)
    for sym, ref in (("cMb", Mb), ("cAb", Ab), ("cS", S), ("cL", lam)):
        body = re.search(sym + r"\[[^\]]*\] = \{([^}]*)\}", src).group(1)
        got = [float.fromhex(t.strip().rstrip("f")) for t in body.split(",")]
        np.testing.assert_array_equal(np.asarray(got, dtype=dtype), np.asarray(ref, dtype=dtype).ravel())


@pytest.mark.parametrize("k", range(1, 9))
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_pencil_kernel_source(k, dtype):
    """The pencil smoother's source (built without a GPU): the compiled-in 1D
    matrices are exactly the patch matrices rounded to the dtype, no template
    field is left, and the shared-memory regions that live at the same time do
    not overlap (see the stage comments of _SMOOTH3D_PENCIL)."""
    from adaptmg.patch.kernels import pencil_layout, pencil_smoother_source
    src, name = pencil_smoother_source(k, dtype, 2)
    assert "$" not in src and name.endswith("_mb2") and f"_k{k}_" in name
    _assert_compiled_matrices(src, k, dtype)
    NP, NI = 2 * k + 1, 2 * k - 1
    PT, off_t, psmem = pencil_layout(k)
    assert PT >= NI * NI and (PT - NI) % 32 == 0            # y-stage reads: distinct banks
    assert off_t >= 2 * NI * NI * NP                         # z/x outputs after p, q
    assert NI ** 3 <= off_t and off_t + NI * PT <= psmem      # y outputs before them
    assert NP ** 3 + NP * NP * NI >= 2 * NI * NI * NP         # w survives the p, q writes
    assert psmem >= NP ** 3 + 2 * NP * NP * NI


@pytest.mark.parametrize("k", range(1, 9))
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_boundary_kernel_source(k, dtype):
    """The Boundary smoother's source (built without a GPU): compiled-in 1D
    matrices exact in the dtype, no template field left, regions that live at
    the same time disjoint, and the three face groups of each residual stage
    on disjoint thread ranges (see _SMOOTH3D_BOUNDARY)."""
    from adaptmg.patch.kernels import boundary_layout, boundary_smoother_source, patches_per_block
    src, name = boundary_smoother_source(k, dtype, 3, "2")
    assert "$" not in src and name.endswith("_mb3_u2") and f"_k{k}_" in name
    assert "#pragma unroll 2\n    for (int a = 0;" in src
    _assert_compiled_matrices(src, k, dtype)
    NP, NI = 2 * k + 1, 2 * k - 1
    L = boundary_layout(k)
    shell_and_stage1 = 2 * NP * NP + 6 * NI * NP + 10 * NI * NI
    assert L["OB"] >= shell_and_stage1 and L["OB"] >= NI * L["PT"]     # sT over dead stage-1 data
    assert L["PSMEM"] == L["OB"] + 12 * NI * NI + NI ** 3               # stage 2 (then sU), R_j b
    for first, n in (("G1", 2 * NP), ("G2", 2 * NI)):
        y, x, end = L[first + "Y"], L[first + "X"], L[first + "END"]
        assert n <= y and y + 2 * NI <= x and end == x + 2 * NI
        if patches_per_block(3, k) == 1 and end <= NP * NP:
            assert y % 32 == 0 and x % 32 == 0                           # one group per warp


@pytest.mark.parametrize("k", (1, 2, 4, 7))
def test_boundary_form_identity(k):
    """The identity behind the Boundary smoother (seed 000 §4.1.3, eq. 4.2), in
    the kernel's stage order: with the exact local solve, x + A_j^{-1}(b - Abar x)
    restricted to the interior is A_j^{-1}(b^I - A^{IB} x^B), and A^{IB} x^B is
    the sum of the z-, y- and x-face groups, each contracting its long
    directions first and expanding its two boundary columns last."""
    from adaptmg.patch.tensor import patch_fast_diag, patch_matrices
    Mb, Ab, Mi, Ai = patch_matrices(k)
    S, lam = patch_fast_diag(k)
    NP, NI = 2 * k + 1, 2 * k - 1
    c0, c1, c2 = 0.7, 1.3, 0.4
    rng = np.random.default_rng(k)
    X, b = rng.standard_normal((NP,) * 3), rng.standard_normal((NI,) * 3)     # [z][y][x]

    def kron3(A2, A1, A0, U):
        return np.einsum("ai,bj,ck,ijk->abc", A2, A1, A0, U)

    Abar = (lambda U: c0 * kron3(Mb, Mb, Ab, U) + c1 * kron3(Mb, Ab, Mb, U) + c2 * kron3(Ab, Mb, Mb, U))
    Ainv = (lambda r: kron3(S, S, S, kron3(S.T, S.T, S.T, r) / (
        c0 * lam[None, None, :] + c1 * lam[None, :, None] + c2 * lam[:, None, None])))
    xi_new = X[1:-1, 1:-1, 1:-1] + Ainv(b - Abar(X))
    mB, aB = Mb[:, [0, -1]], Ab[:, [0, -1]]
    dZ, dY, dX = X[[0, -1]], X[1:-1][:, [0, -1]], X[1:-1, 1:-1][:, :, [0, -1]]
    vZ, wZ = np.einsum("aj,fij->fia", Mb, dZ), np.einsum("aj,fij->fia", Ab, dZ)       # stage 1
    vY, wY = np.einsum("aj,ifj->ifa", Mb, dY), np.einsum("aj,ifj->ifa", Ab, dY)
    yM, yA = np.einsum("bj,ijf->ibf", Mi, dX), np.einsum("bj,ijf->ibf", Ai, dX)
    PZ = np.einsum("bi,fia->fba", Mb, vZ)                                             # stage 2
    QZ = c1 * np.einsum("bi,fia->fba", Ab, vZ) + c0 * np.einsum("bi,fia->fba", Mb, wZ)
    H1 = c2 * np.einsum("ci,ifa->fca", Ai, vY) + c0 * np.einsum("ci,ifa->fca", Mi, wY)
    H2 = c1 * np.einsum("ci,ifa->fca", Mi, vY)
    K1 = c2 * np.einsum("ci,ibf->cbf", Ai, yM) + c1 * np.einsum("ci,ibf->cbf", Mi, yA)
    K2 = c0 * np.einsum("ci,ibf->cbf", Mi, yM)
    AIB_xB = (np.einsum("cf,fba->cba", c2 * aB, PZ) + np.einsum("cf,fba->cba", mB, QZ)   # stage 4
              + np.einsum("bf,fca->cba", mB, H1) + np.einsum("bf,fca->cba", aB, H2)
              + np.einsum("af,cbf->cba", mB, K1) + np.einsum("af,cbf->cba", aB, K2))
    scale = np.abs(xi_new).max()
    assert np.abs(Ainv(b - AIB_xB) - xi_new).max() <= 1e3 * np.finfo(float).eps * scale
