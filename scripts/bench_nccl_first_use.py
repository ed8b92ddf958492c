"""Benchmark: what NCCL's first uses cost in a fresh process, by the number of channels.

NCCL connects a communicator's channels lazily: the first all-reduce and the first
send/receive group of a process pay for it (per channel), later ones do not.  For each value
of ``--channels`` this starts ``mpiexec -n P`` (one rank per GPU, ``NCCL_MAX_NCHANNELS`` set
to the value; ``default``: the variable removed, NCCL's own choice) and prints per rank the
seconds of the communicator's creation, of the first and second all-reduce (one float64)
and of the first and second send/receive group (1000 float64 to the next rank, from the
previous one), each after a synchronisation.  :data:`adaptmg.distributed.nccl.NCCL_CHANNELS`
is what ``adaptmg.distributed`` sets when the environment has none; the solves' side of
the choice: ``NCCL_MAX_NCHANNELS=<n> python scripts/bench_distributed.py ...`` (the driver
passes the environment on).

    python scripts/bench_nccl_first_use.py --channels default,2,4,8
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time


def worker():
    from mpi4py import MPI
    from adaptmg.distributed.comm import select_device
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    select_device(comm)
    import cupy
    from cupy.cuda import nccl
    x, y = cupy.ones(1000), cupy.empty(1000)
    stream = cupy.cuda.Stream(non_blocking=True)

    def done():
        stream.synchronize()
        t.append(time.perf_counter())
    cupy.cuda.Device().synchronize()
    comm.Barrier()
    t = [time.perf_counter()]
    uid = comm.bcast(nccl.get_unique_id() if rank == 0 else None, root=0)
    nc = nccl.NcclCommunicator(size, uid, rank)
    done()
    for _ in range(2):
        nc.allReduce(x.data.ptr, y.data.ptr, 1, nccl.NCCL_FLOAT64, nccl.NCCL_SUM, stream.ptr)
        done()
    for _ in range(2):
        nccl.groupStart()
        nc.send(x.data.ptr, 1000, nccl.NCCL_FLOAT64, (rank + 1) % size, stream.ptr)
        nc.recv(y.data.ptr, 1000, nccl.NCCL_FLOAT64, (rank - 1) % size, stream.ptr)
        nccl.groupEnd()
        done()
    d = [b - a for a, b in zip(t[:-1], t[1:])]
    rows = comm.gather(d, root=0)
    if rank == 0:
        print(json.dumps({"version": nccl.get_version(), "ranks": rows}))


def driver(args):
    from adaptmg.distributed.comm import find_mpiexec, mpiexec_command
    if find_mpiexec() is None:
        sys.exit("mpiexec not found: pip install 'adaptmg[mpi]'")
    print(f"NCCL first uses, {args.ranks} ranks (seconds per rank: creation, all-reduce 1 / 2, "
          f"send-recv 1 / 2)")
    for value in args.channels.split(","):
        env = dict(os.environ, NCCL_NVLS_ENABLE=os.environ.get("NCCL_NVLS_ENABLE", "0"))
        env.pop("NCCL_MAX_NCHANNELS", None)
        if value != "default":
            env["NCCL_MAX_NCHANNELS"] = str(int(value))
        cmd = mpiexec_command(args.ranks, gpu=True) + [sys.executable, os.path.abspath(__file__), "--worker"]
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
        if out.returncode != 0:
            sys.exit(f"channels {value} failed:\n{out.stderr[-4000:]}")
        r = json.loads(out.stdout.strip().splitlines()[-1])
        for q, d in enumerate(r["ranks"]):
            print(f"  channels {value:>7}  NCCL {r['version']}  rank {q}:  " + "  ".join(f"{s:6.3f}" for s in d)
                  + f"   first uses {d[1] + d[3]:6.3f} s")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--channels", default="default,2,4,8",
                    help="comma-separated NCCL_MAX_NCHANNELS values ('default': unset)")
    ap.add_argument("--ranks", type=int, default=2, help="ranks (one GPU each)")
    ap.add_argument("--timeout", type=float, default=120.0)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    worker() if args.worker else driver(args)


if __name__ == "__main__":
    main()
