"""scripts/bench_transfer.py prints its table, and its prolongations match the digests of the
code before issue 36's rewrite (the --small meshes: 2-D uniform, the graded L-shape with
hanging nodes on its levels, the 3-D adaptive family; one and three components)."""
from script_loader import load_script

bench = load_script("bench_transfer")


def test_bench_transfer_prints_its_table_with_the_old_digests(capsys, monkeypatch):
    monkeypatch.setattr("sys.argv", ["bench_transfer.py", "--small", "--repeat", "1", "--profile", "2"])
    bench.main()
    out = capsys.readouterr().out
    rows = [ln.split() for ln in out.splitlines() if ln.split()[:1] in (["uni2"], ["lshape"], ["adapt3"])]
    assert [(r[0], r[1]) for r in rows] == [(c, k) for c in ("uni2", "lshape", "adapt3") for k in ("1", "3")]
    assert all(r[-1] == "same" for r in rows), out
    assert "tottime" in out                                   # the profile
