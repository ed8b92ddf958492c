"""Smoothers of the form ``x <- x + omega * S (b - A x)`` with a fixed matrix ``S``.

This is the smoother family of the GPU port of Gascoigne (seed 001, §4.1.4):
every sweep is a sparse matrix-vector product with ``A`` plus an update with a
fixed ``S``, so it runs unchanged with SciPy on the CPU and cuSPARSE on the GPU.

* :class:`Jacobi` -- ``S = D^{-1}`` stored as a vector (``D = diag(A)``).
* :class:`BlockJacobi` -- ``S`` = inverse of the ``c x c`` diagonal node blocks
  of ``A`` (DoF index ``= node * c + component``), stored as a CSR matrix.
* :class:`Richardson` -- ``S = I`` (pyamg's ``richardson``).
* :class:`Chebyshev` -- for SPD ``A``: ``x <- x + p(D^{-1}A) D^{-1}(b - A x)``
  where ``1 - t p(t)`` is the Chebyshev polynomial of degree ``k`` that is
  smallest on ``[lower * lmax, lmax]``, ``lmax`` an estimate of the largest
  eigenvalue of ``D^{-1} A`` (Lanczos at setup, times 1.1); ``scaling="none"``
  for the polynomial in ``A`` itself (pyamg's ``chebyshev``)
  (:mod:`adaptmg.multilevel.chebyshev`).
* :class:`GaussSeidel`, :class:`BlockGaussSeidel`, :class:`L1GaussSeidel`
  (:mod:`adaptmg.multilevel.gauss_seidel`) -- multicolour (block) Gauss-Seidel /
  SOR and the l1 hybrid Gauss-Seidel: ``S`` is the inverse of a triangular
  splitting in colour order, one kernel launch per colour on the GPU.
* :class:`CFJacobi` -- Jacobi over the F points and the C points of a C/F splitting in
  turn (pyamg's ``cf_jacobi``/``fc_jacobi``, AIR's relaxation;
  :mod:`adaptmg.multilevel.cf_jacobi`); not in the name registry (it needs the splitting).
* :class:`PrePostSmoother` -- different pre- and post-smoothers on one level.

Names.  :data:`SMOOTHERS` is the one registry of smoother names ("jacobi",
"block_jacobi", "richardson", "chebyshev", "gauss_seidel" (symmetric
multicolour), "gauss_seidel_forward", "gauss_seidel_backward",
"block_gauss_seidel", "sor", "l1_gauss_seidel"); :func:`normalize_smoother_name`
is the one place where a user's spelling is turned into a registry key, and
:func:`smoother_setup_kwargs` fills in the hierarchy defaults (block size,
``omega="auto"``).  A hierarchy may smooth its levels with different smoothers: a
sequence of names, finest level first, the last entry for all coarser levels
(:func:`level_smoothers`; e.g. block Gauss-Seidel on the finest level, block Jacobi below).

Contract (all smoothers, and anything plugged into the multigrid driver)::

    smoother.smooth(x, b, sweeps=1, work=None)      # updates x in place

``work`` is an optional scratch vector of the level's length and dtype (the
driver passes its residual vector to share memory).  Our smoothers also take
``zero_initial=True``, meaning "x holds garbage, treat it as 0", which saves
the first SpMV; foreign smoothers get ``x`` zeroed by the driver instead.

Symmetry.  The error propagation of one sweep is ``E = I - omega S A``.  With
``S`` symmetric, ``E`` is self-adjoint in the ``A`` inner product, so using the
same smoother for pre- and post-smoothing makes the V-cycle symmetric.  The
Chebyshev sweep's error propagation ``1 - D^{-1}A p(D^{-1}A)`` is a polynomial
in ``D^{-1}A`` and is ``A``-self-adjoint as well.  A smoother whose ``S`` is not
symmetric (forward Gauss-Seidel) has ``smooth_adjoint``, the sweep with
error propagation ``E^*`` (backward Gauss-Seidel), which the multigrid driver
uses for post-smoothing.

Smoothers are built from a *host* matrix (SciPy sparse; Jacobi and Chebyshev
also accept any operator with ``.diagonal()`` and ``@``) and moved with
``.to(backend, dtype)`` or the ``backend=`` argument.

The base class :class:`Smoother`, :class:`Jacobi` and the helpers the families
share live in :mod:`.smoother_base` (which :mod:`.chebyshev` and
:mod:`.gauss_seidel` import; no module imports back from here) and are
importable from this module too.
"""
from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import scipy.sparse as sp

from ..device import kernels as K
from ..backend import get_backend, is_sparse, to_host
from .cf_jacobi import CFJacobi
from .chebyshev import Chebyshev, estimate_lambda_max
from .gauss_seidel import BlockGaussSeidel, GaussSeidel, L1GaussSeidel
from .smoother_base import (Jacobi, Smoother, _block_diagonal_csr, _block_inverses,  # noqa: F401
                            _check_square,
                            _host_diagonal, _note, _validate_sweeps, _validate_vectors,
                            power_lambda_max, power_lambda_max_many)

__all__ = ["Smoother", "Jacobi", "Richardson", "BlockJacobi", "Chebyshev", "PrePostSmoother",
           "CFJacobi", "GaussSeidel", "BlockGaussSeidel", "L1GaussSeidel", "make_smoother",
           "normalize_smoother_name", "smoother_setup_kwargs", "level_smoothers",
           "describe_level_smoothers", "estimate_lambda_max",
           "SMOOTHERS"]


class Richardson(Jacobi):
    r"""Damped Richardson iteration ``x <- x + omega (b - A x)`` (``S = I``).

    pyamg's ``('richardson', {'omega': w})`` is this smoother with
    ``omega = w / rho(A)``.  ``omega="auto"`` (default) takes
    ``4 / (3 lambda_max(A))`` (power iteration at setup), as for Jacobi.  Runs
    with the Jacobi kernels (``dinv`` = ones); works for matrix-free operators.
    """

    name = "richardson"

    def __init__(self, A, omega="auto", backend=None, dtype=None, fused=False):
        super().__init__(A, omega=omega, backend=backend, dtype=dtype, fused=fused)

    def _setup_host(self):
        self._dinv_host = np.ones(self.n)


def _block_inverse_csr(A, c, singular="raise"):
    """Inverse of the ``c x c`` diagonal node blocks of CSR ``A`` as a CSR matrix on ``A``'s
    backend.

    Row ``i = node*c + k`` of the result holds ``inv(B_node)[k, :]`` in columns
    ``node*c + (0..c-1)``.
    """
    return _block_diagonal_csr(_block_inverses(A, c, singular=singular))


class BlockJacobi(Smoother):
    r"""Damped block Jacobi ``x <- x + omega S (b - A x)``, ``S = blockdiag(B_k)^{-1}``.

    ``B_k`` is the ``c x c`` block of ``A`` coupling the ``c`` components of
    node ``k`` (DoF index ``k*c + comp``).  ``S`` is a CSR matrix with ``c``
    entries per row, so a sweep is SpMV(A), one fused residual kernel and
    SpMV(S) with ``alpha = omega, beta = 1``.  A singular block raises
    ``ValueError`` naming the node (``singular="raise"``) or gets its pseudo-inverse
    (``singular="pinv"``, pyamg's ``get_block_diag``; :func:`adaptmg.from_pyamg` asks for
    it).  With ``c = 1`` this is :class:`Jacobi`.
    """

    name = "block_jacobi"
    _host_attrs = ("_S_host", "block_size")

    def __init__(self, A, block_size=1, omega=2.0 / 3.0, backend=None, dtype=None,
                 singular="raise"):
        if not isinstance(block_size, (int, np.integer)) or block_size < 1:
            raise ValueError(f"BlockJacobi: block_size must be a positive integer, got {block_size!r}")
        if singular not in ("raise", "pinv"):
            raise ValueError(f"BlockJacobi: singular must be 'raise' or 'pinv', got {singular!r}")
        self.block_size, self.singular = int(block_size), singular
        super().__init__(A, omega, backend, dtype)

    def _setup_host(self):
        A = self.A_host
        if not is_sparse(A):
            raise TypeError("BlockJacobi needs an assembled sparse matrix, got "
                            f"{type(A).__name__}")
        # on A's backend: a device matrix (GPU set-up) never comes to the host
        self._S_host = _block_inverse_csr(A.tocsr(), self.block_size, self.singular)

    def _move(self):
        self.S = self.backend.asmatrix(self._S_host, dtype=self.dtype)
        self._Splan = K.make_spmv(self.S)

    def _apply_S(self, r):
        return self.S @ r

    def smooth(self, x, b, sweeps=1, work=None, zero_initial=False):
        """``sweeps`` damped block-Jacobi sweeps on ``A x = b``, in place."""
        sweeps = _validate_sweeps(sweeps)
        _validate_vectors(x, b, self.n, self.dtype, "BlockJacobi.smooth")
        r = self._scratch(work)
        w = self.omega
        start = 0
        if zero_initial and sweeps > 0:
            self._Splan(b, x, w, 0.0)          # x = omega S b
            start = 1
        elif zero_initial:
            x.fill(0)
        for _ in range(start, sweeps):
            self._Aplan(x, r, 1.0, 0.0)        # r = A x
            K.axpby(1.0, b, -1.0, r)           # r = b - A x
            self._Splan(r, x, w, 1.0)          # x += omega S r
        return x

    def __repr__(self):
        return f"BlockJacobi(block_size={self.block_size}, omega={self.omega:.4g}){_note(self)}"


class PrePostSmoother:
    """Different pre- and post-smoothers on one level (e.g. from a pyamg hierarchy).

    ``smooth`` runs ``pre`` (``pre_sweeps`` sweeps per requested sweep) and
    ``smooth_adjoint`` -- which :class:`~adaptmg.multilevel.MultilevelSolver`
    calls for post-smoothing -- runs ``post`` (``post_sweeps`` per requested
    sweep).  ``pre`` and ``post`` may be the same object (then the post-smoother
    is *not* its adjoint: pyamg's forward/forward Gauss-Seidel, say).  Both must
    be adaptmg smoothers on the same level matrix.
    """

    _adaptmg_smoother = True
    name = "pre_post"

    def __init__(self, pre, post, pre_sweeps=1, post_sweeps=1):
        for what, sm in (("pre", pre), ("post", post)):
            if not getattr(sm, "_adaptmg_smoother", False):
                raise TypeError(f"PrePostSmoother: {what} must be an adaptmg smoother, "
                                f"got {type(sm).__name__}")
        if pre.n != post.n:
            raise ValueError(f"PrePostSmoother: pre ({pre.n} rows) and post ({post.n} rows) "
                             "smooth different levels")
        for what, v in (("pre_sweeps", pre_sweeps), ("post_sweeps", post_sweeps)):
            _validate_sweeps(v)
        self.pre, self.post = pre, post
        self.pre_sweeps, self.post_sweeps = int(pre_sweeps), int(post_sweeps)
        self.n = pre.n
        self.note = None

    @property
    def backend(self):
        return self.pre.backend

    @property
    def dtype(self):
        return self.pre.dtype

    @property
    def can_fuse(self):
        return any(getattr(s, "can_fuse", False) for s in (self.pre, self.post))

    @property
    def fused(self):
        return any(getattr(s, "fused", False) for s in (self.pre, self.post))

    @fused.setter
    def fused(self, value):
        for s in (self.pre, self.post):
            if hasattr(s, "can_fuse"):
                s.fused = value

    def to(self, backend="cpu", dtype=None):
        pre = self.pre.to(backend, dtype)
        post = pre if self.post is self.pre else self.post.to(backend, dtype)
        if pre is self.pre and post is self.post:
            return self
        new = PrePostSmoother(pre, post, self.pre_sweeps, self.post_sweeps)
        new.note = self.note
        return new

    def smooth(self, x, b, sweeps=1, work=None, zero_initial=False):
        sweeps = _validate_sweeps(sweeps)
        return self.pre.smooth(x, b, sweeps * self.pre_sweeps, work=work, zero_initial=zero_initial)

    def smooth_adjoint(self, x, b, sweeps=1, work=None, zero_initial=False):
        sweeps = _validate_sweeps(sweeps)
        return self.post.smooth(x, b, sweeps * self.post_sweeps, work=work, zero_initial=zero_initial)

    def __repr__(self):
        pre = f"{self.pre!r}" + (f" x{self.pre_sweeps}" if self.pre_sweeps != 1 else "")
        post = f"{self.post!r}" + (f" x{self.post_sweeps}" if self.post_sweeps != 1 else "")
        return f"PrePostSmoother(pre={pre}, post={post}){_note(self)}"


def _gs(sweep, name):
    def factory(A, **kw):
        kw.setdefault("sweep", sweep)
        return GaussSeidel(A, **kw)
    factory.__name__ = factory.__qualname__ = name
    factory.smoother_class = GaussSeidel
    return factory


def _sor(A, omega=1.0, **kw):
    """Multicolour SOR/SSOR: :class:`GaussSeidel` with a weight ``omega`` in (0, 2)."""
    return GaussSeidel(A, omega=omega, **kw)


_sor.smoother_class = GaussSeidel

#: the one smoother registry: canonical name -> class or factory ``f(A, backend=, dtype=, **kw)``
SMOOTHERS = {
    "jacobi": Jacobi,
    "block_jacobi": BlockJacobi,
    "richardson": Richardson,
    "chebyshev": Chebyshev,
    "gauss_seidel": GaussSeidel,                        # symmetric multicolour sweep
    "gauss_seidel_forward": _gs("forward", "gauss_seidel_forward"),
    "gauss_seidel_backward": _gs("backward", "gauss_seidel_backward"),
    "block_gauss_seidel": BlockGaussSeidel,
    "sor": _sor,
    "l1_gauss_seidel": L1GaussSeidel,
}

#: other spellings accepted by :func:`normalize_smoother_name`
SMOOTHER_ALIASES = {
    "symmetric_gauss_seidel": "gauss_seidel",
    "multicolor_gauss_seidel": "gauss_seidel",
    "multicolour_gauss_seidel": "gauss_seidel",
    "forward_gauss_seidel": "gauss_seidel_forward",
    "backward_gauss_seidel": "gauss_seidel_backward",
    "block_gs": "block_gauss_seidel",
    "ssor": "sor",
    "l1_gs": "l1_gauss_seidel",
    "hybrid_gauss_seidel": "l1_gauss_seidel",
}

# smoothers that take a node block size (multigrid() passes space.components) and
# those with the omega="auto" rule (multigrid() uses it by default)
_BLOCK_SMOOTHERS = frozenset({"block_jacobi", "block_gauss_seidel"})
_AUTO_OMEGA_SMOOTHERS = frozenset({"jacobi", "block_jacobi"})


def normalize_smoother_name(spec):
    """The registry key of a smoother name, or ``None`` when ``spec`` is not a string.

    Case, ``-`` and blanks are ignored and aliases resolved ("Gauss-Seidel" ->
    "gauss_seidel", "SSOR" -> "sor").  An unknown name raises ``ValueError``
    listing the known ones.  This is the one place where smoother names are
    normalised (:func:`make_smoother`, :func:`adaptmg.multigrid`,
    :meth:`MultilevelSolver.from_matrices`, :func:`adaptmg.from_pyamg`).
    """
    if not isinstance(spec, str):
        return None
    key = "_".join(spec.strip().lower().replace("-", " ").replace("_", " ").split())
    key = SMOOTHER_ALIASES.get(key, key)
    if key not in SMOOTHERS:
        raise ValueError(f"unknown smoother {spec!r}; choose one of {sorted(SMOOTHERS)} "
                         "or pass an object with a .smooth(x, b, sweeps) method")
    return key


def level_smoothers(spec, smoother_kwargs=None):
    """The smoothers of a hierarchy's levels as a list of ``(spec, kwargs)``, finest level first.

    ``spec`` is one smoother for every level (a registry name, a factory, an object with
    ``.smooth``) with one dict ``smoother_kwargs``, or a *sequence* (tuple or list) of
    names / factories from the finest level down: the finest level gets ``spec[0]``, the next
    ``spec[1]``, ..., and the last entry every coarser level.  ``("block_gauss_seidel",
    "block_jacobi")`` is block Gauss-Seidel on the finest level and block Jacobi below it
    (the coarse levels are launch-bound on the GPU, where one GS sweep is one launch per
    colour); ``("block_gauss_seidel",) * 2 + ("block_jacobi",)`` GS on the two finest.
    With a sequence, ``smoother_kwargs`` is None or a sequence of the same length (each a
    dict or None): one set of arguments per entry, as the entries take different ones.
    """
    if not isinstance(spec, (tuple, list)):
        if smoother_kwargs is not None and not isinstance(smoother_kwargs, Mapping):
            raise TypeError(f"smoother_kwargs must be a dict or None for one smoother {spec!r}, "
                            f"got {type(smoother_kwargs).__name__}")
        return [(spec, dict(smoother_kwargs or {}))]
    if not spec:
        raise ValueError("smoother: an empty sequence; give one name or factory per level "
                         "group, finest first, e.g. ('block_gauss_seidel', 'block_jacobi')")
    for i, s in enumerate(spec):
        if isinstance(s, str):
            normalize_smoother_name(s)                 # an unknown name raises here
        elif not callable(s) or (hasattr(s, "smooth") and not isinstance(s, type)):
            raise TypeError(f"smoother[{i}] must be a registry name or a factory f(A, **kw) (a "
                            f"built smoother serves one matrix only), got {type(s).__name__}")
    kws = [None] * len(spec) if smoother_kwargs is None else smoother_kwargs
    if not isinstance(kws, (tuple, list)) or len(kws) != len(spec):
        raise ValueError(f"smoother is a sequence of {len(spec)} smoothers, so smoother_kwargs "
                         f"must be None or a sequence of {len(spec)} dicts (one per entry, "
                         f"finest first), got {smoother_kwargs!r}")
    for i, k in enumerate(kws):
        if k is not None and not isinstance(k, Mapping):
            raise TypeError(f"smoother_kwargs[{i}] must be a dict or None, got {type(k).__name__}")
    return [(s, dict(k or {})) for s, k in zip(spec, kws)]


def describe_level_smoothers(smoothers):
    """One line for ``print(ml)``: the finest level's smoother and, where coarser levels run
    other smoothers, their classes (``smoothers`` finest first, None entries skipped)."""
    sms = [s for s in smoothers if s is not None]
    if not sms:
        return "None"
    k = next((i for i, s in enumerate(sms) if type(s) is not type(sms[0])), len(sms))
    if k == len(sms):
        return repr(sms[0])
    below = ", ".join(dict.fromkeys(type(s).__name__ for s in sms[k:]))
    return f"{sms[0]!r} on the finest {k} level{'s' if k > 1 else ''}, below {below}"


def smoother_setup_kwargs(spec, smoother_kwargs=None, *, block_size=None, auto_omega=False):
    """Keyword arguments for ``make_smoother(spec, A, **kw)`` with the hierarchy defaults filled in.

    ``block_size`` is set for the block smoothers ("block_jacobi",
    "block_gauss_seidel") and ``omega="auto"`` for the Jacobi-type ones when
    ``auto_omega`` -- unless ``smoother_kwargs`` already says otherwise.  A
    factory or smoother object gets ``smoother_kwargs`` unchanged.  For a sequence of
    smoothers (:func:`level_smoothers`) a tuple of such dicts, one per entry.
    """
    if isinstance(spec, (tuple, list)):
        return tuple(smoother_setup_kwargs(s, k, block_size=block_size, auto_omega=auto_omega)
                     for s, k in level_smoothers(spec, smoother_kwargs))
    kw = level_smoothers(spec, smoother_kwargs)[0][1]                  # a copy, checked
    key = normalize_smoother_name(spec)
    if key in _BLOCK_SMOOTHERS and block_size is not None:
        kw.setdefault("block_size", block_size)
    if auto_omega and key in _AUTO_OMEGA_SMOOTHERS:
        kw.setdefault("omega", "auto")
    return kw


def make_smoother(spec, A, *, backend=None, dtype=None, **kwargs):
    """Build a smoother from a registry name (:data:`SMOOTHERS`, see
    :func:`normalize_smoother_name`), a class/callable ``f(A, **kwargs)``, or
    return ``spec`` if it already has a ``.smooth`` method."""
    if hasattr(spec, "smooth"):
        return spec
    if isinstance(spec, str):
        return SMOOTHERS[normalize_smoother_name(spec)](A, backend=backend, dtype=dtype, **kwargs)
    if callable(spec):
        sm = spec(A, **kwargs)
        if not hasattr(sm, "smooth"):
            raise TypeError(f"smoother factory {spec!r} returned {type(sm).__name__}, "
                            "which has no .smooth(x, b, sweeps) method")
        return sm
    raise TypeError(f"smoother must be a name, a factory or an object with .smooth, "
                    f"got {type(spec).__name__}")
