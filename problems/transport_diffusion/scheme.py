r"""Transport-diffusion on the unit square (seed 001 §5.1, Table 1).

Problem.  On :math:`\Omega = (0,1)^2`, :math:`I = (0, T]`, find :math:`\theta` with

.. math::

    \partial_t\theta - \lambda\Delta\theta + (b\cdot\nabla)\theta = f, \quad
    \theta = \theta_b \text{ on } \partial\Omega, \quad \theta(0) = \theta_0,

:math:`\lambda = 0.01`, :math:`b = (0, -1)`, and :math:`f, \theta_b, \theta_0` taken
from the exact solution
:math:`\theta_{ex} = \exp(-(m(t,x)^2 + m(t,y)^2)/4)`,
:math:`m(t,z) = 1/2 + \cos(\pi t/2)/4 - z` (:func:`exact`, :func:`source`).

Discretisation.  Q1 on the uniform mesh ``Mesh.box([0,0],[1,1],[4,4])`` refined
``n-2`` times (h = 2^-n, so the global-coarsening hierarchy has n-1 levels),
backward Euler with step dt:

.. math::

    (M + dt(\lambda K + C))\,\theta^k = M\theta^{k-1} + dt\,M f^k_h ,

M the mass, K the stiffness, C the convection matrix and :math:`f^k_h` the nodal
interpolant of :math:`f(t_k)` (an O(h^2) consistent replacement of the load
integral, so that the right-hand side is two SpMVs and one element-wise kernel
on the device -- no per-step quadrature).  With :math:`A = M + dt(\lambda K + C)`,
the boundary values :math:`g^k` (the interpolant of :math:`\theta_{ex}(t_k)` on
:math:`\partial\Omega`, zero inside), the hanging-node matrix H and the free mask Z
(seed 001 §2.2, :class:`adaptmg.Constraints`), each step solves

.. math::

    K_c x = Z H^T\big(M(\theta^{k-1} + dt f^k_h) - A g^k\big) + s\, g^k,
    \qquad \theta^k = H x,

with GMRES right-preconditioned by one V-cycle of geometric multigrid
(rediscretised :math:`A` on every level, Jacobi smoothing, direct coarse solve);
on the GPU each GMRES iteration, V-cycle included, is one CUDA-graph launch
(:class:`adaptmg_problems._stepping.StepGMRES`).
Each step starts GMRES from the linear extrapolation :math:`2\theta^{k-1} - \theta^{k-2}`
(``predictor="linear"``; ``"previous"``: from :math:`\theta^{k-1}`).
The right-hand side is one fused kernel (:func:`.kernels.td_step_data_at`),
two SpMVs (M and A; plus H^T on meshes with hanging nodes) and one fused
combine (:func:`adaptmg_problems._stepping.constrain_combine`), all on the backend's arrays;
on the GPU one CUDA-graph launch per step (:class:`.rhs.StepRHS`).

Timings follow Table 1: ``init`` (mesh, hierarchy, spaces, assembly of all
levels, multigrid setup, transfer to the device, initial value; on the GPU the mesh is built
and refined there, so the whole init runs on the device: ``run(mesh_backend=...)``), ``rhs`` and
``solve`` summed over all steps, and ``sum``.
"""
from __future__ import annotations

import numpy as np

from adaptmg import Mesh, Space, assemble, multigrid
from adaptmg.backend import get_backend, is_device_sparse, to_host
from adaptmg.device import kernels as _K
from adaptmg.fe.csr_ops import mask_rows_cols
from adaptmg.fe.norms import errors

from .._stepping import SpMVOperator, StepGMRES, time_steps
from .._timing import Timer, format_table, progress
from .kernels import td_exact, td_source
from .rhs import StepRHS

__all__ = ["LAMBDA", "B", "exact", "source", "make_mesh", "system_matrix", "run", "COLUMNS"]

LAMBDA = 0.01
B = (0.0, -1.0)
COLUMNS = [("n", "n"), ("dofs", "DOFs"), ("init", "init"), ("rhs", "rhs"), ("solve", "solve"),
           ("sum", "sum"), ("iters_max", "it/step max"), ("l2", "L2 error", ".3e")]


def exact(t: float):
    """theta_ex(t, .) as a callable on points (..., 2)."""
    return lambda X: td_exact(t, X)


def source(t: float, lam: float = LAMBDA, b=B):
    """f(t, .) = d_t theta - lam Laplace theta + b . grad theta, as a callable on points (..., 2)."""
    return lambda X: td_source(t, X, lam, b)


def make_mesh(n: int, backend="cpu") -> Mesh:
    """Uniform mesh with h = 2^-n: the 4x4 box refined n-2 times (n >= 2), its arrays and the
    refinement on ``backend`` ("cpu" or "gpu", see :meth:`adaptmg.Mesh.box`)."""
    if not isinstance(n, (int, np.integer)) or n < 2:
        raise ValueError(f"n must be an integer >= 2 (h = 2^-n), got {n!r}")
    mesh = Mesh.box([0.0, 0.0], [1.0, 1.0], [4, 4], backend=backend)
    for _ in range(int(n) - 2):
        mesh = mesh.refine()
    return mesh


def system_matrix(dt: float, lam: float = LAMBDA, b=B, device=None):
    """``assemble(space) -> M + dt (lam K + C)`` (used on every multigrid level).

    One :func:`adaptmg.assemble.scalar_form` pass per level (mass 1, diffusion
    dt*lam, convection dt*b: one geometry evaluation, GEMM and scatter instead of
    three plus a sum). The mass matrix of the first space assembled (the finest:
    the multigrid builder starts there) is returned by the same pass
    (``return_mass=True``: one more small product and scatter, cheaper than a
    separate assembly, whose cost is mostly the geometry) and kept in
    ``A.first_mass = (space, M)`` so that it is not assembled twice. ``device`` goes to
    :func:`~adaptmg.assemble.scalar_form`; on a GPU every level's matrix (and the first
    mass matrix) stays there as cupyx matrices (``keep_on_device``: element matrices,
    pattern and sums computed there, the coefficients being constants): the multigrid
    builder then constrains each level on the device, and no matrix makes the round trip
    through the host (before: only the finest level; the coarser ones were assembled with
    host element matrices, summed on the device, downloaded, constrained on the host and
    uploaded again by the solver's set-up).
    """
    bt = dt * np.asarray(b, dtype=np.float64)
    keep = device is not None and get_backend(device).is_gpu

    def A(space):
        kw = dict(mass=1.0, diffusion=dt * lam, convection=bt, device=device, keep_on_device=keep)
        if A.first_mass[0] is None:
            Ah, M = assemble.scalar_form(space, return_mass=True, **kw)
            A.first_mass = (space, M)
            return Ah
        return assemble.scalar_form(space, **kw)
    A.first_mass = (None, None)
    return A


def run(n: int = 7, *, dt: float = 0.02, T: float = 2.0, steps: int | None = None,
        lam: float = LAMBDA, b=B, backend="auto", rtol: float = 1e-8, maxiter: int = 50, tol: str = "rhs",
        quiet: bool = False, out=None, compute_error: bool = True, levels=None,
        predictor: str = "linear", mesh_backend=None):
    """Run the transport-diffusion problem on the uniform mesh h = 2^-n.

    Parameters
    ----------
    n : mesh parameter (h = 2^-n, (2^n + 1)^2 DoFs).
    dt, T : time step and final time (``steps`` overrides T: T = steps * dt).
    backend : "auto" | "cpu" | "gpu".
    rtol, maxiter : GMRES tolerance and iteration cap per step.
    tol : "rhs" -- stop when ||b - K x|| <= rtol ||b|| (x0 = previous step);
        "residual" -- reduce each step's initial residual by rtol (Gascoigne's
        "reduction" criterion: work in every step even when x0 is already good).
    levels : number of multigrid levels, or "all" (down to the 4x4 box); default n - 4
        (coarsest 32x32 cells) for n >= 7, else "all".
    predictor : initial guess of each step's GMRES: "linear" (default) extrapolates the two
        previous steps, ``x0 = 2 theta^{k-1} - theta^{k-2}`` (first step: theta^0), whose
        error is O(dt^2) against O(dt) for "previous" (``x0 = theta^{k-1}``): same stopping
        test, fewer iterations (n=7, 8 on the CPU: 334 -> 263 and 364 -> 295 over 100 steps;
        the L2 error at T moves by ~1e-5 of itself).
    quiet : no progress bar.
    out : optional dict to fill (and return) instead of a new one.
    mesh_backend : where the mesh is built and refined: None (default) on the backend, so on
        the GPU the whole init runs mesh -> levels on the device (mesh, Space, assembly of every
        level, constraints, transfers: issue 36); "cpu" a host mesh (the GPU set-up then starts
        from host tables; the CPU backend always takes the host mesh).

    Returns
    -------
    dict with ``u`` (host nodal values at T), ``mesh``, ``space``, ``timings``
    ({"init", "rhs", "solve", "sum"}), ``iterations`` (GMRES iterations per
    step), ``l2`` (L2 error at T against theta_ex, host quadrature), ``dofs``,
    ``n``, ``steps``, ``T``, ``backend``, ``mesh_backend``, ``gmres_mode`` ("cuda-graph" or "host", see
    :class:`~adaptmg_problems._stepping.StepGMRES`), ``rhs_mode`` ("cuda-graph" or
    "launches", see :class:`~adaptmg_problems.transport_diffusion.rhs.StepRHS`).
    """
    steps = time_steps(dt, T, steps, tol)
    if predictor not in ("linear", "previous"):
        raise ValueError(f"predictor must be 'linear' or 'previous', got {predictor!r}")
    be = get_backend(backend)
    xp = be.xp
    mb = be if mesh_backend is None else get_backend(mesh_backend)
    if mb.is_gpu and not be.is_gpu:
        raise ValueError(f"mesh_backend={mesh_backend!r} needs backend='gpu', got backend={be.name!r}")
    timer = Timer(be)
    res = {} if out is None else out

    with timer("init"):
        mesh = make_mesh(n, backend=mb)
        space = Space(mesh, 1)
        Asys = system_matrix(dt, lam, b, device=be)
        # global-coarsening hierarchy down to 32x32 cells (1089 rows, direct coarse solve) for
        # n >= 7: on the GPU, coarser levels cost launches, not bandwidth
        if levels is None:
            levels = int(n) - 4 if n >= 7 else "all"
        ml = multigrid(space, Asys, dirichlet="all", backend=be,
                       max_levels=None if levels == "all" else int(levels))
        cons = ml.constraints[-1]
        # the builder assembles the finest level first: reuse its mass matrix if still there
        Mh = Asys.first_mass[1] if Asys.first_mass[0] is space else assemble.mass(space)
        nd = space.num_dofs
        # Dirichlet row scale s of the constrained matrix (rows s * I on fixed DoFs)
        s = cons.scale if cons.dirichlet.size else 1.0
        mask = xp.zeros(nd)                    # 0/1 Dirichlet mask on the backend
        mask[be.asarray(cons.dirichlet)] = 1.0
        # device data (moved once)
        Kd = getattr(ml, "_A_outer", None)
        if Kd is None:
            Kd = be.asmatrix(ml.A)
        Kop = SpMVOperator(Kd)
        Md = be.asmatrix(Mh)
        # only the Dirichlet columns of A act on the lifting g: A_D = A diag(mask), built from
        # the few entries in those columns (no copy of the whole matrix; on the device when the
        # finest level was assembled there)
        A_fine = ml.assembled
        hx = np if not is_device_sparse(A_fine) else xp      # the masks where A_fine lives
        cols = to_host(mask != 0) if hx is np else mask != 0
        Ad = be.asmatrix(mask_rows_cols(A_fine, hx.ones(nd, dtype=bool), cols, drop_zeros=True))
        has_hanging = space.hanging_nodes.size > 0
        HT_plan = H_plan = None
        if has_hanging:
            HT_plan = _K.make_spmv(be.asmatrix(cons.H.T.tocsr()))
            H_plan = _K.make_spmv(be.asmatrix(cons.H))
        Pd = be.asarray(space.points)       # one upload; the coordinates and theta^0 there
        xd, yd = xp.ascontiguousarray(Pd[:, 0]), xp.ascontiguousarray(Pd[:, 1])
        # the step's right-hand side from rhs_of.u (on the GPU one CUDA graph per step)
        rhs_of = StepRHS(be, xd, yd, mask, be.asarray(cons.free).astype(np.float64), s,
                         _K.make_spmv(Md), _K.make_spmv(Ad), HT_plan, lam, b, dt)
        u = rhs_of.u
        u[...] = td_exact(0.0, Pd)          # = space.interpolate(exact(0.0)), on the backend
        x = u.copy()                        # regular DoF values (= u without hanging nodes)
        # GMRES of every step; on the GPU one CUDA graph per iteration (V-cycle included)
        stepper = StepGMRES(Kop, ml, rtol=rtol, maxiter=maxiter, tol=tol, xp=xp)

    iters = []
    not_converged = 0
    x_prev = None                           # theta^{k-2} (regular DoFs) for the linear predictor
    t = 0.0
    for k in progress(range(1, steps + 1), total=steps, desc=f"transport-diffusion n={n}", quiet=quiet):
        t = k * dt
        with timer("rhs"):
            rhs = rhs_of(t)                   # Z H^T (M (u + dt f) - A_D g) + s g
        with timer("solve"):
            x0 = x
            if x_prev is not None:
                _K.axpby(2.0, x, -1.0, x_prev)     # x_prev <- 2 x - x_prev: the linear predictor
                x0 = x_prev
            # the step works on a copy of x0: x stays the previous step's solution
            x_new, info, its = stepper.step(rhs, x0)
            x_prev = x if predictor == "linear" else None
            x = x_new
            if info != 0:
                not_converged += 1
            if has_hanging:
                H_plan(x, u, 1.0, 0.0)
            else:
                xp.copyto(u, x)               # u is the right-hand side's (fixed) input
        iters.append(its)

    timings = timer.as_dict(["init", "rhs", "solve"])
    u_h = to_host(u)
    if mb.is_gpu:                           # the results (output, error) on the host mesh
        mesh = mesh.to("cpu")
        space = Space(mesh, 1)
    res.update(u=u_h, mesh=mesh, space=space, solver=ml, gmres_mode=stepper.mode,
               rhs_mode=rhs_of.mode, timings=timings, iterations=iters, not_converged=not_converged,
               dofs=space.num_dofs, n=int(n), steps=int(steps), T=steps * dt, dt=dt,
               backend=be.name, mesh_backend=mb.name, fields={"theta": u_h})
    if compute_error:
        res["l2"] = float(errors(space, u_h, exact(steps * dt))["L2"])
    if not quiet:
        row = dict(n=n, dofs=space.num_dofs, iters_max=max(iters), l2=res.get("l2"), **timings)
        print(format_table([row], COLUMNS, title=f"transport-diffusion ({be.name}, {steps} steps, dt={dt})"))
    return res
