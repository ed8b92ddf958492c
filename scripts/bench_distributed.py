"""Benchmark: distributed Q1 Poisson multigrid-CG (adaptmg.distributed, CPU/MPI or GPUs) -- weak and strong scaling.

Driver (launches ``mpiexec -n P`` for each P, one configuration per launch)::

    python scripts/bench_distributed.py --ranks 1 2 4 --dofs-per-rank 2e5        # weak scaling
    python scripts/bench_distributed.py --ranks 1 2 4 --strong-dofs 1e6          # strong scaling
    python scripts/bench_distributed.py --backend gpu --ranks 1 2 4 --dofs-per-rank 3e7   # one GPU per rank

The mesh is the box [0, P_x] x [0,1]^(d-1) with 2 P_x x 2 x ... root cells (P_x = P L for
weak scaling, L for strong; ``--length`` L, default 1), refined uniformly until about the
requested DoFs, plus one local refinement of the cells in a ball of radius ``--ball`` (0.2)
around (0.3, ...) -- for weak scaling one such ball in each of the P segments of length L,
around (0.3 + k L, 0.3, ...): the P-rank problem is P copies of the one-rank problem side by
side, so each rank has the one-rank problem's DoFs (up to the nodes the copies share) and its
hanging nodes (one ball in all left rank 0 with the hanging nodes and the others with ~10 %
fewer DoFs at P = 2).
``--matrix-free``: the finest level's operator is applied without a matrix
(``solve(..., matrix_free=True)``, :class:`adaptmg.distributed.matrix_free.DistMatrixFree`);
the largest problem on two GPUs::

    python scripts/bench_distributed.py --backend gpu --setup local --matrix-free --ranks 2 \
        --mode strong --strong-dofs 2.1e8 --length 1.5 --ball 0.1 --repeat 3 --phases

Reported per P: set-up time (max over ranks; ``--setup-repeat k``: the median of k timed
set-ups, each from a new mesh, every run listed -- a single set-up varies by +-5 % from run
to run on the GPUs; per rank: hierarchy + partition +
distributed matrices; ``--setup local`` builds the finest level from each rank's own cells plus a ghost layer and the serial
hierarchy only below it, ``replicated`` every rank the whole serial hierarchy, ``both``
runs each for comparison; ``cpu``: each rank's process CPU seconds of the set-up, which
include MPI's busy waiting; ``--phases``: the local set-up's phases per rank) with the
finest cells each rank assembled, solve time (CG to rtol 1e-8,
median of ``--repeat`` solves), iterations, the halo-exchange share of the solve (max
over ranks of the seconds in posting/packing/waiting, over the solve time; waiting
includes the load imbalance, e.g. while rank 0 runs the agglomerated coarse levels), the
coarse solver's share (rank 0's seconds in the serial cycle of those levels over the solve,
measured in one more solve with the device synchronised around each visit), and the
parallel efficiency (weak: (t_1 / N_1) / (t_P / (N_P / P)), N the DoFs, since the
refinement steps make N_P / P differ from N_1 a little; strong: t_1 / (P t_P)), and ``D2H``:
the device -> host copies (host synchronisations, :func:`adaptmg.backend.host_copies`) of
rank 0 in one solve (GPU; 0 on the CPU).

P = 1 is the serial code path (``multigrid().solve(accel="cg")``).  The mesh is replicated
on every rank; with ``--setup local`` the finest level's assembly, constrained matrix and
transfer rows scale with the rank's cells, the levels below (serial hierarchy on every rank)
and the mesh do not yet (see adaptmg.distributed).  On a machine with fewer cores
than ranks the ranks share cores and the numbers mean nothing.

``--backend gpu``: every rank takes the device of its node-local rank; the halo exchange is
NCCL when every rank has its own GPU, host-staged MPI otherwise (ranks sharing a GPU: then
the numbers mean nothing either); times are taken after a device synchronisation.
``--mesh-backend`` (default: the backend): where every rank builds the (replicated) mesh --
``gpu``: ``Mesh.box(..., backend="gpu")`` and the device refinement, and then the whole
per-rank set-up (hierarchy, owners, assembly, constraints, transfers, DistCSR blocks,
smoothers) runs on the device arrays; ``cpu``: the host mesh (the set-up on the host, moved
up).  ``mesh_s`` in the phases is the mesh and the load vector, not part of the set-up;
with ``--phases`` one row per rank, P = 1 included (its serial ``multigrid()`` set-up as
``multigrid_s``).  ``--cold``: each P runs in empty kernel cache folders -- without
``--warm-setup`` the first set-up a user meets on a new machine (kernels from the shipped
cubins, the rest compiled by NVRTC), e.g. ``--cold --ranks 2 --dofs-per-rank 2.6e6 --repeat 1``.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np


def in_balls(xp, c, px, ball, copies=1):
    """Whether the points ``c`` (n x d) lie within ``ball`` of the nearest of the ``copies``
    centres ``(0.3 + k px / copies, 0.3, ...)``, k < copies (one copy: ``|c - 0.3| < ball``,
    bit for bit)."""
    d = c - 0.3
    if copies > 1:                             # the nearest centre along x
        s = px / copies
        k = xp.clip(xp.rint(d[:, 0] / s), 0, copies - 1)
        d[:, 0] -= s * k
    return xp.linalg.norm(d, axis=1) < ball


def make_mesh(dim, px, target, backend="cpu", ball=0.2, copies=1):
    """``backend`` ("cpu"/"gpu"): where the mesh is built (``Mesh.box(..., backend=)``);
    ``ball``: the radius of the ball around (0.3, ...) whose cells are refined once more;
    ``copies``: that many balls, one in each of ``copies`` equal segments of ``[0, px]``
    (:func:`in_balls`; weak scaling: one a rank)."""
    from adaptmg.mesh import Mesh
    m = Mesh.box([0.0] * dim, [float(px)] + [1.0] * (dim - 1), [int(round(2 * px))] + [2] * (dim - 1),
                 backend=backend)
    while True:
        n_next = (m.num_nodes * 2 ** dim)
        if n_next > target:
            break
        m = m.refine()
    # the cell centres, m.points[m.cells].mean(1) with the same rounding (a sequential sum
    # over the vertices) from per-vertex row gathers: no (cells, 2^d, d) fancy-index gather
    from adaptmg.mesh._tree import _mean_of
    cells = m.cells
    if m.backend.is_gpu:                      # the same means: sums of dyadic coordinates, exact
        c = m.points[cells].mean(axis=1)
    else:
        c = _mean_of(m.points, [cells[:, j] for j in range(cells.shape[1])])
    return m.refine(in_balls(m.backend.xp, c, px, ball, copies))


def make_forest(dim, px, target, comm, copies=1):
    """The mesh of :func:`make_mesh` as a distributed forest (no rank holds it whole): the box's
    roots cut over the ranks, refined uniformly (its node count known in closed form), then
    the same local refinement, then re-cut into equal pieces.  Returns the forest and the
    seconds of each step (collective)."""
    from adaptmg.distributed.forest import DistributedForest
    t = [time.perf_counter()]
    n = np.array([2 * px] + [2] * (dim - 1))
    df = DistributedForest.box([0.0] * dim, [float(px)] + [1.0] * (dim - 1), n.tolist(), comm=comm)
    while np.prod(n + 1) * 2 ** dim <= target:      # make_mesh's rule, nodes of the uniform box
        df = df.refine()
        n = 2 * n
    t.append(time.perf_counter())
    df = df.refine(lambda c: in_balls(np, np.array(c, dtype=float), px, 0.2, copies))
    t.append(time.perf_counter())
    df = df.repartition()
    t.append(time.perf_counter())
    return df, {"forest_refine_s": t[1] - t[0], "forest_local_s": t[2] - t[1], "forest_repartition_s": t[3] - t[2]}


def level_size_args(args):
    """``(agglomerate_below, min_dofs_per_rank)`` from the command line: "auto", "none" (None:
    every distributed level on all ranks) or a number."""
    return [v if v == "auto" else None if v.lower() == "none" else int(float(v))
            for v in (args.agglomerate_below, args.min_dofs_per_rank)]


def forest_worker(args, comm):
    """``--setup forest``: the forest per rank, :func:`adaptmg.distributed.solve_forest`."""
    from adaptmg.distributed import solve_forest
    P = comm.Get_size()
    px = P if args.mode == "weak" else 1
    target = args.dofs_per_rank * P if args.mode == "weak" else args.strong_dofs
    comm.Barrier()
    t0 = time.perf_counter()
    df, tf = make_forest(args.dim, px, target, comm, copies=P if args.mode == "weak" else 1)
    t_forest = time.perf_counter() - t0
    sizes = level_size_args(args)
    r = solve_forest(df, f=1.0, rtol=1e-8, agglomerate_below=sizes[0], min_dofs_per_rank=sizes[1],
                     backend=args.backend)
    return r, df, t_forest, tf, t0


def worker(args):
    from mpi4py import MPI
    from adaptmg.distributed import install_excepthook
    install_excepthook()
    comm = MPI.COMM_WORLD
    P = comm.Get_size()
    if args.setup == "forest":
        if args.warm_setup:
            forest_worker(args, comm)
            _release(args)
        return report(args, comm, *forest_worker(args, comm))
    if args.warm_setup:                      # one untimed set-up: first-use kernel loads out of the figures
        _local_setup(args, comm)
        _release(args)
    samples = []                             # --setup-repeat: more timed set-ups, the median reported
    for _ in range(args.setup_repeat - 1):
        samples.append(_local_setup(args, comm))
        _release(args)
    _local_setup(args, comm, report_figures=True, samples=samples)


def _release(args):
    """Hand the pool's freed device blocks back (an untimed run's, the mesh refinement's peak)."""
    import gc
    gc.collect()
    if args.backend == "gpu":
        import cupy
        cupy.get_default_memory_pool().free_all_blocks()


def device_mb():
    """This rank's device memory held by CuPy's pool, MiB: the pool keeps freed blocks, so
    after the solve it is the run's high-water mark (up to fragmentation); 0 on the CPU."""
    try:
        import cupy
    except ImportError:
        return 0.0
    return round(cupy.get_default_memory_pool().total_bytes() / 2 ** 20, 1)


def _local_setup(args, comm, report_figures=False, samples=()):
    """Mesh, space, load and :func:`adaptmg.distributed.solve`'s set-up (local or replicated);
    with ``report_figures`` the timed solves and rank 0's JSON line (the set-up figure: the
    median of this one and the earlier ``samples``), else the set-up time (max over ranks)."""
    from adaptmg import assemble
    from adaptmg.distributed import solve
    from adaptmg.fe import Space
    P = comm.Get_size()
    px = args.length * (P if args.mode == "weak" else 1)
    target = args.dofs_per_rank * P if args.mode == "weak" else args.strong_dofs
    if args.mesh_backend == "gpu":           # the rank's device current before the mesh is made
        from adaptmg.distributed.comm import select_device
        select_device(comm)
    from adaptmg.backend import get_backend
    mbe = get_backend(args.mesh_backend)
    comm.Barrier()
    tm = time.perf_counter()
    mesh = make_mesh(args.dim, px, target, backend=args.mesh_backend, ball=args.ball,
                     copies=P if args.mode == "weak" else 1)
    space = Space(mesh, 1)
    b = assemble.load(space, 1.0)
    mbe.synchronize()
    t_mesh = time.perf_counter() - tm
    _release(args)                           # the refinement's peak blocks back (less fragmentation)
    comm.Barrier()
    t0 = time.perf_counter()
    sizes = level_size_args(args)
    r = solve(space, assemble.stiffness, b, comm=comm, rtol=1e-8, agglomerate_below=sizes[0],
              min_dofs_per_rank=sizes[1],
              local_setup=args.setup == "local", backend=args.backend, matrix_free=args.matrix_free)
    setup = comm.allgather(r.timings["setup"])            # per rank, before the first barrier
    assembled = comm.allgather(r.timings.get("fine_cells_assembled", mesh.num_cells))
    cpu = comm.allgather(r.timings.get("setup_cpu", setup[comm.Get_rank()]))
    ph = {"mesh_s": t_mesh, **{k: v for k, v in r.timings.items() if k.endswith("_s")}}
    if P == 1:                                             # the serial path: its one phase
        ph["multigrid_s"] = r.timings["setup"]
    phases = comm.allgather({k: round(v, 3) for k, v in ph.items()})
    if not report_figures:
        return max(setup)
    runs = list(samples) + [max(setup)]
    timed(args, comm, r, b, t0, dict(dofs=space.num_dofs, cells=mesh.num_cells, setup=float(np.median(runs)),
                                     setup_runs=runs, setup_per_rank=setup, setup_cpu=cpu, phases=phases,
                                     assembled=assembled))


def report(args, comm, r, df, t_forest, tf, t0):
    """The forest run's figures (:func:`timed`), with the forest's build time and per-rank memory."""
    setup = comm.allgather(r.timings["setup"])
    phases = comm.allgather({**{k: round(v, 3) for k, v in r.timings.items() if k.endswith("_s")},
                             **{k: round(v, 3) for k, v in tf.items()}})
    timed(args, comm, r, 1.0, t0,
          dict(dofs=df.num_global_nodes, cells=df.global_num_cells, setup=max(setup), setup_per_rank=setup,
               setup_cpu=comm.allgather(r.timings["setup_cpu"]), phases=phases,
               assembled=comm.allgather(df.num_owned), forest_s=comm.allreduce(t_forest, op=_max()),
               forest_mb=comm.allgather(round(df.local_nbytes() / 2 ** 20, 1)),
               active_ranks=list(r.active_ranks)))


def _max():
    from mpi4py import MPI
    return MPI.MAX


def timed(args, comm, r, b, t0, fields):
    """The timed solves on the set-up hierarchy of ``r`` and rank 0's JSON line."""
    from mpi4py import MPI
    P = comm.Get_size()
    from adaptmg.backend import host_copies
    solves, halos = [], []
    for _ in range(args.repeat):
        comm.Barrier()
        h0 = host_copies()
        t_solve, t_halo, its = solve_only(r, b, comm)
        copies = host_copies() - h0                 # device -> host copies (rank 0, last solve)
        solves.append(t_solve)
        halos.append(t_halo)
    t = float(np.median(solves))
    halo = float(np.median(halos))
    halo_max = comm.allreduce(halo, op=MPI.MAX)
    t_max = comm.allreduce(t, op=MPI.MAX)
    coarse = coarse_share(r, b, comm)
    fields["device_mb"] = comm.allgather(device_mb() if args.backend == "gpu" else 0.0)
    if args.profile:
        profile_solve(r, b, comm, args.profile)
    if comm.Get_rank() == 0:
        print(json.dumps(dict(P=P, backend=args.backend, transport=getattr(r.mg, "transport", "-"),
                              mode_setup=args.setup, solve=t_max, its=its, host_copies=copies, halo=halo_max,
                              coarse=coarse, wall=time.perf_counter() - t0, **fields)), flush=True)


def profile_solve(res, b, comm, top):
    """cProfile of one more solve on rank 0 (all ranks solve), the ``top`` functions by own
    and by cumulative time, printed to stdout before the result line.  Run with
    ``CUDA_LAUNCH_BLOCKING=1`` for device time to land in the launching function."""
    import cProfile
    import io
    import pstats
    pr = cProfile.Profile()
    comm.Barrier()
    if comm.Get_rank() == 0:
        pr.enable()
    solve_only(res, b, comm)
    if comm.Get_rank() == 0:
        pr.disable()
        s = io.StringIO()
        pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(top)
        pstats.Stats(pr, stream=s).sort_stats("cumulative").print_stats(top)
        print(s.getvalue(), flush=True)


def coarse_share(res, b, comm):
    """Share of one more solve that rank 0 spends in the coarse solver (the serial cycle of
    the levels agglomerated there, :class:`adaptmg.distributed.RankZeroCycle`), the device
    synchronised around each visit (that solve is not one of the timed ones); None on one
    rank."""
    if res.mg is None:
        return None
    co = res.mg.solver.coarse
    co.seconds, co.calls, co.sync = 0.0, 0, True
    comm.Barrier()
    t_solve, _, _ = solve_only(res, b, comm)
    co.sync = False
    return comm.bcast(co.seconds / t_solve if comm.Get_rank() == 0 else None, root=0)


def solve_only(res, b, comm):
    """(seconds, halo seconds, iterations) of one more CG solve on the hierarchy of ``res``
    (several ranks: adaptmg.linalg.cg preconditioned by the cycle of ``res.mg.solver``)."""
    from adaptmg.distributed import resolve
    ml, mg = res.ml, res.mg
    be = ml.backend if mg is None else mg.backend
    if mg is None:                                     # one rank: the serial code path
        its = [0]
        bd = be.asarray(ml.constrain(b))
        be.synchronize()
        t = time.perf_counter()
        ml.solve(bd, rtol=1e-8, accel="cg", callback=lambda xk: its.__setitem__(0, its[0] + 1))
        be.synchronize()
        return time.perf_counter() - t, 0.0, its[0]
    f_loc = mg.load_local(b) if hasattr(mg, "load_local") else mg.constrain_local(b)    # forest: b = f
    if be.is_gpu:
        f_loc = be.asarray(f_loc)
    mg.timer.reset()
    be.synchronize()
    t = time.perf_counter()
    # like the one-rank path (ml.solve), no reported final residual: CG has checked the true
    # residual itself
    _, _, its, _ = resolve(mg, f_loc, rtol=1e-8, maxiter=200, true_residual=False)
    be.synchronize()
    return time.perf_counter() - t, mg.timer.seconds, its


def driver(args):
    from adaptmg.distributed.comm import find_mpiexec, mpiexec_command
    if find_mpiexec() is None:
        sys.exit("mpiexec not found: pip install 'adaptmg[mpi]'")
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", ADAPTMG_THREADS="1",
               NCCL_NVLS_ENABLE="0")
    rows = []
    setups = ["local", "replicated"] if args.setup == "both" else [args.setup]
    for P in args.ranks:
        for mode in (setups if P > 1 else setups[:1]):       # one rank: the serial path either way
            cmd = mpiexec_command(P, gpu=args.backend == "gpu") + [sys.executable, os.path.abspath(__file__), "--worker",
                   "--backend", args.backend, "--mode", args.mode, "--dim", str(args.dim), "--repeat", str(args.repeat),
                   "--dofs-per-rank", str(args.dofs_per_rank), "--strong-dofs", str(args.strong_dofs),
                   "--agglomerate-below", str(args.agglomerate_below),
                   "--min-dofs-per-rank", str(args.min_dofs_per_rank),
                   "--setup", mode, "--profile", str(args.profile), "--mesh-backend", args.mesh_backend,
                   "--length", str(args.length), "--ball", str(args.ball)] + \
                  (["--warm-setup"] if args.warm_setup else []) + (["--matrix-free"] if args.matrix_free else []) + \
                  ["--setup-repeat", str(args.setup_repeat)]
            run_env, cold_dir = env, None
            if args.cold:                    # a first run on a machine: empty kernel cache folders
                cold_dir = tempfile.mkdtemp(prefix="adaptmg-cold-")
                run_env = dict(env, CUPY_CACHE_DIR=os.path.join(cold_dir, "cupy"),
                               ADAPTMG_KERNEL_CACHE=os.path.join(cold_dir, "adaptmg"))
            try:
                out = subprocess.run(cmd, env=run_env, capture_output=True, text=True, timeout=args.timeout)
            finally:
                if cold_dir is not None:
                    shutil.rmtree(cold_dir, ignore_errors=True)
            if out.returncode != 0:
                sys.exit(f"P={P} failed:\n{out.stderr[-4000:]}")
            lines = out.stdout.strip().splitlines()
            if args.profile:
                print(f"# profile of one solve on rank 0, P = {P}\n" + "\n".join(lines[:-1]))
            rows.append(json.loads(lines[-1]))
    t1 = rows[0]["solve"] if rows[0]["P"] == 1 else None
    print(f"{args.mode} scaling, {args.dim}-D Q1 Poisson, multigrid-CG to rtol 1e-8 "
          f"({'CPU/MPI' if args.backend == 'cpu' else 'GPU, transport ' + str(rows[-1].get('transport'))}, "
          f"mesh on the {args.mesh_backend}, {os.cpu_count()} cores{', empty kernel caches' if args.cold else ''})")
    print(f"{'P':>3} {'set-up':>10} {'DoFs':>10} {'setup s':>9} {'solve s':>9} {'its':>4} {'halo %':>7} "
          f"{'coarse %':>8} {'eff %':>6} {'D2H':>4}  set-up s per rank / finest cells assembled per rank (of all)")
    for r in rows:
        eff = "-"
        if t1 is not None:
            if args.mode == "weak":          # per-rank size not exactly equal: scale by DoFs
                e = t1 / r["solve"] * r["dofs"] / (r["P"] * rows[0]["dofs"])
            else:
                e = t1 / (r["P"] * r["solve"])
            eff = f"{100 * e:.0f}"
        mode = r["mode_setup"] if r["P"] > 1 or r["mode_setup"] == "forest" or args.matrix_free else "serial"
        mode += "-mf" if args.matrix_free else ""
        per = " ".join(f"{t:.3f}" for t in r["setup_per_rank"])
        cells = " ".join(str(c) for c in r["assembled"])
        cpu = " ".join(f"{t:.3f}" for t in r["setup_cpu"])
        coarse = "-" if r.get("coarse") is None else f"{100 * r['coarse']:.1f}"
        d2h = r.get("host_copies", "-")
        print(f"{r['P']:>3} {mode:>10} {r['dofs']:>10} {r['setup']:>9.3f} {r['solve']:>9.4f} {r['its']:>4} "
              f"{100 * r['halo'] / r['solve']:>7.1f} {coarse:>8} {eff:>6} {d2h:>4}  [{per}] cpu [{cpu}] / [{cells}] ({r['cells']})")
        if args.mode == "weak" and r["P"] > 1 and rows[0]["P"] == 1:
            size = r["dofs"] / (r["P"] * rows[0]["dofs"])          # a rank's DoFs over one rank's
            print(f"      set-up vs P = 1: {r['setup'] / rows[0]['setup']:.2f}x with {size:.3f}x the DoFs "
                  f"per rank")
        if len(r.get("setup_runs", [])) > 1:
            print(f"      set-up s of {len(r['setup_runs'])} runs (median above; per rank: the last): "
                  + " ".join(f"{t:.3f}" for t in r["setup_runs"]))
        if args.backend == "gpu" and r.get("device_mb"):
            mb = r["device_mb"]
            print(f"      device memory per rank (CuPy pool after the solves) [{' '.join(f'{m:.0f}' for m in mb)}] MiB, "
                  f"{2 ** 20 * sum(mb) / r['dofs']:.0f} B per DoF")
        if "forest_mb" in r:
            print(f"      forest: built in {r['forest_s']:.3f} s, local arrays per rank "
                  f"[{' '.join(f'{m:.1f}' for m in r['forest_mb'])}] MB; active ranks per level "
                  f"(coarse -> fine) {r.get('active_ranks')}")
        if args.phases and any(r["phases"]):
            for q, ph in enumerate(r["phases"]):
                print(f"      rank {q}: " + ", ".join(f"{k} {v:.3f}" for k, v in ph.items()))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--mode", choices=["weak", "strong"], default=None)
    ap.add_argument("--dim", type=int, choices=[2, 3], default=3)
    ap.add_argument("--dofs-per-rank", type=float, default=2e5)
    ap.add_argument("--strong-dofs", type=float, default=None)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--phases", action="store_true", help="print the local set-up's phases per rank")
    ap.add_argument("--setup", choices=["local", "replicated", "both", "forest"], default="both",
                    help="finest level from each rank's cells (local), every rank the whole serial "
                         "hierarchy (replicated, the first version), both for comparison, or every "
                         "level from a distributed forest (forest: no rank holds the whole mesh; "
                         "P = 1 runs it too)")
    ap.add_argument("--timeout", type=int, default=1800)
    ap.add_argument("--profile", type=int, default=0,
                    help="cProfile one more solve on rank 0 and print the top N functions")
    ap.add_argument("--agglomerate-below", default="auto",
                    help="levels with fewer DoFs on rank 0 (auto: 1000 CPU, 2^19 GPU)")
    ap.add_argument("--min-dofs-per-rank", default="auto",
                    help="DoFs per rank of a coarser distributed level (auto: 2000 CPU, 2^18 GPU; none: all ranks)")
    ap.add_argument("--backend", choices=["cpu", "gpu"], default="cpu")
    ap.add_argument("--mesh-backend", choices=["cpu", "gpu"], default=None,
                    help="where each rank builds the mesh and runs the set-up (default: the backend)")
    ap.add_argument("--warm-setup", action="store_true",
                    help="run the mesh and set-up once untimed first (the set-up figures then leave out "
                         "first-use kernel loads and the allocator's growth)")
    ap.add_argument("--cold", action="store_true",
                    help="run each P in empty kernel cache folders (CUPY_CACHE_DIR, ADAPTMG_KERNEL_CACHE): "
                         "what a first run on a machine meets (the shipped cubins still served); without "
                         "--warm-setup the set-up is then the first in a fresh process with empty caches")
    ap.add_argument("--setup-repeat", type=int, default=1,
                    help="timed set-ups per P (each from a new mesh; --setup local / replicated): the median "
                         "is reported, every run listed (the per-rank and phase figures: the last run's)")
    ap.add_argument("--matrix-free", action="store_true",
                    help="the finest level's operator without a matrix (solve(..., matrix_free=True); "
                         "with --setup local; P = 1 then takes the distributed path on one rank)")
    ap.add_argument("--length", type=float, default=1.0,
                    help="x-extent of the box per rank (weak) or in all (strong), 2 root cells a unit: "
                         "e.g. 1.5 with --strong-dofs 2.1e8 gives 202M DoFs")
    ap.add_argument("--ball", type=float, default=0.2,
                    help="radius of the ball around (0.3, ...) refined once more (hanging nodes; --setup "
                         "local and replicated; weak scaling: one ball in each rank's segment of the box)")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.mode is None:
        args.mode = "strong" if args.strong_dofs else "weak"
    if args.strong_dofs is None:
        args.strong_dofs = 1e6
    if args.mesh_backend is None:
        args.mesh_backend = args.backend
    if args.mesh_backend == "gpu" and args.backend != "gpu":
        ap.error("--mesh-backend gpu needs --backend gpu")
    args.dofs_per_rank, args.strong_dofs = int(args.dofs_per_rank), int(args.strong_dofs)
    if args.length <= 0 or abs(2 * args.length - round(2 * args.length)) > 1e-12:
        ap.error(f"--length must be a positive multiple of 0.5, got {args.length}")
    if args.matrix_free and args.setup != "local":
        ap.error("--matrix-free needs --setup local")
    if args.setup_repeat < 1 or (args.setup_repeat > 1 and args.setup == "forest"):
        ap.error(f"--setup-repeat must be >= 1 (1 with --setup forest), got {args.setup_repeat}")
    if args.worker:
        worker(args)
    else:
        driver(args)


if __name__ == "__main__":
    main()
