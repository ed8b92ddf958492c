r"""Reading pyamg's level smoothers and mapping each to adaptmg's (for :func:`from_pyamg`).

pyamg keeps the smoothers of level ``i`` as callables (``functools.partial`` objects or
closures made by ``pyamg.relaxation.smoothing.change_smoothers``) whose parameters sit in
the partial's keywords or the closure's cells.  :func:`_map_pyamg` reads them and returns
the :class:`_Spec` of adaptmg's closest smoother (the table in
:mod:`adaptmg.multilevel.pyamg`); :func:`_level_smoother` builds one smoother object of a
level from its (pre, post) specs: one smoother, one and its adjoint (forward/backward
Gauss-Seidel, C/F and F/C Jacobi) or a :class:`PrePostSmoother`.
"""
from __future__ import annotations

import functools
import numbers
from dataclasses import dataclass, field

import numpy as np

from ..backend import get_backend
from .pyamg_relax import closure_values
from .smoothers import CFJacobi, Jacobi, PrePostSmoother, make_smoother

def _pyamg_params(fn):
    """(name, parameters) of a pyamg level smoother (partial or closure), or (None, {})."""
    if fn is None:
        return "none", {}
    if isinstance(fn, functools.partial):
        return getattr(fn.func, "__name__", None), dict(fn.keywords or {})
    if getattr(fn, "__code__", None) is None:
        return None, {}
    return getattr(fn, "__name__", None), closure_values(fn)


def _short(params, keys):
    out = []
    for k in keys:
        if k in params:
            v = params[k]
            out.append(f"{k}={v!r}" if isinstance(v, str) else f"{k}={float(v):.4g}"
                       if isinstance(v, (float, np.floating)) else f"{k}={v}")
    return ", ".join(out)


@dataclass
class _Spec:
    """The adaptmg smoother chosen for one pyamg smoother."""
    kind: str                      # registry name or "none"
    kwargs: dict = field(default_factory=dict)
    iterations: int = 1
    exact: bool = True
    source: str = ""               # pyamg's smoother, e.g. "gauss_seidel(sweep='symmetric')"
    instead: str = ""              # what adaptmg runs and why it is not the same (inexact only)

    def key(self):
        return (self.kind, tuple(sorted(self.kwargs.items())))


def _chebyshev_from_coefficients(coef):
    """(degree, lmax, lower) of the Chebyshev smoother whose polynomial pyamg stores."""
    coef = np.asarray(coef, dtype=np.float64).ravel()
    k = coef.size
    if k == 0:
        raise ValueError("empty Chebyshev polynomial")
    q = np.r_[-coef, 1.0]                       # residual polynomial 1 - t p(t), highest first
    roots = np.roots(q)
    if np.abs(roots.imag).max(initial=0.0) > 1e-8 * np.abs(roots).max(initial=1.0):
        raise ValueError("Chebyshev polynomial with complex roots")
    roots = np.sort(roots.real)
    if k == 1:
        lower = 1.0 / 33.0                      # any interval centred at the root: same polynomial
        lmax = 2.0 * roots[0] / (1.0 + lower)
        return 1, float(lmax), lower
    cos0 = np.cos(np.pi / (2 * k))
    c = 0.5 * (roots[-1] + roots[0])
    h = 0.5 * (roots[-1] - roots[0]) / cos0
    a, b = c - h, c + h
    if not (0 < a < b):
        raise ValueError(f"Chebyshev interval [{a}, {b}] is not positive")
    return k, float(b), float(a / b)


def _blocksize(A):
    bs = getattr(A, "blocksize", None)
    return int(bs[0]) if bs is not None and bs[0] == bs[1] else 1


_MISSING = object()


class _Array:
    """An array in a :class:`_Spec`'s ``kwargs`` (a C/F splitting, pyamg's ``Dinv``): equal by
    content, so that two specs of the same level compare as they should."""

    def __init__(self, a):
        self.a = np.asarray(a)

    def __eq__(self, other):
        return (isinstance(other, _Array) and self.a.shape == other.a.shape
                and bool(np.array_equal(self.a, other.a)))

    def __hash__(self):
        return hash((self.a.shape, self.a.tobytes()))

    def __lt__(self, other):         # never reached (kwargs keys are unique); sorted() needs it
        return id(self) < id(other)


_CF_NAMES = ("cf_jacobi", "fc_jacobi", "cf_block_jacobi", "fc_block_jacobi")


def _cf_spec(name, p, it):
    """The :class:`_Spec` of :class:`CFJacobi` for pyamg's C/F Jacobi ``name`` with the
    partial's keywords ``p`` (``Cpts``/``Fpts``: C and F nodes of the level); None when the
    keywords do not describe a splitting."""
    Cp = np.asarray(p.get("Cpts", ()), dtype=np.int64).ravel()
    Fp = np.asarray(p.get("Fpts", ()), dtype=np.int64).ravel()
    N = Cp.size + Fp.size
    both = np.concatenate([Cp, Fp])
    if N == 0 or both.min() < 0 or both.max() >= N or np.bincount(both, minlength=N).max() > 1:
        return None
    split = np.zeros(N, bool)
    split[Cp] = True
    c = int(p.get("blocksize", 1) or 1)
    block = name.endswith("block_jacobi") and c > 1
    kw = {"splitting": _Array(split), "order": name[:2], "omega": float(p["omega"]),
          "f_iterations": int(p.get("f_iterations", 1)), "c_iterations": int(p.get("c_iterations", 1)),
          "block": block}
    if block and p.get("Dinv") is not None:
        kw["Dinv"] = _Array(p["Dinv"])
    src = f"{name}({_short(p, ('blocksize', 'omega', 'iterations', 'f_iterations', 'c_iterations'))})"
    return _Spec("cf_jacobi", kw, it, True, src)


def _map_pyamg(fn, A):
    """The :class:`_Spec` of adaptmg's closest smoother to pyamg's level smoother ``fn``."""
    if fn is _MISSING:          # a level pyamg never smooths (its coarsest): adaptmg's default
        return _Spec("gauss_seidel", {"sweep": "symmetric"}, 1, True, "(none)")
    name, p = _pyamg_params(fn)
    it = p.get("iterations", 1)
    it = int(it) if isinstance(it, numbers.Integral) and it >= 0 else 1
    bs = _blocksize(A)
    if name == "none":
        return _Spec("none", {}, 0, True, "None")
    if name == "jacobi" and "omega" in p:
        return _Spec("jacobi", {"omega": float(p["omega"]), "singular": "pinv"}, it, True,
                     f"jacobi({_short(p, ('omega', 'iterations'))})")
    if name == "block_jacobi" and "omega" in p:
        c = int(p.get("blocksize", bs) or 1)
        return _Spec("block_jacobi", {"omega": float(p["omega"]), "block_size": c,
                                      "singular": "pinv"}, it, True,
                     f"block_jacobi({_short(p, ('blocksize', 'omega', 'iterations'))})")
    if name == "richardson" and "omega" in p:
        return _Spec("richardson", {"omega": float(p["omega"])}, it, True,
                     f"richardson({_short(p, ('omega', 'iterations'))})")
    if name == "chebyshev" and "coefficients" in p:
        src = f"chebyshev(degree={np.size(p['coefficients'])}, iterations={it})"
        try:
            k, lmax, lower = _chebyshev_from_coefficients(p["coefficients"])
        except (ValueError, np.linalg.LinAlgError) as exc:
            kind, kw = ("block_gauss_seidel", {"block_size": bs}) if bs > 1 else ("gauss_seidel", {})
            return _Spec(kind, kw | {"sweep": "symmetric"}, it, False, src,
                         f"symmetric multicolour GS (cannot read the polynomial: {exc})")
        return _Spec("chebyshev", {"degree": k, "lmax": lmax, "lower": lower, "scaling": "none"},
                     it, True, src)
    if name in ("gauss_seidel", "block_gauss_seidel", "sor"):
        sweep = p.get("sweep", "forward")
        if sweep not in ("forward", "backward", "symmetric"):
            sweep = "symmetric"
        kw = {"sweep": sweep, "singular": "pinv"}        # zero diagonals / blocks as pyamg
        c = int(p.get("blocksize", 1) or 1) if name == "block_gauss_seidel" else 1
        if c > 1:
            kw["block_size"] = c
        if name == "sor":
            kw["omega"] = float(p.get("omega", 1.0))
        what = ("multicolour SOR" if name == "sor" else
                "multicolour block GS" if c > 1 else "multicolour GS")
        src = f"{name}({_short(p, ('blocksize', 'omega', 'sweep', 'iterations'))})"
        return _Spec("block_gauss_seidel" if c > 1 else "gauss_seidel", kw, it, False, src,
                     f"{what} (sweep={sweep!r}): colour order, not pyamg's lexicographic order")
    if name in _CF_NAMES and "omega" in p:
        spec = _cf_spec(name, p, it)
        if spec is not None:
            return spec
        c = int(p.get("blocksize", 1) or 1)
        kind = "block_jacobi" if c > 1 else "jacobi"
        kw = {"omega": float(p["omega"]), "singular": "pinv"} | ({"block_size": c} if c > 1 else {})
        src = f"{name}({_short(p, ('omega', 'iterations', 'f_iterations', 'c_iterations'))})"
        return _Spec(kind, kw, it, False, src,
                     f"{kind.replace('_', ' ')} (omega={float(p['omega']):.4g}) on all points, "
                     "not C/F-ordered")
    label = name or type(fn).__name__
    src = f"{label}({_short(p, ('sweep', 'omega', 'iterations'))})"
    kw = ({"block_size": bs} if bs > 1 else {}) | {"sweep": "symmetric", "singular": "pinv"}
    return _Spec("block_gauss_seidel" if bs > 1 else "gauss_seidel", kw, it, False, src,
                 "symmetric multicolour " + ("block GS" if bs > 1 else "GS") +
                 " (adaptmg has no equivalent of this smoother)")


class _NoSmoothing:
    """pyamg's ``None`` smoother: leaves ``x`` as it is (zero from a zero initial guess)."""

    _adaptmg_smoother = True
    name = "none"

    def __init__(self, n, backend, dtype):
        self.n, self.backend, self.dtype = n, backend, np.dtype(dtype)
        self.note = None

    def to(self, backend="cpu", dtype=None):
        be = get_backend(backend)
        dt = np.dtype(dtype) if dtype is not None else self.dtype
        return self if (be, dt) == (self.backend, self.dtype) else _NoSmoothing(self.n, be, dt)

    def smooth(self, x, b, sweeps=1, work=None, zero_initial=False):
        if zero_initial:
            x.fill(0)
        return x

    smooth_adjoint = smooth

    def __repr__(self):
        return "NoSmoothing()"


_SELF_ADJOINT = ("jacobi", "block_jacobi", "richardson", "chebyshev", "none")


def _is_self_adjoint(s):
    return s.kind in _SELF_ADJOINT or s.kwargs.get("sweep") == "symmetric"


def _adjoint_pair(pre, post):
    """pre = forward/backward GS and post = the same GS with the reverse sweep, or pre =
    C/F Jacobi and post the same half-sweeps in the reverse order (cf <-> fc)."""
    if pre.kind != post.kind or pre.kind not in ("gauss_seidel", "block_gauss_seidel",
                                                 "cf_jacobi"):
        return False
    what, pair = (("order", {"cf", "fc"}) if pre.kind == "cf_jacobi" else
                  ("sweep", {"forward", "backward"}))
    a, b = dict(pre.kwargs), dict(post.kwargs)
    sa, sb = a.pop(what, None), b.pop(what, None)
    return a == b and {sa, sb} == pair


def _build(spec, A, be, dtype):
    if spec.kind == "none":
        return _NoSmoothing(A.shape[0], be, dtype)
    if spec.kind == "jacobi":
        return Jacobi(A, backend=be, dtype=dtype, **spec.kwargs)
    if spec.kind == "cf_jacobi":
        kw = {k: v.a if isinstance(v, _Array) else v for k, v in spec.kwargs.items()}
        return CFJacobi(A, backend=be, dtype=dtype, **kw)
    return make_smoother(spec.kind, A, backend=be, dtype=dtype, **spec.kwargs)


def _level_smoother(spec_pair, A, be, dtype, per_level):
    """One adaptmg smoother object for a level from its (pre, post) specs."""
    pre, post = spec_pair
    m_pre, m_post = (pre.iterations, post.iterations) if per_level else (1, 1)
    s_pre = _build(pre, A, be, dtype)
    if pre.key() == post.key() and _is_self_adjoint(pre):
        single, s_post = True, s_pre
    elif _adjoint_pair(pre, post):
        single, s_post = True, None              # post = s_pre.smooth_adjoint
    else:
        single = False
        s_post = s_pre if pre.key() == post.key() else _build(post, A, be, dtype)
    if single and m_pre == m_post:
        if m_pre == 1:
            return s_pre
        if s_post is s_pre:
            return PrePostSmoother(s_pre, s_pre, m_pre, m_post)
    if s_post is None:
        s_post = _build(post, A, be, dtype)
    return PrePostSmoother(s_pre, s_post, m_pre, m_post)
