"""Vectorised assembly (adaptmg.assemble) on uniform, graded and distorted structured meshes.

The meshes are built here with numpy (adaptmg.assemble.testing) so that the tests do not
depend on adaptmg.mesh. Exactness arguments used below: the geometry map is multilinear,
so a function linear in x is in the (isoparametric) Q1 and Q2 spaces on every mesh, and its
physical gradient is reproduced exactly at every quadrature point.
"""
import numpy as np
import pytest
import scipy.sparse as sp

from adaptmg import assemble as asm
from adaptmg.fe.sparsity import Pattern, componentwise
from adaptmg.assemble.testing import (StructuredMesh, StructuredSpace,
                                      refine_structured)
from adaptmg.fe.element import LagrangeQ
from adaptmg.fe.geometry import cell_geometry
from adaptmg.fe.quadrature import tensor_gauss

SHAPES = {2: (5, 4), 3: (3, 3, 2)}


def graded(p):
    """cos grading of seed 001 §5.3.1 in every direction: rectangles of varying size."""
    return 0.5 * (1.0 - np.cos(np.pi * p))


def distorted(seed=1, amp=0.25):
    """Random interior vertex perturbation (boundary fixed): general non-affine cells in [0,1]^d."""
    def mapping(p):
        rng = np.random.default_rng(seed)
        n = np.array([len(np.unique(p[:, a])) - 1 for a in range(p.shape[1])])
        interior = np.all((p > 1e-12) & (p < 1 - 1e-12), axis=1)
        q = p.copy()
        q[interior] += amp * (rng.random((interior.sum(), p.shape[1])) - 0.5) / n
        return q
    return mapping


def sheared(p):
    """A global affine map: parallelogram / parallelepiped cells, volume det(A)."""
    d = p.shape[1]
    A = np.eye(d)
    A[0, 1] = 0.4
    A[d - 1, 0] = 0.2
    return p @ A.T


MESHES = {"uniform": None, "graded": graded, "distorted": distorted(), "sheared": sheared}


def volume(name, d):
    if name == "sheared":
        A = np.eye(d)
        A[0, 1] = 0.4
        A[d - 1, 0] = 0.2
        return np.linalg.det(A)
    return 1.0


def space(d, k=1, mesh="uniform", c=1, shape=None):
    return StructuredSpace(StructuredMesh(shape or SHAPES[d], MESHES[mesh]), k, c)


ALL = [(d, k, m) for d in (2, 3) for k in (1, 2) for m in MESHES]


def linear(d):
    a = np.arange(1.0, d + 1.0)
    return a, (lambda x: 0.5 + x @ a)


# ----------------------------------------------------------------------------- mass


@pytest.mark.parametrize("d,k,mesh", ALL)
def test_mass_and_lumped_mass_sum_to_volume(d, k, mesh):
    s = space(d, k, mesh)
    M = asm.mass(s)
    one = np.ones(s.num_dofs)
    vol = volume(mesh, d)
    assert abs(one @ M @ one - vol) < 1e-12
    assert abs(M - M.T).max() < 1e-15
    ml = asm.lumped_mass(s)
    assert ml.shape == (s.num_dofs,)
    assert abs(ml.sum() - vol) < 1e-12
    assert ml.min() > 0
    if k == 1:   # Q1: exactly the row sums (seed 001 eq. 12)
        assert np.allclose(ml, M @ one, rtol=1e-13, atol=0)


@pytest.mark.parametrize("d,k", [(2, 1), (2, 2), (3, 1), (3, 2)])
@pytest.mark.parametrize("mesh", ["graded", "sheared"] + ["distorted"])
def test_mass_integrates_square_of_linear(d, k, mesh):
    s = space(d, k, mesh)
    # u^2 det J has degree 4 per variable on 3-D trilinear cells: k+1 = 2 points are not enough
    nq = 3 if (mesh == "distorted" and d == 3) else None
    a, u = linear(d)
    uh = u(s.points)
    # exact value of int u^2 with the same map: integrate with a 4-point rule cell by cell
    xi, w = tensor_gauss(d, 4)
    g = cell_geometry(s.mesh, xi)
    exact = np.sum(u(g.x) ** 2 * g.detJ * w)
    assert abs(uh @ asm.mass(s, quad_points=nq) @ uh - exact) < 1e-12 * exact


@pytest.mark.parametrize("d", [2, 3])
def test_q2_hrz_lumping_is_diagonal_scaling(d):
    """HRZ per cell: m_i^T = M^T_ii |T| / trace(M^T), reference from independent element matrices."""
    s = space(d, 2, "distorted", shape=(2,) * d)
    xi, w = tensor_gauss(d, 3)
    g = cell_geometry(s.mesh, xi)
    phi = LagrangeQ(2, d).values(xi)
    diag = np.einsum("cq,qi->ci", g.detJ * w, phi ** 2)
    vol = (g.detJ * w).sum(1)
    ref = np.bincount(s.cell_dofs.ravel(), (diag * (vol / diag.sum(1))[:, None]).ravel())
    ml = asm.lumped_mass(s)
    assert np.allclose(ml, ref, rtol=1e-13, atol=0)
    rowsum = asm.mass(s) @ np.ones(s.num_dofs)
    assert np.allclose(asm.lumped_mass(s, "rowsum"), rowsum)
    assert np.abs(ml - rowsum).max() > 1e-6                     # genuinely different from row sums
    with pytest.raises(ValueError, match="method"):
        asm.lumped_mass(s, "bogus")


def test_components_are_block_diagonal():
    s1, s3 = space(2, 2, "distorted"), space(2, 2, "distorted", c=3)
    M1, M3 = asm.mass(s1), asm.mass(s3)
    assert M3.shape == (3 * s1.num_nodes,) * 2 and M3.nnz == 3 * M1.nnz
    for r in range(3):
        # exact: c = 3 runs the same scalar assembly (same chunks, same GEMMs) and copies it per component
        assert abs(M3[r::3, r::3] - M1).max() == 0
        assert M3[r::3, (r + 1) % 3::3].nnz == 0
    assert np.allclose(asm.lumped_mass(s3).reshape(-1, 3), asm.lumped_mass(s1)[:, None])
    assert M3.indices.dtype == np.int32 and M3.has_sorted_indices


# ----------------------------------------------------------------------------- stiffness


@pytest.mark.parametrize("d,k,mesh", ALL)
def test_stiffness_constants_and_linear_energy(d, k, mesh):
    s = space(d, k, mesh)
    K = asm.stiffness(s)
    assert K.shape == (s.num_dofs, s.num_dofs) and K.indices.dtype == np.int32
    assert abs(K - K.T).max() < 1e-13
    assert np.abs(K @ np.ones(s.num_dofs)).max() < 1e-12
    a, u = linear(d)
    uh = u(s.points)
    # grad u = a exactly at every quadrature point, so u^T K u = |a|^2 |Omega|
    assert abs(uh @ K @ uh - a @ a * volume(mesh, d)) < 1e-11


@pytest.mark.parametrize("d", [2, 3])
def test_q2_stiffness_quadratic(d):
    s = space(d, 2, "graded")
    u = s.points[:, 0] ** 2 - s.points[:, -1] ** 2          # in Q2 on rectangles
    assert abs(u @ asm.stiffness(s) @ u - 8.0 / 3.0) < 1e-12


def test_stiffness_matches_reference_coo_assembly():
    """Independent assembly: physical gradients by einsum, summed with scipy COO."""
    s = space(3, 2, "distorted", shape=(2, 2, 1))
    xi, w = tensor_gauss(3, 3)
    g = cell_geometry(s.mesh, xi)
    G = g.physical_gradients(LagrangeQ(2, 3).gradients(xi))
    kap = 1.0 + g.x[..., 0] * g.x[..., 1]
    Ke = np.einsum("cq,cqia,cqja->cij", kap * g.detJ * w, G, G)
    r = np.repeat(s.cell_dofs, 27, axis=1).ravel()
    c = np.tile(s.cell_dofs, (1, 27)).ravel()
    ref = sp.coo_matrix((Ke.ravel(), (r, c)), shape=(s.num_dofs,) * 2).tocsr()
    K = asm.stiffness(s, lambda x: 1.0 + x[..., 0] * x[..., 1])
    assert abs(K - ref).max() < 1e-13 * abs(ref).max()
    assert K.nnz == ref.nnz


@pytest.mark.parametrize("d,k,mesh", [(2, 1, "distorted"), (3, 2, "distorted"), (2, 2, "sheared"),
                                      (3, 1, "sheared")])
def test_coefficient_forms_agree(d, k, mesh):
    """Constant / per-cell coefficients take the affine fast path on sheared meshes, callables do not."""
    s = space(d, k, mesh)
    nc = s.mesh.num_cells
    K = asm.stiffness(s, 2.5)
    for coef in (np.full(nc, 2.5), lambda x: np.full(x.shape[:-1], 2.5), np.float64(2.5)):
        assert abs(asm.stiffness(s, coef) - K).max() < 1e-13
    assert abs(asm.mass(s, np.full(nc, 2.5)) - 2.5 * asm.mass(s)).max() < 1e-15
    # a genuinely per-cell coefficient: u^T K u = |a|^2 sum_T c_T |T| for linear u
    cT = np.random.default_rng(3).random(nc) + 0.5
    a, u = linear(d)
    uh = u(s.points)
    xi, w = tensor_gauss(d, 2)
    vols = cell_geometry(s.mesh, xi).volumes(w)
    assert abs(uh @ asm.stiffness(s, cT) @ uh - a @ a * cT @ vols) < 1e-11
    if mesh == "distorted":
        # a pointwise coefficient kappa = x_0: u^T K u = |a|^2 int x_0 = |a|^2 / 2
        assert abs(uh @ asm.stiffness(s, lambda x: x[..., 0]) @ uh - a @ a / 2) < 1e-11


def test_bad_coefficients_raise():
    s = space(2, 1)
    nc = s.mesh.num_cells
    with pytest.raises(ValueError, match=r"coef .*shape \(7,\)"):
        asm.stiffness(s, np.ones(7))
    with pytest.raises(ValueError, match="non-finite"):
        asm.stiffness(s, np.full(nc, np.nan))
    with pytest.raises(ValueError, match="non-finite"):
        asm.mass(s, float("inf"))
    with pytest.raises(ValueError, match=r"coef\(x\) must return shape"):
        asm.stiffness(s, lambda x: x)
    with pytest.raises(TypeError, match="coef must be"):
        asm.stiffness(s, "one")
    with pytest.raises(ValueError, match=r"b must be a constant of shape \(2,\)"):
        asm.convection(s, [1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match=r"f\(x\) must return shape"):
        asm.load(s, lambda x: x)
    with pytest.raises(ValueError, match="components == dim"):
        asm.elasticity(s, 1.0, 1.0)


def test_nonpositive_jacobian_raises():
    s = space(2, 1, shape=(4, 4))
    cells = s.mesh.cells.copy()
    cells[[5, 9]] = cells[[5, 9]][:, [1, 0, 3, 2]]            # mirror two cells
    s.mesh.cells = cells
    s.cell_dofs = cells
    for op in (asm.stiffness, asm.mass, asm.lumped_mass):
        with pytest.raises(ValueError, match=r"2 cell\(s\).*first offending cell index 5"):
            op(s)


# ----------------------------------------------------------------------------- elasticity


def rigid_body_modes(x):
    d = x.shape[1]
    modes = [np.eye(d)[r][None, :].repeat(len(x), 0) for r in range(d)]
    pairs = [(0, 1)] if d == 2 else [(0, 1), (1, 2), (2, 0)]
    for a, b in pairs:
        m = np.zeros_like(x)
        m[:, a], m[:, b] = -x[:, b], x[:, a]
        modes.append(m)
    return [m.ravel() for m in modes]


@pytest.mark.parametrize("d,k,mesh", [(2, 1, "distorted"), (2, 2, "distorted"), (3, 1, "distorted"),
                                      (3, 2, "sheared")])
def test_elasticity_rigid_body_kernel_and_energy(d, k, mesh):
    s = space(d, k, mesh, c=d)
    lam, mu = 8.0, 2.0
    K = asm.elasticity(s, lam, mu)
    assert K.shape == (s.num_dofs,) * 2
    assert abs(K - K.T).max() < 1e-12 * abs(K).max()
    modes = rigid_body_modes(s.points)
    assert len(modes) == (3 if d == 2 else 6)
    Kn = sp.linalg.norm(K)
    for r in modes:
        assert np.linalg.norm(K @ r) <= 1e-10 * Kn
    # linear displacement u = G x: u^T K u = (2 mu |eps|^2 + lam tr(eps)^2) |Omega|
    G = np.random.default_rng(5).standard_normal((d, d))
    u = (s.points @ G.T).ravel()
    eps = 0.5 * (G + G.T)
    exact = (2 * mu * np.sum(eps * eps) + lam * np.trace(G) ** 2) * volume(mesh, d)
    assert abs(u @ K @ u - exact) < 1e-10 * exact
    # per-cell and callable Lame parameters agree with constants
    nc = s.mesh.num_cells
    K2 = asm.elasticity(s, np.full(nc, lam), lambda x: np.full(x.shape[:-1], mu))
    assert abs(K2 - K).max() < 1e-12 * abs(K).max()


# ----------------------------------------------------------------------------- convection / C_k


@pytest.mark.parametrize("d,k,mesh", [(2, 1, "distorted"), (2, 2, "distorted"), (3, 1, "distorted"),
                                      (3, 2, "distorted")])
def test_convection_flux(d, k, mesh):
    s = space(d, k, mesh)
    b = (lambda x: np.stack([x[..., 1], -x[..., 0]], -1)) if d == 2 else \
        (lambda x: np.stack([x[..., 1], -x[..., 0], np.ones(x.shape[:-1])], -1))
    C = asm.convection(s, b)
    one = np.ones(s.num_dofs)
    assert np.abs(C @ one).max() < 1e-12
    a, u = linear(d)
    # div b = 0: 1^T C u = int b . grad u = int_boundary u b.n;  b.a = x1 - 2 x0 (+ 3)
    expected = -0.5 if d == 2 else 2.5
    assert abs(one @ C @ u(s.points) - expected) < 1e-12
    # constant field: same as the callable returning it
    Cc = asm.convection(s, np.arange(1.0, d + 1))
    Cf = asm.convection(s, lambda x: np.broadcast_to(np.arange(1.0, d + 1), x.shape))
    assert abs(Cc - Cf).max() < 1e-14
    assert abs(one @ Cc @ u(s.points) - a @ a) < 1e-12
    Cp = asm.convection(s, np.tile(np.arange(1.0, d + 1), (s.mesh.num_cells, 1)))   # per-cell b
    assert abs(Cp - Cc).max() < 1e-14


@pytest.mark.parametrize("d,k,mesh", [(2, 1, "distorted"), (2, 2, "graded"), (3, 1, "distorted"),
                                      (3, 2, "sheared")])
def test_derivative_matrices(d, k, mesh):
    s = space(d, k, mesh)
    Cs = asm.derivative_matrices(s)
    assert len(Cs) == d
    a, f = linear(d)
    fh = f(s.points)
    one = np.ones(s.num_nodes)
    phi_int = asm.mass(s) @ one                                  # (phi_j, 1)
    for kk, C in enumerate(Cs):
        assert C.shape == (s.num_nodes,) * 2
        # sum_i f_i (C_k)_ij = (phi_j, d_k f) = a_k int phi_j
        assert np.abs(fh @ C - a[kk] * phi_int).max() < 1e-12
        # sum_i (C_k)_ij = (phi_j, d_k 1) = 0
        assert np.abs(one @ C).max() < 1e-12
        # C_k^T is the convection matrix of b = e_k
        assert abs(C.T - asm.convection(s, np.eye(d)[kk])).max() < 1e-14


# ----------------------------------------------------------------------------- Q1-iso-Q2 gradient


def q1_prolongation(shape):
    """Coarse Q1 -> fine Q1 interpolation on a structured mesh (tensor product of 1-D ones)."""
    P = sp.identity(1, format="csr")
    for n in shape:                                               # axis 0 fastest -> innermost kron
        P1 = sp.lil_matrix((2 * n + 1, n + 1))
        for i in range(n + 1):
            P1[2 * i, i] = 1
        for i in range(n):
            P1[2 * i + 1, i] = P1[2 * i + 1, i + 1] = 0.5
        P = sp.kron(P1.tocsr(), P, format="csr")
    return P


@pytest.mark.parametrize("d,mesh", [(2, "uniform"), (2, "distorted"), (3, "distorted")])
def test_gradient_iso(d, mesh):
    shape = SHAPES[d]
    Mc = StructuredMesh(shape, MESHES[mesh])
    fine_pts = StructuredSpace(Mc, 2).points                      # nested refinement of the multilinear map
    Mf = StructuredMesh(tuple(2 * n for n in shape), lambda p: fine_pts)
    sp_p, sp_u = StructuredSpace(Mc, 1, 1), StructuredSpace(Mf, 1, d)
    parent, child = refine_structured(shape)
    B = asm.gradient_iso(sp_p, sp_u, parent, child)
    assert B.shape == (sp_u.num_dofs, sp_p.num_dofs)
    # direct: p_h in the coarse space is P p in the fine Q1 space, so B = -[C_k^fine P] interleaved
    P = q1_prolongation(shape)
    Cf = asm.derivative_matrices(StructuredSpace(Mf, 1, 1))
    for kk in range(d):
        assert abs(B[kk::d] + Cf[kk] @ P).max() < 1e-13
    # v^T B p = -int p div v for p = 1 + x0, v = (x0, 0, ...): -int (1 + x0) = -1.5
    p = 1.0 + Mc.points[:, 0]
    v = np.zeros((sp_u.num_nodes, d))
    v[:, 0] = Mf.points[:, 0]
    assert abs(v.ravel() @ B @ p + 1.5) < 1e-12
    D = asm.divergence_iso(sp_p, sp_u, parent, child)
    # exact: divergence_iso is the transpose of gradient_iso, which runs the same code again
    assert abs(D - B.T).max() == 0 and D.shape == (sp_p.num_dofs, sp_u.num_dofs)
    # constant pressure against a velocity vanishing on the boundary: (1, div v) = 0
    inner = np.all((Mf.points > 1e-12) & (Mf.points < 1 - 1e-12), axis=1)
    vr = np.random.default_rng(2).standard_normal((sp_u.num_nodes, d)) * inner[:, None]
    assert abs(vr.ravel() @ B @ np.ones(sp_p.num_dofs)) < 1e-12
    with pytest.raises(ValueError, match="child"):
        asm.gradient_iso(sp_p, sp_u, parent, child + 2 ** d)
    with pytest.raises(ValueError, match="parent must have shape"):
        asm.gradient_iso(sp_p, sp_u, parent[:-1], child)


# ----------------------------------------------------------------------------- load


@pytest.mark.parametrize("d,k,mesh", [(2, 1, "distorted"), (2, 2, "distorted"), (3, 1, "distorted"),
                                      (3, 2, "graded")])
def test_load_vector(d, k, mesh):
    s = space(d, k, mesh)
    a, f = linear(d)
    M = asm.mass(s)
    assert np.allclose(asm.load(s, f), M @ f(s.points), rtol=0, atol=1e-14)
    assert np.allclose(asm.load(s, 3.0), 3.0 * (M @ np.ones(s.num_dofs)), atol=1e-15)
    s2 = space(d, k, mesh, c=2)
    g = lambda x: np.stack([f(x), 1.0 - 2.0 * f(x)], -1)
    b2 = asm.load(s2, g)
    assert b2.shape == (s2.num_dofs,)
    assert np.allclose(b2, asm.mass(s2) @ g(s2.points).ravel(), atol=1e-14)
    assert np.allclose(asm.load(s2, [1.0, 2.0]).reshape(-1, 2), (M @ np.ones(s.num_dofs))[:, None] * [1, 2])
    with pytest.raises(ValueError, match=r"f must be a constant of shape \(2,\)"):
        asm.load(s2, 1.0)


# ----------------------------------------------------------------------------- sparsity pattern


def test_pattern_matches_scipy_and_is_memoised():
    rng = np.random.default_rng(7)
    cells = rng.integers(0, 30, size=(40, 4))
    cols = rng.integers(0, 11, size=(40, 3))
    K = rng.standard_normal((40, 4, 3))
    P = Pattern(cells, cols, 30, 11)
    ref = sp.coo_matrix((K.ravel(), (np.repeat(cells, 3, 1).ravel(), np.tile(cols, (1, 4)).ravel())),
                        shape=(30, 11)).tocsr()
    A = P.assemble(K)
    assert A.nnz == ref.nnz and abs(A - ref).max() < 1e-14
    assert np.array_equal(A.indptr, ref.indptr) and np.array_equal(A.indices, ref.indices)
    empty = Pattern(np.zeros((0, 4), int), np.zeros((0, 4), int), 5, 5).assemble(np.zeros((0, 4, 4)))
    assert empty.shape == (5, 5) and empty.nnz == 0
    # equal columns at the end of one row and the start of the next are different entries
    P2 = Pattern(np.array([[0, 1], [1, 2]]), np.array([[5], [5]]), 3, 6)
    assert P2.nnz == 3 and P2.indptr.tolist() == [0, 1, 2, 3]
    assert P2.assemble(np.ones((2, 2, 1))).toarray()[:, 5].tolist() == [1, 2, 1]
    s = space(2, 1)
    pa = asm.get_pattern(s.cell_dofs, s.cell_dofs, s.num_nodes, s.num_nodes)
    assert asm.get_pattern(s.cell_dofs, s.cell_dofs, s.num_nodes, s.num_nodes) is pa
    from adaptmg.fe import sparsity as _sparse
    cd = np.array(s.cell_dofs)
    cd.flags.writeable = False
    asm.get_pattern(cd, cd, s.num_nodes, s.num_nodes)
    n_before = len(_sparse._CACHE)
    del cd                                                         # entry dies with its table
    assert len(_sparse._CACHE) == n_before - 1
    w = np.array(s.cell_dofs)                                      # writeable copy: not memoised
    assert asm.get_pattern(w, w, s.num_nodes, s.num_nodes) is not asm.get_pattern(w, w, s.num_nodes, s.num_nodes)


def _pattern_reference(rows, cols, nrows, ncols):
    """indptr/indices of the merged pattern by SciPy's COO -> CSR (duplicates summed, sorted)."""
    nc, nr = rows.shape
    ncl = cols.shape[1]
    r = np.repeat(rows, ncl, axis=1).ravel()
    c = np.tile(cols, (1, nr)).ravel()
    A = sp.coo_matrix((np.ones(r.size), (r, c)), shape=(nrows, ncols)).tocsr()
    A.sum_duplicates()
    return A.indptr, A.indices


def _pattern_tables():
    from adaptmg import Mesh
    from adaptmg.fe import Space
    out = []
    for d in (2, 3):
        m = _adaptive_mesh(d)
        assert m.num_hanging_nodes > 0
        for k in (1, 2):
            s = Space(m, k)
            out.append((f"adaptive{d}d-Q{k}", s.cell_dofs, s.cell_dofs, s.num_nodes, s.num_nodes, True))
        mf = m.refine()
        parent, _ = mf.parent_of(m)
        sc, sf = Space(m, 1), Space(mf, 1)
        out.append((f"iso{d}d", sf.cell_dofs, sc.cell_dofs[parent], sf.num_nodes, sc.num_nodes, True))
        out.append((f"iso{d}d-T", sc.cell_dofs[parent], sf.cell_dofs, sc.num_nodes, sf.num_nodes, False))
    # a cell turned by 90 degrees: node 4 is local vertex 3 of both cells
    pts = np.array([[0, 0], [1, 0], [2, 0], [0, 1], [1, 1], [2, 1]], float)
    m = Mesh.from_cells(pts, np.array([[0, 1, 3, 4], [2, 5, 1, 4]])).refine()
    for k in (1, 2):
        s = Space(m, k)
        out.append((f"rotated-Q{k}", s.cell_dofs, s.cell_dofs, s.num_nodes, s.num_nodes, False))
    rng = np.random.default_rng(3)
    out.append(("random", rng.integers(0, 30, (40, 4)), rng.integers(0, 11, (40, 3)), 30, 11, False))
    return out


@pytest.mark.parametrize("block", [64, 1 << 19])
def test_pattern_slot_grouping_and_blocks_match_reference(block, monkeypatch):
    """Pattern by the (node, local index) slot table and by the argsort fallback, in row blocks
    of any size: the same indptr/indices as SciPy and pos pointing at (row_cells[c,i], col_cells[c,j])."""
    from adaptmg.fe import sparsity as _sparse
    monkeypatch.setattr(_sparse, "_BLOCK_ENTRIES", block)
    argsort_only = lambda rc, n: (np.argsort(rc.reshape(-1), kind="stable").astype(  # noqa: E731
        _sparse._index_dtype(rc.size)), False)
    for name, rows, cols, nrows, ncols, by_slot in _pattern_tables():
        P = Pattern(rows, cols, nrows, ncols)
        assert P._by_slot == by_slot, name
        ip, ind = _pattern_reference(rows, cols, nrows, ncols)
        assert np.array_equal(P.indptr, ip) and np.array_equal(P.indices, ind), name
        nc, nr, ncl = P.cell_shape
        pos = P.pos.reshape(nc, nr, ncl)
        row_of = np.repeat(np.arange(nrows), np.diff(P.indptr))
        assert np.array_equal(row_of[pos], np.broadcast_to(rows[:, :, None], pos.shape)), name
        assert np.array_equal(P.indices[pos], np.broadcast_to(cols[:, None, :], pos.shape)), name
        with monkeypatch.context() as mp:
            mp.setattr(_sparse, "_row_grouped", argsort_only)
            Q = Pattern(rows, cols, nrows, ncols)
        assert not Q._by_slot
        assert all(np.array_equal(getattr(P, a), getattr(Q, a)) for a in ("indptr", "indices", "pos")), name


def test_componentwise_expansion():
    A = sp.random(7, 5, density=0.4, random_state=1, format="csr")
    E = componentwise(A, 3)
    assert abs(E - sp.kron(A, sp.identity(3))).max() == 0
    assert E.has_sorted_indices


# ----------------------------------------------------------------------------- with adaptmg.Mesh / Space


def _adaptive_mesh(d):
    from adaptmg import Mesh
    m = Mesh.box([0.0] * d, [1.0] * d, [3] * d, map=distorted(seed=4, amp=0.2))
    m = m.refine(np.flatnonzero(m.cell_vertices().mean(1)[:, 0] < 0.4))
    return m.refine(np.flatnonzero(m.cell_vertices().mean(1).sum(1) < 0.5))


@pytest.mark.parametrize("d,k", [(2, 1), (2, 2), (3, 1), (3, 2)])
def test_with_adaptive_mesh_and_space(d, k):
    """The unconstrained matrices over all DoF nodes (hanging ones included) of adaptmg.fe.Space."""
    from adaptmg.fe import Space
    mesh = _adaptive_mesh(d)
    assert mesh.num_hanging_nodes > 0
    s = Space(mesh, k, 1)
    one = np.ones(s.num_dofs)
    assert abs(one @ asm.mass(s) @ one - 1.0) < 1e-12
    assert abs(asm.lumped_mass(s).sum() - 1.0) < 1e-12
    K = asm.stiffness(s)
    assert np.abs(K @ one).max() < 1e-12
    a, u = linear(d)
    assert abs(u(s.points) @ K @ u(s.points) - a @ a) < 1e-11
    se = Space(mesh, k, d)
    for r in rigid_body_modes(se.points):
        assert np.linalg.norm(asm.elasticity(se, 3.0, 1.0) @ r) < 1e-10 * np.sqrt(se.num_dofs)


@pytest.mark.parametrize("d", [2, 3])
def test_gradient_iso_with_adaptive_mesh(d):
    """Q1-iso-Q2 on an adaptive coarse mesh and its uniform refinement, parent/child from Mesh.parent_of."""
    from adaptmg.fe import Space
    Mc = _adaptive_mesh(d)
    Mf = Mc.refine()
    parent, child = Mf.parent_of(Mc)
    sp_p, sp_u = Space(Mc, 1, 1), Space(Mf, 1, d)
    B = asm.gradient_iso(sp_p, sp_u, parent, child)
    # v^T B p = -int p div v with p = 1 + x0 + 2 x1, v = x (div v = d): -d (1 + 1/2 + 1)
    p = 1.0 + Mc.points[:, 0] + 2.0 * Mc.points[:, 1]
    v = Mf.points.ravel()
    assert abs(v @ B @ p + d * 2.5) < 1e-11
    # a constant pressure sees only the boundary: (1, div v) = int_boundary v.n = d |Omega|
    assert abs(v @ B @ np.ones(sp_p.num_dofs) + d) < 1e-11


# ----------------------------------------------------------------------------- combined scalar form


def _coefficients(kind, d, nc, rng):
    """(mass, diffusion, convection) of one kind; nonconstant ones vary in space."""
    if kind == "const":
        return 1.7, 0.03, np.linspace(-1.0, 2.0, d)
    if kind == "cell":
        return rng.random(nc) + 0.5, rng.random(nc) + 0.1, rng.random((nc, d)) - 0.5
    return (lambda x: 1.0 + x[..., 0] * x[..., -1], lambda x: 0.1 + x[..., 1] ** 2,
            lambda x: np.stack([np.sin(3.0 * x[..., a] + a) for a in range(d)], axis=-1))


@pytest.mark.parametrize("d", [2, 3])
@pytest.mark.parametrize("mesh", ["uniform", "distorted", "adaptive"])
@pytest.mark.parametrize("kind", ["const", "cell", "callable"])
def test_scalar_form_equals_sum_of_forms(d, mesh, kind):
    """scalar_form = mass*M + diffusion*K + C(b) to rounding, incl. hanging nodes, Q1 and Q2."""
    from adaptmg.fe import Space
    k = 2 if (mesh == "distorted" and d == 2) else 1
    s = Space(_adaptive_mesh(d), k, 1) if mesh == "adaptive" else space(d, k, mesh)
    if mesh == "adaptive":
        assert s.mesh.num_hanging_nodes > 0
    rng = np.random.default_rng(7)
    rho, kap, b = _coefficients(kind, d, s.mesh.num_cells, rng)
    ref = asm.mass(s, rho) + asm.stiffness(s, kap) + asm.convection(s, b)
    A = asm.scalar_form(s, mass=rho, diffusion=kap, convection=b)
    assert A.shape == ref.shape and A.has_canonical_format
    assert abs(A - ref).max() <= 1e-13 * abs(ref).max()
    # same pass, mass term alone
    A2, Mr = asm.scalar_form(s, mass=rho, diffusion=kap, convection=b, return_mass=True)
    assert abs(A2 - A).max() == 0        # exact: same chunks, same GEMMs; the mass part is a side product
    M = asm.mass(s, rho)
    assert abs(Mr - M).max() <= 1e-14 * abs(M).max()
    # dropped terms: diffusion only / no diffusion
    K = asm.stiffness(s, kap)
    assert abs(asm.scalar_form(s, diffusion=kap) - K).max() <= 1e-13 * abs(K).max()
    MC = M + asm.convection(s, b)
    assert abs(asm.scalar_form(s, mass=rho, convection=b) - MC).max() <= 1e-13 * abs(MC).max()


def test_scalar_form_components_and_affine_path():
    """c > 1 acts component-wise; sheared (affine) Q2 cells with constants vs a callable (full rule)."""
    s = space(2, 2, "sheared", c=2)
    b = np.array([0.3, -1.0])
    ref = 2.0 * asm.mass(s) + 0.5 * asm.stiffness(s) + asm.convection(s, b)
    A = asm.scalar_form(s, mass=2.0, diffusion=0.5, convection=b)
    assert abs(A - ref).max() <= 1e-13 * abs(ref).max()
    Af = asm.scalar_form(s, mass=lambda x: np.full(x.shape[:-1], 2.0), diffusion=0.5,
                         convection=lambda x: np.broadcast_to(b, x.shape))
    assert abs(Af - ref).max() <= 1e-13 * abs(ref).max()


@pytest.mark.parametrize("d", [2, 3])
def test_affine_chunk_groups_equal_single_chunks(d, monkeypatch):
    """Runs of all-affine chunks merged into one product give the same matrices as
    chunk-by-chunk assembly (same pattern exactly, values to round-off: the GEMMs differ
    in their row count only), also where a group holds a few non-affine cells."""
    from adaptmg.assemble import forms

    def corner_bump(p):                      # distorts only the cells near the origin
        q = p.copy()
        near = np.all((p > 1e-12) & (p < 0.3), axis=1)
        q[near, 0] += 0.002 * np.sin(7.0 * p[near, 1])
        return q
    monkeypatch.setattr(forms, "_CHUNK_BYTES", 1 << 18)
    s = StructuredSpace(StructuredMesh((64, 48) if d == 2 else (16, 12, 10), corner_bump), 1, 1)
    info = forms._SpaceInfo(s)
    xi, _ = info.quadrature(None)
    assert info.affine_group(xi, info.nloc ** 2) > 1
    kw = dict(mass=1.0, diffusion=0.3, convection=np.arange(1.0, d + 1))
    A1, M1 = asm.scalar_form(s, return_mass=True, **kw)
    K1 = asm.stiffness(s, 2.0)
    with monkeypatch.context() as mp:
        mp.setattr(forms._SpaceInfo, "affine_group", lambda self, xi, per: 1)
        A0, M0 = asm.scalar_form(s, return_mass=True, **kw)
        K0 = asm.stiffness(s, 2.0)
    # Merging changes only the row count of the (cells, m) @ (m, nloc^2) GEMM, and BLAS may
    # block it / use FMA differently: each element entry is a length-m dot product (m <= 10
    # factor columns: mass, d(d+1)/2 metric pairs, d convection) whose rounding may change by
    # ~m eps |F||T|, and each stored entry sums <= 2^d of them in the same order on both sides,
    # so |X - Y| <= 2^d m eps max|X| (measured: <= 1 eps max|X| with OpenBLAS Haswell kernels);
    # a distorted cell taken as affine (centre geometry) is off by ~5e-3 max|X| here.
    tol = 2 ** d * 10 * np.finfo(float).eps
    for X, Y in ((A1, A0), (M1, M0), (K1, K0)):
        assert np.array_equal(X.indptr, Y.indptr) and np.array_equal(X.indices, Y.indices)
        assert np.abs(X.data - Y.data).max() <= tol * np.abs(X.data).max()
    groups = [g.affine for _, g in info.chunks(xi, info.nloc ** 2, affine=True,
                                               group=info.affine_group(xi, info.nloc ** 2))]
    assert any(groups) and not all(groups)


def test_scalar_form_bad_input():
    s = space(2, 1)
    nc = s.mesh.num_cells
    with pytest.raises(ValueError, match=r"convection must be a constant of shape \(2,\).*got an array of shape \(3,\)"):
        asm.scalar_form(s, mass=1.0, convection=[1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match=r"convection must be .*\(%d, 2\)" % nc):
        asm.scalar_form(s, mass=1.0, convection=np.ones((nc, 3)))
    with pytest.raises(ValueError, match=r"convection\(x\) must return shape"):
        asm.scalar_form(s, mass=1.0, convection=lambda x: x[..., 0])
    with pytest.raises(ValueError, match=r"diffusion must be .*shape \(%d,\).*got an array of shape \(7,\)" % nc):
        asm.scalar_form(s, mass=1.0, diffusion=np.ones(7))
    with pytest.raises(ValueError, match="mass contains non-finite"):
        asm.scalar_form(s, mass=np.nan)
    with pytest.raises(TypeError, match="diffusion must be"):
        asm.scalar_form(s, diffusion="one")
    with pytest.raises(ValueError, match="mass, diffusion and convection are all zero"):
        asm.scalar_form(s)
    with pytest.raises(ValueError, match="mass, diffusion and convection are all zero"):
        asm.scalar_form(s, mass=np.zeros(nc), diffusion=0.0, convection=[0.0, 0.0])
    with pytest.raises(ValueError, match="return_mass=True needs a nonzero mass"):
        asm.scalar_form(s, diffusion=1.0, return_mass=True)


# ----------------------------------------------------------------------------- device pattern


def test_segment_sum_twin_matches_add_at_on_pattern():
    """The NumPy twin of adaptmg_segment_sum, fed with runs sorted stably by matrix position,
    gives np.add.at's sums bit for bit (same entries, same order)."""
    from adaptmg.assemble._device_sorted import segment_sum
    for name, rows, cols, nrows, ncols, _ in _pattern_tables():
        P = Pattern(rows, cols, nrows, ncols)
        K = np.random.default_rng(5).standard_normal(P.pos.size)
        ref = np.zeros(P.nnz)
        np.add.at(ref, P.pos, K)
        order = np.argsort(P.pos, kind="stable").astype(np.int32)
        seg = np.searchsorted(P.pos[order], np.arange(P.nnz + 1)).astype(np.int32)
        out = np.full(P.nnz, np.nan)
        assert np.array_equal(segment_sum(seg, order, K, out), ref), name


def test_scalar_form_device_argument():
    """device=None/"cpu" is the host path (same matrix); a bad device is a TypeError/ValueError."""
    s = space(2, 1)
    A = asm.scalar_form(s, mass=1.0, diffusion=0.1)
    for dev in (None, "cpu"):
        B = asm.scalar_form(s, mass=1.0, diffusion=0.1, device=dev)
        assert np.array_equal(A.data, B.data) and np.array_equal(A.indices, B.indices)
    with pytest.raises(TypeError, match="device must be None"):
        asm.scalar_form(s, mass=1.0, device=0)
    with pytest.raises(TypeError, match="device must be None"):
        asm.stiffness(s, device=np)
    assert np.array_equal(asm.mass(s, device="cpu").data, asm.mass(s).data)
    with pytest.raises(ValueError, match="backend must be"):
        asm.scalar_form(s, mass=1.0, device="tpu")


@pytest.mark.gpu
@pytest.mark.parametrize("d", [2, 3])
def test_device_pattern_and_scalar_form_bit_identical(d, monkeypatch):
    """Pattern and sums on the GPU: the same host CSR as the host path, bit for bit (uniform,
    distorted, adaptive with hanging nodes; Q1/Q2; return_mass; c = 2), and the same
    indptr/indices as the host Pattern on every test table; small meshes stay on the host."""
    from adaptmg.assemble import _device, forms
    from adaptmg.fe import Space
    for name, rows, cols, nrows, ncols, _ in _pattern_tables():
        P = Pattern(rows, cols, nrows, ncols)
        D = _device.DevicePattern("gpu", rows, cols, nrows, ncols)
        assert np.array_equal(P.indptr, D.indptr) and np.array_equal(P.indices, D.indices), name
    monkeypatch.setattr(forms, "MIN_DEVICE_ENTRIES", 0)
    spaces = [space(d, 1, "distorted"), space(d, 2, "uniform"), Space(_adaptive_mesh(d), 1, 1),
              Space(_adaptive_mesh(d), 2, 1), space(d, 1, "sheared", c=2)]
    kw = dict(mass=1.0, diffusion=0.3, convection=np.arange(1.0, d + 1))
    for s in spaces:
        A0, M0 = asm.scalar_form(s, return_mass=True, **kw)
        A1, M1 = asm.scalar_form(s, return_mass=True, device="gpu", **kw)
        # exact: the element entries come from the same host GEMMs on both paths, and the device
        # sums each run sequentially from 0 in np.add.at's order (additions only, nothing to fuse)
        for X, Y in ((A0, A1), (M0, M1)):
            assert isinstance(Y, sp.csr_matrix)
            assert np.array_equal(X.indptr, Y.indptr) and np.array_equal(X.indices, Y.indices)
            assert np.array_equal(X.data, Y.data)
        for form, arg in ((asm.mass, 2.0), (asm.stiffness, 0.5), (asm.convection, kw["convection"])):
            X, Y = form(s, arg), form(s, arg, device="gpu")
            assert np.array_equal(X.indices, Y.indices) and np.array_equal(X.data, Y.data), form.__name__
    monkeypatch.setattr(forms, "MIN_DEVICE_ENTRIES", 1 << 30)
    calls = []
    monkeypatch.setattr(forms, "get_device_pattern", lambda *a: calls.append(a))
    asm.scalar_form(spaces[0], device="gpu", **kw)
    assert calls == []


def test_scalar_form_keep_on_device_needs_a_gpu_device():
    s = space(2, 1)
    for dev in (None, "cpu"):
        with pytest.raises(ValueError, match="keep_on_device=True needs a GPU device"):
            asm.scalar_form(s, mass=1.0, device=dev, keep_on_device=True)


@pytest.mark.gpu
@pytest.mark.parametrize("d", [2, 3])
def test_scalar_form_keep_on_device_same_arrays(d, monkeypatch):
    """keep_on_device=True: cupyx CSR matrices with the host path's index arrays (built on the
    device for scalar spaces; the host result moved for c = 2 and for meshes below
    MIN_DEVICE_ENTRIES), canonical, and not sharing index arrays with each other; the entries
    equal to a few ulps where the device computed the element matrices (constant coefficients,
    full quadrature on every cell), bit for bit where the host result was moved."""
    from adaptmg.backend import is_device_sparse, to_host
    from adaptmg.assemble import forms
    from adaptmg.fe import Space
    eps = np.finfo(np.float64).eps
    kw = dict(mass=1.0, diffusion=0.3, convection=np.arange(1.0, d + 1))
    for limit in (0, 1 << 30):
        monkeypatch.setattr(forms, "MIN_DEVICE_ENTRIES", limit)
        for s in (space(d, 1, "distorted"), Space(_adaptive_mesh(d), 2, 1), space(d, 1, "sheared", c=2)):
            A0, M0 = asm.scalar_form(s, return_mass=True, **kw)
            A1, M1 = asm.scalar_form(s, return_mass=True, device="gpu", keep_on_device=True, **kw)
            for X, Y in ((A0, A1), (M0, M1)):
                assert is_device_sparse(Y) and Y.has_canonical_format
                Yh = to_host(Y)
                assert np.array_equal(X.indptr, Yh.indptr) and np.array_equal(X.indices, Yh.indices)
                if limit:
                    assert np.array_equal(X.data, Yh.data)
                else:
                    assert np.max(np.abs(X.data - Yh.data)) <= 64 * eps * np.max(np.abs(X.data))
            assert A1.indices.data.ptr != M1.indices.data.ptr


@pytest.mark.parametrize("d", [2, 3])
def test_scalar_form_device_elements_run_on_numpy(d, monkeypatch):
    """scalar_form(keep_on_device=True) with constant coefficients takes the device elements'
    path (geometry, the combined factor -- mass, metric, J^-1 b -- and the return_mass part from
    one GEMM per chunk, full quadrature on every cell; pattern and sums of DevicePattern); run
    on NumPy (the CPU backend standing in for the GPU) it gives the host path's matrices to a
    few ulps on distorted, sheared and adaptive meshes, Q1 and Q2, c = 1 and 2."""
    from adaptmg.assemble import forms, on_device
    from adaptmg.assemble._device import DevicePattern
    from adaptmg.backend import CPU
    from adaptmg.fe import Space
    eps = np.finfo(np.float64).eps
    kw = dict(mass=1.5, diffusion=0.3, convection=np.arange(1.0, d + 1))
    spaces = [space(d, 1, "distorted"), space(d, 2, "sheared", c=2), Space(_adaptive_mesh(d), 1, 1),
              Space(_adaptive_mesh(d), 2, 1)]
    ref = [asm.scalar_form(s, return_mass=True, **kw) for s in spaces]
    calls = []
    chunks = on_device.element_chunks
    monkeypatch.setattr(on_device, "element_chunks",
                        lambda *a, **k: calls.append(a[6] is not None) or chunks(*a, **k))
    monkeypatch.setattr(forms, "_assembly_device", lambda device, info, per: CPU if device == "np" else None)
    monkeypatch.setattr(forms, "_keep_backend", lambda name, device, keep, info=None: CPU if keep else None)
    monkeypatch.setattr(forms, "get_device_pattern", lambda be, r, c, nr, nc: DevicePattern(be, r, c, nr, nc))
    for s, (A0, M0) in zip(spaces, ref):
        A1, M1 = asm.scalar_form(s, return_mass=True, device="np", keep_on_device=True, **kw)
        for X, Y in ((A0, A1), (M0, M1)):
            assert np.array_equal(X.indptr, Y.indptr) and np.array_equal(X.indices, Y.indices)
            assert np.max(np.abs(X.data - Y.data)) <= 64 * eps * np.max(np.abs(X.data))
        A2 = asm.scalar_form(s, device="np", keep_on_device=True, **kw)
        assert np.max(np.abs(A2 - A0)) <= 64 * eps * np.max(np.abs(A0.data))
    assert calls == [True, False] * len(spaces)
    # a per-cell (non-constant) coefficient keeps the host elements (their factor is host code)
    flags = []
    inner = forms._assemble_scalar
    monkeypatch.setattr(forms, "_assemble_scalar",
                        lambda *a, **k: flags.append(k["device_elements"]) or inner(*a, **k))
    s = spaces[0]
    for mass in (1.5, np.full(s.mesh.num_cells, 1.5)):
        asm.scalar_form(s, device="host", keep_on_device=True, **dict(kw, mass=mass))
    assert flags == [True, False]


@pytest.mark.parametrize("d,k,mesh", [(2, 1, "distorted"), (3, 1, "uniform"), (3, 1, "distorted"),
                                      (3, 2, "sheared")])
@pytest.mark.parametrize("fmt", ["csr", "bsr"])
def test_elasticity_return_mass_is_the_scalar_mass(d, k, mesh, fmt):
    """elasticity(return_mass=True): the same A, and the scalar mass matrix of the node space on
    A's node pattern (affine and general cells) equal to mass() of the scalar space to round-off."""
    s = space(d, k, mesh, c=d)
    s1 = space(d, k, mesh, c=1)
    A = asm.elasticity(s, 8.0, 2.0, format=fmt)
    A2, M = asm.elasticity(s, 8.0, 2.0, format=fmt, return_mass=True)
    assert abs(A - A2).max() == 0
    M1 = asm.mass(s1)
    assert M.shape == M1.shape == (s1.num_dofs, s1.num_dofs)
    assert abs(M - M1).max() <= 1e-14 * abs(M1).max()
    assert abs(M.sum() - M1.sum()) <= 1e-13 * M1.sum()


# ----------------------------------------------------------------------------- congruent cells


def _general_path(monkeypatch):
    """Switch the congruent-cell path of _assemble_scalar off (every chunk takes the general path)."""
    from adaptmg.fe.geometry import CellGeometry
    monkeypatch.setattr(CellGeometry, "congruent", lambda self: False)


@pytest.mark.parametrize("d,k,c", [(2, 1, 1), (2, 2, 1), (3, 1, 1), (3, 2, 1), (2, 1, 2)])
def test_scalar_form_congruent_cells_equal_general_path(d, k, c, monkeypatch):
    """On a uniformly refined box (all cells translates, dyadic coordinates) the congruent-cell
    path (one factor and element matrix per chunk, broadcast) is taken and gives the general
    path's matrices to a few ulps (only the GEMM's rounding may differ), pattern identical;
    per-cell coefficients and distorted cells keep the general path, bit for bit."""
    from adaptmg import Mesh
    from adaptmg.fe import Space
    from adaptmg.fe.geometry import CellGeometry
    m = Mesh.box([0.0] * d, [1.0] * d, [4] * d).refine().refine()
    s = Space(m, k, c)
    kw = dict(mass=1.0, diffusion=2e-4, convection=0.02 * np.arange(1.0, d + 1))
    heads = []
    head = CellGeometry.head
    monkeypatch.setattr(CellGeometry, "head", lambda self, n=1: heads.append(n) or head(self, n))
    A1, M1 = asm.scalar_form(s, return_mass=True, **kw)
    K1 = asm.scalar_form(s, diffusion=3.0)
    assert heads                                         # the congruent path was taken
    per_cell = asm.scalar_form(s, mass=np.ones(m.num_cells), diffusion=2e-4)
    dist = Space(m.map(distorted(seed=3, amp=0.2)), k, c)
    D1 = asm.scalar_form(dist, **kw)
    _general_path(monkeypatch)
    A0, M0 = asm.scalar_form(s, return_mass=True, **kw)
    K0 = asm.scalar_form(s, diffusion=3.0)
    for X, Y in ((A1, A0), (M1, M0), (K1, K0)):
        assert np.array_equal(X.indptr, Y.indptr) and np.array_equal(X.indices, Y.indices)
        assert np.abs(X.data - Y.data).max() <= 8 * np.finfo(float).eps * np.abs(Y.data).max()
    X, Y = per_cell, asm.scalar_form(s, mass=np.ones(m.num_cells), diffusion=2e-4)
    assert np.array_equal(X.indices, Y.indices) and np.array_equal(X.data, Y.data)
    Y = asm.scalar_form(dist, **kw)
    assert np.array_equal(D1.indices, Y.indices) and np.array_equal(D1.data, Y.data)


def test_cell_geometry_head_and_congruent():
    """CellGeometry.head(n) holds the first n cells' values (invJ computed later as in the
    whole); congruent() is True exactly when all Jacobians are equal."""
    from adaptmg.fe.geometry import CellGeometry
    X = np.array([[[0, 0], [1, 0], [0, 1], [1, 1]]], float) * 0.25
    X = np.concatenate([X + [0.25 * i, 0.5] for i in range(4)])
    xi = np.array([[0.5, 0.5]])
    g = CellGeometry(X, xi)
    assert g.congruent()
    h = g.head(1)
    assert h.num_cells == 1 and np.array_equal(h.J, g.J[:1]) and np.array_equal(h.detJ, g.detJ[:1])
    assert np.array_equal(h.invJ, g.invJ[:1])
    X2 = X.copy()
    X2[2, 3] += 0.01
    assert not CellGeometry(X2, xi).congruent()
