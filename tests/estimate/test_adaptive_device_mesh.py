"""The adaptive loop on a mesh on the GPU (issue 36 item 2): residual indicators, Doerfler /
fixed-fraction marking, error norms and the L-shape loop read the mesh's device arrays and
keep their results there.

On the CPU the device branches run under stand-ins for CuPy: the strict one of
``tests/mesh/strict_cupy.py`` (refuses NumPy-only calls, host/device mixing, scatters with
repeated indices; counts host reads) for the estimator, the marking and the norms, and the
distributed layer's ``fake_cupy`` (SciPy matrices that claim to be cupyx ones, so the GPU
set-up and the Krylov solve run) for whole loop steps.  Integers (DoFs, marks, cells,
iterations) must equal the host mesh's exactly, floats within a few eps.  The ``gpu`` tests
are the real thing for the lead's H200: a short L-shape loop with the mesh on the device
gives the host mesh's DoF counts, marks and iterations, and its errors within 1e-10.
"""
import pathlib
import sys
import types

import numpy as np
import pytest

from adaptmg import Mesh, Space
from adaptmg.estimate import doerfler, evaluation, fixed_fraction, mark, residual_indicators
from adaptmg.fe.norms import errors

HERE = pathlib.Path(__file__).resolve().parent
EPS = np.finfo(float).eps


def _lshape():
    from adaptmg_problems import lshape
    return lshape


@pytest.fixture
def strict(monkeypatch):
    """``get_backend("gpu")`` answers the strict CuPy stand-in (reset of the device table cache
    afterwards: its arrays are the stand-in's)."""
    monkeypatch.syspath_prepend(str(HERE.parent / "mesh"))
    import strict_cupy
    xp = strict_cupy.install(monkeypatch)
    monkeypatch.setattr(xp.cuda, "runtime", types.SimpleNamespace(getDevice=lambda: 0), raising=False)
    monkeypatch.setattr(evaluation, "_DEVICE_TABLES", {})
    return strict_cupy


@pytest.fixture
def fake(monkeypatch):
    """``get_backend("gpu")`` answers ``tests/distributed/fake_cupy.py`` with a ``cupyx`` whose
    sparse linear algebra is SciPy's (the serial solve without CUDA graphs)."""
    import scipy.sparse.linalg as ssl
    monkeypatch.syspath_prepend(str(HERE.parent / "distributed"))
    monkeypatch.syspath_prepend(str(HERE.parent / "mesh"))
    import fake_cupy
    import strict_cupy
    import adaptmg.backend as B
    from adaptmg.multilevel.solver import MultilevelSolver
    cx = types.ModuleType("cupyx")
    for name in ("scatter_add", "scatter_max", "scatter_min"):
        setattr(cx, name, getattr(strict_cupy.cupyx, name))
    cx.scipy = types.ModuleType("cupyx.scipy")
    cx.scipy.sparse = fake_cupy.csp
    monkeypatch.setattr(B, "_cupy_status", lambda: (fake_cupy.xp, fake_cupy.csp, ""))
    for name, mod in (("cupy", fake_cupy.xp), ("cupyx", cx), ("cupyx.scipy", cx.scipy),
                      ("cupyx.scipy.sparse", fake_cupy.csp), ("cupyx.scipy.sparse.linalg", ssl)):
        monkeypatch.setitem(sys.modules, name, mod)
    monkeypatch.setattr(fake_cupy.xp.cuda.runtime, "getDevice", lambda: 0, raising=False)
    monkeypatch.setattr(MultilevelSolver, "_capturable", lambda self: False)   # no CUDA graphs
    monkeypatch.setattr(evaluation, "_DEVICE_TABLES", {})
    return fake_cupy


def _ball(m, c, r):
    x = m.points[m.cells].mean(axis=1)
    return np.linalg.norm(x - c, axis=1) < r


def _meshes():
    ls = _lshape().coarse_mesh().refine().refine()
    ls = ls.refine(_ball(ls, 0.0, 0.3))
    ls = ls.refine(_ball(ls, 0.0, 0.12))                  # 2-D, two fronts of hanging nodes
    box = Mesh.box([0.0, 0.0, 0.0], [1.0, 1.0, 1.0], [2, 2, 2]).refine()
    box = box.refine(_ball(box, 0.3, 0.4))                # 3-D, hanging nodes on faces and edges
    return {"lshape-2d": ls, "box-3d": box}


def _host(a):
    return a.get() if hasattr(a, "get") else np.asarray(a)


def _close(dev, host, units=64):
    d = _host(dev)
    assert d.shape == host.shape
    assert np.abs(d - host).max() <= units * EPS * max(np.abs(host).max(), 1e-300), np.abs(d - host).max()


@pytest.mark.parametrize("name", ["lshape-2d", "box-3d"])
def test_indicators_on_a_device_mesh_equal_the_host_ones(name, strict):
    m = _meshes()[name]
    s = Space(m, 1)
    u = s.interpolate(lambda x: np.sin(3 * x[:, 0]) * np.cos(2 * x[:, 1]) + x[:, -1] ** 2)
    kw = dict(f=lambda x: 1.0 + x[..., 0], k=2.0, neumann=lambda x, n: n[..., 0] + x[..., 1],
              neumann_ids=[0] if name == "lshape-2d" else [1, 3], parts=True)
    want = residual_indicators(s, u, **kw)
    g = m.to("gpu")
    sd = Space(g, 1)
    ud = strict.xp.asarray(u)
    residual_indicators(sd, ud, **kw)                     # tables and face runs cached per mesh
    before = strict.host_values()
    got = residual_indicators(sd, ud, **kw)
    moved, calls = np.subtract(strict.host_values(), before)
    assert moved <= 16 and calls <= 4, (moved, calls)     # the Neumann faces' 2d + 1 bounds: O(1)
    assert m.num_cells > 150 and m.num_hanging_nodes > 0
    for a, b in zip(got, want):
        assert isinstance(a, strict.ndarray)              # stays on the device
        _close(a, b)
    with pytest.raises(ValueError, match="mesh.to"):
        residual_indicators(sd, ud, backend="cpu")


def test_marking_on_the_device_equals_the_host(strict):
    rng = np.random.default_rng(4)
    eta = rng.random(2000) ** 3
    eta[100:110] = eta[5]                                 # ties at and around the threshold
    eta[::97] = 0.0
    ed = strict.xp.asarray(eta)
    for theta in (0.2, 0.5, 0.9, 1.0):
        for tie in (None, 1e-6):
            before = strict.host_values()
            got = doerfler(ed, theta, tie)
            assert np.subtract(strict.host_values(), before)[0] <= 3     # the flag and the count
            assert isinstance(got, strict.ndarray)
            want = doerfler(eta, theta, tie)
            assert np.array_equal(got.get(), want)
            e2 = np.sort(eta ** 2)[::-1]                  # the minimal bulk set: its size fits
            assert got.get().sum() >= np.searchsorted(np.cumsum(e2), theta * e2.sum() * (1 - 1e-12)) + 1
    assert np.array_equal(fixed_fraction(ed, 0.3).get(), fixed_fraction(eta, 0.3))
    assert mark(ed, "uniform").get().all()
    assert not doerfler(strict.xp.zeros(5), 0.5).get().any()
    with pytest.raises(ValueError, match="finite and non-negative"):
        doerfler(strict.xp.asarray(-eta), 0.5)


@pytest.mark.parametrize("name", ["lshape-2d", "box-3d"])
def test_error_norms_on_a_device_mesh(name, strict):
    m = _meshes()[name]
    s = Space(m, 1)

    def exact(x):
        return x[..., 0] * x[..., 1] + x[..., -1]

    def grad(x):
        g = [x[..., 1], x[..., 0]] + ([0 * x[..., 0]] if x.shape[-1] == 3 else [])
        g[-1] = g[-1] + 1.0
        return np.stack(g, axis=-1)
    u = s.interpolate(exact) + 1e-3
    want = errors(s, u, exact, grad)
    got = errors(Space(m.to("gpu"), 1), strict.xp.asarray(u), exact, grad)
    assert want["L2"] > 0 and want["H1"] > 0
    for k in want:
        assert abs(got[k] - want[k]) <= 64 * EPS * want[k]


def test_lshape_loop_with_the_mesh_on_the_device(fake):
    """Loop steps to ~3000 DoFs (a 2-level hierarchy at the end) with the mesh on the (stand-in)
    device against the host mesh with the same solver backend: the same DoFs, hanging nodes,
    levels, iterations and final cells; errors and estimates within round-off."""
    ls = _lshape()
    # tie_rtol: twin cells of the symmetric L-shape have indicators equal up to round-off, which
    # differs between the two set-ups (and between BLAS kernels): marked together, the marks do
    # not depend on it (without it, OPENBLAS_CORETYPE=Haswell gave another final mesh)
    kw = dict(steps=200, max_dofs=2500, backend="gpu", quiet=True, tie_rtol=1e-8)
    host = ls.run(mesh_backend="cpu", **kw)
    before = fake.device_to_host()
    dev = ls.run(**kw)                                    # default: the mesh on the GPU
    gets = fake.device_to_host() - before
    assert dev["mesh"].backend.is_gpu and not host["mesh"].backend.is_gpu
    assert isinstance(dev["eta"], fake.ndarray)          # (u: the stand-in's SpMV gives NumPy)
    hh, hd = host["history"], dev["history"]
    assert [r["dofs"] for r in hd] == [r["dofs"] for r in hh]
    assert hh[-1]["dofs"] >= 2500 and hh[-1]["levels"] >= 2
    for k in ("cells", "hanging", "levels", "iterations"):
        assert [r[k] for r in hd] == [r[k] for r in hh], k
    assert gets <= 10 * len(hd), gets                      # O(1) copies per step (8.6 with the tie rule), not O(cells)
    assert np.array_equal(_host(dev["mesh"].cells), host["mesh"].cells)
    for a, b in zip(hd, hh):
        for k in ("err_H1", "err_L2", "estimate"):        # (L2: |u - u_h| << |u|, round-off of u)
            assert abs(a[k] - b[k]) <= 1e-8 * b[k], (k, a[k], b[k])
    with pytest.raises(ValueError, match="backend 'gpu'"):
        ls.run(steps=1, backend="cpu", mesh_backend="gpu", quiet=True)


# ----------------------------------------------------------------------------- on the GPU
@pytest.mark.gpu
def test_gpu_lshape_loop_device_mesh_equals_host_mesh():
    """A short L-shape loop (to 2e4 DoFs) with the mesh on the GPU against the host mesh, both
    solved on the GPU: the same DoFs, marks (final cells) and iterations per step, errors and
    estimates within 1e-8 relative (the solves stop at rtol 1e-9, and the two set-ups' matrices
    differ by round-off: the H200 gave 3.2e-10 in the L2 error).  ``tie_rtol``: the L-shape is symmetric about y = -x, so twin cells' indicators
    differ by round-off only, which differs between the two set-ups -- marked together, the
    marks do not depend on it."""
    ls = _lshape()
    kw = dict(steps=200, max_dofs=20_000, backend="gpu", quiet=True, tie_rtol=1e-8)
    host = ls.run(mesh_backend="cpu", **kw)
    dev = ls.run(mesh_backend="gpu", **kw)
    hh, hd = host["history"], dev["history"]
    assert dev["mesh"].backend.is_gpu and hh[-1]["dofs"] >= 20_000
    for k in ("dofs", "cells", "hanging", "levels", "iterations"):
        assert [r[k] for r in hd] == [r[k] for r in hh], k
    assert np.array_equal(dev["mesh"].cells.get(), host["mesh"].cells)
    for a, b in zip(hd, hh):
        for k in ("err_H1", "err_L2", "estimate"):
            assert abs(a[k] - b[k]) <= 1e-8 * b[k], (k, a[k], b[k])


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["lshape-2d", "box-3d"])
def test_gpu_indicators_marks_and_norms_on_a_device_mesh(name):
    import cupy
    m = _meshes()[name]
    s, sd = Space(m, 1), Space(m.to("gpu"), 1)
    u = s.interpolate(lambda x: np.sin(3 * x[:, 0]) * np.cos(2 * x[:, 1]) + x[:, -1] ** 2)
    ud = cupy.asarray(u)
    want = residual_indicators(s, u, f=1.0)
    got = residual_indicators(sd, ud, f=1.0)
    assert isinstance(got, cupy.ndarray)
    _close(got, want)
    assert np.array_equal(doerfler(got, 0.5, 1e-8).get(), doerfler(want, 0.5, 1e-8))
    e_h = errors(s, u, lambda x: x[..., 0] ** 2)
    e_d = errors(sd, ud, lambda x: x[..., 0] ** 2)
    assert abs(e_d["L2"] - e_h["L2"]) <= 64 * EPS * e_h["L2"]


def test_fichera_and_vtu_output_with_the_mesh_on_the_device(fake, tmp_path):
    """Fichera (3-D, load vector on the device) the same on both meshes; the VTU files of a
    device-mesh loop are written from a host copy with the same numbering."""
    import meshio
    from adaptmg_problems import fichera
    host = fichera.run(steps=2, backend="gpu", mesh_backend="cpu", quiet=True)
    dev = fichera.run(steps=2, backend="gpu", quiet=True)
    assert dev["mesh"].backend.is_gpu
    for a, b in zip(dev["history"], host["history"]):
        assert (a["dofs"], a["hanging"], a["iterations"]) == (b["dofs"], b["hanging"], b["iterations"])
        assert abs(a["estimate"] - b["estimate"]) <= 1e-12 * b["estimate"]
        assert abs(a["J"] - b["J"]) <= 64 * EPS * b["J"]
    res = _lshape().run(steps=2, backend="gpu", quiet=True, out=str(tmp_path))
    m = meshio.read(tmp_path / "lshape_002.vtu")
    u = _host(res["u"])
    assert m.points.shape[0] == u.size
    assert np.abs(m.point_data["u"] - u).max() == 0.0
    assert np.abs(m.point_data["error"]).max() < 0.1
