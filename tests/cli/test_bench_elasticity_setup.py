"""Smoke test of scripts/bench_elasticity_setup.py on the CPU (the device code run by NumPy):
the table is printed and the device-path fields and constrained matrices agree with the host's."""
from script_loader import load_script


def test_bench_elasticity_setup_prints_its_table(capsys):
    rows = load_script("bench_elasticity_setup").main(["--backend", "cpu", "--level", "2", "--levels", "2",
                                                       "--repeat", "1"])
    out = capsys.readouterr().out
    assert "elasticity set-up pieces, face 2, backend cpu" in out and "K dev" in out
    assert len(rows) == 2 and rows[0]["dofs"] > rows[1]["dofs"]
    assert all(r["fields err"] <= 64 and r["K err"] <= 64 for r in rows)
