"""The Q1 prolongation P = Z_f (chi kron I_c) H_c Z_c is bit-identical to the one built before
issue 36's rewrite of its index work: SHA-1 digests of P's (indptr, indices, data) -- dtypes,
shapes and bytes -- for every level pair of a few hierarchies, recorded with the old code
(commit 6ca4b53).  The weights are dyadic and the sums of the hanging rows exact, so the
arrays are exact on any machine and either backend.  And scripts/bench_transfer.py prints its
table, its prolongations matching the old code's digests too."""
import numpy as np
import pytest
from script_loader import load_script

from adaptmg import Mesh, Space
from adaptmg.multilevel.hierarchy import _level_constraints
from adaptmg.multilevel.transfer import interpolation_matrix, prolongation

bench = load_script("bench_transfer")     # its meshes and its digest of P's arrays


MESHES = {
    "box2": lambda: Mesh.box([0.0, 0.0], [1.0, 1.0], [2, 3]).refine().refine().refine().refine().refine(),
    "lshape": lambda: bench.lshape_mesh(4e-4),
    "adapt3": lambda: bench.build("adapt3", small=True),     # make_mesh(3, 1, 2e4): 6,132 nodes
}

DIRICHLET = {"all": "all", "none": None, "left": lambda x: x[:, 0] < -0.99,
             "comp0": {"ids": [1], "components": [0]}}    # comp0: masks that are not whole nodes

# (mesh, components, dirichlet) -> digest of every level's P, fine to coarse
CASES = {
    ("box2", 1, "all"): "62a3a8ca322d26063b62100a3c1b36c80fc53407",
    ("box2", 3, "all"): "780b188d975d7190b60c819c4ff587d027e1a3ae",
    ("box2", 1, "none"): "ade725f33eda4b36a94e3fa0f500ce2407210984",
    ("lshape", 1, "all"): "0ed38a66ffa89608c7dd8e08a9078577834daa5a",
    ("lshape", 2, "all"): "f8c44aa1ad446487eb4bcf2825c06b074ce5ced8",
    ("lshape", 1, "left"): "1926a01a0f73a1bab8e5649d7fa2b3a4d4037cb4",
    ("lshape", 2, "comp0"): "e7caaffc681621c653f85f0fe5a180204bddf179",
    ("adapt3", 1, "all"): "121f5a62eac112d975b452a425ecd69aae2f76e4",
    ("adapt3", 3, "all"): "6f0b18e2da627ae44b158d9386afcefb2c02a544",
    ("adapt3", 1, "none"): "e0725e801590820eaff15a9ba385731fbef0c704",
}
CHI = {"box2": "ade725f33eda4b36a94e3fa0f500ce2407210984",     # interpolation_matrix, every level pair
       "lshape": "0e19e7f60cbed189fa8af8f50359a0c68baeadcb",
       "adapt3": "7550c2a36c2a156d771f28633e3b554389932b14"}


_SPACES = {}


def _spaces(name, c):
    if (name, c) not in _SPACES:
        if name not in _SPACES:
            _SPACES[name] = MESHES[name]().hierarchy()
        _SPACES[name, c] = [Space(m, 1, c) for m in _SPACES[name]]
    return _SPACES[name, c]


def _prolongations(name, c, dirichlet, backend=None):
    spaces = _spaces(name, c)
    spec = DIRICHLET[dirichlet]
    free = [_level_constraints(s, spec).free if spec is not None else None for s in spaces]
    return [prolongation(spaces[l - 1], spaces[l], free[l - 1], free[l], backend=backend)
            for l in range(len(spaces) - 1, 0, -1)]


@pytest.mark.parametrize("case", list(CASES), ids=lambda c: "-".join(map(str, c)))
def test_prolongation_is_bit_identical_to_the_old_build(case):
    assert bench.digest(_prolongations(*case)) == CASES[case]


@pytest.mark.parametrize("name", list(CHI))
def test_interpolation_matrix_is_bit_identical_to_the_old_build(name):
    spaces = _spaces(name, 1)
    assert bench.digest(interpolation_matrix(spaces[l - 1], spaces[l])
                   for l in range(len(spaces) - 1, 0, -1)) == CHI[name]


@pytest.mark.gpu
@pytest.mark.parametrize("case", [k for k in CASES if k[2] == "all"], ids=lambda c: "-".join(map(str, c)))
def test_prolongation_on_the_device_is_bit_identical_to_the_old_host_build(case):
    from adaptmg.backend import get_backend
    assert bench.digest(_prolongations(*case, backend=get_backend("gpu"))) == CASES[case]


@pytest.mark.parametrize("case", [k for k in CASES if k[2] != "comp0"], ids=lambda c: "-".join(map(str, c)))
def test_device_branch_with_a_stand_in_device_is_bit_identical(case, fake_gpu):
    """The GPU branch (forest tables uploaded once, the forest -> coarse map scattered on the
    device, every index step on the backend) run with the stand-in CuPy of the conftest:
    the same digests, and no array copied back to the host."""
    from adaptmg.backend import get_backend
    from adaptmg.multilevel import transfer
    be = get_backend("gpu")
    spaces = _spaces(*case[:2])
    gets = fake_gpu.device_to_host()
    Ps = _prolongations(*case, backend=be)
    assert fake_gpu.device_to_host() == gets
    assert all(type(P) is fake_gpu.csr_matrix for P in Ps)
    assert bench.digest(Ps) == CASES[case]
    # the forest path ran: one upload of the forest tables, shared by every level
    F = spaces[-1].mesh._forest
    dev = fake_gpu.xp.cuda.Device().id
    assert transfer._FOREST_TABLES[dev][0]() is F
    kind, par = transfer._forest_tables(F, be)
    assert transfer._forest_tables(F, be)[1] is par and np.array_equal(np.asarray(par), F.node_par)


def test_forest_tables_are_kept_for_the_latest_forest_only(fake_gpu):
    """The device copy of the forest tables: one per device, the latest forest's, dropped when
    that forest dies (an adaptive loop's old forests hold no device memory)."""
    import gc
    from adaptmg.backend import get_backend
    from adaptmg.multilevel import transfer
    m = Mesh.box([0.0, 0.0], [1.0, 1.0], [2, 2]).refine()
    m = m.refine(np.arange(3))
    sc, sf = Space(m.hierarchy()[-2], 1), Space(m, 1)
    P = prolongation(sc, sf, backend=get_backend("gpu"))
    dev = fake_gpu.xp.cuda.Device().id
    assert P.shape == (sf.num_nodes, sc.num_nodes) and transfer._FOREST_TABLES[dev][0]() is m._forest
    # the next forest replaces it
    m2 = m.refine(np.arange(2))
    prolongation(Space(m2.hierarchy()[-2], 1), Space(m2, 1), backend=get_backend("gpu"))
    assert transfer._FOREST_TABLES[dev][0]() is m2._forest
    del m2
    gc.collect()
    assert dev not in transfer._FOREST_TABLES


def test_forest_map_scattered_on_the_backend_equals_the_mesh_map():
    """_forest_map's device form (the inverse of the node ids, written by the backend) is the
    mesh's own cached forest -> node map, on every mesh of an adaptive hierarchy."""
    from adaptmg.multilevel.transfer import _scatter_map
    for m in _spaces("lshape", 1)[::4]:
        m = m.mesh
        got = _scatter_map(np, m.node_ids, m._forest.num_nodes)
        assert got.dtype == np.int32 and np.array_equal(got, m._node_numbering[1])


def test_bench_transfer_prints_its_table_with_the_old_digests(capsys, monkeypatch):
    monkeypatch.setattr("sys.argv", ["bench_transfer.py", "--small", "--repeat", "1", "--profile", "2"])
    bench.main()
    out = capsys.readouterr().out
    rows = [ln.split() for ln in out.splitlines() if ln.split()[:1] in (["uni2"], ["lshape"], ["adapt3"])]
    assert [(r[0], r[1]) for r in rows] == [(c, k) for c in ("uni2", "lshape", "adapt3") for k in ("1", "3")]
    assert all(r[-1] == "same" for r in rows), out
    assert "tottime" in out                                   # the profile
