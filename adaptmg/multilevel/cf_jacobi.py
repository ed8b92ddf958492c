r"""C/F Jacobi: damped Jacobi sweeps over one point class at a time (pyamg's ``cf_jacobi``).

A C/F splitting (AIR, Ruge-Stueben) divides the unknowns of a level into C points
(kept on the coarse level) and F points.  pyamg's ``cf_jacobi`` / ``fc_jacobi``
relax them in turn; one *half-sweep* over the index set :math:`I` (the C or the F
points) is a Jacobi step on those rows only, every row from the same old ``x``:

.. math::

    x_I \leftarrow x_I + \omega\, S_I\, (b - A x)_I, \qquad x_{\bar I} \text{ unchanged},

with :math:`S_I = D_{II}^{-1}` (point Jacobi; a zero diagonal entry leaves its row
alone, as pyamg's ``jacobi_indexed``) or, for ``cf_block_jacobi``, the inverses of
the :math:`c \times c` diagonal node blocks of the nodes in :math:`I` (pyamg's
``Dinv`` when given).  One sweep (pyamg's ``iterations = 1``) is

* ``order="cf"`` (``cf_jacobi``): ``c_iterations`` C half-sweeps, then
  ``f_iterations`` F half-sweeps;
* ``order="fc"`` (``fc_jacobi``): the F half-sweeps first.

Each half-sweep's error propagation :math:`E_I = I - \omega P_I S_I P_I^T A` is
:math:`A`-self-adjoint for symmetric :math:`A` and :math:`S_I`, so the adjoint of a
sweep is the same half-sweeps in reverse order: :meth:`CFJacobi.smooth_adjoint`
(``cf`` <-> ``fc``).

Implementation (the same on NumPy and CuPy): the rows :math:`M_I = A_{I,:}` (point) or
:math:`M_I = S_I A_{I,:}` (block) are stored as their own CSR matrix, so a half-sweep
is one SpMV :math:`y = M_I x` through the level's SpMV plan and one fused indexed
update :math:`x_I \mathrel{+}= \omega\, s\, (\hat b_I - y)`
(:func:`adaptmg.device.kernels.indexed_jacobi_update`), with :math:`s = D_{II}^{-1}`,
:math:`\hat b = b` (point) or :math:`s = 1`, :math:`\hat b = S b` (block, one SpMV
per call).  A full sweep costs one SpMV with :math:`A` in all, as plain Jacobi.

A splitting of ``N`` nodes for a matrix of ``n = N c`` rows marks nodes of ``c``
rows (pyamg's BSR levels); with ``block=False`` their rows are relaxed point by
point (pyamg's ``cf_jacobi`` on a BSR matrix), with ``block=True`` by node blocks.
pyamg applies a block update as :math:`(1-\omega) x + \omega S (b - (A - D) x)`,
the same as here whenever :math:`S D = I` (not for a singular block that pyamg
replaced by its pseudo-inverse).
"""
from __future__ import annotations

import numbers

import numpy as np

from ..backend import backend_of, is_sparse, to_host
from ..device import kernels as K
from ..fe.csr_ops import csr_diagonal
from .smoother_base import (Smoother, _block_diagonal_csr, _block_inverses, _check_square,
                            _host_diagonal, _note, _validate_sweeps, _validate_vectors)

__all__ = ["CFJacobi"]


def _count(name, v):
    if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 0:
        raise ValueError(f"CFJacobi: {name} must be a non-negative integer, got {v!r}")
    return int(v)


class CFJacobi(Smoother):
    r"""Damped Jacobi over the F points and the C points in turn (module docstring).

    Parameters
    ----------
    A : sparse matrix (SciPy or cupyx)
    splitting : bool array of length ``N`` (``True`` = C point), ``n = N c`` rows of ``A``
    order : "cf" | "fc"
        Which class a sweep relaxes first (pyamg's ``cf_jacobi`` / ``fc_jacobi``).
    f_iterations, c_iterations : int
        Half-sweeps over the F / C points per sweep.
    omega : float
    block : bool
        ``S`` of the ``c x c`` node blocks (``cf_block_jacobi``) instead of point Jacobi.
    Dinv : array ``(N, c, c)``, optional
        The block inverses (pyamg's); default: computed (pseudo-inverse of a singular block).
    """

    name = "cf_jacobi"
    _host_attrs = ("_parts_host", "_S_host")

    def __init__(self, A, splitting, order="cf", f_iterations=1, c_iterations=1, omega=1.0,
                 block=False, Dinv=None, backend=None, dtype=None):
        if order not in ("cf", "fc"):
            raise ValueError(f"CFJacobi: order must be 'cf' or 'fc', got {order!r}")
        split = np.asarray(to_host(splitting))
        if split.ndim != 1 or split.size == 0:
            raise ValueError(f"CFJacobi: splitting must be a non-empty 1-D array, got shape "
                             f"{split.shape}")
        if split.dtype != bool:
            if split.dtype.kind not in "iu" or not np.isin(split, (0, 1)).all():
                raise TypeError(f"CFJacobi: splitting must be boolean (True = C point), got "
                                f"dtype {split.dtype}")
            split = split.astype(bool)
        n = _check_square(A, "CFJacobi")
        if n % split.size:
            raise ValueError(f"CFJacobi: the splitting has {split.size} entries, which does not "
                             f"divide the {n} rows of A")
        self.splitting, self.order, self.block = split, order, bool(block)
        self.node_size = n // split.size
        self.f_iterations = _count("f_iterations", f_iterations)
        self.c_iterations = _count("c_iterations", c_iterations)
        self._Dinv = Dinv
        super().__init__(A, omega, backend, dtype)
        del self._Dinv

    # ------------------------------------------------------------------ set-up
    def _setup_host(self):
        A = self.A_host
        if not is_sparse(A):
            raise TypeError(f"CFJacobi needs an assembled sparse matrix, got {type(A).__name__}")
        A = A.tocsr()
        xp = backend_of(A).xp          # a device matrix (GPU set-up) stays on the device
        c, N = self.node_size, self.splitting.size

        def rows(nodes):
            return xp.asarray((nodes[:, None] * c + np.arange(c)[None, :]).ravel())

        if self._Dinv is not None and not self.block:
            raise ValueError("CFJacobi: Dinv is the block inverses of block=True")
        if self.block and (c > 1 or self._Dinv is not None):
            inv = self._Dinv
            if inv is None:
                inv = _block_inverses(A, c, "CFJacobi", singular="pinv")
            else:
                inv = xp.asarray(to_host(inv)) if xp is np else xp.asarray(inv)
                if inv.shape != (N, c, c):
                    raise ValueError(f"CFJacobi: Dinv must have shape {(N, c, c)}, got "
                                     f"{tuple(inv.shape)}")
            S = _block_diagonal_csr(inv.astype(np.result_type(inv.dtype, A.dtype)))
            self._S_host = S
            M = (S @ A).tocsr()
            s = None
        else:
            d = xp.asarray(_host_diagonal(A, "CFJacobi") if xp is np else csr_diagonal(A))
            if not bool(xp.isfinite(d).all()):
                bad = int(to_host(xp.flatnonzero(~xp.isfinite(d)))[0])
                raise ValueError(f"CFJacobi: non-finite diagonal entry in row {bad}")
            s = xp.zeros_like(d)
            nz = d != 0                      # pyamg: a zero diagonal leaves its row alone
            s[nz] = 1.0 / d[nz]
            self._S_host, M = None, A
        parts = {}
        for key, nodes in (("C", np.flatnonzero(self.splitting)),
                           ("F", np.flatnonzero(~self.splitting))):
            if nodes.size:
                idx = rows(nodes)
                parts[key] = (idx, M[idx], s[idx] if s is not None else None)
        self._parts_host = parts

    def _move(self):
        be, dt = self.backend, self.dtype
        self._parts = {}
        for key, (idx, M, s) in self._parts_host.items():
            Md = be.asmatrix(M, dtype=dt)
            sd = be.asarray(s, dtype=dt) if s is not None else be.xp.ones(idx.shape[0], dt)
            ib = be.asarray(idx)
            self._parts[key] = (ib, K.make_spmv(Md), sd, be.xp.zeros(idx.shape[0], dt))
        if self._S_host is not None:
            self.S = be.asmatrix(self._S_host, dtype=dt)
            self._Splan = K.make_spmv(self.S)

    # ------------------------------------------------------------------ sweeps
    def _order(self, reverse):
        halves = [("C", self.c_iterations), ("F", self.f_iterations)]
        if self.order == "fc":
            halves.reverse()
        seq = [k for k, m in halves for _ in range(m) if k in self._parts]
        return seq[::-1] if reverse else seq

    def _run(self, x, b, sweeps, work, zero_initial, reverse, who):
        sweeps = _validate_sweeps(sweeps)
        _validate_vectors(x, b, self.n, self.dtype, who)
        if zero_initial:
            x.fill(0)
        if sweeps == 0:
            return x
        if self._S_host is not None:             # block: b_hat = S b once per call
            bh = self._scratch(work)
            self._Splan(b, bh, 1.0, 0.0)
        else:
            bh = b
        seq = self._order(reverse)
        w = self.omega
        for _ in range(sweeps):
            for key in seq:
                idx, plan, s, y = self._parts[key]
                plan(x, y, 1.0, 0.0)                           # y = M_I x (old x everywhere)
                K.indexed_jacobi_update(x, idx, s, bh, y, w)   # x_I += omega s (b_hat_I - y)
        return x

    def smooth(self, x, b, sweeps=1, work=None, zero_initial=False):
        """``sweeps`` C/F sweeps in ``order`` on ``A x = b``, in place."""
        return self._run(x, b, sweeps, work, zero_initial, False, "CFJacobi.smooth")

    def smooth_adjoint(self, x, b, sweeps=1, work=None, zero_initial=False):
        """The adjoint sweeps: the same half-sweeps in reverse order (``cf`` <-> ``fc``)."""
        return self._run(x, b, sweeps, work, zero_initial, True, "CFJacobi.smooth_adjoint")

    def __repr__(self):
        n_c = int(self.splitting.sum())
        blk = f", block_size={self.node_size}" if self.block and self.node_size > 1 else ""
        return (f"CFJacobi(order={self.order!r}, f_iterations={self.f_iterations}, "
                f"c_iterations={self.c_iterations}, omega={self.omega:.4g}{blk}, "
                f"C={n_c}/{self.splitting.size}){_note(self)}")
