r"""Run a pyamg hierarchy with adaptmg's multigrid cycles (on the GPU where present).

pyamg builds algebraic hierarchies (smoothed aggregation, Ruge-Stueben, ...) on
the host: per level a matrix :math:`A_l`, a prolongation :math:`P_l` and a
restriction :math:`R_l` (``levels[0]`` is pyamg's *finest* level).  Its cycles
run on the CPU.  :func:`from_pyamg` copies exactly these matrices into an
:class:`adaptmg.multilevel.MultilevelSolver` (levels reordered coarse -> fine,
``R`` stored explicitly, never applied as ``P^T``), so the same hierarchy is
cycled with adaptmg's kernels, on the GPU when ``backend`` says so::

    ml = pyamg.smoothed_aggregation_solver(A)
    mg = adaptmg.from_pyamg(ml)                         # GPU if available
    x, info = adaptmg.linalg.cg(A_gpu, b_gpu, rtol=1e-8, M=mg.aspreconditioner())

The cycle is pyamg's (seed 001, Algorithm 1): pre-smoothing, residual,
restriction ``b_c = R_l r``, coarse correction, ``x += P_l x_c``,
post-smoothing; the coarsest level is solved as pyamg's ``ml.coarse_solver``
says (``coarse="pyamg"``, the default): ``'pinv'`` (pyamg's default), ``'lu'``,
``'cholesky'``, ``'splu'`` and ``None`` as the dense operator pyamg applies
(:mod:`adaptmg.multilevel.pyamg_relax`), its iterative coarse solvers (Krylov,
relaxation, a callable) by calling pyamg's own on the CPU and, on the GPU, by adaptmg's
counterparts (Krylov, Jacobi, multicolour GS) or the pseudo-inverse, with a
:class:`CoarseSolverWarning` where that is not the same.  Cycles ``V``,
``W``, ``F`` and ``AMLI`` (:mod:`adaptmg.multilevel.amli`) are pyamg's.  Real and
complex (Hermitian or not) hierarchies are taken as they are: a complex hierarchy
gives a complex128 (complex64 for ``dtype=float32``) adaptmg hierarchy.

Relaxation (``relax="auto"``, the default, with ``smoother=None``): on the CPU the
cycle calls pyamg's own level smoothers (:class:`PyamgRelaxation`: pyamg's
lexicographic Gauss-Seidel, Kaczmarz, Schwarz, C/F relaxation, ..., with pyamg's
treatment of zero diagonals), so it is pyamg's cycle operation for operation; on
the GPU (or with ``relax="map"``, or an ``omega`` override) they are mapped as
follows.

Smoothers (``smoother=None``, the default: pyamg's own).  pyamg keeps the
smoothers of level ``i`` as the callables ``ml.levels[i].presmoother`` /
``.postsmoother`` (``functools.partial`` objects or closures made by
``pyamg.relaxation.smoothing.change_smoothers``); :func:`from_pyamg` reads their
parameters and maps each to adaptmg's closest smoother:

====================================  =============================================  =======
pyamg                                 adaptmg                                        exact?
====================================  =============================================  =======
jacobi (omega, iterations)            :class:`Jacobi` with pyamg's weight            yes
block_jacobi (blocksize, omega)       :class:`BlockJacobi`                           yes
richardson (omega)                    :class:`Richardson` with pyamg's weight        yes
chebyshev (coefficients)              :class:`Chebyshev` (``scaling="none"``), the    yes [#]_
                                      degree and interval read off the polynomial
None                                  no smoothing                                   yes
gauss_seidel (sweep)                  multicolour :class:`GaussSeidel`, same sweep   no [#]_
block_gauss_seidel (blocksize, sweep) multicolour block GS, same sweep               no
sor (omega, sweep)                    multicolour SOR, same omega and sweep          no
cf_/fc_jacobi (omega, f_/c_iterations) :class:`CFJacobi`: the same half-sweeps over     yes
cf_/fc_block_jacobi (Dinv, blocksize)  the F and C points, same order and weight
                                      (block: pyamg's ``Dinv``)
anything else (gauss_seidel_nr/ne,    symmetric multicolour (block) GS               no
jacobi_ne, schwarz, Krylov, custom)
====================================  =============================================  =======

.. [#] The same residual polynomial, evaluated by a three-term recurrence instead
   of Horner's rule (round-off differs).
.. [#] Multicolour Gauss-Seidel is Gauss-Seidel in colour order, not in pyamg's
   lexicographic order: another (parallel) smoother of the same kind.

``iterations`` become the sweep counts.  Where no exact equivalent exists,
:func:`from_pyamg` says so in *one* :class:`SmootherMappingWarning` (levels,
pyamg's smoother, what runs instead), in ``mg.smoother_notes`` and in the
smoothers' ``repr`` (so ``print(mg)`` shows it); it never changes a smoother
silently.  Different pre- and post-smoothers on a level become a
:class:`~adaptmg.multilevel.smoothers.PrePostSmoother`.

An explicit ``smoother="name"`` (any name of
:data:`~adaptmg.multilevel.smoothers.SMOOTHERS`) overrides pyamg's settings on
every level, without warning.  ``smoother="jacobi"`` keeps the weight rule of
earlier versions: ``omega`` if given, else pyamg's own weight where that level's
pyamg pre-smoother is weighted Jacobi, else ``4 / (3 rho(D^{-1} A_l))``.

GPU memory: the hierarchy is moved once at setup; an allocation failure becomes
a :class:`MemoryError` naming the hierarchy size and what to do
(:func:`adaptmg.errors.gpu_memory_guard`).
"""
from __future__ import annotations

import numbers
import warnings

import numpy as np
import scipy.sparse as sp

from ..backend import get_backend
from ..errors import gpu_memory_guard
from .coarse import CoarseOperator
from .pyamg_map import (_MISSING, _Spec, _blocksize, _build, _level_smoother, _map_pyamg,
                        _pyamg_params)
from .pyamg_relax import (DIRECT_COARSE, CoarseSolverWarning, DeviceCoarseSolver,
                          HostCoarseSolver, PyamgRelaxation,
                          coarse_label, coarse_operator, read_coarse_solver)
from .solver import Level, MultilevelSolver
from .smoothers import (SMOOTHERS, estimate_lambda_max, normalize_smoother_name,
                        smoother_setup_kwargs)

__all__ = ["from_pyamg", "pyamg_matrices", "SmootherMappingWarning", "CoarseSolverWarning"]


class SmootherMappingWarning(UserWarning):
    """pyamg's smoother on some level has no exact adaptmg equivalent; the message names the
    levels, pyamg's smoother and the adaptmg smoother used instead."""


def _csr(M, what):
    if not sp.issparse(M):
        raise TypeError(f"from_pyamg: {what} must be a SciPy sparse matrix, got {type(M).__name__}")
    M = sp.csr_matrix(M)            # BSR (pyamg's aggregation levels) -> CSR
    M.sum_duplicates()
    M.sort_indices()
    if M.dtype.kind not in "fc":
        if M.dtype.kind in "iub":
            M = M.astype(np.float64)
        else:
            raise TypeError(f"from_pyamg: {what} must be real or complex floating point, got "
                            f"dtype {M.dtype}")
    if not np.isfinite(M.data).all():
        raise ValueError(f"from_pyamg: {what} (shape {M.shape}) contains NaN or Inf")
    return M


def _rho(A):
    """Spectral radius of D^{-1} A: pyamg's cached value or a Lanczos estimate."""
    rho = getattr(A, "rho_D_inv", None)
    if rho is not None and np.isfinite(rho) and rho > 0:
        return float(rho)
    return float(estimate_lambda_max(A)) * 1.05


def _check_sweeps(name, v):
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 0:
        raise ValueError(f"from_pyamg: {name} must be a non-negative integer or None, got {v!r}")
    return int(v)


def _group_levels(levels):
    """'level 2' / 'levels 0-3' / 'levels 0, 2' for a sorted list of pyamg level numbers."""
    if len(levels) == 1:
        return f"level {levels[0]}"
    if levels == list(range(levels[0], levels[-1] + 1)):
        return f"levels {levels[0]}-{levels[-1]}"
    return "levels " + ", ".join(str(v) for v in levels)


# ---------------------------------------------------------------------------
def _smoother_key(smoother, omega):
    """Registry key of an explicitly named smoother (None: pyamg's own); checks ``omega``."""
    key = None
    if smoother is not None:
        try:
            key = normalize_smoother_name(smoother) if isinstance(smoother, str) else None
        except ValueError:
            key = None
        if key is None:
            raise ValueError(f"from_pyamg: smoother must be one of None (pyamg's own smoothers) or "
                             f"{sorted(SMOOTHERS)}, got {smoother!r}")
    if omega is not None:
        if isinstance(omega, bool) or not isinstance(omega, numbers.Real) or not np.isfinite(omega) \
                or omega <= 0:
            raise ValueError(f"from_pyamg: omega must be a positive number or None, got {omega!r}")
        if key == "chebyshev":
            raise ValueError("from_pyamg: omega does not apply to smoother='chebyshev' "
                             "(use smoother_kwargs)")
    return key


def _check_smoother_kwargs(smoother_kwargs, key):
    if smoother_kwargs is not None and not isinstance(smoother_kwargs, dict):
        raise TypeError(f"from_pyamg: smoother_kwargs must be a dict, got {type(smoother_kwargs).__name__}")
    if smoother_kwargs and key is None:
        raise ValueError("from_pyamg: smoother_kwargs needs an explicit smoother name "
                         "(with smoother=None pyamg's own settings are used)")


def pyamg_matrices(levels_in):
    """Host CSR ``(As, Ps, Rs)`` of a pyamg hierarchy's levels, in pyamg's order (fine -> coarse).

    BSR levels become CSR; ``R`` is pyamg's explicit restriction (``P^T`` when absent);
    ``A.rho_D_inv`` (pyamg's cached spectral radius) is kept.  Shapes are checked.
    """
    As, Ps, Rs = [], [], []
    L = len(levels_in)
    for i, lev in enumerate(levels_in):
        A = getattr(lev, "A", None)
        if A is None:
            raise ValueError(f"from_pyamg: ml.levels[{i}] has no matrix A")
        Ah = _csr(A, f"ml.levels[{i}].A")
        if Ah.shape[0] != Ah.shape[1]:
            raise ValueError(f"from_pyamg: ml.levels[{i}].A must be square, got shape {Ah.shape}")
        if hasattr(A, "rho_D_inv"):
            Ah.rho_D_inv = A.rho_D_inv
        As.append(Ah)
        if i < L - 1:
            if getattr(lev, "P", None) is None:
                raise ValueError(f"from_pyamg: ml.levels[{i}] (not the coarsest) has no P")
            P = _csr(lev.P, f"ml.levels[{i}].P")
            R = getattr(lev, "R", None)
            R = P.T.tocsr() if R is None else _csr(R, f"ml.levels[{i}].R")
            Ps.append(P)
            Rs.append(R)
    for i in range(L - 1):
        n, nc = As[i].shape[0], As[i + 1].shape[0]
        if Ps[i].shape != (n, nc):
            raise ValueError(f"from_pyamg: ml.levels[{i}].P has shape {Ps[i].shape}, expected "
                             f"{(n, nc)} (level {i} has {n} rows, level {i + 1} has {nc})")
        if Rs[i].shape != (nc, n):
            raise ValueError(f"from_pyamg: ml.levels[{i}].R has shape {Rs[i].shape}, expected {(nc, n)}")
    return As, Ps, Rs


def _smoother_specs(levels_in, As, key, omega, smoother_kwargs):
    """Per pyamg level the (pre, post) :class:`_Spec` of the adaptmg smoother: pyamg's own
    smoothers mapped (``key`` None) or the explicitly named one with its defaults."""
    L = len(levels_in)
    specs = []
    for i, lev in enumerate(levels_in):
        src = levels_in[min(i, L - 2)] if L > 1 else lev       # coarsest: next finer level's kind
        pre_fn = getattr(src, "presmoother", _MISSING)
        post_fn = getattr(src, "postsmoother", pre_fn)
        bs_lev = _blocksize(getattr(lev, "A", None))
        if key is None:
            pre, post = _map_pyamg(pre_fn, lev.A), _map_pyamg(post_fn, lev.A)
            if i == L - 1 and L > 1:
                # coarsest level (coarse="smoother"; pyamg smooths no coarsest level): the finer
                # level's kind, with this level's block size and weights / interval of its own
                for s in (pre, post):
                    if s.kind == "cf_jacobi":   # no splitting on the coarsest: all points
                        s.kind = ("block_jacobi" if s.kwargs["block"] and bs_lev > 1 else
                                  "jacobi")
                        s.kwargs = {"singular": "pinv"} | ({"block_size": bs_lev}
                                                           if s.kind == "block_jacobi" else {})
                    if "block_size" in s.kwargs:
                        s.kwargs["block_size"] = bs_lev
                    if s.kind in ("jacobi", "block_jacobi", "richardson"):
                        s.kwargs["omega"] = "auto"
                    if s.kind == "chebyshev":
                        s.kwargs["lmax"] = None
            if omega is not None:
                for s in (pre, post):
                    if s.kind == "chebyshev":
                        raise ValueError(f"from_pyamg: omega does not apply to pyamg's chebyshev "
                                         f"smoother on level {i}")
                    if s.kind != "none":
                        s.kwargs["omega"] = float(omega)
        else:
            name, p = _pyamg_params(pre_fn)
            it = int(p.get("iterations", 1)) if name == "jacobi" else 1
            if key == "jacobi":
                if omega is not None:
                    w = float(omega)
                elif name == "jacobi" and "omega" in p and i < L - 1:
                    w = float(p["omega"])
                else:
                    w = 4.0 / (3.0 * _rho(As[i]))
                kw = {"omega": w} | dict(smoother_kwargs or {})
            else:
                kw = smoother_setup_kwargs(key, smoother_kwargs, block_size=bs_lev)
                if omega is not None:
                    kw["omega"] = float(omega)
            pre = post = _Spec(key, kw, it, True, "")
        specs.append((pre, post))
    return specs


def _mapping_notes(specs, need):
    """Group the levels whose mapping is not exact; warn once with one line per group.

    Returns ``(groups, notes)``: ``(role, pyamg source, adaptmg instead) -> levels`` and
    the note lines (empty when every mapping is exact).
    """
    groups = {}
    for i in need:
        p_, q_ = specs[i]
        if p_.exact and q_.exact:
            continue
        if p_.key() == q_.key() and p_.source == q_.source:
            item = ("pre/post", p_.source, p_.instead)
            groups.setdefault(item, []).append(i)
        else:
            for role, s in (("pre", p_), ("post", q_)):
                if not s.exact:
                    groups.setdefault((role, s.source, s.instead), []).append(i)
    notes = [f"{_group_levels(lv)} (pyamg numbering), {role}smoother pyamg {src} -> adaptmg {inst}"
             for (role, src, inst), lv in groups.items()]
    if notes:
        warnings.warn(SmootherMappingWarning(
            "from_pyamg: pyamg's smoothers have no exact adaptmg equivalent on some levels "
            "(pass smoother=... to choose one explicitly):\n  " + "\n  ".join(notes)),
            stacklevel=3)
    return groups, notes


def from_pyamg(ml, backend="auto", smoother=None, *, omega=None, presmooth=None,
               postsmooth=None, smoother_kwargs=None, dtype=None, coarse="pyamg",
               max_direct=20000, coarse_sweeps=10, relax="auto"):
    """Turn a pyamg ``MultilevelSolver`` into an adaptmg :class:`MultilevelSolver`.

    Parameters
    ----------
    ml : pyamg.multilevel.MultilevelSolver
        Any pyamg hierarchy: ``ml.levels[i].A`` for every level and
        ``.P``/``.R`` on all but pyamg's coarsest level.  BSR levels are
        converted to CSR.  ``R`` is used as given (pyamg stores it explicitly).
    backend : "auto" | "cpu" | "gpu"
        Where the cycles run ("auto": the GPU when CuPy sees a device).
    smoother : None or a smoother name
        ``None`` (default): pyamg's own pre/post-smoothers of every level,
        mapped to adaptmg's closest equivalents (module docstring); a
        :class:`SmootherMappingWarning` lists the levels where the mapping is
        not exact.  A name of :data:`~adaptmg.multilevel.smoothers.SMOOTHERS`
        ("jacobi", "gauss_seidel", "block_gauss_seidel", "chebyshev", ...):
        that adaptmg smoother on every level (block smoothers default to the
        level's BSR block size), no warning.
    omega : float, optional
        Relaxation weight on every level.  With ``smoother=None`` it replaces
        pyamg's weights (Jacobi, Richardson, Gauss-Seidel/SOR).  With
        ``smoother="jacobi"`` the default is, per level, pyamg's Jacobi weight
        when pyamg uses Jacobi there, else ``4 / (3 rho(D^{-1} A_l))``.
    presmooth, postsmooth : int, optional
        Sweeps per level.  Default: pyamg's ``iterations`` (per level, when
        they differ between levels); with an explicit ``smoother``, pyamg's
        Jacobi ``iterations`` where known, else 1.
    smoother_kwargs : dict, optional
        Extra arguments of an explicitly named smoother.
    dtype : numpy float or complex dtype, optional
        Precision of the adaptmg hierarchy (float32 for mixed precision); default: pyamg's
        (float64 for integer matrices).  A complex pyamg hierarchy makes it complex of
        that precision.
    coarse, max_direct, coarse_sweeps :
        ``"pyamg"`` (default): pyamg's ``ml.coarse_solver`` (module docstring);
        ``"direct"``: dense inverse; ``"smoother"``: the coarsest level smoothed
        with the next finer level's pre-smoother kind.
    relax : "auto" | "map"
        "auto": on the CPU, with ``smoother=None`` and no ``omega``, pyamg's own
        level smoothers run inside the cycle (exact); on the GPU the mapping of the
        module docstring.  "map": the mapping on every backend.

    Returns
    -------
    MultilevelSolver
        ``.aspreconditioner()`` is a LinearOperator on the chosen backend that
        the :mod:`adaptmg.linalg` solvers (and SciPy / cupyx) accept as ``M``;
        ``.solve(b, accel="cg")`` solves directly.  ``.smoother_notes`` lists
        the levels whose smoothers differ from pyamg's (empty when exact).
    """
    levels_in = getattr(ml, "levels", None)
    if levels_in is None or not hasattr(ml, "aspreconditioner"):
        raise TypeError("from_pyamg: ml must be a pyamg MultilevelSolver (with .levels), "
                        f"got {type(ml).__name__}")
    levels_in = list(levels_in)
    if not levels_in:
        raise ValueError("from_pyamg: ml has no levels")
    key = _smoother_key(smoother, omega)
    presmooth = _check_sweeps("presmooth", presmooth)
    postsmooth = _check_sweeps("postsmooth", postsmooth)
    _check_smoother_kwargs(smoother_kwargs, key)
    if dtype is None:
        dtype = np.result_type(np.float32, *(getattr(lev.A, "dtype", np.float64)
                                             for lev in levels_in))
    dtype = np.dtype(dtype)
    if dtype.kind not in "fc":
        raise TypeError(f"from_pyamg: dtype must be float32/64 or complex64/128, got {dtype}")
    if relax not in ("auto", "map"):
        raise ValueError(f"from_pyamg: relax must be 'auto' or 'map', got {relax!r}")
    be = get_backend(backend)

    As, Ps, Rs = pyamg_matrices(levels_in)
    L = len(levels_in)
    if any(M.dtype.kind == "c" for M in As + Ps + Rs):
        dtype = np.result_type(dtype, np.complex64)
    # pyamg's own smoother callables on the host (exact), where they take this dtype
    host = [relax == "auto" and not be.is_gpu and key is None and omega is None
            and i < L - 1 and callable(getattr(lev, "presmoother", None))
            and callable(getattr(lev, "postsmoother", None))
            and np.can_cast(getattr(lev.A, "dtype", dtype), dtype)
            for i, lev in enumerate(levels_in)]
    coarse_obj = _coarse_solver(ml, As[-1], be, coarse, dtype)

    specs = _smoother_specs(levels_in, As, key, omega, smoother_kwargs)

    # ---- sweep counts: global when all levels agree, else per level inside the smoother
    need = [i for i in (range(L - 1) if coarse != "smoother" else range(L)) if not host[i]]
    counts = {(specs[i][0].iterations, specs[i][1].iterations) for i in need} or {(1, 1)}
    if key is not None:        # explicit smoother: pyamg's Jacobi iterations (finest), as before
        counts = {(specs[0][0].iterations,) * 2}
    uniform = len(counts) == 1
    pre_n, post_n = next(iter(counts)) if uniform else (1, 1)
    pre = pre_n if presmooth is None else presmooth
    post = post_n if postsmooth is None else postsmooth
    per_level = not uniform and presmooth is None and postsmooth is None

    groups, notes = _mapping_notes(specs, need)
    nbytes = sum(M.data.nbytes + M.indices.nbytes + M.indptr.nbytes for M in As + Ps + Rs)
    what = (f"moving a {L}-level pyamg hierarchy ({As[0].shape[0]} rows on the finest level, "
            f"{sum(M.nnz for M in As)} nonzeros in all A_l) to the {be.name}")
    with gpu_memory_guard(what, nbytes * dtype.itemsize / 8):
        levels = []
        for i in range(L - 1, -1, -1):           # adaptmg: coarse -> fine
            A = be.asmatrix(As[i], dtype=dtype)
            if i < L - 1:
                P = be.asmatrix(Ps[i], dtype=dtype)
                R = be.asmatrix(Rs[i], dtype=dtype)
            else:
                P = R = None
            sm = None
            if host[i]:
                lev = levels_in[i]
                sm = PyamgRelaxation(lev.A, lev.presmoother, lev.postsmoother,
                                     f"pre {specs[i][0].source}, post {specs[i][1].source}")
            elif i < L - 1 or coarse == "smoother":
                if key is None:
                    sm = _level_smoother(specs[i], A, be, dtype, per_level)
                else:             # an explicit choice: adaptmg's own pre/post convention
                    sm = _build(specs[i][0], A, be, dtype)
                own = [n_ for (role, src, inst), lv in groups.items() if i in lv
                       for n_ in [f"{role}: pyamg {src} -> {inst}"]]
                if own:
                    sm.note = "; ".join(own)
            meta = {"pyamg_level": i, "nnz": int(As[i].nnz)}
            levels.append(Level(A, P, R, smoother=sm, meta=meta))
        out = MultilevelSolver(levels, coarse=coarse_obj, coarse_sweeps=coarse_sweeps, presmooth=pre,
                               postsmooth=post, backend=be, dtype=dtype,
                               smoother=key if key is not None else "jacobi",
                               max_direct=max_direct)
    out.smoother_notes = notes
    return out


def _coarse_solver(ml, A0, be, coarse, dtype):
    """The ``coarse`` argument of :class:`MultilevelSolver` for ``from_pyamg(coarse=...)``."""
    if coarse in ("direct", "smoother"):
        return coarse
    if coarse != "pyamg":
        raise ValueError(f"from_pyamg: coarse must be 'pyamg', 'direct' or 'smoother', got "
                         f"{coarse!r}")
    solver, kwargs = read_coarse_solver(ml)
    label = "pyamg coarse_solver " + coarse_label(solver, kwargs)
    if solver in DIRECT_COARSE:
        return CoarseOperator(coarse_operator(solver, kwargs, A0), label)
    if not be.is_gpu:
        return HostCoarseSolver(ml.coarse_solver, ml.levels[-1].A, label)   # pyamg's own matrix
    if isinstance(solver, str) and DeviceCoarseSolver.supports(solver):
        out = DeviceCoarseSolver(solver, kwargs, ml.levels[-1].A, be, dtype, label)
        if not out.exact:
            warnings.warn(CoarseSolverWarning(
                f"from_pyamg: {label} runs as adaptmg's multicolour Gauss-Seidel on the "
                f"{be.name} (colour order, not pyamg's lexicographic order)"), stacklevel=3)
        return out
    warnings.warn(CoarseSolverWarning(
        f"from_pyamg: {label} runs on the host only; on the {be.name} the coarse level is "
        "solved with its pseudo-inverse (pyamg's 'pinv') instead"), stacklevel=3)
    return CoarseOperator(coarse_operator("pinv", {}, A0), "pinv (instead of " + label + ")")
