r"""Gauss-Seidel-class smoothers that run on the GPU: multicolour (block) GS, SOR, l1-GS.

Lexicographic Gauss-Seidel is sequential.  Its parallel form orders the
unknowns by colour: with a colouring of the (node) graph of ``A``
(:mod:`adaptmg.multilevel.coloring`: rows of one colour are never coupled) and
``C_1, ..., C_K`` the rows of the colours, the *forward* multicolour sweep is

.. math::  \text{for } k = 1..K:\quad
           x_{C_k} \leftarrow x_{C_k} + \omega\, D_{C_k C_k}^{-1}
           \bigl(b_{C_k} - A_{C_k,:}\, x\bigr),

where ``D`` is the diagonal of ``A`` (point GS) or its ``c x c`` node-block
diagonal (block GS, DoF ``c p + j`` = component ``j`` of node ``p``, the
colouring on the node graph, the blocks inverted at setup as in
:class:`~adaptmg.multilevel.smoothers.BlockJacobi`).  Because the rows of
``C_k`` do not read each other, the simultaneous update of a colour *is*
sequential Gauss-Seidel over that colour, and the sweep is exactly
lexicographic (block) Gauss-Seidel / SOR for the matrix permuted into colour
order, ``x <- x + (D/omega + L)^{-1} (b - A x)`` with ``L`` the strictly
block-lower part in that order.  It is not pyamg's lexicographic sweep (other
ordering), but for SPD ``A`` and ``0 < omega < 2`` it has the same properties:
the error propagation ``E_F = I - (D/omega + L)^{-1} A`` is an ``A``-norm
contraction; the *backward* sweep (colours ``K..1``) has
``E_B = I - (D/omega + U)^{-1} A = E_F^*`` (``A``-adjoint); the *symmetric*
sweep is forward then backward, ``E_B E_F``, ``A``-self-adjoint.

Symmetric V-cycles.  :meth:`GaussSeidel.smooth_adjoint` runs the sweep whose
error propagation is the ``A``-adjoint of :meth:`GaussSeidel.smooth`'s
(colour order reversed): pre-smoothing with ``smooth`` and post-smoothing with
``smooth_adjoint`` makes the V-cycle ``A``-self-adjoint (a valid CG
preconditioner) also for a forward sweep.
:class:`~adaptmg.multilevel.MultilevelSolver` calls ``smooth_adjoint`` for
post-smoothing.

Device execution.  One colour is one kernel launch
(:mod:`adaptmg.device.gs_kernels`) over a preallocated index array; the sweep
allocates nothing and never synchronises with the host, so it can be recorded
in a CUDA graph.  On the CPU the same colour updates run with SciPy row
slices prepared at setup.  Measured on an H100 (pyamg SA hierarchy, pyamg's
default smoothers mapped by :func:`adaptmg.from_pyamg`, CUDA graph): V-cycle
with one symmetric multicolour GS sweep pre and post 0.98 ms for 2-D Poisson
1.05M DoFs (damped Jacobi: 0.26 ms), 2.37 ms for 3-D Poisson 2.1M DoFs (Jacobi
0.50 ms); CG iterations 10 / 11 (2-D with Jacobi: 16).  Setup then (host colouring
and row slices) 2.4 s / 15.6 s.  The whole set-up now runs where the matrix lives: for a
cupyx matrix the colouring (same colours as on the host), the inverse (block) diagonal,
the l1 splitting and the colours' CSR row slices
(:func:`~adaptmg.device.gs_kernels.colour_slices`: one gather of all entries into colour
order) are built on the device, and nothing of size ``n`` is copied to the host (the
colour counts and, for a bad matrix, the offending row are read).
``symmetric`` with ``omega = 1`` skips the repeated
update of the turning colour (the second one is a no-op: after the first, the
residual on that colour is zero).  With :data:`adaptmg.device.gs_kernels.BLOCK_LAYOUT`
"split" the plan (:mod:`adaptmg.device.gs_split`, either backend) stores the half-product
(couplings to lower or to higher colours) each update computed and the colour's next
update reads it back: alternating sweeps read half of ``A`` each after the first, and
``smooth(..., residual=r)`` (which the multigrid cycle uses for the restriction when the
smoother ``forms_residual``) forms ``b - A x`` from the stored halves in half a pass.

l1 Gauss-Seidel (hybrid, :class:`L1GaussSeidel`).  The rows are split into
contiguous *partitions* of ``partition_rows`` rows (hypre's processor blocks;
here a GPU-friendly unit).  Inside a partition the sweep is multicolour GS on
the partition's own couplings ``A_in``; couplings to other partitions ``A_off``
are taken Jacobi-wise (values from the start of the half-sweep), and the
diagonal is replaced by the l1 diagonal

.. math::  d_i = a_{ii} + \sum_{j \notin \mathrm{part}(i)} |a_{ij}| .

One forward half-sweep is ``g = b - A_off x`` followed by the colour sweep on
``A_in x = g`` with the diagonal ``D_l1 = diag(d)`` (``omega = 1``), i.e.
``x <- x + M^{-1}(b - A x)`` with ``M = D_l1 + L_in``, ``L_in`` the strictly
lower in-partition part in colour order.  With ``A = D + L_in + L_in^T + A_off``
and ``Delta = D_l1 - D = diag(sum_{j off} |a_ij|)``,

.. math::  M + M^T - A = D + 2\Delta - A_{off} \succeq D + \Delta \succ 0,

since ``|v^T A_off v| <= v^T Delta v`` for the symmetric zero-diagonal
``A_off``.  Hence ``||I - M^{-1}A||_A < 1``: the smoother converges in the
``A``-norm without damping, for any partition (Baker, Falgout, Kolev, Yang,
SISC 33 (2011), the l1 smoothers).  With one partition it is multicolour GS.
"""
from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from ..backend import backend_of, csr_from_arrays, is_sparse
from ..device import kernels as K
from ..device.gs_split import make_colored_sweep
from ..fe.csr_ops import csr_diagonal, csr_entry_rows
from .coloring import color_graph, color_groups
from .smoother_base import Smoother, _block_inverses, _inverse_diagonal as _inverse_of_diagonal, _note, \
    _validate_sweeps, _validate_vectors

__all__ = ["GaussSeidel", "BlockGaussSeidel", "L1GaussSeidel", "SWEEPS"]

SWEEPS = ("forward", "backward", "symmetric")
_ADJOINT = {"forward": "backward", "backward": "forward", "symmetric": "symmetric"}


def _canonical_csr(A, who):
    """``A`` as CSR without duplicates and with sorted columns, on its own backend: a SciPy
    matrix is copied (as before); a cupyx one stays on the device and is copied only when
    it is not canonical (never to the host)."""
    if not is_sparse(A):
        raise TypeError(f"{who} needs an assembled sparse matrix (SciPy or cupyx), "
                        f"got {type(A).__name__}")
    if backend_of(A).is_gpu:
        C = A.tocsr()
        if C is A and not C.has_canonical_format:
            C = C.copy()
    else:
        C = sp.csr_matrix(A, copy=True)
    if not C.has_canonical_format:
        C.sum_duplicates()
    C.sort_indices()
    return C


class GaussSeidel(Smoother):
    r"""Multicolour (block) Gauss-Seidel / SOR: see the module docstring.

    Parameters
    ----------
    A : sparse matrix (SciPy or cupyx), square
    sweep : "symmetric" (default), "forward" or "backward"
    omega : float in (0, 2)
        Relaxation weight: 1 is Gauss-Seidel, other values SOR (forward /
        backward) or SSOR (symmetric).
    block_size : int
        ``c > 1``: block Gauss-Seidel on the ``c x c`` node blocks (DoF
        ``c p + j`` is component ``j`` of node ``p``).
    seed : int
        Seed of the colouring's random priorities (reproducible colouring).
    singular : "raise" (default) or "pinv"
        A zero diagonal entry or a singular node block: ``ValueError`` naming it, or, as
        pyamg's relaxation does, the row is left as it is (``D^{-1}`` entry 0) and a
        singular block gets its pseudo-inverse (:func:`adaptmg.from_pyamg` asks for this).
    backend, dtype : where the sweeps run and in which precision.
    """

    name = "gauss_seidel"
    _host_attrs = ("_Acsr", "_groups", "_inv", "block_size", "sweep", "seed", "singular")

    def __init__(self, A, sweep="symmetric", omega=1.0, block_size=1, seed=0, backend=None,
                 dtype=None, singular="raise"):
        who = type(self).__name__
        if sweep not in SWEEPS:
            raise ValueError(f"{who}: sweep must be one of {SWEEPS}, got {sweep!r}")
        if isinstance(omega, str):
            raise ValueError(f"{who}: omega must be a number in (0, 2) (Gauss-Seidel needs no "
                             f"'auto' damping), got {omega!r}")
        if isinstance(omega, bool) or not np.isscalar(omega) or not (0 < omega < 2):
            raise ValueError(f"{who}: omega must be in (0, 2), got {omega!r}")
        if isinstance(block_size, bool) or not isinstance(block_size, (int, np.integer)) \
                or block_size < 1:
            raise ValueError(f"{who}: block_size must be a positive integer, got {block_size!r}")
        if singular not in ("raise", "pinv"):
            raise ValueError(f"{who}: singular must be 'raise' or 'pinv', got {singular!r}")
        self.singular = singular
        self.sweep = sweep
        self.block_size = int(block_size)
        self.seed = int(seed)
        self.note = None
        super().__init__(A, omega, backend, dtype)

    # ------------------------------------------------------------------ setup
    def _setup_host(self):
        """Colours, inverse (block) diagonal: on ``A``'s backend (the device for a cupyx
        matrix; nothing of size ``n`` comes to the host)."""
        who = type(self).__name__
        A = self._Acsr = _canonical_csr(self.A_host, who)
        c = self.block_size
        if A.shape[0] % c:
            raise ValueError(f"{who}: matrix size {A.shape[0]} is not a multiple of "
                             f"block_size {c}")
        self._groups = color_groups(color_graph(A, c, seed=self.seed))
        self._inv = self._inverse_diagonal(A)

    def _inverse_diagonal(self, A):
        who = type(self).__name__
        if self.block_size > 1:
            if np.dtype(A.dtype).kind == "c":
                raise TypeError(f"{who}: block_size > 1 needs a real matrix, got {A.dtype}")
            return _block_inverses(A, self.block_size, who, self.singular)
        return _inverse_of_diagonal(csr_diagonal(A), who, self.singular)

    def _move(self):
        self._plan = make_colored_sweep(self.A, self._groups, self._inv, self.block_size)

    @property
    def ncolors(self):
        """Number of colours of the node graph (kernel launches per one-way sweep)."""
        return len(self._groups)

    # ----------------------------------------------------------------- sweeps
    def _orders(self, sweep, sweeps):
        """Colour sequence of ``sweeps`` sweeps of kind ``sweep``."""
        fwd = tuple(range(self.ncolors))
        one = {"forward": fwd, "backward": fwd[::-1], "symmetric": fwd + fwd[::-1]}[sweep]
        seq = one * sweeps
        if self.omega == 1.0 and seq:
            # with omega = 1 the residual of a colour is zero right after its update:
            # a second update of the same colour in a row is a no-op
            seq = (seq[0],) + tuple(k for k, prev in zip(seq[1:], seq[:-1]) if k != prev)
        return seq

    @property
    def forms_residual(self):
        """True when :meth:`smooth` forms ``residual = b - A x`` from the half-products its
        plan stored (the split plan, :mod:`adaptmg.device.gs_split`: half a pass over ``A``
        after a sweep that ends backward); the multigrid cycle then takes the restriction's
        residual from the pre-smoothing."""
        return getattr(self._plan, "forms_residual", False)

    def _run(self, x, b, sweep, sweeps, work, zero_initial, who, residual=None):
        sweeps = _validate_sweeps(sweeps)
        _validate_vectors(x, b, self.n, self.dtype, who)
        if zero_initial:
            x.fill(0)
        if residual is not None and self.forms_residual:
            _validate_vectors(residual, b, self.n, self.dtype, who)
            self._plan.sweep(x, b, self.omega, self._orders(sweep, sweeps), zero_initial=zero_initial,
                             residual=residual)
            return x
        self._plan.sweep(x, b, self.omega, self._orders(sweep, sweeps), zero_initial=zero_initial)
        if residual is not None:
            self._Aplan.residual(x, b, residual)
        return x

    def smooth(self, x, b, sweeps=1, work=None, zero_initial=False, residual=None):
        """``sweeps`` multicolour sweeps (of kind ``self.sweep``) on ``A x = b``, in place;
        ``residual`` (a vector or None): also ``residual <- b - A x`` of the result."""
        return self._run(x, b, self.sweep, sweeps, work, zero_initial, f"{type(self).__name__}.smooth",
                         residual)

    def smooth_adjoint(self, x, b, sweeps=1, work=None, zero_initial=False):
        """The ``A``-adjoint of :meth:`smooth` (colour order reversed), for post-smoothing."""
        return self._run(x, b, _ADJOINT[self.sweep], sweeps, work, zero_initial,
                         f"{type(self).__name__}.smooth_adjoint")

    def __repr__(self):
        blk = f"block_size={self.block_size}, " if self.block_size > 1 else ""
        return (f"{type(self).__name__}({blk}sweep={self.sweep!r}, colors={self.ncolors}, "
                f"omega={self.omega:.4g}){_note(self)}")


class BlockGaussSeidel(GaussSeidel):
    """Multicolour block Gauss-Seidel (``block_size`` = components per node): :class:`GaussSeidel`
    with the registry name "block_gauss_seidel"; :func:`adaptmg.multigrid` passes
    ``block_size = space.components``."""

    name = "block_gauss_seidel"


class L1GaussSeidel(GaussSeidel):
    r"""l1 hybrid Gauss-Seidel (multicolour GS inside row partitions, Jacobi between them).

    See the module docstring for the math.  ``partition_rows``: rows per
    partition (contiguous row blocks; default 1024).  ``omega`` (default 1)
    needs no damping for SPD ``A``.  One half-sweep is one fused residual kernel
    (``g = b - A_off x``, into the ``work`` vector) plus one launch per colour.
    """

    name = "l1_gauss_seidel"
    _host_attrs = GaussSeidel._host_attrs + ("_Ain", "_Aoff", "partition_rows")

    def __init__(self, A, sweep="symmetric", omega=1.0, partition_rows=1024, seed=0, backend=None,
                 dtype=None):
        if isinstance(partition_rows, bool) or not isinstance(partition_rows, (int, np.integer)) \
                or partition_rows < 1:
            raise ValueError(f"L1GaussSeidel: partition_rows must be a positive integer, "
                             f"got {partition_rows!r}")
        self.partition_rows = int(partition_rows)
        super().__init__(A, sweep=sweep, omega=omega, block_size=1, seed=seed, backend=backend,
                         dtype=dtype)

    def _setup_host(self):
        """``A_in``, ``A_off`` and the l1 diagonal, on ``A``'s backend (masks of the stored
        entries: row and column partition equal or not)."""
        A = self._Acsr = _canonical_csr(self.A_host, "L1GaussSeidel")
        be = backend_of(A)
        xp, n, P = be.xp, A.shape[0], self.partition_rows
        idx = A.indices.astype(xp.int64)
        rows = csr_entry_rows(A.indptr, idx.shape[0])
        inside = (rows // P) == (idx // P)
        nz = A.data != 0                                  # stored zeros couple nothing

        def part(keep):                                   # the kept entries, compressed
            ptr = xp.concatenate([xp.zeros(1, dtype=xp.int64), xp.cumsum(keep, dtype=xp.int64)])
            return csr_from_arrays(be.sparse, A.data[keep], A.indices[keep], ptr[A.indptr].astype(A.indptr.dtype),
                                   A.shape)
        self._Ain, self._Aoff = part(inside & nz), part(~inside & nz)
        self._groups = color_groups(color_graph(self._Ain, 1, seed=self.seed))
        off = xp.bincount(rows, weights=xp.where(inside, 0, xp.abs(A.data)), minlength=n)
        self._inv = _inverse_of_diagonal(csr_diagonal(A) + off, "L1GaussSeidel", positive=True,
                                         what="l1 diagonal")

    def _move(self):
        be, dt = self.backend, self.dtype
        self._Ain_b = be.asmatrix(self._Ain, dtype=dt)
        self._Aoff_b = be.asmatrix(self._Aoff, dtype=dt)
        self._plan = make_colored_sweep(self._Ain_b, self._groups, self._inv, 1)

    forms_residual = False           # its plan sweeps A_in: the halves are not A's

    def _run(self, x, b, sweep, sweeps, work, zero_initial, who, residual=None):
        sweeps = _validate_sweeps(sweeps)
        _validate_vectors(x, b, self.n, self.dtype, who)
        if zero_initial:
            x.fill(0)
        g = self._scratch(work if work is not residual else None)
        fwd = tuple(range(self.ncolors))
        halves = {"forward": (fwd,), "backward": (fwd[::-1],),
                  "symmetric": (fwd, fwd[::-1])}[sweep]
        for _ in range(sweeps):
            for order in halves:
                K.csr_residual(self._Aoff_b, x, b, g)      # g = b - A_off x (one pass)
                self._plan.sweep(x, g, self.omega, order)
        if residual is not None:
            self._Aplan.residual(x, b, residual)
        return x

    def __repr__(self):
        return (f"L1GaussSeidel(sweep={self.sweep!r}, colors={self.ncolors}, "
                f"partition_rows={self.partition_rows}, omega={self.omega:.4g}){_note(self)}")
