"""Adaptive loops on the L-shape (rates, efficiency, DWR, multigrid robustness), the other
problems and the driver script.  CPU budget of this file: about 40 s on 2 cores."""
import os
import runpy

import numpy as np
import pytest

from adaptmg.estimate import fitted_slope
from adaptmg_problems import elasticity_corner, fichera, interior_layer, lshape

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def adaptive():
    return lshape.run(steps=14, quiet=True)["history"]          # up to ~12k DoFs


@pytest.fixture(scope="module")
def uniform():
    return lshape.run(steps=4, quiet=True, strategy="uniform")["history"]   # up to 3.2k DoFs


def later(hist, min_dofs):
    h = [r for r in hist if r["dofs"] >= min_dofs]
    return [r["dofs"] for r in h], [r["err_H1"] for r in h]


def test_lshape_adaptive_rate_is_optimal(adaptive):
    """|u - u_h|_1 ~ N^(-1/2) for adaptive Q1 (fitted over the steps with >= 600 DoFs)."""
    N, e = later(adaptive, 600)
    assert len(N) >= 5
    assert abs(fitted_slope(N, e) - (-0.5)) < 0.1
    # the estimate decays at the same rate
    est = [r["estimate"] for r in adaptive if r["dofs"] >= 600]
    assert abs(fitted_slope(N, est) - (-0.5)) < 0.1


def test_lshape_uniform_rate_is_one_third(uniform):
    """Uniform refinement is limited by the r^(2/3) singularity: N^(-1/3)."""
    N, e = later(uniform, 200)
    assert len(N) >= 3
    assert abs(fitted_slope(N, e) - (-1.0 / 3.0)) < 0.1


def test_adaptive_beats_uniform(adaptive, uniform):
    """At comparable DoFs the adaptive error is clearly smaller."""
    Nu, eu = uniform[-1]["dofs"], uniform[-1]["err_H1"]
    ea = np.interp(np.log(Nu), np.log([r["dofs"] for r in adaptive]), [r["err_H1"] for r in adaptive])
    assert ea < 0.5 * eu


def test_residual_estimator_efficiency_band(adaptive):
    """eta / |u - u_h|_1 stays in a constant band over all adaptive steps: all values in
    [1.5, 5] and within a factor 2 of each other (measured: 2.29 .. 3.34, levelling off at
    ~3.35 over the last steps, i.e. max/min = 1.46)."""
    eff = np.array([r["estimate"] / r["err_H1"] for r in adaptive])
    assert eff.min() > 1.5 and eff.max() < 5.0
    assert eff.max() / eff.min() < 2.0
    assert abs(eff[-1] / eff[-3] - 1) < 0.05          # levelled off


def test_multigrid_iterations_bounded(adaptive):
    """CG + V(2,2)-Jacobi iterations to rtol 1e-9 do not grow with the number of levels
    (1 -> 15) or of hanging nodes (0 -> ~760)."""
    it = np.array([r["iterations"] for r in adaptive])
    lev = np.array([r["levels"] for r in adaptive])
    hang = np.array([r["hanging"] for r in adaptive])
    assert lev[-1] >= 12 and hang[-1] >= 500
    multi = it[lev >= 2]
    assert multi.max() <= 10
    assert multi[-1] <= multi[0] + 3
    half = multi[len(multi) // 2:]                     # second half of the steps: flat
    assert half.max() - half.min() <= 2


def test_dwr_tracks_goal_error():
    """DWR (Q2 dual, Dirichlet-data term included) against the true error of the mollified
    point value: effectivity (J(u) - J(u_h)) / estimate within [0.75, 1.35] at every step and
    within 5 % at the last 3 steps; the goal error decays at least like N^(-0.8)."""
    h = lshape.run(steps=12, estimator="dwr", quiet=True)["history"]
    eff = np.array([r["goal_error"] / r["estimate"] for r in h])
    assert (eff > 0.75).all() and (eff < 1.35).all(), eff
    assert np.abs(eff[-3:] - 1).max() < 0.05, eff
    N = [r["dofs"] for r in h[len(h) // 2:]]
    assert fitted_slope(N, [abs(r["goal_error"]) for r in h[len(h) // 2:]]) < -0.8
    assert max(r["dual_iterations"] for r in h) <= 15


def test_interior_layer_adaptive():
    """Transport-diffusion (eps = 0.01, Galerkin Q1): GMRES + multigrid stays under 20
    iterations, the estimator follows the energy error within a constant band, and the
    error decays."""
    h = interior_layer.run(steps=6, quiet=True)["history"]
    it = [r["iterations"] for r in h]
    assert max(it) <= 20
    eff = np.array([r["estimate"] / r["err_energy"] for r in h])
    assert eff.max() / eff.min() < 2.0
    assert h[-1]["err_energy"] < 0.5 * h[0]["err_energy"]


def test_elasticity_corner_adaptive():
    """Vector Q1 + block-Jacobi multigrid: bounded CG iterations, estimate decays at the
    optimal rate N^(-1/2) (singular corner), compliance increases monotonically."""
    h = elasticity_corner.run(steps=8, quiet=True)["history"]
    it = [r["iterations"] for r in h[1:]]
    assert max(it) <= 20 and it[-1] <= it[0] + 5
    N = [r["dofs"] for r in h[3:]]
    assert abs(fitted_slope(N, [r["estimate"] for r in h[3:]]) + 0.5) < 0.12
    comp = np.array([r["compliance"] for r in h])
    assert (np.diff(comp) > 0).all()


def test_fichera_3d_adaptive():
    """3-D: J(u_h) = int u_h = ||grad u_h||^2 increases, the estimate decreases, iterations
    bounded, and the efficiency against the true energy error is steady."""
    h = fichera.run(steps=5, quiet=True)["history"]
    J = np.array([r["J"] for r in h])
    assert (np.diff(J[1:]) > 0).all()
    est = np.array([r["estimate"] for r in h])
    assert (np.diff(est) < 0).all()
    assert max(r["iterations"] for r in h) <= 12
    assert h[-1]["hanging"] > 0
    # energy error from the extrapolated reference J(u) (its uncertainty 2e-4 in J is < 1 %
    # of J(u) - J(u_h) here): the 3-D efficiency index is larger than in 2-D but steady
    err = np.array([r["err_energy"] for r in h])
    assert (fichera.J_REF - J[-1]) > 20 * fichera.J_REF_UNCERTAINTY
    eff = est[2:] / err[2:]
    assert (eff > 3).all() and (eff < 12).all() and eff.max() / eff.min() < 1.5, eff


def test_script_writes_vtu_csv_and_plot(tmp_path, capsys):
    out = tmp_path / "run"
    mod = runpy.run_path(os.path.join(ROOT, "scripts", "adaptive.py"), run_name="adaptive_test")
    res = mod["main"](["--problem", "lshape", "--steps", "3", "--out", str(out), "--repeat", "2"])
    text = capsys.readouterr().out
    assert "fitted slope" in text and "mg it" in text and "warm-up run 1 of 1" in text
    assert text.count("per-step breakdown") == 1
    files = sorted(os.listdir(out))
    assert [f for f in files if f.endswith(".vtu")] == [f"lshape_{i:03d}.vtu" for i in range(4)]
    assert "history.csv" in files
    pytest.importorskip("matplotlib")
    assert "convergence.png" in files
    import meshio
    m = meshio.read(out / "lshape_003.vtu")
    assert m.cells[0].data.shape[0] == res["history"][-1]["cells"]
    assert set(m.point_data) >= {"u", "exact", "error"} and set(m.cell_data) >= {"eta", "level"}
    assert b'<AppendedData encoding="raw">' in (out / "lshape_003.vtu").read_bytes()    # the raw writer


def test_script_cold_runs_itself_with_empty_kernel_caches(monkeypatch):
    """``--cold``: the same command without it, in a child process whose CuPy and adaptmg
    kernel caches are empty folders; a failing child is the script's exit status."""
    import subprocess
    mod = runpy.run_path(os.path.join(ROOT, "scripts", "adaptive.py"), run_name="adaptive_test")
    seen = {}

    def fake_run(cmd, env):
        seen["cmd"], seen["env"] = cmd, env
        seen["empty"] = [not os.path.exists(env[k]) or not os.listdir(env[k])
                         for k in ("CUPY_CACHE_DIR", "ADAPTMG_KERNEL_CACHE")]
        return subprocess.CompletedProcess(cmd, seen.get("rc", 0))
    monkeypatch.setattr(subprocess, "run", fake_run)
    assert mod["main"](["--problem", "lshape", "--steps", "1", "--cold", "--repeat", "3"]) is None
    assert seen["cmd"][1].endswith("adaptive.py") and "--cold" not in seen["cmd"]
    assert seen["cmd"][2:] == ["--problem", "lshape", "--steps", "1", "--repeat", "3"]
    assert seen["empty"] == [True, True]
    assert seen["env"]["CUPY_CACHE_DIR"] != os.environ.get("CUPY_CACHE_DIR")
    seen["rc"] = 3
    with pytest.raises(SystemExit) as exc:
        mod["main"](["--problem", "lshape", "--steps", "1", "--cold"])
    assert exc.value.code == 3


def test_output_is_written_in_the_background_for_the_steps_asked(tmp_path):
    """write_every=2: steps 0, 2, 4 and the last one; each file holds that step's solution."""
    from adaptmg.estimate import adaptive_loop
    res = adaptive_loop(lshape.problem(), steps=5, quiet=True, out=str(tmp_path), write_every=2)
    names = sorted(os.listdir(tmp_path))
    assert names == [f"lshape_{k:03d}.vtu" for k in (0, 2, 4, 5)]
    import meshio
    u = np.asarray(meshio.read(str(tmp_path / "lshape_005.vtu")).point_data["u"]).ravel()
    assert u.size == res["u"].size and np.allclose(np.sort(u), np.sort(res["u"]))
    with pytest.raises(ValueError, match="write_every"):
        adaptive_loop(lshape.problem(), steps=1, quiet=True, out=str(tmp_path), write_every=0)


def test_a_failing_write_is_reported(tmp_path, monkeypatch):
    from adaptmg.estimate import adaptive as ad
    def boom(*a, **k):
        raise OSError("disk full")
    monkeypatch.setattr(ad, "write_vtu", boom)
    with pytest.raises(OSError, match="disk full"):
        ad.adaptive_loop(lshape.problem(), steps=1, quiet=True, out=str(tmp_path))
