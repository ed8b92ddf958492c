r"""Chebyshev polynomial smoothing with Jacobi scaling, and the Lanczos estimate of ``lambda_max(D^{-1}A)``.

Part of the smoother family of :mod:`adaptmg.multilevel.smoothers` (which registers
:class:`Chebyshev` under the name ``"chebyshev"``); the class docstring has the math.
"""
from __future__ import annotations

import numpy as np

from ..backend import backend_of, is_device_sparse, to_host
from ..device import kernels as K
from .smoother_base import Jacobi, Smoother, _check_square, _diagonal, _note, _validate_sweeps, _validate_vectors
from .start_vector import start_vector

__all__ = ["Chebyshev", "estimate_lambda_max", "lanczos_lambda_max"]


def estimate_lambda_max(A, dinv=None, steps=20, seed=0):
    r"""Largest eigenvalue of ``D^{-1} A`` (``A`` SPD) by ``steps`` Lanczos steps.

    Runs on the symmetric ``D^{-1/2} A D^{-1/2}`` with full re-orthogonalisation
    (``steps`` is small), where ``A`` lives: on the host, or on the device for a cupyx
    matrix (the Lanczos vectors there, two scalars read back per step: nothing of O(n)
    comes to the host); returns the largest Ritz value, a lower bound that converges
    quickly for the top of the spectrum.  Both backends start from the same vector
    (:func:`~.start_vector.start_vector`) and agree to rounding.
    """
    n = _check_square(A, "estimate_lambda_max")
    if dinv is None:
        dinv = 1.0 / _diagonal(A, "estimate_lambda_max")
    if is_device_sparse(A):
        xp = backend_of(A).xp
        if A.dtype != np.float64:                  # the estimate in float64, as on the host
            A = A.astype(np.float64)
        s = xp.sqrt(xp.asarray(dinv, dtype=xp.float64))
        return lanczos_lambda_max(lambda v: s * (A @ (s * v)), start_vector(n, seed, xp=xp),
                                  int(min(steps, n)))
    s = np.sqrt(np.asarray(to_host(dinv), dtype=np.float64))
    v0 = start_vector(n, seed)
    return lanczos_lambda_max(lambda v: s * np.asarray(A @ (s * v)).ravel(), v0, int(min(steps, n)))


def lanczos_lambda_max(matvec, v0, m, reduce=None):
    """Largest Ritz value of the symmetric ``matvec`` after ``m`` Lanczos steps from ``v0``
    (full re-orthogonalisation, twice), on ``v0``'s backend (the coefficients are host
    numbers: two scalar reads per step on the device).  ``reduce``: sums a local array of
    partial inner products over all ranks (None: one process); :mod:`adaptmg.distributed`
    passes an Allreduce, so the distributed estimate runs this same iteration on owned
    entries (host vectors)."""
    red = (lambda a: a) if reduce is None else reduce
    xp = backend_of(v0).xp

    def norm(w):
        if reduce is None:
            return float(xp.linalg.norm(w))
        return float(np.sqrt(max(red(np.array([w @ w]))[0], 0.0)))

    def dot(u, w):
        return float(u @ w) if reduce is None else red(np.array([u @ w]))[0]

    V = xp.zeros((m + 1, v0.size))
    alpha = np.zeros(m)
    beta = np.zeros(m)
    V[0] = v0 / norm(v0)
    k = m
    for j in range(m):
        w = matvec(V[j])
        alpha[j] = dot(V[j], w)
        w -= V[: j + 1].T @ red(V[: j + 1] @ w)
        w -= V[: j + 1].T @ red(V[: j + 1] @ w)
        beta[j] = norm(w)
        if beta[j] <= 1e-12 * abs(alpha[j]) or j == m - 1:
            k = j + 1
            break
        V[j + 1] = w / beta[j]
    T = np.diag(alpha[:k]) + np.diag(beta[: k - 1], 1) + np.diag(beta[: k - 1], -1)
    return float(np.linalg.eigvalsh(T)[-1])


class Chebyshev(Smoother):
    r"""Chebyshev smoother for SPD ``A`` with Jacobi preconditioning.

    With ``lmax`` = 1.1 x (Lanczos estimate of the largest eigenvalue of
    ``D^{-1}A``) and the interval ``[a, b] = [lower * lmax, lmax]``,
    ``theta = (a + b)/2``, ``delta = (b - a)/2``, ``sigma = theta/delta``, a
    sweep of degree ``k`` is the Chebyshev iteration (Saad, Alg. 12.1)::

        d = D^{-1}(b - A x) / theta;                 x += d
        rho_0 = 1/sigma
        for j = 1..k-1:
            rho_j = 1 / (2 sigma - rho_{j-1})
            d = rho_j rho_{j-1} d + (2 rho_j / delta) D^{-1}(b - A x);   x += d

    The error is multiplied by ``T_k((theta - D^{-1}A)/delta) / T_k(sigma)``,
    bounded by ``1/T_k(sigma)`` on ``[a, b]``.  All coefficients are host
    constants fixed at setup; each step is one SpMV and one fused kernel.

    ``scaling="none"`` replaces ``D`` by the identity: the unpreconditioned
    Chebyshev smoother of pyamg (``lmax`` then bounds the spectrum of ``A``).
    pyamg's ``('chebyshev', {'degree': k, 'lower_bound': lb, 'upper_bound': ub})``
    with ``rho ~ rho(A)`` is ``Chebyshev(A, degree=k, lower=lb/ub, lmax=ub*rho,
    scaling="none")``: the same residual polynomial, evaluated by the
    three-term recurrence instead of Horner's rule.
    """

    name = "chebyshev"
    _host_attrs = ("_dinv_host", "degree", "lower", "lmax", "_coef", "scaling", "fused")

    def __init__(self, A, degree=3, lower=1.0 / 30.0, lmax=None, backend=None, dtype=None,
                 scaling="jacobi", fused=False):
        self.fused = bool(fused)
        if not isinstance(degree, (int, np.integer)) or degree < 1:
            raise ValueError(f"Chebyshev: degree must be a positive integer, got {degree!r}")
        if not (0 < lower < 1):
            raise ValueError(f"Chebyshev: lower must be in (0, 1), got {lower!r}")
        if scaling not in ("jacobi", "none"):
            raise ValueError(f"Chebyshev: scaling must be 'jacobi' or 'none', got {scaling!r}")
        if lmax is not None and not (np.isfinite(lmax) and lmax > 0):
            raise ValueError(f"Chebyshev: lmax must be a positive number or None, got {lmax!r}")
        self.degree = int(degree)
        self.lower = float(lower)
        self.lmax = lmax
        self.scaling = scaling
        super().__init__(A, 1.0, backend, dtype)

    def _setup_host(self):
        if self.scaling == "none":
            self._dinv_host = np.ones(self.n)
        else:
            # where A lives (a device array for the GPU set-up: one scalar read)
            d = _diagonal(self.A_host, "Chebyshev")
            bad = ~(d > 0) | ~backend_of(d).xp.isfinite(d)
            if bool(bad.any()):
                i = int(np.flatnonzero(to_host(bad))[0])
                raise ValueError(f"Chebyshev needs an SPD matrix: diagonal entry {i} is {float(d[i])!r}")
            self._dinv_host = 1.0 / d
        if self.lmax is None:     # on A's backend: a device matrix stays there
            self.lmax = 1.1 * estimate_lambda_max(self.A_host, self._dinv_host)
        b = float(self.lmax)
        a = self.lower * b
        theta, delta = 0.5 * (b + a), 0.5 * (b - a)
        sigma = theta / delta
        coef = [(0.0, 1.0 / theta)]
        rho_old = 1.0 / sigma
        for _ in range(1, self.degree):
            rho = 1.0 / (2.0 * sigma - rho_old)
            coef.append((rho * rho_old, 2.0 * rho / delta))
            rho_old = rho
        self._coef = tuple(coef)

    def _move(self):
        self.dinv = self.backend.asarray(self._dinv_host.astype(self.dtype))
        self._d = self.backend.xp.zeros(self.n, self.dtype)

    @property
    def can_fuse(self):
        """True when ``A`` is a CSR matrix with int32 indices (the fused step kernel; a
        distributed operator's ``jacobi_sweep`` does not serve a Chebyshev step)."""
        return K.is_int32_csr(self.A)

    def smooth(self, x, b, sweeps=1, work=None, zero_initial=False):
        """``sweeps`` Chebyshev sweeps of degree ``self.degree``, in place."""
        sweeps = _validate_sweeps(sweeps)
        _validate_vectors(x, b, self.n, self.dtype, "Chebyshev.smooth")
        Ax = self._scratch(work)
        d = self._d
        if self.fused and self.can_fuse:
            return self._smooth_fused(x, b, sweeps, Ax, zero_initial)
        if zero_initial and sweeps == 0:
            x.fill(0)
        for s in range(sweeps):
            for j, (c1, c2) in enumerate(self._coef):
                if j == 0:
                    if zero_initial and s == 0:
                        K.chebyshev_start_zero(x, d, self.dinv, b, c2)
                        continue
                    self._Aplan(x, Ax, 1.0, 0.0)
                    K.chebyshev_start(x, d, self.dinv, b, Ax, c2)
                else:
                    self._Aplan(x, Ax, 1.0, 0.0)
                    K.chebyshev_update(x, d, self.dinv, b, Ax, c1, c2)
        return x

    def _smooth_fused(self, x, b, sweeps, tmp, zero_initial):
        """One launch per Chebyshev step (:func:`adaptmg.device.kernels.csr_chebyshev_step`:
        ``d <- c1 d + c2 D^{-1}(b - A x); out <- x + d``), ping-pong between ``x`` and
        ``tmp`` arranged so that the result lands in ``x``.

        From a zero initial guess the first step needs no product
        (``d = c2 D^{-1} b``) and writes into whichever buffer makes the parity come
        out in ``x``; from a given ``x`` with an odd number of steps the first step
        runs unfused in place (SpMV + update) for the same reason.
        """
        A, dinv, d, coef = self.A, self.dinv, self._d, self._coef
        steps = [c for _ in range(sweeps) for c in coef]
        if not steps:
            if zero_initial:
                x.fill(0)
            return x
        if zero_initial:
            rest = steps[1:]
            src = x if len(rest) % 2 == 0 else tmp
            K.chebyshev_start_zero(src, d, dinv, b, steps[0][1])
        else:
            rest = steps
            src = x
            if len(rest) % 2:
                self._Aplan(x, tmp, 1.0, 0.0)
                K.chebyshev_start(x, d, dinv, b, tmp, rest[0][1])
                rest = rest[1:]
        dst = tmp if src is x else x
        for c1, c2 in rest:
            K.csr_chebyshev_step(A, src, b, dinv, d, c1, c2, dst)
            src, dst = dst, src
        return x

    def __repr__(self):
        sc = "" if self.scaling == "jacobi" else f", scaling={self.scaling!r}"
        fu = ", fused" if self.fused else ""
        return (f"Chebyshev(degree={self.degree}, lower={self.lower:.4g}, lmax={self.lmax:.4g}"
                f"{sc}{fu}){_note(self)}")
