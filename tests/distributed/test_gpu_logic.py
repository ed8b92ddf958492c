"""The host-side logic of the GPU path of adaptmg.distributed (no GPU, no mpiexec needed):
local rank from the launcher's environment, the device of a rank, the halo transport rule,
argument checks.  The device path itself: test_mpi.py (a stand-in device under mpiexec, and
the real one with ``-m gpu``)."""
import importlib.util

import numpy as np
import pytest

import fake_cupy
from adaptmg import assemble
from adaptmg.backend import CPU
from adaptmg.distributed import comm as C
from adaptmg.distributed import nccl as N
from adaptmg.distributed import solve
from adaptmg.fe import Space
from adaptmg.mesh import Mesh

needs_mpi4py = pytest.mark.skipif(importlib.util.find_spec("mpi4py") is None,
                                  reason="mpi4py not installed")


@pytest.mark.parametrize("env,want", [
    ({}, None),
    ({"OMPI_COMM_WORLD_LOCAL_RANK": "3"}, 3),                       # Open MPI
    ({"MPI_LOCALRANKID": "2"}, 2),                                  # MPICH hydra / Intel MPI
    ({"PMI_LOCAL_RANK": "1"}, 1),
    ({"OMPI_COMM_WORLD_LOCAL_RANK": "5", "MPI_LOCALRANKID": "2"}, 5),   # first one wins
    ({"OMPI_COMM_WORLD_LOCAL_RANK": "", "PMI_LOCAL_RANK": "4"}, 4),     # empty: skipped
    ({"MPI_LOCALRANKID": "x1"}, None),
])
def test_local_rank_from_env(env, want):
    assert C.local_rank_from_env(env) == want


def test_device_for_rank():
    assert [C.device_for_rank(r, 1) for r in range(4)] == [0, 0, 0, 0]   # all share one GPU
    assert [C.device_for_rank(r, 4) for r in range(6)] == [0, 1, 2, 3, 0, 1]
    with pytest.raises(ValueError, match="no CUDA device"):
        C.device_for_rank(0, 0)
    with pytest.raises(ValueError, match="non-negative"):
        C.device_for_rank(-1, 2)


class _Node:
    def __init__(self, rank):
        self.rank, self.freed = rank, False

    def Get_rank(self):
        return self.rank

    def Free(self):
        self.freed = True


class _Comm:
    """Stands in for an mpi4py communicator of ``size`` ranks (rank ``rank``)."""

    def __init__(self, rank=0, size=2, node_rank=0, gathered=None):
        self.rank, self.size, self.node = rank, size, _Node(node_rank)
        self.gathered = gathered
        self.calls = []

    def Get_rank(self):
        return self.rank

    def Get_size(self):
        return self.size

    def Allreduce(self, *a):                 # pragma: no cover - get_comm only checks it exists
        raise AssertionError

    def Split_type(self, kind, key=0):
        self.calls.append("Split_type")
        return self.node

    def allgather(self, obj):
        self.calls.append("allgather")
        return self.gathered


def _clear_local_env(monkeypatch):
    for name in C._LOCAL_RANK_VARS:
        monkeypatch.delenv(name, raising=False)


@needs_mpi4py
def test_local_rank_from_a_node_split(monkeypatch):
    """Without the launcher's variables: the rank in the communicator split by shared-memory node."""
    _clear_local_env(monkeypatch)
    comm = _Comm(rank=5, size=8, node_rank=1)
    assert C.local_rank(comm) == 1 and comm.calls == ["Split_type"] and comm.node.freed
    monkeypatch.setenv("PMI_LOCAL_RANK", "3")
    comm = _Comm(rank=5, size=8, node_rank=1)
    assert C.local_rank(comm) == 3 and comm.calls == []            # the environment first


def test_select_device_once_before_allocation(monkeypatch):
    """local_rank % device_count, made current; later calls keep the first choice."""
    import adaptmg.backend as B
    monkeypatch.setattr(B, "_cupy_status", lambda: (fake_cupy.xp, fake_cupy.csp, ""))
    monkeypatch.setattr(C, "_SELECTED", {"device": None})
    monkeypatch.setitem(fake_cupy._STATE, "count", 2)
    monkeypatch.setitem(fake_cupy._STATE, "device", None)
    _clear_local_env(monkeypatch)
    monkeypatch.setenv("OMPI_COMM_WORLD_LOCAL_RANK", "3")
    assert C.select_device(_Comm()) == 1 and fake_cupy.selected_device() == 1
    monkeypatch.setenv("OMPI_COMM_WORLD_LOCAL_RANK", "0")
    assert C.select_device(_Comm()) == 1                          # once per process


def test_choose_transport_rule():
    one_each = [("n1", "0000:01"), ("n1", "0000:02"), ("n2", "0000:01")]
    shared = [("n1", "0000:01"), ("n1", "0000:01")]
    ok3, ok2 = [True] * 3, [True] * 2
    assert C.choose_transport("auto", one_each, ok3)[0] == "nccl"  # same bus id, other host
    assert C.choose_transport("nccl", one_each, ok3)[0] == "nccl"
    assert C.choose_transport("host", one_each, ok3)[0] == "host"
    t, why = C.choose_transport("auto", shared, ok2)
    assert t == "host" and "share a GPU" in why                    # NCCL refuses one device twice
    t, why = C.choose_transport("nccl", shared, ok2)
    assert t == "" and "share a GPU" in why                        # the caller raises
    t, why = C.choose_transport("auto", one_each, [True, False, True])
    assert t == "host" and "not available" in why
    assert C.choose_transport("auto", [("n1", "0")], [True])[0] == "host"
    with pytest.raises(ValueError, match="halo transport must be"):
        C.choose_transport("mpi", one_each, ok3)


class _GPU:
    is_gpu = True
    name = "gpu"


def test_resolve_transport(monkeypatch):
    monkeypatch.delenv("ADAPTMG_HALO_TRANSPORT", raising=False)
    assert C.resolve_transport(_Comm(), None, CPU) == "mpi"         # the CPU backend's exchange
    assert C.resolve_transport(_Comm(), "nccl", None) == "mpi"
    comm = _Comm()
    assert C.resolve_transport(comm, "host", _GPU()) == "host" and comm.calls == []
    assert C.resolve_transport(_Comm(size=1), None, _GPU()) == "host"
    with pytest.raises(ValueError, match="CPU backend"):
        C.resolve_transport(_Comm(), "mpi", _GPU())
    with pytest.raises(ValueError, match="halo transport must be"):
        C.resolve_transport(_Comm(), "ucx", _GPU())
    # two ranks on one GPU (what every rank gathers): host staging; NCCL asked for: refused
    monkeypatch.setattr(C, "_placement", lambda: ("n1", "0000:01"))
    shared = [(("n1", "0000:01"), True)] * 2
    assert C.resolve_transport(_Comm(gathered=shared), "auto", _GPU()) == "host"
    monkeypatch.setenv("ADAPTMG_HALO_TRANSPORT", "nccl")
    with pytest.raises(ValueError, match="'nccl' requested but ranks share a GPU"):
        C.resolve_transport(_Comm(gathered=shared), None, _GPU())
    apart = [(("n1", "0000:01"), True), (("n1", "0000:02"), True)]
    assert C.resolve_transport(_Comm(gathered=apart), None, _GPU()) == "nccl"


def test_resolved_nccl_skips_the_collective(monkeypatch):
    """A communicator that has its NCCL communicator takes "nccl" without an allgather (a
    hierarchy's DistCSRs get its resolved transport); "auto", and "nccl" on another
    communicator, still gather the placements."""
    monkeypatch.delenv("ADAPTMG_HALO_TRANSPORT", raising=False)
    monkeypatch.setattr(C, "_placement", lambda: ("n1", "0000:01"))
    apart = [(("n1", "0000:01"), True), (("n1", "0000:02"), True)]
    comm, other = _Comm(gathered=apart), _Comm(gathered=apart)
    monkeypatch.setitem(N._NCCL, id(comm), (comm, object()))
    assert C.resolve_transport(comm, "nccl", _GPU()) == "nccl" and comm.calls == []
    assert C.resolve_transport(comm, "auto", _GPU()) == "nccl" and comm.calls == ["allgather"]
    assert C.resolve_transport(other, "nccl", _GPU()) == "nccl" and other.calls == ["allgather"]
    monkeypatch.setitem(N._NCCL, id(other), (comm, object()))      # a stale entry: another comm
    other.calls.clear()
    assert C.resolve_transport(other, "nccl", _GPU()) == "nccl" and other.calls == ["allgather"]


def _fake_nccl(init):
    """A stand-in for ``cupy.cuda.nccl``: unique id ``b"id"``, a communicator whose making calls
    ``init(size, uid, rank)``."""
    class Nccl:
        @staticmethod
        def get_unique_id():
            return b"id"

        class NcclCommunicator:
            def __init__(self, size, uid, rank):
                init(size, uid, rank)
    return Nccl


@pytest.mark.parametrize("preset", [None, "16"])
def test_nccl_communicator_limits_the_channels_unless_set(monkeypatch, preset):
    """NCCL_MAX_NCHANNELS is NCCL_CHANNELS when the first communicator is made (NCCL connects
    channels lazily at a cost per channel, nccl.NCCL_CHANNELS), a value in the environment
    is kept; the communicator is made once per communicator."""
    import adaptmg.backend as B
    seen = []
    Nccl = _fake_nccl(lambda size, uid, rank: seen.append((size, uid, rank, N.os.environ.get("NCCL_MAX_NCHANNELS"))))

    class Comm:
        def Get_rank(self):
            return 0

        def Get_size(self):
            return 2

        def bcast(self, obj, root=0):
            return obj

    if preset is None:
        monkeypatch.delenv("NCCL_MAX_NCHANNELS", raising=False)
    else:
        monkeypatch.setenv("NCCL_MAX_NCHANNELS", preset)
    monkeypatch.setattr(B, "nccl_module", lambda: Nccl)
    monkeypatch.setattr(N, "_NCCL", {})
    comm = Comm()
    nc = N.nccl_communicator(comm)
    assert N.nccl_communicator(comm) is nc
    assert seen == [(2, b"id", 0, preset or str(N.NCCL_CHANNELS))] and N.NCCL_CHANNELS == 4


def test_nccl_communicator_made_on_a_thread_is_waited_for(monkeypatch):
    """start_nccl_communicator broadcasts the unique id (the collective part) and returns while
    the communicator is made on a thread; nccl_ready is True at once (resolve_transport skips
    its allgather), the first nccl_communicator waits for the thread and returns its result,
    later ones the same object; a failure there is raised by nccl_communicator."""
    import threading
    import adaptmg.backend as B
    release, calls = threading.Event(), []

    def init(size, uid, rank):
        assert release.wait(10)
        if uid == b"bad":
            raise OSError("no route")
        calls.append((size, uid, rank))
    Nccl = _fake_nccl(init)

    class Comm:
        def __init__(self, uid=b"id"):
            self.uid, self.bcasts = uid, 0

        def Get_rank(self):
            return 1

        def Get_size(self):
            return 2

        def bcast(self, obj, root=0):
            self.bcasts += 1
            return self.uid

    monkeypatch.setattr(B, "nccl_module", lambda: Nccl)
    monkeypatch.setattr(N, "_NCCL", {})
    comm = Comm()
    N.start_nccl_communicator(comm)
    assert N.nccl_ready(comm) and comm.bcasts == 1 and calls == []      # returned before the init
    N.start_nccl_communicator(comm)                                    # once per communicator
    assert comm.bcasts == 1
    release.set()
    nc = N.nccl_communicator(comm)
    assert isinstance(nc, Nccl.NcclCommunicator) and calls == [(2, b"id", 1)]
    assert N.nccl_communicator(comm) is nc and comm.bcasts == 1
    bad = Comm(b"bad")
    N.start_nccl_communicator(bad)
    with pytest.raises(RuntimeError, match="making the communicator failed: no route"):
        N.nccl_communicator(bad)


class OneRank:
    def Get_rank(self):
        return 0

    def Get_size(self):
        return 1

    def Allreduce(self, *a):                     # pragma: no cover
        raise AssertionError("no collective on one rank")


def test_solve_rejects_an_unknown_transport():
    m = Mesh.box([0, 0], [1, 1], [4, 4]).refine()
    space = Space(m, 1)
    b = assemble.load(space, 1.0)
    with pytest.raises(ValueError, match="transport must be None, 'auto', 'host' or 'nccl'"):
        solve(space, assemble.stiffness, b, comm=OneRank(), transport="ucx")
    res = solve(space, assemble.stiffness, b, comm=OneRank(), transport="host")   # CPU: ignored
    assert res.info == 0 and isinstance(res.u, np.ndarray)


def test_nccl_type_and_reduction_choice():
    """NCCL data types (complex as twice as many entries of the real type; no NCCL type is a
    TypeError), and allreduce_sum's choice by transport: the device reduction for "nccl", an
    unknown transport a ValueError naming it."""
    nccl = fake_cupy.nccl
    assert N.nccl_type(nccl, np.float64) == (nccl.NCCL_FLOAT64, 1)
    assert N.nccl_type(nccl, np.float32) == (nccl.NCCL_FLOAT32, 1)
    assert N.nccl_type(nccl, np.complex128) == (nccl.NCCL_FLOAT64, 2)
    assert N.nccl_type(nccl, np.complex64) == (nccl.NCCL_FLOAT32, 2)
    with pytest.raises(TypeError, match="no NCCL type for dtype float16"):
        N.nccl_type(nccl, np.float16)
    with pytest.raises(ValueError, match="'gloo'"):
        C.allreduce_sum(_Comm(), "gloo")
    assert callable(C.allreduce_sum(_Comm(), "host")) and callable(C.allreduce_sum(_Comm()))
