"""Geometric multigrid on an adaptive mesh: hierarchy, constraints, transfer, levels.

``multigrid(space, assemble)`` builds the global-coarsening hierarchy
Omega_0, ..., Omega_L of ``space.mesh`` (seed 001 §2.2), a space of the same
kind on every mesh, the hanging-node + Dirichlet constraints of each level, the
prolongations P_l with the constraints folded in (:mod:`adaptmg.multilevel.transfer`) and
the level operators -- rediscretised by calling ``assemble`` on each level, or
Galerkin products R_l A_l P_l -- and returns a
:class:`~adaptmg.multilevel.MultilevelSolver` whose levels carry the spaces.
"""
from __future__ import annotations

import functools
import inspect
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ..backend import backend_of, call_points, get_backend, is_device_sparse, to_host
from ..fe.csr_ops import add_to_diagonal, canonical_known, csr_diagonal, mask_rows_cols
from ..fe import Constraints, Space
from ..threads import Done, InlineExecutor, default_threads
from ..mesh import Mesh
from .amg import sa_levels
from .nullspace import NEAR_NULLSPACES, near_nullspace as _near_nullspace
from .rap import rap
from .smoothers import smoother_setup_kwargs
from .solver import Level, MultilevelSolver
from .transfer import prolongation

__all__ = ["multigrid", "GeometricMultigrid", "dirichlet_dofs", "dirichlet_values", "default_threads"]


_SPEC_KEYS = {"ids", "where", "components"}


def _value_dict(dirichlet) -> bool:
    """A dict boundary (id or name) -> Dirichlet value, not dict(ids=, where=, components=)."""
    return isinstance(dirichlet, dict) and bool(dirichlet) and not set(dirichlet) <= _SPEC_KEYS


def dirichlet_dofs(space: Space, dirichlet) -> np.ndarray:
    """DoFs fixed by a Dirichlet spec: None, "all" (whole boundary), a boundary id or name
    (``mesh.boundary_names``) or a list of them, a predicate where(x) on boundary nodes, a
    dict(ids=..., where=..., components=...), or a dict boundary -> value such as
    ``{"inlet": g, "wall": 0.0}`` (its keys; the values: :func:`dirichlet_values`).
    An unknown name is a ``ValueError`` listing the mesh's names."""
    try:
        return _dirichlet_dofs(space, dirichlet)
    except ValueError as exc:
        raise ValueError(f"dirichlet={dirichlet!r}: {exc}") from None


def _dirichlet_dofs(space, dirichlet):
    if dirichlet is None:
        return np.zeros(0, dtype=np.int64)
    if isinstance(dirichlet, str) and dirichlet == "all":
        return space.boundary_dofs()
    if callable(dirichlet):
        return space.boundary_dofs(where=dirichlet)
    if _value_dict(dirichlet):
        return space.boundary_dofs(ids=list(dirichlet))
    if isinstance(dirichlet, dict):
        bad = set(dirichlet) - _SPEC_KEYS
        if bad:
            raise ValueError(f"unknown dirichlet keys {sorted(bad)}; allowed: ids, where, components")
        return space.boundary_dofs(dirichlet.get("ids"), dirichlet.get("where"), dirichlet.get("components"))
    return space.boundary_dofs(ids=dirichlet)


def _on_backend(assemble, be):
    """``assemble`` as :func:`multigrid` calls it: on the GPU, a callable that accepts the
    keywords ``device`` and ``keep_on_device`` (the library's forms do) is called with
    ``device=be, keep_on_device=True`` -- pattern, sums and matrix stay on the device and
    the level is constrained there; any other callable is called as ``assemble(space)``."""
    if not be.is_gpu:
        return assemble
    try:
        params = inspect.signature(assemble).parameters
    except (TypeError, ValueError):           # builtins, some C callables: no signature
        return assemble
    if "device" in params and "keep_on_device" in params:
        return functools.partial(assemble, device=be, keep_on_device=True)
    return assemble


def dirichlet_values(space: Space, dirichlet):
    """The Dirichlet value vector g (num_dofs,) of a spec ``{boundary: value}`` (None for any
    other spec: homogeneous).  A value is a number, a (c,) array or a callable g(x) of the
    points (n, d) returning (n,) or (n, c); a node on two listed boundaries takes the value
    of the later entry."""
    if not _value_dict(dirichlet):
        return None
    c = space.components
    xp = space.backend.xp                         # CuPy for a space on a device mesh
    g = xp.zeros(space.num_dofs)
    for key, value in dirichlet.items():          # one vectorised step per named boundary
        nodes = space.boundary_nodes(ids=[key] if isinstance(key, str) else key)
        if callable(value):
            v = call_points(value, space.points[nodes], xp=xp)   # a host-only g: evaluated on the host
        else:
            v = xp.asarray(value, dtype=float)
        if v.shape in ((), (c,)):
            v = xp.broadcast_to(v.reshape(-1)[None, :] if v.ndim else v, (nodes.size, c))
        elif c == 1 and v.shape == (nodes.size,):
            v = v[:, None]
        elif v.shape != (nodes.size, c):
            raise ValueError(f"dirichlet value of {key!r} must be a number, shape ({c},) or a callable "
                             f"g(x) returning ({nodes.size},) or ({nodes.size}, {c}), got shape {v.shape}")
        if not bool(xp.isfinite(v).all()):
            raise ValueError(f"dirichlet value of {key!r} contains NaN or Inf")
        g.reshape(-1, c)[nodes] = v
    return g


def homogeneous(dirichlet):
    """The spec without its Dirichlet values (the boundaries of a ``{boundary: value}`` dict),
    e.g. for a dual or correction problem on the same boundary."""
    return list(dirichlet) if _value_dict(dirichlet) else dirichlet


def _level_constraints(space, dirichlet, values=False, build_H=True):
    """The constraints of one level; with ``values`` the spec's Dirichlet values (finest level);
    ``build_H`` as for :class:`~adaptmg.fe.Constraints`."""
    return Constraints(space, dirichlet_dofs(space, dirichlet),
                       dirichlet_values(space, dirichlet) if values else None, build_H=build_H)


def _hierarchy_min_cells(space, coarse_max_rows, max_coarse):
    """Where global coarsening may stop: a mesh of at most ``m`` cells has at most ``m * nloc *
    components <= coarse_max_rows`` DoFs, so the finest level that ``coarse_max_rows`` keeps is
    that mesh or a finer one and the coarser meshes would be dropped unbuilt anyway (an
    adaptive mesh's hierarchy goes down through many small levels).  1 (down to the coarse
    mesh) without ``coarse_max_rows``, or when algebraic levels would be built below a coarse
    level larger than ``max_coarse``."""
    if coarse_max_rows is None or (max_coarse is not None and max_coarse < coarse_max_rows):
        return 1
    return max(1, coarse_max_rows // (space.element.num_local * space.components))


def _space_H(space):
    """The space's hanging-node matrix, built now (a set-up task of its own)."""
    return space.H


def _on_device(A):
    """True when constraining ``A`` runs on the GPU: a cupyx matrix, or a node-block matrix
    (:class:`~adaptmg.fe.csr_ops.NodeBlockMatrix`) with a GPU backend."""
    return is_device_sparse(A) or bool(getattr(getattr(A, "backend", None), "is_gpu", False))


def _after(first, fn, *args):
    """``fn(*args)`` once the future ``first`` (or each of a tuple of futures) is done (a task
    that must follow others: it is submitted after them, so FIFO workers cannot deadlock)."""
    for f in first if isinstance(first, tuple) else (first,):
        f.result()
    return fn(*args)


def _constrained(cons, A):
    """``cons.result().matrix(A)``: a level's constrained matrix once its constraints (a
    future submitted before this task) are built."""
    return cons.result().matrix(A)


def _level_prolongation(coarse, fine, cons_coarse, cons_fine, be=None, device_id=None):
    """(P, R = P^T as CSR) between two levels, once both levels' constraints are built; with
    ``be`` the GPU backend both are built on device ``device_id`` (this may run on a worker
    thread, whose current device is its own) and the transpose is cuSPARSE's."""
    if be is not None and be.is_gpu:
        with be.xp.cuda.Device(device_id):
            P = prolongation(coarse, fine, cons_coarse.result().free, cons_fine.result().free,
                             backend=be)
            return P, P.T.tocsr()
    P = prolongation(coarse, fine, cons_coarse.result().free, cons_fine.result().free)
    R = P.T.tocsr()
    if canonical_known(P):
        R.has_canonical_format = True     # the transpose of a canonical CSR is canonical (no re-scan)
    return P, R


def _galerkin(R, K, P, free):
    r"""The Galerkin coarse matrix :math:`R K P + s (I - Z)` (``s`` the mean of
    :math:`|(R K P)_{ii}|` over the ``free`` DoFs, a host mask), zeros dropped: on the device
    (cuSPARSE SpGEMM, no download; in row blocks past 32-bit counts: :mod:`.rap`) when ``K``,
    ``P`` and ``R`` are device matrices, else by SciPy's products of host copies -- both as
    :math:`R (K P)`."""
    if not (is_device_sparse(K) and is_device_sparse(P) and is_device_sparse(R)):
        P, R = to_host(P), to_host(R)
        Kc = rap(R, to_host(K), P)
        dvals = np.abs(Kc.diagonal()[free])
        s = float(dvals.mean()) if dvals.size else 1.0
        Kc = add_to_diagonal(Kc, np.where(free, 0.0, s))
        Kc.eliminate_zeros()
        return Kc
    be = backend_of(K)
    xp = be.xp
    Kc = rap(R, K, P)
    Kc.sum_duplicates()
    z = xp.asarray(free)
    dvals = xp.abs(csr_diagonal(Kc))[z]
    s = float(dvals.mean()) if dvals.shape[0] else 1.0
    f = xp.flatnonzero(~z).astype(Kc.indices.dtype)        # on the device (a device mesh's mask)
    if f.shape[0]:
        D = be.sparse.coo_matrix((xp.full(f.shape[0], s), (f, f)), shape=Kc.shape).tocsr()
        Kc = (Kc + D).tocsr()
    keep = xp.ones(Kc.shape[0], dtype=bool)
    return mask_rows_cols(Kc, keep, keep, drop_zeros=True)     # eliminate_zeros, on the device


class _Timeline:
    """Host wall-clock spans of the set-up's tasks, for :attr:`GeometricMultigrid.setup_timeline`."""

    def __init__(self):
        self.t0 = time.perf_counter()
        self.rows = []
        self._lock = threading.Lock()

    def wrap(self, name, fn):
        def timed(*args, **kwargs):
            t = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                with self._lock:
                    self.rows.append((name, threading.current_thread().name, t - self.t0,
                                      time.perf_counter() - self.t0))
        return timed


def _setup_pool(threads):
    if threads is None:
        threads = default_threads()
    if not isinstance(threads, (int, np.integer)) or isinstance(threads, bool) or threads < 1:
        raise ValueError(f"threads must be a positive integer or None, got {threads!r}")
    return InlineExecutor() if threads == 1 else ThreadPoolExecutor(max_workers=int(threads))


class GeometricMultigrid(MultilevelSolver):
    """A :class:`MultilevelSolver` built on a finite element space (what :func:`multigrid` returns).

    ``levels`` are coarse -> fine: first ``num_algebraic`` algebraic levels (none when the
    geometric hierarchy is deep enough), then one level per space of ``spaces``.

    Attributes
    ----------
    spaces : list of Space, coarse -> fine; ``spaces[i]`` is ``levels[num_algebraic + i]``.
    constraints : list of Constraints, one per space.
    assembled : the finest unconstrained matrix ``assemble(spaces[-1])``, as ``assemble``
        returned it: a host matrix, or a cupyx matrix when ``assemble`` built it on the GPU.
    A : the finest constrained matrix ``K = Z H^T A H Z + s (I - Z)``, the matrix of
        ``solve``, as SciPy CSR: ``levels[-1].A`` itself, or -- when the GPU set-up built it
        on the device (``levels[-1].A`` a cupyx matrix) -- its host copy, made on first access.
    num_algebraic : number of algebraic levels below the geometric ones.
    setup_timeline : list of (task, thread, start s, end s) of the :func:`multigrid` call that
        built it, sorted by start, times from the call's start: where the set-up's time went
        (mesh hierarchy, spaces, constraints and transfers per level on the worker threads,
        assembly and constraining in the calling thread, the solver's own set-up).  Host
        wall clock: device work a task launched may finish later.
    """

    def __init__(self, levels, *, spaces, constraints, assembled, **kwargs):
        spaces, constraints = list(spaces), list(constraints)
        if len(spaces) != len(constraints):
            raise ValueError(f"GeometricMultigrid: {len(spaces)} spaces but {len(constraints)} constraints")
        if not spaces:
            raise ValueError("GeometricMultigrid needs at least one space")
        super().__init__(levels, **kwargs)
        n_alg = len(self.levels) - len(spaces)
        if n_alg < 0:
            raise ValueError(f"GeometricMultigrid: {len(spaces)} spaces but only {len(self.levels)} levels")
        if self.levels[-1].n != spaces[-1].num_dofs:
            raise ValueError(f"GeometricMultigrid: the finest level has {self.levels[-1].n} rows, "
                             f"the finest space {spaces[-1].num_dofs} DoFs")
        self.spaces = spaces
        self.constraints = constraints
        self.assembled = assembled
        self.num_algebraic = n_alg

    @property
    def A(self):
        """The finest constrained matrix as SciPy CSR: ``levels[-1].A``, or its host copy
        (made once, on first access) when the GPU set-up built it on the device."""
        A = self.levels[-1].A
        if not is_device_sparse(A):
            return A
        if getattr(self, "_A_host", None) is None or self._A_host[0] is not A:
            self._A_host = (A, to_host(A))
        return self._A_host[1]

    def constrain(self, b):
        """Constrained right-hand side ``f = Z H^T (b - A H g) + s g`` on the finest space
        (:meth:`adaptmg.Constraints.rhs`)."""
        return self.constraints[-1].rhs(b, self.assembled)

    def expand(self, x):
        """Finite element nodal values ``u = H x`` on the finest space (numpy or cupy ``x``)."""
        return self.constraints[-1].expand(x)


def _algebraic_levels(K0, space, cons, near_nullspace, be, dtype, coarse, max_coarse, amg_kwargs):
    """Smoothed-aggregation levels below the coarsest geometric matrix ``K0`` (coarse -> fine,
    the last one being ``K0`` itself with its ``P``/``R``)."""
    B = _near_nullspace(space, near_nullspace, free=cons.free)
    kw = dict(amg_kwargs or {})
    bad = set(kw) & {"backend", "block_size", "max_coarse", "dtype", "coarse", "B"}
    if bad:
        raise ValueError(f"amg_kwargs must not set {sorted(bad)} (multigrid sets them)")
    kw.setdefault("smoother", "chebyshev")
    kw.setdefault("presmooth", 1)
    kw.setdefault("postsmooth", 1)
    levels, _ = sa_levels(K0, B, backend=be, block_size=space.components, max_coarse=max_coarse,
                          dtype=dtype, coarse=coarse, **kw)
    return levels


def _check_mesh_backend(space, be):
    """True when ``space``'s mesh lives on the GPU (then the set-up runs there: ``be`` must be
    the GPU); a ValueError that says what to do otherwise."""
    if not space.mesh.backend.is_gpu:
        return False
    if not be.is_gpu:
        raise ValueError(f"multigrid: the space's mesh lives on the GPU but backend={be.name!r}; "
                         "pass backend='gpu', or move the mesh to the host first (mesh.to('cpu'))")
    return True


#: ``multigrid(coarse_max_rows="auto")`` on the GPU: the direct coarse solve takes the finest
#: level with at most this many rows (2-D Q1 boxes: 1089 rows, 3-D: 729)
GPU_COARSE_MAX_ROWS = 2000


def _coarse_max_rows(value, be, coarse):
    """The ``coarse_max_rows`` of :func:`multigrid` for this backend ("auto" resolved)."""
    if isinstance(value, str):
        if value != "auto":
            raise ValueError(f"coarse_max_rows must be a positive integer, None or 'auto', got {value!r}")
        return GPU_COARSE_MAX_ROWS if (be.is_gpu and coarse == "direct") else None
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"coarse_max_rows must be a positive integer, None or 'auto', got {value!r}")
    return int(value)


def multigrid(space, assemble, *, dirichlet="all", degree=1, components=1, galerkin=False,
              smoother="jacobi", smoother_kwargs=None, presmooth=2, postsmooth=2,
              coarse="direct", coarse_sweeps=10, max_levels=None, backend="auto",
              dtype=np.float64, max_direct=20000, threads=None, max_coarse=2000,
              near_nullspace="constant", amg_kwargs=None, coarse_max_rows="auto"):
    """Multigrid for ``assemble(space)`` with hanging-node and Dirichlet constraints: geometric
    levels from the mesh's refinement history, algebraic ones below when those run out.

    Parameters
    ----------
    space : Space or Mesh
        The finest space (a Mesh gives Q``degree`` with ``components`` components).
    assemble : callable(space) -> sparse matrix
        Unconstrained system matrix on a space (rediscretisation on every level).  It may
        return a cupyx matrix on the GPU backend (e.g. ``scalar_form(..., device=be,
        keep_on_device=True)``): that level's constraints are then applied on the device
        and its matrix never goes through the host (no download, host masking and upload).
        On the GPU a callable that accepts the keywords ``device`` and ``keep_on_device``
        -- ``assemble.stiffness``, ``assemble.mass``, ``assemble.scalar_form``, a
        ``functools.partial(assemble.elasticity, lam=.., mu=..)`` (not a ``lambda s: ...``,
        whose signature has neither) -- is called with ``device=<the GPU backend>,
        keep_on_device=True``, so every level is built so.
    dirichlet : see :func:`dirichlet_dofs` (default: homogeneous on the whole boundary).  A
        dict boundary -> value (``{"inlet": g, "wall": 0.0}``, ids or names) also sets the
        finest level's Dirichlet values, applied by ``constrain(b)``.
    galerkin : bool
        Coarse operators R A P instead of rediscretisation (``assemble`` is then
        called only on the finest space).
    smoother : "jacobi", "block_jacobi" (blocks of ``components``), "chebyshev",
        "block_gauss_seidel", any name of :data:`~adaptmg.multilevel.smoothers.SMOOTHERS`, or
        a factory.  Jacobi-type smoothers get ``omega="auto"`` unless ``smoother_kwargs``
        sets it: omega_l = 4 / (3 lambda_max(S_l A_l)) per level (measured: V(2,2) factors
        0.05 for 2-D Q1 Poisson, 0.03 in 3-D, 0.44 for 3-D elasticity with lambda/mu = 4,
        where the fixed omega = 2/3 diverges).  A sequence smooths the levels differently,
        finest level first, the last entry for all coarser geometric levels
        (:func:`~adaptmg.multilevel.smoothers.level_smoothers`): ``smoother=
        ("block_gauss_seidel", "block_jacobi")`` is block GS on the finest level and block
        Jacobi (``omega="auto"`` per level) below, where on the GPU each GS sweep would
        cost one launch per colour on a launch-bound level; ``smoother_kwargs`` is then
        None or one dict per entry.  Gauss-Seidel sweeps symmetrically by default (forward
        then backward, pyamg's default); ``smoother_kwargs=({"sweep": "forward"}, {})``
        pre-smooths forward and post-smooths with the adjoint, backward sweeps -- the cycle
        stays symmetric at half the colour launches (3-D elasticity on an H200: one V-cycle
        1.3-1.9x block Jacobi's, 11 CG iterations against 10 and 15;
        ``scripts/bench_elasticity_gs.py``).  Algebraic levels keep ``amg_kwargs``' smoother.
    coarse : "direct" (dense factorisation on the device) or "smoother".
    threads : worker threads for the per-level set-up (constraints, prolongations,
        constrained matrices; default :func:`default_threads`, 1 = all in this thread).
        ``assemble`` is always called from the calling thread, finest level first.
    max_levels : at most this many *geometric* levels.
    max_coarse : int or None
        When the coarsest geometric matrix has more rows than this (default 2000: the
        problems of ``problems/`` coarsen to at most 1089 rows and are unaffected),
        smoothed-aggregation levels are appended (set-up on the solver's backend: on the
        device on the GPU, pyamg on the CPU) until a level has at most ``max_coarse`` rows.
        None: purely geometric.
    near_nullspace : "constant" (per component, default), "rigid_body" (elasticity;
        ``components`` a multiple of the dimension) or an array (coarsest space's DoFs, k)
        -- the near-nullspace of the algebraic levels.
    amg_kwargs : dict of further :func:`adaptmg.amg` arguments for the algebraic levels
        (``setup``, ``strength``, ``seed``, ``front`` -- the device set-up's advancing-front
        aggregation, None for random order --, ``smoother`` -- default V(1,1) Chebyshev --, ...).
    coarse_max_rows : int, None or "auto"
        Cycle only down to the finest level with at most this many rows and solve there
        directly; geometric levels below it are not built at all.  None: every level.
        "auto" (default): :data:`GPU_COARSE_MAX_ROWS` on the GPU with ``coarse="direct"``,
        else None.  On the GPU the small levels cost kernel launches rather than
        bandwidth, while the dense coarse inverse of <= 2000 rows is one GEMV of <= 32 MB
        (~10 us on an H100); on the CPU the GEMV costs more than the small levels it
        replaces.  Measured with ``scripts/bench_solve_latency.py``.
    Other arguments go to :class:`~adaptmg.multilevel.MultilevelSolver`.

    Returns
    -------
    GeometricMultigrid: a MultilevelSolver with ``spaces`` (coarse -> fine), ``constraints``
    (per geometric level), ``A`` (the finest constrained host matrix), ``assembled`` and
    ``constrain(b)`` / ``expand(x)`` for the finest level.
    """
    if isinstance(space, Mesh):
        space = Space(space, degree, components)
    if not isinstance(space, Space):
        raise TypeError(f"multigrid expects a Space or a Mesh, got {type(space).__name__}")
    if not callable(assemble):
        raise TypeError(f"assemble must be a callable assemble(space) -> matrix, got {type(assemble).__name__}")
    if max_coarse is not None and (isinstance(max_coarse, bool) or not isinstance(max_coarse, (int, np.integer))
                                   or max_coarse < 1):
        raise ValueError(f"max_coarse must be a positive integer or None, got {max_coarse!r}")
    if isinstance(near_nullspace, str) and near_nullspace not in NEAR_NULLSPACES:
        raise ValueError(f"near_nullspace must be one of {NEAR_NULLSPACES} or an array, got {near_nullspace!r}")
    be = get_backend(backend)
    on_device_mesh = _check_mesh_backend(space, be)
    if on_device_mesh:
        threads = 1          # CuPy's current device is per thread: the device set-up runs inline
    coarse_max_rows = _coarse_max_rows(coarse_max_rows, be, coarse)
    tl = _Timeline()
    with _setup_pool(threads) as pool:
        # the finest space's node numbering (a Q1 space numbers its mesh on first use) on a
        # worker while this thread coarsens the mesh; then the coarse spaces side by side
        numbered = pool.submit(tl.wrap("numbering (finest)", getattr), space, "cell_dofs")
        # beside it the hanging nodes (in forest ids: no numbering needed), then, after both,
        # the finest level's constraints (H, Dirichlet DoFs: with the hanging nodes the
        # longest host task of an adaptive mesh), not after the hierarchy
        hanging = pool.submit(tl.wrap("hanging nodes (finest)", space.find_hanging_nodes))
        fine_cons = pool.submit(tl.wrap("constraints (finest)", _after), (numbered, hanging),
                                _level_constraints, space, dirichlet, True, False)
        # its H on a worker of its own: the finest transfer needs only the free DoFs, the
        # finest constrain (in this thread, after the assembly) the H
        fine_H = pool.submit(tl.wrap("H (finest)", _after), fine_cons, _space_H, space)
        if coarse_max_rows is not None and isinstance(numbered, Done) and space.num_dofs <= coarse_max_rows:
            meshes = [space.mesh]            # the direct coarse solve takes the finest level: no coarsening
        else:
            meshes = tl.wrap("mesh hierarchy", space.mesh.hierarchy)(
                max_levels=max_levels, min_cells=_hierarchy_min_cells(space, coarse_max_rows, max_coarse))
        sp_f = [pool.submit(tl.wrap(f"space {l}", Space), m, space.degree, space.components)
                for l, m in enumerate(meshes[:-1])]
        spaces = [f.result() for f in sp_f] + [space]
        numbered.result()
        if coarse_max_rows is not None:      # levels below the coarse one are not built
            small = [l for l, s in enumerate(spaces) if s.num_dofs <= coarse_max_rows]
            if small and small[-1] > 0:
                spaces = spaces[small[-1]:]
        L = len(spaces)
        # the library's own per-level work (constraints, prolongations, constrained matrices)
        # runs on worker threads while this thread calls ``assemble`` (user code, maybe not
        # thread-safe) fine to coarse; every task is a pure function of its inputs, so the
        # result does not depend on the scheduling
        # (a task only waits for tasks submitted before it: no deadlock with FIFO workers).
        # Fine to coarse: the largest tasks first, so that the finest transfer -- the longest
        # task -- starts as soon as the two finest levels' constraints are there
        cons_f = [None] * (L - 1) + [fine_cons]
        for l in range(L - 2, -1, -1):
            cons_f[l] = pool.submit(tl.wrap(f"constraints {l}", _level_constraints), spaces[l], dirichlet)
        # on the GPU the transfers are built on the device; with Galerkin products when the
        # finest matrix is built there too (a library form: the products then run there)
        wrapped = _on_backend(assemble, be)
        on_device_forms = be.is_gpu and wrapped is not assemble
        on_dev = ((be, int(be.xp.cuda.Device().id))
                  if be.is_gpu and (not galerkin or on_device_forms or on_device_mesh) else (None, None))
        P_f = [None] * L
        for l in range(L - 1, 0, -1):
            P_f[l] = pool.submit(tl.wrap(f"transfer {l}", _level_prolongation), spaces[l - 1],
                                 spaces[l], cons_f[l - 1], cons_f[l], *on_dev)
        assemble = wrapped
        Afine = tl.wrap(f"assemble {L - 1}", assemble)(space)
        n = space.num_dofs
        if getattr(Afine, "shape", None) != (n, n):
            raise ValueError(f"assemble(space) must return a {n} x {n} matrix, "
                             f"got shape {getattr(Afine, 'shape', None)}")
        fine_H.result()
        K_f = [None] * L
        # each level's constraining waits for that level's constraints only (not for the
        # coarser levels', still being built on the workers)
        for l in range(L - 1, L - 2 if galerkin else -1, -1):      # fine to coarse
            A_l = Afine if l == L - 1 else tl.wrap(f"assemble {l}", assemble)(spaces[l])
            if _on_device(A_l):
                # on the device, in this thread (CuPy's current device is per thread): a few kernels
                K_f[l] = Done(tl.wrap(f"constrain {l}", cons_f[l].result().matrix), (A_l,))
            else:
                K_f[l] = pool.submit(tl.wrap(f"constrain {l}", _constrained), cons_f[l], A_l)
        cons = [f.result() for f in cons_f]
        PRs = [(None, None)] + [f.result() for f in P_f[1:]]
        Ps = [P for P, _ in PRs]
        Ks = [None] * L
        Ks[-1] = K_f[-1].result()
        for l in range(L - 2, -1, -1):
            if galerkin:
                P, R = PRs[l + 1]
                Ks[l] = _galerkin(R, Ks[l + 1], P, cons[l].free)
            else:
                Ks[l] = K_f[l].result()
    alg = []
    if max_coarse is not None and Ks[0].shape[0] > max_coarse:
        alg = tl.wrap("algebraic levels", _algebraic_levels)(Ks[0], spaces[0], cons[0], near_nullspace,
                                                             be, dtype, coarse, int(max_coarse), amg_kwargs)
        PRs[0] = (alg[-1].P, alg[-1].R)
        Ps[0] = alg[-1].P
    levels = list(alg[:-1])
    for l, (s, K) in enumerate(zip(spaces, Ks)):
        meta = {"kind": "geometric", "cells": s.mesh.num_cells, "hanging": int(s.hanging_nodes.size)}
        levels.append(Level(K, P=Ps[l], R=PRs[l][1], meta=meta))
    if coarse_max_rows is not None:
        keep = [i for i, lev in enumerate(levels) if lev.n <= coarse_max_rows]
        if keep and keep[-1] > 0:
            k, n_alg = keep[-1], len(levels) - len(spaces)
            levels = levels[k:]
            levels[0] = Level(levels[0].A, meta=levels[0].meta)
            spaces, cons = spaces[max(k - n_alg, 0):], cons[max(k - n_alg, 0):]
    skw = smoother_setup_kwargs(smoother, smoother_kwargs, block_size=space.components, auto_omega=True)
    ml = tl.wrap("solver set-up (smoothers, fused matrices, coarse solve)", GeometricMultigrid)(
        levels, spaces=spaces, constraints=cons, assembled=Afine, coarse=coarse,
        coarse_sweeps=coarse_sweeps, presmooth=presmooth, postsmooth=postsmooth, backend=backend,
        dtype=dtype, smoother=smoother, smoother_kwargs=skw, max_direct=max_direct)
    ml.setup_timeline = sorted(tl.rows, key=lambda r: r[2])
    return ml
