"""Smoke tests of scripts/bench_elasticity_gs.py on the CPU: the static part's rows (block Jacobi,
block GS, GS on the finest one / two levels with block Jacobi below: GS levels, colour launches,
contraction in that order, the ratios to block Jacobi) with the set-up split
(``setup_timeline``; on the CPU the two ``--form`` choices run the same host path: multigrid
passes ``device`` only on the GPU), and the sweep part's table (block Jacobi against
block GS per layout: GS does more work per smoothing than block Jacobi, the layout /
threads-per-row choices are restored afterwards, bad choices are refused)."""
import pytest
from script_loader import load_script

from adaptmg.device import gs_kernels


def test_bench_elasticity_gs_static_prints_its_split(capsys):
    out = load_script("bench_elasticity_gs").main(["--backend", "cpu", "--size", "2", "--parts", "static",
                                                   "--repeat", "1", "--cycles", "3"])
    text = capsys.readouterr().out
    assert "set-up split" in text and "constrain_fine_s" in text
    rows = out["static"]
    assert [r["smoother"] for r in rows] == ["block_jacobi", "block_gauss_seidel", "gs_fine_bj_coarse",
                                             "gs_fine2_bj_coarse", "gsfb_fine_bj_coarse"]
    assert "vcycle_ms_vs_bj" in text and "it_ms_vs_bj" in text
    bj, gs, mixed, mixed2, fb = rows
    # forward sweeps before the coarse correction, backward after: half the colour launches of
    # the symmetric sweeps, a contraction between block Jacobi's and symmetric GS's
    assert fb["gs_levels"] == 1 and 0 < fb["colour_launches"] < mixed["colour_launches"]
    assert bj["factor"] > fb["factor"] >= mixed["factor"]
    assert bj["vcycle_ms_vs_bj"] == bj["it_ms_vs_bj"] == 1.0 and bj["gs_levels"] == bj["colour_launches"] == 0
    # GS on every smoothed level (3 levels, direct coarse solve), on the finest only, on the
    # two finest: fewer colour launches
    assert gs["levels"] == 3 and gs["gs_levels"] == 2 and (mixed["gs_levels"], mixed2["gs_levels"]) == (1, 2)
    assert 0 < mixed["colour_launches"] < mixed2["colour_launches"] <= gs["colour_launches"]
    assert mixed["colors"] == gs["colors"] >= 8 and bj["factor"] > mixed["factor"] >= gs["factor"]
    for r in rows:
        assert r["vcycle_ms"] > 0 and r["it_ms"] == pytest.approx(1e3 * r["solve_s"] / r["cg_iters"])
        assert r["cg_iters"] <= 30 and r["rel_residual"] <= 1e-7
        # the finest level's tasks are part of their kinds' sums, which run inside the set-up
        assert 0 < r["assemble_fine_s"] <= r["assemble_s"] and 0 < r["constrain_fine_s"] <= r["constrain_s"]
        assert r["solver_s"] < r["setup_s"]


def test_bench_elasticity_gs_sweep_part_prints_its_table(capsys):
    out = load_script("bench_elasticity_gs").main(["--backend", "cpu", "--size", "1", "--parts", "sweep",
                                                   "--repeat", "1", "--gs-layout", "csr,bsr", "--gs-tpr", "auto,8"])
    text = capsys.readouterr().out
    rows = out["sweep"]
    assert "smooth2_ms" in text and "block_gauss_seidel[bsr]" in text
    assert [r["smoother"] for r in rows] == ["block_jacobi"] + ["block_gauss_seidel[csr]"] * 2 \
        + ["block_gauss_seidel[bsr]"] * 2
    assert all(r["colors"] >= 8 and r["vs_bj"] > 1 for r in rows[1:])
    assert gs_kernels.BLOCK_LAYOUT == "auto" and gs_kernels.THREADS_PER_ROW is None   # restored


@pytest.mark.parametrize("bad", [["--gs-layout", "ell"], ["--gs-tpr", "3"], ["--parts", "sweeps"],
                                 ["--smoothers", "block_jacobi,gs_everywhere"]])
def test_bench_elasticity_gs_refuses_bad_choices(bad):
    with pytest.raises(SystemExit):
        load_script("bench_elasticity_gs").main(["--backend", "cpu"] + bad)


def test_bench_elasticity_gs_split_layout_row():
    """--gs-layout bsr,split: a row per layout of the finest level's block GS; the split plan
    reads ~40 % fewer passes over A per V-cycle (fine_passes: smoothing and the residual) with
    the same contraction and CG iterations (the same smoother up to round-off)."""
    out = load_script("bench_elasticity_gs").main(["--backend", "cpu", "--size", "2", "--parts", "static",
                                                   "--repeat", "1", "--cycles", "3", "--smoothers",
                                                   "gs_fine_bj_coarse", "--gs-layout", "bsr,split"])
    full, split = out["static"]
    assert (full["smoother"], split["smoother"]) == ("gs_fine_bj_coarse[bsr]", "gs_fine_bj_coarse[split]")
    assert split["colour_launches"] == full["colour_launches"] and split["cg_iters"] == full["cg_iters"]
    assert split["factor"] == pytest.approx(full["factor"], rel=1e-9)
    # full rows: 2 (4K - 3) / K passes (K colours) and the residual's; split: about 4.7 + 0.56
    K = full["colors"]
    assert full["fine_passes"] == pytest.approx(2 * (4 * K - 3) / K + 1, rel=0.1)
    assert 4.5 < split["fine_passes"] < 0.65 * full["fine_passes"]
    assert gs_kernels.BLOCK_LAYOUT == "auto"
