r"""Block multigrid: the cycle of :class:`MultilevelSolver` on ``(n, k)`` blocks of vectors.

A block ``X = [x_1 .. x_k]`` runs through the *same* cycle code
(:meth:`MultilevelSolver._run`) as one vector: this module only supplies, per level,
the block versions of what a cycle touches -- buffers of shape ``(n_l, k)`` in the
backend's layout (:func:`adaptmg.device.spmm.block_order`), SpMM plans for ``A_l``,
``P_l``, ``R_l`` (one pass over each matrix for all ``k`` columns) and block
smoothers -- and swaps them in for the duration of one cycle.  The fused one-vector
kernels (and CUDA graphs) are not used on blocks; with a Jacobi smoother the cycle's
passes over the blocks are fused instead (:meth:`_BlockLevel.fuse_transfers`): on the GPU
two sweeps from zero, the restricted residual and the correction with the first post-sweep
are one pass each; on the host the restricted residual and sweeps of one block pass plus
one ``csr_matvecs`` each.  Measured (2-D Q1, 1.05M DoFs, ``k = 32``): H200 block V-cycle
3.43 -> 2.11 ms; host (263k DoFs, one core) 432 -> 383 ms.

Block smoothers (every smoother of the registry, same math per column):

* Jacobi / Richardson: ``X <- X + omega D^{-1} (B - A X)``, ``D^{-1}`` broadcast over
  the columns; block Jacobi: ``X <- X + omega S (B - A X)`` with ``S`` an SpMM;
* Chebyshev: the three-term recurrence of :class:`~adaptmg.multilevel.Chebyshev` with
  ``k``-column ``d``;
* multicolour (block) Gauss-Seidel / SOR and l1 Gauss-Seidel: per colour ``C``,
  ``X_C <- X_C + omega D_CC^{-1} (B_C - A_{C,:} X)`` with the colour's row slice of
  ``A`` as an SpMM (the order of :meth:`GaussSeidel._orders`, so the same sweep);
* :class:`~adaptmg.multilevel.PrePostSmoother`: the block versions of its two parts.

A smoother from outside adaptmg (only ``smooth(x, b, sweeps)`` on vectors) runs column
by column; matrix-free levels are refused with a ``TypeError``.
"""
from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from ..backend import is_sparse, to_host
from ..device import block_kernels as BK
from ..device import kernels as K
from ..device.gs_kernels import colour_rows
from ..device.spmm import block_order, make_spmm, scale_rows
from .chebyshev import Chebyshev
from .gauss_seidel import GaussSeidel, L1GaussSeidel
from .smoothers import BlockJacobi, Jacobi, PrePostSmoother

__all__ = ["BlockCycle", "block_smoother"]


class _BlockSmoother:
    """Base: the wrapped one-vector smoother ``sm`` and block scratch made on demand."""

    _adaptmg_smoother = True

    def __init__(self, sm, be, dtype, order):
        self.sm, self.be, self.dtype, self.order = sm, be, dtype, order
        self.xp = be.xp
        self.omega = getattr(sm, "omega", 1.0)
        self._scr = {}

    def scratch(self, X, name="w"):
        key = (name, X.shape)
        w = self._scr.get(key)
        if w is None:
            w = self._scr[key] = self.xp.empty(X.shape, self.dtype, order=self.order)
        return w


class _BlockJacobi(_BlockSmoother):
    r"""``X <- X + omega D^{-1} (B - A X)`` (Jacobi, Richardson).  On C-ordered device
    blocks two sweeps from zero are one pass (:func:`~adaptmg.device.block_kernels.jacobi2_zero`)
    and :meth:`smooth_corrected` fuses the coarse-grid correction into the first post-sweep.
    On the host (SciPy CSR) a sweep is ``Y = X + \hat B`` and ``Y += N X`` (one block pass
    and one ``csr_matvecs``), with ``N = -omega D^{-1} A`` made once and
    :math:`\hat B = \omega D^{-1} B` once per call; the first sweep from zero is
    :math:`\hat B` itself."""

    def __init__(self, sm, be, dtype, order):
        super().__init__(sm, be, dtype, order)
        self.A = make_spmm(sm.A)              # the level's matrix, shared with the smoother
        self.Amat = sm.A
        self.d1 = sm.dinv
        self.dinv = sm.dinv.reshape(-1, 1)
        self.gpu = be.is_gpu
        self.N = None
        if not be.is_gpu and sp.issparse(sm.A) and sm.A.format == "csr" and np.dtype(sm.A.dtype) == np.dtype(dtype):
            wd = (self.omega * np.asarray(to_host(sm.dinv), dtype=np.float64)).astype(dtype)
            self.wd = wd.reshape(-1, 1)
            self.N = make_spmm(sp.csr_matrix(sp.diags(-wd) @ sm.A, dtype=dtype))

    def fusable(self, X):
        """Whether the fused row kernels take this level's matrix and the block ``X``."""
        return self.gpu and BK.available(self.Amat, X) and self.d1.dtype == X.dtype

    def _host_scaled(self, X, B):
        """Whether the host sweeps with ``N`` take these blocks."""
        return (self.N is not None and X.flags.c_contiguous and B.flags.c_contiguous
                and X.dtype == B.dtype == self.wd.dtype)

    def smooth(self, X, B, sweeps=1, work=None, zero_initial=False):
        # sweeps alternate between X and W (out of place: one fused pass each on the GPU);
        # the first one from zero is X <- omega D^{-1} B, written where the parity ends in X
        W = work if work is not None else self.scratch(X)
        if sweeps <= 0:
            if zero_initial:
                X.fill(0)
            return X
        if self._host_scaled(X, B):
            return self._smooth_host(X, B, sweeps, W, zero_initial)
        if zero_initial and sweeps >= 2 and self.fusable(X):
            rest = sweeps - 2                 # the first two sweeps in one pass
            src, dst = (W, X) if rest % 2 else (X, W)
            BK.jacobi2_zero(self.Amat, B, self.d1, self.omega, src)
            return self._sweeps(src, dst, B, rest, X)
        fused = sweeps - 1 if zero_initial else sweeps
        src, dst = (W, X) if fused % 2 else (X, W)
        if zero_initial:
            K.jacobi_zero(src, self.dinv, B, self.omega)
        elif fused % 2:
            src[...] = X
        return self._sweeps(src, dst, B, fused, X)

    def _smooth_host(self, X, B, sweeps, W, zero_initial):
        Bh = self.scratch(X, "bhat")
        scale_rows(B, self.wd, Bh)
        if zero_initial:                      # the first sweep from zero is Bh itself
            src, rest = Bh, sweeps - 1
            if rest == 0:
                X[...] = Bh
                return X
        else:
            src, rest = X, sweeps
            if rest % 2:                      # the first destination is X: read from a copy
                W[...] = X
                src = W
        for i in range(rest):                 # destinations alternate and end in X
            dst = X if (rest - i) % 2 else W
            self.N.sweep(src, Bh, dst)        # dst = src + Bh + N src
            src = dst
        return X

    def _sweeps(self, src, dst, B, count, X):
        for _ in range(count):
            self.A.jacobi(src, B, self.dinv, self.omega, dst)
            src, dst = dst, src
        return X

    def smooth_corrected(self, X, B, sweeps, AP, P, E, work, defer_last=False):
        """``X <- X + P E`` and ``sweeps`` post-sweeps, the correction fused into the first
        one (``AP = A P``; see :meth:`MultilevelSolver._level_cycle`); returns ``X``."""
        W = work if work is not None else self.scratch(X)
        BK.corrected_jacobi(self.Amat, AP, P, X, E, B, self.d1, self.omega, W)
        rest = sweeps - 1
        if rest % 2 == 0:                     # an even number of sweeps ends where it starts
            self._sweeps(W, X, B, rest, X)
            X[...] = W
            return X
        return self._sweeps(W, X, B, rest, X)


class _BlockBlockJacobi(_BlockSmoother):
    """``X <- X + omega S (B - A X)``, ``S`` the inverse node blocks (an SpMM)."""

    def __init__(self, sm, be, dtype, order):
        super().__init__(sm, be, dtype, order)
        self.A = make_spmm(sm.A)
        self.S = make_spmm(sm.S)

    def smooth(self, X, B, sweeps=1, work=None, zero_initial=False):
        W = work if work is not None else self.scratch(X)
        start = 0
        if zero_initial and sweeps > 0:
            self.S(B, X, self.omega, 0.0)
            start = 1
        elif zero_initial:
            X.fill(0)
        for _ in range(start, sweeps):
            self.A.residual(X, B, W)
            self.S(W, X, self.omega, 1.0)
        return X


class _BlockChebyshev(_BlockSmoother):
    """The Chebyshev recurrence of :class:`Chebyshev` on every column."""

    def __init__(self, sm, be, dtype, order):
        super().__init__(sm, be, dtype, order)
        self.A = make_spmm(sm.A)
        self.dinv = sm.dinv.reshape(-1, 1)
        self.coef = sm._coef

    def smooth(self, X, B, sweeps=1, work=None, zero_initial=False):
        W = work if work is not None else self.scratch(X)
        D = self.scratch(X, "d")
        if zero_initial and sweeps == 0:
            X.fill(0)
        for s in range(sweeps):
            for j, (c1, c2) in enumerate(self.coef):
                if zero_initial and s == 0 and j == 0:
                    K.chebyshev_start_zero(X, D, self.dinv, B, c2)
                    continue
                self.A(X, W, 1.0, 0.0)
                if j == 0:
                    K.chebyshev_start(X, D, self.dinv, B, W, c2)
                else:
                    K.chebyshev_update(X, D, self.dinv, B, W, c1, c2)
        return X


class _BlockGaussSeidel(_BlockSmoother):
    """Multicolour (block) Gauss-Seidel / SOR and l1-GS: one colour is one row-slice SpMM."""

    def __init__(self, sm, be, dtype, order):
        super().__init__(sm, be, dtype, order)
        self.l1 = isinstance(sm, L1GaussSeidel)
        Ain = be.asmatrix(sm._Ain if self.l1 else sm._Acsr, dtype=dtype)
        if self.l1:
            self.Aoff = make_spmm(sm._Aoff_b)
        c = self.c = sm.block_size
        groups = [be.asarray(g) for g in sm._groups]
        self.rows, Arows, inv = colour_rows(Ain, groups, be.asarray(sm._inv).astype(dtype), c)
        self.Arows = [make_spmm(M) for M in Arows]
        self.inv = [v[:, None] if c == 1 else v for v in inv]

    def _color(self, k, X, B):
        rows = self.rows[k]
        Rk = B[rows]                                 # a new block (fancy indexing)
        Rk -= self.Arows[k].A @ X
        if self.c == 1:
            Rk *= self.inv[k]
        else:
            m = Rk.shape[0] // self.c
            Rk = self.xp.einsum("mab,mbj->maj", self.inv[k],
                                Rk.reshape(m, self.c, -1)).reshape(Rk.shape)
        Rk *= self.omega
        X[rows] += Rk

    def _sweep(self, X, B, kind, sweeps, work, zero_initial):
        if zero_initial:
            X.fill(0)
        sm = self.sm
        if self.l1:
            G = work if work is not None else self.scratch(X)
            fwd = tuple(range(sm.ncolors))
            halves = {"forward": (fwd,), "backward": (fwd[::-1],),
                      "symmetric": (fwd, fwd[::-1])}[kind]
            for _ in range(sweeps):
                for order in halves:
                    self.Aoff.residual(X, B, G)
                    for k in order:
                        self._color(k, X, G)
            return X
        for k in sm._orders(kind, sweeps):
            self._color(k, X, B)
        return X

    def smooth(self, X, B, sweeps=1, work=None, zero_initial=False):
        return self._sweep(X, B, self.sm.sweep, sweeps, work, zero_initial)

    def smooth_adjoint(self, X, B, sweeps=1, work=None, zero_initial=False):
        from .gauss_seidel import _ADJOINT
        return self._sweep(X, B, _ADJOINT[self.sm.sweep], sweeps, work, zero_initial)


class _BlockPrePost(_BlockSmoother):
    """:class:`PrePostSmoother` on blocks: its pre part for ``smooth``, post for the adjoint."""

    def __init__(self, sm, be, dtype, order):
        super().__init__(sm, be, dtype, order)
        self.pre = block_smoother(sm.pre, be, dtype, order)
        self.post = self.pre if sm.post is sm.pre else block_smoother(sm.post, be, dtype, order)

    def smooth(self, X, B, sweeps=1, work=None, zero_initial=False):
        return self.pre.smooth(X, B, sweeps * self.sm.pre_sweeps, work, zero_initial)

    def smooth_adjoint(self, X, B, sweeps=1, work=None, zero_initial=False):
        return self.post.smooth(X, B, sweeps * self.sm.post_sweeps, work, zero_initial)


class _ColumnSmoother(_BlockSmoother):
    """A smoother with only the one-vector ``smooth(x, b, sweeps)``: column by column."""

    def _each(self, f, X, B, sweeps, zero_initial):
        xp = self.xp
        for j in range(X.shape[1]):                 # over right-hand sides, not DoFs
            x = xp.zeros(X.shape[0], self.dtype) if zero_initial else xp.ascontiguousarray(X[:, j])
            f(x, xp.ascontiguousarray(B[:, j]), sweeps)
            X[:, j] = x
        return X

    def smooth(self, X, B, sweeps=1, work=None, zero_initial=False):
        return self._each(self.sm.smooth, X, B, sweeps, zero_initial)


class _ColumnSmootherAdjoint(_ColumnSmoother):
    def smooth_adjoint(self, X, B, sweeps=1, work=None, zero_initial=False):
        return self._each(self.sm.smooth_adjoint, X, B, sweeps, zero_initial)


def block_smoother(sm, be, dtype, order):
    """The block version of the level smoother ``sm`` (see the module docstring)."""
    if sm is None:
        return None
    if isinstance(sm, PrePostSmoother):
        return _BlockPrePost(sm, be, dtype, order)
    if isinstance(sm, GaussSeidel):
        return _BlockGaussSeidel(sm, be, dtype, order)
    if isinstance(sm, Chebyshev) and is_sparse(sm.A):
        return _BlockChebyshev(sm, be, dtype, order)
    if isinstance(sm, BlockJacobi):
        return _BlockBlockJacobi(sm, be, dtype, order)
    if isinstance(sm, Jacobi) and is_sparse(sm.A):               # Jacobi, Richardson
        return _BlockJacobi(sm, be, dtype, order)
    if hasattr(sm, "smooth_adjoint"):
        return _ColumnSmootherAdjoint(sm, be, dtype, order)
    return _ColumnSmoother(sm, be, dtype, order)


class _BlockLevel:
    """What the cycle reads of one level (the fields of ``solver._Dev``), for blocks."""

    def __init__(self, d, be, dtype, order):
        for name in ("A", "P", "R"):
            M = getattr(d, name)
            if M is not None and not is_sparse(M):
                raise TypeError(f"block solves need assembled sparse matrices on every level; "
                                f"{name} of a level with {d.n} rows is a {type(M).__name__} "
                                "(solve the columns one at a time)")
        self.n = d.n
        self.A, self.P, self.R = d.A, d.P, d.R
        self.Aplan = make_spmm(d.A)
        self.Pplan = make_spmm(d.P) if d.P is not None else None
        self.Rplan = make_spmm(d.R) if d.R is not None else None
        self.smoother = block_smoother(d.smoother, be, dtype, order)
        self.own = self.smoother is not None
        self.fused = self.tfused = self.sfused = False
        self.RA = self.AP = self.S = None
        self.x = self.b = self.r = None
        self._dev = d
        self._negRA = None

    def fuse_transfers(self, X):
        r"""On levels with a Jacobi smoother, run the restriction of the residual as
        :math:`R B - (R A) X` (the cycle's ``tfused`` path; ``R A`` from the one-vector
        set-up or made here once) and, on the device, the correction with the first
        post-sweep as one pass (``A P``).  For blocks these passes pay on every level: the
        blocks' traffic, not the matrices', is what they save.  On the host ``R A`` has
        fewer entries than ``A`` and ``R`` together (2-D Q1: ~8.5 against 11.25 per fine
        row) and the residual block is not formed; the correction is not fused there
        (``A P`` would add products)."""
        sm = self.smoother
        d = self._dev
        if (self.tfused or not isinstance(sm, _BlockJacobi) or self.R is None or self.P is None):
            return
        if sm.fusable(X) and all(K.is_int32_csr(M) for M in (self.A, self.R, self.P)):
            RA = d.RA if d.RA is not None else self.R @ self.A
            AP = d.AP if d.AP is not None else self.A @ self.P
            if K.is_int32_csr(RA) and K.is_int32_csr(AP) and RA.dtype == AP.dtype == X.dtype:
                self.RA, self.AP, self.tfused = RA, AP, True
        elif sm._host_scaled(X, X) and all(sp.issparse(M) and M.format == "csr" for M in (self.R, self.A)):
            RA = d.RA if d.RA is not None else sp.csr_matrix(self.R @ self.A)
            self.RA, self.AP, self.tfused = RA, None, True
            self._negRA = make_spmm(sp.csr_matrix(-RA))

    def restricted_residual(self, out):
        """``out <- R b - (R A) x`` of this level's block buffers (the cycle's ``tfused``
        restriction): one launch of the block kernel on the device; on the host two
        threaded products, ``out = R b`` and ``out += (-R A) x``."""
        if self._negRA is None:
            return BK.restricted_residual(self.R, self.RA, self.b, self.x, out)
        self.Rplan(self.b, out, 1.0, 0.0)
        return self._negRA(self.x, out, 1.0, 1.0)

    def buffers(self, k, xp, dtype, order, top):
        if self.r is None or self.r.shape[1] != k:
            self.r = xp.zeros((self.n, k), dtype, order=order)
            self.x = None if top else xp.zeros((self.n, k), dtype, order=order)
            self.b = None if top else xp.zeros((self.n, k), dtype, order=order)


class BlockCycle:
    """One ``kind`` cycle of ``ml`` from zero on an ``(n, k)`` block: ``cyc(B, X)``.

    ``B`` and ``X`` are blocks of ``ml.dtype`` in the backend's layout
    (:attr:`order`); buffers are made for each new ``k`` (kept for the last one)."""

    #: fuse the cycle's passes over the blocks (:meth:`_BlockLevel.fuse_transfers`)
    fuse = True

    def __init__(self, ml, kind):
        self.ml, self.kind = ml, kind
        be = ml.backend
        self.order = block_order(be)
        self.levels = [_BlockLevel(d, be, ml.dtype, self.order) for d in ml._dev]

    def __call__(self, B, X):
        ml = self.ml
        xp, k = ml.backend.xp, B.shape[1]
        top = len(self.levels) - 1
        for l, lev in enumerate(self.levels):
            lev.buffers(k, xp, ml.dtype, self.order, l == top)
            if l > 0 and self.fuse:
                lev.fuse_transfers(B)
        keep = ml._dev
        ml._dev = self.levels
        try:
            ml._run(B, X, self.kind, True)
        finally:
            ml._dev = keep
        return X

    def matmat(self, V):
        """``M V`` for any ``(n, k)`` block ``V`` (cast in and out), a new array.  ``V``
        itself is the cycle's right-hand side when its dtype and layout fit (the cycle
        never writes its right-hand side)."""
        ml, xp = self.ml, self.ml.backend.xp
        Bb = xp.asarray(V, dtype=ml.dtype, order=self.order)
        X = xp.empty(Bb.shape, ml.dtype, order=self.order)
        self(Bb, X)
        return X if X.dtype == V.dtype else X.astype(V.dtype)


def _block_cycle(ml, kind):
    """The cached :class:`BlockCycle` of ``ml`` (forgotten with its preconditioners)."""
    key = ("block", kind)
    cyc = ml._preconditioners.get(key)
    if cyc is None:
        cyc = ml._preconditioners[key] = BlockCycle(ml, kind)
    return cyc


def block_matmat(ml, kind, V):
    """``M V``: one ``kind`` cycle from zero on every column of the block ``V``."""
    return _block_cycle(ml, kind).matmat(V)


def _as_block(be, B, n, what, dtype, order):
    shape = getattr(B, "shape", None)
    if shape is None or len(shape) != 2 or shape[0] != n:
        raise ValueError(f"{what} must have shape ({n}, k), got {shape}")
    dt = np.dtype(getattr(B, "dtype", np.float64))
    if dt.kind not in "fiu":
        raise TypeError(f"{what} must be a real array (float or integer), got dtype {dt}")
    X = be.xp.array(be.asarray(B), dtype=dtype, order=order, copy=True)
    if not bool(be.xp.isfinite(X).all()):
        raise ValueError(f"{what} contains NaN or Inf")
    return X


def solve_block(ml, B, x0, rtol, atol, maxiter, accel, kind, callback, residuals, restart):
    """:meth:`MultilevelSolver.solve` for ``B`` of shape ``(n, k)``, ``k > 1`` (see there).

    Per column ``j`` the stopping rule is ``||b_j - A x_j|| <= max(rtol ||b_j||, atol)``;
    ``ml.last_iterations`` and ``ml.last_info`` become arrays with one entry per column.
    """
    from ..linalg import ConvergenceWarning
    from ..linalg.block_krylov import block_cg, block_gmres, column_norms
    import warnings
    if accel not in (None, "cg", "gmres"):
        raise ValueError(f"accel={accel!r} is not available for a block of right-hand sides; "
                         "use None, 'cg' or 'gmres' (or solve the columns one at a time)")
    be, xp = ml.backend, ml.backend.xp
    n = ml._dev[-1].n
    host_in = be.is_gpu and isinstance(B, np.ndarray)
    cyc = _block_cycle(ml, kind)
    order, odt = cyc.order, ml.outer_dtype
    Bb = _as_block(be, B, n, "b", odt, order)
    X = None if x0 is None else _as_block(be, x0, n, "x0", odt, order)
    if X is not None and X.shape != Bb.shape:
        raise ValueError(f"x0 must have the shape of b {tuple(Bb.shape)}, got {tuple(X.shape)}")
    Aplan = make_spmm(ml._A_outer)

    def Aop(V):
        V = xp.asarray(V, dtype=odt, order=order)
        Y = xp.empty(V.shape, odt, order=order)
        return Aplan(V, Y)

    if residuals is not None:
        residuals.append(to_host(column_norms(xp, Bb - Aop(X) if X is not None else Bb)))
    if accel is not None:
        f = block_cg if accel == "cg" else block_gmres
        kw = {"restart": restart} if accel == "gmres" else {}
        X, info, its = f(Aop, Bb, X, rtol=rtol, atol=atol, maxiter=maxiter, M=cyc.matmat,
                         callback=callback, **kw)
        if residuals is not None:
            residuals.append(to_host(column_norms(xp, Bb - Aop(X))))
    else:
        X, info, its = _stationary(ml, cyc, Aop, Bb, X, rtol, atol, maxiter, callback, residuals)
        bad = np.flatnonzero(info != 0)
        if bad.size:
            warnings.warn(ConvergenceWarning(
                f"multigrid ({kind}-cycle) did not reach the tolerance in {maxiter} iterations "
                f"on {bad.size} of {info.size} columns (columns {bad[:8].tolist()}"
                f"{' ...' if bad.size > 8 else ''})"), stacklevel=3)
    ml.last_iterations, ml.last_info = its, info
    return xp.asnumpy(X) if host_in else X


def _stationary(ml, cyc, Aop, B, X, rtol, atol, maxiter, callback, residuals):
    """``x_j <- x_j + M (b_j - A x_j)`` on the columns not yet converged (compacted)."""
    from ..linalg.block_krylov import column_norms
    xp = ml.backend.xp
    k = B.shape[1]
    if X is None:
        X = xp.zeros_like(B)
    tol = np.maximum(rtol * to_host(column_norms(xp, B)).astype(np.float64), atol)
    R = B - Aop(X)
    rn = to_host(column_norms(xp, R)).astype(np.float64)
    its = np.zeros(k, dtype=np.int64)
    act = np.flatnonzero(~(rn <= tol))
    Xa, Ba, Ra = X[:, xp.asarray(act)], B[:, xp.asarray(act)], R[:, xp.asarray(act)]
    E = None
    while act.size and its[act[0]] < maxiter:
        Rc = xp.asarray(Ra, dtype=ml.dtype, order=cyc.order)
        if E is None or E.shape != Rc.shape:
            E = xp.empty(Rc.shape, ml.dtype, order=cyc.order)
        cyc(Rc, E)
        Xa += E
        Ra = Ba - Aop(Xa)
        its[act] += 1
        rna = to_host(column_norms(xp, Ra)).astype(np.float64)
        rn[act] = rna
        if residuals is not None:
            residuals.append(rn.copy())
        done = (rna <= tol[act]) | ~np.isfinite(rna)
        if done.any() or callback is not None:
            X[:, xp.asarray(act)] = Xa
        if callback is not None:
            callback(X)
        if done.any():
            keep = np.flatnonzero(~done)
            act = act[keep]
            kd = xp.asarray(keep)
            Xa, Ba, Ra = Xa[:, kd], Ba[:, kd], Ra[:, kd]
    if act.size:
        X[:, xp.asarray(act)] = Xa
    info = np.where(rn <= tol, 0, max(maxiter, 1)).astype(np.int64)
    return X, info, its
