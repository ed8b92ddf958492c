"""A mesh lives on a backend: its forest's tables move with ``Mesh.to``."""
import numpy as np
import pytest

from adaptmg import Mesh
from adaptmg.mesh._tree import ARRAYS


def _tables(m):
    from adaptmg.backend import to_host
    F = m._forest
    return {f: to_host(getattr(F, f)) for f in ARRAYS if getattr(F, f) is not None}


def test_host_mesh_is_on_the_cpu_and_to_cpu_is_itself():
    m = Mesh.box([0, 0], [1, 1], [2, 3]).refine([0, 4])
    assert m.backend.name == "cpu"
    assert m.to("cpu") is m
    with pytest.raises(ValueError, match="backend"):
        m.to("tpu")


@pytest.mark.gpu
def test_to_gpu_and_back_keeps_every_table():
    m = Mesh.box([0, 0, 0], [1, 1, 1], [2, 2, 2]).refine([0, 3]).refine([1])
    g = m.to("gpu")
    assert g.backend.is_gpu and g.num_cells == m.num_cells
    assert type(g._active).__module__.startswith("cupy")
    h = g.to("cpu")
    assert h.backend.name == "cpu"
    want, got = _tables(m), _tables(h)
    assert want.keys() == got.keys()
    for f in want:
        assert want[f].dtype == got[f].dtype and np.array_equal(want[f], got[f]), f
    assert np.array_equal(h.cells, m.cells)
    assert Mesh.box([0, 0], [1, 1], [3, 2], backend="gpu").backend.is_gpu
