"""Worker run under ``mpiexec -n P`` by tests/distributed/test_device_contexts.py (not a test module).

``python device_context_cases.py OUT.json``: a distributed GPU solve on a device mesh (the rank's
device selected by :func:`adaptmg.distributed.solve` itself, with ``backend="gpu"``, before any
mesh: the mesh is made after it), then rank 0 records, per rank, on how many GPUs the rank's
process holds a CUDA context (``nvidia-smi --query-compute-apps``): one each."""
import json
import os
import subprocess
import sys

from mpi4py import MPI

from adaptmg import assemble
from adaptmg.distributed import install_excepthook, solve
from adaptmg.fe import Space
from adaptmg.mesh import Mesh

COMM = MPI.COMM_WORLD


def main():
    install_excepthook(COMM)
    mesh0 = Mesh.box([0, 0], [1, 1], [8, 8]).refine()
    b0 = assemble.load(Space(mesh0, 1), 1.0)
    solve(Space(mesh0, 1), assemble.stiffness, b0, comm=COMM, backend="gpu", rtol=1e-8,
          agglomerate_below=50)
    space = Space(mesh0.to("gpu"), 1)
    solve(space, assemble.stiffness, assemble.load(space, 1.0), comm=COMM, backend="gpu", rtol=1e-8,
          agglomerate_below=50)
    pids = COMM.gather(os.getpid(), root=0)
    COMM.Barrier()
    if COMM.rank == 0:
        out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,gpu_uuid", "--format=csv,noheader"],
                             capture_output=True, text=True, check=True).stdout
        rows = [line.split(",")[0].strip() for line in out.splitlines() if line.strip()]
        with open(sys.argv[1], "w") as f:
            json.dump([{"case": "contexts", "stage": "gpu", "per_rank": [rows.count(str(p)) for p in pids]}], f)
    COMM.Barrier()


if __name__ == "__main__":
    main()
