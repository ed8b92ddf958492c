"""Q1 (k = 1) on the GPU as a 27-point (2D: 9-point) stencil.

At k = 1 a vertex patch has one interior DoF, the vertex itself, so the
patch-smoother step of seed 000 (eq. 2.8 with the exact local solve) is point
Gauss-Seidel: with the assembled 1D rows ``m = Mb = (1/6, 4/6, 1/6)`` and
``a = Ab = (-1, 2, -1)`` (two reference cells, :func:`~.tensor.patch_matrices`)
every interior row of the operator is the same stencil

    w[o2, o1, o0] = c0 a[o0] m[o1] m[o2] + c1 m[o0] a[o1] m[o2] + c2 m[o0] m[o1] a[o2]

(2D: ``w[o1, o0] = c0 a[o0] m[o1] + c1 m[o0] a[o1]``), offsets o in {-1, 0, 1}
(x first in ``c``), zero outside the Dirichlet domain, and one colour of the
smoother is

    x_j <- x_j + (b_j - sum_o w_o x_{j+o}) / w_0      for all vertices j of the colour.

The patch kernels of :mod:`.kernels` run this with one thread block per few
patches and 9 threads per patch, which leaves them latency-bound.  Here the
colour kernel has one thread per DoF of the colour, reading its neighbours
through the caches, and the operator kernel one thread per segment of a
z-column (each plane's 3 x 3 neighbourhood loaded once for three outputs), so
both are close to memory-bound (one read of ``x`` per colour; one read and
write for the operator).  A sweep (:meth:`GpuQ1Stencil.sweep`) runs the two
colours that differ in the x parity only in one launch, one block a row of
their (y, z) parities: every colour reads all of ``x``, so this halves the
traffic of a sweep (2^(d-1) reads of ``x`` instead of 2^d).  The arithmetic is
the same up to the order of the sums.
"""
from __future__ import annotations

import functools

import numpy as np

from ..backend import get_backend
from .cuda_build import _TYPES
from .tensor import patch_matrices

__all__ = ["q1_stencil", "distinct_weights", "stencil_source", "GpuQ1Stencil"]


def q1_stencil(space) -> np.ndarray:
    """The Q1 operator's stencil on ``space`` (k = 1), shape (3, 3, 3), float64,
    indexed ``[o2, o1, o0]`` (numpy order, offset + 1); in 2D the planes
    ``o2 = +-1`` are zero and ``[1]`` holds the 9-point stencil."""
    if space.k != 1:
        raise ValueError(f"the Q1 stencil needs k = 1, got k = {space.k}")
    Mb, Ab, _, _ = patch_matrices(1)
    m, a = Mb[0], Ab[0]
    c = space.coeffs
    if space.dim == 2:
        w2 = c[0] * np.multiply.outer(m, a) + c[1] * np.multiply.outer(a, m)   # [o1, o0]
        w = np.zeros((3, 3, 3))
        w[1] = w2
        return w
    return (c[0] * np.einsum("k,j,i->kji", m, m, a) + c[1] * np.einsum("k,j,i->kji", m, a, m)
            + c[2] * np.einsum("k,j,i->kji", a, m, m))


def distinct_weights(w) -> np.ndarray:
    """The 8 distinct entries ``wd[4|o2| + 2|o1| + |o0|]`` of a stencil that is even in
    every direction (the Q1 stencil is: ``m`` and ``a`` are); ValueError otherwise."""
    w = np.asarray(w, dtype=np.float64)
    if not all(np.array_equal(w, np.flip(w, ax)) for ax in range(3)):
        raise ValueError("the stencil kernels need a stencil even in every direction")
    return w[1:, 1:, 1:].ravel().copy()


# The stencil is even in every direction (m and a are), so it has 8 distinct
# weights wd[4|o2| + 2|o1| + |o0|] (kept in registers).  plane_sums(j2) sums
# plane j2's 3 x 3 neighbourhood of (i0, i1) with the weights of |o2| = 0 (s0)
# and |o2| = 1 (s1): output i2 = s1(i2 - 1) + s0(i2) + s1(i2 + 1), zero outside the
# domain.  Grids are (x tiles, y, z); grid-stride loops in y and z keep levels with
# more than 65535 rows or planes launchable.
_STENCIL = r"""
typedef $T T;
// plane j2's 3 x 3 neighbourhood of (i0, i1) grouped by (|o1|, |o0|): c = row i1, e = rows
// i1 +- 1; 0 = the column i0, 1 = the columns i0 +- 1 (zero outside the domain)
__device__ __forceinline__ void plane_groups(const T* __restrict__ x, int i0, int i1, int j2,
                                             int N0, int N1, T& c0, T& c1, T& e0, T& e1)
{
    const long long plane = (long long)N0 * N1;
    c0 = 0; c1 = 0; e0 = 0; e1 = 0;
    #pragma unroll
    for (int o1 = -1; o1 <= 1; ++o1) {
        const int j1 = i1 + o1;
        if (j1 < 0 || j1 >= N1) continue;
        const T* row = x + j2 * plane + (long long)j1 * N0;
        const T v0 = row[i0];
        T v1 = 0;
        if (i0 > 0) v1 += row[i0 - 1];
        if (i0 + 1 < N0) v1 += row[i0 + 1];
        if (o1 == 0) { c0 = v0; c1 = v1; } else { e0 += v0; e1 += v1; }
    }
}

__device__ __forceinline__ void plane_sums(const T* __restrict__ x, const T (&wd)[8], int i0,
                                           int i1, int j2, int N0, int N1, T& s0, T& s1)
{
    T c0, c1, e0, e1;
    plane_groups(x, i0, i1, j2, N0, N1, c0, c1, e0, e1);
    s0 = wd[0] * c0 + wd[1] * c1 + wd[2] * e0 + wd[3] * e1;
    s1 = wd[4] * c0 + wd[5] * c1 + wd[6] * e0 + wd[7] * e1;
}

__device__ __forceinline__ void load_weights(const T* __restrict__ w, T (&wd)[8])
{
    #pragma unroll
    for (int c = 0; c < 8; ++c) wd[c] = w[c];
}

// y <- alpha A x + beta Y  (beta == 0: Y is not read), Y = y ("apply") or another
// vector z ("apply_z": the residual b - A x in one pass, no copy of b first).  A thread
// walks ZB outputs along z and reads each plane's 3 x 3 neighbourhood once for the three
// outputs it enters (~9 loads an output instead of 27: the 27-load form was L1-bound).
#define ZB $ZB
$APPLY_KERNELS
// one colour of point Gauss-Seidel: the DoFs i = c + 2 m, m < P (x first)
extern "C" __global__ void __launch_bounds__(128)
adaptmg_q1_color_$NAME(T* __restrict__ x, const T* __restrict__ b, const T* __restrict__ w,
                       int N0, int N1, int N2, int c0, int c1, int c2, int P0, int P1, int P2,
                       T dinv)
{
    const int m0 = blockIdx.x * blockDim.x + threadIdx.x;
    if (m0 >= P0) return;
    T wd[8];
    load_weights(w, wd);
    const int i0 = c0 + 2 * m0;
    const long long plane = (long long)N0 * N1;
    for (int m2 = blockIdx.z; m2 < P2; m2 += gridDim.z)
        for (int m1 = blockIdx.y; m1 < P1; m1 += gridDim.y) {
            const int i1 = c1 + 2 * m1, i2 = c2 + 2 * m2;
            T s = 0, s0, s1;
            if (i2 > 0) { plane_sums(x, wd, i0, i1, i2 - 1, N0, N1, s0, s1); s += s1; }
            plane_sums(x, wd, i0, i1, i2, N0, N1, s0, s1);
            s += s0;
            if (i2 + 1 < N2) { plane_sums(x, wd, i0, i1, i2 + 1, N0, N1, s0, s1); s += s1; }
            const long long g = i2 * plane + (long long)i1 * N0 + i0;
            x[g] += (b[g] - s) * dinv;
        }
}

// Two colours in one launch: (0, py, pz) then (1, py, pz) (rev: the other way round), a
// block a row (i1, i2) of parities (py, pz), thread j the pair of points 2j, 2j + 1.  The
// row holds every point of both colours in it, and no other block writes it, so the
// first colour reads its x-neighbours (the second colour's points) before the barrier
// and the second colour reads the first one's new values from shared memory after it;
// the other rows and planes hold other colours, which this launch does not change.
__device__ __forceinline__ T off_row_sums(const T* __restrict__ x, const T (&wd)[8], int i0, int i1,
                                          int i2, int N0, int N1, int N2, T& c0, T& c1)
{
    // the 27-point sum at i0 without the row's own x-neighbours, wd[1] c1; c0 = x[i0],
    // c1 = x[i0 - 1] + x[i0 + 1]
    T s = 0, s0, s1, e0, e1;
    if (i2 > 0) { plane_sums(x, wd, i0, i1, i2 - 1, N0, N1, s0, s1); s += s1; }
    plane_groups(x, i0, i1, i2, N0, N1, c0, c1, e0, e1);
    s += wd[0] * c0 + wd[2] * e0 + wd[3] * e1;
    if (i2 + 1 < N2) { plane_sums(x, wd, i0, i1, i2 + 1, N0, N1, s0, s1); s += s1; }
    return s;
}

extern "C" __global__ void __launch_bounds__(1024, $PMINB)
adaptmg_q1_rowpair_$NAME(T* __restrict__ x, const T* __restrict__ b, const T* __restrict__ w,
                         int N0, int N1, int N2, int py, int pz, int P1, int P2, int rev, T dinv)
{
    __shared__ T first[1026];                 // first[1 + j]: the first colour's new value in pair j
    T wd[8];
    load_weights(w, wd);
    const int j = threadIdx.x, npair = (N0 + 1) / 2;
    const long long plane = (long long)N0 * N1;
    if (j == 0) { first[0] = 0; first[npair + 1] = 0; }
    for (int m2 = blockIdx.y; m2 < P2; m2 += gridDim.y)
        for (int m1 = blockIdx.x; m1 < P1; m1 += gridDim.x) {
            const int i1 = py + 2 * m1, i2 = pz + 2 * m2;
            const long long r = i2 * plane + (long long)i1 * N0;
            const int ia = 2 * j + rev, ib = 2 * j + 1 - rev;     // first / second colour's point
            const bool has_a = j < npair && ia < N0, has_b = j < npair && ib < N0;
            T ca = 0, cb = 0, ua = 0, ub = 0, sa = 0, sb = 0;
            if (has_a) sa = off_row_sums(x, wd, ia, i1, i2, N0, N1, N2, ca, ua);
            if (has_b) sb = off_row_sums(x, wd, ib, i1, i2, N0, N1, N2, cb, ub);
            // the first colour: its row neighbours ia -+ 1 (ua) are second-colour points, old
            T na = 0;
            if (has_a) na = ca + (b[r + ia] - (sa + wd[1] * ua)) * dinv;
            if (j < npair) first[1 + j] = na;
            __syncthreads();
            // the second colour: its row neighbours are the first colour's new values
            if (has_b) {
                // rev = 0: ib = 2j + 1 lies between pairs j and j + 1; rev = 1: ib = 2j, between j - 1, j
                const T nbr = rev ? first[j] + first[1 + j] : first[1 + j] + first[2 + j];
                x[r + ib] = cb + (b[r + ib] - (sb + wd[1] * nbr)) * dinv;
            }
            if (has_a) x[r + ia] = na;
            __syncthreads();                  // first[] is rewritten by the next row
        }
}
"""


_APPLY = r"""extern "C" __global__ void __launch_bounds__(128)
adaptmg_q1_$KIND_$NAME(const T* __restrict__ x, T* __restrict__ y,$ZARG const T* __restrict__ w,
                       int N0, int N1, int N2, T alpha, T beta)
{
    const int i0 = blockIdx.x * blockDim.x + threadIdx.x;
    if (i0 >= N0) return;
    T wd[8];
    load_weights(w, wd);
    const long long plane = (long long)N0 * N1;
    for (int zs = blockIdx.z * ZB; zs < N2; zs += gridDim.z * ZB)
        for (int i1 = blockIdx.y; i1 < N1; i1 += gridDim.y) {
            const int ze = min(zs + ZB, N2);
            T prev = 0, cur = 0;              // partial outputs j2 - 1 and j2
            for (int j2 = zs - 1; j2 <= ze; ++j2) {
                T s0 = 0, s1 = 0;
                if (j2 >= 0 && j2 < N2) plane_sums(x, wd, i0, i1, j2, N0, N1, s0, s1);
                if (j2 - 1 >= zs) {           // output j2 - 1 is complete
                    const long long g = (j2 - 1) * plane + (long long)i1 * N0 + i0;
                    const T a = prev + s1;
                    y[g] = beta == (T)0 ? alpha * a : alpha * a + beta * $Y[g];
                }
                prev = cur + s0;              // output j2: s1(j2 - 1) + s0(j2)
                cur = s1;                     // output j2 + 1: s1(j2)
            }
        }
}
"""


def stencil_source(dtype):
    """CUDA source and kernel names (apply, apply_z, colour, row pair) of the Q1
    stencil kernels."""
    T = _TYPES[np.dtype(dtype)]
    name = "f64" if T == "double" else "f32"
    kernels = "\n".join(_APPLY.replace("$KIND", kind).replace("$ZARG", zarg).replace("$Y", y)
                         for kind, zarg, y in (("apply", "", "y"),
                                               ("apply_z", " const T* __restrict__ z,", "z")))
    src = _STENCIL.replace("$APPLY_KERNELS\n", kernels + "\n").replace("$T", T) \
        .replace("$NAME", name).replace("$ZB", str(_ZB)).replace("$PMINB", str(_PAIR_MINB))
    return src, tuple(f"adaptmg_q1_{kind}_{name}" for kind in ("apply", "apply_z", "color", "rowpair"))


@functools.lru_cache(maxsize=None)
def _kernels(dtype_str):
    cp = get_backend("gpu").xp
    src, names = stencil_source(np.dtype(dtype_str))
    mod = cp.RawModule(code=src, options=("-std=c++17",))
    return tuple(mod.get_function(n) for n in names)


_THREADS = 128
_GRID_MAX = 65535
_ZB = 8                 # outputs along z per thread of the apply kernel (ZB in the source)
_PAIR_MAX = 1024        # x-pairs a row the row-pair kernel takes (one thread each)
_PAIR_MINB = 2          # its register cap: 2 blocks of 1024 threads an SM (32 registers)


class GpuQ1Stencil:
    """Launcher of the Q1 stencil kernels for one space (k = 1, 2D or 3D) and dtype."""

    def __init__(self, space, dtype):
        w = q1_stencil(space)
        self.dtype = np.dtype(dtype)
        cp = get_backend("gpu").xp
        self.cp = cp
        T = self.dtype.type
        self.w = cp.asarray(distinct_weights(w), dtype=self.dtype)
        self.dinv = T(1.0 / w[1, 1, 1])
        n = tuple(space.n1d) + (1,) * (3 - space.dim)          # x first
        self.n = tuple(np.int32(v) for v in n)
        self.apply_kernel, self.apply_z_kernel, self.color_kernel, self.pair_kernel = \
            _kernels(self.dtype.str)

    def _grid(self, n0, n1, n2):
        return (-(-n0 // _THREADS), min(n1, _GRID_MAX), min(n2, _GRID_MAX))

    def apply(self, u, out=None, alpha=1.0, beta=0.0, z=None):
        """``out <- alpha A u + beta z`` with ``z = out`` by default (a new array when
        ``out`` is None); ``z = b, alpha = -1, beta = 1`` is the residual in one pass.
        ``out`` must not overlap ``u``, nor ``z`` unless it is ``out``."""
        if out is None:
            out = self.cp.empty_like(u)
            if z is None:
                beta = 0.0
        T = self.dtype.type
        n0, n1, n2 = map(int, self.n)
        grid = self._grid(n0, n1, -(-n2 // _ZB))
        if z is None or z is out:
            self.apply_kernel(grid, (_THREADS,), (u, out, self.w) + self.n + (T(alpha), T(beta)))
        else:
            self.apply_z_kernel(grid, (_THREADS,),
                                (u, out, z, self.w) + self.n + (T(alpha), T(beta)))
        return out

    def color(self, x, b, col, cnt):
        """One colour (parities ``col``, ``cnt`` vertices per direction, x first) of
        point Gauss-Seidel, in place."""
        col = tuple(col) + (0,) * (3 - len(col))
        cnt = tuple(cnt) + (1,) * (3 - len(cnt))
        self.color_kernel(self._grid(*cnt), (_THREADS,),
                          (x, b, self.w) + self.n + tuple(np.int32(c) for c in col)
                          + tuple(np.int32(c) for c in cnt) + (self.dinv,))

    def sweep(self, x, b, reverse=False):
        """One sweep of point Gauss-Seidel over all colours, in place, in the order of
        :func:`~.smoother.patch_colors` (x parity fastest; ``reverse``: backwards).  The
        two colours that differ in the x parity only run in one launch (a block a row:
        four launches in 3D instead of eight, each reading ``x`` once); rows of more
        than 2 * 1024 DoFs take the colours one by one."""
        n0, n1, n2 = map(int, self.n)
        npair = (n0 + 1) // 2
        order = [(py, pz) for pz in (0, 1) for py in (0, 1)]
        if reverse:
            order.reverse()
        for py, pz in order:
            p1, p2 = len(range(py, n1, 2)), len(range(pz, n2, 2))
            if p1 == 0 or p2 == 0:
                continue
            if npair > _PAIR_MAX:
                for px in ((1, 0) if reverse else (0, 1)):
                    p0 = len(range(px, n0, 2))
                    if p0:
                        self.color(x, b, (px, py, pz), (p0, p1, p2))
                continue
            self.pair_kernel((min(p1, _GRID_MAX), min(p2, _GRID_MAX)), (-(-npair // 32) * 32,),
                             (x, b, self.w) + self.n + (np.int32(py), np.int32(pz), np.int32(p1),
                                                        np.int32(p2), np.int32(reverse), self.dinv))
