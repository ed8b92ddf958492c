r"""Navier-Stokes driven cavity with the explicit pressure-correction scheme (seed 001 §5.3, Algorithm 4).

Problem (eq. 8-9).  :math:`\partial_t u - \nu\Delta u + \mathrm{div}(u\otimes u) + \nabla p = 0`,
:math:`\mathrm{div}\,u = 0`, :math:`\nu = 1/Re`, :math:`u(0) = 0`.
3-D: :math:`\Omega = (0,1)\times(0,1)\times(0,2)`, lid :math:`u = (0,1,0)` on x = 1, u = 0 on the
other faces, Re = 1000.  2-D: the unit square, lid :math:`u = (1, 0)` on y = 1.
The lid value is imposed on the nodes of the *open* lid face; nodes on its
edges belong to the walls (u = 0).  Then :math:`u_h\cdot n = 0` at every
boundary node, the discrete flux :math:`\int_{\partial\Omega} u_h\cdot n` is
zero and the Neumann pressure problem (:mod:`.pressure`) is compatible.

Discretisation.  Q1-iso-Q2 / Q1: the velocity is Q1 (d components) on the
uniform refinement ``fine = coarse.refine()`` of the pressure mesh ``coarse``;
the pressure is Q1 on ``coarse``.  Meshes are graded as in §5.3.1:
:math:`x_i = \tfrac12(1 - \cos(i\pi/N_x))` and the same in y.  For z the paper
prints :math:`z_k = 1 + \sin((k - N_z)\pi/(2N_z))`, which covers [0, 1] only and
contradicts :math:`\Omega_z = (0, 2)`; we use the reading consistent with the
domain, the same cosine clustering at both ends,
:math:`z_k = 1 + \sin((2k - N_z)\pi/(2N_z)) = 1 - \cos(k\pi/N_z)`.

Matrices (assembled once on the host, moved to the device once).  With
:math:`\phi_i` the scalar Q1 velocity basis, :math:`\psi_j` the pressure basis:

* lumped masses (eq. 12) :math:`m_i = \int\phi_i`, :math:`m^p_j = \int\psi_j`;
* stiffness :math:`L_{ij} = (\nabla\phi_j, \nabla\phi_i)`, pressure stiffness :math:`L^p`;
* :math:`(C_k)_{ij} = (\phi_j, \partial_k\phi_i)` (:func:`adaptmg.assemble.derivative_matrices`);
* :math:`(B_k)_{ij} = -(\psi_j, \partial_k\phi_i)` (:func:`adaptmg.assemble.gradient_iso`), so
  :math:`(B_k p)_i = -(p_h, \mathrm{div}(\phi_i e_k))`, and :math:`D_k = B_k^T`, so
  :math:`(\sum_k D_k u_k)_j = -(\mathrm{div}\,u_h, \psi_j)`.

Interpolated convection (eq. 13-15).  With the node-wise products
:math:`v^k_{i,c} = u_{i,k}u_{i,c}` (eq. 14, one custom element-wise kernel,
:func:`.kernels.products`),

.. math:: n(u\otimes u, \phi_i e_c) = -(\mathcal I_h(u\otimes u), \nabla(\phi_i e_c))
          = -\sum_k (C_k v^k_c)_i ,

the approximation of :math:`(\mathrm{div}(u\otimes u), \phi_i e_c)`.

Algorithm 4 in matrices (k = dt, component c, free velocity node i; Dirichlet
nodes keep their boundary value):

1. momentum (Step 1, explicit, lumped mass):
   :math:`F_c = \sum_k C_k v^k_c - B_c(p^{m-1} + q^{m-1}) - \nu L u^{m-1}_c`,
   :math:`u^m_c = u^{m-1}_c + k\,M_l^{-1} F_c`;
   timed as mom-rhs-nonlin (products + :math:`\sum_k C_k v^k`), mom-rhs-p, mom-rhs-visc, mom-solve;
2. pressure Poisson (Step 2, Neumann): :math:`L^p q^m = \tfrac1k D u^m`
   (pres-rhs: :math:`D u^m`; pres-solve: GMRES + multigrid, :mod:`.pressure`);
3. pressure update (Step 3, lumped pressure mass):
   :math:`p^m = p^{m-1} + q^m + \nu (M^p_l)^{-1} D u^m` (pres-up).

The stored velocity is the *predictor*: the corrector
:math:`\bar u^m = u^m - k M_l^{-1} B q^m` is eliminated from the loop (Guermond
1996) -- this is why Step 1 uses :math:`p^{m-1} + q^{m-1}`.  :func:`corrected_velocity`
computes it after the loop; its discrete divergence is much smaller than the
predictor's (the test checks this).  :math:`u_0 = 0`, :math:`q^0 = 0` and, because
:math:`u_0 = 0` and f = 0, :math:`p^0 = 0` solves eq. (16).

Device work.  All per-step work runs on the backend's arrays: element-wise
kernels (eq. 14 products, momentum update, pressure rhs / zero-mean shifts,
pressure update), four multi-matrix kernels (convection, viscous term, pressure
gradient = pressure -> velocity map, divergence = velocity -> pressure map) that
read the shared sparsity pattern once for all components (velocity stored
component-major as (d, n), matrices in ELL layout on the GPU;
:class:`adaptmg.device.multicsr.MultiCSR`),
and flexible GMRES (:func:`adaptmg.linalg.fgmres`) preconditioned by the
:class:`~adaptmg.multilevel.MultilevelSolver` V-cycle replayed as one CUDA-graph launch
(:class:`.pressure._NeumannPoisson`), started from the extrapolation
:math:`2q^n - q^{n-1}` of the last two increments.  The only transfers in the loop are
the Krylov scalars (and one scalar every ``check_every`` steps when ``steady_tol`` is set).
"""
from __future__ import annotations

import time

import numpy as np

from adaptmg import Mesh, Space, assemble
from adaptmg.backend import get_backend, to_host
from adaptmg.device import kernels as K
from adaptmg.device.multicsr import MultiCSR
from adaptmg.progress import progress as _progress

from .._timing import Timer, format_table
from . import kernels as NK
from .pressure import _NeumannPoisson, pressure_hierarchy

__all__ = ["PHASES", "graded_map", "make_meshes", "assemble_host", "NavierStokes", "run",
           "corrected_velocity", "centreline", "GHIA_RE100_U", "GHIA_RE100_V", "timing_table"]

#: the rows of seed 001 Table 4 (Step 1: mom-*, Step 2: pres-rhs/-solve, Step 3: pres-up)
PHASES = ("mom-rhs-nonlin", "mom-rhs-p", "mom-rhs-visc", "mom-solve", "pres-rhs", "pres-solve",
          "pres-up")

#: Ghia, Ghia & Shin, "High-Re solutions for incompressible flow using the Navier-Stokes
#: equations and a multigrid method", J. Comput. Phys. 48 (1982) 387-411, Table I, Re = 100:
#: u-velocity along the vertical line through the cavity centre (x = 0.5), columns (y, u).
GHIA_RE100_U = np.array([
    (1.0000, 1.00000), (0.9766, 0.84123), (0.9688, 0.78871), (0.9609, 0.73722),
    (0.9531, 0.68717), (0.8516, 0.23151), (0.7344, 0.00332), (0.6172, -0.13641),
    (0.5000, -0.20581), (0.4531, -0.21090), (0.2813, -0.15662), (0.1719, -0.10150),
    (0.1016, -0.06434), (0.0703, -0.04775), (0.0625, -0.04192), (0.0547, -0.03717),
    (0.0000, 0.00000)])
#: same source, Table II, Re = 100: v-velocity along the horizontal centre line (y = 0.5), (x, v).
GHIA_RE100_V = np.array([
    (1.0000, 0.00000), (0.9688, -0.05906), (0.9609, -0.07391), (0.9531, -0.08864),
    (0.9453, -0.10313), (0.9063, -0.16914), (0.8594, -0.22445), (0.8047, -0.24533),
    (0.5000, 0.05454), (0.2344, 0.17527), (0.2266, 0.17507), (0.1563, 0.16077),
    (0.0938, 0.12317), (0.0781, 0.10890), (0.0703, 0.10091), (0.0625, 0.09233),
    (0.0000, 0.00000)])


# ----------------------------------------------------------------------------- meshes
def graded_map(dim):
    r"""The §5.3.1 coordinates as a map of the unit box: :math:`x = \tfrac12(1-\cos\pi s)` (x, y),
    :math:`z = 1 - \cos\pi s` (3-D, so that z covers (0, 2))."""
    def f(X):
        Y = 0.5 * (1.0 - np.cos(np.pi * X))
        if dim == 3:
            Y[:, 2] = 1.0 - np.cos(np.pi * X[:, 2])
        return Y
    return f


def make_meshes(dim=3, n=None, graded=True):
    """(coarse pressure mesh, fine velocity mesh = coarse.refine()) of the cavity.

    ``n``: cells per direction of the *pressure* mesh (paper: (32, 32, 64) in 3-D).
    """
    if dim not in (2, 3):
        raise ValueError(f"dim must be 2 or 3, got {dim!r}")
    if n is None:
        n = (32, 32, 64) if dim == 3 else (32, 32)
    n = tuple(int(v) for v in np.atleast_1d(n))
    if len(n) == 1:
        n = n * dim
    if len(n) != dim or min(n) < 1:
        raise ValueError(f"n must be {dim} positive cell counts, got {n}")
    # a coarse box refined L times, so that the pressure multigrid has a global-coarsening
    # hierarchy (Mesh.box cells are roots of the refinement forest and cannot be coarsened)
    L = 0
    while all(v % 2 ** (L + 1) == 0 for v in n) and min(n) // 2 ** (L + 1) >= 1:
        L += 1
    upper = [1.0] * dim if graded else [1.0, 1.0, 2.0][:dim]
    coarse = Mesh.box([0.0] * dim, upper, [v // 2 ** L for v in n])
    for _ in range(L):
        coarse = coarse.refine()
    if graded:
        coarse = coarse.map(graded_map(dim))
    return coarse, coarse.refine()


# ----------------------------------------------------------------------------- solver
def assemble_host(dim=3, n=None, graded=True, meshes=None):
    """Meshes, boundary data and all matrices of the scheme on the host (dict), built once.

    Shared by several :class:`NavierStokes` instances (e.g. the CPU and GPU runs of the benchmark).
    """
    t0 = time.perf_counter()
    if meshes is None:
        coarse, fine = make_meshes(dim, n, graded)
    else:
        coarse, fine = meshes
    if coarse.dim != dim:
        raise ValueError(f"meshes have dimension {coarse.dim}, dim is {dim}")
    if coarse.num_hanging_nodes or fine.num_hanging_nodes:
        raise ValueError("the cavity solver needs conforming meshes (no hanging nodes); got "
                         f"{coarse.num_hanging_nodes} / {fine.num_hanging_nodes} hanging nodes")
    d = dim
    space_p = Space(coarse, 1)
    space_s = Space(fine, 1)                  # scalar velocity space (node numbering)
    space_u = Space(fine, 1, components=d)
    parent, child = fine.parent_of(coarse)
    L = assemble.stiffness(space_s)
    C = assemble.derivative_matrices(space_s)
    Bfull = assemble.gradient_iso(space_p, space_u, parent, child)
    Bk = [Bfull[k::d].tocsr() for k in range(d)]
    del Bfull
    Dk = [B.T.tocsr() for B in Bk]
    m_u = assemble.lumped_mass(space_s)
    m_p = assemble.lumped_mass(space_p)
    nu_ = space_s.num_nodes
    # boundary data: lid on the open lid face, walls elsewhere
    lid_id = 1 if d == 3 else 3
    lid_comp = 1 if d == 3 else 0
    allb = fine.boundary_nodes()
    others = fine.boundary_nodes(ids=[i for i in range(2 * d) if i != lid_id])
    lid = np.setdiff1d(fine.boundary_nodes(ids=[lid_id]), others)
    free = np.ones(nu_, dtype=bool)
    free[allb] = False
    G = np.zeros((d, nu_))
    G[lid_comp, lid] = 1.0
    levels, Ap = pressure_hierarchy(space_p)
    return dict(dim=d, coarse=coarse, fine=fine, space_p=space_p, space_s=space_s,
                conv=MultiCSR.from_matrices(C), visc=MultiCSR.from_matrices([L]),
                grad=MultiCSR.from_matrices(Bk), div=MultiCSR.from_matrices(Dk),
                m_u=m_u, m_p=m_p, free=free, G=G, lid=lid, levels=levels, Ap=Ap,
                seconds=time.perf_counter() - t0)


class NavierStokes:
    """Device state and one time step of Algorithm 4 (see the module docstring).

    Parameters
    ----------
    dim, n, graded : cavity and pressure-mesh cells (see :func:`make_meshes`).
    dt, Re : time step and Reynolds number (nu = 1/Re).
    backend : "auto" | "cpu" | "gpu".
    use_kernels : custom multi-matrix CSR kernels on the GPU (False: one cuSPARSE SpMV
        with the equivalent block matrix per product).
    rtol, restart, maxiter : GMRES of the pressure Poisson problem (relative tolerance,
        restart length, restart cycles).
    mg : dict of multigrid options (coarse_rows, smoother, smoother_kwargs, presmooth, postsmooth).
    host : the dict of :func:`assemble_host` (built here when None); ``meshes`` (coarse, fine).
    extrapolate : start the pressure solve from :math:`2q^{n} - q^{n-1}` (linear
        extrapolation in time) instead of :math:`q^n` (from the third step on).

    ``init_time``: seconds for the host assembly (when done here) plus the device setup.
    """

    def __init__(self, dim=3, n=None, *, dt=1e-4, Re=1000.0, graded=True, backend="auto",
                 use_kernels=True, rtol=1e-6, restart=30, maxiter=4, mg=None, meshes=None,
                 host=None, extrapolate=True):
        if not (np.isscalar(dt) and np.isfinite(dt) and dt > 0):
            raise ValueError(f"dt must be a positive number, got {dt!r}")
        if not (np.isscalar(Re) and np.isfinite(Re) and Re > 0):
            raise ValueError(f"Re must be a positive number, got {Re!r}")
        if dim not in (2, 3):
            raise ValueError(f"dim must be 2 or 3, got {dim!r}")
        t0 = time.perf_counter()
        if host is None:
            host = assemble_host(dim, n, graded, meshes)
        elif host["dim"] != dim:
            raise ValueError(f"host data are {host['dim']}-D, dim is {dim}")
        be = get_backend(backend)
        xp = be.xp
        self.host = host
        self.backend, self.xp = be, xp
        self.dim, self.dt, self.Re, self.nu = int(dim), float(dt), float(Re), 1.0 / float(Re)
        self.coarse, self.fine = host["coarse"], host["fine"]
        self.space_p, self.space_s = host["space_p"], host["space_s"]
        d = self.dim
        m_u, m_p, free = host["m_u"], host["m_p"], host["free"]
        nu_, np_ = m_u.size, m_p.size
        self.n_u, self.n_p = nu_, np_
        self.free = free
        self.lid_nodes = host["lid"]
        self.volume = float(m_p.sum())
        S = np.where(free, self.dt / m_u, 0.0)
        # --- device
        self.conv_op = host["conv"].to(be, use_kernels).prepare("conv", d)
        self.visc_op = host["visc"].to(be, use_kernels).prepare("vec", d)
        self.grad_op = host["grad"].to(be, use_kernels).prepare("grad")
        self.div_op = host["div"].to(be, use_kernels).prepare("div")
        self.S = be.asarray(np.ascontiguousarray(np.broadcast_to(S, (d, nu_))))
        self.m_u = be.asarray(m_u)
        self.m_p = be.asarray(m_p)
        self.minv_p = be.asarray(1.0 / m_p)
        # u^0: zero inside, boundary values on the boundary (a copy: on the CPU asarray would
        # alias the shared host data and the time loop would overwrite it)
        self.U = be.asarray(np.array(host["G"], copy=True))
        self.W = xp.zeros((d, d, nu_))
        self.F = xp.zeros((d, nu_))
        self.P = xp.zeros(np_)
        self.Q = xp.zeros(np_)
        self.Qprev = xp.zeros(np_)
        self._x0 = xp.zeros(np_)
        self.extrapolate = bool(extrapolate)
        self.PQ = xp.zeros(np_)
        self.Du = xp.zeros(np_)
        self.b = xp.zeros(np_)
        self._sum = xp.zeros(1)
        self.set_pressure_solver(rtol=rtol, restart=restart, maxiter=maxiter, **dict(mg or {}))
        self.time = 0.0
        self.steps_done = 0
        be.synchronize()
        self.init_time = time.perf_counter() - t0

    def set_pressure_solver(self, *, rtol=1e-6, restart=30, maxiter=4, **mg):
        """(Re)build the GMRES + multigrid solver of Step 2 (``mg``: coarse_rows, smoother,
        smoother_kwargs, presmooth, postsmooth); the host hierarchy is reused."""
        self.poisson = _NeumannPoisson(self.host["levels"], self.host["Ap"], self.backend, rtol=rtol,
                                       restart=restart, maxiter=maxiter, **mg)
        return self.poisson

    # ------------------------------------------------------------------ one step
    def step(self, timer=None):
        """One step of Algorithm 4 on the device arrays; ``timer`` (a :class:`Timer`) times the phases."""
        self.momentum(timer)
        info = self.pressure(timer)
        self.time += self.dt
        self.steps_done += 1
        return info

    def momentum(self, timer=None):
        """Step 1: explicit momentum update of the (predictor) velocity ``U``."""
        ph = timer if timer is not None else _nophase
        with ph("mom-rhs-nonlin"):
            NK.products(self.U, self.W)                               # eq. (14)
            self.conv_op.conv(self.W, self.F)                         # F = sum_k C_k v^k
        with ph("mom-rhs-p"):
            self.grad_op.grad(self.PQ, self.F, -1.0, 1.0)             # F -= B (p + q)
        with ph("mom-rhs-visc"):
            self.visc_op.vec(self.U, self.F, -self.nu, 1.0)           # F -= nu L u
        with ph("mom-solve"):
            NK.axpy_field(self.U, self.S, self.F)                     # u += dt M^-1 F (free nodes)

    def pressure(self, timer=None, update=True):
        """Steps 2 and 3: Neumann Poisson problem for ``Q`` and (``update``) the pressure update."""
        xp, dt = self.xp, self.dt
        ph = timer if timer is not None else _nophase
        with ph("pres-rhs"):
            self.div_op.div(self.U, self.Du)                          # Du = -(div u, psi)
            tot = xp.sum(self.Du).reshape(1) if self.backend.is_gpu else np.array([self.Du.sum()])
            NK.pressure_rhs(self.Du, tot, 1.0 / dt, 1.0 / self.n_p, self.b)
        with ph("pres-solve"):
            x0 = self.Q
            if self.extrapolate and self.steps_done >= 2:
                x0 = self._x0
                x0[...] = self.Q
                K.axpby(-1.0, self.Qprev, 2.0, x0)                    # x0 = 2 q^n - q^{n-1}
            q, info = self.poisson.solve(self.b, x0)
            self.Qprev, self.Q = self.Q, q                            # q is a fresh array: no copy
            tot = xp.dot(self.m_p, q).reshape(1) if self.backend.is_gpu else np.array([self.m_p @ q])
            NK.shift(self.Q, tot, 1.0 / self.volume)                  # int q = 0
        if update:
            with ph("pres-up"):
                NK.pressure_update(self.Q, self.Du, self.minv_p, self.nu, self.P, self.PQ)
        return info

    # ------------------------------------------------------------------ time loop
    def advance(self, steps, timer=None, *, monitor=0, steady_tol=None, check_every=100, quiet=True,
                description="time steps"):
        """Run up to ``steps`` steps; returns dict(steps, wall, energy, rate).

        ``monitor``: every ``monitor`` steps the kinetic energy and the rate
        ``max|u^m - u^{m-1}|/dt`` are written into device arrays (no transfer);
        ``steady_tol``: stop once the rate is below it (one scalar to the host every
        ``check_every`` steps, which must be a multiple of ``monitor``).  ``wall`` is
        the wall-clock time of the loop, device synchronised once at the end.
        """
        if not isinstance(steps, (int, np.integer)) or steps < 1:
            raise ValueError(f"steps must be a positive integer, got {steps!r}")
        if not isinstance(monitor, (int, np.integer)) or monitor < 0:
            raise ValueError(f"monitor must be a non-negative integer, got {monitor!r}")
        if steady_tol is not None and (not monitor or check_every % monitor):
            raise ValueError(f"steady_tol needs monitor > 0 dividing check_every, got monitor={monitor}, "
                             f"check_every={check_every}")
        xp, be = self.xp, self.backend
        nmon = steps // monitor + 1 if monitor else 1
        energy = xp.zeros(nmon)
        rate = xp.zeros(nmon)
        done = 0
        be.synchronize()
        t0 = time.perf_counter()
        for _ in _progress(range(steps), description, quiet=quiet):
            self.step(timer)
            done += 1
            if monitor and done % monitor == 0:
                k = done // monitor
                energy[k] = self.kinetic_energy()
                rate[k] = xp.abs(self.S * self.F).max() / self.dt
                if steady_tol is not None and done % check_every == 0 and float(rate[k]) < steady_tol:
                    break
        be.synchronize()
        wall = time.perf_counter() - t0
        nk = done // monitor + 1 if monitor else 1
        return dict(steps=done, wall=wall, energy=to_host(energy[1:nk]), rate=to_host(rate[1:nk]))

    # ------------------------------------------------------------------ diagnostics
    def kinetic_energy(self):
        r""":math:`\tfrac12\sum_i m_i |u_i|^2` of the predictor (device scalar)."""
        return 0.5 * (self.U * self.U).sum(axis=0).dot(self.m_u)

    def divergence_norm(self, U=None):
        r"""Discrete :math:`L^2` norm of the divergence: :math:`\|D u\|_{(M^p_l)^{-1}}` (host float)."""
        xp = self.xp
        U = self.U if U is None else U
        Du = xp.zeros(self.n_p)
        self.div_op.div(xp.ascontiguousarray(U), Du)
        return float(xp.sqrt((Du * Du * self.minv_p).sum()))

    def corrected(self):
        r"""Corrector :math:`\bar u = u - k M_l^{-1} B q` (device array (d, n); Dirichlet nodes unchanged)."""
        xp = self.xp
        Bq = xp.zeros_like(self.U)
        self.grad_op.grad(self.Q, Bq)
        return self.U - self.S * Bq

    def pressure_mean(self):
        return float(self.m_p.dot(self.P)) / self.volume


class _NoPhase:
    def __call__(self, name):
        return self

    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


_nophase = _NoPhase()


def corrected_velocity(ns):
    """Host (n, d) array of the corrected velocity of a :class:`NavierStokes` state."""
    return np.ascontiguousarray(to_host(ns.corrected()).T)


def centreline(points, U, axis_line, coord=0.5, along=None, samples=None):
    r"""Evaluate a Q1 field on a (graded) tensor-product mesh at points of a grid line.

    ``points`` (n, d) node coordinates of a box mesh, ``U`` (n,) nodal values,
    the line :math:`x_{axis\_line} = coord` (2-D); returns values at ``samples``
    (coordinates along the other axis).  Exact for Q1 on axis-aligned cells
    (bilinear interpolation on the rectilinear grid).
    """
    from scipy.interpolate import RegularGridInterpolator
    d = points.shape[1]
    axes = [np.unique(np.round(points[:, a], 12)) for a in range(d)]
    idx = [np.searchsorted(axes[a], np.round(points[:, a], 12)) for a in range(d)]
    grid = np.full([len(a) for a in axes], np.nan)
    grid[tuple(idx)] = U
    f = RegularGridInterpolator(axes, grid)
    s = np.asarray(samples, dtype=float)
    X = np.empty((s.size, d))
    other = along if along is not None else 1 - axis_line
    X[:, axis_line] = coord
    X[:, other] = s
    return f(X)


# ----------------------------------------------------------------------------- driver
def run(dim=3, n=(32, 32, 64), steps=100, dt=1e-4, Re=1000.0, backend="auto", quiet=False, out=None,
        *, graded=True, use_kernels=True, rtol=1e-6, phases=True, monitor=10, steady_tol=None,
        check_every=100, mg=None, host=None):
    """Run the cavity for ``steps`` time steps (or until steady) and return fields, meshes, timings.

    Parameters
    ----------
    dim, n : 3 (n = pressure cells, default (32, 32, 64)) or 2 (default (32, 32)).
    steps, dt, Re : number of steps, time step, Reynolds number.
    backend : "auto" | "cpu" | "gpu".
    graded : §5.3.1 coordinates (False: uniform cells).
    rtol : GMRES tolerance of the pressure problem, relative to the norm of its rhs.
    phases : time each phase of Table 4 with :class:`adaptmg_problems._timing.Timer` (synchronises the
        device around every phase; ``per_step`` is then slightly pessimistic on the GPU --
        set False for the unperturbed time per step).
    monitor, steady_tol, check_every : see :meth:`NavierStokes.advance`.
    quiet : no progress bar and no printed table.
    out : optional dict to fill.

    Returns
    -------
    dict: ``u`` (host (n_u, d), corrected velocity), ``u_pred`` (predictor), ``p``, ``q``,
    ``meshes`` {"velocity", "pressure"}, ``points_u``, ``points_p``, ``timings`` (seconds per
    phase of Table 4, ``sum``, ``init``), ``per_step`` (wall seconds per step), ``wall``,
    ``steps``, ``time``, ``energy``/``rate`` (monitor history), ``gmres_iterations`` (per
    step), ``div_pred``/``div_corr`` (divergence norms of predictor and corrector),
    ``pressure_mean``, ``backend``, ``dofs``, ``solver`` (the :class:`NavierStokes`).
    """
    if dim == 2 and tuple(np.atleast_1d(n)) == (32, 32, 64):
        n = (32, 32)
    if not isinstance(steps, (int, np.integer)) or steps < 1:
        raise ValueError(f"steps must be a positive integer, got {steps!r}")
    ns = NavierStokes(dim, n, dt=dt, Re=Re, graded=graded, backend=backend, use_kernels=use_kernels,
                      rtol=rtol, mg=mg, host=host)
    be = ns.backend
    timer = Timer(be) if phases else None
    if not quiet:
        print(f"Navier-Stokes {dim}-D cavity Re={Re:g} dt={dt:g}: velocity {ns.n_u} nodes x {dim}, "
              f"pressure {ns.n_p} nodes, backend {be.name}, init {ns.init_time:.2f} s")
    h = ns.advance(steps, timer, monitor=monitor, steady_tol=steady_tol, check_every=check_every,
                   quiet=quiet)
    res = out if out is not None else {}
    tim = timer.as_dict(PHASES) if timer is not None else {}
    tim["init"] = ns.init_time
    res.update(
        u=corrected_velocity(ns), u_pred=np.ascontiguousarray(to_host(ns.U).T),
        p=to_host(ns.P), q=to_host(ns.Q), meshes={"velocity": ns.fine, "pressure": ns.coarse},
        points_u=ns.fine.points, points_p=ns.coarse.points, timings=tim,
        per_step=h["wall"] / h["steps"], wall=h["wall"], steps=h["steps"], time=ns.time,
        energy=h["energy"], rate=h["rate"], gmres_iterations=np.array(ns.poisson.iterations),
        gmres_failures=ns.poisson.failures, div_pred=ns.divergence_norm(),
        div_corr=ns.divergence_norm(ns.corrected()), pressure_mean=ns.pressure_mean(),
        backend=be.name, dofs={"velocity": ns.n_u * dim, "pressure": ns.n_p}, solver=ns)
    if not quiet:
        print(timing_table([res], [be.name]))
        its = res["gmres_iterations"]
        print(f"GMRES iterations per step: mean {its.mean():.2f}, max {its.max()}; "
              f"divergence predictor {res['div_pred']:.3e} -> corrected {res['div_corr']:.3e}")
    return res


def timing_table(results, names):
    """Table 4 layout: one row per phase, one column per result (seconds), plus per step in ms."""
    rows = []
    for ph in PHASES + ("sum",):
        r = {"phase": ph}
        for res, nm in zip(results, names):
            r[nm] = res["timings"].get(ph)
        rows.append(r)
    r = {"phase": "ms/step (wall)"}
    for res, nm in zip(results, names):
        r[nm] = 1e3 * res["per_step"]
    rows.append(r)
    cols = [("phase", "phase")] + [(nm, nm, ".4g") for nm in names]
    return format_table(rows, cols)
