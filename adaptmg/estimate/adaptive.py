r"""The adaptive loop solve -> estimate -> mark -> refine.

Step :math:`\ell = 0, 1, \dots` solves on the mesh :math:`\mathcal T_\ell`, computes the
cell indicators :math:`\eta_K` and a global estimate, marks cells (:mod:`.marking`) and
refines them with 2:1 closure, until ``steps`` refinements are done or the space has
``max_dofs`` DoFs.  What is solved and estimated is described by an
:class:`AdaptiveProblem`; :func:`adaptive_loop` prints one line per step, optionally
writes a VTU file per step (:func:`write_vtu`, through :func:`adaptmg.io.write`), and
returns the history.  :func:`fitted_slope` gives the convergence rate of such a history:
the slope s of the least-squares fit :math:`\log e \approx s \log N + c`.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from .marking import check_tie_rtol, mark


@dataclass
class AdaptiveProblem:
    """What :func:`adaptive_loop` needs to know about a problem.

    mesh : the initial mesh
    solve(mesh, backend) -> (space, u, info): u the full nodal vector, info a dict with at
        least ``iterations`` (multigrid iterations) and optionally ``levels``
    estimate(space, u, info) -> (eta_K (num_cells,), estimate (float), extra dict)
    error(space, u, info) -> dict of true errors (optional)
    fields(space, u, info) -> dict of extra nodal fields for output (optional)
    """
    name: str
    mesh: object
    solve: Callable
    estimate: Callable
    error: Callable | None = None
    fields: Callable | None = None
    meta: dict = field(default_factory=dict)


def fitted_slope(n, e):
    """Least-squares slope of log e against log n."""
    n, e = np.asarray(n, float), np.asarray(e, float)
    if n.size < 2 or n.shape != e.shape:
        raise ValueError(f"need at least two (n, e) pairs of equal length, got {n.shape} and {e.shape}")
    return float(np.polyfit(np.log(n), np.log(e), 1)[0])


def write_vtu(path, space, point_data=None, cell_data=None, *, compression="zlib"):
    """Write the mesh of ``space`` with nodal fields (num_dofs,) and cell fields (num_cells,)
    to VTU through :func:`adaptmg.io.write` (Q2 fields: vertex values; the mesh's ``level``,
    ``hanging`` and ``boundary_ids`` are written too, so a ``level`` cell field is dropped).
    ``space`` may also be the :func:`adaptmg.io.convert.host_mesh` of a space's mesh;
    ``compression=None``: raw appended data (:mod:`adaptmg.io.vtu_raw`)."""
    from .. import io
    from ..io.convert import HostMesh
    cd = {k: v for k, v in (cell_data or {}).items() if k != "level"}
    mesh, space = (space, None) if isinstance(space, HostMesh) else (space.mesh, space)
    return io.write(path, mesh, point_data or {}, cd, space=space, mesh_data=True,
                    compression=compression)


class _Writer:
    """VTU output off the critical path.  In the loop's thread :meth:`submit` makes only the
    device -> host copies of what the step writes (the fields, and for a mesh on the GPU the
    arrays of :func:`adaptmg.io.convert.host_mesh`: O(cells) bytes once, no host numbering);
    one background thread collects the fields and writes the raw VTU
    (:mod:`adaptmg.io.vtu_raw`, ``compression=None``: plain buffer writes, which release the
    GIL the loop's thread needs to launch its kernels) while the next steps run.
    :meth:`close` waits for every file and re-raises the first error."""

    def __init__(self, out, every):
        from concurrent.futures import ThreadPoolExecutor
        self.out, self.every = out, every
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="adaptmg-vtu")
        self._jobs = []

    def wants(self, step, last):
        return self.out is not None and (last or step % self.every == 0)

    def submit(self, path, space, point_data, cell_data):
        from ..backend import to_host
        from ..io.convert import host_mesh
        pd = {k: to_host(v) for k, v in point_data.items()}
        cd = {k: to_host(v) for k, v in cell_data.items()}
        # a host mesh's arrays are read by the writer thread; a device mesh's are copied here
        snap = host_mesh(space.mesh, space) if space.mesh.backend.is_gpu else None
        self._jobs.append(self._pool.submit(self._write, path, snap or space, pd, cd))

    @staticmethod
    def _write(path, space, pd, cd):
        from ..io.convert import HostMesh, host_mesh
        if not isinstance(space, HostMesh):
            space = host_mesh(space.mesh, space)
        return write_vtu(path, space, pd, cd, compression=None)

    def close(self, raise_errors=True):
        self._pool.shutdown(wait=True)
        if raise_errors:
            for j in self._jobs:
                j.result()


def adaptive_loop(problem: AdaptiveProblem, *, steps=10, strategy="doerfler", theta=0.5,
                  backend="cpu", quiet=False, out=None, max_dofs=None, printer=print, write_every=1,
                  tie_rtol=None):
    """Run solve -> estimate -> mark -> refine ``steps`` times (``steps + 1`` solves).

    ``strategy``: "doerfler" (parameter ``theta``), "fixed_fraction" (fraction ``theta``)
    or "uniform"; ``tie_rtol``: Doerfler's tie rule (:func:`~.marking.doerfler`).
    ``out``: directory for a VTU file per step (``<name>_<step>.vtu``: the solution ``u``,
    the problem's ``fields``, the indicators ``eta``, the mesh's ``hanging``, ``level``,
    ``boundary_ids``, ``region``), uncompressed raw appended VTU (:mod:`adaptmg.io.vtu_raw`;
    ParaView and :func:`adaptmg.io.read` read it).  The loop's thread only copies what a
    step writes to the host (for a mesh on the GPU: its fields and the mesh arrays of
    :func:`adaptmg.io.convert.host_mesh`, no host numbering); a background thread builds
    and writes the file while the next steps run.  ``write_every=k`` writes only the steps
    0, k, 2k, ... and the last one.  A failed write is raised when the loop ends.
    Returns a dict with ``history`` (one dict per step: step, cells, dofs, hanging,
    levels, estimate, errors, iterations, times: ``t_solve`` = ``t_setup`` (space, hierarchy,
    assembly, transfer to the device) + ``t_mg`` (the multigrid solve), ``t_estimate``),
    ``mesh``, ``space``, ``u``, ``eta``.  On a mesh on the GPU (``problem.mesh.to("gpu")``,
    solve/estimate returning device arrays) marking and refinement run on the device too
    (:mod:`.marking`), with O(1) host reads per step (and the copies of the steps written).
    A progress bar (:mod:`adaptmg.progress`) is shown
    on a terminal unless ``quiet``.
    """
    from ..progress import progress
    if not isinstance(steps, (int, np.integer)) or steps < 0:
        raise ValueError(f"steps must be a non-negative integer, got {steps!r}")
    if check_tie_rtol(tie_rtol):
        raise ValueError(check_tie_rtol(tie_rtol))
    if isinstance(write_every, bool) or not isinstance(write_every, (int, np.integer)) or write_every < 1:
        raise ValueError(f"write_every must be a positive integer, got {write_every!r}")
    if out is not None:
        os.makedirs(out, exist_ok=True)
    if not quiet:
        printer(f"{problem.name}: {strategy} marking (theta={theta}), backend={backend}")
        printer(f"{'step':>4} {'cells':>8} {'dofs':>9} {'hang':>7} {'lev':>4} {'estimate':>11} "
                f"{'error':>11} {'mg it':>6} {'t_setup':>8} {'t_mg':>7} {'t_est':>7}")
    writer = _Writer(out, int(write_every))
    try:
        with progress(total=steps + 1, description=f"{problem.name} adaptive", quiet=quiet) as bar:
            res = _loop(problem, steps, strategy, theta, backend, quiet, writer, max_dofs, printer, bar,
                        tie_rtol)
    except BaseException:
        writer.close(raise_errors=False)        # the loop's own error is the one to see
        raise
    writer.close()
    return res


def _loop(problem, steps, strategy, theta, backend, quiet, writer, max_dofs, printer, bar, tie_rtol):
    mesh = problem.mesh
    hist = []
    for step in range(steps + 1):
        t0 = time.perf_counter()
        space, u, info = problem.solve(mesh, backend)
        t1 = time.perf_counter()
        eta, est, extra = problem.estimate(space, u, info)
        t2 = time.perf_counter()
        errs = problem.error(space, u, info) if problem.error is not None else {}
        row = {"step": step, "cells": mesh.num_cells, "dofs": int(space.num_dofs),
               "hanging": int(mesh.num_hanging_nodes), "levels": int(info.get("levels", 0)),
               "estimate": float(est), "iterations": int(info.get("iterations", -1)),
               "t_solve": t1 - t0, "t_mg": float(info.get("t_mg", np.nan)),
               "t_setup": t1 - t0 - float(info.get("t_mg", 0.0)), "t_estimate": t2 - t1,
               **{f"err_{k}": float(v) for k, v in errs.items()},
               **{k: v for k, v in extra.items() if np.isscalar(v)}}
        hist.append(row)
        if not quiet:
            e = next(iter(errs.values())) if errs else float("nan")
            printer(f"{step:4d} {row['cells']:8d} {row['dofs']:9d} {row['hanging']:7d} {row['levels']:4d} "
                    f"{row['estimate']:11.4e} {e:11.4e} {row['iterations']:6d} {row['t_setup']:8.3f} "
                    f"{row['t_mg']:7.3f} {row['t_estimate']:7.3f}")
        bar.advance()
        last = step == steps or (max_dofs is not None and space.num_dofs >= max_dofs)
        if writer.wants(step, last):
            pd = {"u": u}
            if problem.fields is not None:
                pd.update(problem.fields(space, u, info))
            writer.submit(os.path.join(writer.out, f"{problem.name}_{step:03d}.vtu"), space, pd, {"eta": eta})
        if last:
            break
        mesh = mesh.refine(mark(eta, strategy, theta, tie_rtol) if strategy != "uniform" else None)
    return {"history": hist, "mesh": mesh, "space": space, "u": u, "eta": eta, "name": problem.name}
