"""adaptmg.device.priority: a block of work on the high-priority stream beside the current
stream's queued work (GPU only): the block runs there after the mark, the previous stream is
current again afterwards (also after an exception) and sees the block's results."""
import numpy as np
import pytest

from adaptmg.backend import get_backend

pytestmark = pytest.mark.gpu


def _cupy():
    try:
        be = get_backend("gpu")
    except Exception as e:                       # noqa: BLE001 - no CuPy or no device
        pytest.skip(f"needs CuPy and a visible CUDA device ({e})")
    return be.xp


def test_block_runs_on_the_priority_stream_and_the_current_stream_waits_for_it():
    cp = _cupy()
    from adaptmg.device.priority import PriorityStream, priority_stream
    ps = PriorityStream(cp)
    before = cp.cuda.get_current_stream()
    x = cp.arange(1 << 22, dtype=np.float64)
    for _ in range(20):                          # queued work before the mark
        x = x + 1.0
    mark = ps.mark()
    with ps.after(mark) as hi:
        assert hi is priority_stream(cp) and cp.cuda.get_current_stream() == hi
        y = 2.0 * x                              # reads what was made before the mark
    assert cp.cuda.get_current_stream() == before and ps.switches == 1
    z = y + 1.0                                  # the current stream waited for the block
    assert np.array_equal(z.get(), 2.0 * (np.arange(1 << 22) + 20.0) + 1.0)
    assert priority_stream(cp) is hi             # one per device, kept


def test_the_previous_stream_is_current_again_after_an_exception():
    cp = _cupy()
    from adaptmg.device.priority import PriorityStream
    ps = PriorityStream(cp)
    before = cp.cuda.get_current_stream()
    with pytest.raises(RuntimeError, match="inside"):
        with ps.after(ps.mark()):
            raise RuntimeError("inside")
    assert cp.cuda.get_current_stream() == before and ps.switches == 1
