"""The estimators for a subset of the cells (``cells=``): exactly the whole call's indicators
on those cells (their cell residuals and every face touching them), zeros elsewhere -- what
a rank computes of a mesh that every rank holds (``adaptive_loop_replicated``)."""
import numpy as np
import pytest

from adaptmg import Space
from adaptmg.backend import get_backend
from adaptmg.estimate import elasticity_indicators, residual_indicators
import adaptmg.estimate.faces as faces
from adaptmg.estimate.faces import face_runs, runs_touching

from estimate_meshes import adaptive_box
from test_residual_backend import CASES, _case

EPS = np.finfo(float).eps
RTOL = 64 * EPS           # the same faces and cells: other batch shapes of the same products only


def _close(new, ref, what, rtol=RTOL):
    err = np.abs(np.asarray(new) - ref).max() / np.abs(ref).max()
    assert err < rtol, f"{what}: relative difference {err:.2e} ({err / EPS:.0f} eps)"


def _forget_faces(mesh):
    """Drop the memoised faces of ``mesh``: a subset's faces are then matched around it alone
    (what a rank does on a new mesh) instead of cut from the whole mesh's."""
    for cache in (faces._RUNS_CACHE, faces._FACE_CACHE):
        cache.pop(mesh, None)


def _masks(n, seed):
    """A random 40 % of the cells and a contiguous block (the shapes of a rank's share)."""
    rng = np.random.default_rng(seed)
    block = np.zeros(n, dtype=bool)
    block[n // 3: 2 * n // 3] = True
    return rng.random(n) < 0.4, block


@pytest.mark.parametrize("matched", ["around-the-subset", "cut-from-the-whole"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_subset_equals_the_whole_call_on_its_cells(name, matched):
    space, u, kw = _case(name)
    ref = residual_indicators(space, u, parts=True, **kw)
    for mask in _masks(space.mesh.num_cells, 1):
        for cells in (mask, np.flatnonzero(mask)):
            if matched == "around-the-subset":
                _forget_faces(space.mesh)
            out = residual_indicators(space, u, parts=True, cells=cells, **kw)
            for new, r, what in zip(out, ref, ("eta", "cell part", "face part")):
                assert not new[~mask].any(), f"{name} {what}: entries outside the subset"
                _close(new[mask], r[mask], f"{name} {what}")


def test_complementary_subsets_add_up_to_the_whole_call():
    space, u, kw = _case("q1-callables")
    ref = residual_indicators(space, u, **kw)
    mask = _masks(space.mesh.num_cells, 2)[0]
    _forget_faces(space.mesh)
    a = residual_indicators(space, u, cells=mask, **kw)
    b = residual_indicators(space, u, cells=~mask, **kw)
    _close(a + b, ref, "a + b")


def test_subset_over_several_chunks(monkeypatch):
    import adaptmg.estimate.residual as residual
    space, u, kw = _case("q2-poisson")
    ref = residual_indicators(space, u, **kw)
    orig = residual.serial_chunk
    monkeypatch.setattr(residual, "serial_chunk", lambda *a, **k: min(7, orig(*a, **k)))
    mask = _masks(space.mesh.num_cells, 3)[0]
    _forget_faces(space.mesh)
    out = residual_indicators(space, u, cells=mask, **kw)
    assert not out[~mask].any()
    _close(out[mask], ref[mask], "chunked subset")


def test_elasticity_subset():
    space = Space(adaptive_box(3, 0, 2), 1, 3)
    u = np.random.default_rng(3).standard_normal(space.num_dofs)
    kw = dict(f=lambda x: x ** 2, traction=lambda x, n: x * n[..., :1], neumann_ids=[0, 3])
    ref = elasticity_indicators(space, u, 1.5, 0.7, **kw)
    mask = _masks(space.mesh.num_cells, 4)[1]
    _forget_faces(space.mesh)
    out = elasticity_indicators(space, u, 1.5, 0.7, cells=mask, **kw)
    assert not out[~mask].any()
    _close(out[mask], ref[mask], "elasticity")


def test_runs_touching_keeps_exactly_the_faces_of_the_subset():
    mesh = adaptive_box(2, 0, 4)
    fr = face_runs(mesh)
    mask = _masks(mesh.num_cells, 5)[1]
    sub = runs_touching(fr, mask)
    want = mask[fr.cell] | mask[fr.nb]
    np.testing.assert_array_equal(sub.cell, fr.cell[want])
    np.testing.assert_array_equal(sub.nb, fr.nb[want])
    covered = np.zeros(sub.cell.size, dtype=int)
    for s, e, f, g in sub.runs:                 # the runs tile the kept faces, each run's own face
        assert e > s
        covered[s:e] += 1
        np.testing.assert_array_equal(sub.face[s:e], f)
    np.testing.assert_array_equal(covered, 1)
    empty = runs_touching(fr, np.zeros(mesh.num_cells, dtype=bool))
    assert empty.cell.size == 0 and empty.runs == []
    # matched around the subset alone: the same faces in the same order
    _forget_faces(mesh)
    alone = face_runs(mesh, only=mask)
    for a in ("cell", "face", "nb", "hanging", "h"):
        np.testing.assert_array_equal(getattr(alone, a), getattr(sub, a), err_msg=a)
    assert faces._RUNS_CACHE.get(mesh) is None          # a subset's faces are not memoised


def test_subset_matching_still_refuses_a_mesh_that_is_not_balanced(monkeypatch):
    """A face of the subset without a partner is an error, as for the whole mesh."""
    import adaptmg.estimate.faces as F
    mesh = adaptive_box(2, 0, 3)
    real = F._row_labels

    def broken(keys, num_nodes, xp=np):          # every face its own label: nothing matches
        lab, order = real(keys, num_nodes, xp)
        return np.arange(lab.size), np.arange(lab.size)
    monkeypatch.setattr(F, "_row_labels", broken)
    with pytest.raises(RuntimeError, match="face matching failed"):
        face_runs(mesh, only=np.arange(mesh.num_cells) < 5)


def test_bad_cells():
    space, u, kw = _case("q1-poisson")
    n = space.mesh.num_cells
    with pytest.raises(ValueError, match="shape"):
        residual_indicators(space, u, cells=np.ones(n + 1, dtype=bool), **kw)
    with pytest.raises(ValueError, match="outside"):
        residual_indicators(space, u, cells=np.array([0, n]), **kw)
    with pytest.raises(ValueError, match="outside"):
        residual_indicators(space, u, cells=np.array([-1, 2]), **kw)
    with pytest.raises(ValueError, match="1-D"):
        residual_indicators(space, u, cells=np.zeros((2, 2), dtype=int), **kw)
    with pytest.raises(TypeError, match="dtype"):
        residual_indicators(space, u, cells=np.ones(n), **kw)
    out = residual_indicators(space, u, cells=np.zeros(0, dtype=int), **kw)
    np.testing.assert_array_equal(out, 0.0)


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(CASES))
def test_gpu_subset_matches_cpu(name):
    gpu = get_backend("gpu")
    space, u, kw = _case(name)
    mask = _masks(space.mesh.num_cells, 6)[1]
    ref = residual_indicators(space, u, cells=mask, **kw)
    _forget_faces(space.mesh)
    out = residual_indicators(space, gpu.asarray(u), cells=gpu.asarray(mask), backend=gpu, **kw)
    assert not out[~mask].any()
    _close(out, ref, f"{name} on the GPU", rtol=1e4 * EPS)


@pytest.mark.gpu
def test_gpu_subset_on_a_device_mesh():
    gpu = get_backend("gpu")
    mesh = adaptive_box(3, 1, 2)
    ref_space = Space(mesh, 1)
    u = np.random.default_rng(7).standard_normal(ref_space.num_dofs)
    mask = _masks(mesh.num_cells, 7)[1]
    ref = residual_indicators(ref_space, u, f=1.0, cells=mask)
    space = Space(mesh.to("gpu"), 1)
    out = residual_indicators(space, gpu.asarray(u), f=1.0, cells=gpu.asarray(mask))
    assert gpu.is_gpu and not isinstance(out, np.ndarray)     # stays on the device
    _close(gpu.to_host(out) if hasattr(gpu, "to_host") else out.get(), ref, "device mesh", rtol=1e4 * EPS)


def _device_path(monkeypatch):
    """The estimator's GPU code path on NumPy (the device chunks, deferred checks and pieces)."""
    import adaptmg.estimate.residual as residual
    init = residual._Data.__init__

    def as_device(self, *a, **k):
        init(self, *a, **k)
        self.gpu = True
    monkeypatch.setattr(residual._Data, "__init__", as_device)


@pytest.mark.parametrize("name", ["q1-callables", "3d-q1", "q2-poisson"])
def test_whole_call_in_pieces_equals_the_whole_call(name, monkeypatch):
    """On the GPU path a large mesh's faces go piece by piece (DEVICE_FACE_PIECE cells)."""
    import adaptmg.estimate.residual as residual
    space, u, kw = _case(name)
    ref = residual_indicators(space, u, parts=True, **kw)
    _forget_faces(space.mesh)
    _device_path(monkeypatch)
    d = space.dim                                           # four equal pieces
    monkeypatch.setattr(residual, "DEVICE_FACE_PIECE", 2 * d * (space.mesh.num_cells // 4 + 1))
    calls = []
    real = residual.face_runs
    monkeypatch.setattr(residual, "face_runs", lambda *a, **k: calls.append(k.get("only")) or real(*a, **k))
    out = residual_indicators(space, u, parts=True, **kw)
    assert len(calls) == 4 and all(c is not None for c in calls)
    for new, r, what in zip(out, ref, ("eta", "cell part", "face part")):
        _close(new, r, f"{name} {what} in pieces")
    # whole-mesh faces memoised already: no pieces
    face_runs(space.mesh)
    calls.clear()
    residual_indicators(space, u, **kw)
    assert calls == [None]


@pytest.mark.gpu
def test_gpu_whole_call_in_pieces_matches_cpu(monkeypatch):
    import adaptmg.estimate.residual as residual
    gpu = get_backend("gpu")
    space, u, kw = _case("q1-callables")
    ref = residual_indicators(space, u, **kw)
    monkeypatch.setattr(residual, "DEVICE_FACE_PIECE", 2 * space.dim * (space.mesh.num_cells // 3))
    _forget_faces(space.mesh)
    _close(residual_indicators(space, gpu.asarray(u), backend=gpu, **kw), ref, "pieces on the GPU", rtol=1e4 * EPS)


def test_subset_in_pieces(monkeypatch):
    """A subset larger than DEVICE_FACE_PIECE goes piece by piece too (GPU path)."""
    import adaptmg.estimate.residual as residual
    space, u, kw = _case("q1-callables")
    mask = _masks(space.mesh.num_cells, 8)[0]
    ref = residual_indicators(space, u, cells=mask, **kw)
    _forget_faces(space.mesh)
    _device_path(monkeypatch)
    monkeypatch.setattr(residual, "DEVICE_FACE_PIECE", 2 * space.dim * (int(mask.sum()) // 3 + 1))
    calls = []
    real = residual.face_runs
    monkeypatch.setattr(residual, "face_runs", lambda *a, **k: calls.append(k.get("only")) or real(*a, **k))
    out = residual_indicators(space, u, cells=mask, **kw)
    assert len(calls) == 3 and all(int(c.sum()) <= int(mask.sum()) // 3 + 1 for c in calls)
    assert sum(int(c.sum()) for c in calls) == int(mask.sum())
    assert not out[~mask].any()
    _close(out[mask], ref[mask], "subset in pieces")
