"""Worker run under ``mpiexec -n P`` by tests/distributed/test_forest_adaptive.py (not a test module).

``python forest_adaptive_cases.py OUT.json``:

* ``loop``: :func:`adaptmg.distributed.adaptive_loop_forest` on the L-shape with homogeneous
  Dirichlet data (``adaptmg_problems.lshape.*_zero_bc``), 12 roots refined twice, 4 adaptive
  steps (theta 0.5), repartitioned after each; rank 0 runs the same problem through the serial
  :func:`adaptmg.estimate.adaptive_loop` and compares step by step: cells, DoFs, the
  indicators (mapped by cell centres, in units of eps * max eta), the marked sets, CG
  iterations, errors; the control at P > 1: the indicators with the vertex values of nodes
  owned elsewhere left at zero, and their marks;
* ``doerfler``: :func:`~adaptmg.distributed.adaptive.doerfler_forest` against the serial
  :func:`adaptmg.estimate.doerfler` of the gathered indicators (curve order) for random
  indicators with many exact ties and without, several theta: the differing marks.
"""
import json
import os
import sys
import warnings

import numpy as np

import adaptmg
from adaptmg import assemble
from adaptmg.distributed import install_excepthook
from adaptmg.distributed.adaptive import PHASES, adaptive_loop_forest, doerfler_forest, owned_indicators
from adaptmg.distributed.forest import DistributedForest
from adaptmg.estimate import AdaptiveProblem, adaptive_loop, doerfler, residual_indicators
from adaptmg.fe.norms import errors
from adaptmg_problems import lshape as L

from forest_cases import COMM, _index_of

RTOL = 1e-10
STEPS = 4
THETA = 0.5


def gather(a):
    got = COMM.gather(a, root=0)
    return None if COMM.rank else np.concatenate(got)


def serial_loop():
    """The serial adaptive loop of the same problem; its per-step indicators and meshes."""
    seen = []

    def solve(mesh, backend):
        space = adaptmg.Space(mesh, 1)
        ml = adaptmg.multigrid(space, assemble.stiffness, dirichlet="all", backend="cpu")
        x = ml.solve(ml.constrain(assemble.load(space, L.source_zero_bc)), rtol=RTOL, accel="cg")
        return space, ml.expand(x), {"iterations": ml.last_iterations}

    def estimate(space, u, info):
        eta = residual_indicators(space, u, f=L.source_zero_bc)
        seen.append((space.mesh, eta))
        return eta, float(np.sqrt((eta ** 2).sum())), {}

    def error(space, u, info):
        return errors(space, u, L.exact_zero_bc, L.grad_zero_bc)

    prob = AdaptiveProblem("lshape0", L.coarse_mesh().refine().refine(), solve, estimate, error)
    res = adaptive_loop(prob, steps=STEPS, theta=THETA, quiet=True)
    return res["history"], seen


def run_loop(records):
    F0 = DistributedForest.from_coarse(L.coarse_mesh(), comm=COMM).refine().refine()
    steps = []

    def record(step, F, eta, marks, res):
        rec = {"X": gather(F.centres()), "eta": gather(eta), "marks": None if marks is None else gather(marks),
               "u": gather(res.u_local), "uX": gather(F.mesh.points[F.owned_nodes])}
        if COMM.size > 1 and marks is not None:        # control: other ranks' vertex values zero
            u = np.zeros(F.mesh.num_nodes)
            u[F.owned_nodes] = res.u_local
            bad = owned_indicators(F, u, f=L.source_zero_bc)
            rec["bad_eta"], rec["bad_marks"] = gather(bad), gather(doerfler_forest(F, bad, THETA))
        steps.append(rec)

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = adaptive_loop_forest(F0, L.source_zero_bc, exact=L.exact_zero_bc, grad=L.grad_zero_bc,
                                   steps=STEPS, theta=THETA, rtol=RTOL, agglomerate_below=100, callback=record)
    if COMM.rank:
        return
    hist_s, seen = serial_loop()
    eps = np.finfo(float).eps
    for k, (row, rec) in enumerate(zip(out["history"], steps)):
        srow, (mesh, eta_s) = hist_s[k], seen[k]
        at = _index_of(rec["X"], mesh.points[mesh.cells].mean(1))     # serial cell -> gathered
        r = {"case": "loop", "stage": f"step{k}", "P": COMM.size, "cells": row["cells"],
             "cells_serial": srow["cells"], "dofs": row["dofs"], "dofs_serial": srow["dofs"],
             "unmapped": int((at < 0).sum()), "its": row["iterations"], "its_serial": srow["iterations"],
             "info": row["info"], "estimate": row["estimate"], "estimate_serial": srow["estimate"],
             "L2": row["err_L2"], "L2_serial": srow["err_L2"], "H1": row["err_H1"], "H1_serial": srow["err_H1"],
             "owned_min": row["owned_min"], "owned_max": row["owned_max"],
             "times": {p: row[f"t_{p}"] for p in PHASES}}
        if r["unmapped"] == 0 and r["cells"] == r["cells_serial"]:
            e = rec["eta"][at]
            r["eta_loop_rel"] = float(np.abs(e - eta_s).max() / eta_s.max())
            # the serial estimator on the serial mesh with the distributed solution: equal
            space = adaptmg.Space(mesh, 1)
            un = _index_of(rec["uX"], space.points)
            r["u_unmapped"] = int((un < 0).sum())
            same = residual_indicators(space, rec["u"][un], f=L.source_zero_bc)
            r["eta_err_eps"] = float(np.abs(e - same).max() / (eps * same.max()))
            if rec["marks"] is not None:
                ms = doerfler(eta_s, THETA)
                r["marked"], r["marks_differ"] = int(ms.sum()), int((rec["marks"][at] != ms).sum())
                if "bad_marks" in rec:
                    r["control_eta_err"] = float(np.abs(rec["bad_eta"][at] - eta_s).max() / eta_s.max())
                    r["control_marks_differ"] = int((rec["bad_marks"][at] != ms).sum())
        records.append(r)


def run_doerfler(records):
    rng = np.random.default_rng(7 + COMM.rank)
    n = 40 + 13 * COMM.rank
    F = DistributedForest.box([0, 0], [1, 1], [4, 4], comm=COMM).refine().refine()
    F = F.repartition(weights=np.linspace(1.0, 2.0 + COMM.rank, F.num_owned))
    n = F.num_owned
    worst = 0
    for kind in ("ties", "distinct", "zeros"):
        if kind == "ties":
            eta = rng.integers(1, 5, n).astype(float)
        elif kind == "distinct":
            eta = rng.random(n) ** 3
        else:
            eta = np.where(rng.random(n) < 0.7, 0.0, rng.random(n))
        for theta in (0.1, 0.3, 0.5, 0.77, 1.0):
            got, all_eta = gather(doerfler_forest(F, eta, theta)), gather(eta)
            if COMM.rank == 0:
                worst = max(worst, int((got != doerfler(all_eta, theta)).sum()))
    if COMM.rank == 0:
        records.append({"case": "doerfler", "stage": "marks", "P": COMM.size, "differ": worst})


def run_gpu(records, fake):
    """The loop with ``backend="gpu"`` under the NumPy stand-in for CuPy (the solve's device
    path; the rest is host) against the CPU loop: the same meshes, iterations, estimates."""
    F0 = DistributedForest.from_coarse(L.coarse_mesh(), comm=COMM).refine().refine()
    kw = dict(steps=2, theta=THETA, rtol=RTOL, agglomerate_below=100)
    cpu = adaptive_loop_forest(F0, L.source_zero_bc, **kw)["history"]
    if fake:
        import fake_cupy
        fake_cupy.install(devices=1)
    out = adaptive_loop_forest(F0, L.source_zero_bc, backend="gpu", coarse_max_rows=None, **kw)
    gpu = out["history"]
    from adaptmg.backend import is_device_array
    if COMM.rank == 0:
        records.append({"case": "fake-gpu" if fake else "gpu", "stage": "loop", "P": COMM.size,
                        "device": bool(is_device_array(out["result"].x_local)),
                        "cells": [h["cells"] for h in gpu], "cells_cpu": [h["cells"] for h in cpu],
                        "its": [h["iterations"] for h in gpu], "its_cpu": [h["iterations"] for h in cpu],
                        "est_rel": max(abs(a["estimate"] / b["estimate"] - 1) for a, b in zip(gpu, cpu))})


def main():
    install_excepthook(COMM)
    records = []
    if os.environ.get("FOREST_ADAPTIVE_GPU"):         # the real device (test_forest_adaptive, -m gpu)
        run_gpu(records, False)
    else:
        run_loop(records)
        run_doerfler(records)
        if COMM.size == 2:
            run_gpu(records, True)           # last: it replaces CuPy for the rest of the process
    if COMM.rank == 0:
        with open(sys.argv[1], "w") as f:
            json.dump(records, f)


if __name__ == "__main__":
    main()
