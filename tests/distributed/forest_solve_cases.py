"""Worker run under ``mpiexec -n P`` by tests/distributed/test_forest_solve.py (not a test module).

``python forest_solve_cases.py OUT.json``: for every case a
:class:`~adaptmg.distributed.forest.DistributedForest` (refined, then re-cut so that hanging
nodes have parents on other ranks) is solved by :func:`adaptmg.distributed.solve_forest`,
and rank 0 compares with the serial :func:`adaptmg.multigrid` solve on the serial mesh of
the same refinements: iterations, convergence factor, solution (against the serial direct
solution, in units of rtol times a condition number estimate), and every level's gathered
``A``, ``P``, ``R`` against the serial level it coincides with (global ids mapped to serial
nodes through the coordinates; errors in units of eps).  The control: ``P`` of the coarsest
distributed level built with the coarse hanging vertices kept as columns (no ``H_c``: their
columns are then dropped as non-free) -- the rows miss their hanging parents' columns.
"""
import json
import os
import sys
import warnings

import numpy as np
import scipy.sparse as sp
import scipy.sparse.linalg as sla

import adaptmg
from adaptmg import assemble
from adaptmg.distributed import install_excepthook, solve_forest
from adaptmg.distributed.forest import DistributedForest
from adaptmg.distributed.forest_rows import Expansion
from adaptmg.distributed.forest_transfer import prolongation_rows
from adaptmg.mesh import Mesh

from forest_cases import COMM, _index_of, near
from forest_rows_cases import cross_rank_hanging

EPS = np.finfo(float).eps
RTOL = 1e-11


def steps(dim):
    box = ([0] * dim, [1] * dim, [3, 2] if dim == 2 else [2, 2, 2])
    uni = [None] * (4 if dim == 2 else 2)
    return box, uni, uni + [near(np.full(dim, 0.3), 0.25), near(np.full(dim, 0.3), 0.12)]


CASES = {"uniform-2d": (2, 1), "local-2d": (2, 2), "uniform-3d": (3, 1), "local-3d": (3, 2),
         "starved-2d": (2, 0), "fold-2d": (2, 1), "fold-3d": (3, 2)}
#: min_dofs_per_rank per case: the fold cases put coarse levels on fewer ranks, the others keep
#: every distributed level on all ranks (None)
FOLD = {"fold-2d": 150, "fold-3d": 200}


def starving(df):
    """Weights that leave the last rank 2 or 3 leaves, all of one family whose child 0 a lower
    rank owns: ``coarsen_once`` then refuses (the hierarchy re-cuts before coarsening)."""
    n, P = df.global_num_cells, COMM.size
    pos = df.first + np.arange(df.num_owned)
    return np.where(pos >= n - 3, 1.0, (P - 1) * 3.0 / (n - 3))


def global_rows(D):
    """(row, column, value) in global ids of a DistCSR on range layouts."""
    a, g = D.Aoo.tocoo(), D.Aog.tocoo()
    return (np.concatenate([a.row, g.row]) + D.rows.lo,
            np.concatenate([a.col + D.cols.lo, D.ghosts[g.col]]), np.concatenate([a.data, g.data]))


def gathered(rc):
    got = COMM.gather(rc, root=0)
    if COMM.rank:
        return None
    return tuple(np.concatenate([g[k] for g in got]) for k in range(3))


def coords(F):
    """Coordinates of the forest's nodes in global id order (gathered on rank 0)."""
    got = COMM.gather(F.mesh.points[F.owned_nodes], root=0)
    return None if COMM.rank else np.concatenate(got)


def err_eps(rcv, S, rmap, cmap, scale):
    """max |D - S| / (eps scale), D the gathered entries renamed by the maps; and nnz of D."""
    r, c, v = rcv
    D = sp.csr_matrix((v, (rmap[r], cmap[c])), shape=S.shape)
    return float(abs(D - sp.csr_matrix(S)).max() / (EPS * scale)), int(D.nnz)


def no_hanging_expansion(F, ex):
    """The coarse expansion with every local node its own column (no H_c): hanging columns are
    non-free and dropped, so a row loses its hanging parents' share."""
    u, inv = np.unique(F.node_gid, return_inverse=True)
    n = F.mesh.num_nodes
    E = sp.csr_matrix((np.ones(n), inv, np.arange(n + 1)), shape=(n, u.size))
    pos = np.minimum(np.searchsorted(ex.u, u), ex.u.size - 1)
    free = np.where(ex.u[pos] == u, ex.free_u[pos], False)
    return Expansion(u, E, free, ex.starts)


def refined_pair(dim, which):
    """The forest and (rank 0) the serial mesh of the same refinements: ``which`` 2 local, 1
    uniform, 0 the first three uniform ones."""
    box, uni, loc = steps(dim)
    stp = loc if which == 2 else uni if which == 1 else uni[:3]
    df = DistributedForest.box(*box, comm=COMM)
    serial = Mesh.box(*box) if COMM.rank == 0 else None
    for s in stp:
        df = df.refine(s)
        if COMM.rank == 0:
            serial = serial.refine(None if s is None else s(serial.points[serial.cells].mean(1)))
    return df, serial


def run(name, dim, which, records):
    df, serial = refined_pair(dim, which)
    c = df.centres()
    if which == 0:
        df = df.repartition(weights=starving(df))
        try:
            df.coarsen_once()
            refused = False
        except ValueError:
            refused = True
    else:
        df = df.repartition(weights=np.where(np.linalg.norm(c - 0.3, axis=1) < 0.3, 4.0, 1.0))
        refused = None
    cross = COMM.allreduce(cross_rank_hanging(df))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        res = solve_forest(df, assemble.stiffness, 1.0, rtol=RTOL, agglomerate_below=30 if which == 0 else 100,
                           min_dofs_per_rank=FOLD.get(name), gather=True)
    mg = res.mg
    owned = [row["owned"] for row in mg.describe()]
    # per level: gathered rows and the coordinates of the level's global ids
    levels = []
    for k, d in enumerate(mg.levels):
        rec = {"A": gathered(global_rows(d.A))}
        if k > 0:
            rec["P"], rec["R"] = gathered(global_rows(d.P)), gathered(global_rows(d.R))
            rec["X"] = coords(mg.forests[k])
        levels.append(rec)
    # control: the coarsest distributed level's P without H_c
    F1, F0 = mg.forests[1], mg.forests[0]
    from adaptmg.distributed.forest_rows import prepare
    free1 = prepare(F1, "all")[3]
    bad = prolongation_rows(F1, F0, free1, no_hanging_expansion(F0, prepare(F0, "all")[4]), mg._g2s)
    bc = bad.tocoo()
    bad = gathered((bc.row + mg.layouts[1].lo, bc.col.astype(np.int64), bc.data))
    hang0 = COMM.allreduce(int(F0.mesh.is_hanging[F0.owned_nodes].sum()))
    if COMM.rank:
        return
    # the serial solve on the serial mesh
    space = adaptmg.Space(serial, 1)
    ml = adaptmg.multigrid(space, assemble.stiffness, dirichlet="all", backend="cpu")
    f = ml.constrain(assemble.load(space, 1.0))
    omega_serial = [d.smoother.omega for d in ml._dev[len(ml.levels) - len(mg.levels) + 1:]]
    its, hist = [0], []
    x_s = ml.solve(f, rtol=RTOL, accel="cg", residuals=hist, callback=lambda xk: its.__setitem__(0, its[0] + 1))
    # the serial solve again with the forest's omegas on the distributed levels (they come from
    # power iterations started from a vector indexed by the global numbering, which is not the
    # serial one): the same iterates up to the summation order
    oms = [d.smoother.omega for d in mg.levels[1:]]
    for d, om in zip(ml._dev[len(ml.levels) - len(oms):], oms):
        d.smoother.omega = om
    its2, hist2 = [0], []
    ml.solve(f, rtol=RTOL, accel="cg", residuals=hist2, callback=lambda xk: its2.__setitem__(0, its2[0] + 1))
    K = sp.csr_matrix(ml.levels[-1].A)
    x_d = sla.spsolve(K.tocsc(), f)
    lmax = sla.eigsh(K, 1, which="LA", return_eigenvectors=False)[0]
    lmin = sla.eigsh(K, 1, sigma=0, which="LM", return_eigenvectors=False)[0]
    kappa = float(lmax / lmin)
    # the forest levels against the serial levels (the last ones coincide)
    Ls, m = len(ml.levels), len(levels)
    maps = []
    for k in range(m):
        X = ml.spaces[-1 - (m - 1 - k)].mesh.points
        if k == 0:
            Xk = mg.ml.spaces[-1].mesh.points        # the gathered level: rank 0's serial numbering
        else:
            Xk = levels[k]["X"]
        maps.append(_index_of(X, Xk))
    lev = []
    for k in range(m):
        S = ml.levels[Ls - m + k]
        scale = abs(S.A).max()
        row = {"dofs": int(S.A.shape[0]), "map_bad": int((maps[k] < 0).sum())}
        row["A_err"], row["A_nnz"] = err_eps(levels[k]["A"], S.A, maps[k], maps[k], scale)
        row["A_nnz_serial"] = int(sp.csr_matrix(S.A).nnz)
        if k > 0:
            row["P_err"], row["P_nnz"] = err_eps(levels[k]["P"], S.P, maps[k], maps[k - 1], 1.0)
            row["R_err"], row["R_nnz"] = err_eps(levels[k]["R"], S.R, maps[k - 1], maps[k], 1.0)
            row["P_nnz_serial"], row["R_nnz_serial"] = int(S.P.nnz), int(S.R.nnz)
        lev.append(row)
    bad_err, _ = err_eps(bad, ml.levels[Ls - m + 1].P, maps[1], maps[0], 1.0)
    fine = maps[-1]
    xf = np.empty_like(res.x)
    xf[fine] = res.x
    uf = np.empty_like(res.u)
    uf[fine] = res.u
    u_s = ml.expand(x_s)
    r = res.residuals
    records.append(dict(
        case=name, stage="solve", P=COMM.size, coarsen_refused=refused, dofs=int(K.shape[0]), hanging=int(serial.num_hanging_nodes),
        coarse_hanging=hang0, cross_rank_hanging=cross, levels=lev, serial_levels=Ls, its=res.iterations,
        its_serial=its[0], info=res.info, rho=float((r[-1] / r[0]) ** (1.0 / res.iterations)),
        rho_serial=float((hist[-1] / hist[0]) ** (1.0 / its[0])), kappa=kappa, its_same_omega=its2[0],
        rho_same_omega=float((hist2[-1] / hist2[0]) ** (1.0 / its2[0])),
        omega_diff=float(max(abs(a / b - 1) for a, b in zip(oms, omega_serial))),
        x_err=float(np.abs(xf - x_d).max() / np.abs(x_d).max()),
        x_serial_err=float(np.abs(x_s - x_d).max() / np.abs(x_d).max()),
        u_err=float(np.abs(uf - ml.expand(x_d)).max() / np.abs(u_s).max()),
        bad_P_err=bad_err, min_dofs_per_rank=FOLD.get(name), active_ranks=list(res.active_ranks),
        owned=owned, phases=sorted(k for k in res.timings if k.endswith("_s"))))


def forest(dim, which):
    box, uni, loc = steps(dim)
    df = DistributedForest.box(*box, comm=COMM)
    for s in (uni if which == 1 else loc):
        df = df.refine(s)
    return df


def run_gpu(records, fake, dim=2):
    """The GPU path (``backend="gpu"``) of the forest set-up -- ``fake``: with fake_cupy standing
    in for CuPy (NumPy arrays that claim to be CuPy's) -- against the CPU path of the same
    forest."""
    from adaptmg.backend import is_device_array
    df = forest(dim, 2)
    cpu = solve_forest(df, rtol=RTOL, agglomerate_below=100, gather=True)
    if fake:
        import fake_cupy
        fake_cupy.install(devices=1, mesh=True)   # the local meshes go to the device
    gdf = forest(dim, 2)              # the same forest, its host mesh untouched by the CPU solve
    gpu = solve_forest(gdf, rtol=RTOL, agglomerate_below=100, gather=True, backend="gpu", coarse_max_rows=None)
    mg = gpu.mg
    dl = mg.levels[1:]
    space, _, _, free_o, ex = mg._fine_prep
    device = bool(is_device_array(gpu.x_local) and mg.solver.backend.is_gpu
                  and all(d.A.backend.is_gpu and d.P.backend.is_gpu and d.R.backend.is_gpu for d in dl)
                  and all(d.smoother.backend.is_gpu for d in dl if d.layout.n)
                  # the levels prepared on the device: the host meshes' hanging nodes never searched
                  and space.backend.is_gpu and is_device_array(free_o) and ex.on_device
                  and not any("_hanging_forest" in F.mesh.__dict__ for F in mg.forests))
    device = COMM.allreduce(int(device), op=__import__("mpi4py").MPI.MIN)
    if COMM.rank == 0:
        records.append(dict(case=f"{'fake-' if fake else ''}gpu-{dim}d", stage="solve", P=COMM.size, its=gpu.iterations,
                            its_cpu=cpu.iterations, info=gpu.info, device=bool(device),
                            rank0_backend=gpu.ml.backend.name, transport=mg.transport,
                            rel=float(np.abs(gpu.u - cpu.u).max() / np.abs(cpu.u).max())))


def harmonic(dim):
    """A harmonic (bi/tri)linear polynomial: in the constrained Q1 space (also across hanging
    edges/faces), so the discrete solution with f = 0 and these Dirichlet values is itself."""
    if dim == 2:
        return lambda x: 1 + x[:, 0] + 2 * x[:, 1] + 3 * x[:, 0] * x[:, 1]
    return lambda x: 1 + x[:, 0] + 2 * x[:, 1] - x[:, 2] + 3 * x[:, 0] * x[:, 1] + x[:, 1] * x[:, 2] \
        + 2 * x[:, 0] * x[:, 1] * x[:, 2]


def smooth(x):
    return np.sin(2 * x[:, 0]) + x[:, 1] ** 2 - 0.5 * x[:, -1]


def run_dirichlet(dim, records):
    """Inhomogeneous Dirichlet data (``solve_forest(..., g=)``) on the locally refined forest,
    re-cut so that hanging nodes (also on the boundary) have parents on other ranks: the
    constrained right-hand side against the serial ``Constraints.rhs`` (eps units), the
    solution against the serial direct one, a harmonic polynomial reproduced; the value-dict
    spec; the control (P > 1): the values of the Dirichlet nodes owned elsewhere dropped from
    the lifting (``_pull`` answering zero for them)."""
    import adaptmg.distributed.forest_rows as fr
    from adaptmg.distributed.solve import resolve
    df, serial = refined_pair(dim, 2)
    c = df.centres()
    df = df.repartition(weights=np.where(np.linalg.norm(c - 0.3, axis=1) < 0.3, 4.0, 1.0))
    kw = dict(rtol=RTOL, agglomerate_below=100, gather=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        res = solve_forest(df, assemble.stiffness, 1.0, g=smooth, **kw)
        poly = solve_forest(df, assemble.stiffness, 0.0, g=harmonic(dim), **kw)
        ids = list(range(2 * dim))
        spec = solve_forest(df, assemble.stiffness, 1.0, dirichlet={i: smooth for i in ids[::-1]}, **kw)
    mg = res.mg
    f_loc = mg.load_local(1.0, smooth)
    rhs = COMM.gather(f_loc, root=0)
    bad_rhs = None
    if COMM.size > 1:                       # control: other ranks' Dirichlet values taken as zero
        real = fr._pull

        def dropped(comm, starts, want, first, values):
            got = real(comm, starts, want, first, values)
            mine = (want >= first) & (want < first + values.size)
            return np.where(mine, got, 0.0)
        fr._pull = dropped
        try:
            bad = mg.load_local(1.0, smooth)
        finally:
            fr._pull = real
        xb = resolve(mg, bad, rtol=RTOL)[0]
        bad_rhs = (COMM.gather(bad, root=0), mg.layout.allgather(mg.expand_local(xb)))
    X = coords(df)
    hang_bnd = None
    if COMM.rank:
        return
    space = adaptmg.Space(serial, 1)
    ml = adaptmg.multigrid(space, assemble.stiffness, dirichlet="all", backend="cpu")
    con = ml.constraints[-1].with_values(smooth)
    f_s = con.rhs(assemble.load(space, 1.0), ml.assembled)
    its = [0]
    ml.solve(f_s, rtol=RTOL, accel="cg", callback=lambda xk: its.__setitem__(0, its[0] + 1))
    K = sp.csr_matrix(ml.levels[-1].A).tocsc()
    u_d = con.expand(sla.spsolve(K, f_s))
    m = _index_of(space.points, X)                 # global id -> serial node
    rhs = np.concatenate(rhs)
    f_m = np.empty_like(f_s)
    f_m[m] = rhs
    u_m = np.empty_like(u_d)
    u_m[m] = res.u
    bnd = np.zeros(space.num_dofs, dtype=bool)
    bnd[space.boundary_dofs()] = True
    hang_bnd = int((bnd & space.is_hanging).sum())
    g_poly = harmonic(dim)(X)
    r = dict(case=f"dirichlet-{dim}d", stage="solve", P=COMM.size, map_bad=int((m < 0).sum()),
             hanging_boundary=hang_bnd, info=res.info, its=res.iterations, its_serial=its[0],
             rhs_err_eps=float(np.abs(f_m - f_s).max() / (EPS * np.abs(f_s).max())),
             u_err=float(np.abs(u_m - u_d).max() / np.abs(u_d).max()),
             g_err=float(np.abs(u_m - smooth(space.points))[bnd & ~space.is_hanging].max()),
             poly_err=float(np.abs(poly.u - g_poly).max() / np.abs(g_poly).max()), poly_info=poly.info,
             spec_rel=float(np.abs(spec.u - res.u).max() / np.abs(res.u).max()))
    if bad_rhs is not None:
        fb = np.empty_like(f_s)
        fb[m] = np.concatenate(bad_rhs[0])
        ub = np.empty_like(u_d)
        ub[m] = bad_rhs[1]
        r["control_rhs_err"] = float(np.abs(fb - f_s).max() / np.abs(f_s).max())
        r["control_u_err"] = float(np.abs(ub - u_d).max() / np.abs(u_d).max())
    records.append(r)


def main():
    install_excepthook(COMM)
    records = []
    if os.environ.get("FOREST_SOLVE_GPU"):           # the real device (test_forest_solve, -m gpu)
        run_gpu(records, False, 2)
        run_gpu(records, False, 3)
    else:
        for name, (dim, which) in CASES.items():
            if which or COMM.size > 1:               # one rank cannot be starved
                run(name, dim, which, records)
        for dim in (2, 3):
            run_dirichlet(dim, records)
        if COMM.size == 2:
            run_gpu(records, True)
    if COMM.rank == 0:
        with open(sys.argv[1], "w") as f:
            json.dump(records, f)


if __name__ == "__main__":
    main()
