"""Worker run under ``mpiexec -n P`` by tests/distributed/test_forest_rows.py (not a test module).

``python forest_rows_cases.py OUT.json``: for every case a
:class:`~adaptmg.distributed.forest.DistributedForest` and the serial :class:`Mesh` by the
same refinements (rank 0); every rank builds its owned rows (:mod:`adaptmg.distributed.forest_rows`),
rank 0 gathers them, maps the global ids to serial nodes through the coordinates and writes
one JSON record per (case, stage) with the errors against the serial matrices in units of eps.
"""
import json
import sys

import numpy as np
import scipy.sparse as sp

from adaptmg.assemble import stiffness
from adaptmg.distributed import install_excepthook
from adaptmg.distributed.forest import DistributedForest
from adaptmg.distributed.forest_rows import owned_constrained_rows, owned_rows
from adaptmg.distributed.local import CellSubset
from adaptmg.fe.constraints import Constraints
from adaptmg.fe.space import Space
from adaptmg.mesh import Mesh

from forest_cases import COMM, _index_of, steps_imported, steps_local, steps_uniform

EPS = np.finfo(float).eps


def left_of(coarse):
    """Dirichlet on part of the boundary: the nodes with x_0 = min over the coarse mesh (a
    ``where`` predicate of the points; the same on every rank)."""
    x0 = coarse.points[:, 0].min() + 1e-9 * np.ptp(coarse.points[:, 0])
    return lambda x: x[:, 0] < x0


def ghostless_rows(df):
    """The owned rows assembled on the owned leaves only (ghosts dropped): must differ."""
    M = df.mesh
    A = sp.csr_matrix(stiffness(CellSubset(Space(M, 1), df.owned_cells)))[df.owned_nodes]
    return sp.csr_matrix((A.data, df.node_gid[A.indices], A.indptr), shape=(A.shape[0], df.num_global_nodes))


def one_layer_congruence(df):
    """Owned rows of H^T A H from the local mesh alone (one ghost layer): must differ where a
    hanging node's leaves are not local to its parent's owner."""
    S = Space(df.mesh, 1)
    H = S.H_nodes
    B = sp.csr_matrix(H.T @ sp.csr_matrix(stiffness(S)) @ H)[df.owned_nodes]
    return sp.csr_matrix((B.data, df.node_gid[B.indices], B.indptr), shape=(B.shape[0], df.num_global_nodes))


def cross_rank_hanging(df):
    """(hanging node, parent) pairs of this rank's owned hanging nodes whose parent another rank owns."""
    hn, hp = df.hanging
    starts = np.concatenate([[0], np.cumsum(COMM.allgather(df.owned_nodes.size))])
    gids = df.node_gid[df.owned_nodes]
    mine = np.isin(hn, gids)
    p = hp[mine]
    p = p[p >= 0]
    return int((np.searchsorted(starts, p, side="right") - 1 != COMM.rank).sum())


def coo_rows(B, gids):
    B = B.tocoo()
    return gids[B.row], B.col.astype(np.int64), B.data


def err_eps(rows, serial_matrix, idx, scale, free=None):
    """max |D - S| / (eps max |S|), D the gathered rows in serial numbering (with ``free``:
    both restricted to the free x free entries)."""
    r = np.concatenate([a for a, _, _ in rows])
    c = np.concatenate([b for _, b, _ in rows])
    v = np.concatenate([x for _, _, x in rows])
    S = sp.csr_matrix(serial_matrix)
    if free is not None:
        keep = free[idx[r]] & free[idx[c]]
        r, c, v = r[keep], c[keep], v[keep]
        Z = sp.diags(free.astype(float))
        S = Z @ S @ Z
    D = sp.csr_matrix((v, (idx[r], idx[c])), shape=S.shape)
    return float(abs(D - S).max() / (EPS * scale))


def compare(name, stage, df, serial, records, left):
    A_o, gids = owned_rows(df)
    K_o, gk, free, s = owned_constrained_rows(df)
    K_w, _, _, s_w = owned_constrained_rows(df, dirichlet=left)     # Dirichlet on part of the boundary
    G = ghostless_rows(df)
    L = one_layer_congruence(df)
    X = df.mesh.points[df.owned_nodes]
    got = COMM.gather(dict(A=coo_rows(A_o, gids), K=coo_rows(K_o, gk), G=coo_rows(G, gids), L=coo_rows(L, gids), W=coo_rows(K_w, gids), s_w=s_w, gids=gids, X=X,
                           same_gids=bool(np.array_equal(gids, gk)), nnz=(A_o.nnz, K_o.nnz), s=s,
                           shape=A_o.shape, nfree=int(free.sum())), root=0)
    cross = COMM.allreduce(cross_rank_hanging(df))
    if COMM.rank:
        return
    S = Space(serial, 1)
    As = sp.csr_matrix(stiffness(S))
    cons = Constraints(S, S.boundary_dofs())
    Ks = cons.matrix(As)
    cons_w = Constraints(S, S.boundary_dofs(where=left))
    Kw = cons_w.matrix(As)
    gid = np.concatenate([g["gids"] for g in got])
    at = _index_of(serial.points, np.concatenate([g["X"] for g in got]))
    idx = np.full(serial.num_nodes, -1)
    idx[gid] = at
    scale = abs(As).max()
    records.append(dict(
        case=name, stage=stage, P=COMM.size, n=serial.num_nodes, hanging=int(serial.num_hanging_nodes),
        cross_rank_hanging=cross, ids_map_bad=int((idx < 0).sum() + (np.sort(at) != np.arange(at.size)).sum()),
        gids_sorted=bool(all((np.diff(g["gids"]) > 0).all() for g in got)),
        shapes_ok=bool(all(g["shape"] == (g["gids"].size, serial.num_nodes) for g in got)),
        same_gids=bool(all(g["same_gids"] for g in got)),
        A_err=err_eps([g["A"] for g in got], As, idx, scale),
        A_nnz=[int(sum(g["nnz"][0] for g in got)), int(As.nnz)],
        K_err=err_eps([g["K"] for g in got], Ks, idx, scale),
        K_nnz=[int(sum(g["nnz"][1] for g in got)), int(Ks.nnz)],
        s_err=float(max(abs(g["s"] - cons.scale) for g in got) / (EPS * cons.scale)),
        nfree=[int(sum(g["nfree"] for g in got)), int(cons.free.sum())],
        Kw_err=err_eps([g["W"] for g in got], Kw, idx, scale),
        sw_err=float(max(abs(g["s_w"] - cons_w.scale) for g in got) / (EPS * cons_w.scale)),
        nfixed_w=int(cons_w.dirichlet.size),
        ghostless_err=err_eps([g["G"] for g in got], As, idx, scale),
        one_layer_K_err=err_eps([g["L"] for g in got], Ks, idx, scale, cons.free)))


CASES = {
    "uniform-2d": (2, steps_uniform),
    "uniform-3d": (3, steps_uniform),
    "local-2d": (2, steps_local),
    "local-3d": (3, steps_local),
    "imported-3d": (3, lambda dim: steps_imported("bracket_hex.vtu")),
}


def main():
    install_excepthook(COMM)
    records = []
    for name, (dim, steps_of) in CASES.items():
        box, steps = steps_of(dim)
        coarse = Mesh.box(*box) if isinstance(box, tuple) else box
        df = DistributedForest.from_coarse(coarse, comm=COMM)
        serial = coarse if COMM.rank == 0 else None
        for step in steps:
            df = df.refine(step)
            if COMM.rank == 0:
                serial = serial.refine(None if step is None else step(serial.points[serial.cells].mean(1)))
        compare(name, "refined", df, serial, records, left_of(coarse))
        # a weighted cut: the ranks' boundaries move through the refined corner
        c = df.centres()
        w = np.where(np.linalg.norm(c - 0.3, axis=1) < 0.3, 4.0, 1.0)
        compare(name, "weighted", df.repartition(weights=w), serial, records, left_of(coarse))
    if COMM.rank == 0:
        with open(sys.argv[1], "w") as f:
            json.dump(records, f)


if __name__ == "__main__":
    main()
