"""All faces in one evaluation per side (issue 36): :func:`point_fields` with per-group tables,
and the face part of the residual estimator against the per-run evaluation it replaces (one
:func:`point_fields` per face run and side, as before), on the CPU path, on the GPU's code
path (its chunk sizes and deferred checks, run on NumPy) and with chunks that cut the runs."""
import importlib.util
import os

import numpy as np
import pytest

from adaptmg import Space
from adaptmg.backend import get_backend
from adaptmg.estimate.evaluation import gather_cells, point_fields, ref_tables
from adaptmg.estimate.faces import face_diameters, face_quadrature, face_runs, own_face_refs
from adaptmg.estimate.residual import _Data, jump_terms, residual_indicators

from estimate_meshes import adaptive_box

EPS = np.finfo(float).eps

SPACES = {
    "2d-q1": lambda c=1: Space(adaptive_box(2, 0, 4), 1, c),
    "2d-q2": lambda c=1: Space(adaptive_box(2, 1, 3), 2, c),
    "3d-q1": lambda c=1: Space(adaptive_box(3, 0, 2), 1, c),
    "3d-q2": lambda c=1: Space(adaptive_box(3, 2, 1, distort=False), 2, c),
}


def _rel(new, ref):
    return np.abs(new - ref).max() / np.abs(ref).max()


@pytest.mark.parametrize("name", sorted(SPACES))
def test_grouped_point_fields_equal_one_call_per_group(name):
    space = SPACES[name](2)
    d, el = space.dim, space.element
    rng = np.random.default_rng(1)
    Ut = rng.standard_normal((2, space.num_nodes))
    cells = rng.integers(0, space.mesh.num_cells, 50)
    tabs = [ref_tables(el, rng.random((4, d))) for _ in range(3)]
    groups = [(0, 13, 2), (13, 14, 0), (14, 40, 1), (40, 50, 2)]
    kw = dict(x=True, value=True, grad=True, hessian=True)
    new = point_fields(tabs, gather_cells(space, Ut, cells), groups=groups, **kw)
    for s, e, i in groups:
        ref = point_fields(tabs[i], gather_cells(space, Ut, cells[s:e]), **kw)
        for f in ("detJ", "invJ", "x", "u", "grad", "href"):
            a, b = getattr(new, f)[..., s:e], getattr(ref, f)
            assert a.shape == b.shape and _rel(a, b) < 8 * EPS, (name, f, s)


# ------------------------------------------------------------------- the per-run evaluation
def _side(space, Ut, R, cells, nq):
    Nf, _ = face_quadrature(space.dim, nq)
    return point_fields(ref_tables(space.element, Nf @ R), gather_cells(space, Ut, cells), x=True, grad=True)


def _normal(ev, f):
    nvec = ev.invJ[f // 2] * (2.0 * (f % 2) - 1.0)
    norm = np.sqrt((nvec ** 2).sum(0))
    return nvec / norm, ev.detJ * norm


def per_run_faces(space, U, flux_n, nq, neumann=None, neumann_ids=None):
    """The face part as evaluated before issue 36: one evaluation per run and side, one per
    local face for the Neumann faces."""
    mesh, d, nc = space.mesh, space.dim, space.mesh.num_cells
    Ut = np.ascontiguousarray(U.T)
    fr = face_runs(mesh)
    _, wf = face_quadrature(d, nq)
    val = np.empty(fr.cell.size)
    for s, e, f, g in fr.runs:
        a, b = fr.cell[s:e], fr.nb[s:e]
        ea, eb = _side(space, Ut, own_face_refs(d, [f])[0], a, nq), _side(space, Ut, fr.R_sets[g], b, nq)
        nrm, da = _normal(ea, f)
        jump = flux_n(ea.grad, nrm, ea.x, a) - flux_n(eb.grad, nrm, ea.x, b)
        val[s:e] = 0.5 * fr.h[s:e] * (wf @ (da * (jump ** 2).sum(0)))
    out = np.bincount(fr.cell, val, nc) + np.bincount(fr.nb, val, nc)
    if neumann_ids is not None:
        cN, fN, _ = mesh.boundary_faces(neumann_ids)
        for f in range(2 * d):
            cf = cN[fN == f]
            if cf.size:
                ea = _side(space, Ut, own_face_refs(d, [f])[0], cf, nq)
                nrm, da = _normal(ea, f)
                if callable(neumann):                 # (n, m) or (n, m, c) -> (c, m, n)
                    g = np.asarray(neumann(ea.x.T, nrm.T), float)
                    g = (g[..., None] if g.ndim == 2 else g).T
                else:
                    g = np.asarray(neumann, float).reshape(-1, 1, 1)
                r = g - flux_n(ea.grad, nrm, ea.x, cf)
                hF = face_diameters(mesh, cf, np.full(cf.size, f))
                out += np.bincount(cf, hF * (wf @ (da * (r ** 2).sum(0))), nc)
    return out


def _scalar_flux(G, n, x, cells):                       # k(x) grad u . n, k = 1 + x_0^2
    return ((1 + x[0] ** 2) * (G[0] * n).sum(0))[None]


def _elastic_flux(G, n, x, cells):                      # sigma(u) n, mu = 0.7, lam = 1.5
    return 0.7 * (np.einsum("cbmn,bmn->cmn", G, n) + np.einsum("bcmn,bmn->cmn", G, n)) \
        + 1.5 * np.einsum("ccmn->mn", G) * n


def _neumann(x, n):
    return x[..., 0] * n[..., 0] + x[..., 1]


PATHS = ("cpu", "gpu-path", "chunks-7")


def _face_part(space, U, flux, path, monkeypatch, **kw):
    dat = _Data(space, U)
    if path == "gpu-path":                              # the device's chunks and deferred checks
        dat.gpu = True
    elif path == "chunks-7":                            # chunks that cut the runs and the groups
        monkeypatch.setattr(_Data, "chunk", lambda self, *a, **k: 7)
    out = jump_terms(space, U, flux, space.degree + 1, need_x=True, data=dat, **kw)
    dat.check()
    return out


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("name", sorted(SPACES))
def test_face_part_equals_per_run_evaluation(name, path, monkeypatch):
    space = SPACES[name]()
    assert space.mesh.num_hanging_nodes > 0
    U = np.random.default_rng(2).standard_normal((space.num_nodes, 1))
    nq = space.degree + 1
    for kw in (dict(), dict(neumann=_neumann, neumann_ids=[0, 3]), dict(neumann=-0.5, neumann_ids=[1, 2])):
        ref = per_run_faces(space, U, _scalar_flux, nq, **kw)
        new = _face_part(space, U, _scalar_flux, path, monkeypatch, **kw)
        assert ref.min() > 0 and _rel(new, ref) < 32 * EPS, (name, path, kw, _rel(new, ref) / EPS)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("name", ["2d-q2", "3d-q1"])
def test_elasticity_face_part_equals_per_run_evaluation(name, path, monkeypatch):
    space = SPACES[name](SPACES[name]().dim)
    d = space.dim
    U = np.random.default_rng(3).standard_normal((space.num_nodes, d))
    kw = dict(neumann=np.arange(1.0, d + 1), neumann_ids=[0, 2 * d - 1])
    ref = per_run_faces(space, U, _elastic_flux, space.degree + 1, **kw)
    new = _face_part(space, U, _elastic_flux, path, monkeypatch, **kw)
    assert _rel(new, ref) < 32 * EPS, (name, path, _rel(new, ref) / EPS)


def _bench():
    """scripts/bench_estimate.py as a module: its call counter and GPU-path context."""
    spec = importlib.util.spec_from_file_location(
        "bench_estimate_under_test", os.path.join(os.path.dirname(__file__), "..", "..", "scripts", "bench_estimate.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _expected_calls(space, ids, neumann_points=False):
    """One evaluation for the cells, one per side for the interior faces, one for the Neumann
    faces; table products: the cells' J and Hessian, then J and the gradient per group (the own
    side's local faces, the neighbour's runs, the Neumann faces' local faces), and with
    ``neumann_points`` (a callable g(x, n)) the points x per Neumann group as well."""
    fr = face_runs(space.mesh)
    own = len({f for _, _, f, _ in fr.runs})
    _, fN, _ = space.mesh.boundary_faces(ids)
    per_neumann_group = 3 if neumann_points else 2
    return {"evaluations": 4, "products": 2 + 2 * (own + len(fr.runs)) + per_neumann_group * np.unique(fN).size}


@pytest.mark.parametrize("name", ["2d-q1", "3d-q2"])
@pytest.mark.parametrize("neumann", [0.5, _neumann], ids=["g-const", "g-callable"])
def test_gpu_path_evaluates_every_face_at_once(name, neumann):
    """On the GPU's path a mesh that fits one chunk costs one evaluation for the cells, one per
    side for all interior faces and one for all Neumann faces, whatever the number of runs;
    only the table products run per group."""
    bench = _bench()
    space = SPACES[name]()
    assert len(face_runs(space.mesh).runs) > 8
    u = np.random.default_rng(4).standard_normal(space.num_dofs)
    kw = dict(f=1.0, neumann=neumann, neumann_ids=[0, 1])
    ref = residual_indicators(space, u, **kw)
    out = []
    with bench.device_path():
        calls = bench.count_calls(lambda: out.append(residual_indicators(space, u, **kw)), np)
    assert calls == _expected_calls(space, [0, 1], neumann_points=callable(neumann))
    np.testing.assert_allclose(out[0], ref, rtol=32 * EPS, atol=0)


def test_bench_script_counts(capsys):
    rows = _bench().main(["--cells", "3000", "--repeat", "1", "--device-path"])
    assert rows[0]["cells"] >= 3000 and rows[0]["runs"] > 4 and rows[0]["evaluations"] == 3
    assert "| cpu (GPU path) |" in capsys.readouterr().out


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["2d-q2", "3d-q1"])
def test_gpu_evaluates_every_face_at_once(name):
    """The device makes the evaluations of the GPU path emulated above, its grouped table
    products one kernel each, and matches the CPU."""
    gpu = get_backend("gpu")
    space = SPACES[name]()
    u = np.random.default_rng(4).standard_normal(space.num_dofs)
    kw = dict(f=1.0, neumann=_neumann, neumann_ids=[0, 1])
    ref = residual_indicators(space, u, parts=True, **kw)
    residual_indicators(space, u, backend=gpu, **kw)           # face topology cached first
    out = []
    calls = _bench().count_calls(
        lambda: out.append(residual_indicators(space, gpu.asarray(u), parts=True, backend=gpu, **kw)), gpu.xp)
    # on the device each grouped table product is one fused kernel (the cells' J and Hessian,
    # J and the gradient of the own sides, of the neighbours' runs and of the Neumann faces,
    # and their points x): a count independent of the number of groups
    assert calls == {"evaluations": 4, "products": 2 + 2 + 2 + 3}, calls
    assert calls["products"] < _expected_calls(space, [0, 1], neumann_points=True)["products"]
    for new, r in zip(out[0], ref):
        assert _rel(new, r) < 1e4 * EPS


@pytest.mark.parametrize("dim", [2, 3])
def test_max_vertex_distance_all_pairs(dim):
    from adaptmg.estimate.evaluation import max_vertex_distance
    from adaptmg.estimate.residual import cell_diameters
    mesh = adaptive_box(dim, 3, 2)
    X = mesh.points[mesh.cells].transpose(2, 1, 0)                     # (d, nv, n)
    ref = np.sqrt(((X[:, :, None] - X[:, None]) ** 2).sum(0)).max(axis=(0, 1))
    np.testing.assert_allclose(cell_diameters(mesh), ref, rtol=2 * EPS, atol=0)
    np.testing.assert_allclose(max_vertex_distance(X[:, :2]), np.linalg.norm(X[:, 1] - X[:, 0], axis=0),
                               rtol=2 * EPS, atol=0)
    assert (max_vertex_distance(X[:, :1]) == 0).all()
    # the host's pair-by-pair loop gives the device formula's numbers bit for bit (the same
    # squares summed over the axes in the same order): h_K agrees between the backends
    Y = X + np.random.default_rng(dim).normal(scale=0.05, size=X.shape)       # distorted cells
    for Z in (X, Y, Y[:, :4]):
        i, j = np.triu_indices(Z.shape[1], 1)
        diff = Z[:, i] - Z[:, j]
        s2 = diff[0] * diff[0]
        for a in range(1, dim):
            s2 += diff[a] * diff[a]
        assert np.array_equal(max_vertex_distance(Z), np.sqrt(s2.max(axis=0)))
