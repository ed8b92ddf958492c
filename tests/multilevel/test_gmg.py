"""Geometric multigrid on adaptive meshes (issue 3 must-shows), CPU and GPU."""
import warnings

import numpy as np
import pytest

import adaptmg
from adaptmg import assemble
from adaptmg.mesh import Mesh

RNG = np.random.default_rng(7)


def poisson_mesh(dim, L, local):
    m = Mesh.box([0] * dim, [1] * dim, [4 if dim == 2 else 2] * dim)
    for _ in range(L):
        m = m.refine()
    if local:                      # two rounds of local refinement around a point: hanging nodes
        for j in range(2):
            c = m.points[m.cells].mean(1)
            m = m.refine(np.linalg.norm(c - 0.3, axis=1) < 0.25 / (j + 1))
        assert m.num_hanging_nodes > 0
    return m


def convergence_factor(ml, cycles=10, cycle="V"):
    """Geometric mean residual reduction of the stationary iteration on A x = 0."""
    n = ml.A.shape[0]
    x0 = RNG.standard_normal(n)
    x0[~ml.constraints[-1].free] = 0.0
    be = ml.backend
    res = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ml.solve(be.asarray(np.zeros(n)), x0=be.asarray(x0), rtol=1e-300, maxiter=cycles,
                 residuals=res, cycle=cycle)
    res = [float(r) for r in res]
    assert len(res) == cycles + 1
    return (res[-1] / res[0]) ** (1.0 / cycles)


@pytest.mark.parametrize("local", [False, True], ids=["uniform", "hanging"])
@pytest.mark.parametrize("dim,levels", [(2, [3, 4, 5, 6]), (3, [2, 3, 4])])
def test_vcycle_jacobi_poisson_factor(backend, dim, levels, local):
    """V(2,2)-Jacobi: factor <= 0.2 and not growing with the number of levels."""
    fs = []
    for L in levels:
        # the whole hierarchy (no direct solve on a 2000-row level, the GPU default): the
        # property under test is the cycle's level independence
        ml = adaptmg.multigrid(poisson_mesh(dim, L, local), assemble.stiffness, backend=backend,
                               coarse_max_rows=None)
        fs.append(convergence_factor(ml))
    assert max(fs) <= 0.2, fs
    for a, b in zip(fs[:-1], fs[1:]):
        assert b <= 1.1 * a + 0.02, fs


def test_block_jacobi_elasticity_level_independent(backend):
    """3-D elasticity (lambda = 8e4, mu = 2e4, clamped at x = 0), hanging nodes, block Jacobi:
    V(2,2) factor about 0.45 on every level (stated bound 0.55)."""
    fs = []
    for L in (1, 2):
        m = Mesh.box([0] * 3, [1] * 3, [2] * 3)
        for _ in range(L):
            m = m.refine()
        m = m.refine(np.flatnonzero(m.points[m.cells].mean(1)[:, 0] < 0.25))
        ml = adaptmg.multigrid(adaptmg.Space(m, 1, 3), lambda s: assemble.elasticity(s, 8e4, 2e4),
                               dirichlet=0, smoother="block_jacobi", backend=backend, coarse_max_rows=None)
        fs.append(convergence_factor(ml))
    assert max(fs) <= 0.55, fs
    assert fs[1] <= 1.1 * fs[0] + 0.02, fs


def test_galerkin_and_rediscretised_agree_on_nested_hierarchy():
    m = poisson_mesh(2, 3, True)
    f_re = convergence_factor(adaptmg.multigrid(m, assemble.stiffness, backend="cpu"))
    f_ga = convergence_factor(adaptmg.multigrid(m, assemble.stiffness, galerkin=True, backend="cpu"))
    assert f_re <= 0.2 and f_ga <= 0.2
    assert abs(f_re - f_ga) < 0.05


def test_vcycle_is_symmetric_and_cg_converges(backend):
    m = poisson_mesh(2, 3, True)
    ml = adaptmg.multigrid(m, assemble.stiffness, backend=backend)
    M = ml.aspreconditioner()
    n = ml.A.shape[0]
    free = ml.constraints[-1].free
    x, y = RNG.standard_normal(n) * free, RNG.standard_normal(n) * free
    xd, yd = backend.asarray(x), backend.asarray(y)
    Mx = adaptmg.backend.to_host(M.matvec(xd))
    My = adaptmg.backend.to_host(M.matvec(yd))
    a, b = Mx @ y, x @ My
    assert abs(a - b) <= 1e-12 * abs(a)
    b_rhs = ml.constrain(assemble.load(ml.spaces[-1], lambda p: np.ones(p.shape[:-1])))
    its = []
    x = ml.solve(backend.asarray(b_rhs), rtol=1e-10, accel="cg", callback=lambda xk: its.append(1))
    r = b_rhs - ml.A @ adaptmg.backend.to_host(x)
    assert np.linalg.norm(r) <= 1e-10 * np.linalg.norm(b_rhs)
    assert len(its) <= 12


def test_q2_and_vector_spaces_converge():
    m = poisson_mesh(2, 2, True)
    ml = adaptmg.multigrid(adaptmg.Space(m, 2), assemble.stiffness, backend="cpu")
    assert convergence_factor(ml) < 0.5            # Q2 with point Jacobi: converges, level count 4+
    ml = adaptmg.multigrid(adaptmg.Space(m, 1, 2), assemble.stiffness, smoother="block_jacobi",
                           backend="cpu")
    assert convergence_factor(ml) <= 0.2


def test_print_shows_levels_and_complexity():
    ml = adaptmg.multigrid(poisson_mesh(2, 2, True), assemble.stiffness, backend="cpu")
    text = repr(ml)
    nnz = [lev.A.nnz for lev in ml.levels]
    assert f"{sum(nnz) / nnz[-1]:.3f}" in text
    for lev in ml.levels:
        assert str(lev.A.shape[0]) in text and str(lev.meta["cells"]) in text


@pytest.mark.gpu
def test_cpu_and_gpu_iterates_agree():
    from adaptmg.backend import to_host
    m = poisson_mesh(2, 3, True)
    mls = [adaptmg.multigrid(m, assemble.stiffness, backend=b, coarse_max_rows=None) for b in ("cpu", "gpu")]
    b = mls[0].constrain(assemble.load(mls[0].spaces[-1], lambda p: np.sin(p[..., 0]) + p[..., 1]))
    outs = []
    for ml in mls:
        xs = []
        ml.solve(ml.backend.asarray(b), rtol=1e-10, maxiter=20, callback=lambda xk: xs.append(to_host(xk).copy()))
        outs.append(xs)
    # same count although the GPU orders its reductions differently: the residuals bracketing the
    # stop are about 10 and 0.83 rtol on both (H100), far outside their ~1e-6 relative gap
    assert len(outs[0]) == len(outs[1])
    for a, g in zip(*outs):
        assert np.linalg.norm(a - g) <= 1e-10 * np.linalg.norm(a)


def test_bad_input():
    m = poisson_mesh(2, 1, False)
    with pytest.raises(TypeError, match="Space or a Mesh"):
        adaptmg.multigrid("mesh", assemble.stiffness)
    with pytest.raises(TypeError, match="assemble"):
        adaptmg.multigrid(m, None)
    with pytest.raises(ValueError, match="must return a"):
        adaptmg.multigrid(m, lambda s: np.eye(3))
    with pytest.raises(ValueError, match="dirichlet"):
        adaptmg.multigrid(m, assemble.stiffness, dirichlet="left")
    ml = adaptmg.multigrid(m, assemble.stiffness, backend="cpu")
    n = ml.A.shape[0]
    with pytest.raises(ValueError, match="shape"):
        ml.solve(np.ones(n + 1))
    with pytest.raises(ValueError, match="NaN|finite|Inf"):
        ml.solve(np.full(n, np.nan))
    with pytest.raises(ValueError, match="rtol"):
        ml.solve(np.ones(n), rtol=-1.0)
    with pytest.raises(ValueError, match="cycle"):
        ml.solve(np.ones(n), cycle="Z")


@pytest.mark.parametrize("galerkin", [False, True])
def test_threaded_setup_is_identical_and_calls_assemble_in_order(galerkin, monkeypatch):
    """Per-level set-up on worker threads gives the same levels, bit for bit, as threads=1
    (hanging nodes, Dirichlet rows, both coarse-operator kinds); ``assemble`` runs in the
    calling thread, finest level first; bad thread counts are a ValueError."""
    import threading

    def build(threads):
        calls = []

        def A(space):
            calls.append((threading.get_ident(), space.num_dofs))
            return assemble.stiffness(space)
        ml = adaptmg.multigrid(poisson_mesh(2, 2, True), A, backend="cpu", galerkin=galerkin, threads=threads)
        return ml, calls
    ml1, c1 = build(1)
    ml4, c4 = build(4)
    assert c1 == c4 and {t for t, _ in c4} == {threading.get_ident()}
    assert c4[0][1] == ml4.A.shape[0] and len(c4) == (1 if galerkin else len(ml4.levels))
    # exact: each level is built by the same deterministic code on the same inputs (SciPy sparse
    # products, element-wise NumPy; no BLAS call whose blocking could depend on threads), only
    # on another thread
    for a, b in zip(ml1.levels, ml4.levels):
        for X, Y in ((a.A, b.A), (a.P, b.P), (a.R, b.R)):
            if X is None:
                assert Y is None
                continue
            assert (X != Y).nnz == 0 and np.array_equal(X.indptr, Y.indptr) and np.array_equal(X.indices, Y.indices)
    for bad in (0, -2, 1.5, True):
        with pytest.raises(ValueError, match="threads must be"):
            adaptmg.multigrid(poisson_mesh(2, 1, False), assemble.stiffness, backend="cpu", threads=bad)
    monkeypatch.setenv("ADAPTMG_THREADS", "many")
    with pytest.raises(ValueError, match="ADAPTMG_THREADS"):
        adaptmg.multilevel.hierarchy.default_threads()
    monkeypatch.setenv("ADAPTMG_THREADS", "3")
    assert adaptmg.multilevel.hierarchy.default_threads() == 3


def test_coarse_max_rows_trims_the_cycle():
    """multigrid(coarse_max_rows=m): the cycle stops at the finest level with <= m rows and
    solves it directly; spaces/constraints stay aligned with the geometric levels; the
    iteration count stays that of the full hierarchy (+1)."""
    mesh = adaptmg.Mesh.box([0, 0], [1, 1], [1, 1])
    for _ in range(6):
        mesh = mesh.refine()
    counts = {}
    for cmr in (None, 300, 1200):
        ml = adaptmg.multigrid(mesh, assemble.stiffness, backend="cpu", coarse_max_rows=cmr)
        assert len(ml.spaces) == len(ml.levels) and ml.levels[-1].n == 4225
        assert ml.levels[0].P is None and ml.levels[0].n == {None: 4, 300: 289, 1200: 1089}[cmr]
        its = []
        x = ml.solve(np.ones(4225), rtol=1e-8, accel="cg", callback=its.append)
        assert np.linalg.norm(1 - ml.A @ x) <= 1e-8 * np.sqrt(4225)
        counts[cmr] = len(its)
    assert max(counts.values()) <= counts[None] + 1, counts
    # "auto" (the default) keeps every level on the CPU
    assert adaptmg.multigrid(mesh, assemble.stiffness, backend="cpu").levels[0].n == 4
    for bad in (0, "all", 2.5):
        with pytest.raises(ValueError, match="coarse_max_rows"):
            adaptmg.multigrid(mesh, assemble.stiffness, backend="cpu", coarse_max_rows=bad)


@pytest.mark.gpu
def test_gpu_default_solves_directly_on_the_finest_level_below_2000_rows():
    """multigrid's default coarse_max_rows="auto" on the GPU: the cycle ends in a dense
    direct solve on the finest level with <= GPU_COARSE_MAX_ROWS rows (the coarser levels are
    not built); the solution equals the CPU's full hierarchy's to the tolerance and the CG
    iterations are at most the CPU's."""
    from adaptmg.multilevel.hierarchy import GPU_COARSE_MAX_ROWS
    from adaptmg.backend import to_host
    mesh = adaptmg.Mesh.box([0, 0, 0], [1, 1, 1], [1, 1, 1])
    for _ in range(4):
        mesh = mesh.refine()
    cpu = adaptmg.multigrid(mesh, assemble.stiffness, backend="cpu")
    gpu = adaptmg.multigrid(mesh, assemble.stiffness, backend="gpu")
    assert [lev.n for lev in gpu.levels] == [729, 4913]
    assert len(gpu.spaces) == 2 and gpu.levels[0].n <= GPU_COARSE_MAX_ROWS
    assert [lev.n for lev in cpu.levels] == [8, 27, 125, 729, 4913]
    b = np.random.default_rng(0).standard_normal(4913)
    xc = cpu.solve(b, rtol=1e-10, accel="cg")
    xg = to_host(gpu.solve(b, rtol=1e-10, accel="cg"))
    assert gpu.last_iterations <= cpu.last_iterations
    assert np.linalg.norm(xg - xc) <= 1e-8 * np.linalg.norm(xc)


def test_constraints_with_values_reuse_the_hierarchy_row_scale():
    """ml.constraints[-1].with_values(g) gives the right-hand side of fresh Constraints(space,
    boundary, g) (whose matrix() call computes the same Dirichlet row scale) without a second
    congruence product, and the solve reproduces a bilinear g exactly (it is in Q1)."""
    mesh = adaptmg.Mesh.box([0, 0], [1, 1], [2, 2]).refine([0]).refine()
    space = adaptmg.Space(mesh, 1)
    assert space.hanging_nodes.size > 0
    ml = adaptmg.multigrid(space, assemble.stiffness, backend="cpu")
    g = lambda x: 1 + 2 * x[..., 0] - x[..., 1] + 3 * x[..., 0] * x[..., 1]
    A = ml.assembled
    con = ml.constraints[-1].with_values(g)
    ref = adaptmg.Constraints(space, space.boundary_dofs(), g)
    ref.matrix(A)
    b = np.zeros(space.num_dofs)
    np.testing.assert_allclose(con.rhs(b, A), ref.rhs(b, A), rtol=1e-14, atol=1e-14)
    assert not np.any(ml.constraints[-1].g)           # the hierarchy's own constraints are unchanged
    u = con.expand(ml.solve(con.rhs(b, A), rtol=1e-12, accel="cg"))
    assert np.abs(u - g(space.points)).max() < 1e-9


@pytest.mark.gpu
@pytest.mark.parametrize("dim", [2, 3])
def test_device_assembled_finest_level_is_constrained_on_the_device(dim):
    """An ``assemble`` that returns a cupyx matrix for the finest space (scalar_form with
    keep_on_device): the finest constrained matrix is built on the device and equals the host
    hierarchy's to round-off (hanging nodes: H^T A H by SpGEMM), the other levels and the row
    scale are the same, and the solve takes the same CG iterations to the same solution;
    Constraints.rhs lifts non-zero Dirichlet values with the device matrix as on the host."""
    from adaptmg.backend import get_backend, is_device_sparse, to_host
    gpu = get_backend("gpu")
    mesh = poisson_mesh(dim, 3 if dim == 2 else 2, True)
    space = adaptmg.Space(mesh, 1)
    kw = dict(mass=1.0, diffusion=0.5)

    def on_device(s):
        return assemble.scalar_form(s, device=gpu, keep_on_device=s is space, **kw)

    ml_h = adaptmg.multigrid(space, lambda s: assemble.scalar_form(s, **kw), backend=gpu)
    ml_d = adaptmg.multigrid(space, on_device, backend=gpu)
    assert is_device_sparse(ml_d.assembled) and is_device_sparse(ml_d.levels[-1].A)
    assert not is_device_sparse(ml_d.A)               # ml.A: the host copy
    Kh, Kd = ml_h.A, to_host(ml_d.A)
    assert Kd.has_canonical_format and Kd.shape == Kh.shape
    assert abs(Kh - Kd).max() <= 1e-13 * abs(Kh).max()
    assert ml_d.constraints[-1].scale == pytest.approx(ml_h.constraints[-1].scale, rel=1e-14)
    for lh, ld in zip(ml_h.levels[:-1], ml_d.levels[:-1]):
        assert abs(lh.A - ld.A).max() == 0
    b = gpu.asarray(RNG.standard_normal(space.num_dofs))
    b[gpu.asarray(~ml_h.constraints[-1].free)] = 0.0
    xh = to_host(ml_h.solve(b, rtol=1e-10, accel="cg"))
    its = ml_h.last_iterations
    xd = to_host(ml_d.solve(b, rtol=1e-10, accel="cg"))
    assert abs(ml_d.last_iterations - its) <= 1
    assert np.linalg.norm(xd - xh) <= 1e-8 * np.linalg.norm(xh)
    cons = adaptmg.Constraints(space, space.boundary_dofs(), values=lambda X: 1.0 + X[..., 0])
    Ah = assemble.scalar_form(space, **kw)
    f_h = cons.rhs(np.ones(space.num_dofs), Ah)
    cons.matrix(Ah)
    f_d = cons.rhs(np.ones(space.num_dofs), gpu.asmatrix(Ah))
    assert isinstance(f_d, np.ndarray) and np.allclose(f_d, f_h, rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("threads", [1, 2])
def test_setup_timeline_lists_every_task_once(threads):
    """``ml.setup_timeline``: one span per set-up task -- the hierarchy, a space, constraints,
    assembly and constraining per level, a transfer per level above the coarsest, the
    solver's own set-up last -- sorted by start, inside the call's wall time."""
    import time
    m = Mesh.box([0.0] * 2, [1.0] * 2, [2] * 2)
    for _ in range(4):
        m = m.refine()
    m = m.refine(m.points[m.cells].mean(axis=1)[:, 0] < 0.3)
    t = time.perf_counter()
    ml = adaptmg.multigrid(adaptmg.Space(m, 1), assemble.stiffness, threads=threads,
                           coarse_max_rows=None, max_coarse=None)
    wall = time.perf_counter() - t
    rows = ml.setup_timeline
    names = [r[0] for r in rows]
    L = len(ml.spaces)
    for l in range(L):
        for task in ("constraints", "assemble", "constrain"):
            # the finest level's constraints start beside the numbering, before L is known
            name = "constraints (finest)" if (task, l) == ("constraints", L - 1) else f"{task} {l}"
            assert names.count(name) == 1, (name, names)
        assert names.count(f"transfer {l}") == (1 if l > 0 else 0)
    assert names.count("mesh hierarchy") == 1 and names.count("numbering (finest)") == 1
    assert names.count("hanging nodes (finest)") == 1 and names.count("H (finest)") == 1
    spans = {r[0]: r for r in rows}
    # the finest constraints follow both the numbering and the hanging nodes
    assert spans["constraints (finest)"][3] >= max(spans["numbering (finest)"][3],
                                                   spans["hanging nodes (finest)"][3])
    assert spans["H (finest)"][3] >= spans["constraints (finest)"][3]
    assert spans[f"constrain {L - 1}"][2] >= spans["H (finest)"][3]
    assert names[-1].startswith("solver set-up")
    starts = [r[2] for r in rows]
    assert starts == sorted(starts)
    assert all(0.0 <= a <= b <= wall for _, _, a, b in rows)


def test_setup_constrains_a_level_without_waiting_for_coarser_constraints(monkeypatch):
    """The per-level tasks go in fine to coarse (the finest transfer, the longest, first), and
    a level is constrained once its own constraints are there: the coarsest level's
    constraints are held back until the finest level has been constrained (an event, no
    clock: with constraining after every level's constraints they would wait in vain, and
    the test fails after the timeout), and the levels are the same as with every task in
    order (threads=1)."""
    import threading
    from adaptmg.multilevel import hierarchy as gmg
    m = Mesh.box([0.0] * 2, [1.0] * 2, [2] * 2)
    for _ in range(4):
        m = m.refine()
    kw = dict(coarse_max_rows=None, max_coarse=None)
    ref = adaptmg.multigrid(adaptmg.Space(m, 1), assemble.stiffness, threads=1, **kw)
    order = [r[0] for r in ref.setup_timeline]
    L = len(ref.spaces)
    assert order.index(f"transfer {L - 1}") < order.index("transfer 1")
    assert order.index(f"constraints {L - 2}") < order.index("constraints 0")
    inner_cons, inner_constrained = gmg._level_constraints, gmg._constrained
    finest_done, seen = threading.Event(), []

    def held(space, *a):
        if space.mesh.num_cells == ref.spaces[0].mesh.num_cells:
            seen.append(finest_done.wait(timeout=30))
        return inner_cons(space, *a)

    def constrained(cons, A):
        out = inner_constrained(cons, A)
        if A.shape[0] == ref.spaces[-1].num_dofs:
            finest_done.set()
        return out
    monkeypatch.setattr(gmg, "_level_constraints", held)
    monkeypatch.setattr(gmg, "_constrained", constrained)
    ml = adaptmg.multigrid(adaptmg.Space(m, 1), assemble.stiffness, threads=4, **kw)
    assert seen == [True]
    for a, b in zip(ml.levels, ref.levels):
        assert abs(a.A - b.A).max() == 0
        assert a.P is None or abs(a.P - b.P).max() == 0


@pytest.mark.parametrize("degree,components,cmr", [(1, 1, 60), (1, 1, 200), (2, 1, 150), (1, 2, 120)])
def test_coarsening_stops_where_coarse_max_rows_cuts(monkeypatch, degree, components, cmr):
    """With coarse_max_rows, global coarsening stops at a mesh of at most coarse_max_rows /
    (nloc * components) cells (the levels below would be dropped unbuilt): the same levels and
    matrices as coarsening down to the coarse mesh, and fewer meshes built."""
    from adaptmg.multilevel import hierarchy as H
    m = Mesh.box([0.0, 0.0], [1.0, 1.0], [2, 2]).refine()
    for k in range(6):                      # a corner refined deep: many small levels
        m = m.refine(np.linalg.norm(m.points[m.cells].mean(axis=1), axis=1) < 0.5 ** (k / 2))
    s = adaptmg.Space(m, degree, components)
    kw = dict(coarse_max_rows=cmr, threads=1, max_coarse=None)
    ml = adaptmg.multigrid(s, assemble.stiffness, **kw)
    built = []
    orig = Mesh.hierarchy
    monkeypatch.setattr(Mesh, "hierarchy", lambda self, **k: built.append(k.get("min_cells", 1)) or orig(self, **k))
    ml_stop = adaptmg.multigrid(adaptmg.Space(m, degree, components), assemble.stiffness, **kw)
    monkeypatch.setattr(H, "_hierarchy_min_cells", lambda *a: 1)
    ml_all = adaptmg.multigrid(adaptmg.Space(m, degree, components), assemble.stiffness, **kw)
    assert built[0] == cmr // ((degree + 1) ** 2 * components) > 1
    assert len(m.hierarchy(min_cells=built[0])) < len(m.hierarchy())
    assert [lev.n for lev in ml_stop.levels] == [lev.n for lev in ml_all.levels] == [lev.n for lev in ml.levels]
    assert ml_stop.levels[0].n <= cmr < ml_stop.levels[1].n
    for a, b in zip(ml_stop.levels, ml_all.levels):
        assert abs(a.A - b.A).max() == 0
