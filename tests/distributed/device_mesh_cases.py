"""Worker run under ``mpiexec -n P`` by tests/distributed/test_device_mesh_rows.py (not a test
module): the distributed solve on a mesh on the stand-in device (``fake_cupy``, host staging)
against the same solve on the host mesh, both with ``backend="gpu"``.

``python device_mesh_cases.py OUT.json``: per case rank 0 writes iterations, the relative
difference of the solutions, the type of the owned solution and of the finest level's blocks
and the device -> host copies of each rank's solve (set-up and CG).  ``--real``: on the real
CuPy (a GPU machine; ranks on one GPU share it), copies counted by
:func:`adaptmg.backend.host_copies`.
"""
import json
import sys

import numpy as np
from mpi4py import MPI

COMM = MPI.COMM_WORLD
REAL = "--real" in sys.argv[2:]


def _copies():
    if REAL:
        from adaptmg.backend import host_copies
        return host_copies()
    import fake_cupy
    return fake_cupy.device_to_host()


def case(dim, L, degree, kw):
    from mpi_cases import poisson
    from adaptmg import assemble
    from adaptmg.distributed import solve
    from adaptmg.fe import Space
    hspace, A, b, base = poisson(dim, L, degree)
    kw = {"min_dofs_per_rank": 0, "rtol": 1e-10, "agglomerate_below": 50, **base, **kw}
    host = solve(hspace, A, b, comm=COMM, backend="gpu", coarse_max_rows=None, **kw)
    dspace = Space(hspace.mesh.to("gpu"), degree)
    db = assemble.load(dspace, lambda x: 1.0 + x[..., 0])
    g0 = _copies()
    dev = solve(dspace, A, db, comm=COMM, backend="gpu", coarse_max_rows=None, **kw)
    gets = _copies() - g0
    setup_values = getattr(dev.mg, "d2h_values", None)
    mg = dev.mg
    fine = mg.levels[-1]
    return dict(its=dev.iterations, its_host=host.iterations, info=dev.info,
                rel=float(np.linalg.norm(dev.u - host.u) / np.linalg.norm(host.u)),
                x_local=type(dev.x_local).__name__, u=type(dev.u).__name__,
                blocks=[type(B).__module__ for B in (fine.A.Aoo_dev, fine.P.Aoo_dev, fine.R.Aoo_dev)],
                smoother=type(mg.solver._dev[-1].smoother.dinv).__module__,
                rhs=type(mg.HT_o).__module__ if mg.HT_o is not None else None, gets=COMM.allgather(gets),
                cells=hspace.mesh.num_cells, dofs=hspace.num_dofs,
                setup_values=COMM.allgather(setup_values),
                # the distributed levels' layouts computed and kept on the device
                device_layouts=[lay._dev is not None for lay in mg.layouts[mg.c:]])


CASES = {"q1-2d": (2, 3, 1, {}), "q2-3d": (3, 1, 2, {}), "q1-2d-folded": (2, 3, 1, dict(min_dofs_per_rank=300)),
         "q1-2d-replicated": (2, 3, 1, dict(local_setup=False))}


if __name__ == "__main__":
    from adaptmg.distributed import install_excepthook
    install_excepthook()
    if REAL:
        from adaptmg.distributed.comm import select_device
        select_device(COMM)                  # before the device meshes are made
    else:
        import fake_cupy
        fake_cupy.install(devices=1, mesh=True)
        from adaptmg.distributed import hierarchy
        init = hierarchy.DistributedHierarchy.__init__

        def counted(self, *a, **k):          # entries copied device -> host by the set-up
            v0 = fake_cupy.device_to_host_values()
            init(self, *a, **k)
            # ... less the send buffers of the set-up's halo exchanges (host staging: each one
            # copies O(halo) values down)
            self.d2h_values = fake_cupy.device_to_host_values() - v0 - self.timer.bytes // 8
        hierarchy.DistributedHierarchy.__init__ = counted
    names = ["q1-2d", "q2-3d"] if REAL else list(CASES)          # (the GPU run kept short)
    recs = {name: case(*CASES[name]) for name in names}
    if COMM.rank == 0:
        with open(sys.argv[1], "w") as fh:
            json.dump(recs, fh)
