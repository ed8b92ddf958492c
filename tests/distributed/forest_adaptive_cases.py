"""Worker run under ``mpiexec -n P`` by tests/distributed/test_forest_adaptive.py (not a test module).

``python forest_adaptive_cases.py OUT.json``:

* ``loop``: :func:`adaptmg.distributed.adaptive_loop_forest` on the L-shape with homogeneous
  Dirichlet data (``adaptmg_problems.lshape.*_zero_bc``), 12 roots refined twice, 4 adaptive
  steps (theta 0.5), repartitioned after each; rank 0 runs the same problem through the serial
  :func:`adaptmg.estimate.adaptive_loop` and compares step by step: cells, DoFs, the
  indicators (mapped by cell centres, in units of eps * max eta), the marked sets, CG
  iterations, errors; the control at P > 1: the indicators with the vertex values of nodes
  owned elsewhere left at zero, and their marks;
* ``lshape``: the same with the real L-shape (``f = 0``, ``g`` the exact solution
  ``r^(2/3) sin(2 theta/3)`` on the boundary: inhomogeneous Dirichlet data), and ``fichera``
  (3-D, ``f = 1``, 7 roots refined once, 3 steps, its goal ``J(u_h) = int u_h`` against the
  serial ``J``), both symmetric problems, both loops with Doerfler's tie rule (``tie_rtol``:
  twins marked together); also the Dirichlet values at the boundary nodes and how many marks
  plain Doerfler would give differently from the serial plain Doerfler (reported, not
  asserted: a round-off coin toss);
* ``doerfler``: :func:`~adaptmg.distributed.adaptive.doerfler_forest` against the serial
  :func:`adaptmg.estimate.doerfler` of the gathered indicators (curve order) for random
  indicators with many exact ties and without, several theta, with and without the tie
  rule: the differing marks.
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
from adaptmg_problems import fichera as Fi
from adaptmg_problems import lshape as L

from forest_cases import COMM, _index_of

RTOL = 1e-10
STEPS = 4
FICHERA_STEPS = 3
THETA = 0.5
TIE_RTOL = 1e-8


def gather(a):
    got = COMM.gather(a, root=0)
    return None if COMM.rank else np.concatenate(got)


def serial_loop(mesh0, solve, f, exact=None, grad=None, steps=STEPS, tie_rtol=None):
    """The serial adaptive loop (:func:`adaptmg.estimate.adaptive_loop`) from ``mesh0`` with
    ``solve(mesh)`` -> (space, u, info) and the residual estimator of the source ``f``; its
    history (``J`` from the solve's info when there) and per-step (mesh, indicators)."""
    seen = []

    def estimate(space, u, info):
        eta = residual_indicators(space, u, f=f)
        seen.append((space.mesh, eta))
        return eta, float(np.sqrt((eta ** 2).sum())), {"J": info["J"]} if "J" in info else {}

    def error(space, u, info):
        return errors(space, u, exact, grad) if exact is not None else {}

    prob = AdaptiveProblem("serial", mesh0, lambda mesh, backend: solve(mesh), estimate, error)
    res = adaptive_loop(prob, steps=steps, theta=THETA, quiet=True, tie_rtol=tie_rtol)
    return res["history"], seen


def zero_bc_solve(mesh):
    space = adaptmg.Space(mesh, 1)
    ml = adaptmg.multigrid(space, assemble.stiffness, dirichlet="all", backend="cpu")
    x = ml.solve(ml.constrain(assemble.load(space, L.source_zero_bc)), rtol=RTOL, accel="cg")
    return space, ml.expand(x), {"iterations": ml.last_iterations}


#: the loops compared with the serial one: (coarse mesh, refinements, f, g, exact, grad, serial
#: solve, steps, tie_rtol); "loop" the zero-data L-shape (no ties: plain Doerfler), "lshape" the
#: L-shape with its exact data (symmetric about y = -x) and "fichera" (f = 1, g = 0, symmetric
#: under permutations of the axes; its goal J(u_h) = int u_h), both with the tie rule
LOOPS = {
    "loop": (L.coarse_mesh, 2, L.source_zero_bc, None, L.exact_zero_bc, L.grad_zero_bc, zero_bc_solve, STEPS, None),
    "lshape": (L.coarse_mesh, 2, 0.0, L.exact, L.exact, L.grad, lambda m: L.solve(m, rtol=RTOL), STEPS, TIE_RTOL),
    "fichera": (Fi.coarse_mesh, 1, 1.0, None, None, None, lambda m: Fi.solve(m, rtol=RTOL), FICHERA_STEPS,
                TIE_RTOL),
}


def run_loop(records, case="loop"):
    coarse, nref, f, g, exact, grad, solve, nsteps, tie = LOOPS[case]
    F0 = DistributedForest.from_coarse(coarse(), comm=COMM)
    for _ in range(nref):
        F0 = F0.refine()
    steps = []
    err = {"exact": exact, "grad": grad} if exact is not None else {"goal": 1.0}

    def record(step, F, eta, marks, res):
        rec = {"X": gather(F.centres()), "eta": gather(eta), "marks": None if marks is None else gather(marks),
               "u": gather(res.u_local), "uX": gather(F.mesh.points[F.owned_nodes])}
        if tie is not None and marks is not None:      # plain Doerfler on the same indicators
            rec["plain"] = gather(doerfler_forest(F, eta, THETA))
        if case == "loop" and COMM.size > 1 and marks is not None:   # control: others' vertex values zero
            u = np.zeros(F.mesh.num_nodes)
            u[F.owned_nodes] = res.u_local
            bad = owned_indicators(F, u, f=f)
            rec["bad_eta"], rec["bad_marks"] = gather(bad), gather(doerfler_forest(F, bad, THETA))
        steps.append(rec)

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = adaptive_loop_forest(F0, f, g=g, **err, steps=nsteps, theta=THETA, tie_rtol=tie, rtol=RTOL,
                                   agglomerate_below=100, callback=record)
    if COMM.rank:
        return
    mesh0 = coarse()
    for _ in range(nref):
        mesh0 = mesh0.refine()
    hist_s, seen = serial_loop(mesh0, solve, f, exact, grad, nsteps, tie)
    eps = np.finfo(float).eps
    for k, (row, rec) in enumerate(zip(out["history"], steps)):
        srow, (mesh, eta_s) = hist_s[k], seen[k]
        at = _index_of(rec["X"], mesh.points[mesh.cells].mean(1))     # serial cell -> gathered
        r = {"case": case, "stage": f"step{k}", "P": COMM.size, "cells": row["cells"],
             "cells_serial": srow["cells"], "dofs": row["dofs"], "dofs_serial": srow["dofs"],
             "unmapped": int((at < 0).sum()), "its": row["iterations"], "its_serial": srow["iterations"],
             "info": row["info"], "estimate": row["estimate"], "estimate_serial": srow["estimate"],
             "owned_min": row["owned_min"], "owned_max": row["owned_max"],
             "times": {p: row[f"t_{p}"] for p in PHASES}}
        if exact is not None:
            r.update(L2=row["err_L2"], L2_serial=srow["err_L2"], H1=row["err_H1"], H1_serial=srow["err_H1"])
        else:
            r.update(goal=row["goal"], goal_serial=srow["J"])
        if r["unmapped"] == 0 and r["cells"] == r["cells_serial"]:
            e = rec["eta"][at]
            r["eta_loop_rel"] = float(np.abs(e - eta_s).max() / eta_s.max())
            # the serial estimator on the serial mesh with the distributed solution: equal
            space = adaptmg.Space(mesh, 1)
            un = _index_of(rec["uX"], space.points)
            r["u_unmapped"] = int((un < 0).sum())
            same = residual_indicators(space, rec["u"][un], f=f)
            r["eta_err_eps"] = float(np.abs(e - same).max() / (eps * same.max()))
            if g is not None:                         # the Dirichlet values at the Dirichlet nodes
                d = np.setdiff1d(space.boundary_dofs(), np.flatnonzero(space.is_hanging))
                r["g_err"] = float(np.abs(rec["u"][un][d] - g(space.points[d])).max())
            if rec["marks"] is not None:
                ms = doerfler(eta_s, THETA, tie)
                r["marked"], r["marks_differ"] = int(ms.sum()), int((rec["marks"][at] != ms).sum())
                if "plain" in rec:
                    r["plain_marks_differ"] = int((rec["plain"][at] != doerfler(eta_s, THETA)).sum())
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
            for tie in (None, 0.0, 0.3):
                got, all_eta = gather(doerfler_forest(F, eta, theta, tie)), gather(eta)
                if COMM.rank == 0:
                    worst = max(worst, int((got != doerfler(all_eta, theta, tie)).sum()))
    if COMM.rank == 0:
        records.append({"case": "doerfler", "stage": "marks", "P": COMM.size, "differ": worst})


def run_gpu(records, fake):
    """The loop with ``backend="gpu"`` under the NumPy stand-in for CuPy (the solve's device
    path; the rest is host) against the CPU loop: the same meshes, iterations, estimates."""
    F0 = DistributedForest.from_coarse(L.coarse_mesh(), comm=COMM).refine().refine()
    kw = dict(steps=2, theta=THETA, rtol=RTOL, agglomerate_below=100)
    # the zero-data L-shape ("loop") and the real one (inhomogeneous Dirichlet data, the tie rule)
    cases = {"loop": dict(f=L.source_zero_bc), "lshape": dict(f=0.0, g=L.exact, tie_rtol=TIE_RTOL)}
    cpu = {c: adaptive_loop_forest(F0, **ckw, **kw)["history"] for c, ckw in cases.items()}
    if fake:
        import fake_cupy
        fake_cupy.install(devices=1, mesh=True)   # the local meshes go to the device
    from adaptmg.backend import is_device_array
    for c, ckw in cases.items():
        out = adaptive_loop_forest(F0, **ckw, backend="gpu", coarse_max_rows=None, **kw)
        gpu, hc = out["history"], cpu[c]
        if COMM.rank == 0:
            records.append({"case": "fake-gpu" if fake else "gpu", "stage": c, "P": COMM.size,
                            "device": bool(is_device_array(out["result"].x_local)),
                            "cells": [h["cells"] for h in gpu], "cells_cpu": [h["cells"] for h in hc],
                            "its": [h["iterations"] for h in gpu], "its_cpu": [h["iterations"] for h in hc],
                            "est_rel": max(abs(a["estimate"] / b["estimate"] - 1) for a, b in zip(gpu, hc))})


def main():
    install_excepthook(COMM)
    records = []
    if os.environ.get("FOREST_ADAPTIVE_GPU"):         # the real device (test_forest_adaptive, -m gpu)
        run_gpu(records, False)
    else:
        for case in LOOPS:
            run_loop(records, case)
        run_doerfler(records)
        if COMM.size == 2:
            run_gpu(records, True)           # last: it replaces CuPy for the rest of the process
    if COMM.rank == 0:
        with open(sys.argv[1], "w") as f:
            json.dump(records, f)


if __name__ == "__main__":
    main()
