"""Would reusing levels across adaptive steps pay?  Unchanged levels of the multigrid hierarchy.

Issue 36 asks for reuse across adaptive steps "where the mesh changed only locally (patterns
and coarse levels of unchanged regions), if it pays -- measure it".  This runs the adaptive
L-shape loop (the README's GPU row: residual estimator, Doerfler theta = 0.5) and, at every
step, compares the global-coarsening hierarchy that ``multigrid()`` builds
(``mesh.hierarchy()``) with the previous step's: a level is *unchanged* when a level of the
previous step has the same cells (the same vertex coordinates, cell by cell).  Only an
unchanged level's space, constraints, matrix and transfer to the next unchanged level could be
reused as they are.

Prints per step: the levels, how many are unchanged, the DoFs of the largest unchanged level,
the share of the hierarchy's cells in unchanged levels, and whether the largest unchanged
level lies within the direct coarse solve of the GPU hierarchy (at most
:data:`adaptmg.multilevel.hierarchy.GPU_COARSE_MAX_ROWS` rows: the finest such level is the
dense coarse solve, coarser ones are not built on the GPU at all).

    python scripts/bench_reuse.py --max-dofs 2e5
"""
import argparse
import hashlib

import numpy as np


def level_digest(mesh):
    """A digest of a mesh's cells by their vertex coordinates (order included)."""
    return hashlib.md5(np.ascontiguousarray(mesh.points[mesh.cells]).tobytes()).hexdigest()


def main(argv=None):
    from adaptmg import Space
    from adaptmg.estimate import adaptive_loop
    from adaptmg.multilevel.hierarchy import GPU_COARSE_MAX_ROWS
    from adaptmg_problems import lshape

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-dofs", type=float, default=2e5)
    ap.add_argument("--backend", default="cpu")
    args = ap.parse_args(argv)

    prob = lshape.problem("residual")
    rows, prev = [], set()
    solve = prob.solve

    def solve_and_compare(mesh, backend="cpu"):
        nonlocal prev
        meshes = mesh.hierarchy()
        digests = [level_digest(m) for m in meshes]
        same = [d in prev for d in digests]
        cells = [m.num_cells for m in meshes]
        kept = [m for m, s in zip(meshes, same) if s]
        largest = Space(kept[-1], 1).num_dofs if kept else 0     # the hierarchy is coarse -> fine
        rows.append(dict(step=len(rows), dofs=None, levels=len(meshes), unchanged=sum(same),
                         largest_unchanged_dofs=largest,
                         share=sum(c for c, s in zip(cells, same) if s) / sum(cells)))
        prev = set(digests)
        out = solve(mesh, backend=backend)
        rows[-1]["dofs"] = out[0].num_dofs
        return out

    prob.solve = solve_and_compare
    adaptive_loop(prob, steps=200, backend=args.backend, quiet=True, max_dofs=int(args.max_dofs))
    print("| step | DoFs | levels | unchanged levels | DoFs of the largest unchanged | "
          "share of the hierarchy's cells | within the GPU coarse solve |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['step']} | {r['dofs']:,} | {r['levels']} | {r['unchanged']} | "
              f"{r['largest_unchanged_dofs']:,} | {r['share']:.3f} | "
              f"{'yes' if r['largest_unchanged_dofs'] <= GPU_COARSE_MAX_ROWS else 'no'} |")
    return rows


if __name__ == "__main__":
    main()
