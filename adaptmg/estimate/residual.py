r"""Residual (Kelly-type) error indicators for scalar elliptic problems and linear elasticity.

For :math:`-\nabla\cdot(k\nabla u) + b\cdot\nabla u + c\,u = f` with a Q_p finite element
solution :math:`u_h` the indicator of a cell K is

.. math::

    \eta_K^2 = h_K^2 \,\| f + \nabla\cdot(k\nabla u_h) - b\cdot\nabla u_h - c u_h\|_K^2
             + \tfrac12 \sum_{F \subset \partial K \setminus \partial\Omega} h_F\,
               \| [\![ k\,\partial_n u_h ]\!] \|_F^2
             + \sum_{F \subset \Gamma_N} h_F \,\| g - k\,\partial_n u_h\|_F^2 ,

:math:`h_K` the cell diameter, :math:`h_F` the face diameter, and the global estimate
:math:`\eta = (\sum_K \eta_K^2)^{1/2}`.  The cell residual uses the Hessian of
:math:`u_h` (:mod:`.evaluation`) and :math:`\nabla\cdot(k\nabla u_h) = k\Delta u_h +
\nabla k\cdot\nabla u_h` (:math:`\nabla k` by central differences when k is a callable
and no ``k_grad`` is given).  The jumps are integrated with Gauss points on conforming
faces and on fine sub-faces (:mod:`.faces`); a sub-face contributes
:math:`\tfrac12 h_F \|[\![k\partial_n u_h]\!]\|_F^2` to both the fine and the coarse cell.

For linear elasticity, :math:`\sigma(u) = 2\mu\varepsilon(u) + \lambda\,\mathrm{tr}\,\varepsilon(u)\,I`,
the flux is :math:`\sigma(u_h) n` and the cell residual :math:`f + \nabla\cdot\sigma(u_h)
= f + \mu\Delta u_h + (\lambda + \mu)\nabla(\nabla\cdot u_h)`.

Everything is vectorised over cells and faces: the loops run over chunks (cache-sized on the
CPU; on the GPU as large as memory allows, so usually one) and, inside an evaluation, over
the few table groups.  The interior faces are sorted into *runs* (:func:`.faces.face_runs`:
faces with the same own local face and the same neighbour point set); all faces of a chunk
are evaluated together, one :func:`.evaluation.point_fields` per side (arrays laid out cells
last) in which only the products with the basis tables run per group -- per local face on
the own side, per run on the neighbour's.  Every interior face is integrated once, on its
fine (or either conforming) side, and its contribution
:math:`\tfrac12 h_F\|[\![k\partial_n u_h]\!]\|_F^2` is added to both cells.

Both estimators take ``backend`` (``"cpu"``, ``"gpu"``, a :class:`adaptmg.backend.Backend`;
None = NumPy).  On the GPU the numeric work runs on CuPy arrays (:class:`_Data`): gathering
the cells' vertices and nodal values, the geometry, gradients and Hessians at the points,
the coefficients, fluxes, jumps, the integrals and the accumulations per cell, and the
interior face topology (:func:`.faces.face_runs`: matching, run grouping, face diameters;
cached per mesh and backend, as the mesh tables, :func:`.faces.mesh_arrays`; past
:data:`DEVICE_FACE_PIECE` faces matched and evaluated in pieces of consecutive cells instead,
not cached: the matching's memory follows the piece); the reference tables are computed on
the host and copied once per call.

``cells=`` (both estimators) computes the indicators of some cells only -- exactly the whole
call's there, 0 elsewhere: their cell residuals and the faces touching them, matched among
two rings of cells around them (:func:`.faces.face_runs` with ``only=``) -- a rank's share of
a mesh that every rank holds (:func:`adaptmg.distributed.adaptive_loop_replicated`).  The result is a NumPy array either
way, unless the mesh itself lives on the GPU (``mesh.to("gpu")``): then its tables are used
where they are and the indicators stay on the device, for :mod:`.marking` and ``refine``.
"""
from __future__ import annotations

import numpy as np

from ..backend import CPU, call_points, get_backend, is_device_array, stable_argsort, to_host
from ..device.index_kernels import ColumnGroups
from ..fe.quadrature import tensor_gauss
from .evaluation import (check_determinants, device_chunk, gather_cells, hessian, laplacian,
                         max_vertex_distance, point_fields, ref_tables, serial_chunk, tables_on)
from .faces import face_diameters, face_quadrature, face_runs, has_face_runs, mesh_arrays, own_face_refs
from .inputs import (check_coefficient, check_space, chunks, coefficient_at,
                     coefficient_gradient, nodal_values)


def cell_diameters(mesh) -> np.ndarray:
    """Diameter h_K of every active cell (largest distance between two of its vertices), an
    array of the mesh's backend."""
    xp = mesh.backend.xp
    return max_vertex_distance(xp.ascontiguousarray(mesh.points.T)[:, mesh.cells.T])   # (d, nv, nc)


def _dot(a, b):
    """sum_i a[i] * b[i] over the (small) leading axis, as element-wise adds."""
    t = a[0] * b[0]
    for i in range(1, len(a)):
        t += a[i] * b[i]
    return t


def _nm(a):
    """Cells-last (k, m, n) -> (n, m, k) view, the layout of user callables."""
    return a.transpose(2, 1, 0)


def _prep(v, be):
    """A coefficient as :func:`_at` reads it on backend ``be``: unchanged on the host (a device
    array copied to the host); on the GPU a scalar constant as a float and an array (constant of
    shape tail, or per cell) on the device, copied once."""
    if v is None or callable(v):
        return v
    if not be.is_gpu:
        return to_host(v) if is_device_array(v) else v
    a = v if is_device_array(v) else np.asarray(v, dtype=float)
    if a.ndim == 0:
        return float(a)
    return be.asarray(a, dtype=float)


def _at(name, v, cells, x, tail=(), xp=np):
    """Coefficient at the points, cells last: a float for a scalar constant, else an array
    broadcastable to tail + (m, n) (``v`` as prepared by :func:`_prep`, on the module ``xp``)."""
    if v is None:
        return 0.0
    if isinstance(v, float):
        return v
    if not callable(v):
        a = xp.asarray(v, dtype=float)
        if a.shape == tuple(tail):
            return float(a) if not tail else a.reshape(a.shape + (1, 1))
        return xp.moveaxis(a[cells], 0, -1)[..., None, :]         # (*tail, 1, n)
    val = coefficient_at(name, v, cells, _nm(x), tail, xp=xp)       # (n, m, *tail)
    return xp.moveaxis(val, (0, 1), (-1, -2))


def _neumann_values(neumann, x, nrm, c, xp=np):
    """Prescribed normal flux g(x, n) (or a constant of shape () or (c,)), shape (c, m, n)."""
    if not callable(neumann):
        return xp.asarray(neumann, dtype=float).reshape(-1, 1, 1)
    m, n = nrm.shape[1:]
    g = call_points(neumann, _nm(x), _nm(nrm), xp=xp)
    if g.shape == (n, m):
        g = g[..., None]
    try:
        g = xp.broadcast_to(g, (n, m, c))
    except ValueError:
        raise ValueError(f"neumann(x, n) must return shape {(n, m)} or {(n, m, c)} for x of shape "
                         f"{(n, m, x.shape[0])}, got {g.shape}") from None
    return g.transpose(2, 1, 0)


def _check_neumann(neumann, neumann_ids, c):
    if neumann is None or callable(neumann):
        if neumann is not None and neumann_ids is None:
            raise ValueError("neumann data given without neumann_ids (the boundary ids it applies to)")
        return
    if neumann_ids is None:
        raise ValueError("neumann data given without neumann_ids (the boundary ids it applies to)")
    a = np.asarray(to_host(neumann))
    if a.dtype.kind not in "fiu" or a.shape not in ((), (c,)):
        raise ValueError(f"a constant neumann datum must be a number{' or of shape (%d,)' % c if c > 1 else ''}, "
                         f"got {a.dtype} array of shape {a.shape}")
    if not np.isfinite(a).all():
        raise ValueError("neumann contains NaN or Inf")


class _Data:
    """The nodal values ``Ut`` (c, num_nodes) and the mesh arrays of an indicator call on its
    backend: on the GPU the points and cell-node tables are copied to the device once per
    mesh (:func:`.faces.mesh_arrays`), the cell-dof table once per call, reference tables
    once per point set (:func:`.evaluation.tables_on`), and the
    Jacobian determinants are checked once at the end (:meth:`check`) instead of per chunk."""

    def __init__(self, space, U, be=CPU):
        self.space, self.be = space, be
        self.xp = xp = be.xp
        self.gpu = be.is_gpu
        mesh = space.mesh
        self.Ut = xp.ascontiguousarray(U.T)
        ma = mesh_arrays(mesh, be)                   # one upload per mesh (cached)
        self.Pt = ma.points_t
        if self.gpu:
            self.cell_nodes = ma.cells
            self.cell_dofs = (self.cell_nodes if space.cell_dofs is mesh.cells
                              else be.asarray(space.cell_dofs))
        else:
            self.cell_nodes, self.cell_dofs = None, None
        self.flags = []

    def array(self, a):
        """A host array on the backend (unchanged on the CPU)."""
        return self.be.asarray(a) if self.gpu else a

    def tables(self, element, xi):
        return tables_on(ref_tables(element, xi), self.xp)

    def chunk(self, tab, hessian=False, components=1):
        """Cells per chunk: :func:`.evaluation.serial_chunk` on the CPU, larger on the GPU."""
        if self.gpu:
            return device_chunk(tab, hessian=hessian, components=components)
        return serial_chunk(tab, hessian=hessian, components=components)

    def fields(self, tab, cells, **kw):
        """:func:`.evaluation.point_fields` of ``cells`` (on the backend) and the gathered data
        (``tab`` a sequence of tables with ``groups=`` in ``kw``: per-group point sets)."""
        cd = gather_cells(self.space, self.Ut, cells, self.Pt, self.cell_nodes, self.cell_dofs)
        ev = point_fields(tab, cd, check=not self.gpu, **kw)
        if self.gpu:
            self.flags.append((ev.detJ > 0).all())
        return ev, cd

    def check(self):
        """Raise if a deferred determinant check failed (one synchronisation)."""
        flags, self.flags = self.flags, []
        check_determinants(flags)


#: on the GPU a call whose wanted cells (the whole mesh, or ``cells=``) have more faces than
#: this (2 d a cell) matches and evaluates its faces in as many equal pieces of consecutive
#: wanted cells as keep a piece below it (the ``cells=`` path per piece: the faces touching
#: it), unless the whole mesh's faces are memoised already: the face matching's transient
#: arrays follow the piece, not the mesh, for 5-15 % more time (:func:`_pieces`)
DEVICE_FACE_PIECE = 1 << 26


def _pieces(n, d):
    """Bounds of the equal pieces of ``n`` wanted cells (dimension ``d``) that keep each below
    :data:`DEVICE_FACE_PIECE` faces: ``[0, n]`` for one."""
    k = -(-n * 2 * d // DEVICE_FACE_PIECE)
    return [(n * i) // k for i in range(k + 1)] if k > 1 else [0, n]


def _cell_selection(cells, nc, be):
    """``cells`` of an indicator call (None, a boolean mask of the ``nc`` cells or cell ids)
    as ``(ids, mask)`` on ``be`` (sorted distinct ids), or ``(None, None)`` for every cell."""
    if cells is None:
        return None, None
    xp = be.xp
    a = be.asarray(cells) if be.is_gpu else np.asarray(to_host(cells))
    if a.dtype == bool:
        if a.shape != (nc,):
            raise ValueError(f"cells as a boolean mask must have shape ({nc},) (one entry a cell), got {a.shape}")
        mask = a
    elif a.dtype.kind in "iu":
        if a.ndim != 1:
            raise ValueError(f"cells must be a boolean mask or a 1-D array of cell ids, got shape {a.shape}")
        if a.size and (int(a.min()) < 0 or int(a.max()) >= nc):
            raise ValueError(f"cells holds ids outside 0 .. {nc - 1}: {int(a.min())} .. {int(a.max())}")
        mask = xp.zeros(nc, dtype=bool)
        mask[a] = True
    else:
        raise TypeError(f"cells must be a boolean mask or integer cell ids, got dtype {a.dtype}")
    return xp.flatnonzero(mask), mask


def _own_side(dat, tabs, groups, cells, need_x):
    """Own side of the faces of ``cells``, evaluated with the own-face tables ``tabs[f]`` of the
    ``groups`` ``(start, stop, f)`` (local face f = 2 axis + side): fields, unit outward normal
    (d, m, n) and surface element (m, n) by Nanson's formula, n = J^{-T} e / |J^{-T} e|,
    e = +-e_axis."""
    ev, _ = dat.fields(tabs, cells, groups=groups, x=need_x, grad=True)
    nvec = dat.xp.empty(ev.invJ.shape[1:])
    for s, e, f in groups:                    # loop over the (at most 2d) local faces only
        # (J^{-T} e_axis)_a = inv[axis, a]
        dat.xp.multiply(ev.invJ[f // 2, ..., s:e], 2.0 * (f % 2) - 1.0, out=nvec[..., s:e])
    norm = dat.xp.sqrt(_dot(nvec, nvec))
    return ev, nvec * (1.0 / norm), ev.detJ * norm


def _clip(groups, sl):
    """The table groups ``(start, stop, i)`` that meet the chunk ``sl``, relative to its start."""
    return [(max(s, sl.start) - sl.start, min(e, sl.stop) - sl.start, i)
            for s, e, i in groups if s < sl.stop and e > sl.start]


def _face_groups(runs):
    """Table groups of the face runs ``(start, stop, face, set)``: the own side's (consecutive
    runs of one local face merged) and the neighbour side's (one per run)."""
    own = []
    for s, e, f, _ in runs:
        if own and own[-1][2] == f and own[-1][1] == s:
            own[-1] = (own[-1][0], e, f)
        else:
            own.append((s, e, f))
    return own, [(s, e, g) for s, e, _, g in runs]


def jump_terms(space, U, flux_n, nq, neumann=None, neumann_ids=None, need_x=False, data=None, partial=False,
               cells=None):
    """Face part of eta_K^2: (1/2) sum h_F ||[flux . n]||^2 (+ Neumann faces).

    ``flux_n(grad, nrm, x, cells)`` maps gradients (c, d, m, n) and unit normals (d, m, n)
    (cells last, x (d, m, n) the points or None) to the normal fluxes (c, m, n); ``neumann``
    is the prescribed normal flux g(x, n) (or a constant) on the faces with ``neumann_ids``.
    Each interior face is integrated once (:func:`.faces.face_runs`) on its own side, with the
    neighbour evaluated at the same points, and the value is added to both cells.  All faces
    (a chunk of them at a time; on the GPU every face in one chunk up to the memory bound of
    :func:`.evaluation.device_chunk`) are evaluated together: one :func:`.evaluation.point_fields`
    per side with the tables of the own local faces and of the neighbour point sets, grouped
    by the runs (only the table products run per run).  Likewise the Neumann faces, sorted
    by their local face.
    ``data``: the :class:`_Data` of the call (default: ``U`` on the host); the result is an
    array of its backend.  ``partial``: the mesh is a piece of a larger one
    (:func:`.faces.face_pairs`).  ``cells``: None, or a boolean mask of the cells (on the
    backend) whose values are wanted: only the faces touching them are matched and evaluated
    (:func:`.faces.face_runs` with ``only=``) and the other cells' entries are 0."""
    mesh, d = space.mesh, space.dim
    c = space.components
    _check_neumann(neumann, neumann_ids, c)
    only, cells = cells, None                 # the subset's mask (``cells`` names a chunk's cells below)
    dat = _Data(space, U) if data is None else data
    xp = dat.xp
    nc = mesh.num_cells
    if dat.gpu and 2 * d * nc > DEVICE_FACE_PIECE and not has_face_runs(mesh, dat.be, partial):
        ids = xp.arange(nc) if only is None else xp.flatnonzero(only)
        bounds = _pieces(ids.size, d)
        if len(bounds) > 2:                   # in pieces (DEVICE_FACE_PIECE): each cell's value from one
            out = xp.zeros(nc)
            for s, e in zip(bounds[:-1], bounds[1:]):
                piece = xp.zeros(nc, dtype=bool)
                piece[ids[s:e]] = True
                out += jump_terms(space, U, flux_n, nq, neumann, neumann_ids, need_x, dat, partial, piece)
            return out
    el = space.element
    fr = face_runs(mesh, backend=dat.be, partial=partial, only=only)      # on the backend (the whole mesh's cached)
    Nf, wf = face_quadrature(d, nq)
    wf = dat.array(wf)
    own = [dat.tables(el, Nf @ R) for R in own_face_refs(d, np.arange(2 * d))]
    out = xp.zeros(nc)
    if fr.runs:
        nbt = [dat.tables(el, Nf @ R) for R in fr.R_sets]
        own_groups, nb_groups = _face_groups(fr.runs)
        fcell, fnb, fh = dat.array(fr.cell), dat.array(fr.nb), dat.array(fr.h)
        val = xp.empty(fr.cell.size)
        for sl in chunks(fr.cell.size, dat.chunk(own[0], components=c)):
            a, b = fcell[sl], fnb[sl]
            # the table of every face on the device (own: its local face; neighbour: its
            # set): the run products there are one kernel each
            ga = ColumnGroups(_clip(own_groups, sl), None if fr.sets is None else fr.face[sl])
            gb = ColumnGroups(_clip(nb_groups, sl), None if fr.sets is None else fr.sets[sl])
            ea, nrm, da = _own_side(dat, own, ga, a, need_x)
            eb, _ = dat.fields(nbt, b, groups=gb, grad=True)
            jump = flux_n(ea.grad, nrm, ea.x, a) - flux_n(eb.grad, nrm, ea.x, b)    # (c, m, n)
            val[sl] = 0.5 * fh[sl] * (wf @ (da * _dot(jump, jump)))
        out += xp.bincount(fcell, weights=val, minlength=nc)
        out += xp.bincount(fnb, weights=val, minlength=nc)
    if neumann_ids is not None:
        cN, fN, _ = mesh.boundary_faces(neumann_ids)
        cNd, fN = dat.array(cN), dat.array(fN)                      # on the backend
        if only is not None:
            keep = xp.flatnonzero(only[cNd])
            cNd, fN = cNd[keep], fN[keep]
        order = stable_argsort(fN)                                  # grouped by local face
        cNd, fN = cNd[order], fN[order]
        if cNd.size == 0:
            return out if only is None else xp.where(only, out, 0.0)
        need_xn = need_x or callable(neumann)
        gconst = None
        if neumann is not None and not callable(neumann):
            gconst = dat.array(np.asarray(to_host(neumann), dtype=float).reshape(-1, 1, 1))
        bounds = to_host(xp.searchsorted(fN, xp.arange(2 * d + 1)))   # 2d + 1 values read
        groups = [(int(bounds[f]), int(bounds[f + 1]), f) for f in range(2 * d) if bounds[f + 1] > bounds[f]]
        hF = face_diameters(mesh, cNd, fN, dat.be)
        valN = xp.empty(cNd.size)
        for sl in chunks(cNd.size, dat.chunk(own[0], components=c)):
            cells = cNd[sl]
            # the local face of every column: one kernel per table product on the device
            ea, nrm, da = _own_side(dat, own, ColumnGroups(_clip(groups, sl), fN[sl]), cells, need_xn)
            r = -flux_n(ea.grad, nrm, ea.x, cells)
            if gconst is not None:
                r = r + gconst
            elif neumann is not None:
                r = r + _neumann_values(neumann, ea.x, nrm, c, xp=xp)
            valN[sl] = hF[sl] * (wf @ (da * _dot(r, r)))
        out += xp.bincount(cNd, weights=valN, minlength=nc)
    return out if only is None else xp.where(only, out, 0.0)


def _resolve(backend, space):
    """The backend of an indicator call: ``backend`` (None: the CPU); for a space on a device
    mesh the mesh's own backend (``backend`` None or a GPU one: the data is there already)."""
    on = space.mesh.backend
    if not on.is_gpu:
        return CPU if backend is None else get_backend(backend)
    if backend is not None and not get_backend(backend).is_gpu:
        raise ValueError(f"the space's mesh lives on the GPU, so the indicators are computed there: "
                         f"backend must be None or 'gpu', got {backend!r}; or use mesh.to('cpu')")
    return on


def _result(space, *arrays):
    """The indicator arrays as returned: NumPy, or for a space on a device mesh arrays of the
    mesh's backend (marked and refined there, no copy)."""
    out = tuple(a if space.mesh.backend.is_gpu else to_host(a) for a in arrays)
    return out if len(out) > 1 else out[0]


def residual_indicators(space, u, *, f=0.0, k=1.0, b=None, c=None, k_grad=None,
                        neumann=None, neumann_ids=None, quad_points=None, parts=False,
                        backend=None, partial=False, cells=None):
    r"""Residual indicators :math:`\eta_K` (module docstring) for a scalar elliptic or
    transport-diffusion problem :math:`-\nabla\cdot(k\nabla u) + b\cdot\nabla u + c u = f`.

    Parameters
    ----------
    space : scalar :class:`~adaptmg.Space` (Q1 or Q2)
    u : full nodal vector (num_dofs,), e.g. ``Constraints.expand(x)`` (numpy or cupy)
    f, k, c : constant, per-cell array (num_cells,) or callable of points (..., d) -> (...)
    b : constant (d,), per-cell (num_cells, d) or callable (..., d) -> (..., d); None = 0
    k_grad : callable (..., d) -> (..., d), gradient of a callable k (default: central differences)
    neumann, neumann_ids : flux data g(x, n) = k du/dn (or a constant) on the boundary faces
        with these ids
    quad_points : Gauss points per direction in the cells (default degree + 2)
    parts : also return (cell residual part, face part) of eta_K^2
    backend : "cpu", "gpu" or a :class:`~adaptmg.backend.Backend`; None = the CPU (NumPy).
        On the GPU the evaluation runs on CuPy arrays (module docstring) and the callables
        get CuPy point arrays; a callable that raises TypeError on them (NumPy-only code) is
        evaluated on the host instead, with a copy of the points and of its values per chunk
        (:func:`adaptmg.backend.call_points`).
    partial : the mesh is a piece of a larger one (a distributed forest's owned leaves and
        ghost layer, :mod:`adaptmg.distributed.adaptive`): interior faces with no neighbour
        in it are left out, so only the cells whose neighbours are all in the piece get their
        full indicator.
    cells : None (every cell), or a boolean mask (num_cells,) or integer ids of the cells whose
        indicators are computed -- exactly those of the whole call, the other entries 0: the
        cell residuals of these cells and the faces touching them only (a rank's share of a
        mesh whole on every rank, :func:`adaptmg.distributed.adaptive_loop_replicated`).

    Returns eta (num_cells,) with :math:`\eta = (\sum_K\eta_K^2)^{1/2}` the global estimate
    -- NumPy arrays (also with ``backend="gpu"``), but for a space on a mesh on the GPU
    (``mesh.to("gpu")``) arrays on the device, computed from the mesh's own arrays (the
    default backend is then the mesh's; ``"cpu"`` is a ValueError).
    """
    check_space(space)
    if space.components != 1:
        raise ValueError(f"residual_indicators is for scalar spaces, got {space.components} components "
                         "(use elasticity_indicators for vector problems)")
    be = _resolve(backend, space)
    U = nodal_values(space, u, backend=be)
    mesh, d = space.mesh, space.dim
    nc = mesh.num_cells
    for name, v in (("f", f), ("k", k), ("c", c)):
        check_coefficient(name, v, nc)
    check_coefficient("b", b, nc, (d,))
    _check_neumann(neumann, neumann_ids, 1)
    ids, sel = _cell_selection(cells, nc, be)
    dat = _Data(space, U, be)
    xp = dat.xp
    f, k, b, c = (_prep(v, be) for v in (f, k, b, c))
    nq = space.degree + 2 if quad_points is None else int(quad_points)
    xi, w = tensor_gauss(d, nq)
    tab = dat.tables(space.element, xi)
    w = dat.array(w)
    need_x = any(callable(v) for v in (f, k, b, c))
    need_grad = callable(k) or b is not None
    cell_part = xp.empty(nc) if ids is None else xp.zeros(nc)
    for sl in chunks(nc if ids is None else ids.size, dat.chunk(tab, hessian=True)):
        cells = xp.arange(sl.start, sl.stop) if ids is None else ids[sl]
        ev, cd = dat.fields(tab, cells, x=need_x, value=c is not None, grad=need_grad, hessian=True)
        h = max_vertex_distance(cd.X)                              # h_K of the chunk's cells
        R = _at("k", k, cells, ev.x, xp=xp) * laplacian(ev)[0]
        R = R + _at("f", f, cells, ev.x, xp=xp)
        G = ev.grad[0] if need_grad else None                       # (d, m, n)
        if callable(k):
            gk = xp.moveaxis(call_points(k_grad, _nm(ev.x), xp=xp), (0, 1), (-1, -2)) if k_grad is not None \
                else _nm(coefficient_gradient(k, _nm(ev.x), 1e-6 * h, xp=xp))
            R = R + _dot(gk, G)
        if b is not None:
            R = R - _dot(_at("b", b, cells, ev.x, (d,), xp=xp), G)
        if c is not None:
            R = R - _at("c", c, cells, ev.x, xp=xp) * ev.u[0]
        cell_part[sl if ids is None else cells] = h ** 2 * (w @ (ev.detJ * R * R))

    def flux_n(grad, nrm, x, cells):
        return _at("k", k, cells, x, xp=xp) * _dot(grad[0], nrm)[None]

    face_part = jump_terms(space, U, flux_n, space.degree + 1, neumann, neumann_ids,
                           need_x=callable(k), data=dat, partial=partial, cells=sel)
    eta = xp.sqrt(cell_part + face_part)
    dat.check()
    if parts:
        return _result(space, eta, cell_part, face_part)
    return _result(space, eta)


def _diagonal_sum(H):
    """sum_s H[s, s] over the two leading axes (H (d, d, ...)), as element-wise adds."""
    t = H[0, 0].copy()
    for s in range(1, H.shape[0]):
        t += H[s, s]
    return t


def elasticity_indicators(space, u, lam, mu, *, f=None, traction=None, neumann_ids=None,
                          quad_points=None, backend=None, cells=None):
    r"""Residual indicators for linear elasticity :math:`-\nabla\cdot\sigma(u) = f`,
    :math:`\sigma = 2\mu\varepsilon + \lambda\,\mathrm{tr}\,\varepsilon\, I` (constant lam, mu):
    :math:`\eta_K^2 = h_K^2\|f + \nabla\cdot\sigma(u_h)\|_K^2 + \frac12\sum h_F\|[\![\sigma n]\!]\|_F^2
    + \sum_{F\subset\Gamma_N} h_F\|t - \sigma n\|_F^2` (``traction`` t(x, n) -> (..., d) or a
    constant (d,), default 0).  ``backend`` and ``cells`` as in :func:`residual_indicators`; the
    result is a NumPy array (on a device mesh an array of its device)."""
    check_space(space)
    d = space.dim
    if space.components != d:
        raise ValueError(f"elasticity_indicators needs space.components == dim == {d}, got {space.components}")
    if not (np.isscalar(lam) and np.isscalar(mu)):
        raise TypeError(f"lam and mu must be constants, got {type(lam).__name__}, {type(mu).__name__}")
    be = _resolve(backend, space)
    U = nodal_values(space, u, backend=be)
    mesh = space.mesh
    nc = mesh.num_cells
    check_coefficient("f", f, nc, (d,))
    _check_neumann(traction, neumann_ids, d)
    ids, sel = _cell_selection(cells, nc, be)
    dat = _Data(space, U, be)
    xp = dat.xp
    f = _prep(f, be)
    nq = space.degree + 2 if quad_points is None else int(quad_points)
    xi, w = tensor_gauss(d, nq)
    tab = dat.tables(space.element, xi)
    w = dat.array(w)
    cell_part = xp.empty(nc) if ids is None else xp.zeros(nc)
    for sl in chunks(nc if ids is None else ids.size, dat.chunk(tab, hessian=True, components=d)):
        cells = xp.arange(sl.start, sl.stop) if ids is None else ids[sl]
        ev, cd = dat.fields(tab, cells, x=callable(f), hessian=True)
        H = hessian(ev)                                            # (c, d, d, m, n)
        lap = _diagonal_sum(H.transpose(1, 2, 0, 3, 4))           # sum_s H[:, s, s]: (c, m, n)
        graddiv = _diagonal_sum(H)                                 # sum_s H[s, s, :]: (c, m, n)
        R = mu * lap + (lam + mu) * graddiv
        if f is not None:
            R = R + _at("f", f, cells, ev.x, (d,), xp=xp)
        cell_part[sl if ids is None else cells] = max_vertex_distance(cd.X) ** 2 * (w @ (ev.detJ * _dot(R, R)))

    def flux_n(grad, nrm, x, cells):
        # sigma n = mu (grad u + grad u^T) n + lam (div u) n
        div = sum(grad[a, a] for a in range(d))                   # (m, n)
        gn = _dot(grad.swapaxes(0, 1), nrm[:, None])                # (grad u) n
        gtn = _dot(grad, nrm[:, None])                              # (grad u)^T n
        return mu * (gn + gtn) + lam * div * nrm

    face_part = jump_terms(space, U, flux_n, space.degree + 1, traction, neumann_ids, data=dat, cells=sel)
    eta = xp.sqrt(cell_part + face_part)
    dat.check()
    return _result(space, eta)
