"""The GPU set-up reads back no O(cells) data: device -> host bytes of ``adaptmg.multigrid``.

Issue 36 ("Done when"): the set-up on the GPU keeps its data on the device and the host
runs O(levels) Python.  The mesh lives on the host (uploads are fine); what is forbidden is
reading O(cells) device results back.  Measured with :mod:`adaptmg.device.host_reads`
(sys.monitoring, Python 3.12+): every ``get``/``item``/``tolist``/``int()``/``float()``/
``bool()`` of a device array, NumPy conversion and device-to-host memcpy of the block,
with its bytes.  The bounds:

* set-up: at most :data:`PER_LEVEL` bytes per level plus :data:`BASE` (scalars: sizes,
  norms, flags, CuPy's own nnz reads), and refining the mesh once more (8x the cells in
  3-D, 4x in 2-D, one level more) adds at most one level's worth: a read of any O(cells)
  or O(hanging nodes) array -- 8 bytes a DoF of the 1e5-8e5 DoF meshes here -- breaks
  both;
* load vector + constrain: :data:`BASE`; a solve: :data:`PER_ITERATION` bytes an
  iteration plus :data:`BASE`.

A test can fail: the control reads one fine-level vector inside a block and must be seen
and break the bound, and the instrument must see each form on real CuPy arrays.  On
failure the message lists the call sites with the most bytes (``HostReads.report``).

    python -m pytest -m gpu -q tests/multilevel/test_setup_host_reads.py
"""
import numpy as np
import pytest

import adaptmg
from adaptmg import Mesh, assemble
from adaptmg.backend import get_backend, to_host
from adaptmg.device.host_reads import available, count_host_reads

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not available(), reason="needs sys.monitoring (Python 3.12+)")]

#: bytes a level may read back during the set-up (a few hundred scalars)
PER_LEVEL = 16 * 1024
#: bytes any block may read back besides (one-off scalars, the coarse solve's checks)
BASE = 16 * 1024
#: bytes a Krylov iteration may read back (its scalars and the status of the CUDA graph)
PER_ITERATION = 256


def _adaptive(dim, refine, radii):
    """A box refined uniformly ``refine`` times, then around (0.3, ...) in nested balls of
    ``radii``: hanging nodes on two fronts (3-D (4, (0.35, 0.15)): 107,349 DoFs, 10,743
    hanging; once more refined: 821,441 and 42,816; 2-D (7, (0.3, 0.15)): 177,821 DoFs,
    1,180 hanging, then about 4x that)."""
    m = Mesh.box([0.0] * dim, [1.0] * dim, [2] * dim)
    for _ in range(refine):
        m = m.refine()
    for r in radii:
        c = m.points[m.cells].mean(axis=1)
        m = m.refine(np.linalg.norm(c - 0.3, axis=1) < r)
    return m


CASES = {3: (4, (0.35, 0.15)), 2: (7, (0.3, 0.15))}
_CACHE = {}


def _setup(dim, larger, smoother="jacobi"):
    """(space, ml, reads) of the GPU set-up on the mesh of ``dim`` (``larger``: refined once
    more), the set-up counted (made once per process)."""
    key = (dim, larger, smoother)
    if key not in _CACHE:
        mesh = _adaptive(dim, *CASES[dim])
        if larger:
            mesh = mesh.refine()
        assert mesh.num_hanging_nodes > 0
        space = adaptmg.Space(mesh, degree=1)
        be = get_backend("gpu")
        with count_host_reads() as reads:
            ml = adaptmg.multigrid(space, assemble.stiffness, dirichlet="all", backend=be,
                                   smoother=smoother)
        be.synchronize()
        _CACHE[key] = (space, ml, reads)
    return _CACHE[key]


def _bound(ml):
    return PER_LEVEL * len(ml.levels) + BASE


def test_the_instrument_sees_each_form_on_cupy_arrays():
    """Each known form on real CuPy arrays, counted once with its bytes (the CPU tests check
    the routing on a stand-in; this checks what CuPy's compiled methods deliver)."""
    be = get_backend("gpu")
    cp, rt = be.xp, be.xp.cuda.runtime
    x = cp.arange(1000, dtype=cp.float64)
    s = cp.asarray(2.5)
    A = be.sparse.identity(100, format="csr")
    pinned = cp.cuda.alloc_pinned_memory(16)
    g = x.get
    forms = [("x.get()", lambda: x.get(), 8000), ("bound get", lambda: g(), 8000),
             ("cupy.asnumpy", lambda: cp.asnumpy(x), 8000), ("to_host", lambda: to_host(x), 8000),
             ("x.tolist()", lambda: x.tolist(), 8000), ("s.item()", lambda: s.item(), 8),
             ("int(s)", lambda: int(s), 8), ("float(s)", lambda: float(s), 8),
             ("bool(s)", lambda: bool(s), 8), ("float(x.sum())", lambda: float(x.sum()), 8),
             ("csr.get()", lambda: A.get(), A.data.nbytes + A.indices.nbytes + A.indptr.nbytes),
             ("memcpyAsync D2H", lambda: rt.memcpyAsync(pinned.ptr, x.data.ptr, 16, rt.memcpyDeviceToHost,
                                                        cp.cuda.get_current_stream().ptr), 16)]
    for what, call, nbytes in forms:
        with count_host_reads() as reads:
            call()
        be.synchronize()
        assert reads.bytes == nbytes, f"{what}:\n{reads.report()}"
    with count_host_reads() as reads:
        y = (x * 2.0 + 1.0)[::2].copy()
        cp.sqrt(y, out=y)
        be.synchronize()
    assert reads.bytes == 0, reads.report()


@pytest.mark.parametrize("dim", [3, 2])
def test_gpu_setup_reads_back_o_levels_bytes(dim):
    space, ml, reads = _setup(dim, False)
    assert reads.calls >= len(ml.levels), reads.report()        # the instrument saw the set-up
    assert reads.bytes <= _bound(ml), (f"{space.num_dofs} DoFs, {len(ml.levels)} levels:\n"
                                       f"{reads.report()}")
    assert 8 * space.num_dofs > 2 * _bound(ml)                   # one fine vector would not fit


@pytest.mark.parametrize("dim", [3, 2])
def test_gpu_setup_reads_do_not_grow_with_the_mesh(dim):
    small, ml_s, r_s = _setup(dim, False)
    large, ml_l, r_l = _setup(dim, True)
    assert large.num_dofs > 3 * small.num_dofs and len(ml_l.levels) >= len(ml_s.levels)
    grown = len(ml_l.levels) - len(ml_s.levels)
    assert r_l.bytes <= r_s.bytes + PER_LEVEL * max(grown, 1), (
        f"{small.num_dofs} -> {large.num_dofs} DoFs: {r_s.bytes} -> {r_l.bytes} bytes\n"
        f"small:\n{r_s.report()}\nlarge:\n{r_l.report()}")
    assert r_l.bytes <= _bound(ml_l), r_l.report()


def test_a_deliberate_fine_vector_read_is_counted_and_breaks_the_bound():
    space, ml, reads = _setup(3, False)
    n = space.num_dofs
    with count_host_reads() as ctrl:
        d = ml.levels[-1].A.diagonal()
        d.get()                                                  # the control: O(DoFs) down
    assert ctrl.bytes >= 8 * n, ctrl.report()
    assert reads.bytes + ctrl.bytes > _bound(ml)


def test_chebyshev_setup_reads_back_o_levels_bytes():
    """Chebyshev's lambda_max by Lanczos on the device (two scalars a step), not on a host
    copy of each level's matrix; its estimate equals the host's to rounding."""
    space, ml, reads = _setup(3, False, "chebyshev")
    assert reads.bytes <= _bound(ml), reads.report()
    from adaptmg.multilevel.chebyshev import estimate_lambda_max
    lev = ml.levels[-1]
    sm = ml._dev[-1].smoother
    host = estimate_lambda_max(to_host(lev.A), to_host(sm.dinv))
    assert abs(1.1 * host - sm.lmax) <= 1e-10 * sm.lmax


def test_load_constrain_and_solve_read_back_scalars_only():
    space, ml, _ = _setup(3, False)
    be = get_backend("gpu")
    with count_host_reads() as load:
        b = ml.constrain(assemble.load(space, lambda x: 1.0 + 0.0 * x[..., 0], device=be))
        be.synchronize()
    assert load.bytes <= BASE, load.report()
    ml.solve(b, rtol=1e-8, accel="cg")                          # warm: graphs captured
    with count_host_reads() as solve:
        x = ml.solve(b, rtol=1e-8, accel="cg")
        be.synchronize()
    its = int(np.max(ml.last_iterations))
    assert 0 < its <= 30
    assert solve.bytes <= PER_ITERATION * its + BASE, f"{its} iterations:\n{solve.report()}"
    r = b - ml.levels[-1].A @ x
    assert float(be.xp.linalg.norm(r)) <= 1e-7 * float(be.xp.linalg.norm(b))


def test_galerkin_setup_stays_on_the_device_and_equals_the_host_one():
    """``galerkin=True``: the coarse matrices R K P by cuSPARSE on the device (no host copy of
    each level's matrix), equal to the host's SciPy products to rounding."""
    mesh = _adaptive(3, *CASES[3])
    space = adaptmg.Space(mesh, degree=1)
    cpu = adaptmg.multigrid(space, assemble.stiffness, galerkin=True, backend="cpu", coarse_max_rows=None)
    with count_host_reads() as reads:
        gpu = adaptmg.multigrid(space, assemble.stiffness, galerkin=True, backend="gpu",
                                coarse_max_rows=None)
    assert reads.bytes <= _bound(gpu), reads.report()
    assert len(cpu.levels) == len(gpu.levels)
    for lc, lg in zip(cpu.levels, gpu.levels):
        Ac, Ag = to_host(lc.A).tocsr(), to_host(lg.A).tocsr()
        assert Ac.shape == Ag.shape
        assert abs(Ac - Ag).max() <= 1e3 * np.finfo(np.float64).eps * abs(Ac).max()
