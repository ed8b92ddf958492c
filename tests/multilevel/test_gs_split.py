"""The split Gauss-Seidel plan (adaptmg/device/gs_split.py, BLOCK_LAYOUT "split"): each colour's
node rows split into the couplings to lower and to higher colours, and a half-product stored by
one update of a colour and read back by its next one.

Checked: the split layout is SciPy's BSR of the colour's rows, partitioned by the colour of the
column node (host and stand-in device); every sweep kind, omega, sweep count and start equals
the reference colour updates (SciPy row slices, the same colour order) within 100 eps, on the
host twin and with the kernel's CUDA source on host threads; a half that is read back equals
the product computed afresh at that update (the schedule never reuses a stale half); the
schedule's reads of A: a symmetric sweep 1.5 passes, from zero 1; the multigrid V-cycle and CG
with the split plan equal the full-row plan's (iterations, contraction).
"""
import os
import sys

import numpy as np
import pytest
import scipy.sparse as sp

from adaptmg.backend import CPU, to_host
from adaptmg.device import gs_kernels, gs_split
from adaptmg.device.gs_split import COMPUTE, READ, ZERO, SplitColoredSweep
from adaptmg.multilevel.gauss_seidel import _ADJOINT, GaussSeidel

sys.path.insert(0, os.path.dirname(__file__))
from test_gs_device_setup import (CASES, EPS, colour_bound, device, record_host_reads,  # noqa: E402,F401
                                  reference_rows, reference_sweep)


def _setup(case, be, **kw):
    make, c = CASES[case]
    A = make()
    sm = GaussSeidel(be.asmatrix(A) if be.is_gpu else A, block_size=c, backend=be, **kw)
    return A, c, sm


@pytest.fixture
def split(monkeypatch):
    monkeypatch.setattr(gs_kernels, "BLOCK_LAYOUT", "split")


@pytest.mark.parametrize("where", ["host", "stand_in_device"])
@pytest.mark.parametrize("case", ["point-9", "block-3"])
def test_split_blocks_are_the_rows_bsr_by_column_colour(request, split, case, where):
    """Per colour: lower blocks (column colour < k) first, then higher ones, each in column
    order; with the diagonal blocks they are exactly SciPy's BSR of ``A[rows]``.  On the
    stand-in device the smoother's set-up copies no array of size n to the host."""
    be = request.getfixturevalue("device") if where != "host" else CPU
    with pytest.MonkeyPatch.context() as mp:
        sizes = record_host_reads(mp) if be.is_gpu else []
        A, c, sm = _setup(case, be)
    # the device set-up reads nothing longer than the colour counts (no array of size n)
    assert max(sizes, default=0) <= colour_bound(A, c), sorted(sizes)[-5:]
    colour = np.empty(A.shape[0] // c, dtype=np.int64)
    for k, g in enumerate(sm._groups):
        colour[to_host(g)] = k
    parts = gs_split.split_blocks(be.asmatrix(A) if be.is_gpu else A, sm._groups, c)
    for k, (g, (nodes, bptr, nlow, bcol, bval, dval), (_, S)) in enumerate(
            zip(sm._groups, parts, reference_rows(A, sm._groups, c))):
        nodes, bptr, nlow, bcol, bval, dval = map(to_host, (nodes, bptr, nlow, bcol, bval, dval))
        assert bptr.dtype == nlow.dtype == bcol.dtype == np.int32
        np.testing.assert_array_equal(nodes, to_host(g))
        B = S.tobsr(blocksize=(c, c))
        B.sort_indices()
        vals = bval.reshape(-1, c, c)
        for t in range(nodes.shape[0]):
            cols, lo = bcol[bptr[t]:bptr[t + 1]], nlow[t]
            assert (colour[cols[:lo]] < k).all() and (colour[cols[lo:]] > k).all()
            assert (np.diff(cols[:lo]) > 0).all() and (np.diff(cols[lo:]) > 0).all()
            ref = dict(zip(B.indices[B.indptr[t]:B.indptr[t + 1]], B.data[B.indptr[t]:B.indptr[t + 1]]))
            np.testing.assert_array_equal(dval.reshape(-1, c, c)[t], ref.pop(nodes[t]))
            assert sorted(ref) == sorted(cols)
            for j, v in zip(cols, vals[bptr[t]:bptr[t + 1]]):
                np.testing.assert_array_equal(v, ref[j])


@pytest.mark.parametrize("where", ["host", "stand_in_device"])
@pytest.mark.parametrize("case", ["point-27", "block-3", "block-2"])
def test_split_sweeps_equal_the_colour_updates(request, split, monkeypatch, case, where):
    """smooth / smooth_adjoint of every sweep kind, omega 1 and 1.3, 1-3 sweeps, from x0 and
    from zero: the colour updates with SciPy row slices in the same order, within 100 eps, and
    smooth's ``residual`` b - A x within 100 eps (device: the kernel source on host threads,
    the default threads per row with the prefetching kernel, and one thread a row without it)."""
    be = request.getfixturevalue("device") if where != "host" else CPU
    make, c = CASES[case]
    A = make()
    kw = {"block_size": c}
    rng = np.random.default_rng(4)
    x0, b = rng.standard_normal(A.shape[0]), rng.standard_normal(A.shape[0])
    tprs = (None, 1) if be.is_gpu else (None,)
    for tpr in tprs:
        monkeypatch.setattr(gs_kernels, "THREADS_PER_ROW", tpr)
        monkeypatch.setattr(gs_split, "PREFETCH_MAX_THREADS", 0 if tpr == 1 else 1 << 17)
        kinds = (("forward", 1.0), ("symmetric", 1.0), ("backward", 1.3), ("symmetric", 1.3))
        for sweep, omega in kinds[1::2] if be.is_gpu else kinds:        # host threads are slow
            sm = GaussSeidel(be.asmatrix(A) if be.is_gpu else A, sweep=sweep, omega=omega, backend=be, **kw)
            assert isinstance(sm._plan, SplitColoredSweep) and sm._plan._host == (not be.is_gpu)
            for sweeps in (1, 2, 3) if not be.is_gpu else (2,):
                for zero in (False, True):
                    for f, kind in ((sm.smooth, sweep), (sm.smooth_adjoint, _ADJOINT[sweep])):
                        x, r = be.asarray(x0.copy()), be.asarray(np.full_like(x0, np.nan))
                        res = {"residual": r} if f == sm.smooth else {}   # and r = b - A x
                        f(x, be.asarray(b), sweeps, zero_initial=zero, **res)
                        start = np.zeros_like(x0) if zero else x0.copy()
                        ref = reference_sweep(A, sm._groups, sm._inv, c, omega, sm._orders(kind, sweeps), start, b)
                        err = np.abs(to_host(x) - ref).max() / np.abs(ref).max()
                        assert err <= 100 * EPS, (tpr, sweep, omega, sweeps, zero, err / EPS)
                        if res:
                            rerr = np.abs(to_host(r) - (b - A @ ref)).max() / (abs(A) @ np.abs(ref)).max()
                            assert rerr <= 100 * EPS, (tpr, sweep, omega, sweeps, zero, rerr / EPS)


def test_a_half_read_back_equals_the_product_afresh(split, monkeypatch):
    """Each update that reads a half from the store: the stored values equal ``L_k x`` /
    ``U_k x`` of the x at that update within 20 eps, and a ZERO half is the product of zeros
    (symmetric and forward sweeps, omega 1 and 1.3, from zero and not)."""
    A, c, _ = _setup("block-3", CPU)
    rng = np.random.default_rng(8)
    x0, b = rng.standard_normal(A.shape[0]), rng.standard_normal(A.shape[0])
    seen = {READ: 0, ZERO: 0}
    for sweep, omega in (("symmetric", 1.0), ("symmetric", 1.3), ("forward", 1.0)):
        sm = GaussSeidel(A, sweep=sweep, omega=omega, block_size=c)
        plan = sm._plan
        run = SplitColoredSweep.color

        def checked(self, k, x, b, omega, lo=COMPUTE, up=COMPUTE, save=0, out=None):
            for mode, M in ((lo, self._L[k]), (up, self._U[k])):
                fresh = M @ x
                scale = np.abs(M).max() * np.abs(x).max() * M.shape[1] / M.shape[0] + 1e-300
                if mode == READ:
                    assert np.abs(self._h[self._rows[k]] - fresh).max() <= 20 * EPS * scale
                elif mode == ZERO:
                    assert not fresh.any()
                if mode != COMPUTE:
                    seen[mode] += 1
            return run(self, k, x, b, omega, lo, up, save, out)
        monkeypatch.setattr(SplitColoredSweep, "color", checked)
        for zero in (False, True):
            x, r = x0.copy(), np.empty_like(x0)
            sm.smooth(x, b, 3, zero_initial=zero, residual=r)
        monkeypatch.setattr(SplitColoredSweep, "color", run)
        assert plan.ncolors >= 4
    assert seen[READ] > 0 and seen[ZERO] > 0


def test_schedule_reads_half_passes_after_the_first_sweep():
    """The schedule of K colours (integers, exact): a symmetric sweep (turning colour merged)
    computes 2K - 2 halves less than two full one-way sweeps: every update after the first K
    computes one half; from zero the first forward sweep computes only lower halves; repeated
    forward sweeps reuse nothing (between two updates of a colour both halves change)."""
    K = 6
    fwd = tuple(range(K))
    sym = fwd + fwd[::-1][1:]
    steps = gs_split._schedule(sym + sym[1:], K, False)
    assert [s[0] for s in steps] == list(sym + sym[1:])
    computed = [(lo == COMPUTE) + (up == COMPUTE) for _, lo, up, _ in steps]
    # first sweep: both halves (colour 0 and K - 1 have one each), then one per update
    assert computed[:K] == [1] + [2] * (K - 2) + [1]
    assert computed[K:] == [1] * (len(steps) - K)
    zero = gs_split._schedule(sym, K, True)
    assert [(lo, up) for _, lo, up, _ in zero[:K]] == [(ZERO, ZERO)] + [(COMPUTE, ZERO)] * (K - 1)
    assert all(sum(m == COMPUTE for m in s[1:3]) == 1 for s in zero[K:])
    assert all(m != READ for s in gs_split._schedule(fwd * 3, K, False) for m in s[1:3])
    # every read half was saved by the colour's previous update, which computed it
    for order, z in ((sym * 2, False), (sym, True), (fwd + fwd[::-1], False)):
        prev = {}
        for k, lo, up, save in gs_split._schedule(order, K, z):
            for h, mode in enumerate((lo, up)):
                if mode == READ:
                    assert prev[k] == h + 1
            if save:
                prev[k] = save
            assert save == 0 or (lo, up)[save - 1] == COMPUTE


def test_residual_from_the_stored_halves():
    """smooth(..., residual=r): r = b - A x of the smoothed x within 20 eps, for the split plan
    (from its stored halves: after a symmetric or backward sweep every colour's upper half is
    read back, colour K-1 has none, colour 0 no lower one), for the full-row plan and l1 GS (one
    residual pass after the sweeps); x is the same as without ``residual``."""
    from adaptmg.multilevel.gauss_seidel import L1GaussSeidel
    A, c, _ = _setup("block-3", CPU)
    rng = np.random.default_rng(11)
    x0, b = rng.standard_normal(A.shape[0]), rng.standard_normal(A.shape[0])
    for layout in ("split", "bsr", "l1"):
        for sweep, omega, zero in (("symmetric", 1.0, True), ("backward", 1.3, False), ("forward", 1.0, False)):
            before, gs_kernels.BLOCK_LAYOUT = gs_kernels.BLOCK_LAYOUT, "bsr" if layout == "bsr" else "split"
            try:
                sm = (L1GaussSeidel(A, sweep=sweep, omega=omega, partition_rows=40) if layout == "l1" else
                      GaussSeidel(A, sweep=sweep, omega=omega, block_size=c))
            finally:
                gs_kernels.BLOCK_LAYOUT = before
            assert sm.forms_residual == (layout == "split")
            x, y, r = x0.copy(), x0.copy(), np.full_like(x0, np.nan)
            sm.smooth(x, b, 2, zero_initial=zero, residual=r)
            sm.smooth(y, b, 2, zero_initial=zero)
            np.testing.assert_array_equal(x, y)
            ref = b - A @ x
            assert np.abs(r - ref).max() <= 20 * EPS * (abs(A) @ np.abs(x)).max(), (layout, sweep)
            if layout == "split" and sweep != "forward":
                K = sm.ncolors
                res = sm._plan.schedule(sm._orders(sweep, 2), zero, True)[-K:]
                assert [s[1:] for s in res] == [(ZERO, READ, 3)] + [(COMPUTE, READ, 3)] * (K - 2) + [(COMPUTE, ZERO, 3)]


def test_one_launch_residual_on_the_device(device, split):
    """After a forward, backward or symmetric sweep (from x0 or zero) the residual steps share
    their modes up to colour 0's empty lower and colour K-1's empty upper half, and the device
    plan forms r = b - A x in one launch over every row (kernel source on host threads): equal
    to the host twin's x and to b - A x within 100 eps.  A sequence whose residual modes differ
    is not merged."""
    A, c, _ = _setup("block-3", CPU)
    rng = np.random.default_rng(12)
    x0, b = rng.standard_normal(A.shape[0]), rng.standard_normal(A.shape[0])
    for sweep in ("forward", "backward", "symmetric"):
        host = GaussSeidel(A, sweep=sweep, block_size=c)
        dev = GaussSeidel(device.asmatrix(A), sweep=sweep, block_size=c, backend=device)
        for zero in (False, True):
            steps = dev._plan.schedule(dev._orders(sweep, 1), zero, True)
            assert dev._plan._one_residual(steps) is not None
            xh, xd, r = x0.copy(), device.asarray(x0), device.asarray(np.full_like(x0, np.nan))
            host.smooth(xh, b, 1, zero_initial=zero)
            dev.smooth(xd, device.asarray(b), 1, zero_initial=zero, residual=r)
            assert np.abs(to_host(xd) - xh).max() <= 100 * EPS * np.abs(xh).max()
            ref = b - A @ xh
            assert np.abs(to_host(r) - ref).max() <= 100 * EPS * (abs(A) @ np.abs(xh)).max(), (sweep, zero)
    K = dev.ncolors
    mixed = gs_split._schedule((0, K - 1, 1), K, False, True)        # colour 1: lower read, 2: computed
    assert dev._plan._one_residual(mixed) is None


def test_reads_of_a_symmetric_v22_fine_level(split):
    """Blocks of A read by V(2,2)'s fine-level smoothing with symmetric sweeps (pre from zero,
    post from the corrected x), in passes over A: the full-row plan about 2 (4K - 3) / K, the
    split plan 2 + 2.5 passes of the off-diagonal blocks (each one-way sweep after the first
    reads half of them: every coupling is the lower half of one colour and the upper of another)
    and the diagonal blocks of every update."""
    A, c, sm = _setup("block-3", CPU)
    plan, K = sm._plan, sm.ncolors
    full = sum(nb for nb, _ in plan.blocks) + sum(plan.sizes)
    order = sm._orders("symmetric", 2)
    pre, post = plan.reads(order, True) / full, plan.reads(order, False) / full
    off = sum(nb for nb, _ in plan.blocks) / full
    assert len(order) == 4 * K - 3
    # every update reads its diagonal blocks; the off-diagonal ones: half a pass per one-way
    # sweep, one more half for the first sweep when it does not start from zero
    diag = sum(plan.sizes[k] for k in order) / full
    assert pre == pytest.approx(diag + 2 * off, rel=1e-12)
    assert post == pytest.approx(diag + 2.5 * off, rel=1e-12)
    rows = sum(plan.blocks[k][0] + plan.sizes[k] for k in order) / full     # the full-row plan
    assert rows == pytest.approx(diag + (4 * K - 3) / K * off, rel=0.1)
    assert pre + post < 0.7 * 2 * rows
    # the restriction's residual from the stored halves: the lower halves only
    res = plan.reads(order, True, residual=True) / full - pre
    assert res == pytest.approx(sum(plan.sizes) / full + off / 2, rel=1e-12)


def test_multigrid_with_split_gs_equals_full_rows(monkeypatch):
    """3-D elasticity-like block system: the V(2,2) preconditioned CG with split block GS takes
    the same iterations as with the full-row plan, and one V-cycle agrees within 1e3 eps."""
    import adaptmg
    from adaptmg import Space, assemble
    from adaptmg.mesh import Mesh
    m = Mesh.box([0] * 3, [1] * 3, [2] * 3).refine()
    m = m.refine(np.flatnonzero(m.points[m.cells].mean(1)[:, 0] < 0.25))      # hanging nodes
    space = Space(m, 1, components=3)
    form = lambda s: assemble.elasticity(s, 8e4, 2e4)        # noqa: E731
    out = {}
    for layout in ("bsr", "split"):
        monkeypatch.setattr(gs_kernels, "BLOCK_LAYOUT", layout)
        ml = adaptmg.multigrid(space, form, dirichlet="all", smoother="block_gauss_seidel",
                               near_nullspace="rigid_body", backend="cpu")   # the host path (GPU: below)
        assert isinstance(ml._dev[-1].smoother._plan, SplitColoredSweep) == (layout == "split")
        n = ml.A.shape[0]
        b = np.random.default_rng(3).standard_normal(n)
        b[~ml.constraints[-1].free] = 0.0
        its = []
        x = ml.solve(b, rtol=1e-8, accel="cg", callback=lambda xk: its.append(1))
        out[layout] = (len(its), ml.aspreconditioner().matvec(b), x)
    assert out["split"][0] == out["bsr"][0] and out["bsr"][0] <= 30
    v, w = out["split"][1], out["bsr"][1]
    assert np.abs(v - w).max() <= 1e3 * EPS * np.abs(w).max()


def test_split_layout_refuses_what_it_cannot_do(split):
    A = sp.identity(4, format="csr") * 2.0
    with pytest.raises(ValueError, match="layout must be one of"):
        gs_kernels.make_colored_sweep(A, [np.arange(4)], 0.5 * np.ones(4), layout="ell")
    # complex matrices keep the xp twin of the full-row plan
    sm = GaussSeidel((A * (1 + 1j)).tocsr())
    assert not isinstance(sm._plan, SplitColoredSweep)


# --------------------------------------------------------------------------- GPU
@pytest.mark.gpu
@pytest.mark.parametrize("dtype,tol", [(np.float64, 1e3 * EPS), (np.float32, 1e3 * np.finfo(np.float32).eps)])
def test_gpu_split_sweeps_equal_the_host_twin_and_the_bsr_plan(dtype, tol, monkeypatch):
    """On a real device: the split kernel (c = 1, 2, 3, 6) gives the host twin's and the full-row
    BSR plan's sweeps (forward / symmetric, omega 1 / 1.3, from x0 and from zero) within tol."""
    from adaptmg.assemble.testing import tensor_q1_stiffness
    from adaptmg.backend import get_backend
    from test_gs_device_setup import vector_spd
    gpu = get_backend("gpu")
    for c in (1, 2, 3, 6):
        A = tensor_q1_stiffness(10, 3) if c == 1 else vector_spd(9, c, seed=c)
        rng = np.random.default_rng(c)
        x0, b = rng.standard_normal(A.shape[0]).astype(dtype), rng.standard_normal(A.shape[0]).astype(dtype)
        for sweep, omega in (("forward", 1.0), ("symmetric", 1.0), ("symmetric", 1.3)):
            out = {}
            for layout, be in (("split", gpu), ("split", CPU), ("bsr", gpu), ("split-noprefetch", gpu)):
                monkeypatch.setattr(gs_kernels, "BLOCK_LAYOUT", layout.split("-")[0])
                monkeypatch.setattr(gs_split, "PREFETCH_MAX_THREADS", 0 if "-" in layout else 1 << 17)
                sm = GaussSeidel(be.asmatrix(A) if be.is_gpu else A, sweep=sweep, omega=omega, block_size=c,
                                 backend=be, dtype=dtype)
                assert isinstance(sm._plan, SplitColoredSweep) == layout.startswith("split")
                for zero in (False, True):
                    x = be.asarray(x0.copy())
                    sm.smooth(x, be.asarray(b), 2, zero_initial=zero)
                    out[layout, be.name, zero] = to_host(x)
            for zero in (False, True):
                ref = out["split", "cpu", zero]
                for key in (("split", "gpu", zero), ("bsr", "gpu", zero), ("split-noprefetch", "gpu", zero)):
                    err = np.abs(out[key] - ref).max() / np.abs(ref).max()
                    assert err <= tol, (c, sweep, omega, key, err)


@pytest.mark.gpu
def test_gpu_split_cycle_is_a_graph_with_the_cpu_iterations_and_never_synchronises(monkeypatch):
    """On a real device, BLOCK_LAYOUT "split": the V-cycle with symmetric GS is captured as a CUDA
    graph, CG takes the CPU's iterations, the graph equals the eager cycle, and no cycle syncs."""
    cupyx = pytest.importorskip("cupyx")
    from adaptmg.backend import get_backend
    from adaptmg.linalg import cg
    from adaptmg.multilevel import MultilevelSolver
    from test_gauss_seidel import _tensor_hierarchy
    monkeypatch.setattr(gs_kernels, "BLOCK_LAYOUT", "split")
    gpu = get_backend("gpu")
    As, Ps = _tensor_hierarchy(3, 2, 4)
    n = As[-1].shape[0]
    b = np.random.default_rng(9).standard_normal(n)
    mc = MultilevelSolver.from_matrices(As, Ps, backend="cpu", smoother="gauss_seidel")
    mg = MultilevelSolver.from_matrices(As, Ps, backend=gpu, smoother="gauss_seidel")
    assert isinstance(mg._dev[-1].smoother._plan, SplitColoredSweep)
    its_c, its_g = [], []
    cg(As[-1], b, rtol=1e-8, M=mc.aspreconditioner(), callback=lambda xk: its_c.append(1))
    Mg = mg.aspreconditioner()
    assert Mg.graph, mg.graph_error
    _, info = cg(gpu.asmatrix(As[-1]), gpu.asarray(b), rtol=1e-8, M=Mg, callback=lambda xk: its_g.append(1))
    assert info == 0 and len(its_g) == len(its_c)
    r = gpu.asarray(np.random.default_rng(10).standard_normal(n))
    ze, zg = to_host(mg.aspreconditioner(graph=False).matvec(r)), to_host(Mg.matvec(r))
    assert np.abs(zg - ze).max() <= 1e-12 * np.abs(ze).max()
    if hasattr(cupyx, "allow_synchronize"):
        x = gpu.xp.zeros(n)
        gpu.synchronize()
        with cupyx.allow_synchronize(False):
            for cyc in ("V", "W"):
                mg.cycle(r, x, cycle=cyc)
        gpu.synchronize()


def test_colour_count_on_the_bench_mesh_family():
    """The node-graph colouring of issue 4's elasticity meshes (scripts/bench_elasticity_gs.py,
    make_mesh(case, 2)): 14 colours, seeds 0-2 (15 at size 10 on the H200: 15 launches a one-way
    sweep); at least 8, the 2 x 2 x 2 node clique of a hexahedron."""
    import adaptmg
    from adaptmg import Space, assemble
    from adaptmg.multilevel.coloring import check_coloring, color_graph
    from adaptmg_problems import elasticity as el
    for case in ("edge", "face", "vertex"):
        space = Space(el.make_mesh(case, 2), 1, components=3)
        ml = adaptmg.multigrid(space, lambda s: assemble.elasticity(s, el.LAMBDA, el.MU), dirichlet="all",
                               smoother="block_jacobi", max_levels=1, max_coarse=None, coarse="smoother")
        A = ml._dev[-1].A
        for seed in range(3):
            col = color_graph(A, 3, seed=seed)
            assert check_coloring(A, col, 3)
            assert 8 <= int(col.max()) + 1 <= 15, (case, seed, int(col.max()) + 1)
