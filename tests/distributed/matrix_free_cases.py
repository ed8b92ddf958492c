"""Worker run under ``mpiexec -n P`` by tests/distributed/test_matrix_free_level.py (not a test module).

``python matrix_free_cases.py OUT.json``: on a 2-D and a 3-D mesh with hanging nodes (the 3-D
one with its interior nodes moved: multilinear, not affine, cells; once more with the coarser
locally built levels folded onto fewer ranks, ``min_dofs_per_rank=1000``: ranks owning no row of
a matrix-free level) and homogeneous Dirichlet data (on the whole boundary; in 2-D once more on
two sides only, natural on the others; in 3-D once more with the Chebyshev smoother, whose
lambda_max comes from the matrix-free product), :func:`adaptmg.distributed.solve` with the
assembled levels and with ``matrix_free=True``; per case rank 0 records the largest relative
difference of the two finest operators' products on a random vector and of their diagonals
(over all ranks), the iterations of both solves and the relative difference of the solutions.
The two share the partition and the layouts.  ``MATRIX_FREE_GPU=1``: on the devices (a mesh on each
rank's GPU).
"""
import json
import os
import sys

import numpy as np
from mpi4py import MPI

from adaptmg import assemble
from adaptmg.backend import to_host
from adaptmg.distributed import install_excepthook, solve
from adaptmg.distributed.comm import select_device
from adaptmg.fe import Space
from adaptmg.mesh import Mesh

COMM = MPI.COMM_WORLD


def mesh_of(dim):
    m = Mesh.box([0.0] * dim, [1.0] * dim, [4] * dim).refine()
    c = m.points[m.cells].mean(axis=1)
    m = m.refine(np.linalg.norm(c - 0.3, axis=1) < 0.3)
    if dim == 3:                                   # interior nodes moved: non-affine cells
        m = m.map(lambda p: p + 0.04 * np.prod(np.sin(np.pi * p), axis=1)[:, None] * np.array([1.0, -0.5, 0.7]))
    return m


def main():
    install_excepthook(COMM)
    gpu = bool(os.environ.get("MATRIX_FREE_GPU"))
    be = "gpu" if gpu else "cpu"
    if gpu:
        select_device(COMM)
    records = []
    for dim, fold, dirichlet, smoother in ((2, None, "all", "jacobi"), (3, None, "all", "jacobi"),
                                           (3, 1000, "all", "jacobi"), (2, None, [0, 2], "jacobi"),
                                           (3, None, "all", "chebyshev")):
        mesh = mesh_of(dim)
        if gpu:
            mesh = mesh.to("gpu")
        space = Space(mesh, 1)
        b = assemble.load(space, 1.0)
        kw = dict(comm=COMM, rtol=1e-10, agglomerate_below=100, min_dofs_per_rank=fold, backend=be,
                  dirichlet=dirichlet, smoother=smoother)
        r0 = solve(space, assemble.stiffness, b, **kw)
        r1 = solve(space, assemble.stiffness, b, matrix_free=True, **kw)
        # the assembled finest level: the distributed one, on one rank the serial hierarchy's
        A1 = r1.mg.A
        A0 = r0.mg.A if r0.mg is not None else r0.ml.levels[-1].A
        xp = A1.backend.xp
        rng = np.random.default_rng(1)
        x = xp.asarray(rng.standard_normal(A1.rows.N)[to_host(A1.rows.rows)])
        y0, y1 = to_host(A0 @ x), to_host(A1 @ x)
        num = COMM.allreduce(float(np.abs(y0 - y1).max(initial=0.0)), op=MPI.MAX)
        den = COMM.allreduce(float(np.abs(y0).max(initial=0.0)), op=MPI.MAX)
        d0, d1 = to_host(A0.diagonal()), A1.diagonal()
        dnum = COMM.allreduce(float(np.abs(d0 - d1).max(initial=0.0)), op=MPI.MAX)
        dden = COMM.allreduce(float(np.abs(d0).max(initial=0.0)), op=MPI.MAX)
        u0, u1 = to_host(r0.u), to_host(r1.u)
        if COMM.rank == 0:
            case = (f"{dim}d" + ("-folded" if fold else "") + ("-two-sides" if dirichlet != "all" else "")
                    + ("-chebyshev" if smoother == "chebyshev" else ""))
            records.append({"case": case, "stage": be, "P": COMM.size,
                            "active_ranks": list(r1.active_ranks), "product": num / den,
                            "diagonal": dnum / dden, "its": [r0.iterations, r1.iterations],
                            "info": [r0.info, r1.info], "u": float(np.abs(u0 - u1).max() / np.abs(u0).max()),
                            "type": type(A1).__name__, "ghosts": int(A1.ghosts.size),
                            "cells": int(A1.num_cells), "mesh_cells": int(mesh.num_cells)})
    if COMM.rank == 0:
        with open(sys.argv[1], "w") as f:
            json.dump(records, f)


if __name__ == "__main__":
    main()
