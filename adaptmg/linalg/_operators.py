"""Operator normalisation shared by the Krylov solvers.

Whatever the caller passes as ``A`` or ``M`` becomes an :class:`Operator`, a
callable ``y = op(x)`` on 1-D vectors of the *working backend* (the one that
holds ``b``):

* matrices (SciPy/cupyx sparse, dense NumPy/CuPy) are moved to the working
  backend *once*;
* foreign operators (SciPy or cupyx ``LinearOperator`` objects, objects with
  ``matvec`` or ``@``, plain callables) are called as they are, with their
  input/output moved only when they live on the other side (a SciPy
  ``LinearOperator`` on the host while ``b`` is on the GPU, or a cupyx
  ``LinearOperator`` while ``b`` is on the host).

Arguments are classified with an error that names the argument and the shapes
involved (TypeError for objects that are no operator, ValueError for wrong
shapes).  The prepared system built from them is in :mod:`._system`, the fused
vector updates of the solvers in :mod:`._vectorops`.
"""
from __future__ import annotations

from typing import Optional

import numpy as np
import scipy.sparse as sp
import scipy.sparse.linalg as spla

from ..backend import (CPU, Backend, get_backend, is_device_array, is_device_linear_operator,
                       is_device_sparse)

__all__ = ["Operator", "as_operator", "classify", "shifted", "side_of", "is_cupyx_sparse",
           "NUMERIC_KINDS"]

NUMERIC_KINDS = "biufc"


# --------------------------------------------------------------------------
# classification of operator-like objects
# --------------------------------------------------------------------------
def _is_cupyx_linear_operator(A) -> bool:
    return is_device_linear_operator(A) and callable(getattr(A, "matvec", None))


def is_cupyx_sparse(A) -> bool:
    return is_device_sparse(A) and not _is_cupyx_linear_operator(A) and hasattr(A, "tocsr")


def _is_dense(A) -> bool:
    if isinstance(A, np.ndarray):
        return True
    return (is_device_array(A) and not is_cupyx_sparse(A)
            and hasattr(A, "ndim") and hasattr(A, "dtype") and hasattr(A, "shape")
            and not _is_cupyx_linear_operator(A))


def _shape_of(A) -> Optional[tuple]:
    shape = getattr(A, "shape", None)
    try:
        shape = tuple(int(s) for s in shape)
    except (TypeError, ValueError):
        return None
    return shape


def _dtype_of(A, name: str) -> Optional[np.dtype]:
    dtype = getattr(A, "dtype", None)
    if dtype is None:
        return None
    try:
        dtype = np.dtype(dtype)
    except TypeError:
        return None
    if dtype.kind not in NUMERIC_KINDS:
        raise TypeError(f"{name} must have a numeric dtype, got dtype {dtype}")
    return dtype


def classify(A, name: str):
    """Return (kind, shape, dtype) for an operator-like ``A``; TypeError if unusable.

    kind is one of "sparse", "dense", "scipy-linop", "cupyx-linop", "matvec",
    "matmul", "callable".
    """
    if A is None or isinstance(A, (str, bytes)):
        raise TypeError(f"{name} must be a sparse or dense matrix, a LinearOperator, "
                        f"an object with a matvec method or a callable, "
                        f"got {type(A).__name__}")
    if isinstance(A, spla.LinearOperator):
        kind = "scipy-linop"
    elif _is_cupyx_linear_operator(A):
        kind = "cupyx-linop"
    elif sp.issparse(A) or is_cupyx_sparse(A):
        kind = "sparse"
    elif _is_dense(A):
        kind = "dense"
        if A.ndim != 2:
            raise ValueError(f"{name} must be a 2-D matrix (expected 2-D, got an array of "
                             f"shape {A.shape})")
    elif callable(getattr(A, "matvec", None)):
        kind = "matvec"
    elif hasattr(type(A), "__matmul__"):
        kind = "matmul"
    elif callable(A):
        kind = "callable"
    else:
        raise TypeError(f"{name} must be a sparse or dense matrix, a LinearOperator, "
                        f"an object with a matvec method or a callable, "
                        f"got {type(A).__name__}")
    shape = _shape_of(A) if kind != "callable" else None
    if shape is not None:
        if len(shape) != 2:
            raise ValueError(f"{name} must be a 2-D operator (expected 2-D, got shape {shape})")
        if shape[0] != shape[1]:
            raise ValueError(f"{name} must be square, got shape {shape}")
    dtype = _dtype_of(A, name) if kind != "callable" else None
    return kind, shape, dtype


# --------------------------------------------------------------------------
# operators
# --------------------------------------------------------------------------
#: Attribute by which an operator object (``matvec``/``@``/LinearOperator/callable)
#: declares that each of its results is a newly allocated array the caller may
#: overwrite; the Krylov solvers then skip their defensive copy of ``A v`` or ``M v``.
FRESH_RESULT = "adaptmg_fresh_result"
#: Attribute by which an operator object offers ``obj.adaptmg_apply_into(x, out)``: its
#: result written into ``out``, a contiguous vector of the working backend (the dtype may
#: differ from the object's own: the method casts).  Flexible GMRES then applies the
#: preconditioner straight into its ``Z`` basis (no temporary, no copy).
APPLY_INTO = "adaptmg_apply_into"


class Operator:
    """A square linear (or, for a preconditioner, possibly nonlinear) map on the backend.

    ``op(x)`` takes a 1-D array of length ``n`` on ``backend`` and returns one.
    ``fresh`` is True when every result is a newly allocated array that the
    caller may overwrite (matrix products); results of foreign callables may
    alias their input or an internal buffer and must be copied before being
    written to.  ``op.into(x, out)`` writes ``op(x)`` into ``out`` (a contiguous
    vector of the backend and dtype): without a temporary where the object offers
    :data:`APPLY_INTO`, else a copy of ``op(x)``.
    """

    __slots__ = ("name", "n", "dtype", "backend", "kind", "fresh", "_apply", "_into")

    def __init__(self, name, n, dtype, backend, kind, fresh, apply, into=None):
        self.name, self.n, self.dtype = name, n, dtype
        self.backend, self.kind, self.fresh = backend, kind, fresh
        self._apply = apply
        self._into = into

    def into(self, x, out):
        if self._into is not None:
            self._into(x, out)
        else:
            out[...] = self._apply(x)
        return out

    @property
    def shape(self):
        return (self.n, self.n)

    def __call__(self, x):
        return self._apply(x)

    def __repr__(self):
        return (f"Operator({self.name}, kind={self.kind}, shape={self.shape}, "
                f"dtype={self.dtype}, backend={self.backend.name})")


def _foreign(f, name, n, dtype, backend: Backend, side: Backend):
    """Wrap a foreign callable living on ``side`` so that it maps backend vectors."""
    convert_in = side.name != backend.name

    def apply(x):
        y = f(side.asarray(x) if convert_in else x)
        y = backend.asarray(y)
        if y.shape != (n,):
            if y.size != n:
                raise ValueError(f"{name} returned an array of shape {y.shape} for an "
                                 f"input of shape ({n},)")
            y = y.reshape(n)
        if y.dtype != dtype:
            y = y.astype(dtype)
        return y

    return apply


def as_operator(A, n: int, dtype, backend: Backend, name: str = "A",
                classified=None, side: Optional[Backend] = None) -> Operator:
    """Normalise ``A`` into an :class:`Operator` of size ``n`` on ``backend``.

    Matrices are converted to ``dtype`` and moved to ``backend`` once (sparse
    ones as CSR); other objects are wrapped.  Raises TypeError for objects that
    are not operators and ValueError when the shape is not ``(n, n)``.
    ``side``: where a plain callable (or ``matvec``/``@`` object) expects its
    input (default: the working backend), e.g. the host for the ``psolve`` of a
    SciPy ``LinearOperator``.
    """
    kind, shape, _ = classified if classified is not None else classify(A, name)
    if shape is not None and shape != (n, n):
        raise ValueError(f"{name} has shape {shape} but the system has size {n}; "
                         f"expected shape ({n}, {n})")
    dtype = np.dtype(dtype)
    if kind == "sparse":
        mat = backend.asmatrix(A, dtype=dtype)
        return Operator(name, n, dtype, backend, kind, True, mat.__matmul__)
    if kind == "dense":
        mat = backend.asarray(A, dtype=dtype)
        return Operator(name, n, dtype, backend, kind, True, mat.__matmul__)
    if kind == "scipy-linop":
        side, f = CPU, A.matvec
    elif kind == "cupyx-linop":
        side, f = get_backend("gpu"), A.matvec
    elif kind == "matvec":
        side, f = side or backend, A.matvec
    elif kind == "matmul":
        side, f = side or backend, A.__matmul__
    else:
        side, f = side or backend, A
    # an object may declare that every result is a new array (FRESH_RESULT) and offer
    # to write its result into a given vector (APPLY_INTO; only where it computes on
    # the working backend: no transfer in between)
    into = getattr(A, APPLY_INTO, None) if side.name == backend.name else None
    return Operator(name, n, dtype, backend, kind, bool(getattr(A, FRESH_RESULT, False)),
                    _foreign(f, name, n, dtype, backend, side),
                    into if callable(into) else None)


def side_of(A) -> Optional[Backend]:
    """Where an operator object computes: the host for SciPy objects, the GPU for
    cupyx ones, None (the working backend) for anything else."""
    if isinstance(A, spla.LinearOperator) or sp.issparse(A) or isinstance(A, np.ndarray):
        return CPU
    if _is_cupyx_linear_operator(A) or is_cupyx_sparse(A) or is_device_array(A):
        return get_backend("gpu")
    return None


def shifted(op: Operator, shift) -> Operator:
    """The operator ``x -> op(x) - shift * x`` (a fresh result each call)."""
    sigma = op.dtype.type(shift)

    def apply(x):
        y = op(x)
        if not op.fresh:
            y = y.copy()
        y -= sigma * x
        return y

    return Operator(op.name, op.n, op.dtype, op.backend, op.kind, True, apply)


