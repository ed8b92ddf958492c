"""Worker run under ``mpiexec -n P`` by tests/distributed/test_replicated_adaptive.py (not a test module).

``python replicated_adaptive_cases.py OUT.json``: :func:`adaptmg.distributed.adaptive_loop_replicated`
on the L-shape with homogeneous Dirichlet data (``adaptmg_problems.lshape.*_zero_bc``: 12 roots
refined twice, 4 Doerfler steps with the tie rule) over all ranks, and the same loop on rank 0
alone on the CPU (a communicator of one rank: the serial solve) as the reference -- per step
the cells, DoFs, CG iterations, estimates and errors.  At P = 2 also under the NumPy stand-in for CuPy
with NCCL (``fake_cupy``: a "device" mesh on every rank, the solution gathered by
``ncclAllGather``, the marks broadcast by an NCCL allreduce): case ``fake-gpu``.
``ADAPTIVE_REPLICATED_GPU=1``: on the real devices instead (case ``gpu``).
"""
import json
import os
import sys

from mpi4py import MPI

from adaptmg.distributed import adaptive_loop_replicated, install_excepthook
from adaptmg_problems import lshape as L

COMM = MPI.COMM_WORLD
KW = dict(steps=4, theta=0.5, tie_rtol=1e-8, rtol=1e-10, agglomerate_below=100, min_dofs_per_rank=None,
          exact=L.exact_zero_bc, grad=L.grad_zero_bc)
FIELDS = ("cells", "dofs", "iterations", "estimate", "err_L2", "err_H1", "info")


def rows(out):
    return {k: [h[k] for h in out["history"]] for k in FIELDS}


def main():
    install_excepthook(COMM)
    records = []
    gpu = bool(os.environ.get("ADAPTIVE_REPLICATED_GPU"))
    fake = COMM.size == 2 and not gpu
    mesh = L.coarse_mesh().refine().refine()
    solo = COMM.Split(0 if COMM.rank == 0 else MPI.UNDEFINED, 0)
    # the reference: the CPU loop on rank 0 alone (the serial solve)
    ref = rows(adaptive_loop_replicated(mesh, L.source_zero_bc, comm=solo, **KW)) if COMM.rank == 0 else None
    if not gpu:
        out = adaptive_loop_replicated(mesh, L.source_zero_bc, comm=COMM, **KW)
        if COMM.rank == 0:
            records.append({"case": "cpu", "stage": "loop", "P": COMM.size, **rows(out), "ref": ref,
                            "phases": sorted(k for k in out["history"][0] if k.startswith("t_"))})
    if fake or gpu:
        if fake:
            import fake_cupy
            fake_cupy.install(devices=COMM.size, with_nccl=True, mesh=True)
        from adaptmg.backend import is_device_array
        from adaptmg.distributed.comm import select_device
        select_device(COMM)
        out = adaptive_loop_replicated(mesh.to("gpu"), L.source_zero_bc, comm=COMM, backend="gpu", **KW)
        if COMM.rank == 0:
            records.append({"case": "gpu" if gpu else "fake-gpu", "stage": "loop", "P": COMM.size, **rows(out), "ref": ref,
                            "device": bool(is_device_array(out["u"]) and is_device_array(out["eta"]))})
    if COMM.rank == 0:
        with open(sys.argv[1], "w") as f:
            json.dump(records, f)


if __name__ == "__main__":
    main()
