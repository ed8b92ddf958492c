r"""Conjugate gradients in half precision (fp16 storage, fp32 or fp16 sums), seed 003 §3 / Fig. 5.

The attainable accuracy of an iterative solve whose matrix and vectors live in fp16
(unit round-off :math:`u = 2^{-11}`) is governed by the condition number: the computed
solution stagnates at a relative error of at most about :math:`\kappa(A)\,u` (a rounding of
relative size u in the matrix or the defect is amplified by up to :math:`\kappa`).  With :math:`\kappa(A_h) \sim h^{-2}`
(nodal Q1) fp16 fails a few levels in; the prehandled
:math:`A = L^{-1} S^T A_h S L^{-T}` has :math:`\kappa \sim (\log 1/h)^2` and keeps fp16
usable several levels further: seed 003's Figure 5.

``half_cg`` is plain CG (Hestenes-Stiefel)

.. math::  q = A p,\ \alpha = \rho / (p, q),\ x \leftarrow x + \alpha p,\
           r \leftarrow r - \alpha q,\ \rho' = (r, r),\ p \leftarrow r + (\rho'/\rho) p

with the matrix entries and the vectors x, r, p, q stored in fp16, the matrix-vector
products and axpys computed in fp32 from fp16 inputs (as tensor cores / HP units do) and
rounded to fp16 when stored, and the inner products accumulated in fp32.  The emulation
keeps fp16-valued float32 arrays (``v.astype(float16).astype(float32)`` after every stored
result): exactly the hardware's numbers up to the order of the fp32 accumulation, and fast
on NumPy, whose fp16 arithmetic is slow.  It is not ``adaptmg.linalg.cg``: that one
computes in at least fp32 by design.  The right-hand side is scaled by a power of two into
(-1, 1] (exact), the solution scaled back in double (scaling it to 2^8 or 2^12 instead
changed the errors of Figure 5 by < 2 %: the floor is the fp16 storage of x, not the range).
fp16 subnormals are kept (IEEE; NumPy and GPUs both have them).

Two readings of "an iterative solve in half precision" (``accumulate``, ``residual``):

* fp32 accumulators, recursive residual (the defaults): :math:`fl(Ap) = Ap(1 + \delta)`,
  :math:`|\delta| \le u`, and r is never recomputed from x.  The rounding then stays far
  below the worst case :math:`\kappa u` (measured: the nodal error is 1.17x the fp64 one at
  h = 1/128 for seed 003's oscillating u).
* fp16 arithmetic throughout (``accumulate="float16"``: every partial sum of A x rounded,
  :class:`_Fp16SpMV`) and the defect recomputed as :math:`r = fl(b - A x)` every iteration
  (``residual="true"``), as an HP defect-correction / multigrid / true-residual solver does:
  the defect carries an error :math:`\delta \sim u |A| |x|`, the solution one of
  :math:`A^{-1} \delta \sim \kappa u` relative: seed 003's curves (nodal fp16 off at
  level 6, prehandled at level 9, measured; paper: 5 and 8-9).

Stopping rule fp16 can meet: ``rtol`` on the (recursive or true) residual (``status="rtol"``), or
``stagnation`` iterations without a new minimum of the residual norm
(``status="stagnation"``: fp16's attainable accuracy; counted once the residual went below
its start, since CG's residual may first grow for many iterations), or ``maxiter``.  The
iterate with the smallest residual is returned.
"""
from __future__ import annotations

import warnings
from typing import NamedTuple

import numpy as np

from ..backend import backend_of, is_sparse

__all__ = ["half_cg", "HalfCGResult", "round_half"]


class HalfCGResult(NamedTuple):
    x: object          # float64 solution on the backend (the iterate of the smallest residual)
    status: str        # "rtol", "stagnation" or "maxiter"
    iterations: int    # iterations done
    best: int          # iteration of the returned iterate
    residuals: list    # residual norms / ||b||, one per iteration (0: the start)


def round_half(v):
    """v rounded to fp16 and held in fp32 (what fp16 storage keeps of an fp32 result)."""
    return v.astype(np.float16).astype(np.float32)


class _Fp16SpMV:
    r"""y = A p with fp16 accumulation: the exact products :math:`a_{ij} p_j` of each row summed
    pairwise (a tree, as a GPU reduction does) with every partial sum rounded to fp16, so
    :math:`fl(Ap) = (A + \delta A) p`, :math:`|\delta A| \lesssim \lceil\log_2 k\rceil u |A|` (k: the
    row length), unlike fp32 accumulation (:math:`|\delta(Ap)| \le u |Ap|`).  The pairing of
    every pass is built once from the CSR structure (about log2(max row length) passes, each a
    gather over the remaining partial sums)."""

    def __init__(self, A16, xp):
        self.xp, self.n = xp, A16.shape[0]
        self.data, self.indices = A16.data, A16.indices
        lens = xp.diff(A16.indptr)
        self.rows = xp.flatnonzero(lens > 0)
        ptr = A16.indptr
        row = xp.searchsorted(ptr, xp.arange(A16.nnz), side="right") - 1   # (cupy.repeat: host counts only)
        self.passes = []
        while lens.size and int(lens.max()) > 1:
            pos = xp.arange(row.size) - ptr[row]
            first = xp.flatnonzero(pos % 2 == 0)
            second = xp.where(pos[first] + 1 < lens[row[first]], first + 1, row.size)   # row.size: a zero
            self.passes.append((first, second))
            lens = (lens + 1) // 2
            ptr = xp.concatenate([xp.zeros(1, dtype=ptr.dtype), xp.cumsum(lens)]).astype(ptr.dtype)
            row = row[first]

    def __matmul__(self, p):
        xp = self.xp
        v = self.data * p[self.indices]                      # fp16 x fp16: exact in fp32
        zero = xp.zeros(1, dtype=v.dtype)
        for first, second in self.passes:
            w = xp.concatenate([v, zero])
            v = round_half(w[first] + w[second])
        y = xp.zeros(self.n, dtype=np.float32)
        y[self.rows] = v
        return y


def half_cg(A, b, *, rtol=1e-3, stagnation=50, maxiter=None, accumulate="float32", residual="recursive"):
    """Solve ``A x = b`` (A SPD, sparse CSR on ``b``'s backend) by CG in half precision.

    See the module docstring for the arithmetic and the stopping rule.  ``accumulate``:
    "float32" (the matrix-vector product of fp16 inputs accumulated in fp32, rounded once) or
    "float16" (every partial sum of a row rounded to fp16, :class:`_Fp16SpMV`: HP arithmetic
    without fp32 accumulators).  ``residual``: "recursive" (r -= alpha q) or "true"
    (r = b - A x in the same arithmetic every iteration, one more product).  Returns a
    :class:`HalfCGResult`; warns (RuntimeWarning) unless ``rtol`` was met.
    """
    if not is_sparse(A):
        raise TypeError(f"half_cg: A must be a sparse matrix, got {type(A).__name__}")
    be = backend_of(b)
    xp = be.xp
    if b.ndim != 1 or A.shape != (b.shape[0], b.shape[0]):
        raise ValueError(f"half_cg: need A (n, n) and b (n,), got {A.shape} and {b.shape}")
    if not (0 <= rtol < 1):
        raise ValueError(f"half_cg: rtol must lie in [0, 1), got {rtol}")
    if int(stagnation) < 1:
        raise ValueError(f"half_cg: stagnation must be a positive number of iterations, got {stagnation}")
    if residual not in ("recursive", "true"):
        raise ValueError(f"half_cg: residual must be 'recursive' or 'true', got {residual!r}")
    if accumulate not in ("float32", "float16"):
        raise ValueError(f"half_cg: accumulate must be 'float32' or 'float16', got {accumulate!r}")
    n = b.shape[0]
    maxiter = 10 * n if maxiter is None else int(maxiter)
    A16 = be.asmatrix(A, dtype=np.float32).copy()
    big = float(xp.max(xp.abs(A16.data))) if A16.nnz else 0.0
    if not big < 65504:
        raise ValueError(f"half_cg: matrix entries up to {big:g} overflow fp16 (max 65504); scale A")
    A16.data[...] = round_half(A16.data)
    if accumulate == "float16":
        A16.sort_indices()
        A16 = _Fp16SpMV(A16, xp)
    bmax = float(xp.max(xp.abs(b)))
    if bmax == 0:
        return HalfCGResult(xp.zeros(n), "rtol", 0, 0, [0.0])
    scale = 2.0 ** np.ceil(np.log2(bmax))
    r = b16 = round_half(xp.asarray(b / scale, dtype=np.float32))
    x = xp.zeros(n, dtype=np.float32)
    p = r.copy()
    rho = float(r @ r)
    nb = np.sqrt(rho)
    res = [1.0]
    x_best, best, it, status = x.copy(), 0, 0, "maxiter"
    while it < maxiter:
        it += 1
        q = round_half(A16 @ p)
        pq = float(p @ q)
        if not pq > 0 or not np.isfinite(pq):
            status = "stagnation"            # breakdown (p lost to rounding, or overflow)
            break
        alpha = np.float32(rho / pq)
        x = round_half(x + alpha * p)
        r = round_half(r - alpha * q) if residual == "recursive" else round_half(b16 - round_half(A16 @ x))
        rho_new = float(r @ r)
        res.append(np.sqrt(rho_new) / nb)
        if res[-1] < res[best]:
            x_best, best = x.copy(), it
        if res[-1] <= rtol:
            status = "rtol"
            break
        if (best and it - best >= stagnation) or rho_new == 0:
            status = "stagnation"
            break
        p = round_half(r + np.float32(rho_new / rho) * p)
        rho = rho_new
    if status != "rtol":
        warnings.warn(f"half_cg: stopped by {status} after {it} iterations at a residual "
                      f"{res[best]:.2e} ||b|| (rtol {rtol:g} not met: fp16's attainable accuracy)",
                      RuntimeWarning, stacklevel=2)
    return HalfCGResult(x_best.astype(np.float64) * scale, status, it, best, res)
