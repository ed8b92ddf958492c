"""In-process ranks (adaptmg.distributed.thread_comm): mpi4py's semantics for the calls the
distributed layer makes, failures that abort every rank instead of hanging, and the
distributed solve on 2 and 3 threads reproducing the one-rank solve."""
import numpy as np
import pytest

from adaptmg import assemble
from adaptmg.distributed import solve
from adaptmg.distributed.comm import waitall
from adaptmg.distributed.thread_comm import RankAborted, run_ranks
from adaptmg.fe import Space
from adaptmg.mesh import Mesh


def test_object_collectives():
    def f(comm):
        r, P = comm.Get_rank(), comm.Get_size()
        got = comm.bcast({"v": [1, 2]} if r == 0 else None, root=0)
        got["v"].append(r)                       # a copy: the root's object is untouched
        return (comm.allgather(r * 10), got, comm.gather(r, root=1), comm.allreduce(r + 1),
                comm.exscan(r + 1), comm.allreduce(np.array([r, -r])))
    out = run_ranks(3, f)
    for r, (ag, got, ga, ar, ex, arr) in enumerate(out):
        assert ag == [0, 10, 20] and got == {"v": [1, 2, r]} and ar == 6
        assert ga == ([0, 1, 2] if r == 1 else None)
        assert ex == (None if r == 0 else sum(range(1, r + 1)))
        np.testing.assert_array_equal(arr, [3, -3])


def test_reduction_ops():
    MPI = pytest.importorskip("mpi4py.MPI")
    out = run_ranks(3, lambda comm: (comm.allreduce(comm.Get_rank(), op=MPI.MAX),
                                     comm.allreduce(np.array([comm.Get_rank(), 5]), op=MPI.MIN)))
    assert [o[0] for o in out] == [2, 2, 2]
    for o in out:
        np.testing.assert_array_equal(o[1], [0, 5])
    with pytest.raises(TypeError, match="MPI.SUM, MPI.MAX or MPI.MIN"):
        run_ranks(2, lambda comm: comm.allreduce(1, op=MPI.PROD))


def test_buffer_collectives():
    def f(comm):
        r, P = comm.Get_rank(), comm.Get_size()
        s = np.empty(2)
        comm.Allreduce(np.array([r, 1.0]), s)
        b = np.arange(4) if r == 2 else np.zeros(4, dtype=int)
        comm.Bcast(b, root=2)
        rc = np.empty(P, dtype=np.int64)
        sc = np.arange(P, dtype=np.int64) + r       # rank r sends q + r entries to rank q
        comm.Alltoall(sc, rc)
        send = np.concatenate([np.full(q + r, 100 * r + q) for q in range(P)])
        recv = np.empty(int(rc.sum()), dtype=send.dtype)
        sd = np.concatenate([[0], np.cumsum(sc)[:-1]])
        rd = np.concatenate([[0], np.cumsum(rc)[:-1]])
        comm.Alltoallv([send, (sc, sd)], [recv, (rc, rd)])
        counts = np.array([1, 2, 3])
        allv = np.empty(6)
        comm.Allgatherv(np.full(counts[r], float(r)), [allv, (counts, np.array([0, 1, 3]))])
        comm.Barrier()
        return s, b, rc, recv, allv
    for r, (s, b, rc, recv, allv) in enumerate(run_ranks(3, f)):
        np.testing.assert_array_equal(s, [3.0, 3.0])
        np.testing.assert_array_equal(b, np.arange(4))
        np.testing.assert_array_equal(rc, [r + q for q in range(3)])
        want = np.concatenate([np.full(r + q, 100 * q + r) for q in range(3)])
        np.testing.assert_array_equal(recv, want)
        np.testing.assert_array_equal(allv, [0, 1, 1, 2, 2, 2])


def test_point_to_point():
    def f(comm):
        r = comm.Get_rank()
        if r == 0:
            comm.Send(np.array([1.0, 2.0]), dest=1, tag=7)
            reqs = [comm.Isend(np.array([3, 4]), dest=1, tag=8)]
            waitall(reqs)
            return None
        a, b = np.empty(2), np.empty(2, dtype=int)
        reqs = [comm.Irecv(b, source=0, tag=8)]      # posted first, the other tag received first
        comm.Recv(a, source=0, tag=7)
        waitall(reqs)
        return a, b
    _, (a, b) = run_ranks(2, f)
    np.testing.assert_array_equal(a, [1.0, 2.0])
    np.testing.assert_array_equal(b, [3, 4])


@pytest.mark.parametrize("where", ["barrier", "recv"])
def test_a_failing_rank_aborts_the_others(where):
    """The failing rank's own exception comes out; the rank blocked in a collective or a
    receive is released by the abort (RankAborted), not left hanging."""
    def f(comm):
        if comm.Get_rank() == 1:
            raise ZeroDivisionError("rank 1 fails")
        if where == "barrier":
            comm.Barrier()
        else:
            comm.Recv(np.empty(1), source=1)
    with pytest.raises(ZeroDivisionError, match="rank 1 fails"):
        run_ranks(2, f)

    def g(comm):
        comm.Abort(1)
        comm.Barrier()
    with pytest.raises(RankAborted):
        run_ranks(2, g)


def test_receive_buffers_must_be_contiguous():
    """A strided receive buffer would take a copy, not the data: refused (as MPI's buffers)."""
    def f(comm):
        if comm.Get_rank() == 0:
            comm.Send(np.ones(2), dest=1)
        else:
            comm.Recv(np.zeros(4)[::2], source=0)
    with pytest.raises(ValueError, match="C-contiguous"):
        run_ranks(2, f)


@pytest.mark.parametrize("where", ["barrier", "recv"])
def test_a_call_no_other_rank_makes_fails_after_the_timeout(where):
    """A rank that never reaches the collective (or never sends): the waiting rank gives up
    after ``timeout`` and the error says so -- no hang."""
    def f(comm):
        if comm.Get_rank() == 0:
            if where == "barrier":
                comm.Barrier()
            else:
                comm.Recv(np.empty(1), source=1)
    with pytest.raises(RankAborted, match="never"):
        run_ranks(2, f, timeout=0.3)


def test_run_ranks_checks_its_arguments():
    for bad in (0, -1, 1.5, True, "2"):
        with pytest.raises(ValueError, match="positive integer"):
            run_ranks(bad, lambda comm: None)
    for bad in (0, -1.0, True, "1"):
        with pytest.raises(ValueError, match="timeout"):
            run_ranks(2, lambda comm: None, timeout=bad)


def _problem():
    m = Mesh.box([0.0] * 3, [1.0] * 3, [2] * 3)
    for _ in range(3):
        m = m.refine()
    c = m.points[m.cells].mean(axis=1)
    return Space(m.refine(np.linalg.norm(c - 0.3, axis=1) < 0.25), 1)


@pytest.mark.parametrize("P", [2, 3])
def test_distributed_solve_on_threads_matches_one_rank(P):
    """The local set-up on P in-process ranks (serial levels on rank 0, the cut handed over by
    rank 1) gives the one-rank solve's iterations and solution (to rounding: the reductions
    are summed in another order)."""
    space = _problem()
    b = assemble.load(space, 1.0)
    kw = dict(rtol=1e-10, local_setup=True, agglomerate_below=200, min_dofs_per_rank=50)

    def run(comm):
        r = solve(space, assemble.stiffness, b, comm=comm, **kw)
        return r.iterations, np.asarray(r.x), set(r.timings)
    (it1, x1, _), = run_ranks(1, run)
    out = run_ranks(P, run)
    for it, x, keys in out:
        assert it == it1
        assert np.linalg.norm(x - x1) <= 1e-9 * np.linalg.norm(x1)
        assert "handover_s" in keys             # the split set-up ran
    assert it1 <= 8


def test_warmup_distributed_task_runs_on_the_host():
    from adaptmg.device.warmup import TASKS, _distributed
    assert TASKS["distributed"][0] is _distributed
    _distributed("cpu", levels=(3,))


def test_forest_on_thread_ranks():
    """The distributed forest on in-process ranks: its collective cached values (the cell halo,
    the numbering) are computed by each rank on its own (Python 3.11's cached_property made
    the second rank wait for the first one's lock while the first waited in the collective:
    a deadlock, here a timeout), and the global node count is the one-rank count."""
    from adaptmg.distributed.forest import DistributedForest

    def f(comm):
        F = DistributedForest.box([0, 0, 0], [2, 1, 1], (2, 1, 1), comm=comm).refine()
        F = F.refine(F.centres()[:, 0] < 0.6).repartition()
        return F.num_global_nodes, len(F.owned_cells), F.num_ghosts
    (n1, c1, g1), = run_ranks(1, f, timeout=60)
    out = run_ranks(2, f, timeout=60)
    assert g1 == 0 and all(n == n1 for n, _, _ in out)
    assert sum(c for _, c, _ in out) == c1 and all(g > 0 for _, _, g in out)


def test_collective_property_is_computed_once_per_instance():
    from adaptmg.distributed.comm import collective_property
    calls = []

    class A:
        @collective_property
        def v(self):
            """doc"""
            calls.append(self)
            return len(calls)
    a, b = A(), A()
    assert (a.v, a.v, b.v) == (1, 1, 2) and calls == [a, b]
    assert isinstance(A.v, collective_property) and A.v.__doc__ == "doc" and a.__dict__["v"] == 1


def test_warmup_distributed_adaptive_task_runs_on_the_host():
    from adaptmg.device.warmup import TASKS, _distributed_adaptive
    assert TASKS["distributed-adaptive"][0] is _distributed_adaptive
    _distributed_adaptive("cpu", max_dofs=3000)
