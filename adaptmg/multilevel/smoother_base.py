"""The smoother base class, point Jacobi and the helpers every smoother family shares.

:class:`Smoother` holds ``A`` on the host and on its backend, its SpMV plan and
scratch, and estimates ``lambda_max(S A)`` for ``omega="auto"`` (power iteration,
:func:`power_lambda_max`); :class:`Jacobi` is the sweep
``x <- x + omega D^{-1} (b - A x)``; :func:`_block_inverses` inverts the ``c x c``
diagonal node blocks.  :mod:`.smoothers` (the registry, block Jacobi, Richardson),
:mod:`.chebyshev` and :mod:`.gauss_seidel` build on this module, so none of them
imports another's module to get its base class; all names here are importable from
:mod:`adaptmg.multilevel.smoothers` as well.
"""
from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from ..device import kernels as K
from ..backend import backend_of, csr_from_arrays, get_backend, is_device_sparse, is_sparse, to_host
from ..fe.csr_ops import csr_diagonal, csr_entry_rows
from .start_vector import start_vector

__all__ = ["Smoother", "Jacobi", "power_lambda_max", "power_lambda_max_many", "power_iterate_many", "checked_lambdas"]


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
    return np.asarray(to_host(_diagonal(A, who)))


def _diagonal(A, who):
    """Diagonal of ``A`` where ``A`` lives: a device array for a cupyx matrix (the GPU
    set-up never reads it back), else a host NumPy array."""
    if sp.issparse(A) or hasattr(A, "diagonal"):
        d = csr_diagonal(A)
        return d if is_device_sparse(A) else np.asarray(to_host(d))
    if isinstance(A, np.ndarray):
        return np.diag(A)
    raise TypeError(f"{who}: cannot take the diagonal of {type(A).__name__}; "
                    "pass a sparse matrix or an operator with .diagonal()")


def _inverse_diagonal(d, who, singular="raise", positive=False, what="diagonal entry"):
    """``1 / d`` on ``d``'s backend.  A zero or non-finite entry (``positive``: one that is not
    > 0) is a ``ValueError`` naming its row -- one reduction on the device and, only when
    something is wrong, a few scalar reads; ``singular="pinv"`` leaves zero entries' rows
    alone (``D^{-1}`` entry 0, as pyamg's relaxation) when every entry is finite."""
    xp = backend_of(d).xp
    fin = xp.isfinite(d)
    if singular == "pinv" and bool(fin.all()):
        nz = d != 0
        return xp.where(nz, 1.0 / xp.where(nz, d, 1), 0)
    bad = ~fin | ((d.real <= 0) if positive else (d == 0))
    if bool(bad.any()):
        first, count = int(xp.argmax(bad)), int(bad.sum())
        if positive:
            raise ValueError(f"{who}: {what} is not positive in row {first} ({d[first].item()!r}; "
                             f"{count} rows in all): A must be SPD")
        raise ValueError(f"{who}: zero or non-finite {what} in row {first} ({count} rows in all)")
    return 1.0 / d


def power_lambda_max(apply, v, norm, iterations=12, who="smoother"):
    """1.05 x the power-iteration estimate of the largest eigenvalue of ``apply`` (``S A``)
    from ``v`` (overwritten), with the 2-norm ``norm`` (a distributed one on several ranks:
    :mod:`adaptmg.distributed` uses this same iteration).

    ``norm`` may return a 0-d device array: the iteration then never waits for the device
    (one read at the end instead of one per step); a zero ``S A v`` then shows as a NaN
    estimate, which is refused like a zero one."""
    return power_lambda_max_many([apply], [v], lambda us: [norm(us[0])], iterations, who)[0]


def power_lambda_max_many(applies, vs, norms, iterations=12, who="smoother"):
    """:func:`power_lambda_max` of several operators at once, their steps interleaved (step
    ``k`` of every operator, then step ``k + 1``): ``norms(us)`` returns the 2-norms of the
    list ``us`` together (on several ranks: one reduction of them all a step, where one
    operator alone takes one each).  Each operator's estimate is the one
    :func:`power_lambda_max` gives it, operation for operation."""
    return checked_lambdas(power_iterate_many(applies, vs, norms, iterations), who)


def power_iterate_many(applies, vs, norms, iterations=12):
    """The iteration of :func:`power_lambda_max_many` without its read-back: the last norms
    ``||S A v||`` as ``norms`` returned them (0-d device arrays stay on the device, so the
    whole iteration can be queued without the host waiting); :func:`checked_lambdas` reads
    and checks them."""
    vs = list(vs)
    for i, nv in enumerate(norms(vs)):
        vs[i] /= nv
    lams = [0.0] * len(vs)
    for _ in range(iterations):        # ||v|| = 1 at the top of each iteration
        ws = [apply(v) for apply, v in zip(applies, vs)]
        lams = list(norms(ws))
        if any(isinstance(lam, (float, np.floating)) and lam == 0 for lam in lams):
            break                      # a host norm of zero: that estimate is refused below
        vs = [w / lam for w, lam in zip(ws, lams)]
    return lams


def checked_lambdas(lams, who="smoother"):
    """``1.05 * lam`` for the norms of :func:`power_iterate_many` (read to the host), a
    ValueError naming ``who`` for a zero, negative or non-finite one."""
    out = []
    for lam in lams:
        lam = float(lam)
        if not np.isfinite(lam) or lam <= 0:
            raise ValueError(f"{who}: could not estimate lambda_max(S A) (got {lam})")
        out.append(1.05 * lam)
    return out


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
        Av = xp.empty(self.n, self.dtype)

        def apply(u):          # S A u, A u by the smoother's SpMV plan (cached descriptors)
            self._Aplan(u, Av, 1.0, 0.0)
            return self._apply_S(Av)
        return power_lambda_max(apply, v, xp.linalg.norm, iterations, type(self).__name__)

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
        """True when ``A`` is a CSR matrix with int32 indices (fused sweep kernel usable), or
        an operator with its own one-pass ``jacobi_sweep`` (``A.fused_kernels``: a
        distributed matrix, :class:`adaptmg.distributed.DistCSR`)."""
        return K.is_int32_csr(self.A) or bool(getattr(self.A, "fused_kernels", False))

    def _sweep(self, src, b, dst):
        """One fused sweep ``dst <- src + omega D^{-1} (b - A src)`` (the operator's own
        ``jacobi_sweep`` where it has one, else the CSR kernel)."""
        own = getattr(self.A, "jacobi_sweep", None)
        if own is not None:
            return own(src, b, self.dinv, self.omega, dst)
        return K.csr_jacobi_sweep(self.A, src, b, self.dinv, self.omega, dst)

    def _setup_host(self):
        # D^{-1} where A lives: for a device matrix (the GPU set-up) a device array -- the
        # diagonal never comes to the host (``_dinv_host`` is then a device array)
        d = _diagonal(self.A_host, "Jacobi")
        self._dinv_host = _inverse_diagonal(d, "Jacobi", getattr(self, "singular", "raise"))

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
            # the first two sweeps in one launch (a CSR matrix: x^(1) formed on the fly; an
            # operator with its own sweep needs x^(1)'s ghost values, so it starts with one)
            pair = sweeps >= 2 and K.is_int32_csr(A)
            m = sweeps - (2 if pair else 1)              # sweeps left after the first launch
            src = x if m % 2 == 0 else tmp
            if pair:
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
        dst = tmp if src is x else x
        for i in range(m):
            if defer_last and i == m - 1 and dst is x:
                return src
            self._sweep(src, b, dst)
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
    rows = csr_entry_rows(indptr, indices.size).astype(np.int64)
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
    # one scalar read each on the device; the node numbers come down only for an error
    if singular == "pinv":
        if not bool(finite.all()):
            bad = np.flatnonzero(~to_host(finite))
            raise ValueError(f"{who}: diagonal block of node {int(bad[0])} is not finite "
                             f"({bad.size} blocks in all)")
        if bool(bad.any()):                        # pyamg: pseudo-inverses of those blocks
            idx = xp.flatnonzero(xp.asarray(bad))
            fixed = xp.linalg.pinv(blocks[idx])
            if inv is None:
                inv = xp.linalg.pinv(blocks)
            inv[idx] = fixed
        bad = bad[:0]
    if bool(bad.any()):
        bad = np.flatnonzero(to_host(bad))
        raise ValueError(f"{who}: diagonal block of node {int(bad[0])} (rows "
                         f"{int(bad[0]) * c}..{int(bad[0]) * c + c - 1}) is singular "
                         f"({bad.size} singular blocks in all)")
    sym = bool(xp.all(xp.abs(blocks - blocks.transpose(0, 2, 1))
                      <= 1e-13 * xp.abs(blocks.transpose(0, 2, 1))))
    if sym:  # keep S exactly symmetric so the V-cycle stays symmetric
        inv = 0.5 * (inv + inv.transpose(0, 2, 1))
    return inv



def _block_diagonal_csr(blocks):
    """The block-diagonal CSR matrix of the ``(N, c, c)`` array ``blocks`` (on its backend):
    row ``i = k*c + m`` holds ``blocks[k, m, :]`` in columns ``k*c .. k*c + c - 1``."""
    N, c = int(blocks.shape[0]), int(blocks.shape[1])
    be = backend_of(blocks)
    xp, n = be.xp, N * c
    indptr = xp.arange(0, n * c + 1, c, dtype=np.int64)
    cols = (xp.arange(n)[:, None] // c) * c + xp.arange(c)[None, :]
    return csr_from_arrays(be.sparse, blocks.reshape(n * c), cols.reshape(-1), indptr, (n, n))
