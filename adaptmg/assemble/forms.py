r"""Vectorised finite element assembly of the standard operators to SciPy CSR.

Notation. :math:`\phi_i` is the (scalar) Lagrange basis of the space, cells are
mapped from :math:`[0,1]^d` by the multilinear map of the mesh vertices
(isoparametric for Q1; for Q2 the DoF nodes are placed by the same map), and
every integral is computed with the tensor Gauss rule of
:mod:`adaptmg.fe.quadrature` (``k + 1`` points per direction unless
``quad_points`` is given):

.. math:: \int_T g\,dx \approx \sum_q w_q\, g(x(\hat x_q)) \det J(\hat x_q).

Each operator is evaluated for all cells at once: geometric factors
(weights x det J x products of :math:`J^{-1}`) of shape (cells, points, ...) are
contracted with precomputed reference tensors in one matrix product per chunk
of cells, giving element matrices (cells, nloc, nloc); these are summed into a
CSR matrix through a precomputed sparsity pattern (:mod:`._sparse`).

Performance choices (measured on a shared 2-core VM, see scripts/bench_assembly.py):

* cells are processed in chunks of about 1 MiB of temporaries, with the product
  buffers allocated once: first-touching fresh memory (page faults) cost more
  than the arithmetic there;
* chunks of parallelograms / parallelepipeds (``affine_mask``) take an affine
  fast path when the integrand is constant in the cell up to the basis functions
  (constant or per-cell coefficients): the factor is evaluated once per cell and
  contracted with :math:`\sum_q w_q T_q`, which gives the same numbers as the
  full rule (it is exact for these integrands); the scalar forms merge runs of up
  to nq such chunks into one (:meth:`_SpaceInfo.affine_group`: the one-point
  geometry keeps the temporaries within budget), which saves per-chunk overhead
  on uniform meshes and changes only round-off (a GEMM of another row count may round differently);
* products run through :func:`~adaptmg.fe.geometry.matmul_serial` (single-threaded
  BLAS blocks).

Layout. A space with c components numbers DoFs as ``node * c + component``.
Scalar operators (mass, stiffness, convection) act component-wise, i.e. they
are :math:`A \otimes I_c`. All matrices are the *unconstrained* global ones over
all DoF nodes, hanging nodes included; constraints are applied elsewhere
(:math:`K = H^T A H`).

Coefficients ``coef`` may be

* a constant (Python/NumPy scalar),
* a per-cell array of shape (num_cells,),
* a callable ``coef(x)`` vectorised over points: ``x`` has shape (..., dim) and
  the result shape (...).
* a per-node array of shape (num_nodes,) (the forms; not ``load``), interpolated in the
  space at the quadrature points.

On a mesh on the GPU the forms compute everything there and return cupyx matrices (the
lumped mass a CuPy array); where array coefficients and callables are evaluated on each
backend, and which copies are made, is said in :mod:`._coefficients`.

Bad input (wrong shapes, non-finite values) raises ``ValueError``/``TypeError``
naming the argument and the shapes involved.
"""
from __future__ import annotations

import functools

import numpy as np

from ..backend import Backend, backend_of, get_backend, is_device_array, is_device_sparse, to_host
from ..fe.element import LagrangeQ
from ..fe.geometry import CellGeometry, affine_mask, jacobian_error, matmul_serial, metric_factor, sym_pairs
from ..fe.quadrature import default_num_points, tensor_gauss
from ._coefficients import coefficient as _coefficient, is_zero as _is_zero
from ._device import MIN_DEVICE_ENTRIES, get_device_pattern
from . import q1_stiffness
from .on_device import device_element_sums, lumped_local, lumped_mass_on_device
from ..fe.sparsity import componentwise, get_pattern
from ..fe.space_xp import kron_identity
from ..threads import default_threads, ordered_map

__all__ = ["mass", "lumped_mass", "stiffness", "convection", "scalar_form", "load"]

_CHUNK_BYTES = 1 << 20   # cells are processed in chunks whose temporaries the allocator can recycle
#: elements with at most this many local nodes (Q1) get the chunks' geometry from a worker
#: thread (``_SpaceInfo.chunks``): there the geometry costs about as much as the element
#: products, where for Q2 the products dominate and the threads only contend for the GIL.
#: Measured on 2 cores (host assembly): Q1 2-D scalar form 1M cells 175 -> 125-132 ms, Q1
#: 3-D stiffness 64^3 154 -> 134 ms, mass 117 -> 89 ms; with a worker for Q2 too, Q2 3-D
#: stiffness 32^3 was 110 -> 127 ms and Q2 2-D 256^2 33 -> 35 ms
PREFETCH_MAX_NLOC = 8
_CONGRUENT_ROWS = 4      # rows of the element-matrix product of a congruent chunk (see _assemble_scalar)


# ----------------------------------------------------------------------------- input checks

class _SpaceInfo:
    """Validated view of a duck-typed space (see the package docstring)."""

    def __init__(self, space, name="space"):
        for attr in ("mesh", "degree", "cell_dofs", "num_nodes"):
            if not hasattr(space, attr):
                raise TypeError(f"{name} must provide .{attr} (got {type(space).__name__})")
        mesh = space.mesh
        self.dim = int(mesh.dim)
        if self.dim not in (2, 3):
            raise ValueError(f"{name}.mesh.dim must be 2 or 3, got {self.dim}")
        be = getattr(mesh, "backend", None)
        self.device = be if be is not None and be.is_gpu else None      # a mesh on the GPU: its arrays
        xp = np if self.device is None else self.device.xp
        self.points, self.cells = xp.asarray(mesh.points, dtype=np.float64), xp.asarray(mesh.cells)
        if self.points.ndim != 2 or self.points.shape[1] != self.dim:
            raise ValueError(f"{name}.mesh.points must have shape (num_nodes, {self.dim}), got {self.points.shape}")
        if self.cells.ndim != 2 or self.cells.shape[1] != 2 ** self.dim:
            raise ValueError(f"{name}.mesh.cells must have shape (num_cells, {2 ** self.dim}), got {self.cells.shape}")
        self.degree = int(space.degree)
        if self.degree not in (1, 2):
            raise ValueError(f"{name}.degree must be 1 or 2, got {space.degree!r}")
        self.components = int(getattr(space, "components", 1))
        if self.components < 1:
            raise ValueError(f"{name}.components must be >= 1, got {self.components}")
        self.num_nodes = int(space.num_nodes)
        self.num_cells = self.cells.shape[0]
        self.cell_dofs = space.cell_dofs if isinstance(space.cell_dofs, np.ndarray) else xp.asarray(space.cell_dofs)
        nloc = (self.degree + 1) ** self.dim
        if self.cell_dofs.shape != (self.num_cells, nloc):
            raise ValueError(f"{name}.cell_dofs must have shape (num_cells, (degree+1)**dim) = "
                             f"({self.num_cells}, {nloc}), got {self.cell_dofs.shape}")
        if not np.issubdtype(self.cell_dofs.dtype, np.integer):
            raise TypeError(f"{name}.cell_dofs must be an integer array, got dtype {self.cell_dofs.dtype}")
        self.num_dofs = self.num_nodes * self.components
        self.element = LagrangeQ(self.degree, self.dim)
        self.nloc = nloc

    def nodal(self, phi):
        """What a per-node coefficient needs: (cell_dofs, num_nodes, phi (nq, nloc))."""
        return self.cell_dofs, self.num_nodes, phi

    def quadrature(self, quad_points):
        n = default_num_points(self.degree) if quad_points is None else int(quad_points)
        return tensor_gauss(self.dim, n)

    def chunk_size(self, xi, per_cell_floats):
        per_cell = max(per_cell_floats, xi.shape[0] * self.dim * self.dim * 4)
        return int(min(max(256, _CHUNK_BYTES // (8 * per_cell)), max(self.num_cells, 1)))

    def affine_group(self, xi, per_cell_floats):
        """How many chunks an all-affine run of cells may merge into one (see :meth:`chunks`):
        at most the number of quadrature points (the geometry there has one point instead of
        nq) and at most what keeps the (cells, per_cell_floats) product within the budget."""
        step = self.chunk_size(xi, per_cell_floats)
        return int(max(1, min(xi.shape[0], (_CHUNK_BYTES // (8 * max(per_cell_floats, 1))) // step)))

    def chunks(self, xi, per_cell_floats, affine=False, group=1):
        """Yield (slice, CellGeometry) over chunks of ``chunk_size`` cells; raise on det J <= 0 after the sweep.

        For Q1 elements on meshes of more than two chunks the geometry is computed by a
        worker thread, up to two chunks ahead of the caller's work
        (:func:`adaptmg.threads.ordered_map`; not with ``ADAPTMG_THREADS=1``): the same
        items in the same order.

        With ``affine=True`` a chunk whose cells are all parallelograms/parallelepipeds
        gets the geometry at the cell centre only (``g.affine = True``, one point): J is
        constant there and the caller contracts with quadrature-summed reference tensors.
        With ``group > 1`` (callers whose buffers hold ``group * chunk_size`` cells, see
        :meth:`affine_group`) ``group`` consecutive chunks that are all affine are yielded
        as one (fewer, larger products; same temporaries, the geometry having one point);
        otherwise they are taken one by one exactly as with ``group=1``.
        """
        if self.device is not None:
            raise ValueError("mesh on the GPU: this form is host code; use mesh.to('cpu')")
        nc = self.num_cells
        step = self.chunk_size(xi, per_cell_floats)
        group = max(1, int(group)) if affine else 1
        starts = range(0, nc, step * group)

        def block(s0):
            return self._chunk_block(s0, step, group, xi, affine)
        # one worker: more did not pay on the H100 host (1M cells: 215 -> 238 ms, and the
        # multigrid set-up's own worker threads slowed down beside them)
        if self.nloc > PREFETCH_MAX_NLOC or default_threads() < 2 or len(starts) <= 2:
            blocks = map(block, starts)
        else:
            blocks = ordered_map(block, starts, workers=1, ahead=2)
        return self._checked(blocks)

    def _checked(self, blocks):
        """The blocks' (slice, geometry) pairs in order; cells with det J <= 0 are collected
        and reported (ValueError) once all blocks are done."""
        bad = None
        for parts in blocks:
            for sl, g in parts:
                if g.bad.any():
                    if bad is None:
                        bad = np.zeros(self.num_cells, dtype=bool)
                    bad[sl] = g.bad
                    continue
                yield sl, g
        if bad is not None:
            raise jacobian_error(bad)

    def _chunk_block(self, s0, step, group, xi, affine):
        """[(slice, CellGeometry)] of the cells from ``s0``: one all-affine group of
        ``group * step`` cells, or ``group`` chunks of ``step`` cells."""
        big = slice(s0, min(s0 + step * group, self.num_cells))
        Xb = np.take(self.points, self.cells[big], axis=0)     # (n, 2^d, d); take: 3x faster than [ ]
        if group > 1 and affine_mask(Xb).all():
            parts = [(big, Xb, True)]
        else:
            parts = [(slice(s, min(s + step, big.stop)), Xb[s - s0:s - s0 + step], None)
                     for s in range(s0, big.stop, step)]
        out = []
        for sl, X, aff in parts:
            if aff is None:
                aff = affine and affine_mask(X).all()
            if aff:
                g = CellGeometry(X, np.full((1, self.dim), 0.5), check=False)
            else:
                g = CellGeometry(X, xi, check=False)
            g.affine = bool(aff)
            out.append((sl, g))
        return out


# ----------------------------------------------------------------------------- reference tensors

def _ref_tables(info, xi):
    phi = info.element.values(xi)          # (nq, nloc)
    dphi = info.element.gradients(xi)      # (nq, nloc, d)
    return phi, dphi


def _square_pattern(info):
    return get_pattern(info.cell_dofs, info.cell_dofs, info.num_nodes, info.num_nodes)


def _assemble_scalar(info, xi, w, factor, Tq, affine_ok, extra=None, device=None, uniform=False,
                     keep=None, device_elements=False, elements=None):
    r"""CSR of the element matrices :math:`K_c = \sum_q F_{c,q,:} T_{q,:,:}` summed over all cells.

    ``factor(sl, g, wdet)`` returns the geometric factor (n, nq, m) of a chunk of n
    cells (``wdet`` = weights x det J), ``Tq`` is the reference tensor (nq, m, nloc*nloc).
    On affine chunks (``affine_ok``: the factor does not vary inside a cell) the factor
    is evaluated once per cell, with ``wdet = det J``, against :math:`\sum_q w_q T_q`.
    Products go into one preallocated buffer (fresh memory per chunk is expensive, see
    :mod:`._sparse`). The matrix is expanded component-wise (A kron I_c) for c > 1.

    ``extra = (cols, Tq_e)`` also returns the matrix of a part of the form from the same
    pass: the factor columns ``cols`` (a slice of the m axis) against ``Tq_e`` (nq, m_e,
    nloc*nloc); the result is then ``(A, A_e)`` on the same sparsity pattern.

    ``device`` (a GPU :class:`~adaptmg.backend.Backend`, see :func:`_assembly_device`):
    pattern and summation on the GPU (:mod:`._device`); the element entries are copied
    up chunk by chunk and the result is the same host CSR, bit for bit.

    ``uniform=True`` (the factor depends on the geometry only: constant coefficients) enables
    the congruent-cell path: on an affine chunk whose cells all have the same Jacobian, bit for
    bit (:meth:`~adaptmg.fe.geometry.CellGeometry.congruent`: structured uniform meshes), the
    factor and the element matrix are computed for its first cell only (the same element-wise
    arithmetic as for every cell) and broadcast; on the GPU the broadcast happens there
    instead of a copy of the chunk's entries. Only the GEMM's rounding may differ (a product
    of a few copies of one row instead of all rows), by at most a few ulps; measured: equal,
    bit for bit, for 2-D Q1/Q2 boxes, 3-D within 1e-16 relative to the largest entry.

    ``keep`` (a GPU backend): return cupyx CSR matrices on it -- summed and built on the
    device without the host round trip when ``device`` is set and the space is scalar, else
    the host result moved there.

    ``device_elements`` (with ``device``; a factor written against the backend of ``wdet``):
    the element matrices too -- and ``extra``'s -- are computed on the device, with the full
    quadrature rule on every cell (:func:`.on_device.element_chunks`, or ``elements``:
    :func:`.on_device.device_element_sums`; summed chunk by chunk): nothing of
    O(cells) is computed on the host or copied up but the mesh itself.  Asked for constant
    coefficients on a host mesh; always taken on a mesh on the GPU, where the coefficients are
    evaluated on the device too (:mod:`._coefficients`).
    """
    nq, m, per = Tq.shape
    device_elements = device_elements or info.device is not None      # a mesh on the GPU: there
    if device is not None:
        pat = get_device_pattern(device, info.cell_dofs, info.cell_dofs, info.num_nodes, info.num_nodes)
        if not device_elements:     # the host's element entries, copied up into one (E,) array
            nent = info.num_cells * per
            data = device.xp.empty(nent)
            data_e = device.xp.empty(nent) if extra is not None else None

        rows = []       # congruent chunks: (destination segment, its element matrix row)

        def add(dst, sl, K):
            seg = dst[sl.start * per:sl.stop * per]
            if K.shape[0] > 1 and K.strides[0] == 0:     # congruent chunk: broadcast on the device
                rows.append((seg.reshape(K.shape[0], per), K[0].copy()))
            else:
                seg.set(np.ascontiguousarray(K).reshape(-1))

        def broadcast_rows():
            # all congruent chunks' rows in one upload (one per chunk cost ~80 us of
            # synchronous copy each on the H100 host), then one broadcast launch per chunk
            if rows:
                up = device.xp.asarray(np.stack([r for _, r in rows]))
                for i, (seg, _) in enumerate(rows):
                    seg[...] = up[i]
                rows.clear()

        def finish(dst):            # dst: summed (device elements) or the (E,) entries
            broadcast_rows()
            summed = dst if device_elements else pat.sum(dst, on_device=True)
            if keep is not None and (info.components == 1 or info.device is not None):
                return kron_identity(device, pat.device_csr(summed), info.components)
            return componentwise(pat.csr(to_host(summed)), info.components)
    else:
        pat = _square_pattern(info)
        data = pat.new_data()
        data_e = pat.new_data() if extra is not None else None
        add = pat.add

        def finish(dst):
            return componentwise(pat.csr(dst), info.components)
    T_full = np.ascontiguousarray(Tq.reshape(nq * m, per))
    if extra is not None:
        cols, Te = extra
        me = Te.shape[1]
        Te_full = np.ascontiguousarray(Te.reshape(nq * me, per))
    if device is not None and device_elements:      # no host chunk loop, no host buffers
        return _finished(finish, *device_element_sums(device, pat, info, xi, w, factor, T_full,
                                                       None if extra is None else (cols, Te_full),
                                                       elements=elements), keep)
    T_aff = np.tensordot(w, Tq, axes=1)
    group = info.affine_group(xi, per) if affine_ok else 1
    step = info.chunk_size(xi, per) * group
    buf = np.empty((step, per))
    if extra is not None:
        Te_aff = np.tensordot(w, Te, axes=1)
        buf_e = np.empty((step, per))
    for sl, g in info.chunks(xi, per, affine=affine_ok, group=group):
        n = g.num_cells
        one = uniform and g.affine and n > 1 and g.congruent()
        if one:                                   # congruent cells: one element matrix for all
            g = g.head(1)
        F = factor(slice(sl.start, sl.start + 1) if one else sl, g, g.detJ if g.affine else g.detJ * w)
        if one:
            # a few copies of the row: a one-row product may take BLAS's GEMV path, whose
            # rounding differs more often from the GEMM kernels of the general path
            F = np.repeat(F, min(n, _CONGRUENT_ROWS), axis=0)
        nf = F.shape[0]
        K = matmul_serial(F.reshape(nf, -1), T_aff if g.affine else T_full, out=buf[:nf])
        add(data, sl, np.broadcast_to(K[:1], (n, per)) if one else K)
        if extra is not None:
            Fe = np.ascontiguousarray(F[:, :, cols]).reshape(nf, -1)
            K = matmul_serial(Fe, Te_aff if g.affine else Te_full, out=buf_e[:nf])
            add(data_e, sl, np.broadcast_to(K[:1], (n, per)) if one else K)
    return _finished(finish, data, data_e if extra is not None else None, keep)


def _finished(finish, data, data_e, keep):
    """``finish`` of the summed entries (and of the extra part's, ``data_e`` not None), each
    matrix on the ``keep`` backend: ``A`` or ``(A, A_e)``."""
    out = tuple(_kept(finish(d), keep) for d in ((data,) if data_e is None else (data, data_e)))
    return out[0] if data_e is None else out


def _kept(M, keep):
    """``M`` on the ``keep`` backend (unchanged when None or already there)."""
    return M if keep is None or is_device_sparse(M) else keep.asmatrix(M)


def _keep_backend(name, device, keep_on_device, info=None):
    """The GPU backend of ``keep_on_device=True`` or of a mesh on the GPU, else None (ValueError without one)."""
    if info is not None and info.device is not None:
        return info.device
    if not keep_on_device:
        return None
    keep = get_backend(device) if isinstance(device, (str, Backend)) else None
    if keep is None or not keep.is_gpu:
        raise ValueError(f"{name}: keep_on_device=True needs a GPU device, got device={device!r}")
    return keep


def _assembly_device(device, info, per_cell):
    """The GPU backend to build the pattern and sums on, or None for the host path.

    ``device``: None / "cpu" (host), "gpu" / "auto" or a :class:`~adaptmg.backend.Backend`.
    Small problems (fewer than ``MIN_DEVICE_ENTRIES`` element entries) stay on the host,
    where they are cheaper than the copies and launches.  A mesh on the GPU: its backend.
    """
    if info.device is not None:
        if device is not None and not get_backend(device).is_gpu:
            raise ValueError(f"device={device!r}, but the mesh lives on the GPU: use mesh.to('cpu')")
        return info.device
    if device is None:
        return None
    if not isinstance(device, (str, Backend)):
        raise TypeError(f"device must be None, 'cpu', 'gpu', 'auto' or a Backend, got {type(device).__name__}")
    be = get_backend(device)
    if not be.is_gpu or info.num_cells * per_cell < MIN_DEVICE_ENTRIES:
        return None
    return be


def _stiffness_tensor(dphi):
    """T[q, p, (i, j)] of the packed symmetric metric pairs p = (b, e) of :func:`sym_pairs`."""
    nq, nloc, d = dphi.shape
    # T[q, (b,e), i, j] = dphi_i,b dphi_j,e (+ the transposed pair for b != e): F is symmetric
    return np.stack([np.einsum("qi,qj->qij", dphi[:, :, b], dphi[:, :, e])
                     + (np.einsum("qi,qj->qij", dphi[:, :, e], dphi[:, :, b]) if b != e else 0.0)
                     for b, e in sym_pairs(d)], axis=1).reshape(nq, -1, nloc * nloc)


def _convection_tensor(phi, dphi):
    """T[q, e, (i, j)] = phi_i dphi_j,e (row i = test function)."""
    nq, nloc = phi.shape
    return np.einsum("qi,qje->qeij", phi, dphi).reshape(nq, dphi.shape[2], nloc * nloc)


def _convection_factor(g, bv, wdet):
    r""":math:`F_{c,q,e} = w_q \det J\, (J^{-1} b)_e` (n, nq, d), on the backend of ``wdet``
    (a host ``bv`` goes to the device with a device geometry)."""
    xp = backend_of(wdet).xp
    bv = xp.broadcast_to(xp.asarray(bv), (g.num_cells, g.num_points, g.dim))
    F = xp.einsum("cqea,cqa->cqe", g.invJ, bv)
    F *= wdet[:, :, None]
    return F


# ----------------------------------------------------------------------------- operators

def mass(space, coef=1.0, *, quad_points=None, device=None, keep_on_device=False):
    r"""Mass matrix :math:`M_{ij} = (\rho\,\phi_j, \phi_i) = \int_\Omega \rho\,\phi_j\phi_i\,dx`.

    ``coef`` (:math:`\rho`) as described in the module docstring. Acts component-wise
    for c > 1. Returns CSR (num_dofs x num_dofs). ``device``, ``keep_on_device``: see
    :func:`scalar_form` (a kept matrix takes the congruent-cell path for constant ``coef``).
    """
    info = _SpaceInfo(space)
    xi, w = info.quadrature(quad_points)
    phi, _ = _ref_tables(info, xi)
    ev, const = _coefficient("coef", coef, info.num_cells, info.dim, nodal=info.nodal(phi))
    T = (phi[:, :, None] * phi[:, None, :]).reshape(len(w), 1, -1)    # (nq, 1, nloc*nloc)

    def factor(sl, g, wdet):
        return wdet * ev(sl, g)
    keep = _keep_backend("mass", device, keep_on_device, info)
    const = keep is not None and const
    return _assemble_scalar(info, xi, w, factor, T, affine_ok=not ev.pointwise,
                            device=_assembly_device(device, info, T.shape[-1]),
                            uniform=const, keep=keep, device_elements=const)


def lumped_mass(space, method="auto", *, quad_points=None):
    r"""Diagonal of the lumped mass matrix (seed 001 eq. 12), 1-D array of length num_dofs.

    ``method="rowsum"``: :math:`m_i = \sum_j (\phi_j, \phi_i) = \int_\Omega \phi_i\,dx`
    (exact row sums of :func:`mass`, because :math:`\sum_j\phi_j = 1`). This is the
    default for Q1, where all :math:`m_i > 0` on cells with det J > 0.

    ``method="hrz"`` (default for Q2): row sums of higher-order elements can be
    zero or negative on general cells, so Q2 uses the diagonal scaling of
    Hinton-Rock-Zienkiewicz: per cell T, :math:`m^T_i = M^T_{ii}\,|T| / \sum_l M^T_{ll}`,
    then summed over cells. Every :math:`m_i > 0` and :math:`\sum_i m_i = |\Omega|`.

    The value of node n is repeated for its c components (DoF n*c + r).  On a mesh on the
    GPU the diagonal is computed there and returned as a CuPy array (:mod:`.on_device`).
    """
    info = _SpaceInfo(space)
    if method == "auto":
        method = "rowsum" if info.degree == 1 else "hrz"
    if method not in ("rowsum", "hrz"):
        raise ValueError(f"method must be 'auto', 'rowsum' or 'hrz', got {method!r}")
    xi, w = info.quadrature(quad_points)
    phi, _ = _ref_tables(info, xi)
    if info.device is not None:                 # a mesh on the GPU: there, a CuPy array
        return lumped_mass_on_device(info.device, info, xi, w, phi, method)
    loc = np.empty((info.num_cells, info.nloc))
    for sl, g in info.chunks(xi, info.nloc):
        loc[sl] = lumped_local(g.detJ * w, phi, method)
    m = np.bincount(info.cell_dofs.reshape(-1), weights=loc.reshape(-1), minlength=info.num_nodes)
    return np.repeat(m, info.components) if info.components > 1 else m


def stiffness(space, coef=1.0, *, quad_points=None, device=None, keep_on_device=False):
    r"""Stiffness (Laplace) matrix :math:`K_{ij} = (\kappa\nabla\phi_j, \nabla\phi_i)`.

    With :math:`G = J^{-1}J^{-T}` the element matrix is
    :math:`K^T_{ij} = \sum_q w_q \kappa_q \det J_q\, \hat\nabla\hat\phi_i^T G_q \hat\nabla\hat\phi_j`,
    computed as one product (cells, nq*d*d) @ (nq*d*d, nloc*nloc).
    ``coef`` (:math:`\kappa`): constant, per-cell (num_cells,) or callable kappa(x).
    Acts component-wise for c > 1. Returns CSR (num_dofs x num_dofs).
    ``device``, ``keep_on_device``: see :func:`scalar_form` (a kept matrix takes the
    congruent-cell path for constant ``coef``); :func:`adaptmg.multigrid` on the GPU passes
    both, so every level is assembled and constrained on the device -- a Q1 space with a
    constant ``coef`` there with its element matrices by one kernel a chunk
    (:mod:`.q1_stiffness`).
    """
    info = _SpaceInfo(space)
    xi, w = info.quadrature(quad_points)
    phi, dphi = _ref_tables(info, xi)
    ev, const = _coefficient("coef", coef, info.num_cells, info.dim, nodal=info.nodal(phi))
    T = _stiffness_tensor(dphi)

    def factor(sl, g, wdet):
        wc = wdet / g.detJ
        wc = wc * ev(sl, g)
        return metric_factor(g.J, g.detJ, wc, packed=True)   # w kappa det J J^{-1} J^{-T}
    keep = _keep_backend("stiffness", device, keep_on_device, info)
    const = keep is not None and const
    # Q1, a constant: the element matrices by one kernel a chunk (their arithmetic in registers)
    q1 = const and q1_stiffness.fits(info, xi.shape[0])
    elements = functools.partial(q1_stiffness.stiffness_chunks, coef=ev(None, None)) if q1 else None
    return _assemble_scalar(info, xi, w, factor, T, affine_ok=not ev.pointwise,
                            device=_assembly_device(device, info, T.shape[-1]),
                            uniform=const, keep=keep, device_elements=const, elements=elements)


def convection(space, b, *, quad_points=None, device=None):
    r"""Convection matrix :math:`C_{ij} = (b\cdot\nabla\phi_j, \phi_i)` (row i = test function).

    ``b`` is a constant vector (dim,), per-cell (num_cells, dim) or a callable
    b(x) -> (..., dim). :math:`C u` is the vector of :math:`(b\cdot\nabla u_h, \phi_i)`.
    Acts component-wise for c > 1. ``device``: see :func:`scalar_form` (a mesh on the GPU:
    computed there, cupyx CSR).
    """
    info = _SpaceInfo(space)
    xi, w = info.quadrature(quad_points)
    d = info.dim
    phi, dphi = _ref_tables(info, xi)
    ev, _ = _coefficient("b", b, info.num_cells, d, tail=(d,), nodal=info.nodal(phi))
    T = _convection_tensor(phi, dphi)

    def factor(sl, g, wdet):
        return _convection_factor(g, ev(sl, g), wdet)
    return _assemble_scalar(info, xi, w, factor, T, affine_ok=not ev.pointwise,
                            device=_assembly_device(device, info, T.shape[-1]),
                            keep=_keep_backend("convection", device, False, info))


def scalar_form(space, *, mass=0.0, diffusion=0.0, convection=None, quad_points=None, return_mass=False,
                device=None, keep_on_device=False):
    r"""Matrix of the combined scalar form :math:`\rho M + K_\kappa + C_b` in one assembly pass.

    Weak form: for trial :math:`u` and test :math:`v`,

    .. math:: a(u, v) = (\rho\,u, v) + (\kappa\nabla u, \nabla v) + (b\cdot\nabla u, v),
              \qquad A_{ij} = a(\phi_j, \phi_i),

    i.e. ``A == mass(space, mass) + stiffness(space, diffusion) + convection(space, convection)``
    (up to rounding) with :math:`\rho` = ``mass``, :math:`\kappa` = ``diffusion`` and
    :math:`b` = ``convection`` (``None``: no convection term). Coefficients as in the
    module docstring: constants, per-cell arrays ((num_cells,), resp. (num_cells, dim)
    for ``convection``) or callables of the points. Terms whose coefficient is zero
    (constant or per-cell) are left out; at least one term must remain.

    Cost: the geometric factors of the terms are concatenated along the middle axis,
    :math:`F = [w\det J\,\rho \mid w\,\kappa\det J\,J^{-1}J^{-T} \mid w\det J\,J^{-1}b]`
    of shape (cells, nq, 1 + d(d+1)/2 + d), against the matching stack of reference
    tensors, so there is one geometry evaluation, one GEMM and one scatter into the
    (memoised) sparsity pattern instead of three. Constant coefficients are folded into
    the reference tensors. Without callable coefficients, parallelogram/parallelepiped
    chunks take the affine path (see :func:`_assemble_scalar`); callables use the full
    quadrature rule.

    ``return_mass=True`` returns ``(A, Mr)`` where ``Mr`` is the matrix of the mass term
    alone, :math:`(\rho u, v)`, from the same pass (one more small product and scatter);
    it needs a nonzero ``mass``. Acts component-wise for c > 1. Returns CSR
    (num_dofs x num_dofs) on the pattern of :func:`mass`.

    ``device="gpu"`` (or a GPU :class:`~adaptmg.backend.Backend`; None/"cpu" = host)
    builds the sparsity pattern and sums the element matrices on the GPU
    (:mod:`adaptmg.assemble._device`: row kernels for the pattern and the sums
    instead of the host row grouping and ``np.add.at``); the element matrices are still
    computed on the host and the result is the same host CSR, bit for bit. Meshes with
    fewer than ``MIN_DEVICE_ENTRIES`` element entries stay on the host.
    ``keep_on_device=True`` (with a GPU ``device``) returns cupyx CSR matrices instead: for a
    scalar space the sums and the index arrays never leave the device (no download of the
    matrix, no upload by the solver later); otherwise, and for small meshes, the host result
    is moved there.  With constant coefficients the element matrices of a kept matrix are
    computed on the device as well (:func:`.on_device.element_chunks`, ``return_mass``
    included): the full quadrature rule on every cell instead of the host's affine and
    congruent-cell shortcuts, so the entries agree with the host path's to a few ulps (not
    bit for bit), and the host does nothing of O(cells) (issue 36: the host chunk loop was
    most of the transport-diffusion assembly's time on the GPU).  On a mesh on the GPU every
    coefficient kind takes that path (callables on CuPy points, arrays moved there once:
    :mod:`._coefficients`) and the result is cupyx CSR.
    """
    info = _SpaceInfo(space)
    xi, w = info.quadrature(quad_points)
    d, nc = info.dim, info.num_cells
    phi, dphi = _ref_tables(info, xi)
    nodal = info.nodal(phi)
    ev_m, const_m = _coefficient("mass", mass, nc, d, nodal=nodal)
    ev_k, const_k = _coefficient("diffusion", diffusion, nc, d, nodal=nodal)
    evs = [ev_m, ev_k]
    if convection is not None:
        ev_b, const_b = _coefficient("convection", convection, nc, d, tail=(d,), nodal=nodal)
        evs.append(ev_b)
    active = [nm for nm, c in (("mass", mass), ("diffusion", diffusion), ("convection", convection))
              if c is not None and not _is_zero(c)]
    if not active:
        raise ValueError("scalar_form: mass, diffusion and convection are all zero (or None); "
                         "give at least one nonzero term")
    if return_mass and "mass" not in active:
        raise ValueError("scalar_form: return_mass=True needs a nonzero mass coefficient, got mass=0")
    nq, nloc = phi.shape
    L = nloc * nloc
    blocks, parts = [], []     # reference tensors (nq, m_t, L) and factor writers of each term
    m = 0

    def add(T, fn):
        nonlocal m
        blocks.append(T)
        parts.append((slice(m, m + T.shape[1]), fn))
        m += T.shape[1]

    if "mass" in active:
        Tm = (phi[:, :, None] * phi[:, None, :]).reshape(nq, 1, L)
        if const_m:
            def fm(sl, g, wdet, out):
                out[..., 0] = wdet                          # host or device arrays
            add(Tm * ev_m(None, None), fm)
        else:
            def fm(sl, g, wdet, out):
                out[..., 0] = wdet * ev_m(sl, g)
            add(Tm, fm)
    if "diffusion" in active:
        Tk = _stiffness_tensor(dphi)
        if const_k:
            Tk = Tk * ev_k(None, None)

        def fk(sl, g, wdet, out):
            wc = wdet / g.detJ                              # quadrature weights (1 on affine chunks)
            if not const_k:
                wc = wc * ev_k(sl, g)
            out[...] = metric_factor(g.J, g.detJ, wc, packed=True)   # w kappa det J J^{-1} J^{-T}
        add(Tk, fk)
    if "convection" in active:
        def fb(sl, g, wdet, out):
            out[...] = _convection_factor(g, ev_b(sl, g), wdet)
        add(_convection_tensor(phi, dphi), fb)

    Tq = np.concatenate(blocks, axis=1)
    fbuf = np.empty(info.chunk_size(xi, L) * nq * m)

    def factor(sl, g, wdet):
        n, nqg = wdet.shape
        if is_device_array(wdet):                   # the device elements' geometry
            F = backend_of(wdet).xp.empty((n, nqg, m))
        else:
            F = fbuf[:n * nqg * m].reshape(n, nqg, m)
        for cols, fn in parts:
            fn(sl, g, wdet, F[:, :, cols])
        return F
    affine_ok = not any(ev.pointwise for ev in evs)
    # constant coefficients: the factor depends on the geometry only (congruent-cell path)
    const = {"mass": const_m, "diffusion": const_k, "convection": convection is not None and const_b}
    uniform = all(const[nm] for nm in active)
    extra = (parts[0][0], blocks[0]) if return_mass else None
    keep = _keep_backend("scalar_form", device, keep_on_device, info)
    # a kept matrix with constant coefficients: the element matrices too on the device
    return _assemble_scalar(info, xi, w, factor, Tq, affine_ok, extra=extra,
                            device=_assembly_device(device, info, L), uniform=uniform,
                            keep=keep, device_elements=keep is not None and uniform)


def load(space, f, *, quad_points=None, device=None):
    r"""Load vector :math:`b_{(i,r)} = (f_r, \phi_i) = \int_\Omega f_r\,\phi_i\,dx`.

    ``f``: a constant (scalar for c = 1, shape (c,) for c components), a per-cell
    array ((num_cells,) or (num_cells, c)), or a callable f(x) with x of shape
    (..., dim) returning (...) for c = 1 or (..., c). Returns a 1-D array of
    length num_dofs (DoF node*c + r).

    ``device`` ("gpu" or a GPU :class:`~adaptmg.backend.Backend`; None/"cpu" = host):
    computed on the device and returned as a CuPy array (:mod:`.on_device`; a callable
    ``f`` gets CuPy point arrays), ready for ``ml.constrain`` and ``ml.solve``.
    """
    info = _SpaceInfo(space)
    c = info.components
    tail = () if c == 1 else (c,)
    xi, w = info.quadrature(quad_points)
    ev, _ = _coefficient("f", f, info.num_cells, info.dim, tail=tail)
    phi, _ = _ref_tables(info, xi)
    if device is not None or info.device is not None:         # a mesh on the GPU: there
        if device is not None and not isinstance(device, (str, Backend)):
            raise TypeError(f"device must be None, 'cpu', 'gpu', 'auto' or a Backend, got {type(device).__name__}")
        be = get_backend(device) if info.device is None else _assembly_device(device, info, 0)
        if be.is_gpu:
            from .on_device import load_on_device
            return load_on_device(be, info, f, xi, w, phi)
    nq = len(w)
    loc = np.empty((info.num_cells, info.nloc, c))
    for sl, g in info.chunks(xi, info.nloc * c):
        wdet = g.detJ * w
        fv = np.broadcast_to(ev(sl, g), wdet.shape + tail).reshape(wdet.shape[0], nq, c)
        loc[sl] = np.einsum("cqr,qi->cir", fv * wdet[:, :, None], phi)
    idx = (info.cell_dofs[:, :, None].astype(np.int64) * c + np.arange(c)).reshape(-1)
    return np.bincount(idx, weights=loc.reshape(-1), minlength=info.num_dofs)
