"""Smoke test of scripts/bench_distributed_levels.py on the CPU: the serial and the one-rank
distributed hierarchy are timed level by level, the distributed levels are DistCSR."""
import json

import pytest

from script_loader import load_script

pytest.importorskip("mpi4py")


def test_bench_distributed_levels_prints_both_hierarchies(capsys):
    res = load_script("bench_distributed_levels").main(["--dofs", "2e4", "--backend", "cpu", "--reps", "2"])
    out = capsys.readouterr().out
    recs = [json.loads(ln) for ln in out.splitlines() if ln.startswith("{")]
    assert {r["who"] for r in recs} == {"serial", "distributed"}
    assert all(r["A"] == "DistCSR" for r in recs if r["who"] == "distributed")
    assert res["serial"] > 0 and res["distributed"] > 0 and "eager V-cycle" in out
