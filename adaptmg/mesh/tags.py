"""Named boundaries and regions: physical groups of a mesh file, and names in place of ids.

A mesh carries a boundary id on every boundary face (``Mesh.boundary_ids``) and a
region id on every cell (``Mesh.regions``), plus two name tables
``boundary_names`` / ``region_names`` (name -> id).  Wherever an id is accepted
(``dirichlet=``, ``Space.boundary_dofs(ids=...)``, the estimators' ``neumann_ids``,
:func:`adaptmg.assemble.boundary_load`), a name may stand in its place;
:func:`resolve` turns a mixed list into ids and refuses an unknown name with the
list of known ones.

On import the tags come from the lower-dimensional elements of the file (Gmsh
writes the boundary lines of a quad mesh, or the boundary quads of a hex mesh,
with their physical group): a facet F with tag t sets the boundary id of the
cell face whose vertex set equals F's corner set (:func:`facet_face_ids`, one
sort of the face keys, no loop over faces).  Sources, in this order:

* cell data ``gmsh:physical`` (Gmsh 2.2 and 4.1) or ``medit:ref`` per element,
  with the names of ``field_data`` (``{name: [tag, dim]}``: dim d - 1 names a
  boundary group, dim d a region);
* otherwise ``cell_sets`` (Abaqus element sets, meshio's cell sets): set k of
  facets becomes boundary id k + 1 under its own name, likewise for cell sets.
"""
from __future__ import annotations

import numbers
import warnings

import numpy as np

from . import reference as ref

__all__ = ["check_names", "resolve", "facet_face_ids", "physical_groups", "FACET_TYPES", "LOWER_TYPES"]

#: meshio cell types that can be the boundary facets of quads (2-D) / hexahedra (3-D); only
#: their first 2 / 4 nodes (the corners) are used
FACET_TYPES = {2: ("line", "line3"), 3: ("quad", "quad8", "quad9")}
#: lower-dimensional cell types a quad (2-D) / hex (3-D) mesh file may hold besides its cells
#: (physical points, curves, boundary faces as Gmsh writes them); all but the facets are skipped
LOWER_TYPES = {2: frozenset({"vertex", "line", "line3"}),
               3: frozenset({"vertex", "line", "line3", "quad", "triangle", "quad8", "quad9", "triangle6"})}
_TAG_KEYS = ("gmsh:physical", "medit:ref")


def check_names(names, what: str) -> tuple:
    """``names`` (a dict name -> non-negative int id, or pairs) as sorted ``(name, id)`` pairs."""
    if names is None:
        return ()
    items = names.items() if isinstance(names, dict) else names
    try:
        pairs = [(k, v) for k, v in items]
    except (TypeError, ValueError):
        raise TypeError(f"{what}_names must be a dict name -> id, got {type(names).__name__}") from None
    for k, v in pairs:
        if not isinstance(k, str) or not k:
            raise TypeError(f"{what}_names: names must be non-empty strings, got {k!r}")
        if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 0:
            raise ValueError(f"{what}_names[{k!r}] must be a non-negative integer id, got {v!r}")
    if len({k for k, _ in pairs}) != len(pairs):
        raise ValueError(f"{what}_names: a name is given twice")
    return tuple(sorted(((k, int(v)) for k, v in pairs), key=lambda kv: (kv[1], kv[0])))


def resolve(ids, names: dict, what: str = "boundary"):
    """Ids (int64 array) of ``ids``: an id, a name, or a list mixing both; None stays None.

    ``ValueError`` for an unknown name (listing the known ones), ``TypeError`` for anything
    that is neither an integer nor a string."""
    if ids is None:
        return None
    if isinstance(ids, str):
        ids = [ids]
    a = np.atleast_1d(np.asarray(ids))
    if a.size == 0 or a.dtype.kind in "iu":                 # plain ids: no per-item work
        return a.astype(np.int64).ravel()
    if a.dtype.kind not in "USO":
        raise TypeError(f"{what} ids must be integers or names, got {a.dtype} ({a.ravel()[:4].tolist()})")
    arr = np.atleast_1d(np.asarray(ids, dtype=object))      # names, maybe mixed with ids
    out = np.empty(arr.size, dtype=np.int64)
    for i, v in enumerate(arr.ravel().tolist()):      # the few ids the user listed
        if isinstance(v, str):
            if v not in names:
                known = ", ".join(f"{k!r} ({names[k]})" for k in sorted(names)) or "none"
                raise ValueError(f"unknown {what} name {v!r}; the mesh's {what} names are: {known}")
            out[i] = names[v]
        elif isinstance(v, numbers.Integral) and not isinstance(v, bool):
            out[i] = int(v)
        else:
            raise TypeError(f"{what} ids must be integers or names, got {v!r}")
    return out


def facet_face_ids(cells: np.ndarray, facets: np.ndarray, facet_ids: np.ndarray, default: int = 0):
    """(nc, 2d) ids of the cell faces: ``facet_ids[k]`` on the faces whose vertices are those of
    ``facets[k]`` (any order), ``default`` elsewhere; and the number of facets matching no face.

    Where several facets share a face the last one wins.  Interior faces may get ids too (the
    caller keeps only those of boundary faces)."""
    nc, nv = cells.shape
    dim = {4: 2, 8: 3}[nv]
    fv = ref.face_vertices(dim)
    out = np.full((nc, 2 * dim), default, dtype=np.int64)
    if facets.shape[0] == 0:
        return out, 0
    F = np.sort(cells[:, fv], axis=2).reshape(-1, fv.shape[1])
    Q = np.sort(facets, axis=1)
    # keep the last facet of each vertex set
    Qr = Q[::-1]
    _, first = np.unique(Qr, axis=0, return_index=True)
    Q, ids = Qr[first], np.asarray(facet_ids)[::-1][first]
    _, lab = np.unique(np.concatenate([F, Q]), axis=0, return_inverse=True)
    lab = lab.ravel()
    lf, lq = lab[:F.shape[0]], lab[F.shape[0]:]
    val = np.full(lab.max() + 1, -1, dtype=np.int64)
    hit = np.zeros(lab.max() + 1, dtype=bool)
    val[lq] = ids
    hit[lq] = True
    got = hit[lf]
    out.ravel()[got] = val[lf[got]]
    seen = np.zeros(lab.max() + 1, dtype=bool)
    seen[lf] = True
    return out, int((~seen[lq]).sum())


def _tag_of(m, i):
    """Per-element tag array of block i (first of :data:`_TAG_KEYS` present), or None."""
    for k in _TAG_KEYS:
        vs = (m.cell_data or {}).get(k)
        if vs is not None and len(vs) > i:
            return np.asarray(vs[i]).astype(np.int64).ravel()
    return None


def physical_groups(m, dim: int, cell_blocks):
    """Boundary facets and regions of a meshio mesh ``m`` (duck-typed: ``cells``,
    ``cell_data``, ``field_data``, ``cell_sets``) whose cells are the blocks ``cell_blocks``.

    Returns ``(facets (m, 2^(d-1)), facet ids, region per cell or None, boundary names,
    region names)``; facets in the mesh's original point numbering."""
    nfv = 2 ** (dim - 1)
    ftypes = FACET_TYPES[dim]
    fblocks = [i for i, b in enumerate(m.cells) if b.type in ftypes]
    sizes = [len(m.cells[i].data) for i in cell_blocks]
    has_tags = any(k in (m.cell_data or {}) for k in _TAG_KEYS)
    bnames, rnames = {}, {}
    for name, v in (getattr(m, "field_data", None) or {}).items():
        a = np.asarray(v).ravel()
        if a.shape == (2,) and a.dtype.kind in "iu" and a[0] >= 0:
            if int(a[1]) == dim - 1:
                bnames[str(name)] = int(a[0])
            elif int(a[1]) == dim:
                rnames[str(name)] = int(a[0])
    if has_tags:
        fids = [_tag_of(m, i) for i in fblocks]
        keep = [j for j, t in enumerate(fids) if t is not None]
        fblocks, fids = [fblocks[j] for j in keep], [fids[j] for j in keep]
        rparts = [_tag_of(m, i) for i in cell_blocks]
        region = None if any(r is None for r in rparts) else np.concatenate(rparts)
    else:
        fids = [np.full(len(m.cells[i].data), -1, dtype=np.int64) for i in fblocks]
        region = None
        off = np.cumsum([0] + sizes)
        for name, parts in (getattr(m, "cell_sets", None) or {}).items():
            parts = list(parts) + [None] * (len(m.cells) - len(parts))
            fk = [_set_part(parts[i], len(m.cells[i].data), name) for i in fblocks]
            ck = [_set_part(parts[i], len(m.cells[i].data), name) for i in cell_blocks]
            if any(a.size for a in fk):
                bnames[str(name)] = bid = max(bnames.values(), default=0) + 1
                for ids, a in zip(fids, fk):
                    ids[a] = bid
            if any(a.size for a in ck):
                rnames[str(name)] = rid = max(rnames.values(), default=0) + 1
                region = np.zeros(off[-1], dtype=np.int64) if region is None else region
                for o, a in zip(off, ck):
                    region[o + a] = rid
    if fblocks:
        facets = np.concatenate([np.asarray(m.cells[i].data)[:, :nfv] for i in fblocks]).astype(np.int64)
        ids = np.concatenate(fids)
        facets, ids = facets[ids >= 0], ids[ids >= 0]
    else:
        facets, ids = np.zeros((0, nfv), dtype=np.int64), np.zeros(0, dtype=np.int64)
    return facets, ids, region, bnames, rnames


def _set_part(a, n, name):
    """The element indices of one block of a cell set, checked against the block size n."""
    a = np.zeros(0, dtype=np.int64) if a is None else np.asarray(a).ravel()
    if a.size and (a.dtype.kind not in "iu" or a.min() < 0 or a.max() >= n):
        raise ValueError(f"cell set {name!r} refers to elements outside a block of {n}")
    return a.astype(np.int64)


def warn_unmatched(n: int, where: str):
    """Warn that ``n`` tagged boundary elements match no cell face (they are ignored)."""
    if n:
        warnings.warn(f"{where}: {n} tagged boundary element(s) match no face of a cell; "
                      "their tags are ignored", stacklevel=3)
