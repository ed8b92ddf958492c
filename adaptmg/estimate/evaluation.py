r"""Values, gradients and Hessians of a finite element function at reference points of cells.

For cells K with the multilinear (Q1) geometry map :math:`x = F_K(\hat x)`, Jacobian
:math:`J = \hat\nabla F_K` and a function :math:`u_h|_K = \sum_j U_j \hat\varphi_j \circ F_K^{-1}`
of the space's element, :func:`evaluate` returns at reference points :math:`\hat x`

.. math::

    x = F_K(\hat x), \qquad u_h = \sum_j U_j \hat\varphi_j, \qquad
    \nabla u_h = J^{-T} \sum_j U_j \hat\nabla\hat\varphi_j, \qquad
    \nabla^2 u_h = J^{-T} \Big(\sum_j U_j \hat\nabla^2\hat\varphi_j\Big) J^{-1}.

The Hessian formula is exact on parallelogram / parallelepiped cells; on a non-affine
multilinear map the curvature term of :math:`F_K` is dropped.  The reference points are
either shared by all cells (``(m, d)``, cell quadrature) or given per cell
(``(n, m, d)``, points on faces seen from a neighbour).

The estimators use the *cells-last* variant :func:`point_fields`: the basis is tabulated
once per reference point set (:func:`ref_tables`, memoised) and every quantity is one
matrix product of a table with the gathered nodal data, e.g.
:math:`J_{a b}(\hat x_q) = \sum_v \partial_b\hat N_v(\hat x_q)\, X_{v a}` for all cells at
once; arrays are laid out as ``(components..., m, n)`` (points, then cells last), so that
the cofactor inverse and the chain rule are element-wise operations on contiguous
``(m, n)`` blocks (array operations only, no loop over cells, so that it can run on CuPy).

The cells-last functions (:func:`gather_cells`, :func:`point_fields`, :func:`inverse_cofactor`,
:func:`laplacian`, :func:`hessian`) work on NumPy or CuPy arrays alike (the array module is
taken from the data, :func:`array_module`); the tables are computed with NumPy and moved to
the device with :func:`tables_on`.  :func:`serial_chunk` sizes chunks for the host's caches
and BLAS, :func:`device_chunk` for the GPU (larger, bounded by memory).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..backend import constant, is_device_array
from ..device.index_kernels import grouped_table_product
from ..fe.element import LagrangeQ, lagrange_1d, lagrange_1d_derivative
from ..fe.geometry import _det_inv


@dataclass
class PointValues:
    """Geometry and u_h at m points of each of n cells (c components, dimension d)."""
    x: np.ndarray        # (n, m, d) physical points
    J: np.ndarray        # (n, m, d, d)
    detJ: np.ndarray     # (n, m)
    invJ: np.ndarray     # (n, m, d, d)
    u: np.ndarray        # (n, m, c)
    grad: np.ndarray     # (n, m, c, d)
    hess: np.ndarray | None = None   # (n, m, c, d, d)


def _second_derivatives_1d(nodes, x):
    """l_i''(x) of the 1-D Lagrange basis, shape (len(x), len(nodes))."""
    out = np.zeros((x.size, nodes.size))
    for i in range(nodes.size):          # loop over the k+1 basis functions only
        others = np.delete(nodes, i)
        c = np.poly(others) / np.prod(nodes[i] - others)
        out[:, i] = np.polyval(np.polyder(c, 2), x) if c.size > 2 else 0.0
    return out


def reference_hessians(el: LagrangeQ, xi):
    """Reference Hessians d^2 phi_j / dxi_a dxi_b, shape (nq, nloc, d, d)."""
    d, mi = el.dim, el.multi_index
    v = [lagrange_1d(el.nodes_1d, xi[:, a])[:, mi[:, a]] for a in range(d)]
    d1 = [lagrange_1d_derivative(el.nodes_1d, xi[:, a])[:, mi[:, a]] for a in range(d)]
    d2 = [_second_derivatives_1d(el.nodes_1d, xi[:, a])[:, mi[:, a]] for a in range(d)]
    out = np.empty((xi.shape[0], el.num_local, d, d))
    for a in range(d):
        for b in range(d):
            g = np.ones((xi.shape[0], el.num_local))
            for e in range(d):
                if a == b == e:
                    g = g * d2[e]
                elif e == a or e == b:
                    g = g * d1[e]
                else:
                    g = g * v[e]
            out[:, :, a, b] = g
    return out


def basis_tables(space, xi):
    """Q1 values/gradients and element values/gradients at points xi (..., d)."""
    d = space.dim
    pts = xi.reshape(-1, d)
    q1, el = LagrangeQ(1, d), space.element
    lead = xi.shape[:-1]
    nv, nl = q1.num_local, el.num_local
    return (q1.values(pts).reshape(lead + (nv,)), q1.gradients(pts).reshape(lead + (nv, d)),
            el.values(pts).reshape(lead + (nl,)), el.gradients(pts).reshape(lead + (nl, d)))


def evaluate(space, U, cells, xi, hessian=False, tables=None) -> PointValues:
    """u_h, grad u_h (and the affine Hessian) at reference points xi: shared (m, d) or per cell
    (n, m, d); ``U`` the nodal values (num_nodes, c); ``tables`` optionally gives the per-cell
    basis tables of :func:`basis_tables`."""
    mesh, d = space.mesh, space.dim
    shared = xi.ndim == 2
    n = cells.size
    m = xi.shape[-2]
    pts = xi if shared else xi.reshape(-1, d)
    q1 = LagrangeQ(1, d)
    el = space.element
    X = mesh.points[mesh.cells[cells]]                          # (n, nv, d)
    Uc = U[space.cell_dofs[cells]]                               # (n, nloc, c)
    if tables is not None and not shared:
        N, dN, phi, dphi = tables                                # (n, m, ...) per-cell tables
    elif shared:
        N, dN = q1.values(pts), q1.gradients(pts)                # (m, nv), (m, nv, d)
        phi, dphi = el.values(pts), el.gradients(pts)
    else:
        N, dN, phi, dphi = basis_tables(space, xi)
    # batched matmuls: faster than the equivalent einsums for these tiny blocks
    x = np.matmul(N, X)                                          # (n, m, d)
    J = np.matmul(X.transpose(0, 2, 1)[:, None], dN)             # J[n,m,a,b] = sum_v X[n,v,a] dN[m,v,b]
    u = np.matmul(phi, Uc)                                       # (n, m, c)
    gref = np.matmul(Uc.transpose(0, 2, 1)[:, None], dphi)       # reference gradient of u_h (n, m, c, d)
    detJ, invJ = _det_inv(J)            # explicit cofactor formulas (np.linalg.inv is slow on 2x2 stacks)
    if not (detJ > 0).all():
        raise ValueError("non-positive Jacobian determinant at an estimator quadrature point")
    grad = np.einsum("nmba,nmcb->nmca", invJ, gref)   # J^{-T} reference gradient
    hess = None
    if hessian:
        if shared:
            Hh = reference_hessians(el, pts)
            Hr = np.einsum("mibe,nic->nmcbe", Hh, Uc)
        else:
            Hh = reference_hessians(el, pts).reshape(n, m, -1, d, d)
            Hr = np.einsum("nmibe,nic->nmcbe", Hh, Uc)
        hess = np.einsum("nmba,nmcbe,nmef->nmcaf", invJ, Hr, invJ, optimize=True)
    return PointValues(x, J, detJ, invJ, u, grad, hess)


# ---------------------------------------------------------------------------------------------
# cells-last evaluation with tables shared by all cells (the estimators' fast path)

@dataclass(frozen=True)
class RefTables:
    """Q1 (geometry) and element tables at m shared reference points, as left factors.

    Row ``b*m + q`` of ``dN``/``dphi`` holds the derivative in direction b at point q, row
    ``(b*d + e)*m + q`` of ``hess`` the second derivative in directions b, e."""
    N: np.ndarray        # (m, nv)
    dN: np.ndarray       # (d*m, nv)
    phi: np.ndarray      # (m, nloc)
    dphi: np.ndarray     # (d*m, nloc)
    hess: np.ndarray     # (d*d*m, nloc)


_TABLES: dict = {}


def ref_tables(element, xi) -> RefTables:
    """:class:`RefTables` of ``element`` (a LagrangeQ) at the points xi (m, d), memoised."""
    xi = np.ascontiguousarray(xi, dtype=np.float64)
    key = (type(element).__name__, element.degree, element.dim, xi.shape, xi.tobytes())
    hit = _TABLES.get(key)
    if hit is None:
        q1 = LagrangeQ(1, element.dim)

        def rows(g):                                   # (m, nloc, d...) -> (d...*m, nloc)
            k = g.ndim - 2
            return np.ascontiguousarray(np.moveaxis(g, 1, -1).transpose(
                tuple(range(1, 1 + k)) + (0, k + 1)).reshape(-1, g.shape[1]))
        hit = RefTables(q1.values(xi), rows(q1.gradients(xi)), element.values(xi),
                        rows(element.gradients(xi)), rows(reference_hessians(element, xi)))
        if len(_TABLES) > 256:
            _TABLES.clear()
        _TABLES[key] = hit
    return hit


_GEMM_SERIAL = 1 << 18     # OpenBLAS runs dgemm on the calling thread up to m*n*k = 2^18


def serial_chunk(tab: RefTables, hessian=False, components=1, lo=512, hi=20000):
    """Cells per call of :func:`point_fields` that keep its products below the size where
    OpenBLAS starts threads (memory-bound products with a tiny inner dimension gain nothing
    from threads and slow down on a loaded machine, cf. :func:`adaptmg.fe.geometry.matmul_serial`)."""
    t = tab.hess if hessian else tab.dphi
    work = max(tab.dN.size, t.size * components)
    return int(min(hi, max(lo, _GEMM_SERIAL // max(work, 1))))


def array_module(a):
    """``numpy`` for a host array, ``cupy`` for a device array."""
    if is_device_array(a):
        import cupy
        return cupy
    return np


_DEVICE_TABLES: dict = {}


def tables_on(tab: RefTables, xp) -> RefTables:
    """``tab`` with its arrays on the array module ``xp`` (``tab`` itself for NumPy); device
    copies are memoised per table (and per current device)."""
    if xp is np:
        return tab
    key = (id(tab), int(xp.cuda.runtime.getDevice()))
    hit = _DEVICE_TABLES.get(key)
    if hit is None or hit[0] is not tab:
        if len(_DEVICE_TABLES) > 256:
            _DEVICE_TABLES.clear()
        hit = (tab, RefTables(*(None if getattr(tab, f) is None else constant(getattr(tab, f), xp)
                                for f in ("N", "dN", "phi", "dphi", "hess"))))
        _DEVICE_TABLES[key] = hit
    return hit[1]


DEVICE_CHUNK = 1 << 22       # at most this many cells per call of point_fields on the GPU
DEVICE_FLOATS = 1 << 25      # and at most about this many floats (256 MiB) in its largest array


def device_chunk(tab: RefTables, hessian=False, components=1, dim=None, hi=DEVICE_CHUNK,
                 floats=DEVICE_FLOATS, lo=1024):
    """Cells per call of :func:`point_fields` on the GPU: as many as keep the largest array
    (the Jacobians, d*d*m per cell, or the reference gradients/Hessians times the components)
    below ``floats`` entries, between ``lo`` and ``hi``."""
    d = tab.dN.shape[0] // tab.N.shape[0] if dim is None else dim
    t = tab.hess if hessian else tab.dphi
    work = max(d * tab.dN.shape[0], t.shape[0] * components)
    return int(min(hi, max(lo, floats // max(work, 1))))


def max_vertex_distance(X):
    r"""Largest distance :math:`\max_{i<j} |X_i - X_j|` between two of the k vertices of each
    of n cells or faces, X (d, k, n) (NumPy or CuPy), the squares summed over the d axes in
    order; zeros for k < 2.  On the device all vertex pairs in one array (d, k (k-1) / 2, n)
    (a few kernels); on the host pair by pair into two work vectors of n (the same sums,
    bit for bit: a hex's 28 pairs 6-10x faster than the (3, 28, n) temporaries)."""
    xp = array_module(X)
    d, k, n = X.shape
    if k < 2:
        return xp.zeros(n)
    if xp is np:
        best, s, t = np.zeros(n), np.empty(n), np.empty(n)
        for i in range(k):
            for j in range(i + 1, k):
                np.subtract(X[0, i], X[0, j], out=t)
                np.multiply(t, t, out=s)
                for a in range(1, d):         # loop over the d axes, as below
                    np.subtract(X[a, i], X[a, j], out=t)
                    t *= t
                    s += t
                np.maximum(best, s, out=best)
        return np.sqrt(best)
    i, j = (constant(t, xp) for t in np.triu_indices(k, 1))
    diff = X[:, i] - X[:, j]
    s2 = diff[0] * diff[0]
    for a in range(1, d):                 # loop over the d axes only
        s2 += diff[a] * diff[a]
    return xp.sqrt(s2.max(axis=0))


@dataclass
class CellData:
    """Vertex coordinates ``X`` (d, nv, n) and nodal values ``U`` (c, nloc, n) of n cells."""
    X: np.ndarray
    U: np.ndarray


def gather_cells(space, Ut, cells, points_t=None, cell_nodes=None, cell_dofs=None) -> CellData:
    """Gather the cells' vertices and nodal values; ``Ut`` is the nodal vector as (c, num_nodes)
    and ``points_t`` optionally ``mesh.points.T`` (d, num_nodes) computed once by the caller.
    On the device pass ``points_t``, ``cells`` and the device copies ``cell_nodes`` of
    ``mesh.cells`` and ``cell_dofs`` of ``space.cell_dofs`` too."""
    mesh = space.mesh
    Pt = np.ascontiguousarray(mesh.points.T) if points_t is None else points_t
    cn = mesh.cells if cell_nodes is None else cell_nodes
    cdofs = space.cell_dofs if cell_dofs is None else cell_dofs
    # gathers by ``take`` (a fancy index with a 2-D index array copies element by element:
    # several times slower on the host; the same values)
    return CellData(Pt.take(cn.take(cells, axis=0).T, axis=1), Ut.take(cdofs.take(cells, axis=0).T, axis=1))


def inverse_cofactor(J, check=True):
    """det J (m, n) and J^{-1} (d, d, m, n) of a cells-last stack J (d, d, m, n) (cofactors).

    ``check``: raise :class:`ValueError` where det J <= 0 (on the device the caller may
    check later, :func:`check_determinants`, to save a synchronisation per call)."""
    xp = array_module(J)
    d = J.shape[0]
    inv = xp.empty_like(J)
    if d == 1:
        det = J[0, 0].copy()
        inv[0, 0] = 1.0
    elif d == 2:
        det = J[0, 0] * J[1, 1] - J[0, 1] * J[1, 0]
        inv[0, 0], inv[1, 1] = J[1, 1], J[0, 0]
        xp.negative(J[0, 1], out=inv[0, 1])
        xp.negative(J[1, 0], out=inv[1, 0])
    elif d == 3:
        tmp = xp.empty_like(J[0, 0])
        for r in range(3):                          # inv[s, r] = cofactor(r, s) / det
            r1, r2 = (r + 1) % 3, (r + 2) % 3
            for s in range(3):
                s1, s2 = (s + 1) % 3, (s + 2) % 3
                xp.multiply(J[r1, s1], J[r2, s2], out=inv[s, r])
                inv[s, r] -= xp.multiply(J[r1, s2], J[r2, s1], out=tmp)
        det = J[0, 0] * inv[0, 0]
        det += xp.multiply(J[0, 1], inv[1, 0], out=tmp)
        det += xp.multiply(J[0, 2], inv[2, 0], out=tmp)
    else:
        raise ValueError(f"dimension must be 1, 2 or 3, got {d}")
    if check:
        check_determinants([(det > 0).all()])
    inv /= det
    return det, inv


def check_determinants(flags):
    """Raise :class:`ValueError` unless all of ``flags`` (booleans or 0-d arrays of one
    array module, e.g. ``(detJ > 0).all()`` of several chunks) are true (one sync on a GPU)."""
    if not flags:
        return
    if len(flags) == 1:
        ok = bool(flags[0])
    else:
        xp = array_module(flags[0])
        ok = bool(xp.stack(flags).all()) if xp is not np else all(bool(f) for f in flags)
    if not ok:
        raise ValueError("non-positive Jacobian determinant at an estimator quadrature point")


@dataclass
class Fields:
    """Geometry and u_h at m points of n cells, cells last (see :func:`point_fields`)."""
    detJ: np.ndarray                 # (m, n)
    invJ: np.ndarray                 # (d, d, m, n), invJ[b, a] = (J^{-1})_{ba}
    x: np.ndarray | None = None      # (d, m, n)
    u: np.ndarray | None = None      # (c, m, n)
    grad: np.ndarray | None = None   # (c, d, m, n) physical gradient
    href: np.ndarray | None = None   # (c, d, d, m, n) reference Hessian


def _table_product(tab, name, B, groups=None):
    r"""The product :math:`T B` of the basis table ``name`` (a field of :class:`RefTables`, e.g.
    ``"dN"``, shape (R, k)) with the cells-last data B (..., k, n), shape (..., R, n).

    ``groups`` None: one product with the table of ``tab`` (a :class:`RefTables`).  Otherwise
    ``tab`` is a sequence of :class:`RefTables` of equal shapes and ``groups`` a list of
    ``(start, stop, i)``: the cells start:stop use table ``tab[i]`` (one product per group)."""
    xp = array_module(B)
    if groups is None:
        return xp.matmul(getattr(tab, name), B)
    tables = [getattr(t, name) for t in tab]
    n = B.shape[-1]
    if len(groups) == 1 and groups[0][0] == 0 and groups[0][1] == n:
        return xp.matmul(tables[groups[0][2]], B)
    return grouped_table_product(tables, B, groups)     # one kernel on the device


def point_fields(tab, cd: CellData, *, groups=None, x=False, value=False, grad=False,
                 hessian=False, check=True) -> Fields:
    r"""Evaluate at the points of ``tab`` for the cells of ``cd`` (module docstring):
    :math:`J = \hat\nabla N\,X`, its determinant and inverse always; on request the points
    :math:`x = N X`, values :math:`\phi U`, physical gradients :math:`J^{-T}\hat\nabla\phi U`
    and reference Hessians :math:`\hat\nabla^2\phi\, U` (combine with :func:`hessian`).
    ``tab`` and ``cd`` on the same device (:func:`tables_on`); ``check`` as in
    :func:`inverse_cofactor`.

    ``groups``: the cells use different point sets of m points each, ``tab`` is then a
    sequence of :class:`RefTables` and ``groups`` a list of ``(start, stop, i)`` covering the
    cells of ``cd``: cells start:stop are evaluated with ``tab[i]`` (e.g. faces whose
    neighbours see them at different reference points).  Only the table products run per
    group (:func:`_table_product`); everything else is one array operation for all cells."""
    xp = array_module(cd.X)
    d, nv, n = cd.X.shape
    c = cd.U.shape[0]
    m = (tab if groups is None else tab[0]).N.shape[0]

    def prod(name, B):
        return _table_product(tab, name, B, groups)
    J = prod("dN", cd.X).reshape(d, d, m, n)                  # J[a, b] = dx_a / dxi_b
    det, inv = inverse_cofactor(J, check=check)
    out = Fields(det, inv)
    if x:
        out.x = prod("N", cd.X)                                # (d, m, n)
    if value:
        out.u = prod("phi", cd.U)                              # (c, m, n)
    if grad:
        gref = prod("dphi", cd.U).reshape(c, d, m, n)
        g = xp.empty_like(gref)
        for a in range(d):                                     # (J^{-T} g)_a = sum_b inv[b, a] g_b
            t = inv[0, a] * gref[:, 0]
            for b in range(1, d):
                t += inv[b, a] * gref[:, b]
            g[:, a] = t
        out.grad = g
    if hessian:
        out.href = prod("hess", cd.U).reshape(c, d, d, m, n)
    return out


def laplacian(f: Fields):
    r""":math:`\Delta u_h = \mathrm{tr}(J^{-T} \hat H J^{-1}) = \sum_{b,e} G_{be} \hat H_{be}` with
    :math:`G = J^{-1}J^{-T}` (affine Hessian, module docstring), shape (c, m, n)."""
    inv, H = f.invJ, f.href
    d = inv.shape[0]
    lap = None
    for b in range(d):
        for e in range(b, d):
            G = inv[b, 0] * inv[e, 0]
            for a in range(1, d):
                G += inv[b, a] * inv[e, a]
            t = G * (H[:, b, e] + H[:, e, b]) if e != b else G * H[:, b, b]
            lap = t if lap is None else lap + t
    return lap


def hessian(f: Fields):
    r"""Physical (affine) Hessian :math:`J^{-T}\hat H J^{-1}`, shape (c, d, d, m, n)."""
    inv, H = f.invJ, f.href
    d = inv.shape[0]
    xp = array_module(H)
    T = xp.zeros_like(H)                                       # T[c, b, f] = sum_e H[c, b, e] inv[e, f]
    for b in range(d):
        for g in range(d):
            for e in range(d):
                T[:, b, g] += H[:, b, e] * inv[e, g]
    out = xp.zeros_like(H)
    for a in range(d):
        for g in range(d):
            for b in range(d):
                out[:, a, g] += inv[b, a] * T[:, b, g]
    return out
