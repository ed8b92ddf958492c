r"""Canonical cell keys of a refinement forest, and a local forest rebuilt from leaf keys.

A cell of a forest is identified by its root (a cell of the coarse mesh), its level ``k``
and its child digits ``c_1 .. c_k`` (child ``c`` of a cell has the bits
``(c & 1, c >> 1 & 1, c >> 2 & 1)`` along x, y, z: its Morton digit, as in
:mod:`.partition`).  With ``r`` the root's position in the Morton order of the root
centroids (:func:`.partition._root_ranks`, computed on the replicated coarse mesh, so every
rank gets the same ``r``), ``d`` the dimension and ``L`` = :attr:`KeyCodec.lmax` the deepest
level a key can hold, the key is the int64

.. math::  \mathrm{key} = \Bigl(\bigl(r \cdot 2^{dL} + \textstyle\sum_{j=1}^{k}
           c_j\, 2^{d(L - j)}\bigr) \cdot 2^{B}\Bigr) + k, \qquad B = 5 \text{ level bits}.

Sorting keys sorts cells by (root position, c_1, c_2, ..., missing digits as 0, level):
the preorder of a depth-first walk along the Z-curve, an ancestor just before its first
descendant.  Leaves (no two of them nested) therefore sort in the curve order of
:func:`.partition.curve_order`, and a key never depends on a rank's forest-local ids (each
rank creates cells and nodes in its own order): keys are what ranks exchange.

:func:`build_local` makes a serial :class:`~adaptmg.mesh._tree.Forest` whose leaves are
exactly the given keys: the roots they need (a subset of the coarse mesh, its points
compacted), then one vectorised :meth:`Forest.split` per level of the ancestors the keys
need.  Its nodes are made by the forest's registries, so two local leaves share a node
where they share a point, and every node's coordinates are the parents' means of the
serial forest (the same for any P on meshes whose coarse cells are oriented alike, e.g.
:meth:`Mesh.box`).
"""
from __future__ import annotations

import numpy as np

from ..backend import is_device_array
from ..mesh import Mesh
from ..mesh._tree import Forest
from .partition import _root_ranks

__all__ = ["KeyCodec", "root_positions", "forest_keys", "build_local", "LEVEL_BITS"]

LEVEL_BITS = 5
_LEVEL_MASK = (1 << LEVEL_BITS) - 1


def _i64(a):
    """``a`` as int64 in its own array module (a device array stays on the device)."""
    return a.astype(np.int64, copy=False) if is_device_array(a) else np.asarray(a, dtype=np.int64)


class KeyCodec:
    """Packing of (root position, level, child digits) into one int64 for a coarse mesh of
    ``num_roots`` cells in ``dim`` dimensions (module docstring); ``lmax`` levels fit."""

    def __init__(self, dim: int, num_roots: int):
        if dim not in (2, 3):
            raise ValueError(f"KeyCodec: dimension must be 2 or 3, got {dim}")
        if num_roots < 1:
            raise ValueError(f"KeyCodec: need at least one root cell, got {num_roots}")
        rb = max(num_roots - 1, 1).bit_length()
        self.dim, self.nv = dim, 2 ** dim
        self.lmax = min((63 - LEVEL_BITS - rb) // dim, _LEVEL_MASK)
        if self.lmax < 1:
            raise ValueError(f"KeyCodec: {num_roots} root cells leave no bits for refinement levels")
        self.root_shift = LEVEL_BITS + dim * self.lmax

    def check_level(self, level: int) -> None:
        """ValueError if cells of ``level`` (the deepest a refinement makes) have no key."""
        if level > self.lmax:
            raise ValueError(f"refinement to level {level}: cell keys of a {self.dim}-D forest with "
                             f"this many roots hold at most {self.lmax} levels")

    def _shift(self, level):
        """Bit position of the digit of ``level`` (array, host or device, or int)."""
        return LEVEL_BITS + self.dim * (self.lmax - _i64(level))

    def roots(self, position: np.ndarray) -> np.ndarray:
        """Keys of the root cells at curve positions ``position``."""
        return np.asarray(position, dtype=np.int64) << self.root_shift

    def root_of(self, keys: np.ndarray) -> np.ndarray:
        """Curve position of the root of each key."""
        return np.asarray(keys, dtype=np.int64) >> self.root_shift

    @staticmethod
    def level(keys: np.ndarray) -> np.ndarray:
        """Refinement level of each key (host or device arrays)."""
        return _i64(keys) & _LEVEL_MASK

    def ancestor(self, keys: np.ndarray, level: int) -> np.ndarray:
        """Keys of the ancestors at ``level`` (<= each key's level) of ``keys``."""
        s = int(self._shift(level))
        return ((np.asarray(keys, dtype=np.int64) >> s) << s) | level

    def child(self, keys: np.ndarray, digit: np.ndarray) -> np.ndarray:
        """Key of child ``digit`` (0 .. 2^d - 1) of each key (elementwise, broadcasting)."""
        keys = np.asarray(keys, dtype=np.int64)
        k = keys & _LEVEL_MASK
        return ((keys & ~_LEVEL_MASK) | (np.asarray(digit, dtype=np.int64) << self._shift(k + 1))) | (k + 1)

    def children(self, keys: np.ndarray) -> np.ndarray:
        """(n * 2^d,) keys of all children of ``keys``, child digits fastest (sorted if
        ``keys`` is: the children of a cell come before the next cell's subtree)."""
        keys = np.asarray(keys, dtype=np.int64)
        return self.child(keys[:, None], np.arange(self.nv, dtype=np.int64)[None, :]).reshape(-1)


def root_positions(coarse_forest: Forest) -> np.ndarray:
    """Curve position of every root cell (forest ids 0 .. num_roots - 1) of an unrefined forest."""
    return _root_ranks(coarse_forest, np.arange(coarse_forest.num_cells, dtype=np.int64))


def forest_keys(forest: Forest, codec: KeyCodec, root_pos: np.ndarray) -> np.ndarray:
    """Key of every cell of a serial ``forest`` (its roots at curve positions ``root_pos``,
    indexed by root forest id): top down, one vectorised step per level."""
    key = np.full(forest.num_cells, -1, dtype=np.int64)
    front = np.flatnonzero(forest.cell_level == 0)
    key[front] = codec.roots(np.asarray(root_pos)[front])
    codec.check_level(int(forest.cell_level.max()))
    while front.size:
        c0 = forest.cell_child0[front]
        has = c0 >= 0
        front, c0 = front[has], c0[has]
        kids = (c0[:, None] + np.arange(codec.nv)).reshape(-1)
        key[kids] = codec.children(key[front])
        front = kids
    return key


def sorted_unique(a: np.ndarray) -> np.ndarray:
    """The distinct values of a non-decreasing 1-D array (one comparison pass; np.unique
    would hash or sort again)."""
    if a.size < 2:
        return a
    keep = np.empty(a.size, dtype=bool)
    keep[0] = True
    np.not_equal(a[1:], a[:-1], out=keep[1:])
    return a[keep]


def _sub_coarse(coarse: Forest, roots: np.ndarray) -> Forest:
    """The unrefined forest of the root cells ``roots`` of ``coarse`` (points compacted)."""
    cn = coarse.cell_nodes[roots]
    used, inv = np.unique(cn, return_inverse=True)
    region = None if coarse.cell_region is None else coarse.cell_region[roots]
    return Forest.from_coarse(coarse.X[used], inv.reshape(cn.shape), coarse.cell_bface[roots], region,
                              coarse.boundary_names, coarse.region_names)


def build_local(coarse: Forest, codec: KeyCodec, root_pos: np.ndarray, keys: np.ndarray):
    """``(mesh, fkey)``: a serial mesh whose active cells are the leaves ``keys`` (distinct,
    none an ancestor of another) of the forest over the unrefined ``coarse`` forest, and the
    key of every cell of its forest.  ``mesh.cell_ids`` are sorted forest ids, so the mesh's
    cell order is not the key order: ``fkey[mesh.cell_ids]`` are the cells' keys.  No keys: an
    empty mesh (a rank idle on a folded level)."""
    keys = np.asarray(keys, dtype=np.int64)
    if keys.size > 1 and not bool((keys[1:] >= keys[:-1]).all()):   # often sorted already
        keys = np.sort(keys)
    keys = sorted_unique(keys)
    if keys.size == 0:
        none = np.zeros(0, dtype=np.int64)
        return Mesh(_sub_coarse(coarse, none), none), none
    lev = codec.level(keys)
    by_pos = np.argsort(root_pos)                  # root forest id at each curve position
    rpos = codec.root_of(keys)
    if rpos.min() < 0 or rpos.max() >= by_pos.size or lev.max() > codec.lmax:
        raise ValueError("build_local: keys outside the coarse mesh's roots or levels")
    upos = np.unique(rpos)                          # local roots in curve order
    F = _sub_coarse(coarse, by_pos[upos])
    lvl_keys = [codec.roots(upos)]
    fkeys = [lvl_keys[0]]
    for lv in range(int(lev.max())):
        anc = sorted_unique(codec.ancestor(keys[lev > lv], lv))   # keys sorted: so are these
        at = np.searchsorted(lvl_keys[lv], anc)
        if (at >= lvl_keys[lv].size).any() or (lvl_keys[lv][np.minimum(at, lvl_keys[lv].size - 1)] != anc).any():
            raise ValueError("build_local: inconsistent keys")
        nc = F.num_cells
        F = F.split(at + (nc - lvl_keys[lv].size))  # the cells of level lv are the last ones
        kids = codec.children(anc)
        lvl_keys.append(kids)
        fkeys.append(kids)
    fkey = np.concatenate(fkeys)
    # forest ids of the leaves: level by level, the keys of a level are one sorted block
    base = np.cumsum([0] + [k.size for k in lvl_keys])
    ids = np.empty(keys.size, dtype=np.int64)
    for lv in range(len(lvl_keys)):
        sel = np.flatnonzero(lev == lv)
        if sel.size:
            ids[sel] = base[lv] + np.searchsorted(lvl_keys[lv], keys[sel])
    if (fkey[ids] != keys).any() or (F.cell_child0[ids] >= 0).any():
        raise ValueError("build_local: the keys are not the leaves of one forest (nested or duplicate cells)")
    active = np.zeros(F.num_cells, dtype=bool)     # the distinct ids, sorted: a mask, no sort
    active[ids] = True
    return Mesh(F, np.flatnonzero(active)), fkey
