"""The reduction hook of adaptmg.linalg._vectorops (no MPI needed: a fake 'allreduce')."""
import numpy as np
import pytest

from adaptmg.backend import CPU
from adaptmg.linalg._vectorops import VectorOps, global_norm, global_reductions


def test_hook_completes_every_reduction_and_is_scoped():
    """With allreduce = 'times 3' (three identical ranks), dot, mdot, the accumulated mdot
    and global_norm are 3x (sqrt 3 x) the local values; outside the block they are local."""
    rng = np.random.default_rng(0)
    V, w = rng.standard_normal((4, 40)), rng.standard_normal(40)
    ops = VectorOps(CPU, 40, np.float64, rows=4)
    calls = []

    def triple(a):
        calls.append(a.shape)
        return 3.0 * a

    out, acc = np.zeros(4), np.ones(4)
    with global_reductions(triple):
        d = ops.dot(V[0], w)
        ops.mdot(V, w, out, acc=acc)
        nrm = global_norm(np, w)
    eps = np.finfo(float).eps
    ref = V @ w
    assert abs(d - 3 * ref[0]) <= 16 * eps * np.abs(ref).max() * 3
    assert np.abs(out - 3 * ref).max() <= 16 * eps * np.abs(ref).max() * 3
    assert np.abs(acc - 1 - 3 * ref).max() <= 16 * eps * (1 + 3 * np.abs(ref).max())
    assert abs(nrm - np.sqrt(3) * np.linalg.norm(w)) <= 16 * eps * nrm
    assert calls == [(1,), (4,), (1,)]                 # one reduction per group
    assert abs(ops.dot(V[0], w) - ref[0]) <= 16 * eps * np.abs(ref).max()   # local again
    assert global_norm(np, w) == float(np.linalg.norm(w))


def test_hook_rejects_a_non_callable():
    with pytest.raises(TypeError, match="allreduce must be a callable"):
        with global_reductions(3):
            pass
