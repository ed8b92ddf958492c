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
* :class:`PrePostSmoother` -- different pre- and post-smoothers on one level.

Names.  :data:`SMOOTHERS` is the one registry of smoother names ("jacobi",
"block_jacobi", "richardson", "chebyshev", "gauss_seidel" (symmetric
multicolour), "gauss_seidel_forward", "gauss_seidel_backward",
"block_gauss_seidel", "sor", "l1_gauss_seidel"); :func:`normalize_smoother_name`
is the one place where a user's spelling is turned into a registry key, and
:func:`smoother_setup_kwargs` fills in the hierarchy defaults (block size,
``omega="auto"``).

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
"""
from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from ..device import kernels as K
from ..backend import backend_of, get_backend, is_sparse, to_host
from .start_vector import start_vector

__all__ = ["Smoother", "Jacobi", "Richardson", "BlockJacobi", "Chebyshev", "PrePostSmoother",
           "GaussSeidel", "BlockGaussSeidel", "L1GaussSeidel", "make_smoother",
           "normalize_smoother_name", "smoother_setup_kwargs", "estimate_lambda_max", "SMOOTHERS"]


def _check_square(A, who):
    shape = getattr(A, "shape", None)
    if shape is None or len(shape) != 2:
        raise TypeError(f"{who}: A must be a 2-D matrix or operator with .shape, "
                        f"got {type(A).__name__}")
    if shape[0] != shape[1]:
        raise ValueError(f"{who}: A must be square, got shape {tuple(shape)}")
    return int(shape[0])


def _host_diagonal(A, who):
    """Diagonal of ``A`` as a host NumPy array (sparse, dense or ``.diagonal()``)."""
    if sp.issparse(A) or hasattr(A, "diagonal"):
        d = to_host(A.diagonal())
    elif isinstance(A, np.ndarray):
        d = np.diag(A)
    else:
        raise TypeError(f"{who}: cannot take the diagonal of {type(A).__name__}; "
                        "pass a sparse matrix or an operator with .diagonal()")
    return np.asarray(d)


def power_lambda_max(apply, v, norm, iterations=12, who="smoother"):
    """1.05 x the power-iteration estimate of the largest eigenvalue of ``apply`` (``S A``)
    from ``v`` (overwritten), with the 2-norm ``norm`` (a distributed one on several ranks:
    :mod:`adaptmg.distributed` uses this same iteration).

    ``norm`` may return a 0-d device array: the iteration then never waits for the device
    (one read at the end instead of one per step); a zero ``S A v`` then shows as a NaN
    estimate, which is refused like a zero one."""
    v /= norm(v)
    lam = 0.0
    for _ in range(iterations):        # ||v|| = 1 at the top of each iteration
        w = apply(v)
        lam = norm(w)
        if isinstance(lam, (float, np.floating)) and lam == 0:     # a host norm: stop there
            break
        v = w / lam
    lam = float(lam)
    if not np.isfinite(lam) or lam <= 0:
        raise ValueError(f"{who}: could not estimate lambda_max(S A) (got {lam})")
    return 1.05 * lam


def _validate_sweeps(sweeps):
    if not isinstance(sweeps, (int, np.integer)) or sweeps < 0:
        raise ValueError(f"sweeps must be a non-negative integer, got {sweeps!r}")
    return int(sweeps)


def _validate_vectors(x, b, n, dtype, who):
    if x.shape != (n,) or b.shape != (n,):
        raise ValueError(f"{who}: x and b must have shape ({n},), got x {x.shape}, b {b.shape}")
    if x.dtype != dtype or b.dtype != dtype:
        raise TypeError(f"{who}: x and b must be {dtype}, got x {x.dtype}, b {b.dtype}")


def _note(sm):
    """`` [note]`` when a smoother carries a ``note`` (e.g. what it replaces), else ''."""
    note = getattr(sm, "note", None)
    return f" [{note}]" if note else ""


class Smoother:
    """Base class: holds ``A`` (host and device), its SpMV plan and scratch."""

    name = "smoother"
    _adaptmg_smoother = True

    def __init__(self, A, omega, backend=None, dtype=None):
        self.n = _check_square(A, type(self).__name__)
        auto = isinstance(omega, str) and omega == "auto"
        if not auto and (isinstance(omega, str) or not np.isfinite(omega) or omega <= 0):
            raise ValueError(f"{type(self).__name__}: omega must be a positive number or 'auto', got {omega!r}")
        self.omega = 1.0 if auto else float(omega)
        self.A_host = A
        self.backend = None
        self.dtype = None
        self._setup_host()
        self._to(get_backend(backend if backend is not None else "cpu"),
                 np.dtype(dtype if dtype is not None else getattr(A, "dtype", np.float64)))
        if auto:
            self.omega = 4.0 / (3.0 * self.lambda_max())

    def lambda_max(self, iterations=12, seed=0):
        r"""Estimate of the largest eigenvalue of S A (power iteration, +5 %).

        S A is similar to the symmetric S^{1/2} A S^{1/2} for SPD A, so its
        spectrum is real.  ``omega="auto"`` uses omega = 4 / (3 lambda_max), the
        damping that minimises max |1 - omega lambda| over the upper half
        [lambda_max / 2, lambda_max] of the spectrum (the smoothing range).
        Runs on the smoother's backend (setup time only), from
        :func:`~adaptmg.multilevel.start_vector.start_vector` (the same vector on every
        backend, made there).
        """
        if not hasattr(self, "_apply_S"):
            raise TypeError(f"{type(self).__name__} has no omega='auto' rule")
        xp = self.backend.xp
        v = start_vector(self.n, seed, xp=xp).astype(self.dtype, copy=False)
        return power_lambda_max(lambda u: self._apply_S(self.A @ u), v, xp.linalg.norm,
                                iterations, type(self).__name__)

    # subclasses: _setup_host() computes host data, _move() builds device data
    def _setup_host(self):  # pragma: no cover - abstract
        raise NotImplementedError

    def _move(self):  # pragma: no cover - abstract
        raise NotImplementedError

    def _to(self, be, dtype):
        if dtype.kind not in "fc":
            raise TypeError(f"{type(self).__name__}: dtype must be a float or complex type, "
                            f"got {dtype}")
        self.backend, self.dtype = be, dtype
        A = self.A_host
        if is_sparse(A):
            self.A = be.asmatrix(A, dtype=dtype)
        else:  # matrix-free operator: used as is
            self.A = A
        self._Aplan = K.make_spmv(self.A)
        self._work = None           # scratch, allocated on first use without ``work=``
        self._move()
        return self

    def to(self, backend="cpu", dtype=None):
        """A copy of this smoother on ``backend`` (and ``dtype``); self if unchanged."""
        be = get_backend(backend)
        dt = np.dtype(dtype) if dtype is not None else self.dtype
        if be == self.backend and dt == self.dtype:
            return self
        new = object.__new__(type(self))
        new.__dict__.update({k: v for k, v in self.__dict__.items()
                             if not k.startswith("_") or k in self._host_attrs})
        return new._to(be, dt)

    _host_attrs = ()

    def _scratch(self, work):
        if work is None:
            if self._work is None:
                self._work = self.backend.xp.zeros(self.n, self.dtype)
            return self._work
        if work.shape != (self.n,) or work.dtype != self.dtype:
            raise ValueError(f"work must have shape ({self.n},) and dtype {self.dtype}, "
                             f"got {work.shape} {work.dtype}")
        return work

    def smooth(self, x, b, sweeps=1, work=None, zero_initial=False):  # pragma: no cover
        raise NotImplementedError

    def __repr__(self):
        return f"{type(self).__name__}(omega={self.omega:.4g}){_note(self)}"


class Jacobi(Smoother):
    r"""Damped point Jacobi, ``x <- x + omega D^{-1} (b - A x)``.

    ``S = D^{-1}`` is stored as a vector ``dinv``; one sweep is one SpMV
    (``Ax`` into scratch) and one fused kernel
    (:func:`adaptmg.device.kernels.jacobi_residual_update`).  From a zero initial
    guess the first sweep is ``x = omega D^{-1} b`` (no SpMV).

    For the Q1 Laplacian the spectrum of ``D^{-1}A`` lies in ``(0, 1.5]`` in
    2-D and ``(0, 1.6875]`` in 3-D (``lambda_max = 27/16``); ``omega = 2/3``
    damps the upper half of the spectrum in 2-D, ``omega ~ 0.7`` is a good
    choice in 3-D.
    """

    name = "jacobi"
    #: :meth:`smooth` and :meth:`smooth_corrected` take ``defer_last``
    defers_last_sweep = True

    def __repr__(self):
        return (f"{type(self).__name__}(omega={self.omega:.4g}{', fused' if self.fused else ''})"
                f"{_note(self)}")
    _host_attrs = ("_dinv_host", "fused", "singular")

    def __init__(self, A, omega=2.0 / 3.0, backend=None, dtype=None, fused=False,
                 singular="raise"):
        # singular="pinv": a zero diagonal entry leaves its row alone (D^{-1} entry 0), as
        # pyamg's relaxation does (from_pyamg asks for it); "raise": ValueError naming it
        if singular not in ("raise", "pinv"):
            raise ValueError(f"Jacobi: singular must be 'raise' or 'pinv', got {singular!r}")
        self.singular = singular
        self.fused = bool(fused)
        super().__init__(A, omega, backend, dtype)

    @property
    def can_fuse(self):
        """True when ``A`` is a CSR matrix with int32 indices (fused sweep kernel usable)."""
        return K.is_int32_csr(self.A)

    def _setup_host(self):
        d = _host_diagonal(self.A_host, "Jacobi")
        if getattr(self, "singular", "raise") == "pinv" and np.isfinite(d).all():
            self._dinv_host = np.divide(1.0, d, out=np.zeros_like(d), where=d != 0)
            return
        bad = np.flatnonzero(~np.isfinite(d) | (d == 0))
        if bad.size:
            raise ValueError(f"Jacobi: zero or non-finite diagonal entry in row {int(bad[0])} "
                             f"({bad.size} rows in all)")
        self._dinv_host = 1.0 / d

    def _apply_S(self, r):
        return self.dinv * r

    def _move(self):
        self.dinv = self.backend.asarray(self._dinv_host.astype(self.dtype))

    def smooth(self, x, b, sweeps=1, work=None, zero_initial=False, defer_last=False):
        """``sweeps`` damped Jacobi sweeps on ``A x = b``, in place.

        ``defer_last=True`` (fused kernels only, else ignored): when the last sweep would
        read another buffer and write ``x``, it is not launched and that buffer ``src``
        is returned instead, for the caller to run ``x <- src + omega D^{-1} (b - A
        src)`` fused with its own work.  Returns ``x`` or ``src``."""
        sweeps = _validate_sweeps(sweeps)
        _validate_vectors(x, b, self.n, self.dtype, "Jacobi.smooth")
        Ax = self._scratch(work)
        w = self.omega
        if self.fused and self.can_fuse:
            return self._smooth_fused(x, b, sweeps, Ax, zero_initial, defer_last)
        start = 0
        if zero_initial and sweeps > 0:
            K.jacobi_zero(x, self.dinv, b, w)
            start = 1
        elif zero_initial:
            x.fill(0)
        for _ in range(start, sweeps):
            self._Aplan(x, Ax, 1.0, 0.0)
            K.jacobi_residual_update(x, self.dinv, b, Ax, w)
        return x

    def _smooth_fused(self, x, b, sweeps, tmp, zero_initial, defer_last=False):
        """One launch per sweep (:func:`adaptmg.device.kernels.csr_jacobi_sweep`), ping-pong
        between ``x`` and ``tmp`` arranged so that the result lands in ``x``.  From a zero
        initial guess the first two sweeps are one launch
        (:func:`~adaptmg.device.kernels.csr_jacobi_zero_sweeps`)."""
        w, dinv, A = self.omega, self.dinv, self.A
        if zero_initial:
            if sweeps == 0:
                x.fill(0)
                return x
            m = sweeps - 2 if sweeps >= 2 else 0        # sweeps left after the first launch
            src = x if m % 2 == 0 else tmp
            if sweeps >= 2:
                K.csr_jacobi_zero_sweeps(A, b, dinv, w, src)
            else:
                K.jacobi_zero(src, dinv, b, w)
        else:
            m, src = sweeps, x
        return self._sweeps_into_x(x, src, b, m, tmp, defer_last)

    def _sweeps_into_x(self, x, src, b, m, tmp, defer_last=False):
        """``m`` fused sweeps from ``src`` (``x`` or ``tmp``), ping-pong, result in ``x``;
        with ``defer_last`` a last sweep that writes ``x`` is left to the caller (its
        input buffer is returned)."""
        w, dinv, A = self.omega, self.dinv, self.A
        dst = tmp if src is x else x
        for i in range(m):
            if defer_last and i == m - 1 and dst is x:
                return src
            K.csr_jacobi_sweep(A, src, b, dinv, w, dst)
            src, dst = dst, src
        if src is not x:
            x[...] = src
        return x

    def smooth_corrected(self, x, b, sweeps, AP, P, e, work, defer_last=False):
        r"""The coarse-grid correction ``x <- x + P e`` followed by ``sweeps >= 1`` sweeps,
        the correction and the first sweep in one launch
        (:func:`~adaptmg.device.kernels.csr_correct_jacobi`, ``AP = A P`` given), the
        others as :meth:`smooth` (fused).  Needs the fused kernels (``self.fused`` and
        :attr:`can_fuse`); ``work`` is the ping-pong buffer.  ``defer_last``: as in
        :meth:`smooth`."""
        if not (self.fused and self.can_fuse) or sweeps < 1:
            raise ValueError("smooth_corrected needs the fused kernels and sweeps >= 1")
        m = sweeps - 1
        # the first launch cannot write x (it reads x in the neighbours' rows): it writes
        # work; an odd number of sweeps left ends in x, an even one is copied there
        K.csr_correct_jacobi(self.A, AP, P, x, e, b, self.dinv, self.omega, work)
        return self._sweeps_into_x(x, work, b, m, work, defer_last)


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


def _block_inverses(A, c, who="BlockJacobi", singular="raise"):
    """Inverses of the ``c x c`` diagonal node blocks of CSR ``A``, shape ``(n/c, c, c)``,
    on ``A``'s backend (NumPy for SciPy, CuPy for cupyx: no host round trip on the GPU).

    The blocks are gathered from the CSR arrays with one weighted ``bincount`` (the
    entries with ``row // c == col // c``) and inverted as a batch.  A block is rejected
    (``ValueError`` naming the node) when it is not finite, zero, or
    ``||B||_F ||B^{-1}||_F >= 1 / (c eps)`` -- this bound on ``cond_F >= cond_2`` flags
    every block with ``sigma_min <= c eps sigma_max``.  Symmetric blocks get exactly
    symmetric inverses (keeps ``S`` symmetric).  ``singular="pinv"``: a finite singular
    block gets its pseudo-inverse instead (pyamg's block relaxation inverts every block
    with ``pinv``); non-finite blocks are still refused.
    """
    n = A.shape[0]
    if n % c:
        raise ValueError(f"{who}: matrix size {n} is not a multiple of block_size {c}")
    N = n // c
    xp = backend_of(A).xp
    indptr, indices = A.indptr, A.indices.astype(np.int64)
    rows = xp.searchsorted(indptr, xp.arange(indices.size, dtype=indptr.dtype), side="right") - 1
    rows = rows.astype(np.int64)
    keep = (rows // c) == (indices // c)
    flat = (rows[keep] // c) * (c * c) + (rows[keep] % c) * c + indices[keep] % c
    dt = np.result_type(A.dtype, np.float64)
    blocks = xp.bincount(flat, weights=A.data[keep].astype(dt), minlength=N * c * c)
    blocks = blocks.reshape(N, c, c)
    finite = xp.isfinite(blocks).all(axis=(1, 2))
    safe = xp.where(finite[:, None, None], blocks, xp.eye(c, dtype=dt)[None])
    nb = xp.sqrt((xp.abs(safe) ** 2).sum(axis=(1, 2)))
    try:
        inv = xp.linalg.inv(xp.where((nb > 0)[:, None, None], safe, xp.eye(c, dtype=dt)[None]))
        ni = xp.sqrt((xp.abs(inv) ** 2).sum(axis=(1, 2)))
        bad = ~finite | (nb == 0) | ~xp.isfinite(ni) | (nb * ni * (c * np.finfo(np.float64).eps) >= 1)
    except np.linalg.LinAlgError:          # NumPy: an exactly singular block
        inv = None
        s = np.linalg.svd(to_host(safe), compute_uv=False)
        bad = ~to_host(finite) | (s[:, 0] == 0) | (s[:, -1] <= c * np.finfo(np.float64).eps * s[:, 0])
    if singular == "pinv":
        fin = to_host(finite)
        if not fin.all():
            bad = np.flatnonzero(~fin)
            raise ValueError(f"{who}: diagonal block of node {int(bad[0])} is not finite "
                             f"({bad.size} blocks in all)")
        bad = np.flatnonzero(to_host(bad))
        if bad.size:                               # pyamg: pseudo-inverses of those blocks
            idx = xp.asarray(bad)
            fixed = xp.linalg.pinv(blocks[idx])
            if inv is None:
                inv = xp.linalg.pinv(blocks)
            inv[idx] = fixed
        bad = bad[:0]
    bad = np.flatnonzero(to_host(bad))
    if bad.size:
        raise ValueError(f"{who}: diagonal block of node {int(bad[0])} (rows "
                         f"{int(bad[0]) * c}..{int(bad[0]) * c + c - 1}) is singular "
                         f"({bad.size} singular blocks in all)")
    sym = bool(xp.all(xp.abs(blocks - blocks.transpose(0, 2, 1))
                      <= 1e-13 * xp.abs(blocks.transpose(0, 2, 1))))
    if sym:  # keep S exactly symmetric so the V-cycle stays symmetric
        inv = 0.5 * (inv + inv.transpose(0, 2, 1))
    return inv


def _block_inverse_csr(A, c):
    """Inverse of the ``c x c`` diagonal node blocks of CSR ``A`` as a CSR matrix on ``A``'s
    backend.

    Row ``i = node*c + k`` of the result holds ``inv(B_node)[k, :]`` in columns
    ``node*c + (0..c-1)``.
    """
    n = A.shape[0]
    be = backend_of(A)
    xp = be.xp
    inv = _block_inverses(A, c)
    indptr = xp.arange(0, n * c + 1, c, dtype=np.int64)
    cols = (xp.arange(n)[:, None] // c) * c + xp.arange(c)[None, :]
    return be.sparse.csr_matrix((inv.reshape(n * c), cols.reshape(-1), indptr), shape=(n, n))


class BlockJacobi(Smoother):
    r"""Damped block Jacobi ``x <- x + omega S (b - A x)``, ``S = blockdiag(B_k)^{-1}``.

    ``B_k`` is the ``c x c`` block of ``A`` coupling the ``c`` components of
    node ``k`` (DoF index ``k*c + comp``).  ``S`` is a CSR matrix with ``c``
    entries per row, so a sweep is SpMV(A), one fused residual kernel and
    SpMV(S) with ``alpha = omega, beta = 1``.  A singular block raises
    ``ValueError`` naming the node.  With ``c = 1`` this is :class:`Jacobi`.
    """

    name = "block_jacobi"
    _host_attrs = ("_S_host", "block_size")

    def __init__(self, A, block_size=1, omega=2.0 / 3.0, backend=None, dtype=None):
        if not isinstance(block_size, (int, np.integer)) or block_size < 1:
            raise ValueError(f"BlockJacobi: block_size must be a positive integer, got {block_size!r}")
        self.block_size = int(block_size)
        super().__init__(A, omega, backend, dtype)

    def _setup_host(self):
        A = self.A_host
        if not is_sparse(A):
            raise TypeError("BlockJacobi needs an assembled sparse matrix, got "
                            f"{type(A).__name__}")
        # on A's backend: a device matrix (GPU set-up) never comes to the host
        self._S_host = _block_inverse_csr(A.tocsr(), self.block_size)

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


# The Chebyshev and Gauss-Seidel families live in their own modules, which build on
# Smoother above (imported here, after the base class exists, so that the registry
# below is complete).
from .chebyshev import Chebyshev, estimate_lambda_max  # noqa: E402
from .gauss_seidel import BlockGaussSeidel, GaussSeidel, L1GaussSeidel  # noqa: E402


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


def smoother_setup_kwargs(spec, smoother_kwargs=None, *, block_size=None, auto_omega=False):
    """Keyword arguments for ``make_smoother(spec, A, **kw)`` with the hierarchy defaults filled in.

    ``block_size`` is set for the block smoothers ("block_jacobi",
    "block_gauss_seidel") and ``omega="auto"`` for the Jacobi-type ones when
    ``auto_omega`` -- unless ``smoother_kwargs`` already says otherwise.  A
    factory or smoother object gets ``smoother_kwargs`` unchanged.
    """
    kw = dict(smoother_kwargs or {})
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
