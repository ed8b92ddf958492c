"""Worker run under ``mpiexec -n P`` by tests/distributed/test_forest.py (not a test module).

``python forest_cases.py OUT.json``: every case of CASES builds a
:class:`~adaptmg.distributed.forest.DistributedForest` over COMM_WORLD and the serial
:class:`~adaptmg.mesh.Mesh` by the same refinements (on rank 0), compares them after every
step and after a repartition, and rank 0 writes one JSON record per (case, stage) with the
mismatch counts (all must be 0) and the per-rank cell counts.
"""
import json
import os
import sys

import numpy as np
from mpi4py import MPI

import adaptmg.io
from adaptmg.distributed import install_excepthook
from adaptmg.distributed.cellkeys import forest_keys
from adaptmg.distributed.forest import DistributedForest
from adaptmg.mesh import Mesh

COMM = MPI.COMM_WORLD
DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "data")


def _rows(X):
    """Exact row identity of coordinates (n, d): a structured view for np.unique/searchsorted."""
    X = np.ascontiguousarray(X, dtype=np.float64)
    return X.view([("", np.float64)] * X.shape[1]).reshape(-1)


def _index_of(ref, X):
    """Index of each coordinate row of X among the rows of ref (exact), -1 if absent."""
    r, x = _rows(ref), _rows(X)
    o = np.argsort(r)
    at = np.minimum(np.searchsorted(r[o], x), r.size - 1)
    return np.where(r[o][at] == x, o[at], -1)


def serial_keys(df, mesh):
    return forest_keys(mesh._forest, df.codec, df.root_pos)[mesh.cell_ids]


def gather(df):
    """Everything rank 0 compares, from every rank (pickled gathers: test sizes)."""
    M = df.mesh
    own = df.owned_cells
    on = df.nodes_of_owned
    hn, hp = df.hanging
    gid = df.node_gid
    X = M.points
    pos = np.full(gid.max() + 1, -1)
    pos[gid] = np.arange(gid.size)
    rec = dict(keys=df.keys[own], cellX=X[M.cells[own]], ghosts=df.keys[df.ghost_cells],
               ghost_owner=df.owner[df.ghost_cells],
               gid=gid[on], X=X[on], node_owner=df.node_owner[on], hang=hn, hangX=X[pos[hn]],
               hangP=np.where(hp >= 0, hp, -1),
               hangPX=np.where((hp >= 0)[..., None], X[pos[np.maximum(hp, 0)]], np.nan),
               nglob=df.num_global_nodes, nlocal=M.num_cells, nforest=M._forest.num_cells,
               nowned=df.num_owned, first=df.first, all_gid=gid, all_X=X)
    return COMM.gather(rec, root=0)


def compare(df, serial):
    """Mismatch counts of the gathered distributed forest against the serial mesh (rank 0)."""
    recs = gather(df)
    if COMM.rank:
        return None
    P = len(recs)
    sk = serial_keys(df, serial)
    so = np.argsort(sk)
    keys = np.concatenate([r["keys"] for r in recs])
    out = {}
    # (a) owned leaves: contiguous curve ranges whose union is the serial mesh, same vertices
    out["keys_differ"] = int(keys.size != sk.size or (np.sort(keys) != sk[so]).any())
    out["not_contiguous"] = int(not (np.diff(keys) > 0).all())
    out["first_wrong"] = int(sum(r["first"] != sum(q["nowned"] for q in recs[:p]) for p, r in enumerate(recs)))
    if not out["keys_differ"]:
        cellX = np.concatenate([r["cellX"] for r in recs])
        ref = serial.points[serial.cells][so]
        out["cell_coords_max_diff"] = float(np.abs(cellX[np.argsort(keys)] - ref).max())
    # (b) global node ids: one id per point, ids 0..N-1, N = serial nodes
    gid = np.concatenate([r["gid"] for r in recs])
    X = np.concatenate([r["X"] for r in recs])
    N = serial.num_nodes
    at = _index_of(serial.points, X)
    out["nodes_not_in_serial"] = int((at < 0).sum())
    pairs = np.unique(np.stack([gid, at], 1), axis=0)
    out["ids_with_two_points"] = int(pairs.shape[0] - np.unique(pairs[:, 0]).size)
    out["points_with_two_ids"] = int(pairs.shape[0] - np.unique(pairs[:, 1]).size)
    out["distinct_ids_minus_serial"] = int(np.unique(gid).size - N)
    out["nglob_minus_serial"] = int(max(abs(r["nglob"] - N) for r in recs))
    out["ids_outside_range"] = int(((gid < 0) | (gid >= N)).sum())
    # ghosts' vertex ids agree with the owners' numbering too
    allg = np.concatenate([r["all_gid"] for r in recs])
    allX = np.concatenate([r["all_X"] for r in recs])
    p2 = np.unique(np.stack([allg, _index_of(serial.points, allX)], 1), axis=0)
    out["ghost_ids_inconsistent"] = int(p2.shape[0] - np.unique(p2[:, 0]).size)
    # (c) hanging nodes and their parents (as points) equal the serial mesh's
    hX = np.concatenate([r["hangX"] for r in recs])
    hPX = np.concatenate([r["hangPX"] for r in recs])
    sh = serial.hanging_nodes
    out["serial_hanging"] = int(sh.size)
    hat = _index_of(serial.points, hX)
    uh, first = np.unique(hat, return_index=True)
    out["hanging_differ"] = int(uh.size != sh.size or (np.sort(uh) != np.sort(sh)).any())
    if not out["hanging_differ"]:
        sp_ = serial.hanging_parents
        row = np.empty(serial.num_nodes, dtype=np.int64)
        row[sh] = np.arange(sh.size)
        bad = 0
        for j in range(hPX.shape[0]):     # test sizes: a loop over hanging nodes is fine here
            mine = hPX[j][~np.isnan(hPX[j, :, 0])]
            ref = sp_[row[hat[j]]]
            refX = serial.points[ref[ref >= 0]]
            bad += int(mine.shape != refX.shape or (np.sort(_rows(mine)) != np.sort(_rows(refX))).any())
        out["hanging_parents_differ"] = bad
        # the parents' global ids are the ids of those points
        hid = np.concatenate([r["hangP"] for r in recs])
        idof = np.full(serial.num_nodes, -1)
        idof[at] = gid
        pid_ref = np.where(hid >= 0, idof[_index_of(serial.points, np.nan_to_num(hPX).reshape(-1, hPX.shape[2]))
                                          .reshape(hid.shape)], -1)
        out["hanging_parent_ids_differ"] = int((pid_ref != hid).sum())
    # (d) ghost layer: exactly the leaves owned elsewhere sharing a vertex with an owned leaf
    if not out["keys_differ"]:
        rank_of_key = np.concatenate([np.full(r["keys"].size, p) for p, r in enumerate(recs)])
        kk = np.sort(keys)
        cell_rank = rank_of_key[np.argsort(keys)][np.searchsorted(kk, sk)]
        bad = 0
        for p, r in enumerate(recs):
            mark = np.zeros(serial.num_nodes, dtype=bool)
            mark[serial.cells[cell_rank == p]] = True
            g = np.flatnonzero(mark[serial.cells].any(1) & (cell_rank != p))
            bad += int(g.size != r["ghosts"].size or (np.sort(sk[g]) != np.sort(r["ghosts"])).any()
                       or (cell_rank[g][np.argsort(sk[g])] != r["ghost_owner"][np.argsort(r["ghosts"])]).any())
        out["ghost_layers_differ"] = bad
        # node owners: the lowest rank of the leaves with the node as a vertex (dof_owners'
        # rule), and each rank's ids one contiguous block, in rank order
        low = np.full(N, P)
        np.minimum.at(low, serial.cells.reshape(-1), np.repeat(cell_rank, serial.cells.shape[1]))
        nown = np.concatenate([r["node_owner"] for r in recs])
        out["node_owners_differ"] = int((low[at] != nown).sum())
        og = np.unique(np.stack([gid, nown], 1), axis=0)
        out["owner_blocks_not_contiguous"] = int((np.diff(og[np.argsort(og[:, 0]), 1]) < 0).sum())
    out["owned"] = [int(r["nowned"]) for r in recs]
    out["local"] = [int(r["nlocal"]) for r in recs]
    out["forest"] = [int(r["nforest"]) for r in recs]
    out["serial_cells"] = int(serial.num_cells)
    out["P"] = P
    return out


def split_families(df):
    """Parent keys of the families of 2^d leaves whose children more than one rank owns."""
    k = df.owned_keys
    lev = df.codec.level(k)
    par = np.full(k.size, -1)
    for lv in np.unique(lev[lev > 0]):
        par[lev == lv] = df.codec.ancestor(k[lev == lv], int(lv) - 1)
    got = COMM.allgather((par[par >= 0], np.full(int((par >= 0).sum()), COMM.rank)))
    p = np.concatenate([a for a, _ in got])
    r = np.concatenate([b for _, b in got])
    u, inv, cnt = np.unique(p, return_inverse=True, return_counts=True)
    whole = cnt[inv] == 2 ** df.dim
    pr = np.unique(np.stack([p[whole], r[whole]], 1), axis=0)
    fam, n_ranks = np.unique(pr[:, 0], return_counts=True)
    return fam[n_ranks > 1]


def coarsen_checked(lev, smesh):
    """Both coarsened once, and the number of cut families the serial rule blocks (rank 0)."""
    split = split_families(lev)
    lev = lev.coarsen_once()
    if COMM.rank:
        return lev, None, 0, int(split.size)
    smesh = smesh.coarsen_once()
    blocked = int((~np.isin(split, serial_keys(lev, smesh))).sum())
    return lev, smesh, blocked, int(split.size)


def near(c, r):
    return lambda x: np.linalg.norm(x - c, axis=1) < r


def steps_uniform(dim):
    box = ([0] * dim, [1] * dim, [3, 2] if dim == 2 else [2, 2, 2])
    return box, [None] * (3 if dim == 2 else 2)


def steps_local(dim):
    box, uni = steps_uniform(dim)
    return box, uni + [near(np.full(dim, 0.3), 0.25), near(np.full(dim, 0.3), 0.12)]


def run_case(name, dim, box, steps, records, one_rank=False):
    coarse = Mesh.box(*box) if isinstance(box, tuple) else box
    df = DistributedForest.from_coarse(coarse, comm=COMM)
    serial = coarse if COMM.rank == 0 else None
    grew_elsewhere = 0
    for step in steps:
        if one_rank:                      # marked on rank 0 only, near its cut
            mark = np.zeros(df.num_owned, dtype=bool)
            if COMM.rank == 0 and step is not None:
                c = df.centres()
                mark = np.linalg.norm(c - c[-1], axis=1) < step
            marked = COMM.gather(df.owned_keys[mark], root=0)
            before = df.num_owned
            df = df.refine(mark if step is not None else None)
            grew_elsewhere += COMM.allreduce(int(COMM.rank > 0 and step is not None and df.num_owned > before))
            if COMM.rank == 0:
                if step is None:
                    serial = serial.refine()
                else:
                    m = np.isin(serial_keys(df, serial), np.concatenate(marked))
                    serial = serial.refine(m)
        else:
            df = df.refine(step)
            if COMM.rank == 0:
                serial = serial.refine(None if step is None else step(serial.points[serial.cells].mean(1)))
    rec = compare(df, serial)
    if COMM.rank == 0:
        rec.update(case=name, stage="refined", closure_on_other_ranks=grew_elsewhere)
        records.append(rec)
    df2 = df.repartition()
    rec = compare(df2, serial)
    if COMM.rank == 0:
        rec.update(case=name, stage="repartitioned")
        records.append(rec)
    lev, smesh = df2, serial                      # the global-coarsening hierarchy
    for k in range(2):
        lev, smesh, blocked, split = coarsen_checked(lev, smesh)
        rec = compare(lev, smesh)
        if COMM.rank == 0:
            rec.update(case=name, stage=f"coarsened-{k + 1}", split_families=split, split_blocked=blocked)
            records.append(rec)
    w = df2.centres()[:, 0] + 0.5                 # weighted cut: sums of weights balanced
    df3 = df2.repartition(weights=w)
    tot = COMM.gather(float(w.sum()), root=0)
    wmax = COMM.gather(float(w.max()), root=0)
    rec = compare(df3, serial)
    wsum = COMM.gather(float((df3.centres()[:, 0] + 0.5).sum()), root=0)
    if COMM.rank == 0:
        rec.update(case=name, stage="weighted", weight_sums=wsum, weight_total=float(sum(tot)),
                   max_weight=float(max(wmax)))
        records.append(rec)


def steps_imported(name):
    """A mesh of data/ (unstructured, cells of several orientations): uniform, then a ball."""
    m = adaptmg.io.read(os.path.join(DATA, name))
    c = m.points.mean(axis=0)
    return m, [None, near(c, 0.3 * np.ptp(m.points[:, 0]))]


CASES = {
    "uniform-2d": lambda: (2, *steps_uniform(2), False),
    "uniform-3d": lambda: (3, *steps_uniform(3), False),
    "local-2d": lambda: (2, *steps_local(2), False),
    "local-3d": lambda: (3, *steps_local(3), False),
    "one-rank-2d": lambda: (2, ([0, 0], [1, 1], [3, 2]), [None, None, 0.3, 0.2, 0.12], True),
    "one-rank-3d": lambda: (3, ([0, 0, 0], [1, 1, 1], [2, 2, 2]), [None, 0.35, 0.2], True),
    "imported-2d": lambda: (2, *steps_imported("channel_quad.msh"), False),
    "imported-3d": lambda: (3, *steps_imported("bracket_hex.vtu"), False),
}


def blocked_cut_case(dim, records):
    """A cut inside a family that the 2:1 rule blocks, its blocking children on one side and
    only unblocked ones on the other: the other side learns it through the halo."""
    box, steps = steps_local(dim)
    df = DistributedForest.box(*box, comm=COMM)
    for step in steps:
        df = df.refine(step)
    serial = None
    c = None
    if COMM.rank == 0:
        serial = Mesh.box(*box)
        for step in steps:
            serial = serial.refine(None if step is None else step(serial.points[serial.cells].mean(1)))
        nv, lv = 2 ** dim, serial.levels
        par = serial.parents
        has = par >= 0
        cell_in = has & (np.bincount(par[has], minlength=serial._forest.num_cells)[np.where(has, par, 0)] == nv)
        bad = cell_in & (serial.touch_max(np.where(cell_in, -1, lv)) >= lv + 1)
        order = np.argsort(serial_keys(df, serial))
        b, ci, pp = bad[order], cell_in[order], par[order]
        for i in np.flatnonzero(ci):             # a family: its 2^d children in a row from i
            if i + nv > ci.size or pp[i + nv - 1] != pp[i] or (i > 0 and pp[i - 1] == pp[i]):
                continue
            f = b[i:i + nv]
            if f.any() and not f.all():
                if not f[0]:
                    c = i + int(np.argmax(f))              # [i, c) all unblocked
                else:
                    t = int(np.argmax(f[::-1]))            # trailing unblocked children
                    c = i + nv - t
                break
    c = COMM.bcast(c, root=0)
    n, P = df.global_num_cells, COMM.size
    pos = df.first + np.arange(df.num_owned)
    w = np.where(pos < c, 1.0, (P - 1) * c / (n - c))     # the first cut exactly at c
    cut = df.repartition(weights=w)
    lev, smesh, blocked, split = coarsen_checked(cut, serial)
    rec = compare(lev, smesh)
    if COMM.rank == 0:
        rec.update(case=f"blocked-cut-{dim}d", stage="coarsened", split_families=split, split_blocked=blocked,
                   cut=int(c))
        records.append(rec)


def size_case(records):
    """(e): a 16^3 box from 2^3 roots: local leaves per rank vs the global count."""
    df = DistributedForest.box([0] * 3, [1] * 3, [2, 2, 2], comm=COMM)
    for _ in range(3):
        df = df.refine()
    loc = COMM.gather((df.num_owned, df.mesh.num_cells, df.mesh._forest.num_cells), root=0)
    if COMM.rank == 0:
        records.append(dict(case="size-16^3", stage="uniform", owned=[a for a, _, _ in loc],
                            local=[b for _, b, _ in loc], forest=[c for _, _, c in loc],
                            n=df.global_num_cells))


def main():
    install_excepthook(COMM)
    out = sys.argv[1]
    records = []
    for name, make in CASES.items():
        dim, box, steps, one = make()
        run_case(name, dim, box, steps, records, one_rank=one)
    if COMM.size > 1:
        blocked_cut_case(3, records)             # (the 2-D local case blocks no family)
    size_case(records)
    if COMM.rank == 0:
        with open(out, "w") as f:
            json.dump(records, f)


if __name__ == "__main__":
    main()
