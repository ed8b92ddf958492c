"""The README's Python example runs and solves the problem it claims to."""
import pathlib
import re

from adaptmg.backend import to_host

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def test_readme_example_runs_and_solves(monkeypatch):
    monkeypatch.chdir(README.parent)                 # the examples read data/ files
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert blocks, "README has no python example"
    ns = {}
    for code in blocks:
        exec(compile(code, str(README), "exec"), ns)
    # -Laplace u = 1 on the unit square, u = 0 on the boundary: max u = 0.07367 (series solution);
    # the example's coarse adaptive Q1 mesh is within 2e-3 of it
    assert abs(to_host(ns["u"]).max() - 0.07367) < 2e-3
    # the AMG example converges with SciPy's cg and adaptmg's preconditioner
    assert ns["info"] == 0
    # the named-boundary example: 4y(1-y) on "inlet", 0 on "outlet", in between elsewhere
    # (maximum principle)
    uc, sc = to_host(ns["uc"]), ns["sc"]
    inlet = sc.boundary_nodes("inlet")
    y = sc.points[inlet, 1]
    assert abs(uc[inlet] - 4 * y * (1 - y)).max() < 1e-12 and abs(uc[sc.boundary_nodes(2)]).max() < 1e-12
    assert uc.min() > -1e-9 and uc.max() < 1 + 1e-9 and 0.05 < uc.mean() < 0.8
