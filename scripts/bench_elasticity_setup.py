"""Set-up pieces of the elasticity problem (issue 36: "elasticity face-5 init <= 1 s"), one
level at a time, host against device.

For the adaptive mesh ``make_mesh(case, level)`` (face 5: 1,035,030 DoFs of the 6-component
system) it times, per multigrid level (finest first) with the device synchronised around
each call (median of ``--repeat``):

* ``asm host``: ``assemble.elasticity(s3, lam, mu, format="fields", return_mass=True)`` on
  the host (memoised pattern);
* ``asm dev`` / ``asm dev cold``: the same with ``device=gpu, keep_on_device=True`` (element
  matrices, pattern and sums on the device), the pattern memoised / built in that call;
* ``K host`` / ``K dev``: ``Constraints.matrix`` of the node-block system
  ``[[M, -dt M], [dt A, M]]`` (10 fields) built from host fields with the host congruence
  map, and from the device fields with the device map (:func:`adaptmg.fe.congruence.
  congruence_map_on`) -- both give device CSR on the GPU backend;
* ``fields err`` / ``K err``: max |device - host| over max |host| of the fields and of K
  (in units of eps).

    python scripts/bench_elasticity_setup.py --backend gpu               # face 5, ~20-40 s
    python scripts/bench_elasticity_setup.py --backend cpu --level 3     # the xp code on NumPy
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from adaptmg import Space, assemble
from adaptmg.backend import get_backend, to_host
from adaptmg.fe.csr_ops import NodeBlockMatrix
from adaptmg.multilevel.hierarchy import _level_constraints

EPS = np.finfo(float).eps


def timed(be, fn, repeat):
    """(median seconds, last result) of ``fn()``, the device synchronised before and after."""
    ts, out = [], None
    for _ in range(max(1, repeat)):
        be.synchronize()
        t = time.perf_counter()
        out = fn()
        be.synchronize()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts), out


def level_row(space6, be, dev, repeat, lam, mu, dt):
    from adaptmg_problems.elasticity import _coefficients
    mesh = space6.mesh
    s3 = Space(mesh, 1, components=3)
    cons = _level_constraints(space6, "all")
    coef = _coefficients(dt)
    row = dict(cells=mesh.num_cells, dofs=space6.num_dofs, hanging=int(mesh.num_hanging_nodes))
    t, host = timed(be, lambda: assemble.elasticity(s3, lam, mu, format="fields", return_mass=True), repeat)
    row["asm host"] = t
    from adaptmg.fe import sparsity
    from adaptmg.assemble import _device
    if dev is not None:
        sparsity.clear_cache()                     # the next call builds the device pattern
        t, _ = timed(be, lambda: assemble.elasticity(s3, lam, mu, format="fields", return_mass=True,
                                                     device=dev, keep_on_device=True), 1)
        row["asm dev cold"] = t
        t, fd = timed(be, lambda: assemble.elasticity(s3, lam, mu, format="fields", return_mass=True,
                                                      device=dev, keep_on_device=True), repeat)
        row["asm dev"] = t
    else:                                          # the device code run by NumPy (its own pattern)
        cpu = get_backend("cpu")
        from adaptmg.assemble import vector_forms as vf
        keep = (vf._assembly_device, vf.get_device_pattern, vf._keep_backend)
        vf._assembly_device = lambda device, info, per: cpu
        vf.get_device_pattern = lambda b, r, c, nr, nc: _device.DevicePattern(b, r, c, nr, nc)
        vf._keep_backend = lambda *a: cpu
        try:
            t, fd = timed(be, lambda: assemble.elasticity(s3, lam, mu, format="fields", return_mass=True,
                                                          device="xp", keep_on_device=True), repeat)
        finally:
            vf._assembly_device, vf.get_device_pattern, vf._keep_backend = keep
        row["asm dev"] = t
    h = host[2]
    row["fields err"] = float(np.abs(to_host(fd[2]) - h).max() / np.abs(h).max() / EPS)
    nn = s3.num_nodes
    Bh = NodeBlockMatrix(host[0], host[1], host[2], coef, nn, backend=dev)
    Bd = NodeBlockMatrix(fd[0], fd[1], fd[2], coef, nn, backend=dev)
    if dev is not None:                            # the host map (and host T @ data), expanded there
        host_path = host_block_path(cons, Bh)
        t, Kh = timed(be, host_path, repeat)
    else:
        t, Kh = timed(be, lambda: cons.matrix(Bh), repeat)
    row["K host"] = t
    fn = cons.free.reshape(-1, 6)[:, 0]
    fixed = np.flatnonzero(~fn)
    t, Kd = timed(be, lambda: cons._matrix_blocks_on(dev or get_backend("cpu"), Bd, fn, fixed), repeat)
    row["K dev"] = t
    Kh, Kd = to_host(Kh), to_host(Kd)
    row["K err"] = float(abs(Kh - Kd).max() / abs(Kh).max() / EPS) if Kh.shape == Kd.shape else float("nan")
    return row


def host_block_path(cons, B):
    """The node-block constraining of the code before the device map: host congruence_map and
    host ``T @ data``, then the expansion on the device (what ``Constraints.matrix`` did)."""
    from adaptmg.fe.constraints import _block_scale
    from adaptmg.fe.csr_ops import congruence_map, diagonal_positions, expand_node_blocks
    n, c = cons.space.num_nodes, B.c
    fn = cons.free.reshape(n, c)[:, 0]
    fixed = np.flatnonzero(~fn)

    def run():
        ip, ind, T = congruence_map(B.indptr, B.indices, cons.space.H_nodes, fn, extra_diagonal=fixed)
        data = T @ B.data
        dp = diagonal_positions(ip, ind, n)
        s = _block_scale(data, dp[fn], B.coef)
        return expand_node_blocks(B.backend, ip, ind, data, B.coef, n, drop_zeros=True,
                                  diagonal=(dp[fixed], s * np.eye(c)))
    return run


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--backend", default="auto", choices=("auto", "cpu", "gpu"))
    ap.add_argument("--case", default="face", choices=("face", "edge", "vertex"))
    ap.add_argument("--level", type=int, default=5)
    ap.add_argument("--levels", type=int, default=2, help="multigrid levels to time, finest first")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args(argv)
    from adaptmg_problems.elasticity import LAMBDA, MU, make_mesh
    be = get_backend(args.backend)
    dev = be if be.is_gpu else None
    mesh = make_mesh(args.case, args.level)
    meshes = mesh.hierarchy()[::-1][:max(1, args.levels)]
    if dev is not None:                            # compile the kernels outside the timings
        level_row(Space(make_mesh(args.case, 2), 1, components=6), be, dev, 1, LAMBDA, MU, 0.025)
    rows = [level_row(Space(m, 1, components=6), be, dev, args.repeat, LAMBDA, MU, 0.025) for m in meshes]
    cols = ["cells", "dofs", "hanging", "asm host", "asm dev cold", "asm dev", "K host", "K dev",
            "fields err", "K err"]
    cols = [c for c in cols if c in rows[0]]
    print(f"elasticity set-up pieces, {args.case} {args.level}, backend {be.name} "
          f"(seconds, median of {args.repeat}; errors in eps of the largest |entry|)")
    print("  ".join(f"{c:>12s}" for c in cols))
    for r in rows:
        print("  ".join(f"{r[c]:12d}" if isinstance(r[c], int) else f"{r[c]:12.4f}" for c in cols))
    return rows


if __name__ == "__main__":
    main()
