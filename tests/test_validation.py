"""Table-driven check of input validation across the public API.

Each row: a call with one bad input, the intended exception type, and a regex
that the message must match -- it names the offending argument (and, where it
applies, the shapes/values involved).  The four gaps this table first found in
modules owned by other engineers (Mesh.hierarchy max_levels,
Space.boundary_dofs ids, Space.interpolate f, elasticity mu) were fixed by
their owners in 1069c37 and are regular rows now.
"""
import numpy as np
import pytest
import scipy.sparse as sp

import adaptmg
import adaptmg.io
from adaptmg import Constraints, Level, Mesh, MultilevelSolver, Space, assemble, linalg
from adaptmg.fe.norms import errors
from adaptmg.progress import progress

pyamg = pytest.importorskip("pyamg")

M = Mesh.box([0, 0], [1, 1], [4, 4])
S = Space(M)
S2 = Space(M, components=2)
A = assemble.stiffness(S, 1.0)
N = S.num_dofs


def _ml():
    return adaptmg.multigrid(Space(M.refine()), assemble.stiffness)


def _amg():
    return pyamg.smoothed_aggregation_solver(pyamg.gallery.poisson((20, 20), format="csr"))


def _write_file(tmp):
    p = tmp / "m.vtu"
    adaptmg.io.write(p, M)
    return p



CASES = [
    # --- mesh
    ("Mesh.box cells", lambda t: Mesh.box([0, 0], [1, 1], [0, 2]), ValueError, r"cells must be positive integers"),
    ("Mesh.box lower/upper", lambda t: Mesh.box([1, 0], [0, 1], [2, 2]), ValueError, r"lower < upper.*\[1\. 0\.\]"),
    ("Mesh.box dimension", lambda t: Mesh.box([0] * 4, [1] * 4, [1] * 4), ValueError, r"dimension 4"),
    ("Mesh.refine mask shape", lambda t: M.refine(np.ones(3, bool)), ValueError, r"marked.*shape \(16,\).*\(3,\)"),
    ("Mesh.refine index range", lambda t: M.refine([99]), ValueError, r"marked.*\[0, 16\)"),
    ("Mesh.from_cells cells shape", lambda t: Mesh.from_cells(np.zeros((4, 2)), np.zeros((1, 3), int)),
     ValueError, r"cells must have shape \(nc, 4\).*\(1, 3\)"),
    ("Mesh.from_cells NaN points", lambda t: Mesh.from_cells(np.array([[0, 0], [1, 0], [0, 1], [np.nan, 1]]),
                                                              np.array([[0, 1, 2, 3]])), ValueError, r"points.*NaN"),
    ("Mesh.map output shape", lambda t: M.map(lambda x: x[:, :1]), ValueError, r"map.*shape \(25, 2\).*\(25, 1\)"),
    ("Mesh.hierarchy max_levels=0", lambda t: M.hierarchy(max_levels=0), ValueError, r"max_levels must be a positive integer"),
    # --- spaces and constraints
    ("Space degree", lambda t: Space(M, degree=3), ValueError, r"degree must be 1 or 2, got 3"),
    ("Space components", lambda t: Space(M, components=0), ValueError, r"components must be a positive integer"),
    ("Space mesh type", lambda t: Space("mesh"), TypeError, r"Space expects an adaptmg Mesh, got str"),
    ("Space.boundary_dofs components", lambda t: S2.boundary_dofs(components=[5]), ValueError, r"components.*\[0, 2\)"),
    ("Space.boundary_dofs ids type", lambda t: S.boundary_dofs(ids=[0.5]), TypeError,
     r"boundary ids must be integers or names"),
    ("Space.boundary_dofs unknown name", lambda t: S.boundary_dofs(ids="x"), ValueError,
     r"unknown boundary name 'x'; the mesh's boundary names are: none"),
    ("Space.interpolate not callable", lambda t: S.interpolate(5), TypeError, r"\bf must be a callable.*got int"),
    ("Constraints DoF range", lambda t: Constraints(S, [100]), ValueError, r"dirichlet.*\[0, 25\)"),
    ("Constraints values shape", lambda t: Constraints(S, [0, 1], values=np.zeros(3)), ValueError,
     r"values must be.*\(25,\).*\(3,\)"),
    ("Constraints.expand shape", lambda t: Constraints(S).expand(np.ones(3)), ValueError, r"x has shape \(3,\), expected \(25,\)"),
    # --- assembly
    ("stiffness coef shape", lambda t: assemble.stiffness(S, np.ones(7)), ValueError, r"coef.*\(16,\).*\(7,\)"),
    ("stiffness coef NaN", lambda t: assemble.stiffness(S, np.nan), ValueError, r"coef contains non-finite"),
    ("mass coef type", lambda t: assemble.mass(S, "x"), TypeError, r"coef must be a number"),
    ("convection b shape", lambda t: assemble.convection(S, [1.0, 2.0, 3.0]), ValueError, r"b must be.*\(2,\).*\(3,\)"),
    ("load f shape", lambda t: assemble.load(S, np.ones(5)), ValueError, r"f must be.*\(16,\).*\(5,\)"),
    ("elasticity components", lambda t: assemble.elasticity(S, 1.0, 1.0), ValueError, r"components == dim == 2, got 1"),
    ("elasticity mu <= 0", lambda t: assemble.elasticity(S2, 1.0, -1.0), ValueError, r"shear modulus mu must be positive"),
    ("errors u shape", lambda t: errors(S, np.ones(3), lambda x: x[..., 0]), ValueError, r"u must have shape \(25,\)"),
    # --- multigrid
    ("multigrid assemble type", lambda t: adaptmg.multigrid(S, 5), TypeError, r"assemble must be a callable"),
    ("multigrid smoother name", lambda t: adaptmg.multigrid(Space(M.refine()), assemble.stiffness, smoother="gs"),
     ValueError, r"unknown smoother 'gs'"),
    ("multigrid presmooth", lambda t: adaptmg.multigrid(S, assemble.stiffness, presmooth=-1), ValueError,
     r"presmooth must be a non-negative integer, got -1"),
    ("multigrid backend", lambda t: adaptmg.multigrid(S, assemble.stiffness, backend="tpu"), ValueError,
     r"backend must be 'auto', 'cpu' or 'gpu', got 'tpu'"),
    ("multigrid dtype", lambda t: adaptmg.multigrid(S, assemble.stiffness, dtype=np.int32), TypeError, r"dtype must be a float"),
    ("solve b shape", lambda t: _ml().solve(np.ones(3)), ValueError, r"b must have shape \(81,\).*\(3,\)"),
    ("solve b NaN", lambda t: _ml().solve(np.full(81, np.nan)), ValueError, r"b contains NaN"),
    ("solve cycle", lambda t: _ml().solve(np.ones(81), cycle="X"), ValueError, r"unknown cycle 'X'"),
    ("Level non-square A", lambda t: Level(sp.eye(3, 4).tocsr()), ValueError, r"Level.A must be square.*\(3, 4\)"),
    ("from_matrices lengths", lambda t: MultilevelSolver.from_matrices([sp.eye(3), sp.eye(5)], []), ValueError,
     r"len\(Ps\) == len\(As\) - 1"),
    # --- Krylov
    ("cg b shape", lambda t: linalg.cg(A, np.ones(3)), ValueError, r"A has shape \(25, 25\) but b has shape \(3,\)"),
    ("cg rtol", lambda t: linalg.cg(A, np.ones(N), rtol=-1), ValueError, r"rtol must be a finite non-negative"),
    ("cg M shape", lambda t: linalg.cg(A, np.ones(N), M=sp.eye(3)), ValueError, r"M has shape \(3, 3\).*\(25, 25\)"),
    ("gmres restart", lambda t: linalg.gmres(A, np.ones(N), restart=0), ValueError, r"restart must be a positive integer"),
    ("cg A type", lambda t: linalg.cg("A", np.ones(4)), TypeError, r"A must be a sparse or dense matrix.*got str"),
    # --- backend
    ("get_backend type", lambda t: adaptmg.get_backend(3), TypeError, r"backend must be .*got int"),
    # --- io (this module's owner: issue 7)
    ("io.write point_data shape", lambda t: adaptmg.io.write(t / "a.vtu", M, {"u": np.zeros(4)}), ValueError,
     r"point_data\['u'\].*25 nodes.*\(4,\)"),
    ("io.write mesh type", lambda t: adaptmg.io.write(t / "a.vtu", "mesh"), TypeError, r"mesh must be an adaptmg Mesh"),
    ("io.read path type", lambda t: adaptmg.io.read(42), TypeError, r"path must be a str or os.PathLike, got int"),
    ("io.read max_cells", lambda t: adaptmg.io.read(_write_file(t), max_cells=3), ValueError, r"NumberOfCells=16.*max_cells"),
    ("io.read unknown suffix", lambda t: (t / "x.foo").write_text("x") and adaptmg.io.read(t / "x.foo"), ValueError,
     r"x\.foo: cannot tell the mesh format"),
    ("TimeSeriesWriter suffix", lambda t: adaptmg.io.TimeSeriesWriter(t / "a.vtu", M), ValueError, r"path must end in .xdmf"),
    # --- pyamg bridge
    ("from_pyamg ml type", lambda t: adaptmg.from_pyamg(A), TypeError, r"ml must be a pyamg MultilevelSolver"),
    ("from_pyamg smoother", lambda t: adaptmg.from_pyamg(_amg(), smoother="gauss_jordan"), ValueError,
     r"smoother must be one of"),
    ("from_pyamg omega", lambda t: adaptmg.from_pyamg(_amg(), omega=-1.0), ValueError, r"omega must be a positive number"),
    ("from_pyamg presmooth", lambda t: adaptmg.from_pyamg(_amg(), presmooth=1.5), ValueError,
     r"presmooth must be a non-negative integer"),
    ("from_pyamg backend", lambda t: adaptmg.from_pyamg(_amg(), backend="tpu"), ValueError, r"backend must be"),
    # --- progress / plot
    ("progress total", lambda t: progress(total=-1), ValueError, r"total must be a non-negative integer"),
    ("progress description", lambda t: progress(3, description=5), TypeError, r"description must be a str"),
]


def _ids():
    return [c.values[0] if hasattr(c, "values") else c[0] for c in CASES]


@pytest.mark.parametrize("name,call,exc,pattern", CASES, ids=_ids())
def test_bad_input(tmp_path, name, call, exc, pattern):
    with pytest.raises(exc) as info:
        call(tmp_path)
    assert __import__("re").search(pattern, str(info.value)), f"{name}: message {str(info.value)!r}"


def test_table_is_large_enough():
    active = [c for c in CASES if not hasattr(c, "marks") or not c.marks]
    assert len(active) >= 15
