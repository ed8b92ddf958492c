"""The vectorised residual estimator (face runs, cells-last tables) against a straightforward
reference: every face listing evaluated on both sides with per-point basis tables, as the
estimator was first written. Also the constant Neumann / traction data."""
import numpy as np
import pytest

from adaptmg import Mesh, Space
from adaptmg.estimate import elasticity_indicators, face_pairs, residual_indicators
from adaptmg.estimate.evaluation import basis_tables, evaluate, gather_cells, point_fields, ref_tables
from adaptmg.estimate.faces import _row_labels, face_quadrature, face_runs, outward_normals, own_face_refs
from adaptmg.estimate.residual import cell_diameters
from adaptmg.fe.quadrature import tensor_gauss

from estimate_meshes import adaptive_box, k_coefficient

EPS = np.finfo(float).eps


# ---------------------------------------------------------------------------------- reference
def _coef(v, cells, x, tail=()):
    if v is None:
        return np.zeros(x.shape[:2] + tail)
    if callable(v):
        return np.broadcast_to(np.asarray(v(x), float), x.shape[:2] + tail)
    a = np.asarray(v, float)
    return np.broadcast_to(a if a.shape == tail else a[cells][:, None], x.shape[:2] + tail)


def _ref_faces(space, U, flux, neumann, neumann_ids):
    """(1/2) h_F ||[flux.n]||^2 from each listing of face_pairs (both sides evaluated), + Neumann."""
    mesh, d = space.mesh, space.dim
    out = np.zeros(mesh.num_cells)
    fp = face_pairs(mesh)
    Nf, wf = face_quadrature(d, space.degree + 1)

    def hF(c, f):
        from adaptmg.mesh import reference as ref
        V = mesh.points[mesh.cells[c[:, None], ref.face_vertices(d)[f]]]
        return np.sqrt(((V[:, :, None] - V[:, None]) ** 2).sum(-1)).max(axis=(1, 2))

    c, f, nb = fp.cell, fp.face, fp.nb
    es = evaluate(space, U, c, np.einsum("qj,njd->nqd", Nf, own_face_refs(d, f)))
    xi_n = np.einsum("qj,njd->nqd", Nf, fp.R_nb)
    en = evaluate(space, U, nb, xi_n, tables=basis_tables(space, xi_n))
    n, da = outward_normals(es, f, d)
    jump = np.einsum("nmca,nma->nmc", flux(es.grad, es.x, c) - flux(en.grad, es.x, nb), n)
    val = 0.5 * hF(c, f) * np.einsum("nm,m,nmc->n", da, wf, jump ** 2)
    out += np.bincount(c, weights=val, minlength=mesh.num_cells)
    out += np.bincount(nb[fp.hanging], weights=val[fp.hanging], minlength=mesh.num_cells)
    cN, fN, _ = mesh.boundary_faces(neumann_ids) if neumann_ids is not None else (np.zeros(0, int),) * 3
    if cN.size:
        es = evaluate(space, U, cN, np.einsum("qj,njd->nqd", Nf, own_face_refs(d, fN)))
        n, da = outward_normals(es, fN, d)
        r = -np.einsum("nmca,nma->nmc", flux(es.grad, es.x, cN), n)
        if neumann is not None:
            g = neumann(es.x, n) if callable(neumann) else np.asarray(neumann, float)
            g = np.asarray(g, float)
            r = r + (g[..., None] if g.shape == r.shape[:2] else g)
        out += np.bincount(cN, weights=hF(cN, fN) * np.einsum("nm,m,nmc->n", da, wf, r ** 2),
                           minlength=mesh.num_cells)
    return out


def reference_scalar(space, u, f=0.0, k=1.0, b=None, c=None, k_grad=None, neumann=None, neumann_ids=None):
    mesh, d = space.mesh, space.dim
    U = np.asarray(u, float).reshape(-1, 1)
    xi, w = tensor_gauss(d, space.degree + 2)
    cells = np.arange(mesh.num_cells)
    ev = evaluate(space, U, cells, xi, hessian=True)
    g = ev.grad[:, :, 0]
    R = _coef(f, cells, ev.x) + _coef(k, cells, ev.x) * np.trace(ev.hess[:, :, 0], axis1=-2, axis2=-1)
    if callable(k):
        R = R + np.einsum("nma,nma->nm", k_grad(ev.x), g)
    R = R - np.einsum("nma,nma->nm", _coef(b, cells, ev.x, (d,)), g) - _coef(c, cells, ev.x) * ev.u[:, :, 0]
    h = cell_diameters(mesh)
    cell_part = h ** 2 * np.einsum("nm,m,nm->n", ev.detJ, w, R ** 2)
    face_part = _ref_faces(space, U, lambda G, x, cl: _coef(k, cl, x)[..., None, None] * G, neumann, neumann_ids)
    return np.sqrt(cell_part + face_part), cell_part, face_part


def reference_elasticity(space, u, lam, mu, f=None, traction=None, neumann_ids=None):
    mesh, d = space.mesh, space.dim
    U = np.asarray(u, float).reshape(-1, d)
    xi, w = tensor_gauss(d, space.degree + 2)
    cells = np.arange(mesh.num_cells)
    ev = evaluate(space, U, cells, xi, hessian=True)
    H = ev.hess
    R = mu * np.trace(H, axis1=-2, axis2=-1) + (lam + mu) * np.einsum("nmssr->nmr", H) + _coef(f, cells, ev.x, (d,))
    cell_part = cell_diameters(mesh) ** 2 * np.einsum("nm,m,nmc->n", ev.detJ, w, R ** 2)

    def flux(G, x, cl):
        e = 0.5 * (G + G.swapaxes(-1, -2))
        return 2 * mu * e + lam * np.trace(e, axis1=-2, axis2=-1)[..., None, None] * np.eye(d)
    return np.sqrt(cell_part + _ref_faces(space, U, flux, traction, neumann_ids))


# ---------------------------------------------------------------------------------- meshes
def rotated_lshape():
    """L-shape whose cells have rotated lexicographic vertex orders (mixed face orientations)."""
    from adaptmg_problems.lshape import coarse_mesh
    m = coarse_mesh()
    cells = np.array(m.cells)
    rots = [[0, 1, 2, 3], [1, 3, 0, 2], [3, 2, 1, 0], [2, 0, 3, 1]]
    for i in range(cells.shape[0]):      # 12 coarse cells: test setup only
        cells[i] = cells[i][rots[i % 4]]
    return Mesh.from_cells(m.points, cells).refine().refine([0, 5, 9, 17])


MESHES = {
    "2d-q1": lambda: Space(adaptive_box(2, 0, 4), 1),
    "2d-q2": lambda: Space(adaptive_box(2, 1, 3), 2),
    "2d-rot": lambda: Space(rotated_lshape(), 1),
    "3d-q1": lambda: Space(adaptive_box(3, 0, 2), 1),
    "3d-q2": lambda: Space(adaptive_box(3, 2, 1, distort=False), 2),
}


def _k_grad(x):
    g = np.zeros(x.shape)
    g[..., 0], g[..., 1] = 2 * x[..., 0], 0.5
    return g


def _data(name, space, rng):
    d, nc = space.dim, space.mesh.num_cells
    return {
        "f=0": dict(f=0.0),
        "callables": dict(f=lambda x: np.sin(3 * x[..., 0]) * x[..., 1], k=k_coefficient, k_grad=_k_grad, c=0.3,
                          b=lambda x: np.stack([x[..., 1], -x[..., 0]] + [0 * x[..., 0]] * (d - 2), -1)),
        "per-cell": dict(f=rng.random(nc), k=1 + rng.random(nc), b=rng.random((nc, d)), c=rng.random(nc)),
        "neumann": dict(f=1.0, k=k_coefficient, k_grad=_k_grad, neumann=lambda x, n: x[..., 0] * n[..., 0],
                        neumann_ids=[0, 1]),
        "neumann-const": dict(k=2.0, neumann=-0.5, neumann_ids=[0, 2]),
    }


@pytest.mark.parametrize("mesh", sorted(MESHES))
def test_residual_indicators_match_reference(mesh):
    space = MESHES[mesh]()
    assert space.mesh.num_hanging_nodes > 0
    rng = np.random.default_rng(7)
    u = rng.standard_normal(space.num_dofs)
    for label, kw in _data(mesh, space, rng).items():
        eta, cp, fp = residual_indicators(space, u, parts=True, **kw)
        eta_r, cp_r, fp_r = reference_scalar(space, u, **kw)
        for new, ref, what in ((eta, eta_r, "eta"), (cp, cp_r, "cell part"), (fp, fp_r, "face part")):
            err = np.abs(new - ref).max() / np.abs(ref).max()
            assert err < 1e3 * EPS, f"{mesh} {label} {what}: relative difference {err:.2e}"
        assert fp.min() > 0 and cp.max() > 0


@pytest.mark.parametrize("mesh", ["2d-q1", "2d-q2", "3d-q1"])
def test_elasticity_indicators_match_reference(mesh):
    space0 = MESHES[mesh]()
    space = Space(space0.mesh, space0.degree, space0.dim)
    d = space.dim
    u = np.random.default_rng(3).standard_normal(space.num_dofs)
    for kw in (dict(), dict(f=np.arange(1.0, d + 1), traction=lambda x, n: x[..., :d] * n[..., :1], neumann_ids=[0]),
               dict(f=lambda x: x ** 2, traction=np.arange(d, dtype=float), neumann_ids=[1, 3])):
        eta = elasticity_indicators(space, u, 1.5, 0.7, **kw)
        ref = reference_elasticity(space, u, 1.5, 0.7, **kw)
        assert np.abs(eta - ref).max() < 1e3 * EPS * ref.max()


def test_constant_neumann_equals_callable():
    """Regression: a constant ``neumann`` (or ``traction``) used to fail in a reshape."""
    space = MESHES["2d-q1"]()
    u = np.random.default_rng(1).standard_normal(space.num_dofs)
    a = residual_indicators(space, u, neumann=0.25, neumann_ids=[1, 2])
    b = residual_indicators(space, u, neumann=lambda x, n: 0.25 + 0 * x[..., 0], neumann_ids=[1, 2])
    np.testing.assert_allclose(a, b, rtol=1e-14, atol=0)
    assert not np.allclose(a, residual_indicators(space, u, neumann_ids=[1, 2]))
    sv = Space(space.mesh, 1, 2)
    uv = np.random.default_rng(2).standard_normal(sv.num_dofs)
    a = elasticity_indicators(sv, uv, 1.0, 1.0, traction=[0.5, -1.0], neumann_ids=[0])
    b = elasticity_indicators(sv, uv, 1.0, 1.0, traction=lambda x, n: np.broadcast_to([0.5, -1.0], x.shape),
                              neumann_ids=[0])
    np.testing.assert_allclose(a, b, rtol=1e-14, atol=0)


@pytest.mark.parametrize("kw, msg", [
    (dict(neumann=[1.0, 2.0], neumann_ids=[0]), "constant neumann"),
    (dict(neumann=1.0), "without neumann_ids"),
    (dict(neumann=np.nan, neumann_ids=[0]), "NaN"),
    (dict(neumann=lambda x, n: np.ones(3), neumann_ids=[0]), "must return shape"),
])
def test_bad_neumann(kw, msg):
    space = Space(Mesh.box([0, 0], [1, 1], [2, 2]), 1)
    with pytest.raises(ValueError, match=msg):
        residual_indicators(space, np.zeros(space.num_dofs), **kw)


@pytest.mark.parametrize("dim,seed", [(2, 0), (3, 1)])
def test_face_runs_list_every_face_once(dim, seed):
    m = adaptive_box(dim, seed, 3 if dim == 2 else 2, distort=False)
    fp, fr = face_pairs(m), face_runs(m)
    sp = Space(m, 1)
    Ut = np.zeros((1, sp.num_nodes))
    Nf, _ = face_quadrature(dim, 2)
    assert fr.cell.size == (~fp.hanging).sum() // 2 + fp.hanging.sum()
    pairs = np.sort(np.stack([fr.cell, fr.nb], 1), axis=1)
    assert np.unique(pairs[~fr.hanging], axis=0).shape[0] == (~fr.hanging).sum()
    covered = np.zeros(fr.cell.size, bool)
    for s, e, f, g in fr.runs:      # runs are contiguous, share the own face and the neighbour set
        assert (fr.face[s:e] == f).all() and not covered[s:e].any()
        covered[s:e] = True
        # the neighbour's points of the run are the own side's points
        xa, xb = (point_fields(ref_tables(sp.element, Nf @ R), gather_cells(sp, Ut, cl), x=True).x
                  for R, cl in ((own_face_refs(dim, np.array([f]))[0], fr.cell[s:e]), (fr.R_sets[g], fr.nb[s:e])))
        np.testing.assert_allclose(xa, xb, atol=1e-14)
    assert covered.all()


def test_row_labels_wide_path():
    """Face keys of 4 node ids: the packed path (ids < 2^15) and the two-pair path agree."""
    rng = np.random.default_rng(0)
    keys = np.sort(rng.integers(0, 60, (4000, 4)), axis=1)
    a, oa = _row_labels(keys, 2 ** 15)
    b, ob = _row_labels(keys, 2 ** 20)
    _, ref = np.unique(keys, axis=0, return_inverse=True)
    for lab, order in ((a, oa), (b, ob)):
        assert (np.diff(lab[order]) >= 0).all()
        np.testing.assert_array_equal(np.unique(np.stack([lab, ref.ravel()], 1), axis=0)[:, 0],
                                      np.arange(lab.max() + 1))
        assert lab.max() == ref.max()


@pytest.mark.parametrize("dim", [2, 3])
def test_single_cell_mesh(dim):
    """No interior face at all: only the cell residual and the Neumann faces contribute."""
    s = Space(Mesh.box([0] * dim, [1] * dim, [1] * dim), 1)
    u = np.arange(s.num_dofs, dtype=float) ** 2
    eta, cp, fp = residual_indicators(s, u, f=1.0, neumann=1.0, neumann_ids=[0], parts=True)
    ref = reference_scalar(s, u, f=1.0, neumann=1.0, neumann_ids=[0])
    np.testing.assert_allclose(eta, ref[0], rtol=1e3 * EPS)
    assert fp[0] > 0 and residual_indicators(s, u, f=1.0, parts=True)[2][0] == 0.0


@pytest.mark.parametrize("width", [2, 4])
def test_row_labels_counting_path_equals_packed_argsort(width):
    """The host's counting-sort labels (_pair_labels) equal the labels of the packed keys'
    argsort, row for row, and the order sorts them; node ids above 2^15 take the pair path."""
    from adaptmg.estimate.faces import _int_labels
    rng = np.random.default_rng(7)
    nn = 2 ** 16 + 5
    keys = np.sort(rng.integers(0, nn, (6000, width)), axis=1)
    keys[3000:] = keys[rng.integers(0, 3000, 3000)]            # every row about twice
    lab, order = _row_labels(keys, nn)
    _, ref = np.unique(keys, axis=0, return_inverse=True)
    np.testing.assert_array_equal(lab, ref.ravel())             # dense labels in lexicographic order
    assert (np.diff(lab[order]) >= 0).all() and np.unique(order).size == order.size
    if width == 2:
        np.testing.assert_array_equal(lab, _int_labels((keys[:, 0] << 32) | keys[:, 1])[0])
