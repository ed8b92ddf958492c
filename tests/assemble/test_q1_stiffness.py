"""The Q1 stiffness element kernel (adaptmg.assemble.q1_stiffness): its NumPy twin and its CUDA
source (compiled as host C++) against the host assembly of adaptmg.assemble.stiffness, and on
the GPU the kernel itself through stiffness() on a device mesh.

What is checked: the element matrices summed over a distorted 2-D mesh, a 3-D mesh with hanging
nodes and a twisted 3-D mesh equal the host stiffness matrix (constant coefficient 2.5) to
64 eps of the largest entry -- the host path takes its affine and congruent-cell shortcuts,
the kernel the full Gauss rule on every cell, so the rounding differs; the host-compiled kernel
body equals the twin to the same tolerance; a cell turned inside out is a ValueError after
the sweep, as on the general path; only Q1 in 2-D / 3-D takes the kernel."""
import ctypes
import shutil
import subprocess

import numpy as np
import pytest
import scipy.sparse as sp

from adaptmg import Mesh, Space, assemble
from adaptmg.assemble import forms, q1_stiffness
from adaptmg.backend import CPU

EPS = np.finfo(np.float64).eps


def _meshes():
    b = Mesh.box([0.0, 0.0], [1.0, 1.0], [4, 3])
    p = b.points.copy()
    inner = (p > 0).all(1) & (p < 1).all(1)
    p[inner] += 0.04 * np.sin(7.0 * p[inner][:, ::-1])              # no parallelograms
    d2 = Mesh.from_cells(p, b.cells).refine()
    l3 = Mesh.box([0.0] * 3, [1.0] * 3, [2] * 3).refine()
    x = l3.points[l3.cells].mean(axis=1)
    l3 = l3.refine(np.linalg.norm(x - 0.4, axis=1) < 0.4)           # hanging nodes
    t = Mesh.box([0.0] * 3, [1.0, 2.0, 1.5], [3, 2, 2])
    q = t.points.copy()
    q += 0.05 * np.sin(5.0 * q[:, ::-1]) * (q[:, :1] > 0)             # curved faces inside
    t3 = Mesh.from_cells(q, t.cells).refine()
    return {"distorted-2d": d2, "hanging-3d": l3, "twisted-3d": t3}


MESHES = _meshes()


def _inputs(space):
    info = forms._SpaceInfo(space)
    xi, w = info.quadrature(None)
    T = forms._stiffness_tensor(forms._ref_tables(info, xi)[1])
    return info, xi, w, np.ascontiguousarray(T.reshape(-1, T.shape[-1]))


def _summed(space, chunks):
    """The element matrices of ``chunks`` summed into a CSR matrix (host)."""
    cd = np.asarray(space.cell_dofs)
    n = cd.shape[1]
    Ks = np.concatenate([np.asarray(K) for _, K, _ in chunks])
    r = np.repeat(cd, n, axis=1).reshape(-1)
    c = np.tile(cd, (1, n)).reshape(-1)
    return sp.csr_matrix((Ks.reshape(-1), (r, c)), shape=(space.num_dofs,) * 2)


def _close(A, B):
    tol = 64 * EPS * abs(B).max()
    assert abs(A - B).max() <= tol, (abs(A - B).max(), tol)


@pytest.mark.parametrize("name", list(MESHES))
def test_twin_elements_sum_to_the_host_stiffness(name):
    s = Space(MESHES[name], 1)
    info, xi, w, T = _inputs(s)
    assert q1_stiffness.fits(info, xi.shape[0])
    got = _summed(s, q1_stiffness.stiffness_chunks(CPU, info, xi, w, T, 7, coef=2.5))
    _close(got, assemble.stiffness(s, 2.5))


def test_only_q1_in_two_and_three_dimensions_takes_the_kernel():
    m = MESHES["distorted-2d"]
    info, xi, _, _ = _inputs(Space(m, 2))
    assert not q1_stiffness.fits(info, xi.shape[0])                 # Q2: the general path
    info, xi, _, _ = _inputs(Space(m, 1))
    assert not q1_stiffness.fits(info, np.zeros((28, 2)).shape[0])  # too many points for registers


def _inverted(cells):
    """``cells`` with cell 0 mirrored in x (inside out; Mesh.from_cells would refuse it)."""
    cells = np.array(cells)
    cells[0] = cells[0].reshape(-1, 2)[:, ::-1].reshape(-1)
    return cells


@pytest.mark.parametrize("name", ["distorted-2d", "twisted-3d"])
def test_a_cell_turned_inside_out_is_a_value_error(name):
    info, xi, w, T = _inputs(Space(MESHES[name], 1))
    info.cells = _inverted(info.cells)
    with pytest.raises(ValueError, match="non-positive Jacobian"):
        list(q1_stiffness.stiffness_chunks(CPU, info, xi, w, T, 5))


_HOST = r"""
typedef long long C;
extern "C" void q1(const double* pts, const C* cells, const double* dN, const double* w, const double* T,
                   double coef, long long c0, double* K, bool* bad, long long n) {
  for (long long i = 0; i < n; ++i) {
%s
  } }
"""


@pytest.fixture(scope="module")
def host_kernels(tmp_path_factory):
    """The kernel bodies of 2-D and 3-D (their default Gauss rules) compiled as host C++."""
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.skip("no C++ compiler")
    libs = {}
    for d in (2, 3):
        nq = 2 ** d
        folder = tmp_path_factory.mktemp(f"q1_{d}d")
        (folder / "k.cpp").write_text(_HOST % q1_stiffness._source(d, nq))
        subprocess.run([cxx, "-O1", "-w", "-shared", "-fPIC", "-o", str(folder / "k.so"), str(folder / "k.cpp")],
                       check=True)
        libs[d] = ctypes.CDLL(str(folder / "k.so"))
    return libs


def _p(a):
    assert a.flags.c_contiguous
    return a.ctypes.data_as(ctypes.c_void_p)


@pytest.mark.parametrize("name", list(MESHES))
def test_kernel_source_compiled_for_the_host_equals_the_twin(host_kernels, name):
    """The CUDA body (the ElementwiseKernel loop over i written out) on two chunks of cells:
    the twin's element matrices to 64 eps of the largest, det J > 0 everywhere; and the
    inverted cell flagged."""
    m = MESHES[name]
    for flip in (False, True):
        s = Space(m, 1)
        info, xi, w, T = _inputs(s)
        d = info.dim
        from adaptmg.fe.geometry import q1_tables
        dN = np.ascontiguousarray(q1_tables(d, xi)[1])
        pts = np.ascontiguousarray(m.points, dtype=np.float64)
        cells = np.ascontiguousarray(_inverted(m.cells) if flip else m.cells, dtype=np.int64)
        nc, ne = m.num_cells, T.shape[1]
        K = np.empty((nc, ne))
        bad = np.zeros(nc, dtype=bool)
        half = nc // 2
        for c0, n in ((0, half), (half, nc - half)):
            Kc = np.empty((n, ne))
            host_kernels[d].q1(_p(pts), _p(cells), _p(dN), _p(np.ascontiguousarray(w)), _p(T), ctypes.c_double(2.5),
                               ctypes.c_longlong(c0), _p(Kc), _p(bad), ctypes.c_longlong(n))
            K[c0:c0 + n] = Kc
        Kt, bt = q1_stiffness._np_elements(pts, cells, dN, w, T, 2.5, slice(0, nc))
        assert np.array_equal(bad, bt)
        assert bad.any() == flip and not bad[1:].any()
        ok = ~bad
        assert abs(K[ok] - Kt[ok]).max() <= 64 * EPS * abs(Kt[ok]).max()


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(MESHES))
def test_device_kernel_through_stiffness_equals_the_host(name, monkeypatch):
    """stiffness() on a device mesh (constant coefficient: the kernel; spied) equals the host
    mesh's to 64 eps of the largest entry; the inverted cell is a ValueError there too."""
    pytest.importorskip("cupy")
    from adaptmg.backend import to_host
    m = MESHES[name]
    calls = []
    real = q1_stiffness.stiffness_chunks

    def spy(*a, **k):
        calls.append(1)
        return real(*a, **k)
    monkeypatch.setattr(q1_stiffness, "stiffness_chunks", spy)
    Ad = assemble.stiffness(Space(m.to("gpu"), 1), 2.5)
    assert calls, "the device mesh's constant-coefficient stiffness did not take the kernel"
    _close(sp.csr_matrix(to_host(Ad)), assemble.stiffness(Space(m, 1), 2.5))
    g = Space(m.to("gpu"), 1)
    info, xi, w, T = _inputs(g)
    import cupy
    info.cells = cupy.asarray(_inverted(m.cells))
    with pytest.raises(ValueError, match="non-positive Jacobian"):
        list(q1_stiffness.stiffness_chunks(g.mesh.backend, info, xi, w, T, 5))
