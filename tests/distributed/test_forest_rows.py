"""Owned matrix rows from the distributed forest (issue 37 item 3): :mod:`adaptmg.distributed.forest_rows`.

``forest_rows_cases.py`` runs under ``mpiexec -n 1 / 2 / 3`` (one launch each, ~1-2 s): 2-D
and 3-D boxes refined uniformly and locally (hanging nodes) and an unstructured hex mesh of
data/ refined uniformly and locally, each after the refinements and
after a weighted repartition that moves the cuts through the refined corner (hanging nodes
whose parents another rank owns).  The gathered owned rows, mapped to the serial mesh's nodes
through their coordinates, equal the serial ``stiffness(Space(mesh))`` and the serial
``Constraints(space, boundary_dofs()).matrix(A)``, also with Dirichlet on one side only
(a ``where`` predicate) (same pattern, entries within a few eps of
max |A|: the assembly order differs), and the same ``s``.  Two controls show the tests can
fail: the owned rows without the ghost leaves' contributions, and the constrained rows from
one ghost layer alone (no entries sent to the rows' owners), are far off.
"""
import os

import numpy as np
import pytest

from test_forest import worker_records
from test_mpi import needs_mpi

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "forest_rows_cases.py")
CASES = ["uniform-2d", "uniform-3d", "local-2d", "local-3d", "imported-3d"]
STAGES = ["refined", "weighted"]
CASE_STAGE = [(c, s) for c in CASES for s in STAGES]
TOL = 16                    # units of eps * max |A|


@pytest.fixture(scope="module", params=[1, 2, 3], ids=["np1", "np2", "np3"])
def rows_results(request, tmp_path_factory):
    return request.param, worker_records(WORKER, request.param, tmp_path_factory.mktemp("forest_rows"))


@needs_mpi
@pytest.mark.parametrize("case, stage", CASE_STAGE)
def test_owned_rows_equal_serial_matrix(rows_results, case, stage):
    """Unconstrained rows from owned + ghost leaves: every global row once, the serial
    pattern, entries within TOL eps; without the ghosts (P > 1) far off."""
    P, rec = rows_results[0], rows_results[1][(case, stage)]
    assert rec["P"] == P and rec["ids_map_bad"] == 0 and rec["gids_sorted"] and rec["shapes_ok"]
    assert rec["A_nnz"][0] == rec["A_nnz"][1]
    assert rec["A_err"] <= TOL
    if case.startswith("local"):
        assert rec["hanging"] >= 50
    if P > 1:
        assert rec["ghostless_err"] > 1e6


@needs_mpi
@pytest.mark.parametrize("case, stage", CASE_STAGE)
def test_constrained_rows_equal_serial_constrained_matrix(rows_results, case, stage):
    """Z H^T A H Z + s (I - Z): the serial pattern, entries, free count and scale s, with
    Dirichlet on the whole boundary and on the face x_0 = min only."""
    rec = rows_results[1][(case, stage)]
    assert rec["same_gids"]
    assert rec["K_nnz"][0] == rec["K_nnz"][1]
    assert rec["nfree"][0] == rec["nfree"][1]
    assert rec["K_err"] <= TOL and rec["s_err"] <= TOL
    assert rec["nfixed_w"] > 0 and rec["Kw_err"] <= TOL and rec["sw_err"] <= TOL


@needs_mpi
@pytest.mark.parametrize("case", ["local-2d", "local-3d", "imported-3d"])
def test_constrained_rows_need_entries_from_other_ranks(rows_results, case):
    """After the weighted cut, hanging nodes have parents on other ranks, and the owned rows of
    H^T A H from the local mesh alone (one ghost layer) are wrong there: the entries sent to
    the rows' owners are what makes the rows above exact."""
    P, recs = rows_results
    if P == 1:
        pytest.skip("one rank")
    rec = recs[(case, "weighted")]
    assert rec["cross_rank_hanging"] > 0
    assert rec["one_layer_K_err"] > 1e6
    assert rec["K_err"] <= TOL


def test_bad_input():
    from adaptmg.distributed.forest import DistributedForest
    from adaptmg.distributed.forest_rows import owned_constrained_rows, owned_rows
    from adaptmg.mesh import Mesh
    with pytest.raises(TypeError, match="DistributedForest"):
        owned_rows(Mesh.box([0, 0], [1, 1], [2, 2]))
    df = DistributedForest.box([0, 0], [1, 1], [2, 2])
    with pytest.raises(ValueError, match="Q1 scalar"):
        owned_rows(df, assemble=lambda s: None)
    with pytest.raises(ValueError, match="dirichlet"):
        owned_constrained_rows(df, dirichlet="nowhere")


def test_renamed_columns_equal_unique():
    """prepare's column renaming: np.unique(gid[cols], return_inverse=True) for an injective
    gid, also with an unsorted gid; a non-injective control differs."""
    from adaptmg.distributed.forest_rows import _renamed_columns
    rng = np.random.default_rng(3)
    gid = np.concatenate([40 + np.arange(30), rng.permutation(np.r_[0:40, 70:100])])   # owned run + others
    cols = rng.integers(0, gid.size, 400)
    u, inv = _renamed_columns(cols, gid)
    ru, rinv = np.unique(gid[cols], return_inverse=True)
    np.testing.assert_array_equal(u, ru)
    np.testing.assert_array_equal(inv, rinv.reshape(-1))
    assert inv.dtype.kind == "i" and u.size == np.unique(cols).size
