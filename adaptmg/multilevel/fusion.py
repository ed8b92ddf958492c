r"""Which levels of a :class:`~adaptmg.multilevel.MultilevelSolver` run fused kernels, and the
products those kernels read.

Three switches, each for the levels below a row count (see the solver's docstring for the
measurements behind the defaults):

* ``fuse_below``: one-launch residual ``r = b - A x`` and Jacobi sweeps (flags only);
* ``fuse_transfers_below``: the restricted residual ``R b - (R A) x`` in one launch and, with
  a Jacobi smoother, the correction ``x + P e`` fused into the first post-sweep, reading the
  products :math:`RA = R A` and :math:`AP = A P`;
* ``fuse_presmooth_below``: the pre-smoothing from zero and the restriction of its residual
  as one launch, ``b_c = S b`` with :math:`S = R (I - A G)` (``G b``: the sweeps from zero).

The products cost SpGEMMs at set-up and save a launch or two per level and cycle, so they
pay only over many cycles.  With the solver's ``defer_fused_products`` (default) they are
built on the second :meth:`solve`, or at once for an explicit :meth:`aspreconditioner` /
:meth:`buffered_cycle` (operators that are kept and applied many times) or
:meth:`build_fused_products` -- never inside :meth:`cycle`, which does no set-up work and can
be captured in a CUDA graph --, so a hierarchy that is solved once (an adaptive loop builds
one per mesh) runs the unfused cycle and never pays for them.  Fused and unfused cycles are
the same operator up to round-off.
"""
from __future__ import annotations

import numpy as np

from ..backend import is_device_sparse, to_host
from ..device import kernels as K
from .level import host_csr

__all__ = ["set_fuse_below", "set_fuse_transfers_below", "set_fuse_presmooth_below",
           "build_fused_products", "note_use"]

#: rows below which ``fuse_transfers_below="auto"`` fuses the transfers on the GPU (the
#: defaults of the solver's class attributes of the same names, which the switches read)
FUSE_TRANSFERS_AUTO = 40000
#: ``fuse_presmooth_below="auto"`` on the GPU: levels with fewer rows than this whose ``S``
#: has at most :data:`FUSE_PRESMOOTH_MAX_NNZ` entries
FUSE_PRESMOOTH_AUTO = 40000
FUSE_PRESMOOTH_MAX_NNZ = 2 ** 19


def _limit(name, rows, auto, gpu):
    """The row limit of a ``fuse_*_below`` value (``"auto"``: ``auto`` on the GPU, 0 on the CPU)."""
    if isinstance(rows, str):
        if rows != "auto":
            raise ValueError(f"{name} must be an integer or 'auto', got {rows!r}")
        return auto if gpu else 0
    if isinstance(rows, bool) or not isinstance(rows, (int, np.integer)) or rows < 0:
        raise ValueError(f"{name} must be a non-negative integer or 'auto', got {rows!r}")
    return int(rows)


def set_fuse_below(ml, rows):
    """The one-launch residual / Jacobi kernels on the levels of ``ml`` with fewer than
    ``rows`` rows (see :meth:`~adaptmg.multilevel.MultilevelSolver.set_fuse_below`); then the
    transfer and pre-smoothing switches again (they need it)."""
    _limit("fuse_below", rows, 0, False)            # the same checks as the other switches
    ml.fuse_below = rows
    ml._preconditioners = {}          # they were recorded with the old kernels
    real = ml.dtype.kind == "f"                                              # real kernels
    for lev, d in zip(ml.levels, ml._dev):
        small = ml.backend.is_gpu if rows == "auto" else lev.n < rows
        d.fused = small and K.is_int32_csr(d.A) and real
        sm = d.smoother
        if d.own and hasattr(sm, "fused") and hasattr(sm, "can_fuse"):       # DistCSR: its own kernels
            sm.fused = d.fused or (small and real and bool(getattr(d.A, "fused_kernels", False)))
    set_fuse_transfers_below(ml, ml.fuse_transfers_below)
    set_fuse_presmooth_below(ml, ml.fuse_presmooth_below)


def set_fuse_transfers_below(ml, rows):
    """Mark the fused levels with fewer than ``rows`` rows for the fused transfers; their
    ``R A`` (and ``A P`` for a Jacobi smoother) are built now or, deferred, on the second solve."""
    limit = _limit("fuse_transfers_below", rows, ml.FUSE_TRANSFERS_AUTO, ml.backend.is_gpu)
    ml.fuse_transfers_below = rows
    ml._preconditioners = {}
    for l, (lev, d) in enumerate(zip(ml.levels, ml._dev)):
        d.want_t = bool(l > 0 and d.fused and lev.n < limit and K.is_int32_csr(d.R)
                        and K.is_int32_csr(d.P))
        d.tfused = False
    if ml._fused_products:
        _transfer_products(ml)


def set_fuse_presmooth_below(ml, rows):
    """Mark the fused Jacobi levels (``presmooth`` 1 or 2) with fewer than ``rows`` rows for the
    fused pre-smoothing and restriction; their ``S`` is built now or, deferred, on the second
    solve (``"auto"``: also at most :data:`FUSE_PRESMOOTH_MAX_NNZ` entries in ``S``)."""
    limit = _limit("fuse_presmooth_below", rows, ml.FUSE_PRESMOOTH_AUTO, ml.backend.is_gpu)
    ml._presmooth_max_nnz = ml.FUSE_PRESMOOTH_MAX_NNZ if rows == "auto" else None
    ml.fuse_presmooth_below = rows
    ml._preconditioners = {}
    for l, (lev, d) in enumerate(zip(ml.levels, ml._dev)):
        sm = d.smoother
        d.want_s = bool(l > 0 and d.fused and lev.n < limit and ml.presmooth in (1, 2)
                        and d.own and getattr(sm, "fused", False)
                        and getattr(sm, "defers_last_sweep", False)
                        and K.is_int32_csr(d.R))
        d.sfused = False
    if ml._fused_products:
        _presmooth_products(ml)


def _transfer_products(ml):
    """``R A`` (and ``A P``) of the levels marked for the fused transfers, where missing."""
    for lev, d in zip(ml.levels, ml._dev):
        if not d.want_t:
            continue
        if d.RA is None:
            d.RA = ml._product(lev.R, lev.A)
        sm = d.smoother
        if (d.AP is None and d.own and hasattr(sm, "smooth_corrected")
                and not hasattr(sm, "smooth_adjoint")):
            d.AP = ml._product(lev.A, lev.P)
        d.tfused = K.is_int32_csr(d.RA) and (d.AP is None or K.is_int32_csr(d.AP))


def _presmooth_products(ml):
    """``S = R (I - A G)`` of the levels marked for the fused pre-smoothing, where missing
    (a level whose ``S`` exceeds the ``"auto"`` entry bound is unmarked)."""
    max_nnz = ml._presmooth_max_nnz
    for lev, d in zip(ml.levels, ml._dev):
        if not d.want_s:
            continue
        if d.S is None:         # smoother and presmooth are fixed: S once per level
            sm = d.smoother
            dinv = getattr(sm, "_dinv_host", None)
            if is_device_sparse(lev.A):    # built on the device: S by SpGEMMs there
                A, R = lev.A, (d.R if d.R.dtype == np.float64 else ml.backend.asmatrix(lev.R, np.float64))
                dinv = ml.backend.asarray(sm.dinv if dinv is None else dinv, np.float64)
            else:
                A, R = host_csr(lev.A, copy=False), host_csr(lev.R, copy=False)
                dinv = to_host(sm.dinv if dinv is None else dinv)
            S = K.smooth_restrict_matrix(A, R, dinv, sm.omega, ml.presmooth)
            if max_nnz is not None and S.nnz > max_nnz:
                d.want_s = False            # not moved to the backend: never used
                continue
            d.S = ml._move_matrix(S)
        d.sfused = K.is_int32_csr(d.S) and (max_nnz is None or d.S.nnz <= max_nnz)


def build_fused_products(ml):
    """Build the products of every level marked for fusion now (idempotent)."""
    if ml._fused_products:
        return
    ml._fused_products = True
    # the preconditioners recorded with the unfused cycle go; what solve() noted stays (a
    # large matrix records its CUDA-graph CG on the second solve: solve_driver._graph_cg)
    ml._preconditioners = {k: v for k, v in ml._preconditioners.items()
                           if isinstance(k, tuple) and k[0] == "graph_cg_solves"}
    _transfer_products(ml)
    _presmooth_products(ml)


def note_use(ml):
    """A solve with the hierarchy: the second one builds the deferred products."""
    if ml._fused_products:
        return
    if ml._used:
        build_fused_products(ml)
    ml._used = True
