"""adaptmg.device.deferred: validity checks read at the end of a block.

On the host: a check outside a block is read at once; inside, the block's code after it runs
and the first true check raises at the block's end; a block left by an exception drops its
checks; blocks nest.  Both assembly sweeps that check det J (the Q1 stiffness kernel's and the
general device path's) defer their check inside a block, on the host twins here.  On the GPU:
the device mesh's assembly reads nothing back inside a block (one read, the det J flag, fewer
than outside) and an inverted cell is still a ValueError, at the block's end.
"""
import numpy as np
import pytest

from adaptmg import Mesh, Space, assemble
from adaptmg.assemble import forms, on_device, q1_stiffness
from adaptmg.backend import CPU, get_backend, to_host
from adaptmg.device.deferred import check_later, deferred_checks


def _err(msg):
    return lambda: ValueError(msg)


def test_outside_a_block_a_check_is_read_at_once():
    check_later(np.False_, _err("no"))
    with pytest.raises(ValueError, match="at once"):
        check_later(np.True_, _err("at once"))


def test_inside_a_block_the_first_true_check_raises_at_its_end():
    ran = []
    with pytest.raises(ValueError, match="first"):
        with deferred_checks():
            check_later(False, _err("never"))
            check_later(True, _err("first"))
            check_later(True, _err("second"))
            ran.append("after the checks")
    assert ran == ["after the checks"]
    with deferred_checks():                      # nothing true: nothing raised
        check_later(np.zeros(3).any(), _err("never"))


def test_an_exception_in_the_block_wins_and_its_checks_are_dropped():
    with pytest.raises(KeyError):
        with deferred_checks():
            check_later(True, _err("dropped"))
            raise KeyError("first")
    check_later(False, _err("never"))            # and no block is left open


def test_blocks_nest_each_reading_its_own():
    seen = []
    with deferred_checks():
        with pytest.raises(ValueError, match="inner"):
            with deferred_checks():
                check_later(True, _err("inner"))
                seen.append("inner body")
        seen.append("outer body")
    assert seen == ["inner body", "outer body"]


def _inverted_inputs():
    m = Mesh.box([0.0, 0.0], [1.0, 1.0], [3, 2])
    info = forms._SpaceInfo(Space(m, 1))
    xi, w = info.quadrature(None)
    T = forms._stiffness_tensor(forms._ref_tables(info, xi)[1])
    cells = np.array(info.cells)
    cells[0] = cells[0].reshape(-1, 2)[:, ::-1].reshape(-1)     # cell 0 inside out
    info.cells = cells
    return info, xi, w, np.ascontiguousarray(T.reshape(-1, T.shape[-1]))


def test_the_stiffness_kernel_sweep_defers_its_det_j_check():
    info, xi, w, T = _inverted_inputs()
    swept = []
    with pytest.raises(ValueError, match="non-positive Jacobian"):
        with deferred_checks():
            swept.append(len(list(q1_stiffness.stiffness_chunks(CPU, info, xi, w, T, 2))))
    assert swept == [3]                                  # the whole sweep ran, then the check
    with pytest.raises(ValueError, match="non-positive Jacobian"):
        list(q1_stiffness.stiffness_chunks(CPU, info, xi, w, T, 2))


def test_the_general_device_sweep_defers_its_det_j_check():
    info, xi, _, _ = _inverted_inputs()
    swept = []
    with pytest.raises(ValueError, match="non-positive Jacobian"):
        with deferred_checks():
            swept.append(len(list(on_device._chunks(CPU, info, xi, step=2))))
    assert swept == [3]
    with pytest.raises(ValueError, match="non-positive Jacobian"):
        list(on_device._chunks(CPU, info, xi, step=2))


@pytest.mark.gpu
def test_a_device_assembly_reads_nothing_back_inside_a_block():
    try:
        be = get_backend("gpu")
    except Exception as e:                       # noqa: BLE001 - no CuPy or no device
        pytest.skip(f"needs CuPy and a visible CUDA device ({e})")
    from adaptmg.device.host_reads import available, count_host_reads
    if not available():
        pytest.skip("needs sys.monitoring (Python 3.12+)")
    space = Space(Mesh.box([0.0] * 3, [1.0] * 3, [6, 5, 4]).to("gpu"), 1)
    ref = assemble.stiffness(space, 2.0)                 # the memoised pattern made
    with count_host_reads(be.xp) as plain:
        assemble.stiffness(space, 2.0)
    with count_host_reads(be.xp) as inside:
        with deferred_checks():
            A = assemble.stiffness(space, 2.0)
            reads_in_block = inside.calls
    assert reads_in_block == plain.calls - 1, (plain.report(), inside.report())
    assert abs(to_host(A) - to_host(ref)).max() == 0.0   # the same kernels, the same sums
    info, xi, w, T = _inverted_inputs()
    info.cells = be.xp.asarray(info.cells)
    info.points = be.xp.asarray(info.points)
    with pytest.raises(ValueError, match="non-positive Jacobian"):
        with deferred_checks():
            list(q1_stiffness.stiffness_chunks(be, info, xi, w, T, 2))
