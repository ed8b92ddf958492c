"""Smoke test of scripts/bench_elasticity_gs.py's static part on the CPU: both smoothers'
rows with the set-up split (``setup_timeline``).  (On the CPU the two ``--form`` choices run the
same host path: multigrid passes ``device`` only on the GPU.)"""
from script_loader import load_script


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
