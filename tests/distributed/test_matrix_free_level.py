"""The finest level applied without a matrix (``solve(..., matrix_free=True)``,
:class:`adaptmg.distributed.matrix_free.DistMatrixFree`): on 1-3 CPU ranks (and two devices with
``-m gpu``) its products and diagonal equal the assembled level's to round-off, the solves take
the same iterations and give the same solution.  Worker: matrix_free_cases.py."""
import os

import numpy as np
import pytest

from test_forest import worker_records
from test_mpi import needs_mpi

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "matrix_free_cases.py")
EPS = np.finfo(float).eps


def _check(rec, P):
    assert rec["P"] == P and rec["type"] == "DistMatrixFree"
    assert rec["info"] == [0, 0]
    # the same operator: the products and diagonals agree to round-off (other summation order)
    assert rec["product"] < 200 * EPS, rec
    assert rec["diagonal"] < 200 * EPS, rec
    assert rec["its"][0] == rec["its"][1], rec
    assert rec["u"] < 1e-9, rec
    if P > 1:                       # a rank's cells: its own plus the layer, not the whole mesh
        assert rec["ghosts"] > 0 and rec["cells"] < rec["mesh_cells"], rec


@pytest.fixture(scope="module", params=[1, 2, 3], ids=["np1", "np2", "np3"])
def mf_results(request, tmp_path_factory):
    return request.param, worker_records(WORKER, request.param, tmp_path_factory.mktemp("mf"))


@needs_mpi
@pytest.mark.parametrize("case", ["2d", "3d", "3d-folded", "2d-two-sides", "3d-chebyshev"])
def test_matrix_free_level_equals_the_assembled_one(mf_results, case):
    P, recs = mf_results
    rec = recs[(case, "cpu")]
    _check(rec, P)
    if case.endswith("folded") and P > 1:      # a matrix-free level on fewer ranks than P
        assert min(rec["active_ranks"][1:]) < P == rec["active_ranks"][-1], rec


@needs_mpi
@pytest.mark.gpu
def test_matrix_free_level_on_the_devices(tmp_path, monkeypatch):
    monkeypatch.setenv("MATRIX_FREE_GPU", "1")
    recs = worker_records(WORKER, 2, tmp_path)
    for case in ("2d", "3d", "3d-folded", "2d-two-sides", "3d-chebyshev"):
        _check(recs[(case, "gpu")], 2)


@pytest.mark.parametrize("kw, match", [
    (dict(assemble="mass"), "assemble must be adaptmg.assemble.stiffness"),
    (dict(degree=2), "scalar Q1 space"),
    (dict(local_setup=False), "needs the local set-up"),
    (dict(galerkin=True), "needs the local set-up"),
    (dict(matrix_free="yes"), "matrix_free must be True or False"),
])
def test_matrix_free_refuses_what_it_cannot_apply(kw, match):
    pytest.importorskip("mpi4py")
    from adaptmg import assemble
    from adaptmg.distributed import solve
    from adaptmg.fe import Space
    from adaptmg.mesh import Mesh
    space = Space(Mesh.box([0, 0], [1, 1], [2, 2]).refine(), kw.pop("degree", 1))
    form = getattr(assemble, kw.pop("assemble", "stiffness"))
    kw.setdefault("matrix_free", True)
    with pytest.raises(ValueError, match=match):
        solve(space, form, np.ones(space.num_dofs), **kw)
