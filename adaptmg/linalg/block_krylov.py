r"""CG and GMRES on a block of ``k`` right-hand sides ``A X = B`` (``B`` of shape ``(n, k)``).

The ``k`` columns are ``k`` independent Krylov solves run in lockstep: every scalar of
the one-vector method (CG's ``alpha_j``, ``beta_j``; GMRES' Hessenberg entries and
Givens rotations) becomes a row of ``k`` scalars, one per column, and every operator
application is one product with the whole block (a sparse x dense SpMM, one block
multigrid cycle), which reads the matrix once for all columns.  Column ``j`` stops when

.. math::  \|b_j - A x_j\| \le \max(\mathrm{rtol}\,\|b_j\|, \mathrm{atol}),

checked, as in :mod:`adaptmg.linalg`, with the true residual before it is reported
converged.  A converged column is removed from the active block (its vectors are
compacted away), so it is neither updated nor counted nor multiplied any more; a zero
column or one whose start is already converged never enters the loop.

Returns ``(X, info, iterations)``: ``info[j] == 0`` converged (true residual
checked), ``> 0`` not converged after ``maxiter`` (the value is ``maxiter``, as SciPy's
``info``, at least 1), ``< 0`` breakdown (non-finite or non-positive curvature); a
:class:`~adaptmg.linalg.ConvergenceWarning` names the columns that did not converge.
``iterations[j]``: the iterations (operator applications) spent on column ``j``.
``A`` and ``M`` map an ``(n, m)`` block to an ``(n, m)`` block (sparse matrices, dense
arrays, ``LinearOperator`` with ``matmat``, callables); arrays are NumPy or CuPy, the
result of the kind of ``B``.
"""
from __future__ import annotations

import warnings

import numpy as np

from ..backend import backend_of, to_host
from ..device import block_kernels as BK
from . import ConvergenceWarning

__all__ = ["block_cg", "block_gmres", "column_norms"]


def column_norms(xp, X):
    """The 2-norm of every column of ``X`` (a device array of length ``k``)."""
    return xp.sqrt(_coldot(xp, X, X))


def _coldot(xp, X, Y):
    """``x_j^T y_j`` for every column (no ``(n, k)`` temporary): on the device one pass of
    :func:`adaptmg.device.block_kernels.column_dots` for C-ordered float blocks (CuPy's
    einsum makes it a batched product ~10x slower at ``(1e6, 32)``)."""
    if BK.column_dots_apply(X, Y):
        return BK.column_dots(X, Y)
    if BK.host_blocks(X, Y):              # the host threads, row chunk by row chunk
        return BK.column_dots_host(X, Y)
    return xp.einsum("ij,ij->j", X, Y)


def _as_block_op(A, what):
    if A is None:
        return None
    if hasattr(A, "matmat"):
        return A.matmat
    if hasattr(A, "shape") and hasattr(A, "__matmul__"):
        return lambda X: A @ X
    if callable(A):
        return A
    raise TypeError(f"{what} must be a matrix, a LinearOperator or a callable X -> A X, "
                    f"got {type(A).__name__}")


def _check(B, X0, rtol, atol, maxiter, who):
    shape = getattr(B, "shape", None)
    if shape is None or len(shape) != 2:
        raise ValueError(f"{who}: B must be a 2-D array (n, k), got shape {shape}")
    dt = np.dtype(B.dtype)
    if dt.kind != "f":
        raise TypeError(f"{who}: B must be a real floating-point array, got dtype {dt}")
    if X0 is not None and tuple(getattr(X0, "shape", ())) != tuple(shape):
        raise ValueError(f"{who}: X0 must have the shape of B {tuple(shape)}, "
                         f"got {getattr(X0, 'shape', None)}")
    for name, v in (("rtol", rtol), ("atol", atol)):
        if not np.isscalar(v) or not np.isfinite(v) or v < 0:
            raise ValueError(f"{who}: {name} must be a non-negative number, got {v!r}")
    if maxiter is None:
        maxiter = 10 * int(shape[0])
    if isinstance(maxiter, bool) or not isinstance(maxiter, (int, np.integer)) or maxiter < 0:
        raise ValueError(f"{who}: maxiter must be a non-negative integer, got {maxiter!r}")
    return int(maxiter)


def _start(who, xp, Aop, B, X0, rtol, atol):
    """``X``, ``R = B - A X``, the per-column tolerances and residual norms (host), zero
    ``info`` and iteration counts, and the columns that still have to be solved."""
    X = xp.zeros_like(B) if X0 is None else xp.array(X0, dtype=B.dtype, copy=True)
    R = B.copy() if X0 is None else B - Aop(X)
    bn = to_host(column_norms(xp, B)).astype(np.float64)
    tol = np.maximum(rtol * bn, atol)
    rn = bn.copy() if X0 is None else to_host(column_norms(xp, R)).astype(np.float64)
    if not np.all(np.isfinite(rn)):
        raise ValueError(f"{who}: B or X0 contains NaN or Inf")
    k = B.shape[1]
    info, its = np.zeros(k, dtype=np.int64), np.zeros(k, dtype=np.int64)
    return X, R, tol, rn, info, its, np.flatnonzero(~(rn <= tol))


def _report(who, info, tol, rn):
    bad = np.flatnonzero(info != 0)
    if bad.size:
        cols = ", ".join(f"{j} ({rn[j]:.3e} > {tol[j]:.3e})" if info[j] > 0
                         else f"{j} (breakdown)" for j in bad[:8])
        more = f" and {bad.size - 8} more" if bad.size > 8 else ""
        warnings.warn(ConvergenceWarning(
            f"{who}: {bad.size} of {info.size} columns did not converge: {cols}{more}"),
            stacklevel=3)


def _finish(xp, who, Aop, B, X, tol, info, rounds_left):
    """True residual of every column reported converged; those above the tolerance
    (recurrence drift) are returned for another round when ``rounds_left``."""
    R = B - Aop(X)
    rn = to_host(column_norms(xp, R)).astype(np.float64)
    drift = (info == 0) & ~(rn <= tol)
    return R, rn, np.flatnonzero(drift) if rounds_left else np.empty(0, int)


def block_cg(A, B, X0=None, *, rtol=1e-5, atol=0.0, maxiter=None, M=None, callback=None):
    r"""Preconditioned CG on every column of ``B`` (``A`` and ``M`` SPD), in lockstep.

    Per column ``j`` (SciPy's PCG): ``z = M r``, ``rho_j = r_j^T z_j``, ``p = z + (rho /
    rho_old) p``, ``q = A p``, ``alpha_j = rho_j / p_j^T q_j``, ``x += alpha p``,
    ``r -= alpha q``; one block product with ``A`` and one with ``M`` per iteration,
    one host read of the ``k`` residual norms.  ``callback(X)`` after each iteration.
    See the module docstring for the stopping rule and the results.
    """
    who = "block_cg"
    maxiter = _check(B, X0, rtol, atol, maxiter, who)
    xp = backend_of(B).xp
    Aop, Mop = _as_block_op(A, "A"), _as_block_op(M, "M")
    k = B.shape[1]
    X, R, tol, rn, info, its, act = _start(who, xp, Aop, B, X0, rtol, atol)
    for rnd in range(3):            # a column whose true residual failed gets a fresh start
        act = act[its[act] < maxiter]
        if act.size == 0:
            break
        Ra = R if act.size == k else R[:, xp.asarray(act)]    # R is not read after the round
        P = rho = None
        while True:
            Z = Mop(Ra) if Mop is not None else Ra.copy()
            rho_new = _coldot(xp, Ra, Z)
            if P is None:
                P = Z
            else:                               # p = z + beta p, in place
                BK.scale_add(P, rho_new / rho, Z)
            rho = rho_new
            Q = Aop(P)
            alpha = rho / _coldot(xp, P, Q)
            if act.size == k and BK.column_dots_apply(X, P) and BK.column_dots_apply(Ra, Q):
                rna2 = BK.cg_update(alpha, X, P, Ra, Q)        # one pass; ||r_j||^2 with it
            elif act.size == k and BK.host_blocks(X, P, Ra, Q):
                rna2 = BK.cg_update_host(alpha, X, P, Ra, Q)
            else:
                if act.size == k:
                    X += alpha * P
                else:
                    X[:, xp.asarray(act)] += alpha * P
                Q *= alpha
                Ra -= Q
                rna2 = _coldot(xp, Ra, Ra)
            its[act] += 1
            h = to_host(xp.concatenate([xp.sqrt(rna2), alpha])).astype(np.float64)
            rna, al = h[: act.size], h[act.size:]
            bad = ~np.isfinite(rna) | ~np.isfinite(al) | ~(al > 0)
            info[act[bad]] = -1
            done = (rna <= tol[act]) | bad | (its[act] >= maxiter)
            if callback is not None:
                callback(X)
            if done.any():
                keep = ~done
                act = act[keep]
                if not act.size:
                    break
                kd = xp.asarray(np.flatnonzero(keep))
                Ra, P, rho = Ra[:, kd], P[:, kd], rho[kd]
        R, rn, act = _finish(xp, who, Aop, B, X, tol, info, rnd < 2)
    info[(info == 0) & ~(rn <= tol)] = max(maxiter, 1)      # > 0 also for maxiter=0
    _report(who, info, tol, rn)
    return X, info, its


def _givens(a, b):
    """Vectorised Givens rotation ``[c s; -s c] [a; b] = [r; 0]`` (host arrays)."""
    r = np.hypot(a, b)
    safe = np.where(r == 0, 1.0, r)
    return np.where(r == 0, 1.0, a / safe), np.where(r == 0, 0.0, b / safe), r


def block_gmres(A, B, X0=None, *, rtol=1e-5, atol=0.0, restart=None, maxiter=None, M=None,
                callback=None):
    r"""Left-preconditioned GMRES on every column of ``B``, in lockstep.

    Per column: Arnoldi on ``M A`` from ``v_0 = M r_0 / ||M r_0||`` with modified
    Gram-Schmidt (``h_ij = v_i^T w`` is a row of ``k`` inner products), the Hessenberg
    columns moved to the host once per step and reduced there by vectorised Givens
    rotations; ``|g_{j+1}|`` (the preconditioned residual) is the monitor.  A column
    leaves the block when its monitor passes ``||M r_0|| min(1, tol / ||r_0||)``
    (SciPy's target), its update ``x += V y`` is formed then.  ``restart=None``: no
    restart (pyamg's default), at most ``maxiter`` inner iterations; ``restart=m``:
    cycles of ``m`` steps.  A column whose true residual fails after the monitor passed
    starts a new cycle with a tightened target.  ``maxiter`` counts inner iterations.
    """
    who = "block_gmres"
    maxiter = _check(B, X0, rtol, atol, maxiter, who)
    if restart is not None and (isinstance(restart, bool) or not isinstance(restart, (int, np.integer))
                                or restart < 1):
        raise ValueError(f"{who}: restart must be a positive integer or None, got {restart!r}")
    xp = backend_of(B).xp
    Aop, Mop = _as_block_op(A, "A"), _as_block_op(M, "M")
    Mop = Mop if Mop is not None else (lambda V: V.copy())
    n, k = B.shape
    m_max = min(int(restart) if restart is not None else max(maxiter, 1), n)
    X, R, tol, rn, info, its, act = _start(who, xp, Aop, B, X0, rtol, atol)
    factor = np.ones(k)
    while act.size:
        act = act[its[act] < maxiter]
        info[np.setdiff1d(np.flatnonzero(~(rn <= tol) & (info == 0)), act)] = max(maxiter, 1)
        if not act.size:
            break
        W = Mop(R[:, act])
        beta = to_host(column_norms(xp, W)).astype(np.float64)
        ptol = beta * np.minimum(factor[act], tol[act] / rn[act])
        zero = ~(beta > 0)
        info[act[zero]] = -1
        act, W, beta, ptol = act[~zero], W[:, xp.asarray(np.flatnonzero(~zero))], beta[~zero], ptol[~zero]
        m = int(min(m_max, maxiter - its[act].min())) if act.size else 0
        V = [W / xp.asarray(beta)]
        H = np.zeros((m + 1, m, act.size))
        cs, sn = np.zeros((m, act.size)), np.zeros((m, act.size))
        g = np.zeros((m + 1, act.size))
        g[0] = beta
        cyc = act.copy()            # the columns of this cycle (V, H index them)
        live = np.ones(act.size, bool)
        presid = beta.copy()
        steps = np.zeros(act.size, dtype=np.int64)

        def update(cols, j):
            """x += V_j y for the cycle's columns ``cols`` (local indices) after j steps."""
            if not cols.size or j == 0:
                return
            Hs, gs = H[:j, :j, cols], g[:j, cols]
            # one small upper-triangular solve per column, batched
            y = np.linalg.solve(np.triu(Hs.transpose(2, 0, 1)), gs.T[:, :, None])[:, :, 0].T
            ci = xp.asarray(cols)
            upd = sum(V[i][:, ci] * xp.asarray(y[i]) for i in range(j))
            X[:, xp.asarray(cyc[cols])] += upd

        for j in range(m):
            li = np.flatnonzero(live)
            lid = xp.asarray(li)
            w = Mop(Aop(V[j][:, lid] if li.size < cyc.size else V[j]))
            hs = []
            for i in range(j + 1):
                Vi = V[i][:, lid] if li.size < cyc.size else V[i]
                h = _coldot(xp, Vi, w)
                w = w - h * Vi
                hs.append(h)
            hs.append(column_norms(xp, w))
            hcol = to_host(xp.stack(hs)).astype(np.float64)         # (j + 2, live)
            its[cyc[li]] += 1
            steps[li] = j + 1
            vn = xp.where(xp.asarray(hcol[j + 1] > 0), xp.asarray(hcol[j + 1]), 1.0)
            Vn = xp.zeros_like(V[0])
            Vn[:, lid] = w / vn
            V.append(Vn)
            for i in range(j):                      # earlier rotations on the new column
                a, b = hcol[i], hcol[i + 1]
                hcol[i], hcol[i + 1] = cs[i, li] * a + sn[i, li] * b, -sn[i, li] * a + cs[i, li] * b
            c, s, r = _givens(hcol[j], hcol[j + 1])
            cs[j, li], sn[j, li] = c, s
            hcol[j], hcol[j + 1] = r, 0.0
            H[: j + 2, j, li] = hcol
            g[j + 1, li] = -s * g[j, li]
            g[j, li] = c * g[j, li]
            presid[li] = np.abs(g[j + 1, li])
            bad = ~np.isfinite(presid[li]) | (r == 0)
            info[cyc[li[bad]]] = -1
            done = (presid[li] <= ptol[li]) | bad
            if callback is not None:
                callback(X)
            if done.any():
                fin = li[done & ~bad]
                for jj in np.unique(steps[fin]):
                    update(fin[steps[fin] == jj], int(jj))
                live[li[done]] = False
            if not live.any():
                break
        for jj in np.unique(steps[live]):           # cycle end: the rest get their update
            sel = np.flatnonzero(live)
            update(sel[steps[sel] == jj], int(jj))
        R = B - Aop(X)
        rn = to_host(column_norms(xp, R)).astype(np.float64)
        ok = (rn <= tol) | (info != 0)
        passed = presid <= ptol
        factor[cyc] = np.where(passed, np.maximum(1e-16, 0.25 * factor[cyc]),
                               np.minimum(1.0, 1.5 * factor[cyc]))
        act = np.flatnonzero(~ok)
        if restart is None and act.size and its[act].min() >= maxiter:
            break
    info[(info == 0) & ~(rn <= tol)] = max(maxiter, 1)
    _report(who, info, tol, rn)
    return X, info, its
