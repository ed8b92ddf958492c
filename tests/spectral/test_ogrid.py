"""The O-grid of a cylinder (seed 004 Table 1's mesh with vertices of valence 6): built by
refinement, its Q1 coarse scale and h-independent two-scale / p-multigrid iterations."""
import warnings

import numpy as np
import pytest

from adaptmg.spectral import poisson
from adaptmg.spectral.meshes import ogrid_cylinder, ogrid_map
from adaptmg.spectral.schwarz import q1_multigrid


def _sorted_rows(a):
    a = np.round(np.asarray(a, dtype=float), 10)
    return a[np.lexsort(a.T[::-1])]


@pytest.mark.parametrize("n,nz,levels", [(16, 16, 2), (8, 6, 1), (12, 4, 0)])
def test_refined_ogrid_equals_direct_construction(n, nz, levels):
    fine = ogrid_cylinder(n, nz, height=1.5)
    direct = ogrid_cylinder(n, nz, height=1.5, levels=0)
    assert len(fine.hierarchy()) == levels + 1
    assert fine.num_cells == direct.num_cells == 3 * n * n * nz // 4
    assert np.array_equal(_sorted_rows(fine.points), _sorted_rows(direct.points))
    cf = fine.points[fine.cells].mean(axis=1)
    cd = direct.points[direct.cells].mean(axis=1)
    assert np.array_equal(_sorted_rows(cf), _sorted_rows(cd))
    # the boundary: every node on the circle r = 1 or on the core's ring inside it
    r = np.hypot(fine.points[:, 0], fine.points[:, 1])
    assert r.max() <= 1 + 1e-12
    assert np.count_nonzero(np.abs(r - 1) < 1e-12) == 2 * n * (nz + 1)
    # valence 6: the 4 z-lines through the core's corners have 3 cells around them a layer
    counts = np.bincount(fine.cells.ravel(), minlength=fine.num_nodes)
    inner = (r < 0.99) & (fine.points[:, 2] > 1e-9) & (fine.points[:, 2] < 1.5 - 1e-9)
    assert np.count_nonzero(counts[inner] == 6) == 4 * (nz - 1)


def test_ogrid_map_keeps_core_and_maps_square_to_circle():
    x = np.array([[0.1, -0.2, 0.3], [1.0, 0.0, 0.0], [1.0, 1.0, 2.0], [-1.0, 0.5, 0.0], [0.3, -1.0, 0.0]])
    y = ogrid_map(x)
    assert np.array_equal(y[0], x[0])                                  # inside the core
    np.testing.assert_allclose(np.hypot(y[1:, 0], y[1:, 1]), 1.0, rtol=0, atol=4 * np.finfo(float).eps)
    np.testing.assert_allclose(np.arctan2(y[1:, 1], y[1:, 0]),
                               [0.0, np.pi / 4, np.pi - np.pi / 8, -np.pi / 2 + np.pi * 0.3 / 4],
                               rtol=0, atol=8 * np.finfo(float).eps)
    assert np.array_equal(y[:, 2], x[:, 2])


def test_ogrid_bad_input():
    with pytest.raises(ValueError, match="multiple of 4"):
        ogrid_cylinder(6)
    with pytest.raises(ValueError, match="nz"):
        ogrid_cylinder(8, 0)
    with pytest.raises(ValueError, match="levels"):
        ogrid_cylinder(8, 3, levels=1)
    with pytest.raises(ValueError, match="core"):
        ogrid_cylinder(8, core=1.2)


def test_q1_coarse_scale_contracts_on_ogrid():
    # O-grid cells have aspect ratio ~2 (z vs the plane): damped Jacobi V(2,2) contracted by
    # 0.63 (algebraic levels of the unrefined O-grid) / 0.49 (geometric ones), Chebyshev 0.11
    ml, fixed = q1_multigrid(ogrid_cylinder(16), "all", backend="cpu")
    assert len(ml.levels) == 3 and all(l.meta.get("kind") == "geometric" for l in ml.levels)
    b = np.random.default_rng(0).standard_normal(ml.levels[-1].n)
    b[fixed] = 0.0
    res = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ml.solve(b, rtol=1e-8, maxiter=12, residuals=res)
    factor = (res[-1] / res[0]) ** (1.0 / (len(res) - 1))
    assert factor < 0.2, (factor, res)


def test_ogrid_two_scale_and_pmg_h_independent():
    # degree 2, 8 -> 16: measured two-scale 18 19, p-multigrid 10 11; with the Jacobi-smoothed
    # algebraic Q1 levels of the unrefined O-grid 18 23 and 10 16
    f = lambda x: 1.0 + x[..., 0] * np.exp(x[..., 1])
    its = {pc: [poisson(ogrid_cylinder(n), 2, f, preconditioner=pc, backend="cpu").iterations for n in (8, 16)]
           for pc in ("two-scale", "pmg")}
    ts, pm = its["two-scale"], its["pmg"]
    assert ts[1] <= 20 and ts[1] - ts[0] <= 2, its
    assert pm[1] <= 12 and pm[1] - pm[0] <= 2, its
