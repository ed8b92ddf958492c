"""Smoke tests of scripts/bench_elasticity_gs.py on the CPU: the static part's rows with the
set-up split (``setup_timeline``; on the CPU the two ``--form`` choices run the same host path:
multigrid passes ``device`` only on the GPU), and the sweep part's table (block Jacobi against
block GS per layout: GS does more work per smoothing than block Jacobi, the layout /
threads-per-row choices are restored afterwards, bad choices are refused)."""
import pytest
from script_loader import load_script

from adaptmg.device import gs_kernels


def test_bench_elasticity_gs_static_prints_its_split(capsys):
    out = load_script("bench_elasticity_gs").main(["--backend", "cpu", "--size", "1", "--parts", "static",
                                                   "--repeat", "1", "--cycles", "3"])
    text = capsys.readouterr().out
    assert "set-up split" in text and "constrain_fine_s" in text
    rows = out["static"]
    assert [r["smoother"] for r in rows] == ["block_jacobi", "block_gauss_seidel"]
    for r in rows:
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
    assert gs_kernels.BLOCK_LAYOUT == "bsr" and gs_kernels.THREADS_PER_ROW is None   # restored


@pytest.mark.parametrize("bad", [["--gs-layout", "ell"], ["--gs-tpr", "3"], ["--parts", "sweeps"]])
def test_bench_elasticity_gs_refuses_bad_choices(bad):
    with pytest.raises(SystemExit):
        load_script("bench_elasticity_gs").main(["--backend", "cpu"] + bad)
