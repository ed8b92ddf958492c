"""scripts/adaptive.py: total wall time and the per-step breakdown table."""
from script_loader import load_script


def test_breakdown_accounts_for_the_wall_time(capsys):
    ad = load_script("adaptive")
    res = ad.main(["--problem", "lshape", "--backend", "cpu", "--max-dofs", "300"])
    out = capsys.readouterr().out
    rows, total = res["breakdown"], res["total"]
    hist = res["history"]
    assert len(rows) == len(hist) >= 4 and hist[-1]["dofs"] >= 300 > hist[-2]["dofs"]
    assert [r["dofs"] for r in rows] == [h["dofs"] for h in hist]
    # the parts of every step add up to the step's wall time, the steps to the total
    for r in rows:
        assert all(r[k] >= 0 for k in ad.BREAKDOWN)
        parts = sum(r[k] for k in ad.BREAKDOWN)
        assert abs(parts - r["step_wall"]) <= 1e-6 + 1e-9 * total, r
    assert rows[0]["refine"] == 0 and all(r["refine"] > 0 for r in rows[1:])
    assert abs(sum(r["step_wall"] for r in rows) - total) <= 1e-3 * total + 1e-4
    assert "| step | cells | DoFs | MG its | refine | setup | solve | estimate | error | other | step total |" in out
    assert f"total wall time {total:.2f} s on backend cpu" in out
    # refine was unwrapped again
    from adaptmg.mesh import mesh as meshmod
    assert not hasattr(meshmod.Mesh.refine, "__wrapped__")
