"""On the GPU (issue 36): a mesh moved with ``to("gpu")`` numbers its nodes, finds its hanging
nodes and its boundary data on CuPy arrays, with the host mesh's integers exactly (points:
a gather, exact; volumes to a few ulps).  The same code runs on the host under a strict
stand-in for CuPy in ``test_mesh_device_paths.py``; this file is for the real device
(``pytest -m gpu tests/mesh/test_device_numbering.py``)."""
import numpy as np
import pytest

from adaptmg.backend import is_device_array, is_device_sparse
from device_meshes import MESHES
from test_mesh import random_mesh

pytestmark = pytest.mark.gpu


def _same(dev, host):
    assert is_device_array(dev), type(dev)
    d = dev.get()
    assert d.shape == host.shape and np.array_equal(d, host)


@pytest.mark.parametrize("name", sorted(MESHES))
def test_device_mesh_numbering_hanging_boundary_equal_the_host(name):
    host = MESHES[name]()
    for m in host.hierarchy():
        g = m.to("gpu")
        assert g.backend.is_gpu and g.num_nodes == m.num_nodes
        assert g.num_hanging_nodes == m.num_hanging_nodes
        for dev, want in [(g.node_ids, m.node_ids), (g.cells, m.cells), (g.points, m.points),
                          (g.hanging_nodes, m.hanging_nodes), (g.hanging_parents, m.hanging_parents),
                          (g.hanging_weights, m.hanging_weights), (g.hanging_owner, m.hanging_owner),
                          (g._hanging[3][0], m._hanging[3][0]), (g._hanging[3][1], m._hanging[3][1]),
                          (g.is_hanging, m.is_hanging), (g.region_cells([0, 2]), m.region_cells([0, 2]))]:
            _same(dev, want)
        for ids in (None, 0, [1, 2]):
            for dev, want in zip(g.boundary_faces(ids), m.boundary_faces(ids)):
                _same(dev, want)
            _same(g.boundary_nodes(ids), m.boundary_nodes(ids))
        _same(g.boundary_nodes(where=lambda x: x[:, 0] < 0.5), m.boundary_nodes(where=lambda x: x[:, 0] < 0.5))
        N = g.incidence
        assert is_device_sparse(N) and abs(N.get() - m.incidence).max() == 0
        assert abs(g.touch_graph.get() - m.touch_graph).max() == 0
        vd, vh = g.volumes().get(), m.volumes()
        assert np.abs(vd - vh).max() <= 8 * np.finfo(float).eps * vh.max()


def test_device_numbering_of_a_larger_adaptive_mesh():
    """A mesh large enough that the scatter_min of the first occurrences runs over many blocks."""
    m = random_mesh(3, 2, 3, n0=6, frac=0.15)
    g = m.to("gpu")
    _same(g.cells, m.cells)
    _same(g.node_ids, m.node_ids)
    _same(g.hanging_parents, m.hanging_parents)
    _same(g.hanging_owner, m.hanging_owner)
