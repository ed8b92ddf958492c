"""The vector-valued (elasticity) multigrid set-up on the device (issue 36).

``multigrid(space, functools.partial(assemble.elasticity, lam=.., mu=..), backend="gpu")``:
the partial takes ``device`` and ``keep_on_device``, so multigrid asks for a device matrix;
``elasticity`` expands its node-block fields to a cupyx CSR on the device
(:func:`~adaptmg.fe.csr_ops.expand_node_blocks`) and every level is constrained there
(:func:`adaptmg.fe.constraints._device_matrix`: the device congruence, then the device
masking).  On the CPU these device branches run on the stand-in CuPy of
``tests/distributed/fake_cupy.py`` (the ``fake_gpu`` fixture: NumPy arithmetic, device ->
host copies counted); the GPU tests run them on CuPy.

What must hold: the kept CSR is the host CSR (same pattern, explicit zeros included; values
to a few eps -- the device computes the element matrices with the full quadrature rule,
the host with its affine shortcut); constraining the same matrix on the device gives the
host's constrained matrix (indices exactly, values to a few eps) by either device
congruence (cuSPARSE products, or the expansion that matrices of more than
``SPGEMM_MAX_NNZ`` entries -- the 1.7M-DoF elasticity of ``bench_elasticity_gs.py`` --
take); and multigrid's levels on the device equal the CPU's.
"""
import functools

import numpy as np
import pytest
import scipy.sparse as sp

import adaptmg
from adaptmg import assemble
from adaptmg.backend import get_backend, is_device_sparse, to_host
from adaptmg.multilevel.hierarchy import _on_backend

EPS = np.finfo(np.float64).eps
LAM, MU = 8.0e4, 2.0e4


def _mesh(refine=2, radius=0.3):
    """A 3-D box refined ``refine`` times, then once around (0.3, 0.3, 0.3): hanging nodes
    (refine=2: 974 cells, 4,185 DoFs of 3 components, above the device assembly's minimum)."""
    m = adaptmg.Mesh.box([0.0] * 3, [1.0] * 3, [2] * 3)
    for _ in range(refine):
        m = m.refine()
    c = m.points[m.cells].mean(axis=1)
    return m.refine(np.linalg.norm(c - 0.3, axis=1) < radius)


def _form():
    return functools.partial(assemble.elasticity, lam=LAM, mu=MU)


def _canonical(A):
    A = sp.csr_matrix(to_host(A), copy=True)
    A.sum_duplicates()
    A.sort_indices()
    return A


def _assert_same(A, B, ulps, drop=0.0):
    """Values within ``ulps`` eps of the largest |entry| and equal patterns after canonical
    ordering -- with ``drop``, of the entries above ``drop`` times the largest |entry|: a sum
    that cancels (an elasticity entry whose exact value is 0) may round to exactly 0 on one
    path, which drops it, and to ~1e-18 of the largest entry on the other."""
    A, B = _canonical(A), _canonical(B)
    scale = abs(A).max()
    err = abs(A - B).max()
    assert err <= ulps * EPS * scale, err / (EPS * scale)
    if drop:
        A, B = (M.multiply(abs(M) > drop * scale).tocsr() for M in (A, B))
        A.sort_indices()
        B.sort_indices()
    np.testing.assert_array_equal(A.indptr, B.indptr)
    np.testing.assert_array_equal(A.indices, B.indices)


@pytest.fixture(params=["products", "expansion"])
def congruence(request, monkeypatch):
    """Which device congruence ``_device_matrix`` takes: cuSPARSE-style products, or (as for
    matrices of more than SPGEMM_MAX_NNZ entries) the expansion without SpGEMM."""
    if request.param == "expansion":
        from adaptmg.fe import congruence as cg
        monkeypatch.setattr(cg, "SPGEMM_MAX_NNZ", -1)
    return request.param


@pytest.mark.parametrize("device_fields", [True, False])
def test_kept_csr_is_the_host_csr(fake_gpu, monkeypatch, device_fields):
    """elasticity(..., device=gpu, keep_on_device=True) with format "csr": a device CSR with
    the host pattern (explicit zeros kept) and values, the scalar mass too; nothing copied
    down (fields computed on the device, or -- small meshes -- on the host and moved up)."""
    from adaptmg.assemble import forms
    monkeypatch.setattr(forms, "MIN_DEVICE_ENTRIES", 0 if device_fields else 1 << 40)
    space = adaptmg.Space(_mesh(1), 1, components=3)
    assert space.mesh.num_hanging_nodes > 0
    lam = np.linspace(1.0e4, 3.0e4, space.mesh.num_cells)           # per-cell: the general path
    A, M = assemble.elasticity(space, lam, MU, return_mass=True)
    gets = fake_gpu.device_to_host()
    B, N = assemble.elasticity(space, lam, MU, return_mass=True, device="gpu", keep_on_device=True)
    B1 = assemble.elasticity(space, lam, MU, device="gpu", keep_on_device=True)
    assert fake_gpu.device_to_host() == gets
    for P, Q in ((A, B), (M, N), (A, B1)):
        assert type(Q) is fake_gpu.csr_matrix and Q.has_canonical_format
        assert Q.shape == P.shape
        np.testing.assert_array_equal(P.indptr, np.asarray(Q.indptr))
        np.testing.assert_array_equal(P.indices, np.asarray(Q.indices))
        ulps = 64 if device_fields else 0                           # the same host fields: exact
        assert np.abs(P.data - np.asarray(Q.data)).max() <= ulps * EPS * np.abs(P.data).max()


def test_kept_bsr_is_refused_with_a_clear_error(fake_gpu):
    space = adaptmg.Space(_mesh(1), 1, components=3)
    with pytest.raises(ValueError, match="keep_on_device=True takes format='csr' or 'fields', got 'bsr'"):
        assemble.elasticity(space, LAM, MU, format="bsr", device="gpu", keep_on_device=True)
    with pytest.raises(ValueError, match="keep_on_device=True needs a GPU device"):
        assemble.elasticity(space, LAM, MU, device="cpu", keep_on_device=True)


def test_device_constraints_of_the_elasticity_csr_equal_the_host_ones(fake_gpu, congruence):
    """``Constraints.matrix`` of a device CSR of a 3-component space with hanging nodes and
    Dirichlet on the whole boundary: the device congruence and masking give the host's
    constrained matrix -- indices exactly, values to a few eps -- and the same scale s."""
    from adaptmg.multilevel.hierarchy import _level_constraints
    space = adaptmg.Space(_mesh(1), 1, components=3)
    A = assemble.elasticity(space, LAM, MU)
    ch = _level_constraints(space, "all")
    cd = _level_constraints(space, "all")
    assert space.hanging_nodes.size and ch.dirichlet.size and not ch.free.all()
    K = ch.matrix(A)
    gets = fake_gpu.device_to_host()
    Kd = cd.matrix(fake_gpu.csr_matrix(A))
    assert fake_gpu.device_to_host() == gets
    if congruence == "expansion":                   # written against xp throughout: stays a device CSR
        assert is_device_sparse(Kd)
    _assert_same(K, Kd, 16, drop=EPS)
    assert abs(ch.scale - cd.scale) <= 4 * EPS * ch.scale


def test_partial_of_elasticity_is_asked_for_a_device_matrix(fake_gpu):
    """A plain partial has both keywords: multigrid asks it for a device matrix, which it
    now builds (it raised "keep_on_device=True needs format='fields'" before)."""
    be = get_backend("gpu")
    on = _on_backend(_form(), be)
    assert on.keywords["device"] is be and on.keywords["keep_on_device"] is True
    space = adaptmg.Space(_mesh(1), 1, components=3)
    assert is_device_sparse(on(space))
    lam_only = lambda s: assemble.elasticity(s, LAM, MU)                # noqa: E731
    assert _on_backend(lam_only, be) is lam_only                       # a lambda: as is (host path)


def test_multigrid_levels_on_the_device_equal_the_cpu_ones(fake_gpu, congruence, monkeypatch):
    """multigrid of a 3-D elasticity mesh with hanging nodes on the stand-in GPU: every level
    assembled and constrained by the device branches (``_device_matrix`` once a level), and
    the levels -- matrices, transfers, block-Jacobi omega -- equal the CPU's; no array comes
    back to the host."""
    from adaptmg.fe import constraints as C
    space = adaptmg.Space(_mesh(2), 1, components=3)
    assert space.mesh.num_hanging_nodes > 0
    kw = dict(dirichlet="all", smoother="block_jacobi", near_nullspace="rigid_body", coarse_max_rows=None)
    cpu = adaptmg.multigrid(space, _form(), backend="cpu", **kw)
    calls = []
    orig = C._device_matrix
    monkeypatch.setattr(C, "_device_matrix", lambda cons, A, be=None: calls.append(A.shape) or orig(cons, A, be))
    gets = fake_gpu.device_to_host()
    gpu = adaptmg.multigrid(space, _form(), backend="gpu", **kw)
    assert fake_gpu.device_to_host() == gets
    assert is_device_sparse(gpu.assembled)
    assert len(cpu.levels) == len(gpu.levels) >= 3
    assert sorted(calls) == sorted(lev.A.shape for lev in cpu.levels)   # every level on the device
    for lc, lg, dc, dg in zip(cpu.levels, gpu.levels, cpu._dev, gpu._dev):
        # the finest level's device fields round differently from the host's affine path: entries
        # that cancel to 0 on the host may be ~1e-16 of the largest there (dropped before comparing)
        _assert_same(lc.A, dg.A, 64, drop=64 * EPS)
        if lc.P is not None:
            _assert_same(lc.P, dg.P, 0)
            _assert_same(lc.R, dg.R, 0)
        if dc.smoother is not None:
            assert abs(dc.smoother.omega - dg.smoother.omega) <= 1e-6 * dc.smoother.omega


@pytest.mark.gpu
def test_gpu_elasticity_setup_equals_the_cpu_one(congruence):
    """On the GPU: the partial's levels are built and constrained on the device (cupyx
    matrices throughout, either device congruence) and equal the CPU's; CG with the V-cycle
    gives the CPU's solution."""
    space = adaptmg.Space(_mesh(3, 0.25), 1, components=3)
    kw = dict(dirichlet="all", smoother="block_jacobi", near_nullspace="rigid_body", coarse_max_rows=None)
    cpu = adaptmg.multigrid(space, _form(), backend="cpu", **kw)
    gpu = adaptmg.multigrid(space, _form(), backend="gpu", **kw)
    assert is_device_sparse(gpu.assembled)
    assert len(cpu.levels) == len(gpu.levels) >= 3
    for lc, lg, dc, dg in zip(cpu.levels, gpu.levels, cpu._dev, gpu._dev):
        assert is_device_sparse(lg.A)
        _assert_same(lc.A, lg.A, 256, drop=256 * EPS)
        if lc.P is not None:
            _assert_same(lc.P, lg.P, 4)
        if dc.smoother is not None:
            assert abs(dc.smoother.omega - dg.smoother.omega) <= 1e-6 * dc.smoother.omega
    b = np.random.default_rng(3).standard_normal(space.num_dofs)
    b[~cpu.constraints[-1].free] = 0.0
    xc = cpu.solve(b, rtol=1e-10, accel="cg")
    xg = to_host(gpu.solve(get_backend("gpu").asarray(b), rtol=1e-10, accel="cg"))
    assert np.abs(xc - xg).max() <= 1e-7 * np.abs(xc).max()


@pytest.mark.gpu
def test_gpu_elasticity_setup_reads_back_o_levels_bytes():
    """The elasticity set-up reads back O(levels) bytes (the bound of
    tests/multilevel/test_setup_host_reads.py), at two sizes (8x the cells: no growth)."""
    from adaptmg.device.host_reads import available, count_host_reads
    if not available():
        pytest.skip("needs sys.monitoring (Python 3.12+)")
    per_level = base = 16 * 1024
    be = get_backend("gpu")
    out = []
    for refine in (3, 4):
        space = adaptmg.Space(_mesh(refine, 0.2), 1, components=3)
        adaptmg.multigrid(space, _form(), backend=be, smoother="block_jacobi")     # warm: kernels compiled
        with count_host_reads() as reads:
            ml = adaptmg.multigrid(space, _form(), backend=be, smoother="block_jacobi",
                                   near_nullspace="rigid_body")
        be.synchronize()
        assert reads.calls >= len(ml.levels), reads.report()
        assert reads.bytes <= per_level * len(ml.levels) + base, f"{space.num_dofs} DoFs:\n{reads.report()}"
        out.append((len(ml.levels), reads.bytes))
    (l0, b0), (l1, b1) = out
    assert 8 * space.num_dofs > 2 * (per_level * l1 + base)          # one fine vector would not fit
    assert b1 <= b0 + per_level * max(l1 - l0, 1), out
