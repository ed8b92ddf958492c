"""Seed 003: prehandling by hierarchical bases and partial Cholesky, and the Schur-complement
direct method (M1) with dense inverses applied in fp64 / fp32 / fp16.

Modules: ``macro`` (uniform refinement of a quad macro mesh, node classes C / E / I and
their numbering), ``hierarchical`` (the transform S, the partial Cholesky L, the assembled
prehandled matrix), ``schur`` (method M1), ``spectrum`` (condition numbers), ``half``
(CG in half precision: the attainable accuracy of Figure 5).
"""
from .half import HalfCGResult, half_cg, round_half
from .hierarchical import PartialCholesky, fine_stiffness, global_transform, local_transform, prehandled_matrix
from .macro import RefinedMacroMesh, macro_square, macro_square_with_hole
from .schur import SchurSolver
from .spectrum import condition_number, lanczos_max

__all__ = ["RefinedMacroMesh", "macro_square", "macro_square_with_hole", "local_transform",
           "global_transform", "fine_stiffness", "prehandled_matrix", "PartialCholesky", "SchurSolver", "condition_number", "lanczos_max",
           "half_cg", "HalfCGResult", "round_half"]
