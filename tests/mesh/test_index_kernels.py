"""The fused index kernels of ``adaptmg/device/index_kernels.py``: the NumPy twin against the
formula evaluated node by node (CPU), and the CuPy kernel against the twin (GPU, exact
integers)."""
import importlib.util
import pathlib

import numpy as np
import pytest

import adaptmg
from adaptmg.device import index_kernels
from adaptmg.mesh import _touch


def _mesh(dim, backend="cpu"):
    m = adaptmg.Mesh.box([0.0] * dim, [1.0] * dim, [2] * dim, backend=backend)
    for _ in range(3 if dim == 2 else 2):
        c = m.points[m.cells].mean(axis=1)
        m = m.refine(m.backend.xp.linalg.norm(c, axis=1) < 0.45)
    return m


def _inputs(m):
    """(seen, kind, par, jump, dim) as ``hanging_in_forest`` hands them to the kernel."""
    F, cells, levels = m._forest, m._active_cell_nodes(), m.levels
    xp = F.backend.xp
    jump, rows = _touch.level_jumps(cells, F.num_nodes, levels.astype(F.cell_level.dtype))
    sub = cells if rows is None else xp.take(cells, rows, axis=0)
    seen = xp.zeros(F.num_nodes, dtype=bool)
    seen[sub] = True
    return seen, F.node_kind, F.node_par, jump, F.dim


@pytest.mark.parametrize("dim", [2, 3])
def test_hanging_candidates_twin_is_the_formula(dim):
    seen, kind, par, jump, d = _inputs(_mesh(dim))
    got = index_kernels.hanging_candidates(seen, kind, par, jump, d)
    want = [i for i in range(seen.size)
            if seen[i] and 1 <= kind[i] < d and all(p < 0 or jump[p] for p in par[i, :4])]
    assert len(want) > 10                                   # the mesh has candidates to find
    np.testing.assert_array_equal(got, want)
    # every candidate of a 2:1 mesh's hanging nodes is among them
    assert np.isin(m_hanging_forest(dim), got).all()


def m_hanging_forest(dim):
    return _mesh(dim)._hanging_forest[0]


def test_census_runs_each_fused_kernel_once_per_call(monkeypatch):
    """The census's stand-in runs the device path (kernel, then flatnonzero) with the same
    integers as the twin, so its operation counts are those of the device."""
    root = pathlib.Path(__file__).resolve().parents[2]
    spec = importlib.util.spec_from_file_location("census_device_ops", root / "scripts" / "census_device_ops.py")
    census = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(census)
    monkeypatch.setattr(census, "RECORDS", type(census.RECORDS)())
    host = _inputs(_mesh(2))
    want = index_kernels.hanging_candidates(*host)
    census.install(monkeypatch)
    dev = [census.xp.asarray(a) if isinstance(a, np.ndarray) else a for a in host]
    census.RECORDS.clear()
    got = index_kernels.hanging_candidates(*dev)
    np.testing.assert_array_equal(np.asarray(got.view(np.ndarray)), want)
    names = sorted(k[3] for k, n in census.RECORDS.items() for _ in range(n))
    assert names == ["flatnonzero", "kernel:hanging_candidates"]


@pytest.mark.gpu
@pytest.mark.parametrize("dim", [2, 3])
def test_hanging_candidates_kernel_equals_twin(dim):
    from adaptmg.backend import to_host
    dev = _inputs(_mesh(dim, backend="gpu"))
    host = [to_host(a) if not isinstance(a, int) else a for a in dev]
    got = index_kernels.hanging_candidates(*dev)
    assert not isinstance(got, np.ndarray)                  # the kernel ran
    want = index_kernels.hanging_candidates(*host)
    assert want.size > 10
    np.testing.assert_array_equal(to_host(got), want)
    m = _mesh(dim, backend="gpu")
    np.testing.assert_array_equal(to_host(m.hanging_nodes), _mesh(dim).hanging_nodes)
