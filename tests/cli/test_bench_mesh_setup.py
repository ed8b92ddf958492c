"""The mesh set-up's outputs stay bit-identical (issue 36: faster hanging-node data, same
results): SHA-1 digests of every output of a few adaptive 2-D / 3-D meshes and of their
hierarchies (cells, points, node ids, levels, boundary ids, regions, hanging nodes / parents
/ owners / (node, cell) pairs), stored from the code before the change (commit 77ed07b)."""
import numpy as np
import pytest

from adaptmg import Mesh
from script_loader import load_script

bench = load_script("bench_mesh_setup")


def _random(dim, steps, seed, frac=0.3):
    rng = np.random.default_rng(seed)
    m = Mesh.box([0] * dim, [1] * dim, [2] * dim)
    for _ in range(steps):
        m = m.refine(rng.random(m.num_cells) < frac)
    return m


CASES = {
    "2d": (lambda: _random(2, 6, 1), "ffd9f5b84db0890fe2c399ca6980f86577d9e6ed"),
    "3d": (lambda: _random(3, 3, 2), "340635dbb6f9deeb79c30d8d407e4a4abbac0f52"),
    "family": (lambda: bench.build("adaptive", 3e4), "bb3d0cb484b685321e2c7d3570500b4293ad0bf9"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_mesh_outputs_match_the_reference_digest(case):
    make, digest = CASES[case]
    m = make()
    assert m.num_hanging_nodes > 0 and len(m.hierarchy()) > 2     # the digest covers hanging data
    assert bench.mesh_digest(m) == digest


def test_bench_mesh_setup_prints_its_table(capsys, monkeypatch):
    monkeypatch.setattr("sys.argv", ["bench_mesh_setup.py", "--cases", "adaptive,uniform", "--targets", "3e3",
                                     "--refine", "2", "--digest", "--profile", "3"])
    bench.main()
    out = capsys.readouterr().out
    assert "cell_dofs s" in out and "ncalls" in out
    table = [ln.split() for ln in out.splitlines() if ln.strip().startswith(("adaptive ", "uniform ")) and ":" not in ln]
    assert [r[0] for r in table] == ["adaptive", "uniform"] and all(len(r[-1]) == 12 for r in table)
    assert table[1][2:6] == ["729", "512", "0", "3"]          # DoFs, cells, hanging, levels of 2^3 x 2
