"""Smoke test of scripts/bench_spectral.py: the selections of table1, table4's precisions and
the op section's BK table print what they say."""
import re

import pytest

from script_loader import load_script


def test_bench_spectral_selections(capsys):
    load_script("bench_spectral").main(
        ["--backend", "cpu", "--sections", "table1,table4,op", "--sizes", "2", "--meshes", "distorted",
         "--preconditioners", "pmg,two-scale", "--table4-n", "4", "--table4-degrees", "2", "--steps", "3",
         "--table4-precisions", "float64,mixed,float32", "--op-dofs", "3000", "--op-degrees", "2,3",
         "--op-kinds", "bk1,bk3,stored", "--reps", "1"])
    out = capsys.readouterr().out
    t1 = [ln.split() for ln in out.splitlines() if ln.startswith("distorted ")]
    assert len(t1) == 1 and t1[0][5] == "-" and t1[0][4].isdigit() and t1[0][6].isdigit(), t1
    t4 = {ln.split()[2]: ln.split() for ln in out.splitlines() if re.match(r"^ 2 +\d+ +fp", ln)}
    assert set(t4) == {"fp64", "fp32/64", "fp32"}, out
    assert all(r[6].isdigit() for r in t4.values()), t4                 # converged: no '!'
    assert int(t4["fp32/64"][7]) >= 3 and int(t4["fp64"][7]) == 3      # outer steps
    assert t4["fp64"][-2] == t4["fp32/64"][-2]                           # max u agrees
    assert "## BK1 / BK3 throughput vs polynomial degree" in out
    bk = [ln.split() for ln in out.splitlines() if re.match(r"^ [23] +\d+ +\d+\.\d+ ", ln)]
    assert [r[0] for r in bk] == ["2", "3"] and all(len(r) == 10 for r in bk), bk


def test_bench_spectral_refuses_unknown_names():
    for opt in ("--meshes", "--preconditioners", "--table4-precisions"):
        with pytest.raises(SystemExit):
            load_script("bench_spectral").main(["--backend", "cpu", opt, "nope"])
