r"""The AMLI cycle (algebraic multilevel iteration, as pyamg runs it).

On level :math:`l` the AMLI cycle smooths and restricts like a V-cycle; its
coarse correction is not one coarse cycle but :math:`m = 2` coarse cycles that
are A-orthogonalised and combined with optimal step lengths (a two-step
conjugate-direction method on level :math:`l-1` preconditioned by the AMLI
cycle there).  With :math:`d` the restricted residual and :math:`A_c` the coarse
matrix, for :math:`k = 1, \dots, m`:

.. math::

    p_k &= \mathrm{AMLI}_{l-1}(x = \mathbf 1, b = d)
          \quad\text{(the coarse cycle from the all-ones vector, as pyamg)}\\
    p_k &\leftarrow p_k - \sum_{j<k} \frac{\langle p_j, A_c p_k\rangle}
          {\langle p_j, A_c p_j\rangle} p_j,\qquad
    \alpha_k = \frac{\langle p_k, d\rangle}{\langle p_k, A_c p_k\rangle},\\
    x_c &\leftarrow x_c + \alpha_k p_k,\qquad d \leftarrow d - \alpha_k A_c p_k,

(:math:`\langle u, v\rangle = u^H v`).  The level above the coarsest solves
directly.  The step lengths make the cycle a nonlinear operator of the residual:
use it alone or inside FGMRES, not CG.  The inner products are reductions inside
the cycle, so an AMLI cycle is never recorded as a CUDA graph.
"""
from __future__ import annotations

__all__ = ["amli_correction", "N_AMLI"]

#: coarse cycles per AMLI coarse correction (pyamg's ``nAMLI``)
N_AMLI = 2


def _work(ml, l):
    """Per-level scratch of the AMLI correction on level ``l - 1`` (allocated once)."""
    cache = ml.__dict__.setdefault("_amli_work", {})
    w = cache.get(l)
    if w is None:
        c = ml._dev[l - 1]
        xp = ml.backend.xp
        w = cache[l] = {"d": xp.empty_like(c.r), "xc": xp.empty_like(c.r),
                        "Ap": [xp.empty_like(c.r) for _ in range(N_AMLI)],
                        "p": [xp.empty_like(c.r) for _ in range(N_AMLI)]}
    return w


def amli_correction(ml, l):
    """``c.x = `` the AMLI coarse correction of level ``l`` for the coarse right-hand side
    ``c.b`` (``c`` the level below ``l``; ``c.b`` is kept).  Level ``l - 1 >= 1``."""
    xp = ml.backend.xp
    c = ml._dev[l - 1]
    w = _work(ml, l)
    d, xc, P, AP = w["d"], w["xc"], w["p"], w["Ap"]
    xp.copyto(d, c.b)
    xc.fill(0)
    keep_b = c.b
    try:
        c.b = d                                  # the coarse cycles solve for the current d
        for k in range(N_AMLI):
            c.x.fill(1)
            ml._level_cycle(l - 1, "AMLI", False)
            p, Ap = P[k], AP[k]
            xp.copyto(p, c.x)
            for j in range(k):
                c.Aplan(p, Ap, 1.0, 0.0)
                beta = xp.vdot(P[j], Ap) / xp.vdot(P[j], AP[j])
                p -= beta * P[j]
            c.Aplan(p, Ap, 1.0, 0.0)
            alpha = xp.vdot(p, d) / xp.vdot(p, Ap)
            xc += alpha * p
            d -= alpha * Ap
    finally:
        c.b = keep_b
    xp.copyto(c.x, xc)
