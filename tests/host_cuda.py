"""CUDA kernels of adaptmg's RawModules run on the host, for tests without a GPU.

:class:`HostXP` stands in for the part of CuPy that adaptmg's kernel launchers use
(``RawModule(code).get_function(name)``, ``empty``, ``zeros``): a kernel's own source is
compiled by g++ with a small shim (``__global__``/``__device__`` vanish, ``__shared__``
becomes ``static``, ``__syncthreads`` a ``std::barrier``) and launched with one
``std::thread`` per CUDA thread, the blocks of a 1-D or 2-D grid one after another; device
arrays are NumPy arrays (fresh ones NaN, so a kernel that leaves an entry unwritten is
seen).  Index arithmetic, argument order, block shapes and barriers are exercised; warp
shuffles and atomics are not available.  The ``host_gpu`` fixture of ``tests/conftest.py``
makes ``get_backend("gpu")`` answer such a backend.
"""
import ctypes
import shutil
import subprocess

import numpy as np

HAVE_GXX = shutil.which("g++") is not None

_SHIM = r"""
#include <algorithm>
#include <barrier>
#include <thread>
#include <vector>
using std::min; using std::max;
struct adaptmg_dim3 { unsigned x, y, z; };
static thread_local adaptmg_dim3 threadIdx;
static adaptmg_dim3 blockIdx, blockDim, gridDim;
static std::barrier<>* adaptmg_bar;
#define __global__
#define __device__
#define __forceinline__ inline
#define __shared__ static
#define __restrict__ __restrict
#define __launch_bounds__(...)
static void __syncthreads() { adaptmg_bar->arrive_and_wait(); }
struct alignas(16) double2 { double x, y; };
struct alignas(8) float2 { float x, y; };
static inline double2 make_double2(double x, double y) { return {x, y}; }
static inline float2 make_float2(float x, float y) { return {x, y}; }
"""

_LAUNCH = r"""
struct adaptmg_vp { void* p; template <class P> operator P*() const { return (P*)p; } };
extern "C" void launch(int gx, int gy, int bx, int by, int bz{PARAMS})
{
    gridDim = {(unsigned)gx, (unsigned)gy, 1u};
    for (int by_ = 0; by_ < gy; ++by_)
    for (int bx_ = 0; bx_ < gx; ++bx_) {                 // blocks one after another
        blockIdx = {(unsigned)bx_, (unsigned)by_, 0u};
        blockDim = {(unsigned)bx, (unsigned)by, (unsigned)bz};
        const int nt = bx * by * bz;
        std::barrier<> bar(nt);
        adaptmg_bar = &bar;
        std::vector<std::thread> threads;
        for (int t = 0; t < nt; ++t)
            threads.emplace_back([&, t] {
                threadIdx = {(unsigned)(t % bx), (unsigned)((t / bx) % by), (unsigned)(t / (bx * by))};
                {NAME}({ARGS});
                bar.arrive_and_drop();                    // an exited thread leaves the barrier
            });
        for (auto& th : threads) th.join();
    }
}
"""

_SCALARS = {np.int64: ("long long", ctypes.c_longlong), np.int32: ("int", ctypes.c_int),
            np.float64: ("double", ctypes.c_double), np.float32: ("float", ctypes.c_float),
            np.uintp: ("void*", ctypes.c_void_p)}        # np.uintp(0): a null pointer argument


class HostFunction:
    """A CUDA kernel of a RawModule run on the host (see the module docstring)."""

    libs = {}

    def __init__(self, code, name, tmp):
        self.code, self.name, self.tmp = code, name, tmp

    def __call__(self, grid, block, args, shared_mem=0):
        grid = tuple(int(g) for g in grid) + (1,) * (2 - len(grid))
        assert len(grid) == 2 and min(grid) > 0, grid
        kinds = tuple("array" if isinstance(a, np.ndarray) else type(a) for a in args)
        key = (self.code, self.name, kinds)
        if key not in self.libs:
            params = "".join(f", {'void*' if k == 'array' else _SCALARS[k][0]} a{i}"
                             for i, k in enumerate(kinds))
            call = ", ".join(f"adaptmg_vp{{a{i}}}" if k in ("array", np.uintp) else f"a{i}"
                             for i, k in enumerate(kinds))
            launch = _LAUNCH.replace("{PARAMS}", params).replace("{ARGS}", call).replace("{NAME}", self.name)
            cpp = self.tmp / f"k{len(self.libs)}.cpp"
            cpp.write_text(_SHIM + self.code + launch)
            lib = cpp.with_suffix(".so")
            p = subprocess.run(["g++", "-std=c++20", "-O1", "-w", "-shared", "-fPIC", "-pthread", str(cpp),
                                "-o", str(lib)], capture_output=True, text=True)
            assert p.returncode == 0, p.stderr[-3000:]
            self.libs[key] = ctypes.CDLL(str(lib))
        block = tuple(block) + (1,) * (3 - len(block))
        cargs = [a.ctypes.data_as(ctypes.c_void_p) if k == "array"
                 else ctypes.c_void_p(int(a)) if k is np.uintp else _SCALARS[k][1](a)
                 for a, k in zip(args, kinds)]
        self.libs[key].launch(*(ctypes.c_int(g) for g in grid), *(ctypes.c_int(int(b)) for b in block),
                              *cargs)


class HostXP:
    """The part of CuPy the launchers use, on the host; fresh arrays are NaN."""

    def __init__(self, tmp):
        self.tmp = tmp

    def RawModule(self, code):
        return type("HostModule", (), {"get_function": lambda _, name: HostFunction(code, name, self.tmp)})()

    @staticmethod
    def empty(shape, dtype):
        """Poisoned: NaN for floats, the extreme value for integers (what a kernel leaves
        unwritten shows)."""
        dt = np.dtype(dtype)
        fill = np.nan if dt.kind in "fc" else np.iinfo(dt).min if dt.kind == "i" else \
            np.iinfo(dt).max if dt.kind == "u" else 0
        return np.full(shape, fill, dtype=dt)

    zeros = staticmethod(np.zeros)
