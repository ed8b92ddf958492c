r"""Smoothed aggregation from any sparse SPD matrix: :func:`amg`, on the device when the backend is.

``adaptmg.amg(A, B)`` builds an algebraic hierarchy (Vanek, Mandel, Brezina 1996) and
returns a :class:`~adaptmg.multilevel.MultilevelSolver` that cycles it with adaptmg's
smoothers and kernels::

    ml = adaptmg.amg(A)                      # SciPy or cupyx CSR
    x = ml.solve(b, rtol=1e-8, accel="cg")
    M = ml.aspreconditioner()                # the M of adaptmg.linalg.cg / gmres

Per level :math:`l`, with the near-nullspace :math:`B_l` (``k`` columns; constants by
default, rigid-body modes for elasticity, :mod:`adaptmg.multilevel.nullspace`):

1. strong neighbours :math:`|a_{ij}| \ge \theta\sqrt{|a_{ii}a_{jj}|}` (on node blocks for
   systems), 2. aggregates from a distance-2 maximal independent set (on the finest level
   grown as advancing fronts from sparse seeds, ``front``), 3. the tentative
   prolongator :math:`T` (per-aggregate QR of :math:`B_l`, :math:`B_{l+1} = R`), 4. one
   damped-Jacobi smoothing :math:`P = (I - \tfrac{4}{3\rho} D^{-1}A) T` with
   :math:`\rho \approx \rho(D^{-1}A)` (Lanczos), 5. :math:`A_{l+1} = R A P`, :math:`R = P^T`,

until a level has at most ``max_coarse`` rows (dense direct solve) or coarsening stalls.
Steps 1-3 live in :mod:`adaptmg.multilevel.aggregation`.

Two set-up paths, one result type:

* ``setup="device"`` (default on the GPU): the steps above, written once against the
  backend's ``xp`` / ``sparse`` -- cupyx/cuSPARSE on the GPU with no host round trip but
  a few scalars per Luby round and per level, NumPy/SciPy on the CPU (the tests run it
  there).
  Measured on an H100 (``scripts/bench_amg.py``, Q1 Poisson, Dirichlet): hierarchy and
  smoothers 0.13-0.24 s for ``Mesh.box`` 1024^2 (1.05M rows, 5 levels, operator
  complexity 1.20, 15 CG iterations, solve 14-20 ms; pyamg on the host: 2.7 s set-up,
  2.2 s solve, 9 iterations) and 0.39 s for 128^3 (2.1M rows, 10 iterations, 30 ms),
  both with the random-order aggregation (``front=None``).  The front aggregation of the
  finest level (default since) takes 15 instead of 12 rounds there (21 instead of 16 in
  3-D), each with two SpMVs and four row maxima instead of one and two, plus one more
  fill phase; on the CPU (NumPy, same code) it brings the hybrid below ``Mesh.box``
  512^2 from 11 to 9 CG iterations (1024^2: 12 -> 9, 3-D 64^3: 8 -> 7, distorted hex
  64^3: 11 -> 10; the geometric hierarchy of the refined mesh: 6) at operator complexity
  1.18 instead of 1.20 in 2-D, 1.07 instead of 1.09 in 3-D
  (``tests/multilevel/test_hybrid.py``).
* ``setup="pyamg"`` (default on the CPU): pyamg's ``smoothed_aggregation_solver`` builds
  the hierarchy on the host (its standard aggregation and candidate improvement), and
  :func:`~adaptmg.multilevel.pyamg.from_pyamg` turns its levels into adaptmg levels.

Smoothers.  pyamg smooths with Gauss-Seidel, which does not parallelise; adaptmg's
default is one degree-3 Chebyshev sweep before and after the coarse correction
(:math:`\lambda_{max} = 1.1\rho_l` from step 4, no further eigenvalue estimate), which
stays within 1.3x of pyamg's iteration counts on pyamg's gallery problems, rotated
anisotropy included; V(2,2) damped Jacobi (``smoother="jacobi"``, :math:`\omega =
4/(3\rho_l)`) is cheaper per cycle but needs 1.3-1.5x pyamg's iterations there
(``tests/multilevel/test_amg.py`` holds the measured table).

Singular matrices (pure Neumann problems).  When the coarsest matrix :math:`A_0`
annihilates columns of its near-nullspace :math:`B_0` (``||A_0 b|| <= 1e-8 ||A_0||
||b||``, e.g. the constants of a Neumann Laplacian, which smoothed aggregation carries
exactly to every level), the coarse level stores :math:`A_0 + \gamma QQ^T` (``Q`` an
orthonormal basis of those columns, :math:`\gamma = \mathrm{mean}(\mathrm{diag}\,A_0)`)
for the direct solve -- the regularisation of the Navier-Stokes pressure solver
(:mod:`problems.navier_stokes`).  For a right-hand side orthogonal to the kernel (the
restricted residual of a consistent problem is) its solution is the one of
:math:`A_0 x = b` orthogonal to the kernel; the level's ``meta["regularized"]`` holds
the kernel dimension.
"""
from __future__ import annotations

import numbers
import time

import numpy as np

from ..backend import get_backend, is_device_sparse, is_sparse, to_host
from ..fe.csr_ops import csr_diagonal
from . import aggregation as agg
from .rap import rap
from .smoothers import make_smoother, normalize_smoother_name
from .solver import Level, MultilevelSolver

__all__ = ["amg", "sa_levels", "SETUPS"]

SETUPS = ("device", "pyamg")
FRONT = 1.0                    # seed density of the finest level's advancing-front aggregation


# ----------------------------------------------------------------------------- input checks
def _theta(strength):
    """``theta`` from ``strength``: a number, ``"symmetric"`` or ``("symmetric", {"theta": t})``."""
    if isinstance(strength, bool):
        raise TypeError(f"strength must be a number in [0, 1) or ('symmetric', {{'theta': t}}), got {strength!r}")
    if isinstance(strength, numbers.Real):
        t = float(strength)
    elif strength == "symmetric":
        t = 0.0
    elif (isinstance(strength, (tuple, list)) and len(strength) == 2 and strength[0] == "symmetric"
          and isinstance(strength[1], dict) and set(strength[1]) <= {"theta"}):
        t = float(strength[1].get("theta", 0.0))
    else:
        raise ValueError(f"strength must be a number in [0, 1), 'symmetric' or "
                         f"('symmetric', {{'theta': t}}), got {strength!r}")
    if not (0.0 <= t < 1.0):
        raise ValueError(f"strength: theta must lie in [0, 1), got {t!r}")
    return t


def _front(front):
    """The seed density of the finest level's advancing-front aggregation, or None (random order)."""
    if front is None:
        return None
    if isinstance(front, bool) or not isinstance(front, numbers.Real) or not 0 < front <= 1000:
        raise ValueError(f"front must be a seed density in (0, 1000] or None, got {front!r}")
    return float(front)


def _positive_int(name, v, minimum=1):
    if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {v!r}")
    return int(v)


def _check_matrix(A):
    if not is_sparse(A):
        raise TypeError(f"amg: A must be a SciPy or cupyx sparse matrix, got {type(A).__name__}")
    if A.ndim != 2 or A.shape[0] != A.shape[1]:
        raise ValueError(f"amg: A must be square, got shape {A.shape}")
    if A.shape[0] == 0:
        raise ValueError("amg: A is empty (shape (0, 0))")
    if np.dtype(A.dtype).kind not in "fiub":
        raise TypeError(f"amg: A must be real, got dtype {A.dtype}")


def _block_size(A, block_size):
    if block_size is None:
        bs = getattr(A, "blocksize", (1, 1))
        return int(bs[0]) if bs[0] == bs[1] else 1
    b = _positive_int("block_size", block_size)
    if A.shape[0] % b:
        raise ValueError(f"amg: block_size={b} does not divide the number of rows {A.shape[0]}")
    return b


def default_B(be, n, block_size=1, dtype=np.float64):
    """Constants per component: ``B[i, i % block_size] = 1`` (pyamg's default for block systems)."""
    xp = be.xp
    B = xp.zeros((n, block_size), dtype=dtype)
    i = xp.arange(n)
    B[i, i % block_size] = 1.0
    return B


def _check_B(be, B, n, block_size):
    if B is None:
        return default_B(be, n, block_size)
    B = be.asarray(B)
    if B.ndim == 1:
        B = B.reshape(-1, 1)
    if B.ndim != 2 or B.shape[0] != n:
        raise ValueError(f"amg: B must have shape ({n}, k), got {tuple(B.shape)}")
    k = B.shape[1]
    if not 1 <= k <= n:
        raise ValueError(f"amg: B must have between 1 and {n} columns, got {k}")
    if B.dtype.kind not in "fiu":
        raise TypeError(f"amg: B must be real, got dtype {B.dtype}")
    B = B.astype(np.float64)
    if not bool(be.xp.isfinite(B).all()):
        raise ValueError("amg: B contains NaN or Inf")
    return be.xp.ascontiguousarray(B)


def _resolve(backend, A, setup):
    be = get_backend(backend)
    if is_device_sparse(A) and backend == "auto":
        be = get_backend("gpu")
    if setup is None:
        setup = "device" if be.is_gpu else "pyamg"
    if setup not in SETUPS:
        raise ValueError(f"setup must be one of {SETUPS} or None, got {setup!r}")
    return be, setup


# ----------------------------------------------------------------------------- smoothers
def _level_smoother(spec, A, rho, be, dtype, kwargs):
    """The smoother of an algebraic level, its damping taken from the set-up's ``rho(D^{-1}A)``."""
    kw = dict(kwargs or {})
    key = normalize_smoother_name(spec) if isinstance(spec, str) else None
    if key == "jacobi":
        kw.setdefault("omega", 4.0 / (3.0 * rho))
    elif key == "block_jacobi":
        kw.setdefault("omega", "auto")
    elif key == "chebyshev":
        kw.setdefault("lmax", 1.1 * rho)
    return make_smoother(spec, A, backend=be, dtype=dtype, **kw)


# ----------------------------------------------------------------------------- device path
def _diag_inverse(be, A, where):
    d = csr_diagonal(A)
    bad = ~(d > 0) | ~be.xp.isfinite(d)
    if bool(bad.any()):
        i = int(be.xp.flatnonzero(bad)[0])
        raise ValueError(f"amg: {where} is not SPD: diagonal entry {i} is {float(d[i])!r} "
                         f"({int(bad.sum())} non-positive or non-finite diagonal entries)")
    return 1.0 / d


def _aggregate_level(be, A, B, dof_node, num_nodes, theta, seed, akw):
    """Aggregates of one level and its tentative prolongator: ``(T, Bc, col_agg, nagg)``;
    ``T`` is None when the level does not coarsen (no aggregate, or >= 90 % of the rows).
    ``akw``: keyword arguments of :func:`~adaptmg.multilevel.aggregation.aggregate`."""
    xp = be.xp
    n = A.shape[0]
    iso = agg.isolated_dofs(be, A)
    if dof_node is None:
        a, nagg = agg.aggregate(be, agg.strength(be, A, theta), seed=seed, **akw)
    else:
        G = agg.strength(be, agg.node_graph(be, A, dof_node, num_nodes), theta)
        a_node, nagg = agg.aggregate(be, G, seed=seed, **akw)
        a = a_node[dof_node]
    a = xp.where(iso, -1, a)
    if nagg == 0:
        return None, None, None, 0
    T, Bc, col_agg = agg.tentative(be, a, nagg, B)
    if T.shape[1] == 0 or T.shape[1] >= 0.9 * n:
        return None, None, None, nagg
    return T, Bc, col_agg, nagg


def _aggregation_kwargs(level, front):
    """Aggregation of a level: on the finest one advancing fronts from seeds of density
    ``front`` and two fill phases open to every free node (``fraction=0``: a node at
    distance 2 from the roots rather starts an aggregate of its own than widens one to 4
    nodes -- measured: CG convergence factor 0.105 against 0.117 with one fill phase on
    the hybrid below ``Mesh.box`` 512^2, 0.132 against 0.149 on the distorted hex block
    64^3, operator complexity +0.01); below it random-order Luby rounds with two fill
    phases for nodes with half their neighbours free (fewer rounds; coarse graphs are not
    grids)."""
    if level == 0 and front is not None:
        return {"front": front, "phases": 3, "fraction": 0.0}
    return {}


def _device_hierarchy(be, A, B, block_size, theta, max_coarse, max_levels, seed, omega,
                      front=None):
    """Matrices of the device set-up, fine -> coarse: ``As``, ``Ps`` (P, R), ``rhos``, the
    coarsest ``B`` and the aggregate counts."""
    xp = be.xp
    A = be.asmatrix(A, dtype=np.float64)
    A.sum_duplicates()
    As, Ps, rhos, aggs = [A], [], [], []
    n = A.shape[0]
    dof_node = (xp.arange(n, dtype=xp.int64) // block_size) if block_size > 1 else None
    num_nodes = n // block_size
    while len(As) < max_levels and As[-1].shape[0] > max_coarse:
        A = As[-1]
        dinv = _diag_inverse(be, A, f"level {len(As) - 1} (of the algebraic hierarchy)")
        akw = _aggregation_kwargs(len(As) - 1, front)
        T, Bc, col_agg, nagg = _aggregate_level(be, A, B, dof_node, num_nodes, theta, seed + len(As), akw)
        if T is None and theta > 0:        # the threshold left too few strong couplings
            T, Bc, col_agg, nagg = _aggregate_level(be, A, B, dof_node, num_nodes, 0.0, seed + len(As),
                                                    akw)
        if T is None:                      # coarsening stalled
            break
        rho = agg.spectral_radius(be, A, dinv)
        AT = (A @ T).tocsr()
        rows = AT.tocoo().row
        AT.data = AT.data * ((omega / rho) * dinv)[rows]
        P = (T - AT).tocsr()
        P.sum_duplicates()
        R = P.T.tocsr()
        Ac = rap(R, A, P)                 # in row blocks where cuSPARSE's int32 would overflow
        Ac.sum_duplicates()
        Ps.append((P, R))
        rhos.append(rho)
        aggs.append(nagg)
        As.append(Ac)
        B = Bc
        nc = T.shape[1]
        if B.shape[1] == 1 and nc == nagg:
            dof_node, num_nodes = None, nc
        else:
            dof_node, num_nodes = col_agg, nagg
    return As, Ps, rhos, B, aggs


# ----------------------------------------------------------------------------- singular coarse
def _kernel_regularized(A0, B0):
    """``(A0 + gamma Q Q^T, rank)`` if columns of ``B0`` span part of the kernel of ``A0``
    (``Q`` an orthonormal basis of those columns), else ``(None, 0)``; host dense algebra."""
    import scipy.sparse as sp
    Ad = to_host(A0).toarray().astype(np.float64)
    Bh = np.asarray(to_host(B0), dtype=np.float64)
    if Bh.ndim == 1:
        Bh = Bh[:, None]
    nrmA = np.linalg.norm(Ad)
    nb = np.linalg.norm(Bh, axis=0)
    AB = np.linalg.norm(Ad @ Bh, axis=0)
    ker = (nb > 0) & (AB <= 1e-8 * nrmA * nb)
    if not ker.any():
        return None, 0
    Q, Rq = np.linalg.qr(Bh[:, ker])
    Q = Q[:, np.abs(np.diag(Rq)) > 1e-10 * np.abs(np.diag(Rq)).max()]
    gamma = float(np.mean(np.abs(np.diag(Ad))))
    return sp.csr_matrix(Ad + gamma * (Q @ Q.T)), int(Q.shape[1])


# ----------------------------------------------------------------------------- levels
def sa_levels(A, B=None, *, backend="auto", setup=None, block_size=None, strength=0.0,
              max_coarse=500, max_levels=20, seed=0, omega=4.0 / 3.0, smoother="chebyshev",
              smoother_kwargs=None, presmooth=1, postsmooth=1, dtype=np.float64,
              coarse="direct", pyamg_kwargs=None, front=FRONT):
    """The levels of a smoothed-aggregation hierarchy (coarse -> fine) and set-up facts.

    Returns ``(levels, info)``: ``levels[-1].A`` is ``A`` (on the backend), every level's
    ``meta["kind"]`` is ``"algebraic"``; ``info`` holds ``setup``, ``backend``, ``seconds``
    (set-up wall time), ``B`` (the coarsest near-nullspace) and ``regularized`` (kernel
    dimension added to a singular coarsest matrix, 0 if none).  See :func:`amg`.
    """
    _check_matrix(A)
    be, setup = _resolve(backend, A, setup)
    theta = _theta(strength)
    max_coarse = _positive_int("max_coarse", max_coarse)
    max_levels = _positive_int("max_levels", max_levels)
    if isinstance(omega, bool) or not isinstance(omega, numbers.Real) or not 0 < omega < 2:
        raise ValueError(f"omega (prolongation smoothing weight times rho) must lie in (0, 2), got {omega!r}")
    if coarse not in ("direct", "smoother"):
        raise ValueError(f"coarse must be 'direct' or 'smoother', got {coarse!r}")
    bs = _block_size(A, block_size)
    n = A.shape[0]
    t0 = time.perf_counter()
    if setup == "pyamg":
        levels, Bc = _pyamg_levels(A, B, bs, theta, max_coarse, max_levels, be, smoother,
                                   smoother_kwargs, presmooth, postsmooth, dtype, pyamg_kwargs)
    else:
        if pyamg_kwargs:
            raise ValueError("pyamg_kwargs apply to setup='pyamg' only")
        Bd = _check_B(be, B, n, bs)
        As, Ps, rhos, Bc, aggs = _device_hierarchy(be, A, Bd, bs, theta, max_coarse, max_levels,
                                                   seed, float(omega), _front(front))
        levels = []
        L = len(As)
        for i in range(L - 1, -1, -1):                 # coarse -> fine
            P, R = Ps[i] if i < L - 1 else (None, None)
            sm = None
            if i < L - 1 or coarse == "smoother":
                rho = rhos[i] if i < L - 1 else agg.spectral_radius(
                    be, As[i], _diag_inverse(be, As[i], "the coarsest level"))
                sm = _level_smoother(smoother, As[i], rho, be, dtype, smoother_kwargs)
            meta = {"kind": "algebraic", "setup": "device"}
            if i < L - 1:
                meta.update(aggregates=aggs[i], rho=rhos[i])
            levels.append(Level(As[i], P, R, smoother=sm, meta=meta))
    reg = 0
    if coarse == "direct" and len(levels) > 1:
        A0r, reg = _kernel_regularized(levels[0].A, Bc)
        if A0r is not None:
            lev0 = levels[0]
            levels[0] = Level(A0r, None, None, lev0.smoother, dict(lev0.meta, regularized=reg))
    be.synchronize()
    info = {"setup": setup, "backend": be.name, "seconds": time.perf_counter() - t0, "B": Bc,
            "regularized": reg}
    return levels, info


def _pyamg_levels(A, B, bs, theta, max_coarse, max_levels, be, smoother, smoother_kwargs,
                  presmooth, postsmooth, dtype, pyamg_kwargs):
    """pyamg's smoothed-aggregation set-up on the host, its levels as adaptmg Levels."""
    try:
        import pyamg
    except ImportError as exc:  # pragma: no cover - pyamg is a dependency
        raise ImportError("setup='pyamg' needs pyamg (pip install pyamg)") from exc
    from .pyamg import from_pyamg
    import scipy.sparse as sp
    Ah = to_host(A)
    Ah = Ah.astype(np.float64) if Ah.dtype != np.float64 else Ah
    if bs > 1:
        if Ah.format != "bsr" or Ah.blocksize != (bs, bs):
            Ah = sp.bsr_matrix(Ah.tocsr(), blocksize=(bs, bs))
    elif Ah.format != "csr":
        Ah = Ah.tocsr()
    Bh = None if B is None else np.asarray(to_host(B), dtype=np.float64)
    if Bh is not None and Bh.ndim == 1:
        Bh = Bh[:, None]
    kw = dict(strength=("symmetric", {"theta": theta}), max_coarse=max_coarse,
              max_levels=max_levels)
    kw.update(pyamg_kwargs or {})
    ml = pyamg.smoothed_aggregation_solver(Ah, B=Bh, **kw)
    key = normalize_smoother_name(smoother) if isinstance(smoother, str) else smoother
    # coarse="smoother" here: the coarse level is re-made by amg() (a singular one regularised)
    mg = from_pyamg(ml, backend=be, smoother=key, presmooth=presmooth, postsmooth=postsmooth,
                    smoother_kwargs=smoother_kwargs, dtype=dtype, coarse="smoother",
                    coarse_sweeps=0)
    levels = []
    for lev in mg.levels:
        meta = dict(lev.meta, kind="algebraic", setup="pyamg")
        levels.append(Level(lev.A, lev.P, lev.R, smoother=lev.smoother, meta=meta))
    return levels, ml.levels[-1].B


# ----------------------------------------------------------------------------- amg()
def amg(A, B=None, *, backend="auto", setup=None, block_size=None, strength=0.0, max_coarse=500,
        max_levels=20, smoother="chebyshev", smoother_kwargs=None, presmooth=1, postsmooth=1,
        seed=0, omega=4.0 / 3.0, coarse="direct", coarse_sweeps=10, max_direct=20000,
        dtype=np.float64, pyamg_kwargs=None, front=FRONT):
    """Smoothed-aggregation multigrid for a sparse SPD matrix ``A``.

    Parameters
    ----------
    A : SciPy sparse matrix (CSR/BSR/...) or cupyx CSR, symmetric positive (semi-)definite.
    B : (n, k) array, optional
        Near-nullspace (NumPy or CuPy): default the constants per component
        (``block_size`` columns); rigid-body modes from
        :func:`adaptmg.multilevel.nullspace.rigid_body_modes` for elasticity.
    backend : "auto" | "cpu" | "gpu" | Backend
        Where the cycles run ("auto": the GPU when present, or when ``A`` is on it).
    setup : "device" | "pyamg" | None
        None: "device" on the GPU, "pyamg" on the CPU (see the module docstring).
    block_size : DoFs per node (aggregated together); default ``A.blocksize`` for BSR, else 1.
    strength : theta of the symmetric strength test (0 keeps every non-zero), or pyamg's
        ``("symmetric", {"theta": t})``.
    max_coarse : a level with at most this many rows is the coarsest (default 500).
    max_levels : at most this many levels.
    smoother, smoother_kwargs, presmooth, postsmooth : the cycle's smoother on every level;
        "chebyshev" (default, degree 3, lmax = 1.1 rho per level unless given; V(1,1)),
        "jacobi" (omega = 4/(3 rho) per level unless given), "block_jacobi", or any name
        of :data:`~adaptmg.multilevel.smoothers.SMOOTHERS`.
    seed : seed of the aggregation's node weights (device set-up; deterministic).
    front : device set-up: the finest level's aggregates grow as advancing fronts from
        sparse seeds, ``front`` seeds per ``s^2`` aggregates of ``s`` nodes (default 1;
        :func:`~adaptmg.multilevel.aggregation._mis2_front`); None: random-order Luby rounds
        as on the coarser levels (the aggregation before this option existed).
    omega : prolongation smoothing weight, ``P = (I - omega/rho D^{-1} A) T`` (default 4/3).
    coarse, coarse_sweeps, max_direct, dtype : as in :class:`MultilevelSolver`.
    pyamg_kwargs : extra arguments of ``pyamg.smoothed_aggregation_solver`` (setup="pyamg").

    Returns
    -------
    MultilevelSolver whose levels carry ``meta["kind"] == "algebraic"`` (and
    ``"aggregates"``, ``"rho"`` on the device set-up, ``"regularized"`` on a singular
    coarsest level).
    """
    levels, info = sa_levels(A, B, backend=backend, setup=setup, block_size=block_size,
                             strength=strength, max_coarse=max_coarse, max_levels=max_levels,
                             seed=seed, omega=omega, front=front, smoother=smoother,
                             smoother_kwargs=smoother_kwargs, presmooth=presmooth,
                             postsmooth=postsmooth, dtype=dtype, coarse=coarse,
                             pyamg_kwargs=pyamg_kwargs)
    skw = dict(smoother_kwargs or {})
    return MultilevelSolver(levels, coarse=coarse, coarse_sweeps=coarse_sweeps, presmooth=presmooth,
                            postsmooth=postsmooth, backend=info["backend"], dtype=dtype,
                            smoother=smoother, smoother_kwargs=skw, max_direct=max_direct)
