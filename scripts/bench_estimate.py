#!/usr/bin/env python
"""The residual estimator alone: calls and seconds per ``residual_indicators`` call.

Examples::

    python scripts/bench_estimate.py                                # 2-D L-shape, ~2e5 cells, CPU
    python scripts/bench_estimate.py --cells 1400000 --backend gpu  # the size of the GPU loop's last step
    python scripts/bench_estimate.py --dim 3 --cells 100000 --degree 2
    python scripts/bench_estimate.py --device-path   # the GPU path's chunks and checks, on NumPy
    python scripts/bench_estimate.py --backend gpu --mesh-backend gpu --cells 2.5e7 --share 2

The mesh is graded towards the singular corner (the L-shape's re-entrant corner in 2-D, the
origin of the cube in 3-D): cells with :math:`h_K > \\delta\\, r_K^{1/3}` are refined until
none is left, with :math:`\\delta` lowered until the mesh has ``--cells`` cells -- the mesh an
adaptive loop makes for a corner singularity, with hanging nodes on every level.  ``u`` is
random (the estimator's work does not depend on its values).

Prints one row per backend: cells, interior faces, face runs, evaluation calls per estimate
(:func:`adaptmg.estimate.evaluation.point_fields`, counted), table products per estimate
(``xp.matmul`` calls: products with a basis table), the first call (face matching and tables included)
and the best of ``--repeat`` later calls.  ``--device-path`` runs the CPU backend through the
GPU's code path (its chunk sizes and deferred determinant checks, :func:`device_path`), so that
a host without a GPU counts the GPU's evaluations.

``--share P`` also times what one rank of ``P`` does per step of
:func:`adaptmg.distributed.adaptive_loop_replicated`, on a mesh whose faces are not matched yet
(as every step's new mesh): the indicators of the rank's cells of the Morton cut (``cells=``:
the faces matched around them, :func:`adaptmg.estimate.faces.face_runs` with ``only=``), the
slowest rank's, against the whole estimate (``P = 1``); and of the whole estimate the face
matching alone.  ``--mesh-backend gpu``
grades the mesh on the device (large meshes in seconds; the estimator then runs on it).

``--pieces`` (GPU) times the whole estimate with its faces matched in pieces
(:data:`adaptmg.estimate.residual.DEVICE_FACE_PIECE`, the default) against one piece,
alternated, faces not matched before, and reads CuPy's pool: the bytes it held at the end
above the arrays live before the call (the pool emptied first), per DoF -- the call's peak.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)


def graded_mesh(dim, cells, backend="cpu"):
    """The L-shape (2-D) or the unit cube (3-D) refined towards a corner to >= ``cells`` cells
    (on ``backend``'s arrays: a device mesh for "gpu")."""
    from adaptmg import Mesh
    if dim == 2:
        from adaptmg_problems.lshape import coarse_mesh
        mesh = coarse_mesh()
    else:
        mesh = Mesh.box([0.0] * 3, [1.0] * 3, [2, 2, 2])
    if backend != "cpu":
        mesh = mesh.to(backend)
    xp = mesh.backend.xp
    delta = 0.5
    while mesh.num_cells < cells:
        delta /= 1.1
        while True:
            X = mesh.points[mesh.cells]
            h = xp.linalg.norm(X[:, -1] - X[:, 0], axis=1)
            r = xp.linalg.norm(X.mean(axis=1), axis=1)
            marked = xp.flatnonzero(h > delta * xp.maximum(r, h) ** (1.0 / 3.0))
            if marked.size == 0:
                break
            mesh = mesh.refine(marked)
    return mesh


def _timed(fn, be):
    be.synchronize()
    t = time.perf_counter()
    fn()
    be.synchronize()
    return time.perf_counter() - t


def rank_share(space, u, be, size, repeat):
    """Seconds per step of a rank of ``size`` in the replicated loop's estimate (module doc),
    each on a mesh whose faces are not memoised, best of ``repeat``: ``(match, whole, rank)`` --
    the whole mesh's face matching alone, the whole estimate and the slowest rank's estimate of
    its cells."""
    import adaptmg.estimate.faces as faces
    from adaptmg.distributed.partition import partition_cells
    from adaptmg.estimate import residual_indicators
    mesh = space.mesh

    def fresh(fn):
        def run():
            for cache in (faces._RUNS_CACHE, faces._FACE_CACHE):
                cache.pop(mesh, None)
            fn()
        return min(_timed(run, be) for _ in range(repeat))
    t_match = fresh(lambda: faces.face_runs(mesh, backend=be))
    whole = fresh(lambda: residual_indicators(space, u, f=1.0, backend=be))
    ranks = partition_cells(mesh, size)
    slowest = 0.0
    for r in range(size):
        own = ranks == r
        slowest = max(slowest, fresh(lambda: residual_indicators(space, u, f=1.0, backend=be, cells=own)))
    return t_match, whole, slowest


@contextlib.contextmanager
def device_path():
    """The estimator's GPU code path on NumPy: every ``_Data`` takes the device's chunk sizes
    and defers its determinant checks (its arrays stay NumPy arrays)."""
    import adaptmg.estimate.residual as res
    init = res._Data.__init__

    def as_device(self, *a, **k):
        init(self, *a, **k)
        self.gpu = True
    res._Data.__init__ = as_device
    try:
        yield
    finally:
        res._Data.__init__ = init


def count_calls(fn, xp):
    """Run ``fn()`` counting the estimator's evaluations (:func:`point_fields` calls) and its
    products with basis tables: ``xp.matmul`` calls (the estimator has no other) and, on the
    device, the fused grouped products (one kernel for all groups of a table product:
    :func:`adaptmg.device.index_kernels.grouped_table_product`, whose twin makes one matmul
    per group)."""
    import adaptmg.estimate.evaluation as ev
    import adaptmg.estimate.residual as res
    from adaptmg.backend import in_host_memory
    counts = {"evaluations": 0, "products": 0}
    real_pf, real_mm, real_gp = res.point_fields, xp.matmul, ev.grouped_table_product

    def pf(*a, **k):
        counts["evaluations"] += 1
        return real_pf(*a, **k)

    def mm(*a, **k):
        counts["products"] += 1
        return real_mm(*a, **k)

    def gp(tables, B, groups):
        if getattr(groups, "ids", None) is not None and not in_host_memory(B):
            counts["products"] += 1                  # the kernel; the twin's matmuls count above
        return real_gp(tables, B, groups)
    res.point_fields, xp.matmul, ev.grouped_table_product = pf, mm, gp
    try:
        fn()
    finally:
        res.point_fields, xp.matmul, ev.grouped_table_product = real_pf, real_mm, real_gp
    return counts


def run(backend, dim, cells, degree, repeat, mesh=None):
    from adaptmg import Space
    from adaptmg.backend import get_backend
    from adaptmg.estimate import residual_indicators
    from adaptmg.estimate.faces import face_runs
    be = get_backend(backend)
    mesh = graded_mesh(dim, cells) if mesh is None else mesh
    space = Space(mesh, degree)
    u = be.asarray(np.random.default_rng(0).standard_normal(space.num_dofs))
    call = lambda: residual_indicators(space, u, f=1.0, backend=be)           # noqa: E731
    t = time.perf_counter()
    call()
    first = time.perf_counter() - t
    counts = count_calls(call, be.xp)
    best = np.inf
    for _ in range(repeat):
        t = time.perf_counter()
        call()
        best = min(best, time.perf_counter() - t)
    fr = face_runs(mesh, backend=be)
    return dict(backend=be.name, cells=mesh.num_cells, dofs=space.num_dofs, faces=fr.cell.size,
                runs=len(fr.runs), first=first, best=best, **counts), mesh


def pieces_against_one(space, u, be, repeat):
    """``{label: (median seconds, largest peak bytes per DoF)}`` of the whole estimate in pieces
    and in one piece (module doc), ``repeat`` alternated rounds after one untimed."""
    import adaptmg.estimate.faces as faces
    import adaptmg.estimate.residual as residual
    from adaptmg.estimate import residual_indicators
    pool = be.xp.get_default_memory_pool()
    default, got = residual.DEVICE_FACE_PIECE, {}
    try:
        for rnd in range(repeat + 1):
            for label, piece in (("pieces", default), ("one piece", 1 << 62)):
                residual.DEVICE_FACE_PIECE = piece
                for cache in (faces._RUNS_CACHE, faces._FACE_CACHE):
                    cache.pop(space.mesh, None)
                pool.free_all_blocks()
                live = pool.used_bytes()
                t = _timed(lambda: residual_indicators(space, u, f=1.0, backend=be), be)
                if rnd:
                    got.setdefault(label, []).append((t, (pool.total_bytes() - live) / space.num_dofs))
    finally:
        residual.DEVICE_FACE_PIECE = default
    return {k: (float(np.median([t for t, _ in v])), max(b for _, b in v)) for k, v in got.items()}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backend", default="cpu", help="cpu, gpu, or both (comma separated)")
    p.add_argument("--dim", type=int, default=2, choices=(2, 3))
    p.add_argument("--cells", type=float, default=2e5)
    p.add_argument("--degree", type=int, default=1, choices=(1, 2))
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--device-path", action="store_true", help="the GPU code path on the CPU backend")
    p.add_argument("--share", type=int, default=0, help="also time one rank's estimate of P ranks (module doc)")
    p.add_argument("--mesh-backend", default="cpu", choices=("cpu", "gpu"), help="where the mesh is graded")
    p.add_argument("--pieces", action="store_true", help="GPU: the faces in pieces against one piece (module doc)")
    a = p.parse_args(argv)
    if a.share < 0:
        p.error("--share must be a positive number of ranks")
    t = time.perf_counter()
    mesh = graded_mesh(a.dim, int(a.cells), a.mesh_backend)
    print(f"graded {a.dim}-D mesh: {mesh.num_cells} cells, {mesh.num_hanging_nodes} hanging nodes "
          f"({time.perf_counter() - t:.1f} s)", flush=True)
    print("| backend | cells | DoFs | faces | runs | evaluations / estimate | table products / estimate "
          "| first call (s) | estimate (s, best of %d) |" % a.repeat)
    print("|---|---|---|---|---|---|---|---|---|")
    rows = []
    for name in a.backend.split(","):
        with device_path() if a.device_path else contextlib.nullcontext():
            r, _ = run(name.strip(), a.dim, 0, a.degree, a.repeat, mesh)
        if a.device_path:
            r["backend"] += " (GPU path)"
        rows.append(r)
        print(f"| {r['backend']} | {r['cells']} | {r['dofs']} | {r['faces']} | {r['runs']} | {r['evaluations']} "
              f"| {r['products']} | {r['first']:.3f} | {r['best']:.4f} |", flush=True)
    if a.share:
        from adaptmg import Space
        from adaptmg.backend import get_backend
        print(f"\nper step of the replicated loop, one rank of P = {a.share} against P = 1 (seconds, best of "
              f"{a.repeat}, faces not matched before):\n| backend | of it: match faces | whole estimate (P = 1) "
              f"| a rank's cells (P = {a.share}, slowest) | ratio |\n|---|---|---|---|---|")
        for name in a.backend.split(","):
            be = get_backend(name.strip())
            space = Space(mesh, a.degree)
            u = be.asarray(np.random.default_rng(0).standard_normal(space.num_dofs))
            m, w, r = rank_share(space, u, be, a.share, a.repeat)
            print(f"| {be.name} | {m:.4f} | {w:.4f} | {r:.4f} | {w / r:.2f}x |", flush=True)
    if a.pieces:
        from adaptmg import Space
        from adaptmg.backend import get_backend
        be = get_backend("gpu")
        space = Space(mesh, a.degree)
        u = be.asarray(np.random.default_rng(0).standard_normal(space.num_dofs))
        print(f"\nthe whole estimate, faces matched in pieces against one piece ({a.repeat} rounds alternated, "
              "median; the CuPy pool's peak above the live arrays):\n| faces | seconds | peak B per DoF |\n|---|---|---|")
        for label, (t, peak) in pieces_against_one(space, u, be, a.repeat).items():
            print(f"| {label} | {t:.3f} | {peak:.0f} |", flush=True)
    return rows


if __name__ == "__main__":
    main()
