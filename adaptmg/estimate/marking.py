r"""Marking: which cells to refine, given the cell indicators :math:`\eta_K`.

* :func:`doerfler` (bulk criterion): the smallest set M of cells, largest indicators
  first, with :math:`\sum_{K\in M}\eta_K^2 \ge \theta \sum_K \eta_K^2` (``tie_rtol``: with
  every cell whose :math:`\eta_K^2` is within that relative distance of the set's smallest,
  so that cells tied up to round-off -- a symmetric problem's twins -- are marked together);
* :func:`fixed_fraction`: the given fraction of cells (by count) with the largest
  indicators;
* :func:`mark`: one of the two by name, or ``"uniform"`` (all cells).

Refinement is then ``mesh.refine(marked)``, which closes the marked set under the
2:1 rule.

The indicators may be NumPy or CuPy arrays (e.g. those of a mesh on the GPU); the mask is of
the same module, computed there: a stable sort of :math:`-\eta_K^2`, a cumulative sum and a
``searchsorted`` for Doerfler (one host read of the count), a sort for the fixed fraction.
"""
from __future__ import annotations

import numpy as np

from ..backend import backend_of, is_device_array, stable_argsort


def _check_eta(eta):
    """``eta`` as a float array of its module (NumPy, or CuPy for a device array) and that
    module; one host read of a flag on the device."""
    xp = backend_of(eta).xp if is_device_array(eta) else np
    eta = None if eta is None else xp.asarray(eta)
    if eta is None or eta.ndim != 1 or eta.size == 0:
        raise ValueError(f"eta must be a non-empty 1-D array of cell indicators, got shape "
                         f"{None if eta is None else eta.shape}")
    if not bool(xp.isfinite(eta).all() & (eta >= 0).all()):
        raise ValueError("eta must be finite and non-negative")
    return xp.asarray(eta, dtype=float), xp


def check_tie_rtol(tie_rtol):
    """'' or what is wrong with a ``tie_rtol`` of :func:`doerfler`."""
    if tie_rtol is None or (np.isscalar(tie_rtol) and not isinstance(tie_rtol, (bool, str))
                            and 0 <= tie_rtol < 1):
        return ""
    return f"tie_rtol must be None or a number in [0, 1), got {tie_rtol!r}"


def doerfler(eta, theta=0.5, tie_rtol=None):
    r"""Doerfler (bulk) marking: the smallest set M with
    :math:`\sum_{K\in M}\eta_K^2 \ge \theta \sum_K \eta_K^2` (largest indicators first).
    Returns a boolean mask over the cells.

    ``tie_rtol``: None -- cells tied at the threshold are taken in cell order until the bulk
    is reached; a number :math:`\delta \in [0, 1)` -- every cell with
    :math:`\eta_K^2 \ge (1 - \delta)\, t^*` is marked, :math:`t^*` the smallest
    :math:`\eta^2` of the minimal set: a symmetric problem's twin cells, whose indicators
    differ by round-off only, are marked together, so the marks do not depend on round-off
    (nor on the cell order)."""
    eta, xp = _check_eta(eta)
    if not (np.isscalar(theta) and 0 < theta <= 1):
        raise ValueError(f"theta must lie in (0, 1], got {theta!r}")
    msg = check_tie_rtol(tie_rtol)
    if msg:
        raise ValueError(msg)
    e2 = eta ** 2
    order = stable_argsort(-e2)
    cum = xp.cumsum(e2[order])
    total = cum[-1]
    marked = xp.zeros(eta.size, dtype=bool)
    # one read: the count (0 when every indicator is 0)
    n = int(xp.where(total > 0, xp.searchsorted(cum, theta * total * (1 - 1e-12)) + 1, 0))
    if n == 0:
        return marked
    n = min(n, eta.size)
    if tie_rtol is not None:
        return e2 >= e2[order[n - 1]] * (1 - tie_rtol)
    marked[order[:n]] = True
    return marked


def fixed_fraction(eta, fraction=0.2):
    """Mark the ``fraction`` of cells (by count, at least one) with the largest indicators."""
    eta, xp = _check_eta(eta)
    if not (np.isscalar(fraction) and 0 < fraction <= 1):
        raise ValueError(f"fraction must lie in (0, 1], got {fraction!r}")
    n = max(1, int(np.ceil(fraction * eta.size)))
    order = stable_argsort(-eta)
    marked = xp.zeros(eta.size, dtype=bool)
    marked[order[:n]] = True
    return marked


def mark(eta, strategy="doerfler", param=0.5, tie_rtol=None):
    """``doerfler(eta, param, tie_rtol)``, ``fixed_fraction(eta, param)`` or ``"uniform"`` (all cells)."""
    if strategy == "doerfler":
        return doerfler(eta, param, tie_rtol)
    if strategy == "fixed_fraction":
        return fixed_fraction(eta, param)
    if strategy == "uniform":
        e, xp = _check_eta(eta)
        return xp.ones(e.size, dtype=bool)
    raise ValueError(f"strategy must be 'doerfler', 'fixed_fraction' or 'uniform', got {strategy!r}")
