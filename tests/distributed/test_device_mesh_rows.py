"""The per-rank set-up on a mesh on the device (issue 37), on the CPU under the stand-in CuPy
(``tests/distributed/fake_cupy.py`` with the strict stand-in's scatters: the ``fake`` fixture of
``tests/estimate/test_adaptive_device_mesh.py``).  One process plays every rank of a 2- and a
3-rank partition: the partition, the DoF owners, each rank's rows of ``K = Z H^T A H Z + s (I -
Z)``, of ``Z H^T`` (the right-hand side) and of ``P`` and ``R`` computed from ``mesh.to("gpu")``
must equal those from the host mesh -- integers exactly, floats within a few eps -- and stay
device arrays."""
import pathlib
import sys

import numpy as np
import pytest
import scipy.sparse as sp

from adaptmg import assemble, multigrid
from adaptmg.distributed import dof_owners, partition_cells
from adaptmg.distributed.csr import Layout, split_rows
from adaptmg.distributed.local import local_constrained_rows, local_transfer_rows
from adaptmg.distributed.partition import coarse_cell_ranks, curve_order, fold_cell_ranks
from adaptmg.fe import Constraints, Space
from adaptmg.mesh import Mesh
from adaptmg.multilevel.hierarchy import dirichlet_dofs

HERE = pathlib.Path(__file__).resolve().parent
sys.path.append(str(HERE.parent / "estimate"))      # (appended: no shadowing of other basenames)
from test_adaptive_device_mesh import fake, strict  # noqa: E402,F401  (the stand-in fixtures)
from test_local_setup import RankOf, _mesh  # noqa: E402

EPS = np.finfo(float).eps


def _h(a):
    return a.get() if hasattr(a, "get") else a if sp.issparse(a) else np.asarray(a)


def _close(dev, host, units=16, pattern=False):
    """Sparse ``dev`` (device stand-in) equals host ``host`` within ``units`` eps of the largest
    entry.  ``pattern=True``: also the same stored pattern (integers: exact) -- for the
    constraint and transfer rows, whose entries are sums of products of small dyadic weights
    (the two paths form them by different operations, hence the few-eps value tolerance);
    otherwise the device congruence's cancellations may leave round-off entries where the
    host's products leave none."""
    d, h = sp.csr_matrix(_h(dev)), sp.csr_matrix(host)
    d.sum_duplicates(), h.sum_duplicates()
    assert d.shape == h.shape
    if pattern:
        d.sort_indices(), h.sort_indices()
        assert np.array_equal(d.indptr, h.indptr) and np.array_equal(d.indices, h.indices)
    scale = max(abs(h).max(), 1e-300) if h.nnz else 1.0
    assert abs(d - h).max() <= units * EPS * scale, abs(d - h).max() / scale


def _spaces(mesh, degree):
    fine = Space(mesh, degree)
    coarse = Space(mesh.hierarchy()[-2], degree)
    return coarse, fine


CASES = [(2, 3, 1), (3, 1, 1), (3, 1, 2)]
IDS = ["q1-2d", "q1-3d", "q2-3d"]


@pytest.mark.parametrize("size", [2, 3])
@pytest.mark.parametrize("dim,L", [(2, 3), (3, 1)], ids=["2d", "3d"])
def test_partition_and_owners_on_a_device_mesh_equal_the_host_ones(strict, dim, L, size):
    """Under the strict stand-in (no NumPy call on a device array, no repeated-index scatter
    by assignment): curve order, cell ranks, the coarse votes, the folds and the DoF owners of
    the device mesh are the host mesh's integers, computed and kept on the device, with O(1)
    host reads per refinement level."""
    hm = _mesh(dim, L)
    dm = hm.to("gpu")
    (hc, hf), (dc, df) = _spaces(hm, 1), _spaces(dm, 1)
    before = strict.host_values()
    dr = partition_cells(dm, size)
    dcr = coarse_cell_ranks(df.mesh, dc.mesh, dr, size)
    folds = [fold_cell_ranks(dc.mesh, dcr, k) for k in (1, size - 1)]
    do, dco = dof_owners(df, dr), dof_owners(dc, dcr)
    values, calls = np.subtract(strict.host_values(), before)
    assert values <= 64 and calls <= 64, (values, calls)        # scalars only, not O(cells)
    for a in [dr, dcr, do, dco] + folds:
        assert isinstance(a, strict.ndarray)
    hr = partition_cells(hm, size)
    hcr = coarse_cell_ranks(hf.mesh, hc.mesh, hr, size)
    assert np.array_equal(_h(curve_order(dm)), curve_order(hm))
    assert np.array_equal(_h(dr), hr) and np.array_equal(_h(dcr), hcr)
    for got, k in zip(folds, (1, size - 1)):
        assert np.array_equal(_h(got), fold_cell_ranks(hc.mesh, hcr, k))
    assert np.array_equal(_h(do), dof_owners(hf, hr)) and np.array_equal(_h(dco), dof_owners(hc, hcr))


def test_layout_of_device_owners_equals_the_host_layout(strict):
    """A :class:`Layout` of device owners keeps rows / local positions on the device, equal to
    the host layout's; its owners and positions of a few (ghost) indices come to the host
    through gathers of those only, and its host arrays are copies made on first use."""
    rng = np.random.default_rng(3)
    owner = rng.integers(0, 3, 5000)
    g = rng.choice(5000, 40, replace=False)
    for r in range(3):
        h, d = Layout(owner, RankOf(r, 3)), Layout(strict.xp.asarray(owner), RankOf(r, 3))
        assert d.n == h.n and np.array_equal(d.counts, h.counts)
        assert isinstance(d.rows_on(strict.xp), strict.ndarray)
        assert np.array_equal(_h(d.rows_on(strict.xp)), h.rows)
        assert np.array_equal(_h(d.local_on(strict.xp)), h.local)
        before = strict.host_values()
        assert np.array_equal(d.owner_of(g), h.owner_of(g))
        assert np.array_equal(d.local_index(np, g), h.local_index(np, g))
        assert np.subtract(strict.host_values(), before)[0] <= 2 * g.size       # O(g), not O(N)
        assert np.array_equal(d.rows, h.rows) and np.array_equal(d.local, h.local)
        assert np.array_equal(d.owner, h.owner)
    with pytest.raises(ValueError, match="ranks in"):
        Layout(strict.xp.asarray(owner), RankOf(0, 2))


@pytest.mark.parametrize("dim,L,degree", CASES, ids=IDS)
@pytest.mark.parametrize("size", [2, 3])
def test_rank_rows_on_a_device_mesh_equal_the_host_rows(fake, dim, L, degree, size):
    """Every rank's rows of K (within 16 eps of its largest entry), of Z H^T, P and R (exactly)
    and its assembled cells from the device mesh equal the host mesh's."""
    hm = _mesh(dim, L)
    dm = hm.to("gpu")
    (hc, hf), (dc, df) = _spaces(hm, degree), _spaces(dm, degree)
    hr, dr = partition_cells(hm, size), partition_cells(dm, size)
    hcr, dcr = (coarse_cell_ranks(f.mesh, c.mesh, r, size) for f, c, r in ((hf, hc, hr), (df, dc, dr)))
    ho, do = dof_owners(hf, hr), dof_owners(df, dr)
    hco, dco = dof_owners(hc, hcr), dof_owners(dc, dcr)
    hfree = Constraints(hf, dirichlet_dofs(hf, "all")).free
    hcfree = Constraints(hc, dirichlet_dofs(hc, "all")).free
    dfree, dcfree = (Constraints(s, dirichlet_dofs(s, "all")).free for s in (df, dc))
    b = assemble.load(hf, 1.0)
    for r in range(size):
        comm = RankOf(r, size)
        hK, hHT, hcells = local_constrained_rows(hf, assemble.stiffness, hfree, ho, comm)
        dK, dHT, dcells = local_constrained_rows(df, assemble.stiffness, dfree, do, comm, backend="gpu")
        assert np.array_equal(_h(dcells), hcells)
        assert isinstance(dK, fake.csr_matrix) and isinstance(dHT, fake.csr_matrix)
        _close(dK, hK)
        _close(dHT, hHT, units=4, pattern=True)
        hP, hR, _ = local_transfer_rows(hc, hf, hcfree, hfree, hco, ho, r)
        dP, dR, _ = local_transfer_rows(dc, df, dcfree, dfree, dco, do, r)
        assert isinstance(dP, fake.csr_matrix) and isinstance(dR, fake.csr_matrix)
        _close(dP, hP, units=4, pattern=True)
        _close(dR, hR, units=4, pattern=True)
        # split= (the hierarchy's call): the device rows split for the DistCSRs as they are read
        # out of P and its transpose -- the host rows' split, integers exactly
        for whole in (None, False):
            sP, sR, _ = local_transfer_rows(dc, df, dcfree, dfree, dco, do, r, whole=whole,
                                            split=(Layout(dco, comm), Layout(do, comm)))
            for got, M, owners in ((sP, hP, hco), (sR, hR, ho)):
                want = split_rows(M, Layout(owners, comm))
                assert got.shape == want.shape
                for k, (a, w) in enumerate(zip(got.parts, want.parts)):
                    assert a.dtype == w.dtype
                    if k in (2, 5):          # values: the few eps of the two paths
                        assert np.abs(_h(a) - w).max(initial=0.0) <= 4 * EPS
                    else:
                        assert np.array_equal(_h(a), w)
        assert np.abs(_h(dHT @ fake.xp.asarray(b)) - hHT @ b).max() <= 8 * EPS * np.abs(b).max()


def test_distributed_solve_on_a_device_mesh_equals_the_host_mesh_solve(tmp_path):
    """``mpiexec -n 2`` of ``device_mesh_cases.py``: the whole distributed solve (local set-up,
    Q1 2-D, Q2 3-D, a folded level; the replicated set-up) from a mesh on the stand-in device takes the host mesh's
    iterations and solution (relative 1e-11; measured <= 6e-14), and its finest level's blocks,
    smoother data, right-hand side rows and owned solution are device data."""
    import json
    import os
    import subprocess
    from test_mpi import MPIEXEC, ROOT, mpiexec_cmd
    if MPIEXEC is None:
        pytest.skip("mpi4py or mpiexec not available")
    out = tmp_path / "out.json"
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", ADAPTMG_THREADS="1",
               PYTHONPATH=ROOT + os.pathsep + str(HERE) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("ADAPTMG_HALO_TRANSPORT", None)
    r = subprocess.run(mpiexec_cmd(2) + [sys.executable, str(HERE / "device_mesh_cases.py"), str(out)],
                       env=env, capture_output=True, text=True, timeout=180, cwd=ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    recs = json.loads(out.read_text())
    assert sorted(recs) == ["q1-2d", "q1-2d-folded", "q1-2d-replicated", "q2-3d"]
    for name, rec in recs.items():
        assert rec["info"] == 0 and rec["its"] == rec["its_host"], (name, rec)
        assert rec["rel"] <= 1e-11, (name, rec["rel"])
        assert rec["blocks"] == ["cupyx.scipy.sparse._csr"] * 3 and all(rec["device_layouts"])
        # the local set-up's rhs rows Z H^T on the device (the replicated one: the serial constrain)
        assert rec["rhs"] == (None if name.endswith("replicated") else "cupyx.scipy.sparse._csr")
        # entries copied device -> host by the set-up besides its halo exchanges' send buffers
        # (2-D Q1, 2359 DoFs): the local set-up's ghost lists and the small level on rank 0,
        # measured 452-912 per rank; the replicated set-up copies the serial levels (~4 N)
        if name.endswith("replicated"):
            assert min(rec["setup_values"]) > rec["dofs"], rec["setup_values"]
        elif name.startswith("q1-2d"):
            assert max(rec["setup_values"]) < 0.5 * rec["dofs"], (name, rec["setup_values"])
        assert rec["smoother"].startswith("cupy") and rec["u"] == "ndarray"
