"""scripts/bench_prehandling.py runs every section on a tiny problem and prints its tables."""
import re

from script_loader import load_script


def test_bench_prehandling_tiny(capsys):
    bench = load_script("bench_prehandling")
    bench.main(["--backend", "cpu", "--table-h", "32", "--table-h0", "4", "--kappa-full", "16:4",
                "--levels", "3,4", "--err-n", "4", "--speed-h", "16", "--h0", "4", "--nrhs", "1,3",
                "--mg-rhs", "1", "--repeat", "1", "--plot", "", "--a", "2"])
    out = capsys.readouterr().out
    assert "## Table 1" in out and "## Figure 5" in out and "## M1 speed" in out
    # the 1/32, 1/4 row: kappa(C_i) of h0/h = 8 is Table 1's 6.6
    assert re.search(r"^\s+32\s+4\s+9\s+168\s+784\s+6\.6\b", out, re.M), out
    # M1 in fp64 solves the same discrete problem as multigrid-CG: same L2 error
    rows = [line.split() for line in out.splitlines() if re.match(r"^\s+16\s+4\s+\d+\s+(float64|mg-CG64)", line)]
    e = {r[3]: float(r[10] if r[3] == "float64" else r[8]) for r in rows}
    assert abs(e["float64"] - e["mg-CG64"]) < 1e-6 * e["float64"], rows
