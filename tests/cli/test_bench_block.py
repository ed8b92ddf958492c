"""Smoke test of scripts/bench_block.py: the table is printed and every column converged."""
import pytest

from script_loader import load_script


def test_bench_block_prints_its_table(capsys):
    res = load_script("bench_block").main(["--n", "16", "--k", "3", "--repeat", "1"])
    out = capsys.readouterr().out
    assert "| 3 as one block |" in out and "block / one solve =" in out
    assert res["worst"] <= 1e-8 and res["ratio"] > 0


def test_bench_block_refuses_bad_sizes():
    with pytest.raises(SystemExit):
        load_script("bench_block").main(["--n", "12"])
