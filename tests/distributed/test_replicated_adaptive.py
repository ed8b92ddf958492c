"""adaptmg.distributed.adaptive_loop_replicated: the adaptive loop with the mesh on every rank
and the distributed solve reproduces the CPU loop on one rank (meshes, iterations, estimates,
errors) on 1-3 ranks, on the CPU and under the NumPy stand-in for CuPy with NCCL; on two real
devices with ``-m gpu``.  Worker: replicated_adaptive_cases.py."""
import os

import numpy as np
import pytest

from test_forest import worker_records
from test_mpi import needs_mpi

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "replicated_adaptive_cases.py")


def _check(r, its_slack):
    """Against the CPU loop on one rank: the same meshes, estimates and errors; iterations within
    ``its_slack`` (the distributed GPU cycle is another preconditioner than the serial one)."""
    ref = r["ref"]
    assert r["cells"] == ref["cells"] and r["dofs"] == ref["dofs"], r
    assert all(i == 0 for i in r["info"]), r
    for k in ("estimate", "err_L2", "err_H1"):
        assert np.allclose(r[k], ref[k], rtol=1e-8, atol=0), (k, r[k], ref[k])
    assert max(abs(a - b) for a, b in zip(r["iterations"], ref["iterations"])) <= its_slack, \
        (r["iterations"], ref["iterations"])
    # the loop converges: the H1 error of the last step below the first, DoFs growing
    assert r["err_H1"][-1] < 0.5 * r["err_H1"][0] and all(np.diff(r["dofs"]) > 0), r


@pytest.fixture(scope="module", params=[1, 2, 3], ids=["np1", "np2", "np3"])
def replicated_results(request, tmp_path_factory):
    return request.param, worker_records(WORKER, request.param, tmp_path_factory.mktemp("replicated"))


@needs_mpi
def test_replicated_loop_reproduces_the_one_rank_loop(replicated_results):
    P, recs = replicated_results
    r = recs[("cpu", "loop")]
    assert r["P"] == P
    _check(r, its_slack=1)
    assert r["phases"] == sorted(f"t_{p}" for p in ("mesh", "setup", "partition", "solve", "gather",
                                                    "estimate", "mark", "refine"))


@needs_mpi
def test_device_path_under_a_stand_in_with_nccl(replicated_results):
    """np2: a device mesh on each of two stand-in devices, the solution gathered and the marks
    broadcast through the NCCL stand-in: the one-rank loop's meshes and numbers."""
    P, recs = replicated_results
    if P != 2:
        pytest.skip("run under mpiexec -n 2 only")
    r = recs[("fake-gpu", "loop")]
    assert r["device"]
    _check(r, its_slack=1)


@needs_mpi
@pytest.mark.gpu
def test_on_the_devices(tmp_path, monkeypatch):
    monkeypatch.setenv("ADAPTIVE_REPLICATED_GPU", "1")
    r = worker_records(WORKER, 2, tmp_path)[("gpu", "loop")]
    assert r["device"]
    _check(r, its_slack=2)


@pytest.mark.parametrize("kw, match", [
    (dict(theta=0.0), "theta must lie in"), (dict(steps=-1), "steps must be"), (dict(max_dofs=0), "max_dofs"), (dict(max_dofs=1e5), "max_dofs must be None or a positive integer"),
    (dict(exact=3.0), "exact must be None or a callable"), (dict(goal="x"), "goal must be"),
    (dict(tie_rtol=2.0), "tie_rtol"), (dict(local_setup=False), "local set-up"),
])
def test_bad_arguments_are_refused(kw, match):
    pytest.importorskip("mpi4py")
    from adaptmg import Mesh
    from adaptmg.distributed import adaptive_loop_replicated
    mesh = Mesh.box([0, 0], [1, 1], [2, 2]).refine()
    with pytest.raises(ValueError, match=match):
        adaptive_loop_replicated(mesh, 1.0, **kw)
    with pytest.raises(ValueError, match="expects an adaptmg Mesh"):
        adaptive_loop_replicated("mesh", 1.0)
