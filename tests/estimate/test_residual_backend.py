"""The residual estimators with ``backend=``: the CPU backend is today's NumPy code path
(bitwise), and on the GPU the indicators agree with the CPU ones to rounding."""
import numpy as np
import pytest

from adaptmg import Space
from adaptmg.backend import get_backend
from adaptmg.estimate import elasticity_indicators, residual_indicators

from estimate_meshes import adaptive_box, k_coefficient

EPS = np.finfo(float).eps
RTOL = 1e4 * EPS          # ~2e-12: rounding (other summation orders, atomic adds) only


def _k_grad_numpy_only(x):
    """Writes into a NumPy array: raises TypeError on CuPy points (evaluated on the host)."""
    g = np.zeros(x.shape)
    g[..., 0], g[..., 1] = 2 * x[..., 0], 0.5
    return g


def _b(x):
    return np.stack([x[..., 1], -x[..., 0]], -1)


CASES = {
    "q1-poisson": (lambda: Space(adaptive_box(2, 0, 4), 1), dict(f=1.0)),
    "q2-poisson": (lambda: Space(adaptive_box(2, 1, 3), 2), dict(f=lambda x: np.sin(3 * x[..., 0]))),
    "q1-callables": (lambda: Space(adaptive_box(2, 2, 4), 1),
                     dict(f=lambda x: np.sin(3 * x[..., 0]) * x[..., 1], k=k_coefficient, c=0.3, b=_b,
                          neumann=lambda x, n: x[..., 0] * n[..., 0], neumann_ids=[0, 1])),
    "q1-k-grad-host": (lambda: Space(adaptive_box(2, 3, 3), 1),
                       dict(f=0.5, k=k_coefficient, k_grad=_k_grad_numpy_only, neumann=-0.5, neumann_ids=[2])),
    "q1-per-cell": (lambda: Space(adaptive_box(2, 4, 3), 1), "per-cell"),
    "3d-q1": (lambda: Space(adaptive_box(3, 0, 2), 1), dict(f=lambda x: x[..., 2], k=2.0)),
}


def _case(name):
    make, kw = CASES[name]
    space = make()
    assert space.mesh.num_hanging_nodes > 0
    rng = np.random.default_rng(5)
    if kw == "per-cell":
        nc = space.mesh.num_cells
        kw = dict(f=rng.random(nc), k=1 + rng.random(nc), b=rng.random((nc, 2)), c=rng.random(nc))
    return space, rng.standard_normal(space.num_dofs), kw


@pytest.mark.parametrize("name", sorted(CASES))
def test_cpu_backend_is_the_default_path(name):
    space, u, kw = _case(name)
    ref = residual_indicators(space, u, parts=True, **kw)
    for backend in ("cpu", get_backend("cpu")):
        out = residual_indicators(space, u, parts=True, backend=backend, **kw)
        for a, b in zip(out, ref):
            assert isinstance(a, np.ndarray)
            np.testing.assert_array_equal(a, b)


def test_cpu_backend_elasticity_is_the_default_path():
    space = Space(adaptive_box(3, 0, 2), 1, 3)
    u = np.random.default_rng(3).standard_normal(space.num_dofs)
    kw = dict(f=lambda x: x ** 2, traction=lambda x, n: x * n[..., :1], neumann_ids=[0, 3])
    np.testing.assert_array_equal(elasticity_indicators(space, u, 1.5, 0.7, backend="cpu", **kw),
                                  elasticity_indicators(space, u, 1.5, 0.7, **kw))


def test_bad_backend():
    space, u, kw = _case("q1-poisson")
    with pytest.raises(ValueError, match="backend"):
        residual_indicators(space, u, backend="tpu", **kw)


def _close(new, ref, what):
    assert isinstance(new, np.ndarray), f"{what}: {type(new).__name__} is not a NumPy array"
    err = np.abs(new - ref).max() / np.abs(ref).max()
    assert err < RTOL, f"{what}: relative difference {err:.2e} ({err / EPS:.0f} eps)"


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("on_device", [False, True], ids=["u-host", "u-device"])
def test_gpu_matches_cpu(name, on_device):
    gpu = get_backend("gpu")
    space, u, kw = _case(name)
    ref = residual_indicators(space, u, parts=True, **kw)
    out = residual_indicators(space, gpu.asarray(u) if on_device else u, parts=True, backend=gpu, **kw)
    for new, r, what in zip(out, ref, ("eta", "cell part", "face part")):
        _close(new, r, f"{name} {what}")


@pytest.mark.gpu
@pytest.mark.parametrize("kw", [
    dict(),
    dict(f=np.array([1.0, 2.0, 3.0]), traction=lambda x, n: x * n[..., :1], neumann_ids=[0]),
    dict(f=lambda x: x ** 2, traction=np.array([0.0, 1.0, 2.0]), neumann_ids=[1, 3]),
], ids=["plain", "const-f", "callable-f"])
def test_gpu_elasticity_3d_matches_cpu(kw):
    gpu = get_backend("gpu")
    space = Space(adaptive_box(3, 0, 2), 1, 3)
    assert space.mesh.num_hanging_nodes > 0
    u = np.random.default_rng(3).standard_normal(space.num_dofs)
    ref = elasticity_indicators(space, u, 1.5, 0.7, **kw)
    _close(elasticity_indicators(space, gpu.asarray(u), 1.5, 0.7, backend="gpu", **kw), ref, "elasticity")


@pytest.mark.gpu
def test_gpu_q2_elasticity_2d_and_several_chunks(monkeypatch):
    """Small device chunks, so that the chunk loops (and the deferred det check) run several times."""
    import adaptmg.estimate.residual as residual
    gpu = get_backend("gpu")
    space = Space(adaptive_box(2, 1, 3), 2, 2)
    u = np.random.default_rng(4).standard_normal(space.num_dofs)
    ref = elasticity_indicators(space, u, 2.0, 1.0, f=lambda x: x, traction=[1.0, 0.5], neumann_ids=[0, 2])
    orig = residual.device_chunk
    monkeypatch.setattr(residual, "device_chunk", lambda *a, **k: min(7, orig(*a, **k)))
    _close(elasticity_indicators(space, u, 2.0, 1.0, f=lambda x: x, traction=[1.0, 0.5], neumann_ids=[0, 2],
                                 backend=gpu), ref, "q2 elasticity")


def test_deferred_determinant_check(backend):
    """The device path checks det J > 0 of all chunks once at the end (meshes with a non-positive
    det J at a vertex are rejected when built, so the flags are tested directly)."""
    from adaptmg.estimate.evaluation import check_determinants
    xp = backend.xp
    ok = [(xp.ones(5) > 0).all() for _ in range(3)]
    check_determinants([])
    check_determinants(ok)
    for bad in ([(xp.zeros(4) > 0).all()], ok + [(xp.asarray([1.0, np.nan]) > 0).all()]):
        with pytest.raises(ValueError, match="non-positive Jacobian"):
            check_determinants(bad)
