r"""Element matrices of the Q1 stiffness form with a constant coefficient, one device thread a
cell.

For a cell with vertices :math:`X_v` (``2^d`` of them) and the tensor Gauss rule
:math:`(\hat x_q, w_q)`:

.. math::  J_{q,ab} = \sum_v X_{v,a}\, \partial_b \hat N_v(\hat x_q), \qquad
           F_{q,p} = \frac{w_q \kappa}{\det J_q}\, \mathrm{adj}(J_q^T J_q)_{p}, \qquad
           K_{c,(i,j)} = \sum_{q,p} F_{q,p}\, T_{q,p,(i,j)},

``p`` the packed symmetric pairs of :func:`~adaptmg.fe.geometry.sym_pairs` and ``T`` the
reference tensor of :func:`adaptmg.assemble.stiffness` (:math:`w_q \kappa \det J\,
J^{-1}J^{-T} = w_q \kappa\,\mathrm{adj}(J^TJ)/\det J`: the factor of
:func:`~adaptmg.fe.geometry.metric_factor`).  This is the arithmetic of the general device path
(:func:`.on_device.element_chunks`: the vertex gather, the Jacobians by one contraction,
the factor, one GEMM with ``T``), done in registers by one kernel per chunk instead of a
dozen CuPy passes over chunk-sized temporaries: the sums run in another order, so the
entries agree to rounding, not bit for bit.  Measured on one H200 (3-D, 20,712,966 cells,
sync-timed, the two paths alternated in one process, the same row walk): the stiffness
matrix 0.234 -> 0.128 s (the general path's element matrices ~136 ms of it: the geometry
41 ms, the factor and GEMM ~95 ms), the entries within 6.7e-16 of the largest of the general
path's.

A cell with :math:`\det J_q \le 0` at some point is flagged and, after the sweep, reported
by :func:`~adaptmg.fe.geometry.jacobian_error`, as on the general path.  On NumPy arrays
:func:`stiffness_chunks` runs a vectorised twin of the kernel (the CPU tests).
"""
from __future__ import annotations

import functools

import numpy as np

from ..backend import backend_of, constant, get_backend, in_host_memory, to_host
from ..device.deferred import check_later
from ..fe.geometry import _det, jacobian_error, metric_factor, q1_tables, sym_pairs

__all__ = ["fits", "stiffness_chunks"]


def fits(info, nq):
    """Whether the kernel serves this space: Q1 (``2^d`` local DoFs, the vertices) in 2-D or
    3-D, at most 27 quadrature points (its factors stay in registers)."""
    return info.dim in (2, 3) and info.degree == 1 and info.nloc == 2 ** info.dim and nq <= 27


def _cofactor(d, a, b):
    """C expression of ``adj(g)[a, b]`` of the symmetric d x d metric ``g`` (as
    :func:`~adaptmg.fe.geometry.metric_factor` forms it)."""
    if d == 2:
        return f"g{1 - a}{1 - b}" if a == b else f"(-g{a}{b})"
    a1, a2, b1, b2 = (a + 1) % 3, (a + 2) % 3, (b + 1) % 3, (b + 2) % 3
    return f"(g{a1}{b1} * g{a2}{b2} - g{a1}{b2} * g{a2}{b1})"


def _source(d, nq):
    nv, mp = 2 ** d, d * (d + 1) // 2
    ne = nv * nv
    det = ("J00 * J11 - J01 * J10" if d == 2 else
           "J00 * (J11 * J22 - J12 * J21) - J01 * (J10 * J22 - J12 * J20) + J02 * (J10 * J21 - J11 * J20)")
    jac = "\n".join(f"    double J{a}{b} = 0.0;" for a in range(d) for b in range(d))
    acc = "\n".join(f"      J{a}{b} += X[v][{a}] * dN[(q * {nv} + v) * {d} + {b}];" for a in range(d) for b in range(d))
    metric = "\n".join(f"    const double g{a}{b} = " + " + ".join(f"J{r}{a} * J{r}{b}" for r in range(d)) + ";"
                       for a in range(d) for b in range(a, d))
    sym = "\n".join(f"    const double g{b}{a} = g{a}{b};" for a in range(d) for b in range(a + 1, d))
    fac = "\n".join(f"    F[q * {mp} + {p}] = {_cofactor(d, a, b)} * s;" for p, (a, b) in enumerate(sym_pairs(d)))
    return f"""
const long long c = c0 + i;
double X[{nv}][{d}];
#pragma unroll
for (int v = 0; v < {nv}; ++v) {{
  const long long n = (long long)cells[c * {nv} + v];
#pragma unroll
  for (int a = 0; a < {d}; ++a) X[v][a] = pts[n * {d} + a];
}}
double F[{nq * mp}];
bool ok = true;
#pragma unroll
for (int q = 0; q < {nq}; ++q) {{
{jac}
#pragma unroll
    for (int v = 0; v < {nv}; ++v) {{
{acc}
    }}
    const double det = {det};
    ok = ok && det > 0.0;
{metric}
{sym}
    const double s = w[q] * coef / det;
{fac}
}}
for (int e = 0; e < {ne}; ++e) {{
  double sum = 0.0;
#pragma unroll
  for (int k = 0; k < {nq * mp}; ++k) sum += F[k] * T[k * {ne} + e];
  K[(long long)i * {ne} + e] = sum;
}}
bad[c] = !ok;
"""


@functools.lru_cache(maxsize=None)
def _kernel(d, nq):
    """The element kernel for dimension ``d`` and ``nq`` quadrature points."""
    return get_backend("gpu").xp.ElementwiseKernel(
        "raw float64 pts, raw C cells, raw float64 dN, raw float64 w, raw float64 T, float64 coef, int64 c0",
        "raw float64 K, raw bool bad", _source(d, nq), f"adaptmg_q1_stiffness_{d}d_{nq}")


def _np_elements(pts, cells, dN, w, T, coef, sl):
    """The twin of the kernel on NumPy (or the tests' stand-ins for CuPy, whose arrays it keeps:
    no host copy): ``(K, bad)`` of the cells ``sl``, the same formulas
    (:func:`~adaptmg.fe.geometry.metric_factor` with the weights ``w_q kappa``)."""
    xp = backend_of(pts).xp
    X = pts[cells[sl]]                                         # (n, nv, d)
    J = xp.einsum("cva,qvb->cqab", X, dN)                      # (n, nq, d, d)
    det = _det(J)
    F = metric_factor(J, det, w[None, :] * coef, packed=True)  # (n, nq, d(d+1)/2)
    return F.reshape(F.shape[0], -1) @ T, ~(det > 0).all(axis=1)


def stiffness_chunks(be, info, xi, w, T_full, step, coef=1.0):
    """``(sl, K, None)`` over chunks of at most ``step`` cells: the Q1 stiffness element matrices
    (n, 4^d) of the constant coefficient ``coef`` (module doc), ``T_full`` the reference
    tensor (nq * d(d+1)/2, 4^d) of :func:`adaptmg.assemble.stiffness`.  The form of
    :func:`.on_device.element_chunks` (what :func:`.on_device.device_element_sums` sums; on
    the device one buffer serves every chunk: a chunk's ``K`` holds until the next is asked
    for); ValueError after the sweep for cells with det J <= 0 (inside
    :func:`adaptmg.device.deferred.deferred_checks`: at that block's end)."""
    xp = be.xp
    d, nq = info.dim, xi.shape[0]
    dN = q1_tables(d, xi)[1]                                   # (nq, nv, d)
    pts = xp.ascontiguousarray(xp.asarray(info.points, dtype=np.float64))
    cells = xp.ascontiguousarray(xp.asarray(info.cells))
    nc = info.num_cells
    dN_d, w_d, T_d = constant(dN, xp), constant(w, xp), constant(T_full, xp)
    bad = xp.zeros(nc, dtype=bool)
    if in_host_memory(pts):              # the twin (NumPy; the tests' stand-ins for CuPy)
        for s in range(0, nc, step):
            sl = slice(s, min(s + step, nc))
            K, bad[sl] = _np_elements(pts, cells, dN_d, w_d, T_d, float(coef), sl)
            yield sl, K, None
    else:
        kern = _kernel(d, nq)
        K = None
        for s in range(0, nc, step):
            sl = slice(s, min(s + step, nc))
            n = sl.stop - sl.start
            if K is None:
                K = xp.empty((n, T_full.shape[1]))
            kern(pts, cells, dN_d, w_d, T_d, float(coef), np.int64(s), K[:n], bad, size=n)
            yield sl, K[:n], None
    # read now, or at the end of an enclosing deferred_checks block (adaptmg.device.deferred)
    check_later(bad.any(), lambda: jacobian_error(to_host(bad)))
