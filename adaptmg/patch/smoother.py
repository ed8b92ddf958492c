"""Colored multiplicative vertex-patch smoother with fast diagonalisation.

For every interior vertex ``j`` the patch of the 2^d cells around it carries
the subspace ``V_j`` of the (2k-1)^d DoFs interior to the patch; its closure
``Vbar_j`` has (2k+1)^d DoFs.  One subspace correction is (eq. 2.8)

    r_j = R_j b - Abar_j Rbar_j x,         x <- x + R_j^T A_j^{-1} r_j,

which is the textbook step ``x + R_j^T A_j^{-1} R_j (b - A x)`` (eq. 2.6)
with the residual computed from patch data only.  ``Abar_j`` and ``A_j``
are sums of Kronecker products of 1D two-cell matrices (eqs. 2.11/2.12):
``Abar_j = sum_d c_d (Mb x .. x Ab(d) x .. x Mb)`` with the interior rows
``Mb, Ab`` (2k-1 x 2k+1) and ``A_j`` the same with the interior blocks
``Mi, Ai``.  Its exact inverse comes from the 1D generalised eigenproblem
``Ai S = Mi S Lambda``, ``S^T Mi S = I`` (eq. 2.15):

    A_j^{-1} = (S x .. x S) diag(sum_d c_d lambda_{i_d})^{-1} (S x .. x S)^T
                                                          (eqs. 2.13/2.14)

at cost O(d k^{d+1}) per patch.

Patches whose vertex indices have the same parities (2^d colors) overlap
only in patch-boundary DoFs, which a correction never changes, so all patches
of one color are corrected at once (Algorithm 2.3); the colors run one after
the other (multiplicative).  ``reverse=True`` runs the colors backwards.

Post-smoothing (``smooth_adjoint``, called by the V-cycle after the coarse
correction).  ``post="forward"`` (default) runs the colours in the same order
as the pre-smoothing: this is what seed 000's code does (the post-smoother is
deal.II's ``MGSmootherPrecondition::smooth`` -> ``PatchSmoother::step``, the
same colour loop; its ``Tstep`` is empty) and it is also the faster V-cycle on
the seed's measure (FMG steps to 1e-9: 2D Q1 5 vs 10-11, see NOTES.md).  The
V-cycle is then not symmetric (fine for FMG and GMRES, not for CG).
``post="reverse"`` runs the colours backwards, the ``A``-adjoint sweep, which
makes the V-cycle symmetric (the former default; a CG preconditioner).

CPU: each color is one batched NumPy computation over all its patches (the
patches are strided views of the padded vector).  GPU: one fused RawKernel
launch per color (local residual and local solve in shared memory); at k = 1,
where the patch step is point Gauss-Seidel, one launch per two colours
(:meth:`adaptmg.patch.stencil.GpuQ1Stencil.sweep`).
"""
from __future__ import annotations

import itertools

import numpy as np

from ..backend import get_backend, is_device_array
from .operator import _check_space, cell_windows, check_dtype, contract
from .tensor import eigenvalue_sums, patch_fast_diag, patch_matrices

__all__ = ["PatchSmoother", "patch_colors", "POST_ORDERS", "check_post"]


def patch_colors(space):
    """List of (color, counts): color is a tuple of parities (x first), counts
    the number of patches of that color per direction (x first); colors with
    no patch are left out.  Vertex indices are p_d = 1 + color_d + 2 m."""
    out = []
    for col in itertools.product((0, 1), repeat=space.dim):
        col = tuple(reversed(col))            # x varies fastest
        cnt = tuple(len(range(1 + c, n, 2)) for c, n in zip(col, space.cells))
        if min(cnt) > 0:
            out.append((col, cnt))
    return out


POST_ORDERS = ("forward", "reverse")


def check_post(post):
    """Validate the post-smoothing colour order ("forward" or "reverse")."""
    if post not in POST_ORDERS:
        raise ValueError(f"post must be one of {POST_ORDERS}, got {post!r}")
    return post


class PatchSmoother:
    """``S.smooth(x, b, sweeps=1, reverse=False)`` updates ``x`` in place with
    ``sweeps`` colored multiplicative vertex-patch sweeps (Algorithm 2.3);
    ``S.smooth_adjoint`` is the post-smoothing sweep: colours forward
    (``post="forward"``, seed 000's code, default) or reversed (``"reverse"``,
    the adjoint sweep: symmetric V-cycle)."""

    def __init__(self, space, backend="cpu", dtype=np.float64, post="forward"):
        self.space = _check_space(space)
        self.backend = get_backend(backend)
        self.dtype = check_dtype(dtype)
        self.post = check_post(post)
        if min(space.cells) < 2:
            raise ValueError(f"{space} has no interior vertex: no vertex patch")
        xp = self.backend.xp
        k, d = space.k, space.dim
        Mb, Ab, _, _ = patch_matrices(k)
        S, lam = patch_fast_diag(k)
        c = space.coeffs
        self.colors = patch_colors(space)
        self._Mb = xp.asarray(Mb, dtype=self.dtype)
        self._Ab = xp.asarray(Ab, dtype=self.dtype)
        self._S = xp.asarray(S, dtype=self.dtype)
        self._Dinv = xp.asarray(1.0 / eigenvalue_sums([lam] * d, c), dtype=self.dtype)
        self._c = c
        self._gpu = None
        if self.backend.is_gpu:
            from .kernels import GpuPatchSmoother
            self._gpu = GpuPatchSmoother(space, self.dtype)

    def __repr__(self):
        return (f"PatchSmoother({self.space}, colors={len(self.colors)}, post={self.post!r}, "
                f"backend={self.backend.name}, dtype={self.dtype})")

    def to(self, backend=None, dtype=None):
        """The same smoother on ``backend`` in ``dtype`` (self when both are unchanged)."""
        be = self.backend if backend is None else get_backend(backend)
        dt = self.dtype if dtype is None else check_dtype(dtype)
        if be == self.backend and dt == self.dtype:
            return self
        return PatchSmoother(self.space, be, dt, self.post)

    def _check(self, x, b):
        for name, v in (("x", x), ("b", b)):
            self.space.check_vector(v, name)
            if v.dtype != self.dtype:
                raise TypeError(f"{name} dtype {v.dtype} != smoother dtype {self.dtype}")
            if self.backend.is_gpu != is_device_array(v):
                raise TypeError(f"{name} of type {type(v).__name__} is not on the smoother's "
                                f"backend {self.backend.name!r}")
            if self.backend.is_gpu and not v.flags.c_contiguous:
                raise ValueError(f"{name}: the GPU kernels need contiguous vectors (got a "
                                 f"strided view; pass a copy)")

    def smooth(self, x, b, sweeps=1, reverse=False):
        """In-place ``x <- S(x, b)``, ``sweeps`` times. Returns ``x``."""
        self._check(x, b)
        if isinstance(sweeps, bool) or not isinstance(sweeps, (int, np.integer)) or sweeps < 0:
            raise ValueError(f"sweeps must be a non-negative int, got {sweeps!r}")
        if self._gpu is not None:
            for _ in range(sweeps):
                self._gpu.sweep(x, b, self.colors, reverse)
            return x
        colors = self.colors[::-1] if reverse else self.colors
        xp = self.backend.xp
        sp_ = self.space
        d = sp_.dim
        inner = (slice(1, -1),) * d
        B = xp.pad(b.reshape(sp_.shape), 1)
        X = xp.pad(x.reshape(sp_.shape), 1)
        for _ in range(sweeps):
            for col, cnt in colors:
                self._color_array(X, B, col, cnt)
        x.reshape(sp_.shape)[...] = X[inner]
        return x

    def smooth_adjoint(self, x, b, sweeps=1):
        """The post-smoothing sweep :class:`adaptmg.multilevel.MultilevelSolver`
        calls after the coarse correction: the colours in the order ``post``
        names (forward: as the pre-smoothing, seed 000; reverse: the adjoint)."""
        return self.smooth(x, b, sweeps, reverse=self.post == "reverse")

    def _color_array(self, X, B, col, cnt):
        """All patches of one color at once (vectorised)."""
        xp = self.backend.xp
        k, d = self.space.k, self.space.dim
        c = self._c
        start = tuple(cc * k for cc in reversed(col))          # numpy axis order
        Xs = X[tuple(slice(s, None) for s in start)]
        Xw = cell_windows(xp, Xs, k, 2 * k, 2 * k + 1)[tuple(slice(0, m) for m in reversed(cnt))]
        Xi = cell_windows(xp, X[tuple(slice(s + 1, None) for s in start)], k, 2 * k, 2 * k - 1)
        Xi = Xi[tuple(slice(0, m) for m in reversed(cnt))]
        Bi = cell_windows(xp, B[tuple(slice(s + 1, None) for s in start)], k, 2 * k, 2 * k - 1)
        Bi = Bi[tuple(slice(0, m) for m in reversed(cnt))]
        Mb, Ab, S = self._Mb, self._Ab, self._S
        # local residual r_j = R_j b - Abar_j Rbar_j x   (eq. 2.8)
        v = contract(Mb, Xw, 1)
        w = contract(Ab, Xw, 1)
        if d == 2:
            r = Bi - (c[1] * contract(Ab, v, 2) + c[0] * contract(Mb, w, 2))
        else:
            p = contract(Mb, v, 2)
            q = c[1] * contract(Ab, v, 2) + c[0] * contract(Mb, w, 2)
            r = Bi - (c[2] * contract(Ab, p, 3) + contract(Mb, q, 3))
        # local solve by fast diagonalisation (eqs. 2.13/2.14)
        St = S.T
        for a in range(1, d + 1):
            r = contract(St, r, a)
        r = r * self._Dinv
        for a in range(1, d + 1):
            r = contract(S, r, a)
        Xi += r
