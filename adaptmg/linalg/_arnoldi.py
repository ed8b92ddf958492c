"""Restarted GMRES cycles (left-preconditioned) and flexible GMRES on NumPy or CuPy vectors.

Math (Saad, *Iterative Methods for Sparse Linear Systems*, §6.5.3, §9.3.1 and
§9.4.1).  ``m`` steps of the Arnoldi process applied to an operator ``B`` from a
vector ``z_0`` with ``beta = ||z_0||`` build an orthonormal basis
``V_{m+1} = [v_1, ..., v_{m+1}]``, ``v_1 = z_0 / beta``, and an upper Hessenberg
``(m+1) x m`` matrix ``H_m`` with

    B V_m = V_{m+1} H_m              (Arnoldi relation).

* :func:`~adaptmg.linalg.gmres` is SciPy's GMRES: *left* preconditioning,
  ``B = M A`` and ``z_0 = M r_0``.  The monitor ``|g_{j+1}|`` below is the norm of
  the *preconditioned* residual ``||M (b - A x_j)||``: it is what the callback
  receives (divided by ``||b||``, SciPy's ``'pr_norm'``) and what the inner
  iteration is stopped on, against the tolerance ``ptol`` that SciPy adapts from
  cycle to cycle (gh-8400): initially ``||M b|| min(1, tol / ||b||)``, then
  ``presid * min(f, tol / ||b - A x||)`` with the safety factor ``f`` divided by 4
  after a cycle whose monitor passed but whose true residual did not, multiplied
  by 1.5 (at most 1) otherwise.  The update is ``x = x_0 + V_m y``.
* :func:`~adaptmg.linalg.fgmres` is flexible GMRES (Saad 1993): *right*
  preconditioning, ``B = A M_j`` and ``z_0 = r_0``; it stores ``z_j = M_j v_j`` in
  a second ``(m, n)`` array ``Z`` and updates ``x = x_0 + Z_m y``, so that
  ``A Z_m = V_{m+1} H_m`` holds exactly even when the preconditioner changes
  from one step to the next (a multigrid cycle, an inner Krylov solve).  Its
  monitor is the norm of the *true* residual ``||b - A x_j||`` up to rounding.

Each step computes ``w = B v_j`` and orthogonalises it against ``v_1..v_j``,
then ``h_{j+1,j} = ||w||`` and ``v_{j+1} = w / h_{j+1,j}``.  Two variants
(keyword ``orthogonalization``):

* ``"mgs"`` (default), *modified* Gram-Schmidt: ``h_ij = (v_i, w);
  w <- w - h_ij v_i``, one ``i`` after the other (``2 j`` dependent device
  operations per step);
* ``"cgs2"``, classical Gram-Schmidt with one re-orthogonalisation
  (Giraud, Langou, Rozloznik 2005: "twice is enough"): with ``V_j`` the block of
  the ``j`` basis vectors, two passes of ``h^(p) = V_j^H w; w <- w - V_j h^(p)``
  and ``h_{1..j,j} = h^(1) + h^(2)``.  Each pass is two block operations (a
  multi-dot and a fused update), so a step costs a fixed number of launches
  instead of ``~2 j``.  The CGS2 basis stays orthogonal to working precision
  (MGS loses orthogonality like ``eps cond(K)`` of the Krylov matrix, single-pass
  CGS like ``eps cond(K)^2``; GMRES-MGS is backward stable nonetheless,
  Paige, Rozloznik, Strakos 2006), and before convergence the Hessenberg
  matrices, residual histories and iterates of both variants agree to round-off.

The iterate minimises the monitored residual norm over the Krylov space when
``y`` solves the small least-squares problem ``min ||beta e_1 - H_m y||``.  It
is solved progressively with Givens rotations
``G_j = [[c_j, s_j], [-conj(s_j), c_j]]`` that annihilate ``h_{j+1,j}``: applied
to ``H_m`` they leave an upper-triangular ``R_m`` and applied to
``g = beta e_1`` they give the monitor ``|g_{j+1}|`` at no cost.

GPU layout (Gascoigne's scheme, seed 001 §4.1.5): the basis ``V`` is one
preallocated ``(m+1, n)`` device array and the Gram-Schmidt inner products and
updates run on the device, writing into one preallocated device column that
also receives ``||w||^2``; this column ``h_{1..j+1,j}`` is brought to the host
in one transfer per inner iteration (the only synchronisation), where
``h_{j+1,j} = sqrt(||w||^2)``, the Givens rotations and the triangular solve
(``m <= restart``, tiny) are done with NumPy.  No device memory is allocated
inside the loop (apart from what ``A`` and ``M`` allocate).  The only other
transfers are once per restart cycle: ``y``, the true residual norm and (left
preconditioning only) ``||M r||``.  On an H100 (``scripts/bench_gmres.py``,
GMRES(20), Jacobi, 2-D Q1 Poisson with 70k unknowns) an inner iteration costs
0.98 ms with ``"mgs"`` and 0.54 ms with ``"cgs2"`` (it was 1.75 ms with a scalar
``vdot`` per MGS projection and a stack of device scalars), of which 0.14 ms is
the operator.

Every cycle ends with the true residual ``b - A x``: ``info == 0`` only when it
passes.  "Happy breakdown" (``h_{j+1,j} = 0``: the Krylov space is invariant)
ends the cycle with the exact least-squares solution; when the monitor is still
above ``sqrt(eps) beta`` then, the operator is singular on that space and the
solve breaks down (``info < 0``), as it does on a zero pivot of ``R_m`` or a
vanishing ``M r``; a monitor at the round-off level restarts instead (``maxiter``
bounds the whole).
"""
from __future__ import annotations

import math

import numpy as np
from scipy.linalg import solve_triangular

from ._vectorops import VectorOps

__all__ = ["arnoldi_solve"]


def _givens(a, b):
    """Return ``(c, s, rho)`` with c real and ``[[c, s], [-conj(s), c]] @ [a, b] = [rho, 0]``."""
    if b == 0:
        return 1.0, 0.0 * a, a
    if a == 0:
        return 0.0, np.conj(b) / abs(b), abs(b) + 0.0 * a
    abs_a = abs(a)
    nu = np.hypot(abs_a, abs(b))
    phase = a / abs_a
    return abs_a / nu, phase * np.conj(b) / nu, phase * nu


def _where(cycle, iterations):
    return f"in restart cycle {cycle} (after {iterations} iterations)"


def arnoldi_solve(s, *, flexible, restart, cgs2, callback_type):
    """Run restarted (f)gmres on the prepared system ``s``; returns ``(x, info)``.

    ``flexible``: fgmres (right preconditioning, ``Z`` stored); else gmres (left).
    ``callback_type``: None (no callback), ``'x'``, ``'pr_norm'`` or ``'legacy'``
    (SciPy's meanings; ``'legacy'`` makes ``s.maxiter`` count inner iterations).
    """
    xp, x, tol, n, dtype = s.xp, s.x, s.tol, s.n, s.dtype
    m = min(restart, n)
    started = s.start()
    if started is None:
        return x, 0
    r, rnorm = started
    left = not flexible and s.M is not None
    legacy = callback_type == "legacy"
    scalar_cb = callback_type in ("legacy", "pr_norm")

    # ---- everything the cycles need, allocated once -------------------------------
    ops = VectorOps(s.backend, n, dtype, rows=m + 1)
    V = xp.empty((m + 1, n), dtype=dtype)                       # Krylov basis
    hcol = xp.zeros(m + 1, dtype=dtype)                         # h_{1..j,j}, ||w||^2 (device)
    h2 = xp.zeros(m, dtype=dtype) if cgs2 else None             # second CGS pass (device)
    hland = np.zeros(m + 1, dtype=dtype)                        # where hcol lands on the host
    yd = xp.empty(m, dtype=dtype)                               # y on the device
    Z = xp.empty((m, n), dtype=dtype) if (flexible and s.M is not None) else None
    fresh = (s.M.fresh if left else s.A.fresh)
    wbuf = None if fresh else xp.empty(n, dtype=dtype)
    u = xp.empty(n, dtype=dtype)                                # V_k y
    hdtype = np.result_type(dtype, np.float64)                  # host work in double
    hwork = np.zeros(m + 1, dtype=hdtype)                       # the column, rotated in place
    R = np.zeros((m, m), dtype=hdtype)                          # rotated H (triangular)
    cs = np.zeros(m, dtype=np.float64)
    sn = np.zeros(m, dtype=hdtype)
    g = np.zeros(m + 1, dtype=hdtype)
    eps = float(np.finfo(dtype).eps)

    # SciPy's inner tolerance (gh-8400), on the monitored (left: preconditioned) residual
    mb_norm = s.norm(s.M(s.b)) if left else s.bnrm2
    ptol_factor = 1.0
    ptol = mb_norm * min(1.0, tol / s.bnrm2)

    iterations = 0                # inner iterations over all cycles
    for cycle in range(1, s.maxiter + 1):
        if left:                  # z_0 = M r
            z0 = s.M(r)
            beta = s.norm(z0)
            if not math.isfinite(beta):
                return s.breakdown(_where(cycle, iterations), "M returned NaN or Inf",
                                   rnorm=rnorm)
            if beta == 0.0:
                return s.breakdown(_where(cycle, iterations), "M (b - A x) == 0: the residual "
                                   "lies in the null space of M (singular preconditioner)",
                                   rnorm=rnorm)
            xp.multiply(z0, 1.0 / beta, out=V[0])
        else:
            beta = rnorm
            xp.multiply(r, 1.0 / beta, out=V[0])
        g[:] = 0
        g[0] = beta
        presid = beta
        k = 0                     # number of basis vectors used for the update
        why = None                # reason for a breakdown of this cycle
        happy = False             # the Krylov space became invariant
        for j in range(m):
            # w = M A v_j (left), A Z_j with Z_j = M v_j (flexible), or A v_j
            if left:
                w = s.M(s.A(V[j]))
            elif Z is not None:
                s.M.into(V[j], Z[j])      # straight into Z where M offers it (APPLY_INTO)
                w = s.A(Z[j])
            else:
                w = s.A(V[j])
            if wbuf is not None:          # a foreign operator may return an alias
                xp.copyto(wbuf, w)
                w = wbuf
            # Gram-Schmidt on the device, into hcol[:j+1] (no host synchronisation)
            if cgs2:            # h = V_j^H w; w -= V_j h; twice; h_{.,j} = h1 + h2
                ops.mdot(V[:j + 1], w, hcol[:j + 1])
                ops.block_sub(w, V, hcol[:j + 1])
                ops.mdot(V[:j + 1], w, h2[:j + 1], acc=hcol[:j + 1])
                ops.block_sub(w, V, h2[:j + 1])
            else:               # modified Gram-Schmidt, one basis vector after the other
                for i in range(j + 1):
                    ops.mdot(V[i:i + 1], w, hcol[i:i + 1])
                    ops.sub_scaled(w, hcol[i:i + 1], V[i])
            ops.mdot(w[None], w, hcol[j + 1:j + 2])              # ||w||^2
            h = hwork[:j + 2]
            h[...] = ops.fetch(hcol[:j + 2], hland[:j + 2])    # the one transfer
            iterations += 1
            if not np.isfinite(h).all():
                why = "non-finite values in the Arnoldi process (A or M returned NaN/Inf)"
                break
            h[j + 1] = np.sqrt(max(h[j + 1].real, 0.0))
            hnext = abs(h[j + 1])
            colnorm = float(np.linalg.norm(h))
            # Givens rotations, on the host
            for i in range(j):
                t = cs[i] * h[i] + sn[i] * h[i + 1]
                h[i + 1] = -np.conj(sn[i]) * h[i] + cs[i] * h[i + 1]
                h[i] = t
            cs[j], sn[j], rho = _givens(h[j], h[j + 1])
            R[:j, j] = h[:j]
            R[j, j] = rho
            g[j + 1] = -np.conj(sn[j]) * g[j]
            g[j] = cs[j] * g[j]
            presid = abs(g[j + 1])
            if scalar_cb:
                s.callback(np.float64(presid / s.bnrm2))    # a float with ndim, as in SciPy
            if abs(rho) <= eps * colnorm:
                op = "M A" if left else "A M" if s.M is not None else "A"
                why = f"{op} is singular on the Krylov space (zero pivot)"
                break
            k = j + 1
            if legacy and iterations >= s.maxiter:
                break
            if presid <= ptol:
                break
            if hnext <= eps * colnorm:    # happy breakdown: the Krylov space is invariant
                happy = True
                break
            if j + 1 < m:
                xp.multiply(w, 1.0 / hnext, out=V[j + 1])

        # x <- x + V_k y  (gmres)  or  x + Z_k y  (fgmres)
        if k > 0:
            y = solve_triangular(R[:k, :k], g[:k], lower=False, check_finite=False)
            if s.backend.is_gpu:
                yd[:k].set(y.astype(dtype, copy=False))
            else:
                yd[:k] = y
            xp.dot(yd[:k], (V if Z is None else Z)[:k], out=u)
            x += u
        s.residual(x, out=r)
        rnorm = s.norm(r)                                        # the true residual
        if legacy and iterations >= s.maxiter:
            if rnorm <= tol:
                return x, 0
            return s.not_converged(s.maxiter, f"{s.maxiter} iterations (callback_type="
                                   f"'legacy': maxiter counts inner iterations, "
                                   f"restart={m})", rnorm=rnorm)
        if callback_type == "x":
            s.callback(x)
        if rnorm <= tol:
            return x, 0
        if not math.isfinite(rnorm):
            why = "the residual became NaN or Inf"
        if why is None and happy and presid > math.sqrt(eps) * beta:
            op = "M A" if left else "A M" if s.M is not None else "A"
            why = (f"the Krylov space is invariant but the residual did not vanish on it: "
                   f"{op} is singular and b is not in its range")
        if why is not None:
            return s.breakdown(_where(cycle, iterations), why, rnorm=rnorm)
        if presid <= ptol:        # the monitor passed, the true residual did not
            ptol_factor = max(eps, 0.25 * ptol_factor)
        else:
            ptol_factor = min(1.0, 1.5 * ptol_factor)
        ptol = presid * min(ptol_factor, tol / rnorm)

    return s.not_converged(s.maxiter, f"{s.maxiter} restart cycles ({iterations} iterations,"
                           f" restart={m})", rnorm=rnorm)
