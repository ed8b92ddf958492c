"""Transport-diffusion problem (seed 001 §5.1): exactness of the data, convergence, solver robustness.

CPU budget: ~10 s on a 2-core machine.
"""
import numpy as np
import pytest

from adaptmg import Space, assemble
from adaptmg_problems import transport_diffusion as td
from adaptmg_problems._stepping import constrain_combine
from adaptmg_problems._timing import Timer, format_table
from adaptmg_problems.transport_diffusion import kernels as KP


def _fd_source(t, X, lam, b, h=1e-4):
    """f = d_t theta - lam Laplace theta + b . grad theta by central differences."""
    th = lambda tt, P: KP.td_exact(tt, P)
    ex, ey = np.array([h, 0.0]), np.array([0.0, h])
    dt_ = (th(t + h, X) - th(t - h, X)) / (2 * h)
    lap = (th(t, X + ex) + th(t, X - ex) + th(t, X + ey) + th(t, X - ey) - 4 * th(t, X)) / h**2
    gx = (th(t, X + ex) - th(t, X - ex)) / (2 * h)
    gy = (th(t, X + ey) - th(t, X - ey)) / (2 * h)
    return dt_ - lam * lap + b[0] * gx + b[1] * gy


def test_source_matches_pde_of_exact_solution():
    rng = np.random.default_rng(0)
    X = rng.random((200, 2))
    for t in (0.0, 0.37, 1.5):
        f = KP.td_source(t, X, td.LAMBDA, td.B)
        ref = _fd_source(t, X, td.LAMBDA, td.B)
        assert np.max(np.abs(f - ref)) < 1e-5 * (1 + np.max(np.abs(ref)))
    # the paper's initial value: m(0, z) = 3/4 - z
    x = np.array([[0.25, 0.5]])
    assert KP.td_exact(0.0, x)[0] == pytest.approx(np.exp(-0.25 * (0.5**2 + 0.25**2)))


def test_step_data_kernel_twin():
    rng = np.random.default_rng(1)
    n = 50
    x, y, u, mask = rng.random(n), rng.random(n), rng.random(n), (rng.random(n) < 0.3).astype(float)
    w, g = np.empty(n), np.empty(n)
    KP.td_step_data(x, y, u, mask, 0.7, 0.01, (0.0, -1.0), 0.05, w, g)
    X = np.stack([x, y], -1)
    np.testing.assert_allclose(w, u + 0.05 * KP.td_source(0.7, X, 0.01), rtol=1e-14, atol=1e-15)
    np.testing.assert_allclose(g, mask * KP.td_exact(0.7, X), rtol=1e-14)
    out = np.empty(n)
    constrain_combine(mask, x, 3.0, y, out)
    np.testing.assert_allclose(out, mask * x + 3.0 * y)
    with pytest.raises(ValueError, match="shape"):
        KP.td_step_data(x, y[:-1], u, mask, 0.7, 0.01, (0.0, -1.0), 0.05, w, g)


def test_step_data_at_time_buffer_is_step_data():
    """td_step_data_at reads (t, c'(t)) from an array: the same values as td_step_data at t."""
    rng = np.random.default_rng(2)
    n = 40
    x, y, u, mask = rng.random(n), rng.random(n), rng.random(n), (rng.random(n) < 0.3).astype(float)
    w, g, w2, g2 = (np.empty(n) for _ in range(4))
    for t in (0.02, 0.7, 1.98):
        KP.td_step_data(x, y, u, mask, t, 0.01, (0.0, -1.0), 0.02, w, g)
        KP.td_step_data_at(x, y, u, mask, KP.td_time(t), 0.01, (0.0, -1.0), 0.02, w2, g2)
        assert np.array_equal(w, w2) and np.array_equal(g, g2)
    with pytest.raises(ValueError, match="tc must have shape"):
        KP.td_step_data_at(x, y, u, mask, np.zeros(3), 0.01, (0.0, -1.0), 0.02, w2, g2)


def test_mesh_sizes_and_bad_input():
    m = td.make_mesh(5)
    assert m.num_cells == 32 * 32 and m.num_nodes == 33 * 33
    assert len(m.hierarchy()) == 4          # 4x4 -> 8x8 -> 16x16 -> 32x32
    with pytest.raises(ValueError, match="n must be"):
        td.make_mesh(1)
    with pytest.raises(ValueError, match="dt"):
        td.run(3, dt=-1.0, backend="cpu", quiet=True)
    with pytest.raises(ValueError, match="multiple"):
        td.run(3, dt=0.3, T=1.0, backend="cpu", quiet=True)


def test_first_step_matches_direct_solve():
    """One step of the device-style rhs + GMRES equals the host Constraints.apply + spsolve."""
    import scipy.sparse.linalg as sla
    from adaptmg import Constraints
    n, dt = 4, 0.05
    r = td.run(n, dt=dt, steps=1, backend="cpu", quiet=True, rtol=1e-12)
    space = Space(td.make_mesh(n), 1)
    A = td.system_matrix(dt)(space)
    M = assemble.mass(space)
    u0 = space.interpolate(td.exact(0.0))
    b = M @ (u0 + dt * space.interpolate(td.source(dt)))
    cons = Constraints(space, space.boundary_dofs(), values=td.exact(dt))
    K, f = cons.apply(A, b)
    ref = cons.expand(sla.spsolve(K.tocsc(), f))
    np.testing.assert_allclose(r["u"], ref, rtol=0, atol=1e-10)


def test_l2_error_converges_at_rate_two_until_time_error_dominates():
    # small dt, short T: spatial error dominates
    errs = [td.run(n, dt=0.000625, T=0.2, backend="cpu", quiet=True)["l2"] for n in (3, 4, 5)]
    h = 2.0 ** -np.arange(3, 6)
    rate = np.polyfit(np.log(h), np.log(errs), 1)[0]
    assert 1.8 < rate < 2.3, (errs, rate)
    assert errs[-1] < 1e-4
    # the paper's dt = 0.02: the O(dt) error of backward Euler takes over on fine meshes
    e5, e6 = (td.run(n, dt=0.02, T=2.0, backend="cpu", quiet=True)["l2"] for n in (5, 6))
    assert e6 > 0.5 * e5                    # no longer ~4x smaller
    assert 2e-4 < e6 < 2e-3                 # O(dt) with dt = 0.02


def test_gmres_multigrid_iterations_bounded_and_level_independent():
    its = {}
    for n in (3, 4, 5, 6, 7):                # full hierarchies down to the 4x4 box
        r = td.run(n, dt=0.02, steps=10, backend="cpu", quiet=True, levels="all")
        its[n] = r["iterations"]
        assert len(r["iterations"]) == 10
        assert len(r["solver"].levels) == n - 1
    r = td.run(8, dt=0.02, steps=5, backend="cpu", quiet=True)     # default: coarsest 32x32
    assert len(r["solver"].levels) == 4 and r["solver"].levels[0].n == 33 * 33
    its[8] = r["iterations"]
    maxes = [max(v) for v in its.values()]
    assert max(maxes) <= 10, its
    assert max(maxes) - min(maxes) <= 3, its
    # a cold start (x0 = 0 would be harder) is not what is measured: the first step too
    assert all(v[0] <= 10 for v in its.values())


def test_linear_predictor_saves_iterations_not_accuracy():
    """x0 = 2 theta^{k-1} - theta^{k-2} (the default) against x0 = theta^{k-1}: the same
    stopping test, fewer GMRES iterations, the same solution to the solver's tolerance."""
    kw = dict(dt=0.02, steps=20, backend="cpu", quiet=True)
    lin = td.run(6, **kw)
    prev = td.run(6, predictor="previous", **kw)
    assert lin["iterations"][0] == prev["iterations"][0]          # step 1 has no history
    assert sum(lin["iterations"]) <= 0.9 * sum(prev["iterations"]), (lin["iterations"], prev["iterations"])
    assert np.linalg.norm(lin["u"] - prev["u"]) <= 1e-6 * np.linalg.norm(prev["u"])
    assert lin["l2"] == pytest.approx(prev["l2"], rel=1e-4)
    with pytest.raises(ValueError, match="predictor"):
        td.run(3, steps=1, backend="cpu", quiet=True, predictor="quadratic")


def test_run_returns_fields_and_timings(capsys):
    r = td.run(3, steps=2, backend="cpu", quiet=False)
    out = capsys.readouterr().out
    assert "init" in out and "solve" in out and "L2 error" in out
    assert set(r["timings"]) == {"init", "rhs", "solve", "sum"}
    assert r["timings"]["sum"] == pytest.approx(sum(r["timings"][k] for k in ("init", "rhs", "solve")))
    assert r["fields"]["theta"].shape == (81,) and r["dofs"] == 81 and r["steps"] == 2


def test_timer_and_table():
    t = Timer()
    with t("a"):
        pass
    with t("a"):
        pass
    assert t.counts["a"] == 2 and t["a"] >= 0 and t["missing"] == 0.0
    d = t.as_dict(["a", "b"])
    assert d["sum"] == d["a"] + d["b"]
    s = format_table([{"x": 1050625, "y": 0.5}], ["x", ("y", "why", ".3f")], title="T")
    assert "1 050 625" in s and "0.500" in s and "why" in s
    with pytest.raises(TypeError):
        format_table([1], ["x"])


@pytest.mark.gpu
@pytest.mark.parametrize("n", [6, 7])
def test_gpu_run_matches_cpu_run(n):
    """The GPU run (n=7: the finest matrices assembled, constrained and masked on the device;
    n=6: below MIN_DEVICE_ENTRIES, host assembly moved up) gives the CPU run's solution and
    iterations: the device Dirichlet-column mask, mass matrix and row scale are the host's."""
    rc = td.run(n, steps=5, backend="cpu", quiet=True)
    rg = td.run(n, steps=5, backend="gpu", quiet=True)
    assert rc["gmres_mode"] == "host" and rg["gmres_mode"] == "cuda-graph"
    assert rc["rhs_mode"] == "launches" and rg["rhs_mode"] == "cuda-graph"
    assert all(abs(a - b) <= 1 for a, b in zip(rg["iterations"], rc["iterations"]))
    assert np.abs(rg["u"] - rc["u"]).max() <= 1e-6 * np.abs(rc["u"]).max()
    assert rg["l2"] == pytest.approx(rc["l2"], rel=1e-4)


def _step_system(n=6, dt=0.02):
    """The constrained transport-diffusion step matrix of mesh n on the GPU, its multigrid
    solver and a right-hand side with a smooth and a rough part."""
    from adaptmg import multigrid
    from adaptmg.backend import get_backend
    from adaptmg_problems._stepping import SpMVOperator
    gpu = get_backend("gpu")
    space = Space(td.make_mesh(n), 1)
    ml = multigrid(space, td.system_matrix(dt), dirichlet="all", backend=gpu)
    K = SpMVOperator(gpu.asmatrix(ml.A))
    rng = np.random.default_rng(5)
    P = space.points
    b = np.sin(3 * P[:, 0]) * np.cos(2 * P[:, 1]) + 0.1 * rng.standard_normal(space.num_dofs)
    return gpu, ml, K, gpu.asarray(ml.constrain(b))


@pytest.mark.gpu
@pytest.mark.parametrize("tol", ["rhs", "residual"])
def test_step_gmres_graph_equals_host(tol):
    """StepGMRES on the GPU (one CUDA graph per FGMRES iteration, recorded when first
    reached) against the host-driven gmres_step with the same V-cycle: the same iteration
    count (+-1) for a cold and a warm start, both at the tolerance, the same solution;
    x0 is left unchanged."""
    from adaptmg_problems._stepping import StepGMRES
    gpu, ml, K, b = _step_system()
    xp = gpu.xp
    g = StepGMRES(K, ml, rtol=1e-9, maxiter=50, tol=tol, xp=xp)
    h = StepGMRES(K, ml, rtol=1e-9, maxiter=50, tol=tol, xp=xp, graph=False)
    assert g.mode == "cuda-graph" and h.mode == "host"
    x0 = xp.zeros_like(b)
    for start in ("cold", "warm"):
        keep = x0.copy()
        xg, ig, kg = g.step(b, x0)
        xh, ih, kh = h.step(b, x0)
        assert g.mode == "cuda-graph", g.graph_error
        assert bool((x0 == keep).all())
        assert ig == 0 and ih == 0 and abs(kg - kh) <= 1 and kg >= 2, (start, kg, kh)
        r0 = float(xp.linalg.norm(b - K.matvec(x0)))
        ref = float(xp.linalg.norm(b)) if tol == "rhs" else r0
        for x in (xg, xh):
            assert float(xp.linalg.norm(b - K.matvec(x))) <= 1e-9 * ref
        assert float(xp.abs(xg - xh).max()) <= 1e-6 * float(xp.abs(xh).max())
        # warm start: the cold solution perturbed
        x0 = xh + 1e-3 * xp.sin(xp.arange(b.size, dtype=b.dtype))


@pytest.mark.gpu
def test_step_gmres_refused_graph_mid_cycle_falls_back(monkeypatch):
    """A capture refused at the third iteration (in the middle of the first solve): the
    graph solve hands x back as it was and the step is solved by gmres_step, which
    converges; later steps stay on the host path and the reason is kept."""
    import adaptmg.linalg.graph_fgmres as GF
    from adaptmg_problems._stepping import StepGMRES
    gpu, ml, K, b = _step_system()
    xp = gpu.xp
    real = GF.capture
    calls = []

    def capture(be, run, inputs, output, **kw):
        calls.append(1)
        if len(calls) == 3:
            return None, "refused for the test"
        return real(be, run, inputs, output, **kw)
    monkeypatch.setattr(GF, "capture", capture)
    s = StepGMRES(K, ml, rtol=1e-9, maxiter=50, xp=xp)
    x0 = xp.zeros_like(b)
    x, info, its = s.step(b, x0)
    assert len(calls) == 3 and s.mode == "host" and s.graph_error == "refused for the test"
    assert info == 0 and its >= 3
    assert float(xp.linalg.norm(b - K.matvec(x))) <= 1e-9 * float(xp.linalg.norm(b))
    assert bool((x0 == 0).all())


@pytest.mark.gpu
def test_step_rhs_graph_reads_each_steps_time():
    """The recorded right-hand side (one CUDA graph, the time copied in from page-locked
    memory) gives the launched sequence's vector at every step's time -- not the time of
    the recording -- and the host's (CPU backend) to rounding."""
    from adaptmg.backend import get_backend, to_host
    from adaptmg.device import kernels as K
    from adaptmg_problems.transport_diffusion.rhs import StepRHS
    gpu, cpu = get_backend("gpu"), get_backend("cpu")
    space = Space(td.make_mesh(5), 1)
    n = space.num_dofs
    rng = np.random.default_rng(3)
    M = assemble.mass(space)
    A = assemble.scalar_form(space, mass=1.0, diffusion=0.02, convection=(0.0, -0.02))
    mask = np.zeros(n)
    mask[space.boundary_dofs()] = 1.0
    P = space.points
    u0 = rng.random(n)

    def build(be, graph):
        xp = be.xp
        return StepRHS(be, be.asarray(np.ascontiguousarray(P[:, 0])),
                       be.asarray(np.ascontiguousarray(P[:, 1])), be.asarray(mask),
                       be.asarray(1.0 - mask), 2.5, K.make_spmv(be.asmatrix(M)),
                       K.make_spmv(be.asmatrix(A)), None, 0.01, (0.0, -1.0), 0.02, graph=graph)
    g, e, c = build(gpu, True), build(gpu, False), build(cpu, False)
    assert g.mode == "cuda-graph", g.graph_error
    assert e.mode == "launches" and c.mode == "launches"
    prev = None
    for t in (0.02, 0.04, 1.3):
        outs = []
        for r in (g, e, c):
            r.u[...] = r.be.asarray(u0)
            outs.append(to_host(r(t)).copy())
        assert np.abs(outs[0] - outs[1]).max() <= 4 * np.finfo(float).eps * np.abs(outs[1]).max()
        assert np.abs(outs[0] - outs[2]).max() <= 1e-13 * np.abs(outs[2]).max()
        if prev is not None:
            assert np.abs(outs[0] - prev).max() > 1e-6      # the time moved the vector
        prev = outs[0]


@pytest.mark.gpu
def test_gpu_run_with_the_mesh_on_the_device_equals_the_host_mesh_run():
    """Issue 36: the init from a device mesh (mesh, levels, assembly, constraints, transfers on
    the GPU) gives the host-mesh GPU run's solution to 1e-12 and the same iterations."""
    rh = td.run(6, steps=5, backend="gpu", mesh_backend="cpu", quiet=True)
    rd = td.run(6, steps=5, backend="gpu", quiet=True)
    assert rh["mesh_backend"] == "cpu" and rd["mesh_backend"] == "gpu"
    assert rd["iterations"] == rh["iterations"]
    assert np.abs(rd["u"] - rh["u"]).max() <= 1e-12 * np.abs(rh["u"]).max()
    assert rd["l2"] == pytest.approx(rh["l2"], rel=1e-10)
    assert rd["mesh"].num_cells == 64 * 64          # the results on the host mesh
