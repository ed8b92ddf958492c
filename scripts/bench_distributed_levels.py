"""Benchmark: the distributed levels' own cost on ONE rank, against the serial levels.

    python scripts/bench_distributed_levels.py --dofs 2.1e7 --backend gpu

Builds the mesh family of ``scripts/bench_distributed.py`` (uniform refinement to about
``--dofs`` DoFs plus one local refinement), the serial hierarchy (``adaptmg.multigrid``) and
the distributed one on a communicator of one rank (the local set-up of
``adaptmg.distributed.solve``, forced: on one rank ``solve`` takes the serial path), and times
on the same data, per level (CUDA events on the GPU, medians of 20): the product ``A x``, two
smoothing sweeps, the transfers; then one eager V-cycle and one CG solve to 1e-8 (the
distributed one without the reported final residual, as ``bench_distributed.py`` times it).
What remains between the two columns is the distributed levels' own overhead (their
kernels, the exchange bookkeeping, the Krylov layer's reductions through the hook), apart
from any communication: there is no neighbour.
"""
import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))


def main(argv=None):
    """Run the benchmark (``argv``: the command-line arguments); returns ``{"serial": ms,
    "distributed": ms}`` of the CG solves."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dofs", type=float, default=2.6e6)
    ap.add_argument("--backend", choices=["cpu", "gpu"], default="gpu")
    ap.add_argument("--reps", type=int, default=20)
    a = ap.parse_args(argv)
    from mpi4py import MPI
    from bench_distributed import make_mesh
    from adaptmg import assemble, multigrid
    from adaptmg.backend import get_backend
    from adaptmg.distributed.solve import _solve_local, level_sizes, resolve
    from adaptmg.fe import Space
    be = get_backend(a.backend)
    xp = be.xp
    mesh = make_mesh(3, 1, a.dofs)
    space = Space(mesh, 1)
    b = assemble.load(space, 1.0)
    t = time.perf_counter()
    ml = multigrid(space, assemble.stiffness, backend=a.backend)
    t_serial = time.perf_counter() - t
    agg, mdr = level_sizes("auto", "auto", be.is_gpu)
    t = time.perf_counter()
    r = _solve_local(space, assemble.stiffness, b, MPI.COMM_SELF, "all", 1e-8, 200, "cg", "V", agg, None,
                     None, (time.perf_counter(), time.process_time()), dict(backend=a.backend), mdr, None)
    t_dist = time.perf_counter() - t
    print(f"{space.num_dofs:,} DoFs; set-up serial {t_serial:.2f} s, distributed on one rank {t_dist:.2f} s")

    def timed(f, reps=a.reps):
        for _ in range(3):
            f()
        be.synchronize()
        ts = []
        if be.is_gpu:
            s, e = xp.cuda.Event(), xp.cuda.Event()
            for _ in range(reps):
                s.record()
                f()
                e.record()
                e.synchronize()
                ts.append(xp.cuda.get_elapsed_time(s, e) * 1e-3)
        else:
            for _ in range(reps):
                t0 = time.perf_counter()
                f()
                ts.append(time.perf_counter() - t0)
        return 1e3 * float(np.median(ts))

    for name, S in (("serial", ml), ("distributed", r.mg.solver)):
        for l, d in enumerate(S._dev):
            x, y, bb = xp.ones(d.n), xp.zeros(d.n), xp.ones(d.n)
            rec = dict(who=name, level=l, rows=int(d.n), A=type(d.A).__name__,
                       spmv_ms=round(timed(lambda: d.Aplan(x, y, 1.0, 0.0)), 4))
            if l > 0:
                xc = xp.ones(S._dev[l - 1].n)
                rec.update(smooth2_ms=round(timed(lambda: d.smoother.smooth(x, bb, 2, work=y)), 4),
                           P_ms=round(timed(lambda: d.Pplan(xc, x, 1.0, 1.0)), 4),
                           R_ms=round(timed(lambda: d.Rplan(x, xc, 1.0, 0.0)), 4))
            print(json.dumps(rec), flush=True)
    for name, S in (("serial", ml), ("distributed", r.mg.solver)):
        n = S._dev[-1].n
        bb, x = xp.ones(n), xp.zeros(n)
        print(f"{name:>11} eager V-cycle {timed(lambda: S.cycle(bb, x)):.3f} ms", flush=True)
    f = be.asarray(ml.constrain(np.asarray(b, float)))
    f_loc = r.mg.backend.asarray(r.mg.constrain_local(b))
    ts = timed(lambda: ml.solve(f, rtol=1e-8, accel="cg"), reps=5)
    td = timed(lambda: resolve(r.mg, f_loc, rtol=1e-8, true_residual=False), reps=5)
    print(f"CG solve to 1e-8: serial {ts:.2f} ms, distributed on one rank {td:.2f} ms ({td / ts:.2f}x)")
    return {"serial": ts, "distributed": td}


if __name__ == "__main__":
    main()
