"""Worker run under ``mpiexec -n P`` by tests/distributed/test_mpi.py (not a test module).

``python mpi_cases.py solve OUT.json``: every case of CASES distributed over COMM_WORLD and
on one rank (a size-1 communicator: the serial code path); rank 0 writes one JSON
record per case.  CASES keep every distributed level on all ranks (``min_dofs_per_rank=0``);
FOLDED put the coarser distributed levels on fewer ranks (``min_dofs_per_rank`` given).  ``python mpi_cases.py bad-input`` / ``callback``: a failure on rank 1
only (the test checks that every rank exits, with the error, before its timeout).
``python mpi_cases.py solve-gpu OUT.json``: the GPU_CASES with ``backend="gpu"`` distributed
over COMM_WORLD, compared with the serial GPU and the serial CPU solves (one rank each);
``solve-gpu OUT.json --fake``: the same with :mod:`fake_cupy` standing in for CuPy (no GPU
needed; the serial GPU solve is then skipped).
"""
import json
import sys
import warnings

import numpy as np
import scipy.sparse as sp
from mpi4py import MPI

from adaptmg import assemble
from adaptmg.distributed import allreduce_sum, install_excepthook, solve
from adaptmg.linalg._vectorops import VectorOps, global_norm, global_reductions
from adaptmg.backend import CPU
from adaptmg.distributed.serial_levels import _SETUPS
from adaptmg.fe import Space
from adaptmg.mesh import Mesh

COMM = MPI.COMM_WORLD


def adaptive_mesh(dim, L):
    m = Mesh.box([0] * dim, [1] * dim, [4 if dim == 2 else 2] * dim)
    for _ in range(L):
        m = m.refine()
    for j in range(2):                     # two rounds of local refinement: hanging nodes
        c = m.points[m.cells].mean(1)
        m = m.refine(np.linalg.norm(c - 0.3, axis=1) < 0.25 / (j + 1))
    return m


def poisson(dim, L, degree):
    space = Space(adaptive_mesh(dim, L), degree)
    return space, assemble.stiffness, assemble.load(space, lambda x: 1.0 + x[..., 0]), {}


def elasticity(dim, L, smoother):
    space = Space(adaptive_mesh(dim, L), 1, components=dim)
    load = np.zeros(dim)
    load[-1] = -1.0

    def A(s):
        return assemble.elasticity(s, 4.0, 1.0)
    kw = dict(dirichlet=[0], smoother=smoother)
    return space, A, assemble.load(space, load), kw


CASES = {
    "q1-2d": lambda: poisson(2, 3, 1),
    "q1-3d": lambda: poisson(3, 2, 1),
    "q2-2d": lambda: poisson(2, 2, 2),
    "q2-3d": lambda: poisson(3, 1, 2),
    "elasticity-2d": lambda: elasticity(2, 2, "block_jacobi"),
    "elasticity-3d": lambda: elasticity(3, 1, "chebyshev"),
}


# name -> (problem, min_dofs_per_rank, extra solve arguments); level DoFs (coarse -> fine):
# q1-2d [25, 41, 91, 224, 671, 2359] (agglomerate_below=50: levels 0-1 on rank 0), so with
# m = 300 the ranks per level are [1, 1, 1, 1, 2, P]; elasticity-2d [50, 82, 170, 402, 1224]
# (m = 150: [1, 1, 1, 2, P]); elasticity-3d [81, 138, 558, 852] (m = 250: [1, 1, 2, P])
FOLDED = {
    "q1-2d-folded": (lambda: poisson(2, 3, 1), 300, {}),
    "elasticity-2d-folded-replicated-w": (lambda: elasticity(2, 2, "block_jacobi"), 150,
                                          dict(local_setup=False, cycle="W")),
    "elasticity-3d-folded": (lambda: elasticity(3, 1, "chebyshev"), 250, {}),
}


def cross_rank_hanging(res, space):
    """Hanging DoFs whose constraint couples DoFs of different owners (fine level)."""
    owner = res.mg.owners[-1]
    hang = np.flatnonzero(space.is_hanging)
    Hh = space.H.tocsr()[hang]
    rows, cols = np.repeat(hang, np.diff(Hh.indptr)), Hh.indices
    return int(np.unique(rows[owner[cols] != owner[rows]]).size), int(hang.size)


def global_rows(D):
    """This rank's rows of a DistCSR with global column numbers (CSR, rows x global columns)."""
    M = sp.hstack([D.Aoo, D.Aog]).tocoo()
    cmap = np.concatenate([D.cols.rows, D.ghosts])
    return sp.csr_matrix((M.data, (M.row, cmap[M.col])), shape=(D.rows.n, D.global_shape[1]))


def rows_error(D, S):
    """max |rows of D - the same rows of the serial S| / max |S|."""
    diff = global_rows(D) - sp.csr_matrix(S)[D.rows.rows]
    return float(abs(diff).max() / abs(S).max()) if diff.nnz else 0.0


def cell_layers(mesh, cell_ranks, k):
    """Cells within k vertex-neighbour layers of this rank's cells."""
    mask = cell_ranks == COMM.rank
    for _ in range(k):
        nodes = np.zeros(mesh.num_nodes, dtype=bool)
        nodes[mesh.cells[mask]] = True
        mask = nodes[mesh.cells].any(axis=1)
    return int(mask.sum())


def record(name, space, A, b, kw, serial_comm):
    kw = {"min_dofs_per_rank": 0, **kw}
    dist = solve(space, A, b, comm=COMM, rtol=1e-10, agglomerate_below=50, **kw)
    ser = solve(space, A, b, comm=serial_comm, rtol=1e-10, agglomerate_below=50, **kw)
    cross, nh = cross_rank_hanging(dist, space)
    counts = np.bincount(dist.cell_ranks, minlength=COMM.size)
    st = dist.mg.setup_stats
    assembled = COMM.allgather(st.get("fine_cells_assembled", -1))
    transfer = COMM.allgather(st.get("fine_cells_transfer", -1))
    per_level = COMM.allgather(st.get("cells_assembled", []))
    errs = [0.0, 0.0, 0.0]
    for l in range(dist.mg.c, len(dist.mg.levels)):              # every distributed level
        dl, sl = dist.mg.levels[l], ser.ml.levels[l]
        errs = np.maximum(errs, [rows_error(dl.A, sl.A), rows_error(dl.P, sl.P), rows_error(dl.R, sl.R)])
    errs = errs.tolist()
    errs = np.max(COMM.allgather(errs), axis=0).tolist()
    layers = COMM.allgather([cell_layers(space.mesh, dist.cell_ranks, k) for k in (1, 2)])
    return dict(case=name, dofs=space.num_dofs, hanging=nh, cross_rank_hanging=cross,
                rel_err=float(np.linalg.norm(dist.u - ser.u) / np.linalg.norm(ser.u)),
                its=dist.iterations, its_serial=ser.iterations, info=dist.info,
                imbalance=dist.imbalance, cells_per_rank=counts.tolist(),
                distributed_levels=len(dist.mg.levels) - dist.mg.c, levels=len(dist.mg.levels),
                serial_levels=len(ser.ml.levels), cells_assembled=assembled, cells_transfer=transfer,
                fine_rows_err=errs, level_cells=st.get("cells", []), level_cells_assembled=per_level,
                serial_top=len(dist.ml.levels) - 1, cell_layers=layers, cells=space.mesh.num_cells,
                neighbours=len(dist.mg.A.neighbours), active_ranks=dist.active_ranks,
                owning_ranks=dist.mg.owning_ranks, agglomerated=dist.mg.c,
                level_dofs=[lay.N for lay in dist.mg.layouts],
                level_owned=[lay.counts.tolist() for lay in dist.mg.layouts],
                level_cell_ranks=[np.bincount(cr, minlength=COMM.size).tolist()
                                  for cr in dist.mg.cell_ranks],
                describe_ranks=[r["ranks"] for r in dist.mg.describe()],
                serial_kinds=COMM.allgather(type(dist.ml).__name__),
                serial_built=COMM.allgather(dist.mg.serial_built),
                serial_top_dofs=dist.ml.spaces[-1].num_dofs), dist


def sync_counts(mg, b):
    """Solve once more on the set-up hierarchy ``mg`` (:func:`adaptmg.distributed.resolve`, CG
    to 1e-10 from zero) and count: CG iterations, calls of the Krylov reduction hook (the
    ``allreduce_sum`` it was given, wrapped), host copies through ``adaptmg.backend.to_host``,
    and with the stand-in device every device -> host ``get`` and NCCL allreduce."""
    import adaptmg.distributed.solve  # noqa: F401  (the package's name ``solve`` is the function)
    S = sys.modules["adaptmg.distributed.solve"]
    from adaptmg.backend import host_copies
    fake = sys.modules.get("fake_cupy")
    f_loc = mg.backend.asarray(mg.constrain_local(b))
    orig, calls = S.allreduce_sum, [0]

    def counting(comm, transport="mpi"):
        f = orig(comm, transport)

        def g(a):
            calls[0] += 1
            return f(a)
        return g

    def snap():
        return (host_copies(), fake.device_to_host() if fake else 0,
                fake.nccl_allreduces() if fake else 0, mg.timer.exchanges, mg.timer.idle)

    S.allreduce_sum = counting
    try:
        before = snap()
        _, info, its, _ = S.resolve(mg, f_loc, rtol=1e-10, maxiter=100)
        after = snap()
    finally:
        S.allreduce_sum = orig
    copies, gets, nccl, exchanges, idle = (int(a - b_) for a, b_ in zip(after, before))
    return dict(its=its, info=info, reductions=calls[0], host_copies=copies, gets=gets,
                nccl_allreduces=nccl, exchanges=exchanges, idle=idle)


def hook_record():
    """VectorOps reductions under global_reductions(Allreduce) vs the allgathered vectors."""
    rng = np.random.default_rng(COMM.rank)
    n = 50 + 7 * COMM.rank
    V, w = rng.standard_normal((3, n)), rng.standard_normal(n)
    Vg = np.concatenate(COMM.allgather(V), axis=1)
    wg = np.concatenate(COMM.allgather(w))
    ops = VectorOps(CPU, n, np.float64, rows=3)
    out, acc = np.zeros(3), np.ones(3)
    with global_reductions(allreduce_sum(COMM)):
        d = float(ops.dot(V[0], w))
        ops.mdot(V, w, out, acc=acc)
        nrm = global_norm(np, w)
    local = float(ops.dot(V[0], w))                  # outside the block: local again
    ref = Vg @ wg
    return dict(case="hook", dot_err=abs(d - ref[0]) / abs(ref).max(),
                mdot_err=float(np.abs(out - ref).max() / np.abs(ref).max()),
                acc_err=float(np.abs(acc - 1 - ref).max() / np.abs(ref).max()),
                norm_err=abs(nrm - np.linalg.norm(wg)) / np.linalg.norm(wg),
                local_err=abs(local - V[0] @ w) / abs(V[0] @ w))


def run_solve(out):
    serial_comm = COMM.Split(COMM.rank, 0)           # size 1: the serial code path
    hook = hook_record()
    recs = [hook]
    for name, make in CASES.items():
        space, A, b, kw = make()
        rec, dist = record(name, space, A, b, kw, serial_comm)
        recs.append(rec)
        if name == "q1-2d":                           # adaptive step: mark, refine, repartition
            u = dist.u
            cu = np.abs(u[space.mesh.cells]).mean(1)
            mesh2 = space.mesh.refine(cu >= np.quantile(cu, 0.8))
            s2 = Space(mesh2, 1)
            rec2, _ = record("q1-2d-adapted", s2, assemble.stiffness,
                             assemble.load(s2, lambda x: 1.0 + x[..., 0]), {}, serial_comm)
            rec2["cells_before"] = space.mesh.num_cells
            recs.append(rec2)
            rec3, _ = record("q1-2d-wcycle", space, A, b, dict(cycle="W"), serial_comm)
            recs.append(rec3)
            rec4, _ = record("q1-2d-replicated", space, A, b, dict(local_setup=False), serial_comm)
            recs.append(rec4)
            hook["sync"] = COMM.allgather(sync_counts(dist.mg, b))
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                short = solve(space, A, b, comm=COMM, rtol=1e-10, maxiter=2, agglomerate_below=50)
            hook["maxiter_info"] = short.info
            hook["maxiter_warned"] = any("did not reach" in str(w.message) for w in caught)
            for accel in ("gmres", "fgmres"):       # adaptmg.linalg unchanged, under the hook
                r, _ = record(f"q1-2d-{accel}", space, A, b, dict(accel=accel), serial_comm)
                recs.append(r)
    for name, (make, m, extra) in FOLDED.items():     # coarser levels on fewer ranks
        space, A, b, kw = make()
        rec, _ = record(name, space, A, b, dict(kw, min_dofs_per_rank=m, **extra), serial_comm)
        rec["min_dofs_per_rank"] = m
        recs.append(rec)
    if COMM.rank == 0:
        with open(out, "w") as fh:
            json.dump(recs, fh)


def run_failure(kind):
    space, A, b, kw = poisson(2, 2, 1)
    if kind == "bad-input":
        rtol = -1.0 if COMM.rank == 1 else 1e-8       # bad input on one rank only
        solve(space, A, b, comm=COMM, rtol=rtol)
    elif kind == "callback":
        def cb(k, x):
            if COMM.rank == 1 and k == 2:
                raise RuntimeError("user callback failed on purpose")
        solve(space, A, b, comm=COMM, rtol=1e-12, callback=cb)
    else:
        raise ValueError(f"unknown failure kind {kind!r}")
    print("not reached", flush=True)


# name -> (problem, solve arguments); every level as on the CPU (coarse_max_rows=None: the GPU
# default "auto" would cut the serial hierarchy below 2000 rows), smoothers Jacobi, block
# Jacobi and Chebyshev, the local and the replicated set-up, a folded level
GPU_CASES = {
    "q1-2d": (lambda: poisson(2, 3, 1), {}),
    "q1-2d-replicated-w": (lambda: poisson(2, 3, 1), dict(local_setup=False, cycle="W")),
    "q1-2d-folded": (lambda: poisson(2, 3, 1), dict(min_dofs_per_rank=300)),
    "q2-3d": (lambda: poisson(3, 1, 2), {}),
    "elasticity-2d": (lambda: elasticity(2, 2, "block_jacobi"), {}),
    "elasticity-3d": (lambda: elasticity(3, 1, "chebyshev"), {}),
}


def _rel(a, b):
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def _off_device(mg):
    """What of the distributed levels is not on the device (names; empty: everything is)."""
    from adaptmg.backend import is_device_array, is_device_sparse
    bad = []
    for l in range(mg.c, len(mg.levels)):
        d = mg.levels[l]
        for key in ("A", "P", "R"):
            D = getattr(d, key)
            if D.rows.n and D.Aoo.nnz and not is_device_sparse(D.Aoo_dev):
                bad.append(f"{l}.{key}.Aoo")
            if D.rows.n and D.Aog.nnz and not is_device_sparse(D.Aog_dev):
                bad.append(f"{l}.{key}.Aog")
            for buf in ("_gbuf", "_sdev", "_sidx"):
                if not is_device_array(getattr(D, buf)):
                    bad.append(f"{l}.{key}.{buf}")
        sm = d.smoother
        for name in ("dinv", "_d"):
            if hasattr(sm, name) and not is_device_array(getattr(sm, name)):
                bad.append(f"{l}.smoother.{name}")
        if hasattr(sm, "S") and sm.S is not None and not is_device_sparse(sm.S):
            bad.append(f"{l}.smoother.S")
    return sorted(set(bad))


def reduce_record(transport):
    """``allreduce_sum(COMM, transport)`` of device arrays (float64, float32, complex128) against
    the sum of the gathered host arrays: relative error in units of the dtype's eps, and
    whether the result stays on the device with the same shape and dtype."""
    from adaptmg.backend import get_backend, is_device_array, to_host
    xp = get_backend("gpu").xp
    f = allreduce_sum(COMM, transport)
    rng = np.random.default_rng(10 + COMM.rank)
    errs, same = {}, True
    for dt in ("float64", "float32", "complex128"):
        h = rng.standard_normal(5) + (1j * rng.standard_normal(5) if dt.startswith("complex") else 0)
        h = h.astype(dt)
        ref = np.sum(COMM.allgather(h.astype(np.complex128)), axis=0)
        out = f(xp.asarray(h))
        same &= is_device_array(out) and out.shape == h.shape and out.dtype == h.dtype
        eps = np.finfo(h.real.dtype).eps
        errs[dt] = float(np.abs(to_host(out) - ref).max() / np.abs(ref).max() / eps)
    return dict(case="reduce", transport=transport, device_out=bool(same), eps_err=errs)


def run_solve_gpu(out, fake):
    """Every GPU_CASES problem with backend="gpu" on all ranks vs one rank (GPU and CPU)."""
    from adaptmg.backend import is_device_array
    from adaptmg.distributed.comm import local_rank
    serial_comm = COMM.Split(COMM.rank, 0)
    recs = []
    for name, (make, extra) in GPU_CASES.items():
        space, A, b, kw = make()
        kw = {"min_dofs_per_rank": 0, "rtol": 1e-10, "agglomerate_below": 50, **kw, **extra}
        first = any(COMM.allgather(_SETUPS[0] == 0))       # this process's first local set-up
        dist = solve(space, A, b, comm=COMM, backend="gpu", coarse_max_rows=None, **kw)
        cpu = solve(space, A, b, comm=serial_comm, backend="cpu", **kw)
        gpu = None if fake else solve(space, A, b, comm=serial_comm, backend="gpu",
                                      coarse_max_rows=None, **kw)
        mg = dist.mg
        dl = [mg.levels[l] for l in range(mg.c, len(mg.levels))]
        transports = sorted({D.transport for d in dl for D in (d.A, d.P, d.R)} | {mg.transport})
        # the one MultilevelSolver's level vectors (the finest level's are the caller's)
        vectors = [v for d in mg.solver._dev for v in (d.x, d.b, d.r) if v is not None]
        device = (is_device_array(dist.x_local) and all(is_device_array(v) for v in vectors)
                  and mg.solver.backend.is_gpu
                  and all(getattr(d.smoother, "backend").is_gpu for d in dl))
        host_out = all(type(v) is np.ndarray for v in (dist.u, dist.x))
        rec = dict(case=name, its=dist.iterations, info=dist.info, its_cpu=cpu.iterations,
                   rel_err_cpu=_rel(dist.u, cpu.u), transports=transports, device=device,
                   host_out=host_out, backend=dist.ml.backend.name, size=COMM.size,
                   local_rank=COMM.allgather(local_rank(COMM)), off_device=_off_device(mg),
                   halo_bytes=COMM.allgather(mg.timer.bytes),
                   exchanges=COMM.allgather(mg.timer.exchanges),
                   setup_exchanges=COMM.allgather(mg.setup_exchanges),
                   idle=COMM.allgather(mg.timer.idle), setup_idle=COMM.allgather(mg.setup_idle),
                   setup_aside=COMM.allgather(getattr(mg, "aside_estimates", 0)),
                   priority_switches=COMM.allgather(getattr(mg, "priority_switches", 0)),
                   build_order=list(getattr(mg, "build_order", [])),
                   serial_built=COMM.allgather(getattr(mg, "serial_built", None)), first_setup=first,
                   serial_top_dofs=dist.ml.spaces[-1].num_dofs,
                   # the distributed levels' omega (None: no rows, or no omega) and the serial
                   # CPU hierarchy's on the same levels
                   omega=COMM.allgather([getattr(d.smoother, "omega", None) for d in dl]),
                   omega_cpu=[getattr(d.smoother, "omega", None) for d in cpu.ml._dev[-len(dl):]],
                   sync=COMM.allgather(sync_counts(mg, b)),
                   active_ranks=dist.active_ranks, agglomerated=mg.c, levels=len(mg.levels),
                   # per distributed level of the one solver (levels[0] is rank 0's): the
                   # smoother's fused flag (None: a rank without rows there, or no such flag)
                   fused=COMM.allgather([getattr(d.smoother, "fused", None)
                                         for d in mg.solver._dev[1:]]),
                   smoother=type(mg.solver._dev[-1].smoother).__name__)
        if gpu is not None:
            from adaptmg.distributed.comm import _placement, choose_transport, nccl_available
            places = COMM.allgather(_placement())
            ok = COMM.allgather(nccl_available())
            rec.update(its_gpu=gpu.iterations, rel_err_gpu=_rel(dist.u, gpu.u),
                       serial_gpu_vs_cpu=_rel(gpu.u, cpu.u), placements=places, nccl_ok=ok,
                       shared_gpu=len(set(map(tuple, places))) < len(places),
                       expected_transport=choose_transport("auto", places, ok)[0])
        recs.append(rec)
    recs.append(reduce_record(mg.transport))
    if fake:
        import fake_cupy
        recs.append(dict(case="fake", mode=fake, pinned=COMM.allgather(fake_cupy.pinned_allocations()),
                         device=COMM.allgather(fake_cupy.selected_device()),
                         nccl_calls=COMM.allgather(fake_cupy.nccl_calls()),
                         nccl_allreduces=COMM.allgather(fake_cupy.nccl_allreduces()),
                         stream_waits=COMM.allgather(fake_cupy.stream_waits())))
    if COMM.rank == 0:
        with open(out, "w") as fh:
            json.dump(recs, fh)


if __name__ == "__main__":
    install_excepthook()
    if sys.argv[1] == "solve":
        run_solve(sys.argv[2])
    elif sys.argv[1] == "solve-gpu":
        fake = next((a for a in sys.argv[3:] if a.startswith("--fake")), "")
        if fake:
            import fake_cupy
            nccl = fake == "--fake-nccl"
            fake_cupy.install(devices=COMM.size if nccl else 1, with_nccl=nccl)
        run_solve_gpu(sys.argv[2], fake)
    else:
        run_failure(sys.argv[1])
