"""Programmatic dependent launch (adaptmg.device.pdl): the source contract and, on a GPU,
graphs recorded with it against graphs recorded without it."""
import re

import numpy as np
import pytest

from adaptmg.device import pdl
from adaptmg.device import gs_split
from adaptmg.device import kernels as K
from adaptmg.linalg import graph_cg

# set-up data: CSR structure and values of A, R, R A, A P, P, S, the diagonal, a dense
# matrix, the rows of a row-compressed block (grow) -- never written by a kernel of a graph,
# so a kernel may read them before the wait
SETUP = {"indptr", "indices", "data", "ap", "ai", "ad", "sp", "si", "sd", "rp", "ri", "rd",
         "qp", "qi", "qd", "pp", "pi", "pd", "dinv", "M", "grow",
         "nodes", "bptr", "nlow", "bcol", "bval", "dval", "binv"}     # the split GS plan's


def _kernels(src):
    """(name, pointer parameters, body) of every kernel of a with_grid_wait'ed source."""
    return [(re.search(r"void\s+(\w+)", head).group(1),
             set(re.findall(r"\*\s*(?:__restrict__\s*)?(\w+)\s*[,)]", head)), src[start:end])
            for head, start, end in pdl.kernels(src)]


def test_grid_wait_inserted_where_missing():
    src = ('extern "C" __global__ void a(int n, double* x) { if (n) { x[0] = 1; } }\n'
           'extern "C" __global__ void b(const int* __restrict__ ip, double* x)\n{\n'
           '    int k = ip[0];\n    ADAPTMG_GRID_WAIT();\n    x[k] = 0;\n}\n')
    out = pdl.with_grid_wait(src)
    assert out.startswith(pdl.GRID_WAIT_SOURCE)
    bodies = {name: body for name, _, body in _kernels(out)}
    assert bodies["a"].lstrip().startswith("ADAPTMG_GRID_WAIT();")
    assert bodies["a"].count("ADAPTMG_GRID_WAIT()") == 1
    assert bodies["b"].count("ADAPTMG_GRID_WAIT()") == 1          # its own, after the prologue
    assert bodies["b"].index("ip[0]") < bodies["b"].index("ADAPTMG_GRID_WAIT()")
    assert pdl.with_grid_wait("__device__ int f() { return 1; }").endswith("return 1; }")


@pytest.mark.parametrize("src, count", [(K._CSR_SRC, 4), (graph_cg._SRC, 4),
                                        (gs_split._SPLIT_SRC.replace("{C}", "3").replace("{PRE}", "true")
                                         .replace("{SUFFIX}", "_pre"), 1)],
                         ids=["csr", "graph_cg", "gs_split"])
def test_kernels_read_only_setup_data_before_the_wait(src, count):
    """The PDL contract, read off the source: in every kernel, each path meets the wait,
    and the code before a wait (back to the kernel head, an earlier wait or an else
    branch) names no pointer argument but set-up data (vectors are written by the kernel
    before, which may still run)."""
    kernels = _kernels(pdl.with_grid_wait(src.replace("{T}", "double")))
    assert len(kernels) >= count
    for name, params, body in kernels:
        assert "ADAPTMG_GRID_WAIT()" in body, name
        lines = body.split("\n")
        for i, line in enumerate(lines):
            if "ADAPTMG_GRID_WAIT()" not in line:
                continue
            j = i - 1
            while j >= 0 and "ADAPTMG_GRID_WAIT()" not in lines[j] and "} else {" not in lines[j]:
                used = set(re.findall(r"(?<![.\w])(\w+)\b", lines[j])) & params
                assert used <= SETUP, (name, lines[j], used - SETUP)
                j -= 1
    # the branches of the fused pre-smoothing/restriction each wait once
    body = dict((n, b) for n, _, b in kernels).get("adaptmg_csr_smooth_restrict_double")
    if body is not None:
        assert body.count("ADAPTMG_GRID_WAIT()") == 2


@pytest.mark.gpu
def test_graph_cg_with_and_without_programmatic_launches(monkeypatch):
    """GraphCG recorded with PDL (the default on compute capability >= 9.0) and without it
    (ADAPTMG_PDL=0): the same iterations and the same solution to round-off, and the
    programmatic launches are really made where the device supports them."""
    from adaptmg.backend import get_backend, to_host
    from adaptmg.assemble.testing import tensor_prolongation, tensor_q1_stiffness
    from adaptmg.multilevel import MultilevelSolver
    gpu = get_backend("gpu")
    cp = gpu.xp
    ns = [4 * 2 ** l for l in range(6)]                 # 2-D Q1, 16 -> 128 cells a side
    As = [tensor_q1_stiffness(n, 2) for n in ns]
    Ps = [tensor_prolongation(n, 2) for n in ns[:-1]]
    b = gpu.asarray(np.random.default_rng(3).standard_normal(As[-1].shape[0]))
    real = pdl._cu_launch_kernel_ex()
    calls = []

    def counting(*args):
        calls.append(1)
        return real(*args)
    results = {}
    for flag in ("0", "1"):
        monkeypatch.setenv("ADAPTMG_PDL", flag)
        if real is not None:
            monkeypatch.setitem(pdl._driver, "fn", counting)
        calls.clear()
        ml = MultilevelSolver.from_matrices(As, Ps, backend=gpu)
        x = to_host(ml.solve(b, rtol=1e-8, accel="cg"))
        g = ml._graph_cg("V")
        assert g is not None, ml.graph_error
        results[flag] = (x, g.iterations, len(calls))
    cc = int(cp.cuda.Device().compute_capability)
    assert results["0"][2] == 0
    assert (results["1"][2] > 0) == (cc >= 90 and real is not None)
    assert results["1"][1] == results["0"][1]
    x0, x1 = results["0"][0], results["1"][0]
    assert np.linalg.norm(x1 - x0) <= 64 * np.finfo(np.float64).eps * np.linalg.norm(x0)
