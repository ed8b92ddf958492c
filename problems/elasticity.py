r"""Linear elasticity on adaptively refined hexahedral meshes (seed 001 §5.2, Tables 2-3).

Problem.  On :math:`\Omega = (0,1)^3`, :math:`I = (0, 2.5]`:
:math:`\partial_t^2 u - \mathrm{div}\,\sigma(u) = f`, :math:`f = (0,-1,0)`,
:math:`\sigma(u) = \lambda\,\mathrm{tr}\,\varepsilon(u) I + 2\mu\varepsilon(u)`,
:math:`\lambda = 8\cdot10^4`, :math:`\mu = 2\cdot10^4`, homogeneous Dirichlet
conditions and zero initial data, written as the first-order system (eqs. 6-7)

.. math::

    \partial_t u - v = 0, \qquad \partial_t v - \mathrm{div}\,\sigma(u) = f .

Discretisation.  One Q1 space with 6 components per node (DoF ``6 node + c``,
``c = 0..2`` displacement u, ``c = 3..5`` velocity v, Gascoigne's interleaved
block layout) and backward Euler with step dt: with the scalar mass matrix M
and the elasticity matrix A (:func:`adaptmg.assemble.elasticity`),

.. math::

    \begin{pmatrix} M & -dt\,M \\ dt\,A & M \end{pmatrix}
    \begin{pmatrix} u^k \\ v^k \end{pmatrix}
    = \begin{pmatrix} M u^{k-1} \\ M v^{k-1} + dt\,F \end{pmatrix},
    \qquad F_{(i,r)} = (f_r, \phi_i).

The matrix (:func:`system_matrix`) is non-symmetric; it is solved by GMRES
preconditioned with a V-cycle of geometric multigrid on the global-coarsening
hierarchy (rediscretised on every level) with the block-Jacobi smoother over the
6x6 node blocks (seed 001 §4.1.4), coarse problem solved directly.

Right-hand side on the device.  With the hanging-node matrix :math:`H = H_s \otimes I_6`
and the free mask Z, the constrained right-hand side is
:math:`Z H^T((M \otimes I_6) H x^{k-1} + dt F) = z \odot \mathrm{vec}(M_c X^{k-1}) + dt F_c`
with the scalar :math:`M_c = H_s^T M H_s`, :math:`X` the solution viewed as a
(nodes x 6) array and :math:`F_c = Z H^T F` formed once at init: one SpMM with
6 columns and one fused kernel per step
(:func:`adaptmg_problems._stepping.constrain_combine`), on the backend's arrays.

Meshes (:func:`make_mesh`).  Level 1 is the 8x8x8 box; level l >= 2 refines
every active cell of level l-1 contained in the region
``{x <= a}`` (face), ``{x, y <= a}`` (edge) or ``{x, y, z <= a}`` (vertex),
``a = 2^-(l-1)``, followed by the 2:1 closure of :meth:`adaptmg.Mesh.refine`.
"""
from __future__ import annotations


import numpy as np
import scipy.sparse as sp

from adaptmg import Mesh, Space, assemble, multigrid
from adaptmg.backend import get_backend, to_host
from adaptmg.fe.csr_ops import NodeBlockMatrix, congruence_with_constraints

from ._stepping import SpMVOperator, constrain_combine, gmres_step, time_steps
from ._timing import Timer, format_table, progress

__all__ = ["LAMBDA", "MU", "F", "CASES", "make_mesh", "mesh_stats", "system_matrix", "block_system", "run",
           "COLUMNS"]

LAMBDA = 8.0e4
MU = 2.0e4
F = (0.0, -1.0, 0.0)
CASES = ("face", "edge", "vertex")
COLUMNS = [("case", "case"), ("level", "level"), ("nodes", "nodes"), ("hanging_pct", "hanging %", ".2f"),
           ("hanging_edge_pct", "edge-hanging %", ".2f"),
           ("dofs", "DOFs"), ("init", "init"), ("rhs", "rhs"), ("solve", "solve"), ("sum", "sum"),
           ("iters_max", "it/step max")]


def _region_axes(case: str) -> int:
    try:
        return {"face": 1, "edge": 2, "vertex": 3}[case]
    except KeyError:
        raise ValueError(f"case must be one of {CASES}, got {case!r}") from None


def make_mesh(case: str, level: int, coarse=(8, 8, 8), backend="cpu") -> Mesh:
    """The adaptive mesh of ``level`` (1 = the coarse ``coarse`` box) refined towards a face,
    an edge or a vertex of the unit cube (see the module docstring); ``backend="gpu"``: built
    and refined on the device (the marks from the mesh's own arrays)."""
    k = _region_axes(case)
    if not isinstance(level, (int, np.integer)) or level < 1:
        raise ValueError(f"level must be an integer >= 1, got {level!r}")
    coarse = np.asarray(coarse, dtype=int)
    if coarse.shape != (3,) or np.any(coarse < 1):
        raise ValueError(f"coarse must be 3 positive cell counts, got {coarse!r}")
    # The level-1 box is built by refining a coarser box as often as all counts stay
    # integers (8x8x8 = 2x2x2 refined twice), so that the global-coarsening hierarchy
    # reaches a tiny coarse problem (direct solve on 162 DoFs instead of 4374).
    pre = 0
    while np.all(coarse % 2 == 0) and np.all(coarse > 2):
        coarse //= 2
        pre += 1
    mesh = Mesh.box([0.0] * 3, [1.0] * 3, coarse.tolist(), backend=backend)
    for _ in range(pre):
        mesh = mesh.refine()
    for l in range(2, int(level) + 1):
        a = 2.0 ** -(l - 1)
        X = mesh.points[mesh.cells]                        # (nc, 8, 3)
        inside = (X[:, :, :k].max(axis=1) <= a + 1e-12).all(axis=1)
        mesh = mesh.refine(inside)
    return mesh


def mesh_stats(mesh: Mesh) -> dict:
    """Nodes, hanging nodes, cells, and DoFs of the 6-component system.

    ``hanging_pct``: all hanging nodes (edge midpoints and face centres of coarse
    neighbours) in percent of the nodes; ``hanging_edge_pct``: only those on coarse
    edges (2 parents) -- the count of the paper's Table 2, which it reproduces
    (face 4.92 / 6.10 %, edge 7.66 / 10.3 / 11.4 / 11.9 / 12.2 %, ...).
    """
    nn, nh = mesh.num_nodes, mesh.num_hanging_nodes
    ne = int((mesh.hanging_parents[:, 2] < 0).sum()) if nh else 0
    return dict(nodes=nn, hanging=nh, hanging_pct=100.0 * nh / nn, hanging_edge=ne,
                hanging_edge_pct=100.0 * ne / nn, cells=mesh.num_cells, dofs=6 * nn)


def _system_from_blocks(Ms, A3, dt: float) -> sp.csr_matrix:
    r"""Interleaved 6-component CSR of ``[[M, -dt M], [dt A, M]]`` from the scalar mass ``Ms``
    and the 3-component elasticity matrix ``A3`` (DoF ``3 node + r``).

    Node pair (n, m) of the scalar pattern contributes, in row ``6n + r`` (r < 3), the
    columns ``6m + r`` (M_nm) and ``6m + 3 + r`` (-dt M_nm); in row ``6n + 3 + r`` the
    columns ``6m + s``, s < 3 (dt A_nm[r, s]) and ``6m + 3 + r`` (M_nm).  Built directly in
    sorted CSR by index arithmetic; falls back to a COO sum when the 3x3 block pattern of
    ``A3`` differs from the pattern of ``Ms``.
    """
    Ms = sp.csr_matrix(Ms)
    Ms.sum_duplicates()
    nn = Ms.shape[0]
    Bk = A3 if sp.isspmatrix_bsr(A3) and A3.blocksize == (3, 3) else sp.csr_matrix(A3).tobsr(blocksize=(3, 3))
    if not (np.array_equal(Bk.indptr, Ms.indptr) and np.array_equal(Bk.indices, Ms.indices)):
        M3 = sp.kron(Ms, sp.identity(3), format="csr")
        return sp.bmat([[M3, -dt * M3], [dt * sp.csr_matrix(A3), M3]], format="csr")[_perm6(nn)][:, _perm6(nn)].tocsr()
    k = np.diff(Ms.indptr).astype(np.int64)
    widths = np.array([2, 2, 2, 4, 4, 4], dtype=np.int64)
    rowlen = (k[:, None] * widths[None, :]).ravel()
    indptr = np.zeros(6 * nn + 1, dtype=np.int64)
    np.cumsum(rowlen, out=indptr[1:])
    nnz = int(indptr[-1])
    it = np.int32 if max(nnz, 6 * nn) < 2**31 - 1 else np.int64
    data = np.empty(nnz)
    indices = np.empty(nnz, dtype=it)
    nse = Ms.nnz
    node = np.repeat(np.arange(nn, dtype=np.int64), k)            # row node of each scalar entry
    within = np.arange(nse, dtype=np.int64) - Ms.indptr[:-1].astype(np.int64)[node]
    m6 = Ms.indices.astype(it) * it(6)
    Mv = Ms.data
    Ab = Bk.data                                                   # (nse, 3, 3)
    for c in range(6):
        w = int(widths[c])
        base = indptr[6 * node + c] + within * w                   # (nse,) first slot of entry e
        dest = base[:, None] + np.arange(w)                         # (nse, w), sorted columns
        if c < 3:
            data[dest] = np.stack([Mv, -dt * Mv], axis=1)
            indices[dest] = m6[:, None] + np.array([c, 3 + c], dtype=it)
        else:
            r = c - 3
            data[dest] = np.concatenate([dt * Ab[:, r, :], Mv[:, None]], axis=1)
            indices[dest] = m6[:, None] + np.array([0, 1, 2, 3 + r], dtype=it)
    indptr = indptr.astype(it)
    out = sp.csr_matrix((data, indices, indptr), shape=(6 * nn, 6 * nn))
    out.has_sorted_indices = True
    return out


def _perm6(nn):
    """Permutation from the block layout [u (3 nn) | v (3 nn)] to the interleaved layout."""
    node = np.arange(nn)[:, None]
    comp = np.arange(6)[None, :]
    return np.where(comp < 3, 3 * node + comp, 3 * nn + 3 * node + comp - 3).ravel()


def _coefficients(dt: float) -> np.ndarray:
    r"""The 6 x 6 node-block coefficients of the fields (M, A_00, A_01, ..., A_22):
    :math:`C_M = [[I_3, -dt I_3], [0, I_3]]`, :math:`C_{A_{rs}} = dt\, e_{3+r} e_s^T`."""
    C = np.zeros((10, 6, 6))
    C[0] = np.eye(6)
    C[0, np.arange(3), 3 + np.arange(3)] = -dt
    for r in range(3):
        for s_ in range(3):
            C[1 + 3 * r + s_, 3 + r, s_] = dt
    return C


def block_system(Ms, A3, dt: float, backend=None):
    r"""``[[M, -dt M], [dt A, M]]`` (interleaved, DoF ``6 node + c``) as a
    :class:`~adaptmg.fe.csr_ops.NodeBlockMatrix`: the fields M and the nine A_rs on the
    scalar node pattern of ``Ms`` (10 values per node pair instead of 18), which
    :meth:`adaptmg.Constraints.matrix` constrains on that pattern before expanding once.
    ``A3``: BSR with 3 x 3 blocks on the same pattern (``assemble.elasticity(...,
    format="bsr")``); another pattern falls back to :func:`_system_from_blocks` (CSR).
    ``backend``: a GPU backend makes the constrained matrices device CSR, expanded there.
    """
    Ms = sp.csr_matrix(Ms)
    Ms.sum_duplicates()
    nn = Ms.shape[0]
    Bk = A3 if sp.isspmatrix_bsr(A3) and A3.blocksize == (3, 3) else sp.csr_matrix(A3).tobsr(blocksize=(3, 3))
    if not (np.array_equal(Bk.indptr, Ms.indptr) and np.array_equal(Bk.indices, Ms.indices)):
        return _system_from_blocks(Ms, Bk, dt)
    data = np.empty((Ms.nnz, 10))
    data[:, 0] = Ms.data
    data[:, 1:] = Bk.data.reshape(-1, 9)
    return NodeBlockMatrix(Ms.indptr, Ms.indices, data, _coefficients(dt), nn,
                           backend=backend if backend is not None and backend.is_gpu else None)


def system_matrix(dt: float, lam: float = LAMBDA, mu: float = MU, backend=None):
    """``assemble(space6) -> [[M, -dt M], [dt A, M]]`` in the interleaved 6-component layout,
    as a :class:`~adaptmg.fe.csr_ops.NodeBlockMatrix` (``.tocsr()`` gives SciPy CSR).
    ``backend`` ("gpu" or a GPU Backend): :meth:`adaptmg.Constraints.matrix` then builds the
    constrained level matrices on the device (the hierarchy's levels are device CSR)."""
    be = None if backend is None else get_backend(backend)
    def S(space6):
        if space6.components != 6:
            raise ValueError(f"the elasticity system needs a 6-component space, got {space6.components}")
        s1 = Space(space6.mesh, 1, components=1)
        s3 = Space(space6.mesh, 1, components=3)
        gpu = be if be is not None and be.is_gpu else None
        # the scalar mass and the 3 x 3 blocks from one assembly pass (one geometry evaluation),
        # summed straight into the (nnz, 10) fields [M, A_00, ..., A_22] of block_system; on the
        # GPU computed and kept there (Constraints.matrix constrains them there)
        ip, ind, data = assemble.elasticity(s3, lam, mu, format="fields", return_mass=True,
                                            device=gpu, keep_on_device=gpu is not None)
        nn = s3.num_nodes
        if S.first_mass[0] is None:                  # the finest level comes first
            # its scalar mass, reused for the right-hand side (on the device: stays there)
            csr = gpu.sparse.csr_matrix if gpu is not None else sp.csr_matrix
            Ms = csr((data[:, 0].copy(), ind.copy(), ip.copy()), shape=(nn, nn))
            Ms.has_sorted_indices = True
            Ms.has_canonical_format = True
            S.first_mass = (space6, s1, Ms)
        return NodeBlockMatrix(ip, ind, data, _coefficients(dt), nn, backend=gpu)
    S.first_mass = (None, None, None)
    return S


def run(case: str = "edge", level: int = 3, *, dt: float = 0.025, T: float = 2.5,
        steps: int | None = None, lam: float = LAMBDA, mu: float = MU, f=F, backend="auto",
        rtol: float = 1e-8, maxiter: int = 50, tol: str = "rhs", levels=None, quiet: bool = False, out=None,
        coarse=(8, 8, 8), mg_dtype=np.float64):
    """Run the elasticity problem on the adaptive mesh ``make_mesh(case, level)``.

    ``tol="rhs"`` stops GMRES when ``||b - K x|| <= rtol ||b||`` (x0 = previous step);
    with the paper's dt the strongly damped backward-Euler dynamics reach the static
    state within ~5 steps, after which x0 already meets that test and steps cost no
    iteration.  ``tol="residual"`` reduces each step's initial residual by ``rtol``
    (Gascoigne's "reduction" criterion), i.e. the solver works in every step.

    ``levels``: number of multigrid levels or "all" (down to the 2x2x2 box); default all
    but the 2x2x2 box (direct coarse solve on the 4x4x4 box, 750 rows).

    Returns a dict with ``u``, ``v`` (host nodal values at T, shape (nodes, 3)),
    ``mesh``, ``space``, ``timings`` ({"init", "rhs", "solve", "sum"}),
    ``iterations`` (GMRES iterations per step), the mesh statistics of
    :func:`mesh_stats`, ``steps``, ``T``, ``backend``.
    """
    steps = time_steps(dt, T, steps, tol)
    f = np.asarray(f, dtype=float)
    if f.shape != (3,):
        raise ValueError(f"f must be a 3-vector, got shape {f.shape}")
    be = get_backend(backend)
    xp = be.xp
    timer = Timer(be)
    res = {} if out is None else out

    with timer("init"):
        mesh = make_mesh(case, level, coarse, backend=be.name)      # on the GPU: built there
        space = Space(mesh, 1, components=6)
        S = system_matrix(dt, lam, mu, backend=be if be.is_gpu else None)
        # hierarchy down to the 4x4x4 box (750 rows, direct coarse solve) by default
        nlev = None if levels == "all" else (len(mesh.hierarchy()) - 1 if levels is None else int(levels))
        ml = multigrid(space, S, dirichlet="all", smoother="block_jacobi", backend=be,
                       max_levels=nlev, dtype=mg_dtype, near_nullspace="rigid_body")
        cons = ml.constraints[-1]
        nd = space.num_dofs
        Kd = getattr(ml, "_A_outer", None)
        if Kd is None:
            Kd = be.asmatrix(ml.A)
        Kop = SpMVOperator(Kd)
        # right-hand side Z H^T (M (x) I_6) H x + dt Z H^T F: with H = Hs (x) I_6 this is
        # z * (Msc X) + dt Fc, Msc = Hs^T Ms Hs (scalar), X = x viewed as (nodes, 6)
        sp6, s1, Ms = S.first_mass
        S.first_mass = (None, None, None)
        if sp6 is not space:
            s1 = Space(mesh, 1, components=1)
            Ms = assemble.mass(s1)
        # Hs^T Ms Hs without two SpGEMMs, on Ms's side (the device's expansion there)
        Msc = Ms if s1.hanging_nodes.size == 0 else congruence_with_constraints(Ms, s1.H, s1.hanging_nodes)
        free = cons.free
        nn = mesh.num_nodes
        if mesh.backend.is_gpu:                  # a device mesh: H and the masks live there
            ones = Ms @ xp.ones(nn)                                        # (1, phi_i)
        else:
            ones = np.asarray(to_host(Ms.sum(axis=1))).ravel()
        Fv = mesh.backend.xp.zeros((nn, 6))
        Fv[:, 3:] = ones[:, None] * mesh.backend.xp.asarray(f)[None, :]    # F_(i,r) = f_r (1, phi_i)
        Fc = free * (cons.H.T @ Fv.ravel())
        Mscd = be.asmatrix(Msc)
        zd = be.asarray(free.astype(np.float64))
        Fcd = be.asarray(dt * Fc)
        x = xp.zeros(nd)
        rhs = xp.empty(nd)
        Mprec = ml.aspreconditioner("V")

    iters = []
    not_converged = 0
    for _ in progress(range(steps), total=steps, desc=f"elasticity {case} l={level}", quiet=quiet):
        with timer("rhs"):
            Y = Mscd @ x.reshape(nn, 6)          # SpMM: scalar mass on the 6 components
            constrain_combine(zd, Y.reshape(-1), 1.0, Fcd, rhs)   # rhs = z * Y + dt Fc
        with timer("solve"):
            x, info, its = gmres_step(Kop, rhs, x, Mprec, rtol=rtol, maxiter=maxiter, tol=tol, xp=xp)
            if info != 0:
                not_converged += 1
        iters.append(its)

    timings = timer.as_dict(["init", "rhs", "solve"])
    U = to_host(ml.expand(x)).reshape(-1, 6)
    stats = mesh_stats(mesh)
    res.update(u=U[:, :3].copy(), v=U[:, 3:].copy(), mesh=mesh, space=space, solver=ml,
               timings=timings, iterations=iters, not_converged=not_converged, steps=int(steps), T=steps * dt, dt=dt,
               backend=be.name, case=case, level=int(level), levels=len(ml.levels),
               fields={"u": U[:, :3].copy(), "v": U[:, 3:].copy()}, **stats)
    if not quiet:
        row = dict(case=case, level=level, iters_max=max(iters), **stats, **timings)
        print(format_table([row], COLUMNS, title=f"elasticity ({be.name}, {steps} steps, dt={dt})"))
    return res
