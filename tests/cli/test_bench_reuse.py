"""scripts/bench_reuse.py: the share of the multigrid hierarchy an adaptive step leaves unchanged."""
import numpy as np
from script_loader import load_script

from adaptmg import Mesh
from adaptmg.multilevel.hierarchy import GPU_COARSE_MAX_ROWS


def _bench():
    return load_script("bench_reuse")


def test_digest_tells_levels_apart():
    bench = _bench()
    m = Mesh.box([0.0, 0.0], [1.0, 1.0], [2, 2])
    assert bench.level_digest(m) == bench.level_digest(Mesh.box([0.0, 0.0], [1.0, 1.0], [2, 2]))
    marks = np.zeros(m.num_cells, dtype=bool)
    marks[0] = True
    assert bench.level_digest(m.refine(marks)) != bench.level_digest(m)


def test_lshape_steps_leave_only_tiny_coarse_levels_unchanged(capsys):
    """The measured answer to "does reuse across steps pay": the unchanged levels are the
    coarsest few, inside the GPU's direct coarse solve, and a vanishing share of the cells."""
    rows = _bench().main(["--max-dofs", "4000"])
    assert len(rows) >= 10 and rows[-1]["dofs"] >= 2000
    assert all(r["unchanged"] >= 1 for r in rows[1:])                 # the coarse mesh survives
    assert all(r["unchanged"] < r["levels"] for r in rows)             # the fine levels never do
    assert max(r["largest_unchanged_dofs"] for r in rows) <= GPU_COARSE_MAX_ROWS
    assert rows[-1]["share"] < 0.1
    assert "| within the GPU coarse solve |" in capsys.readouterr().out
