"""Compile adaptmg's GPU kernels ahead of time, in parallel (``adaptmg warmup``).

A kernel is compiled (NVRTC) the first time a process needs it and then read from the
kernel caches (:mod:`adaptmg.device.kernel_cache`).  Which kernels a run needs depends on
dtypes, element degrees, smoothers and code paths, and -- through the block shapes of
CuPy's reductions -- on the size class of the arrays, so small and medium problems of
every kind compile nearly all of them.  :func:`warmup` runs such small problems -- the
*tasks* of :data:`TASKS` -- each in its own process, ``jobs`` at a time: NVRTC runs on all
cores instead of one, and every cubin lands in adaptmg's cache, where a later process
finds it even when CuPy's own cache is empty.  A task that fails is reported, not raised:
its kernels are then compiled on first use, as without the warm-up.
"""
from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

__all__ = ["TASKS", "warmup", "run_task"]


def _ones(x):
    return 1.0 + 0.0 * x[..., 0]


def _mesh(dim, n, local, backend="cpu", length=1):
    """A box ``[0, length] x [0, 1]^(dim-1)`` of ``2 length x 2 x ...`` roots refined ``n``
    times, then ``local`` times in the ball of radius 0.25 around (0.3, ...)."""
    from ..mesh import Mesh
    m = Mesh.box([0.0] * dim, [float(length)] + [1.0] * (dim - 1), [2 * length] + [2] * (dim - 1),
                 backend=backend)
    xp = m.backend.xp
    for _ in range(n):
        m = m.refine()
    for _ in range(local):
        c = m.points[m.cells].mean(axis=1)
        m = m.refine(xp.linalg.norm(c - 0.3, axis=1) < 0.25)
    return m


def _solve_all(ml, b, accels=("cg", "gmres", "fgmres")):
    for accel in accels:
        ml.solve(b, rtol=1e-8, accel=accel)
        ml.solve(b, rtol=1e-8, accel=accel)        # second solves record CUDA graphs
    ml.solve(b, rtol=1e-8)


def _geometric(backend, dim, degree, n, local, dtypes=("float64", "float32"), smoothers=("jacobi",),
               components=1, mesh_on_backend=False):
    from .. import assemble, multigrid
    from ..fe import Space
    mesh = _mesh(dim, n, local, backend if mesh_on_backend else "cpu")
    space = Space(mesh, degree=degree, components=components)
    if components == 1:
        form, f = assemble.stiffness, _ones
    else:
        def form(s):
            return assemble.elasticity(s, 1.0, 1.0)

        def f(x):
            return np.ones(x.shape[:-1] + (components,))
    for dtype in dtypes:
        for sm in smoothers:
            ml = multigrid(space, form, dirichlet="all", backend=backend, dtype=np.dtype(dtype),
                           smoother=sm)
            b = ml.constrain(assemble.load(space, f))
            _solve_all(ml, b)
            ml.expand(ml.solve(b, rtol=1e-8, accel="cg"))


#: free device memory (GiB) a task of ~2e7 DoFs needs; a smaller GPU skips it (it never runs
#: problems that large, so it needs none of their kernels)
HUGE_GIB = 48


def _device_fits(backend, gib=HUGE_GIB) -> bool:
    """Whether ``backend`` is the GPU and its current device has ``gib`` GiB free."""
    if backend != "gpu":
        return False
    from ..backend import get_backend
    free, _ = get_backend("gpu").xp.cuda.runtime.memGetInfo()
    return free >= gib * 2 ** 30


@contextlib.contextmanager
def _one_large_task_at_a_time():
    """Run the body while no other warm-up process runs a large problem (an exclusive lock on
    a file in the temporary folder): :func:`warmup` starts its tasks in parallel processes on
    one device, and two of the ~2e7-DoF problems side by side would not fit in its memory.
    The body's device memory goes back to the driver (CuPy's pools emptied) before the lock
    is let go, so the next holder sees it free.  Where file locks are not available the body
    runs at once."""
    try:
        import fcntl
    except ImportError:                        # no POSIX locks: no serialisation
        yield
        return
    path = os.path.join(tempfile.gettempdir(), f"adaptmg-warmup-large-{os.getuid()}.lock")
    with open(path, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            _release_device_memory()
            fcntl.flock(fh, fcntl.LOCK_UN)


def _memory_frees_up(backend, gib, timeout=120.0, poll=0.5) -> bool:
    """Whether ``gib`` GiB of the current device are free, waiting up to ``timeout`` seconds for
    the tasks beside this one to give theirs back; False at once where the device is smaller
    than that (or ``backend`` is not the GPU)."""
    if backend != "gpu":
        return False
    from ..backend import get_backend
    if get_backend("gpu").xp.cuda.runtime.memGetInfo()[1] < gib * 2 ** 30:
        return False
    end = time.monotonic() + timeout
    while not _device_fits(backend, gib):
        if time.monotonic() > end:
            return False
        time.sleep(poll)
    return True


def _release_device_memory():
    """Collect garbage and empty CuPy's memory pools (nothing where CuPy was never imported)."""
    cupy = sys.modules.get("cupy")
    if cupy is None:
        return
    import gc
    gc.collect()
    try:
        cupy.get_default_memory_pool().free_all_blocks()
        cupy.get_default_pinned_memory_pool().free_all_blocks()
    except Exception:                          # noqa: BLE001 - a warm-up helper: never fatal
        pass


def _large(backend, gib, fn, *args):
    """``fn(*args)`` on a GPU of at least ``gib`` GiB once that much is free, one large task at
    a time; nothing on the host."""
    if backend != "gpu":
        return
    with _one_large_task_at_a_time():
        if _memory_frees_up(backend, gib):
            fn(*args)


def _huge(backend, *args):
    """:func:`_geometric` of a ~2e7-DoF problem, on a GPU of at least :data:`HUGE_GIB` GiB
    (:func:`_large`)."""
    _large(backend, HUGE_GIB, _geometric, backend, *args)


def _amg(backend, dim, n, local=0):
    from .. import amg, assemble, multigrid
    from ..fe import Space
    space = Space(_mesh(dim, n, local), degree=1)
    ml = multigrid(space, assemble.stiffness, dirichlet="all", backend="cpu", max_coarse=None)
    A = ml.A
    b = ml.constrain(assemble.load(space, _ones))
    for smoother in ("chebyshev", "jacobi"):
        mg = amg(A, backend=backend, smoother=smoother)
        _solve_all(mg, b)


def _adaptive(backend, name, max_dofs=30000, gpu_max_dofs=None):
    """``name``'s adaptive loop to ``max_dofs`` (on the GPU to ``gpu_max_dofs`` when given: CuPy's
    reduction kernels are specialised by the sizes they meet, so a loop that stops early leaves
    the late steps' kernels to the user's first full loop)."""
    try:
        mod = __import__(f"adaptmg_problems.{name}", fromlist=["run"])
    except ImportError:                  # problems/ not installed: nothing to warm
        return
    big = gpu_max_dofs if backend == "gpu" and gpu_max_dofs else max_dofs
    mod.run(backend=backend, quiet=True, max_dofs=big)


def _spectral(backend, n, degrees, solve_degree=3):
    """Spectral operators (the fused element kernel of every degree, float64 and float32,
    and the batched path) and the fused fine-scale kernel P^f on a distorted n^3 cube, and
    one two-scale solve."""
    from ..spectral import SpectralOperator, SpectralSpace, poisson
    from ..spectral.meshes import distorted_box
    from ..spectral.schwarz import FineSchwarz
    mesh = distorted_box(3, n)
    for k in degrees:
        V = SpectralSpace(mesh, k)
        fixed = V.boundary_dofs("all")
        for dtype in (np.float64, np.float32):
            P = FineSchwarz(V, fixed, mass=1.0, dtype=dtype, backend=backend)
            P(P.xp.asarray(V.points[:, 0], dtype=dtype))
            for fused in (True, False):
                op = SpectralOperator(V, mass=0.5, dtype=dtype, backend=backend, fused=fused)
                op.cell_apply(op.xp.asarray(V.points[V.cell_dofs, 0], dtype=dtype).reshape(op._cshape))
                op.matvec(op.xp.asarray(V.points[:, 0], dtype=dtype))
    poisson(mesh, solve_degree, _ones, backend=backend)


def _distributed(backend, levels=(4, 6, 7), ranks=2, length=1, variants=True, gib=HUGE_GIB):
    """:func:`adaptmg.distributed.solve` with the local set-up on ``ranks`` in-process ranks
    (:mod:`adaptmg.distributed.thread_comm`: both sides of every exchange, rank 0's serial
    levels and the other ranks' cut and hand-over) on a box refined ``levels`` times plus one
    local refinement (CuPy's reductions compile per size class, and arrays past 2 GB take
    kernels with 64-bit indices: ~3e4, ~1.3e6 and ~1e7 DoFs a rank by default, the last on a
    GPU with ``gib`` GiB free only, one large task at a time), the mesh on the backend; the
    smallest one also with a host mesh and with matrix-free levels (``variants``).  The ranks
    share this process's device, so the halo goes by host staging: what only the NCCL path
    compiles is left to the first run that needs it (:func:`_distributed_huge`: the replicated
    mesh past 2 GB)."""
    from .. import assemble
    from ..distributed import solve
    from ..distributed.thread_comm import run_ranks
    from ..fe import Space

    def one(comm, n, mesh_backend, matrix_free):
        space = Space(_mesh(3, n, 1, mesh_backend, length), 1)
        b = assemble.load(space, 1.0)
        solve(space, assemble.stiffness, b, comm=comm, rtol=1e-8, local_setup=True, backend=backend,
              matrix_free=matrix_free)
    for i, n in enumerate(levels):
        if n >= 7:                                       # ~2e7 DoFs in all: a large GPU only
            _large(backend, gib, run_ranks, ranks, one, n, backend, False)
            continue
        run_ranks(ranks, one, n, backend, False)
        if i == 0 and variants:
            run_ranks(ranks, one, n, "cpu", False)
            run_ranks(ranks, one, n, backend, True)


#: free device memory (GiB) that :func:`_estimate_huge` needs: the residual estimator's face
#: matching on a ~2e7-DoF 3-D mesh held a CuPy pool of 95 GiB (one H200)
ESTIMATE_HUGE_GIB = 115


def _estimate_huge(backend):
    """:func:`adaptmg.estimate.residual_indicators` on a ~2e7-DoF 3-D mesh with hanging nodes on
    the device (the ``q1-3d-device-mesh-huge`` mesh): the face matching's arrays pass 2 GB and
    take kernels of their own -- 22 compiled on a first call at 21M DoFs, 3.3 s against 0.8 s
    for the second (one H200), what every 3-D adaptive loop on the GPU met at that size.  On
    a GPU with :data:`ESTIMATE_HUGE_GIB` GiB free only, one large task at a time."""
    _large(backend, ESTIMATE_HUGE_GIB, _estimate_on_device_mesh, backend, 3, 7, 1)


def _estimate_on_device_mesh(backend, dim, n, local):
    from ..estimate import residual_indicators
    from ..fe import Space
    space = Space(_mesh(dim, n, local, backend), 1)
    xp = space.mesh.backend.xp
    residual_indicators(space, xp.linspace(0.0, 1.0, space.num_dofs), f=1.0)


#: free device memory (GiB) that :func:`_distributed_huge` needs: two ranks of ~2e7 DoFs, each
#: with its own copy of the ~4e7-cell mesh, on one device
DISTRIBUTED_HUGE_GIB = 100


def _distributed_huge(backend):
    """:func:`_distributed` on two in-process ranks with a replicated mesh of ~4e7 cells (~2e7
    DoFs a rank, as two GPUs of ``bench_distributed.py --dofs-per-rank 2.1e7`` hold them): the
    mesh's arrays pass 2 GB (its cells: 4e7 x 8 int64), so its hierarchy, free masks, cut and
    the local levels' cell selections take CuPy's and adaptmg's kernels with 64-bit indices --
    kernels that a one-GPU problem of the same size per GPU never meets.  On a GPU with
    :data:`DISTRIBUTED_HUGE_GIB` GiB free only, one large task at a time (the machine that
    records the manifest: the shipped cubins then serve every GPU of those architectures)."""
    _distributed(backend, levels=(7,), length=2, variants=False, gib=DISTRIBUTED_HUGE_GIB)


def _distributed_adaptive(backend, max_dofs=20000, ranks=2):
    """The two distributed adaptive loops on ``ranks`` in-process ranks
    (:mod:`adaptmg.distributed.thread_comm`), each to ``max_dofs``: the mesh whole on every rank
    (:func:`adaptmg.distributed.adaptive_loop_replicated`, the L-shape with zero boundary
    data: its source's and the estimator's, marks' and gather's kernels) and the distributed
    forest (:func:`adaptmg.distributed.adaptive_loop_forest`, the Fichera cube: the forest's
    device levels, loads and marks).  Without them a first two-GPU loop in a fresh process
    compiled 6-8 and 4 kernels of CuPy's (its first step's set-up 4.7 s against 0.7 s in a
    second process, and 2.3 s against 1.6 s; two H200); the halo transport here is host
    staging, as in :func:`_distributed`.  Skipped where the problems package is not installed."""
    try:
        from adaptmg_problems import fichera, lshape
    except ImportError:                  # problems/ not installed: nothing to warm
        return
    from ..distributed import adaptive_loop_forest, adaptive_loop_replicated
    from ..distributed.forest import DistributedForest
    from ..distributed.thread_comm import run_ranks

    def replicated(comm):
        mesh = lshape.coarse_mesh().to(backend).refine().refine()
        adaptive_loop_replicated(mesh, lshape.source_zero_bc, comm=comm, steps=30, max_dofs=max_dofs,
                                 tie_rtol=1e-8, backend=backend)

    def forest(comm):
        F = DistributedForest.from_coarse(fichera.coarse_mesh(), comm=comm).refine().repartition()
        adaptive_loop_forest(F, 1.0, steps=30, max_dofs=max_dofs, tie_rtol=1e-8, backend=backend)
    run_ranks(ranks, replicated)
    run_ranks(ranks, forest)


#: name -> (function, args): the small problems :func:`warmup` runs, one process each; in
#: priority order (the kernel manifest's replay order, :mod:`.kernel_manifest`: the most
#: common problems' kernels first)
TASKS = {
    "q1-3d": (_geometric, (3, 1, 3, 1)),
    "q1-3d-large": (_geometric, (3, 1, 5, 0, ("float64",))),
    "q1-2d": (_geometric, (2, 1, 4, 2)),
    "q1-2d-large": (_geometric, (2, 1, 9, 1, ("float64",))),
    # the mesh on the device (Mesh.box(..., backend="gpu")): refinement, numbering, hanging
    # nodes and the set-up's index work on CuPy arrays -- their sorts and reductions, also at a
    # larger size (CuPy's reduction kernels follow the array sizes, see amg-3d-large)
    "q1-3d-device-mesh": (_geometric, (3, 1, 3, 1, ("float64",), ("jacobi",), 1, True)),
    "q1-3d-device-mesh-large": (_geometric, (3, 1, 5, 1, ("float64",), ("jacobi",), 1, True)),
    # ... and a ~2e7-DoF one with hanging nodes: arrays past 2 GB (the matrix, the assembly's
    # entries) take CuPy's and adaptmg's kernels with 64-bit indices, compiled separately
    "q1-3d-device-mesh-huge": (_huge, (3, 1, 7, 1, ("float64",), ("jacobi",), 1, True)),
    "q1-2d-device-mesh": (_geometric, (2, 1, 5, 2, ("float64",), ("jacobi",), 1, True)),
    "amg-3d": (_amg, (3, 4)),
    # CuPy's reduction kernels are compiled per block shape, which follows the array sizes:
    # larger problems too (measured: a 340k-DoF adaptive matrix needed 5 more than amg-3d's)
    "amg-3d-large": (_amg, (3, 5, 1)),
    "amg-2d": (_amg, (2, 6)),
    "amg-2d-large": (_amg, (2, 9)),
    "lshape": (_adaptive, ("lshape", 30000, 1_000_000)),
    "fichera": (_adaptive, ("fichera",)),
    "elasticity-3d": (_geometric, (3, 1, 2, 1, ("float64",), ("block_jacobi", "block_gauss_seidel"), 3)),
    "q2-3d": (_geometric, (3, 2, 2, 1, ("float64",))),
    "q2-2d": (_geometric, (2, 2, 3, 2, ("float64",))),
    "smoothers-2d": (_geometric, (2, 1, 4, 1, ("float64",),
                                  ("chebyshev", "gauss_seidel", "l1_gauss_seidel", "block_jacobi"))),
    "spectral": (_spectral, (2, tuple(range(1, 9)))),
    "distributed": (_distributed, ()),
    "distributed-huge": (_distributed_huge, ()),
    "distributed-adaptive": (_distributed_adaptive, ()),
    "estimate-huge": (_estimate_huge, ()),
}


def run_task(name, backend="gpu", record=None):
    """Run one task of :data:`TASKS` in this process (``backend="cpu"`` runs the same
    problems on the host: a check that the tasks themselves work).  ``record``: a path where
    the kernels NVRTC was asked for are logged (:func:`.kernel_manifest.record`)."""
    if name not in TASKS:
        raise ValueError(f"unknown warm-up task {name!r}; known: {', '.join(TASKS)}")
    fn, args = TASKS[name]
    if record is None:
        fn(backend, *args)
        return
    from .kernel_manifest import record as recording
    with recording(record):
        fn(backend, *args)


def warmup(tasks=None, jobs=None, quiet=False, timeout=900, record=None):
    """Compile the kernels of ``tasks`` (default all of :data:`TASKS`) in ``jobs`` parallel
    processes (default: one per task, at most the CPU count).  Returns ``{task: (ok,
    seconds, message)}``.  Needs a GPU (RuntimeError otherwise).  ``record``: also write the
    kernel manifest there (:mod:`.kernel_manifest`; run it with empty kernel caches: a
    task whose kernels are all cached still logs them, in its own first-use order)."""
    from ..backend import get_backend
    from .kernel_cache import cache_dir
    get_backend("gpu")                           # the clear error where there is no GPU
    names = list(TASKS) if tasks is None else list(tasks)
    bad = [t for t in names if t not in TASKS]
    if bad:
        raise ValueError(f"unknown warm-up tasks {bad}; known: {', '.join(TASKS)}")
    if jobs is None:
        jobs = min(len(names), os.cpu_count() or 1)
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise ValueError(f"jobs must be a positive integer, got {jobs!r}")
    say = (lambda *a: None) if quiet else (lambda *a: print(*a, flush=True))
    say(f"adaptmg warmup: {len(names)} tasks, {jobs} at a time, kernel cache {cache_dir()}")
    pending, running, results = list(names), {}, {}
    parts = {}
    if record is not None:
        import tempfile
        rec_dir = tempfile.mkdtemp(prefix="adaptmg-record-")
        parts = {n: os.path.join(rec_dir, f"{n}.json") for n in names}
    t0 = time.perf_counter()
    while pending or running:
        while pending and len(running) < jobs:
            name = pending.pop(0)
            rec = parts.get(name)
            cmd = [sys.executable, "-c", f"from adaptmg.device.warmup import run_task; run_task({name!r}, record={rec!r})"]
            env = dict(os.environ, ADAPTMG_PREFETCH="0")      # the tasks compile; no replay beside them
            running[name] = (subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                              text=True, env=env), time.perf_counter())
        time.sleep(0.05)
        for name, (proc, ts) in list(running.items()):
            if proc.poll() is None and time.perf_counter() - ts < timeout:
                continue
            if proc.poll() is None:
                proc.kill()
            err = proc.communicate()[1] or ""
            ok = proc.returncode == 0
            msg = "" if ok else (err.strip().splitlines() or ["killed (timeout)"])[-1]
            results[name] = (ok, time.perf_counter() - ts, msg)
            del running[name]
            say(f"  {name:<14} {'ok' if ok else 'FAILED'} {results[name][1]:6.1f} s {msg}")
    say(f"adaptmg warmup: done in {time.perf_counter() - t0:.1f} s")
    if record is not None:
        from .kernel_manifest import merge
        done = {n: p for n, p in parts.items() if results[n][0] and os.path.exists(p)}
        merge(done, record)
        say(f"adaptmg warmup: kernel manifest of {len(done)} tasks written to {record}")
    return results
