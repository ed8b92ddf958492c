"""Benchmark (GPU): device memory of a 3-D Q1 Poisson set-up and solve on one GPU -- the peak
bytes per DoF of each phase, and the largest problem that fits.

    python scripts/bench_memory.py                      # 2.1e7 DoFs, the lean device pattern
    python scripts/bench_memory.py --sorted             # the same with the sort-based pattern
    python scripts/bench_memory.py --px 3 --dofs 7e7 --reps 1   # ~5.6e7 DoFs (nnz < 2^31)

The mesh is :func:`bench_distributed.make_mesh` (3-D, one box, a local refinement) built on
the device; then ``multigrid(space, assemble.stiffness, backend="gpu")`` and CG to 1e-8.
Per phase (mesh + load, multigrid set-up, solve) the high-water mark of CuPy's pool in use
(a memory hook on every allocation) in GB and bytes per DoF, the seconds (after a device
synchronisation; the last repetition is warm), and the largest DoF count whose set-up peak
(bytes per DoF, measured) fits the device's free memory at start:
``N_max = free / max(peak per DoF)`` (the mesh phase included, and separately without it),
beside the DoFs at which the finest matrix reaches 2^31 - 1 entries (the most a cupyx CSR
holds before CuPy 14.3).  ``--where``: the stack at each phase's peak.
"""
import argparse
import os
import sys
import time
import traceback

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dofs", type=float, default=2.1e7)
    ap.add_argument("--px", type=int, default=1, help="boxes along x (make_mesh's px): sizes between "
                    "its 8x refinement steps, e.g. --px 3 --dofs 7e7 for ~5.6e7 DoFs")
    ap.add_argument("--reps", type=int, default=2, help="repetitions (the last one is reported warm)")
    ap.add_argument("--sorted", action="store_true", help="the sort-based device pattern (before)")
    ap.add_argument("--no-solve", action="store_true")
    ap.add_argument("--where", action="store_true", help="print the stack at each phase's peak")
    a = ap.parse_args()
    import cupy
    from bench_distributed import make_mesh
    from adaptmg import assemble, multigrid
    from adaptmg.fe import Space
    if a.sorted:
        _use_sorted_pattern()
    pool = cupy.get_default_memory_pool()
    GB = 2.0 ** 30

    class Peak(cupy.cuda.MemoryHook):
        name = "peak"
        peak = 0
        stack = ()

        def malloc_postprocess(self, device_id, size, mem_size, mem_ptr, pmem_id):
            used = pool.used_bytes()
            if used > self.peak:
                if a.where and used > 1.01 * self.peak:       # where the peak is (the stack)
                    self.stack = [f"{f.filename.split('adaptmg/')[-1]}:{f.lineno} {f.name}"
                                  for f in traceback.extract_stack()[:-1] if "adaptmg" in f.filename][-6:]
                self.peak = used

    free0, total = cupy.cuda.runtime.memGetInfo()
    print(f"device: {total / GB:.1f} GB, free {free0 / GB:.1f} GB; pattern: {'sorted' if a.sorted else 'lean'}")
    for rep in range(a.reps):
        pool.free_all_blocks()
        h = Peak()
        rows = []
        with h:
            t = time.perf_counter()
            mesh = make_mesh(3, a.px, int(a.dofs), backend="gpu")
            space = Space(mesh, 1)
            b = assemble.load(space, 1.0)
            cupy.cuda.Device().synchronize()
            n = space.num_dofs
            rows.append(("mesh+load", time.perf_counter() - t, h.peak, h.stack))
            h.peak, h.stack = pool.used_bytes(), ()
            t = time.perf_counter()
            ml = multigrid(space, assemble.stiffness, backend="gpu")
            cupy.cuda.Device().synchronize()
            rows.append(("multigrid", time.perf_counter() - t, h.peak, h.stack))
            live = pool.used_bytes()
            if not a.no_solve:
                h.peak, h.stack = live, ()
                t = time.perf_counter()
                f = ml.constrain(b)
                x = ml.solve(f, rtol=1e-8, accel="cg")
                cupy.cuda.Device().synchronize()
                rows.append(("solve", time.perf_counter() - t, h.peak, h.stack))
                # the true relative residual of the constrained system (one SpMV after the peak)
                res = float(cupy.linalg.norm(ml.levels[-1].A @ x - f) / cupy.linalg.norm(f))
                del x, f
        print(f"rep {rep}: {mesh.num_cells} cells, {n} DoFs, finest nnz {ml.levels[-1].A.nnz}; "
              f"live after set-up {live / GB:.2f} GB = {live / n:.0f} B/DoF"
              + ("" if a.no_solve else f"; CG to rtol 1e-8: relative residual {res:.1e}"))
        for name, s, p, where in rows:
            print(f"  {name:10s} {s:7.3f} s   peak {p / GB:7.2f} GB = {p / n:6.0f} B/DoF")
            for line in where:
                print(f"      at {line}")
        peak_all = max(r[2] for r in rows) / n
        peak_setup = max(r[2] for r in rows if r[0] != "mesh+load") / n
        nnz = int(ml.levels[-1].A.nnz)
        print(f"  largest fitting (free {free0 / GB:.0f} GB): {free0 / peak_all:.3g} DoFs; "
              f"without the mesh phase {free0 / peak_setup:.3g} DoFs; a CSR of at most 2^31 - 1 "
              f"entries (cupyx before CuPy 14.3): {(2 ** 31 - 1) * n / nnz:.3g} DoFs")
        del ml, b, space, mesh
        import gc
        gc.collect()


def _use_sorted_pattern():
    """The earlier device assembly: every element matrix into one (E,) array, summed by the
    sort-based pattern (adaptmg.assemble._device_sorted)."""
    from adaptmg.assemble import forms, on_device, vector_forms
    from adaptmg.assemble._device_sorted import SortedDevicePattern

    def pattern(be, r, c, nr, nc):
        return SortedDevicePattern(be, r, c, nr, nc)

    def sums(device, pat, info, xi, w, factor, T_full, extra):
        xp = device.xp
        nent = info.num_cells * T_full.shape[1]
        out = xp.empty(nent)
        out_e = xp.empty(nent) if extra is not None else None
        on_device.element_entries_on_device(device, info, xi, w, factor, T_full, out,
                                            extra=None if extra is None else (*extra, out_e))
        s = pat.sum(out, on_device=True)
        del out
        return s, None if extra is None else pat.sum(out_e, on_device=True)
    forms.get_device_pattern = vector_forms.get_device_pattern = pattern
    forms.device_element_sums = sums


if __name__ == "__main__":
    main()
