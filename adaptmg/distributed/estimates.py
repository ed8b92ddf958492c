r"""The distributed smoothers' spectral estimates: ``omega = 4 / (3 lambda)`` of the
Jacobi-type smoothers (power iteration on :math:`S A`) and Chebyshev's ``lmax`` (Lanczos on
:math:`D^{-1/2} A D^{-1/2}`), the serial iterations of :mod:`adaptmg.multilevel` with their
inner products summed over the ranks and started from the serial start vector's owned
entries, so every rank gets the serial estimate.

:func:`start_auto_omegas` only *queues* the power iteration where the norms stay on the
device (NCCL transport: the squares summed by an ``ncclAllReduce`` into 0-d device arrays):
the host never waits inside it, and :meth:`PendingOmegas.finish` reads the estimates and
sets the smoothers' ``omega``.  :class:`~.hierarchy.DistributedHierarchy` queues the finest
level's so (twelve products of the largest matrix) and sets up the second finest level
meanwhile on the high-priority stream (:mod:`adaptmg.device.priority`; the levels below it
go beside the finest level's assembly): two H200, 21M DoFs a rank, with all the coarser
levels beside the estimate the set-up per rank went 0.41-0.42 -> 0.39-0.40 s, old and new
code alternated on three machines.
"""
from __future__ import annotations

import numpy as np

from ..backend import to_host
from ..multilevel.chebyshev import lanczos_lambda_max
from ..multilevel.smoother_base import checked_lambdas, power_iterate_many
from ..multilevel.start_vector import start_vector
from .comm import allreduce_sum
from .csr import dots

__all__ = ["auto_omegas", "start_auto_omegas", "PendingOmegas", "lanczos_lambda", "device_norms"]


class PendingOmegas:
    """Estimates of :func:`start_auto_omegas` (with :func:`device_norms`, 0-d device arrays the
    host has not waited for); :meth:`finish` sets the omegas."""

    def __init__(self, pairs, lams):
        self.pairs, self.lams = pairs, lams

    def finish(self):
        """Read the estimates (the host waits for them) and set every smoother's
        ``omega = 4 / (3 lambda)``; a ValueError for an estimate that is not positive."""
        lams = checked_lambdas(self.lams, "distributed smoother")
        for (_, sm), lam in zip(self.pairs, lams):
            sm.omega = 4.0 / (3.0 * lam)
        self.lams = self.pairs = ()


def device_norms(pairs) -> bool:
    """Whether :func:`start_auto_omegas` of ``pairs`` keeps its norms on the device (every
    level's halo exchange by NCCL): then it only queues the iteration."""
    return bool(pairs) and all(A.transport == "nccl" for A, _ in pairs)


def auto_omegas(comm, pairs, iterations=12, seed=0):
    """:func:`start_auto_omegas` and its :meth:`~PendingOmegas.finish` at once."""
    start_auto_omegas(comm, pairs, iterations, seed).finish()


def start_auto_omegas(comm, pairs, iterations=12, seed=0) -> PendingOmegas:
    r"""Queue ``omega = 4 / (3 lambda)`` for the smoothers of the levels ``pairs``
    (``(A, smoother)``, the smoother's ``omega="auto"``), ``lambda`` of
    :meth:`Smoother.lambda_max` distributed: the same power iteration
    (:func:`~adaptmg.multilevel.smoother_base.power_iterate_many`) from the serial start
    vector (its owned entries only, on ``A``'s backend), norms by Allreduce -- on the device
    by NCCL where the halo exchange goes that way (0-d device arrays: the iteration does not
    wait for the device, one read in :meth:`PendingOmegas.finish`), else by MPI on the host
    (then everything is done on return).  Several levels at once: their steps interleaved
    and their norms in one reduction a step, each level's estimate the one it has alone --
    the small levels' steps, bound by the host's launches and the exchanges' latency, run
    while the device works through the large level's (measured on two H200 at 21M DoFs per
    rank: the three local levels' estimates one after the other took 5.1, 5.8 and 37 ms on
    rank 0, together 44 ms against one GPU's 42 ms for its five levels).  A rank without rows
    of a level only joins the reductions.  The caller leaves the levels' matrices and
    smoothers alone until ``finish``."""
    if not pairs:
        return PendingOmegas((), ())
    xp = pairs[0][0].backend.xp       # computed where it is used (bit for bit the host's)
    return PendingOmegas(pairs, _power_iterations(comm, pairs, iterations, seed, xp, device_norms(pairs)))


def _power_iterations(comm, pairs, iterations, seed, xp, on_device):
    vs, applies = [], []
    for A, sm in pairs:
        vs.append(start_vector(A.global_shape[0], seed, rows=A.rows.rows_on(xp), xp=xp))
        S = sm._apply_S if A.rows.n else (lambda u: u)
        applies.append(lambda u, A=A, S=S: S(A @ u))
    if on_device:                      # the squares summed on the device
        red = allreduce_sum(comm, "nccl")

        def norms(us):
            sq = xp.empty(len(us))
            for i, u in enumerate(us):          # (a copy each: no new kernel for a first run)
                sq[i] = xp.dot(u, u)
            r = xp.sqrt(red(sq))
            return [r[i] for i in range(len(us))]
    else:
        def norms(us):
            return [float(np.sqrt(max(d, 0.0))) for d in dots(comm, [(u, u) for u in us])]
    return power_iterate_many(applies, vs, norms, iterations)


def lanczos_lambda(comm, A, dinv, N, steps=20, seed=0):
    """:func:`adaptmg.multilevel.chebyshev.estimate_lambda_max` distributed: the same Lanczos
    iteration (:func:`~adaptmg.multilevel.chebyshev.lanczos_lambda_max`, host vectors) on
    D^{-1/2} A D^{-1/2} from the serial start vector (owned entries), inner products reduced
    by Allreduce; the products on ``A``'s backend (one copy each way per step on the GPU)."""
    be = A.backend
    s = be.asarray(np.sqrt(dinv))
    v0 = start_vector(N, seed, rows=A.rows.rows)

    def allreduce(loc):
        glob = np.empty_like(loc)
        comm.Allreduce(loc, glob)
        return glob
    return lanczos_lambda_max(lambda v: to_host(s * (A @ (s * be.asarray(v)))), v0,
                              int(min(steps, N)), allreduce)
