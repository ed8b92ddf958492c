"""The coarse-level solve of the cycle: a dense inverse applied as one GEMV.

For the coarsest matrix :math:`A_0` (``n_0 <= max_direct`` rows) the solver
stores :math:`A_0^{-1}` computed in float64 (LAPACK on the host, cuSOLVER on the
device), symmetrised as :math:`(A_0^{-1} + A_0^{-T})/2` when :math:`A_0` is
symmetric, and cast to the hierarchy's dtype; the coarse correction is then
``x_0 = A_0^{-1} b_0``, one GEMV with no pivoting or triangular solves (which
would serialise on the device).  Complex matrices are inverted in complex128.

:class:`CoarseOperator` carries any other dense coarse operator :math:`C`
(``x_0 = C b_0``), e.g. pyamg's pseudo-inverse (``coarse_solver='pinv'``), formed
on the host by whoever knows it and applied the same way.
"""
from __future__ import annotations

import numpy as np

from ..backend import is_device_sparse, is_sparse, to_host

__all__ = ["dense_inverse", "CoarseOperator"]


class CoarseOperator:
    """A dense coarse operator :math:`C` (host array, ``x_0 = C b_0``) for
    ``MultilevelSolver(coarse=...)``; ``label`` names it in ``print(ml)``."""

    def __init__(self, C, label):
        C = np.asarray(C)
        if C.ndim != 2 or C.shape[0] != C.shape[1] or C.dtype.kind not in "fc":
            raise ValueError(f"CoarseOperator: need a square float or complex matrix, got "
                             f"shape {C.shape} dtype {C.dtype}")
        self.C, self.label = C, str(label)

    def on(self, backend, dtype, n0):
        """``C`` as a contiguous ``dtype`` array on ``backend`` (checks ``n0`` rows)."""
        if self.C.shape[0] != n0:
            raise ValueError(f"CoarseOperator: {self.C.shape} operator for a coarse level "
                             f"with {n0} rows")
        if self.C.dtype.kind == "c" and np.dtype(dtype).kind != "c":
            raise TypeError(f"CoarseOperator: a complex operator for a {np.dtype(dtype)} "
                            "hierarchy")
        return backend.xp.ascontiguousarray(backend.asarray(self.C).astype(dtype))

    def __repr__(self):
        return f"{self.label} (dense, {self.C.shape[0]} rows)"


def _wide(dt):
    return np.complex128 if np.dtype(dt).kind == "c" else np.float64


def _dense(A0, backend):
    """``A0`` dense in float64/complex128: on the device for a cupyx matrix on the GPU
    backend (the coarse matrix never comes to the host), else on the host."""
    if backend.is_gpu and is_device_sparse(A0):
        return A0.toarray().astype(_wide(A0.dtype))
    return _dense_host(A0)


def _dense_host(A0):
    if is_sparse(A0):
        A0 = to_host(A0)
        return A0.toarray().astype(_wide(A0.dtype))
    if hasattr(A0, "toarray"):
        Ad = np.asarray(to_host(A0.toarray()))
        return Ad.astype(_wide(Ad.dtype))
    raise TypeError("coarse='direct' needs a coarse matrix that is sparse or has .toarray(); "
                    f"got {type(A0).__name__} (use coarse='smoother')")


def dense_inverse(A0, backend, dtype, max_direct):
    """``A0^{-1}`` as a dense contiguous array of ``dtype`` on ``backend``.

    Raises ``ValueError`` when ``A0`` has more than ``max_direct`` rows or is singular.
    """
    n0 = int(A0.shape[0])
    if n0 > max_direct:
        raise ValueError(f"coarse='direct' refused: the coarse matrix has {n0} rows "
                         f"(> max_direct={max_direct}); use more levels, "
                         "coarse_max_rows, or coarse='smoother'")
    Ad = _dense(A0, backend)
    xp = backend.xp
    if backend.is_gpu:        # cuSOLVER: no host LAPACK call at set-up
        Ad = xp.asarray(Ad)                    # up, unless built there
        sym = bool(xp.allclose(Ad, Ad.conj().T, rtol=1e-12, atol=0))    # there too (1089^2: ~15 ms on a host)
        inv = xp.linalg.inv(Ad)
        finite = bool(xp.isfinite(inv).all())
    else:
        sym = np.allclose(Ad, Ad.conj().T, rtol=1e-12, atol=0)
        try:
            inv = np.linalg.inv(Ad)
        except np.linalg.LinAlgError as exc:
            raise ValueError(f"coarse='direct': the coarse matrix ({n0} x {n0}) is "
                             f"singular ({exc})") from None
        finite = bool(np.all(np.isfinite(inv)))
    if not finite:
        raise ValueError(f"coarse='direct': the inverse of the coarse matrix ({n0} x {n0}) "
                         "is not finite (the matrix is singular or nearly so)")
    if sym:                                     # Hermitian: keep the inverse Hermitian
        inv = 0.5 * (inv + inv.conj().T)
    return xp.ascontiguousarray(inv.astype(dtype))
