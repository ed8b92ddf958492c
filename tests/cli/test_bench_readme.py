"""Smoke test of scripts/bench_readme.py: every README row is produced, in the README's layout."""
import re

import pytest

from adaptmg import gpu_available

from script_loader import load_script


def _table_rows(text):
    return [ln for ln in text.splitlines() if ln.startswith("| ") and not ln.startswith("| what")]


def test_quick_run_prints_every_readme_row(capsys):
    br = load_script("bench_readme")
    res = br.main(["--quick", "--cpu-fallback"])
    out = capsys.readouterr().out
    assert list(res) == list(br.ROWS)
    rows = _table_rows(out)
    assert len(rows) == len(br.ROWS)
    for key, line in zip(br.ROWS, rows):
        what, command, result = [c.strip() for c in line.strip("|").split(" | ")]
        assert (what, command) == br.README[key]
        assert result == res[key]
    assert re.search(r"on \d{4}-\d\d-\d\d \d\d:\d\d UTC", out)
    assert "## Measured performance (" in out
    # the rows measured here carry numbers; without a GPU only the CUDA-kernel rows are n/a
    for key in ("poisson2d", "poisson3d", "vcycle", "bridge", "td", "elasticity"):
        assert re.search(r"\d", res[key]) and "n/a" not in res[key].replace("cupyx CG+Jacobi n/a", "")
    if not gpu_available():
        assert res["patch"] == res["ns"] == br.NA
        assert all(res[k].endswith("[CPU backend, quick]") for k in ("td", "elasticity", "vcycle"))
        r2 = br.main(["--quick", "--rows", "vcycle,td,poisson2d"])
        assert r2["vcycle"] == r2["td"] == br.NA
        assert "pyamg SA+CG" in r2["poisson2d"] and "n/a (needs GPU)" in r2["poisson2d"]


def test_bad_rows_are_refused():
    br = load_script("bench_readme")
    with pytest.raises(SystemExit):
        br.main(["--rows", "poisson2d,nonsense"])
