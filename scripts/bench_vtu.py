"""Benchmark: writing a VTU file of a large 2-D mesh, meshio's zlib writer vs the raw one.

A ``Mesh.box`` of ``--cells`` quads (default 1,000,000: 1000 x 1000) with three point fields
(``u``, ``v``, ``w``) and one cell field (``eta``) plus the mesh data (``hanging``, ``level``,
``boundary_ids``, ``region``) is written with

* ``zlib``: ``adaptmg.io.write(path, ...)`` (meshio's zlib/base64 writer, then the names
  inserted by a rewrite of the file), as before issue 36 item 4;
* ``raw``: ``adaptmg.io.write(path, ..., compression=None)`` (:mod:`adaptmg.io.vtu_raw`);

timed alone (``write``), then started in a background thread beside a loop-thread stand-in
(pure Python rounds, which need the GIL as kernel launches do; about 1 s of them alone):
``loop beside`` is that loop's time over its time alone (1.0 = the writer does not slow the
loop; the GIL a writer holds shows here).  With ``--backend gpu`` the mesh and the
fields live on the device and the figures include ``copy``: the loop thread's part of the
adaptive loop's writer (:func:`adaptmg.io.convert.host_mesh` and the fields to the host).

    python scripts/bench_vtu.py                      # host, 1M cells
    python scripts/bench_vtu.py --backend gpu        # mesh on the device
"""
import argparse
import os
import sys
import tempfile
import threading
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _work(rounds):
    """Seconds of ``rounds`` rounds of pure Python work in this thread: the loop's stand-in
    (launching kernels is Python and driver calls that hold the GIL)."""
    t0 = time.perf_counter()
    for _ in range(rounds):
        sum(i * i for i in range(1000))
    return time.perf_counter() - t0


def beside(fn, rounds):
    """Seconds of ``rounds`` rounds of :func:`_work` in this thread while ``fn`` runs in a
    background thread (started first)."""
    th = threading.Thread(target=fn)
    th.start()
    t = _work(rounds)
    th.join()
    return t


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cells", type=int, default=1_000_000)
    ap.add_argument("--backend", choices=("cpu", "gpu"), default="cpu")
    ap.add_argument("--dir", default=None, help="folder for the files (default: a temporary one)")
    a = ap.parse_args(argv)
    from adaptmg import Mesh, Space, io
    from adaptmg.backend import to_host
    from adaptmg.io.convert import host_mesh
    k = max(1, int(round(np.sqrt(a.cells))))
    mesh = Mesh.box([0, 0], [1, 1], [k, k], backend=a.backend)
    xp = mesh.backend.xp
    x = mesh.points
    pd = {"u": xp.sin(x[:, 0]) * x[:, 1], "v": x[:, 0] + x[:, 1], "w": x[:, 0] * x[:, 1]}
    cd = {"eta": xp.arange(mesh.num_cells) / 3.0}
    space = Space(mesh)
    sync = (lambda: xp.cuda.runtime.deviceSynchronize()) if mesh.backend.is_gpu else (lambda: None)
    with tempfile.TemporaryDirectory() as tmp:
        d = a.dir or tmp
        os.makedirs(d, exist_ok=True)
        t0 = time.perf_counter()
        _work(200)
        rounds = max(200, int(200 / (time.perf_counter() - t0)))      # ~1 s alone
        alone = min(_work(rounds) for _ in range(2))
        print(f"{mesh.num_cells} cells, {mesh.num_nodes} nodes, mesh on {mesh.backend.name}; "
              f"loop stand-in alone {alone:.2f} s")
        print("| writer | copy in the loop thread (s) | write alone (s) | file MB | loop beside the writer |")
        print("|---|---|---|---|---|")
        for name, comp in (("zlib (meshio)", "zlib"), ("raw", None)):
            sync()
            t0 = time.perf_counter()
            hm = host_mesh(mesh, space)                   # what the adaptive loop's thread does
            hpd = {k2: to_host(v) for k2, v in pd.items()}
            hcd = {k2: to_host(v) for k2, v in cd.items()}
            t_copy = time.perf_counter() - t0
            path = os.path.join(d, f"bench_{comp or 'raw'}.vtu")
            t0 = time.perf_counter()
            io.write(path, hm, hpd, hcd, compression=comp)
            t_w = time.perf_counter() - t0
            slow = beside(lambda: io.write(path, hm, hpd, hcd, compression=comp), rounds) / alone
            mb = os.path.getsize(path) / 1e6
            print(f"| {name} | {t_copy:.3f} | {t_w:.3f} | {mb:.1f} | {slow:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
