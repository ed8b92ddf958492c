"""The face topology (:func:`face_pairs`, :func:`face_runs`, :func:`face_diameters`) with
``backend=``: the CPU backend is the default NumPy path (bitwise), and on the GPU the matching,
the run grouping and the diameters run on CuPy and give the host's result.

On the device the faces come out in the *same order* as on the host: the face matching does
not depend on the order of equal keys in its sorts, and the run grouping uses a stable sort on
both (NumPy ``kind="stable"``, CuPy's only sort), so the arrays are compared elementwise and
the ``runs`` lists are compared for equality."""
from types import SimpleNamespace

import numpy as np
import pytest

from adaptmg import Mesh, Space
from adaptmg.backend import get_backend, to_host
from adaptmg.estimate import residual_indicators
from adaptmg.estimate import faces
from adaptmg.estimate.faces import face_diameters, face_pairs, face_runs

from estimate_meshes import adaptive_box

EPS = np.finfo(float).eps
PAIR_FIELDS = ("cell", "face", "nb", "R_nb", "hanging", "once")
RUN_FIELDS = ("cell", "face", "nb", "hanging", "h")


MESHES = {
    "2d": lambda: adaptive_box(2, 0, 4),
    "2d-deep": lambda: adaptive_box(2, 7, 6, distort=False),
    "3d": lambda: adaptive_box(3, 0, 2),
    "3d-b": lambda: adaptive_box(3, 1, 2, distort=False),
}


def _fresh(mesh, fn, backend):
    """``fn(mesh, backend)`` computed anew (the per-mesh caches dropped first)."""
    faces._FACE_CACHE.pop(mesh, None)
    faces._RUNS_CACHE.pop(mesh, None)
    return fn(mesh, backend)


def _assert_same(a, b, fields, exact_float=True):
    for f in fields:
        x, y = getattr(a, f), to_host(getattr(b, f))
        assert type(y) is np.ndarray, f
        assert x.dtype == y.dtype and x.shape == y.shape, f"{f}: {x.dtype}{x.shape} vs {y.dtype}{y.shape}"
        if f == "h" and not exact_float:
            np.testing.assert_allclose(y, x, rtol=4 * EPS, atol=0, err_msg=f)
        else:
            np.testing.assert_array_equal(y, x, err_msg=f)


@pytest.mark.parametrize("name", sorted(MESHES))
def test_cpu_backend_is_the_default_path(name):
    mesh = MESHES[name]()
    assert mesh.num_hanging_nodes > 0
    ref_p = _fresh(mesh, lambda m, b: face_pairs(m), None)
    ref_r = _fresh(mesh, lambda m, b: face_runs(m), None)
    for backend in ("cpu", get_backend("cpu")):
        fp = _fresh(mesh, face_pairs, backend)
        _assert_same(ref_p, fp, PAIR_FIELDS)
        fr = _fresh(mesh, face_runs, backend)
        _assert_same(ref_r, fr, RUN_FIELDS)
        np.testing.assert_array_equal(fr.R_sets, ref_r.R_sets)
        assert fr.runs == ref_r.runs
    # the default and "cpu" share the cache entry
    assert face_runs(mesh, "cpu") is face_runs(mesh) and face_pairs(mesh, "cpu") is face_pairs(mesh)
    np.testing.assert_array_equal(face_diameters(mesh, ref_r.cell, ref_r.face, backend="cpu"), ref_r.h)


def test_cpu_no_interior_faces():
    mesh = Mesh.box([0, 0], [1, 1], [1, 1])
    fr = face_runs(mesh, backend="cpu")
    assert fr.cell.size == 0 and fr.runs == []


def _unmatched_mesh():
    """Two cells whose shared face has different vertex ids on the two sides (a stand-in mesh,
    not weak-referenceable, so not cached)."""
    m = Mesh.box([0, 0], [2, 1], [2, 1])
    cells = m.cells.copy()
    cells[1, 0] = cells[1, 1]
    return SimpleNamespace(dim=2, cells=cells, boundary_ids=m.boundary_ids, num_nodes=m.num_nodes,
                           num_hanging_nodes=0, hanging_nodes=np.zeros(0, np.int64),
                           hanging_parents=np.zeros((0, 4), np.int64), points=m.points)


UNMATCHED = r"face matching failed for 2 interior face\(s\) \(first: cell 0, face 1, vertices \[1, 4\]\)"


@pytest.mark.parametrize("backend", [None, "cpu"])
def test_cpu_unmatched_face_error(backend):
    with pytest.raises(RuntimeError, match=UNMATCHED):
        face_pairs(_unmatched_mesh(), backend)


# ------------------------------------------------------------------------------------- GPU
def _cupy():
    return get_backend("gpu").xp


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(MESHES))
def test_gpu_face_pairs_match_host(name):
    cp = _cupy()
    mesh = MESHES[name]()
    assert mesh.num_hanging_nodes > 0
    host = face_pairs(mesh)
    dev = _fresh(mesh, face_pairs, "gpu")
    for f in PAIR_FIELDS:
        assert isinstance(getattr(dev, f), cp.ndarray), f
    _assert_same(host, dev, PAIR_FIELDS)          # same faces in the same order
    assert dev.hanging.any()


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(MESHES))
def test_gpu_face_runs_match_host(name):
    cp = _cupy()
    mesh = MESHES[name]()
    host = _fresh(mesh, lambda m, b: face_runs(m), None)
    dev = face_runs(mesh, "gpu")
    for f in RUN_FIELDS:
        assert isinstance(getattr(dev, f), cp.ndarray), f
    _assert_same(host, dev, RUN_FIELDS, exact_float=False)
    assert type(dev.R_sets) is np.ndarray
    np.testing.assert_array_equal(dev.R_sets, host.R_sets)
    assert isinstance(dev.runs, list) and all(type(v) is int for r in dev.runs for v in r)
    assert dev.runs == host.runs
    # caches per backend: neither call returns the other's arrays
    assert isinstance(face_runs(mesh).cell, np.ndarray) and face_runs(mesh) is host
    assert isinstance(face_runs(mesh, "gpu").cell, cp.ndarray) and face_runs(mesh, "gpu") is dev
    assert isinstance(face_pairs(mesh).cell, np.ndarray)
    assert isinstance(face_pairs(mesh, "gpu").cell, cp.ndarray)
    # face_diameters with host or device indices
    h = face_diameters(mesh, host.cell, host.face, backend="gpu")
    assert isinstance(h, cp.ndarray)
    np.testing.assert_allclose(to_host(h), host.h, rtol=4 * EPS, atol=0)


@pytest.mark.gpu
def test_gpu_wide_keys_and_no_faces():
    """3-D face keys of node ids >= 2^15 (the two-pair labelling), and a mesh without interior faces."""
    rng = np.random.default_rng(0)
    mesh = Mesh.box([0] * 3, [1] * 3, [32] * 3)
    mesh = mesh.refine(rng.random(mesh.num_cells) < 0.05)
    assert mesh.num_nodes > 2 ** 15 and mesh.num_hanging_nodes > 0
    host, dev = face_runs(mesh), face_runs(mesh, "gpu")
    _assert_same(host, dev, RUN_FIELDS, exact_float=False)
    assert dev.runs == host.runs
    _assert_same(face_pairs(mesh), face_pairs(mesh, "gpu"), PAIR_FIELDS)
    empty = face_runs(Mesh.box([0, 0], [1, 1], [1, 1]), "gpu")
    assert empty.cell.size == 0 and empty.runs == []


@pytest.mark.gpu
@pytest.mark.parametrize("dim", [2, 3])
def test_gpu_residual_uses_device_faces_and_matches_cpu(dim):
    cp = _cupy()
    mesh = adaptive_box(dim, 3, 4 if dim == 2 else 2)
    space = Space(mesh, 1)
    u = np.random.default_rng(1).standard_normal(space.num_dofs)
    kw = dict(f=lambda x: x[..., 0], k=lambda x: 1 + x[..., 1] ** 2, neumann=0.5, neumann_ids=[0])
    ref = residual_indicators(space, u, parts=True, **kw)
    faces._RUNS_CACHE.pop(mesh, None)
    out = residual_indicators(space, u, parts=True, backend="gpu", **kw)
    assert [k for k in faces._RUNS_CACHE[mesh] if k != "cpu"]       # face_runs ran on the device
    assert isinstance(face_runs(mesh, "gpu").cell, cp.ndarray)
    for new, r, what in zip(out, ref, ("eta", "cell part", "face part")):
        assert isinstance(new, np.ndarray)
        err = np.abs(new - r).max() / np.abs(r).max()
        assert err < 1e4 * EPS, f"{what}: relative difference {err:.2e}"


@pytest.mark.gpu
def test_gpu_unmatched_face_error():
    with pytest.raises(RuntimeError, match=UNMATCHED):
        face_pairs(_unmatched_mesh(), "gpu")
