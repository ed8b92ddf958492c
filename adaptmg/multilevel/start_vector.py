r"""The start vector of the spectral estimates (power iteration, Lanczos) of the set-up.

.. math:: v_i = 2\,2^{-53}\,\big(\mathrm{mix}(i + 1 + s\,c) \gg 11\big) - 1 \in [-1, 1),

where ``mix`` is the SplitMix64 finaliser (multiplications modulo 2^64, xor-shifts)
and ``c`` an odd constant that separates the seeds ``s``.  Only integer operations
and one exact conversion to float64 (an integer below 2^53 times a power of two),
so:

* NumPy and CuPy give the same vector, bit for bit: the estimates, hence the
  smoothers' ``omega``, agree between the CPU and GPU backends;
* entry ``i`` depends on ``i`` only: a rank of :mod:`adaptmg.distributed` evaluates
  its own rows (``rows=``) and gets the serial vector's entries without drawing
  all ``N`` of them;
* on the GPU it is computed where it is used: no host draw and upload of an
  ``n``-vector per level (~20 ms per 1M rows on a slow host).
"""
from __future__ import annotations

import numpy as np

__all__ = ["start_vector"]

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_SEED = 0x632BE59BD9B4E019


def start_vector(n: int, seed: int = 0, *, rows=None, xp=np) -> np.ndarray:
    """Entries ``rows`` (default ``0..n-1``) of the deterministic pseudo-random vector of
    length ``n`` in [-1, 1) (see the module docstring), float64, as an ``xp`` array."""
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
        raise ValueError(f"start_vector: n must be a non-negative integer, got {n!r}")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"start_vector: seed must be a non-negative integer, got {seed!r}")
    if rows is None:
        z = xp.arange(int(n), dtype=np.uint64)
    else:
        rows = xp.asarray(rows)
        if rows.dtype.kind not in "iu":
            raise TypeError(f"start_vector: rows must be integers, got dtype {rows.dtype}")
        if rows.size and (int(rows.min()) < 0 or int(rows.max()) >= n):
            raise ValueError(f"start_vector: rows must lie in [0, {n}), got "
                             f"[{int(rows.min())}, {int(rows.max())}]")
        z = rows.astype(np.uint64)
    z += np.uint64((1 + int(seed) * _SEED) % 2 ** 64)
    z *= _GOLDEN
    z ^= z >> np.uint64(30)
    z *= _M1
    z ^= z >> np.uint64(27)
    z *= _M2
    z ^= z >> np.uint64(31)
    z >>= np.uint64(11)
    v = z.astype(np.float64)
    v *= 2.0 ** -52
    v -= 1.0
    return v
