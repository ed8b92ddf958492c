#!/usr/bin/env bash
# Run the test suite under several BLAS configurations and fail if any run fails.
#
# Why: floating-point results that go through BLAS/LAPACK (GEMM, GEMV, dot, LU) depend on
# the kernel that OpenBLAS picks for the CPU (blocking, FMA or not, vector width) and on
# its thread count.  A test that asserts bit-for-bit equality between two such results
# (e.g. one GEMM of 2n rows against two of n rows) can pass on the developer's machine
# and fail on another CPU (issue 12).  Tests must hold for every kernel and thread count:
# exact where both sides run the same operations in the same order, otherwise a
# tolerance in units of machine epsilon times the operator's norm.
#
# What: the suite runs four times,
#   (a) the CPU's own kernels (OpenBLAS auto-detection), 1 BLAS thread,
#   (b) the CPU's own kernels, 2 BLAS threads,
#   (c) OPENBLAS_CORETYPE=Haswell      (AVX2 + FMA kernels), 1 thread,
#   (d) OPENBLAS_CORETYPE=Sandybridge  (AVX kernels, no FMA), 1 thread,
# each printing "coretype=<..> threads=<..>: <pytest summary line>".  (c) and (d) differ
# from (a) in the kernels only, (b) in the thread count only; on a machine whose own
# kernels are Haswell's (AVX2 CPUs, including AMD Zen), (a) and (c) coincide.  A forced
# core type whose instructions the CPU lacks would crash (SIGILL); such a run is skipped.
#
# NumPy and SciPy wheels each bundle their own OpenBLAS (numpy: scipy_openblas64_, the
# ILP64 build; scipy: scipy_openblas); OPENBLAS_CORETYPE and OPENBLAS_NUM_THREADS apply
# to both, and the script prints which kernels each of them actually selected.
# OMP_NUM_THREADS is set to the same count (OpenMP builds of OpenBLAS read it).
#
# Usage: scripts/check_portability.sh [pytest args]     (default: tests)
#   PYTHON=/path/to/python   interpreter (default .venv/bin/python)
#   CONFIGS="default:1 Sandybridge:2 ..."  coretype:threads pairs to run instead of (a)-(d)
set -euo pipefail

cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
CONFIGS=${CONFIGS:-"default:1 default:2 Haswell:1 Sandybridge:1"}
if [ "$#" -eq 0 ]; then
    set -- tests
fi

LOGDIR=$(mktemp -d "${TMPDIR:-/tmp}/check_portability.XXXXXX")

# which BLAS NumPy and SciPy were built against, and the kernels each loaded OpenBLAS uses
BLAS_INFO='
import ctypes, numpy, scipy, scipy.linalg
def blas(mod):
    try:
        b = mod.show_config(mode="dicts")["Build Dependencies"]["blas"]
        return "%s %s" % (b.get("name"), b.get("version"))
    except Exception:
        return "unknown"
cores = []
try:
    paths = sorted({l.split()[-1] for l in open("/proc/self/maps") if "openblas" in l and ".so" in l})
except OSError:
    paths = []
for p in paths:
    lib = ctypes.CDLL(p)
    for sym in ("scipy_openblas_get_corename64_", "scipy_openblas_get_corename",
                "openblas_get_corename64_", "openblas_get_corename"):
        f = getattr(lib, sym, None)
        if f is not None:
            f.restype = ctypes.c_char_p
            g = getattr(lib, sym.replace("corename", "num_threads"), None)
            nt = " x%d" % g() if g is not None else ""
            cores.append("%s=%s%s" % (p.rsplit("/", 1)[-1], f().decode(), nt))
            break
print("numpy BLAS: %s; scipy BLAS: %s; kernels: %s"
      % (blas(numpy), blas(scipy), ", ".join(cores) or "unknown (not OpenBLAS?)"))
'

cpu_has() {   # cpu_has FLAG...: all flags present in /proc/cpuinfo (true where it is unreadable)
    [ -r /proc/cpuinfo ] || return 0
    local flags f
    flags=" $(grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2) "
    for f in "$@"; do
        case "$flags" in *" $f "*) ;; *) return 1 ;; esac
    done
}

status=0
for cfg in $CONFIGS; do
    core=${cfg%%:*}
    threads=${cfg##*:}
    case "$core" in
        Haswell|Zen)        need="avx2 fma" ;;
        Sandybridge)        need="avx" ;;
        SkylakeX|Cooperlake|SapphireRapids) need="avx512f" ;;
        *)                  need="" ;;
    esac
    # shellcheck disable=SC2086
    if [ -n "$need" ] && ! cpu_has $need; then
        echo "coretype=$core threads=$threads: skipped (CPU lacks $need)"
        continue
    fi
    env=(OPENBLAS_NUM_THREADS="$threads" OMP_NUM_THREADS="$threads")
    if [ "$core" != "default" ]; then
        env+=(OPENBLAS_CORETYPE="$core")
    fi
    log="$LOGDIR/$core-$threads.log"
    echo "  [$(env -u OPENBLAS_CORETYPE "${env[@]}" "$PY" -c "$BLAS_INFO" 2>&1 | tail -n 1)]"
    rc=0
    env -u OPENBLAS_CORETYPE "${env[@]}" "$PY" -m pytest -q -p no:cacheprovider "$@" >"$log" 2>&1 || rc=$?
    echo "coretype=$core threads=$threads: $(tail -n 1 "$log")"
    if [ "$rc" -ne 0 ]; then
        status=1
        grep -E '^(FAILED|ERROR) ' "$log" | sed 's/^/    /' || true
        echo "    (pytest exit status $rc; full log: $log)"
    fi
done

if [ "$status" -eq 0 ]; then
    rm -rf "$LOGDIR"
    echo "all BLAS configurations passed"
else
    echo "some BLAS configuration failed (logs in $LOGDIR)" >&2
fi
exit "$status"
