"""Boundary ids, regions and their names in the files adaptmg writes.

* Gmsh (2.2 and 4.1): the boundary faces become elements of dimension d - 1
  (lines in 2-D, quads in 3-D), one block per boundary id, with the id as
  their physical tag; the cells carry their region id as physical tag; the
  names go to ``$PhysicalNames`` (meshio's ``field_data``, ``{name: [id, dim]}``).
  Gmsh 4.1 keeps one physical tag per entity, so the cells are written one
  block per region there (cells of several regions come back grouped by region),
  and the nodes grouped by the entity they are classified on (a mesh read back
  has its nodes renumbered: same points and cells, another node order).
* VTU / XDMF: the ``boundary_ids`` and ``region`` cell arrays, and the names as
  VTK ``FieldData`` / an XDMF ``Information`` element in the same
  ``{name: [id, dim]}`` form.

:func:`adaptmg.mesh.tags.physical_groups` reads all of them back.
"""
from __future__ import annotations

import json
from xml.sax.saxutils import quoteattr

import numpy as np

from ..mesh import reference as ref

GMSH_FORMATS = ("gmsh", "gmsh22")
FACET_TYPE = {2: "line", 3: "quad"}


def field_data(mesh) -> dict:
    """The name tables of ``mesh`` as ``{name: array([id, dim])}`` (Gmsh's convention)."""
    d = mesh.dim
    both = set(mesh.boundary_names) & set(mesh.region_names)
    if both:
        raise ValueError(f"the names {sorted(both)} name both a boundary and a region; mesh files "
                         "keep one table of names (rename one with mesh.with_names)")
    out = {k: np.array([v, d - 1]) for k, v in mesh.boundary_names.items()}
    out.update({k: np.array([v, d]) for k, v in mesh.region_names.items()})
    return out


def gmsh_blocks(mesh, cells_vtk, cd, version41):
    """Cell blocks and cell data (per block) for Gmsh; for 4.1 also the node order to write.

    Returns ``(blocks [(type, array)], cell_data {name: [per block]}, nodes)`` with ``nodes``
    None (2.2) or ``(perm, gmsh:dim_tags)``: the file lists node ``perm[k]`` k-th, with
    its entity (the blocks already refer to the new numbers)."""
    d = mesh.dim
    reg = np.asarray(mesh.regions)
    if version41 and np.unique(reg).size > 1:
        order = np.argsort(reg, kind="stable")
        ureg, start = np.unique(reg[order], return_index=True)
        parts = np.split(order, start[1:])
    else:
        ureg, parts = np.unique(reg)[:1], [np.arange(mesh.num_cells)]
    blocks = [(("quad", "hexahedron")[d - 2], cells_vtk[p]) for p in parts]
    phys = [reg[p] for p in parts]
    geo = [np.full(p.size, k + 1) for k, p in enumerate(parts)]
    # boundary faces, one block per id, vertices in VTK order
    bid = np.asarray(mesh.boundary_ids)
    c, f = np.nonzero(bid >= 0)
    ids = bid[c, f]
    fv = ref.face_vertices(d)
    verts = np.asarray(mesh.cells)[c[:, None], fv[f]]
    if d == 3:
        verts = verts[:, [0, 1, 3, 2]]
    order = np.argsort(ids, kind="stable")
    uid, fstart = np.unique(ids[order], return_index=True)
    fparts = np.split(order, fstart[1:]) if ids.size else []
    for k, p in enumerate(fparts):
        blocks.append((FACET_TYPE[d], verts[p]))
        phys.append(ids[p])
        geo.append(np.full(p.size, k + 1))
    out = {"gmsh:physical": [a.astype(np.int64) for a in phys],
           "gmsh:geometrical": [a.astype(np.int64) for a in geo]}
    for name, a in cd.items():                 # facets get zeros (dropped when read back)
        a = np.asarray(a)
        out[name] = [a[p] for p in parts] + [np.zeros((p.size,) + a.shape[1:], a.dtype) for p in fparts]
    if not version41:
        return blocks, out, None
    # meshio writes the nodes of Gmsh 4.1 grouped by entity and reads them back in file
    # order, but its NodeData in index order: number the nodes by entity here, so both agree
    dt = _dim_tags(mesh, parts, verts, fparts)
    perm = np.lexsort((dt[:, 1], dt[:, 0]))
    new = np.empty_like(perm)
    new[perm] = np.arange(perm.size)
    blocks = [(t, new[a]) for t, a in blocks]
    return blocks, out, (perm, dt[perm])


def _dim_tags(mesh, parts, verts, fparts):
    """(num_nodes, 2) entity (dim, tag) of each node, every entity of a block holding at least
    one node (meshio's Gmsh 4.1 writer lists the entities of the nodes only)."""
    d, n = mesh.dim, mesh.num_nodes
    cells = np.asarray(mesh.cells)
    ent = np.zeros(n, dtype=np.int64)          # entity index: regions 0.., boundary groups after
    for k, p in enumerate(parts):
        ent[cells[p].ravel()] = k
    nodes_of = [np.unique(cells[p]) for p in parts]
    for k, p in enumerate(fparts):
        ent[verts[p].ravel()] = len(parts) + k
        nodes_of.append(np.unique(verts[p]))
    count = np.bincount(ent, minlength=len(nodes_of))
    for k, nodes in enumerate(nodes_of):       # one pass over the few entities
        if count[k]:
            continue
        spare = nodes[count[ent[nodes]] > 1]
        if spare.size == 0:
            raise ValueError("cannot write this mesh as Gmsh 4.1: a region or boundary group has no "
                             "node of its own; write Gmsh 2.2 (file_format='gmsh22') instead")
        count[ent[spare[0]]] -= 1
        ent[spare[0]] = k
        count[k] = 1
    dims = np.where(ent < len(parts), d, d - 1)
    tags = np.where(ent < len(parts), ent + 1, ent - len(parts) + 1)
    return np.stack([dims, tags], axis=1)


def vtu_field_data(fd) -> str:
    """The names ``fd`` as a VTK ``<FieldData>`` element (one ascii Int64 pair ``id dim`` per
    name); empty text for no names."""
    if not fd:
        return ""
    items = "".join(f'<DataArray type="Int64" Name={quoteattr(k)} NumberOfTuples="2" format="ascii">'
                    f"{int(v[0])} {int(v[1])}</DataArray>" for k, v in fd.items())
    return f"<FieldData>{items}</FieldData>"


def add_vtu_field_data(p, fd):
    """Insert the names ``fd`` as a ``FieldData`` element into the VTU file ``p`` (meshio's
    writer leaves field data out; its reader reads it)."""
    if not fd:
        return
    raw = p.read_bytes()
    i = raw.find(b"<UnstructuredGrid>")
    if i < 0:
        raise ValueError(f"{p}: no <UnstructuredGrid> element to hold the names")
    i += len(b"<UnstructuredGrid>")
    p.write_bytes(raw[:i] + vtu_field_data(fd).encode() + raw[i:])


def names_json(fd) -> str:
    """``fd`` as the JSON text of the XDMF ``Information`` element."""
    return json.dumps({k: [int(v[0]), int(v[1])] for k, v in fd.items()}, sort_keys=True)


def names_from_json(text):
    """The ``{name: array([id, dim])}`` of :func:`names_json` (bad entries dropped)."""
    try:
        raw = json.loads(text)
    except (TypeError, ValueError):
        return {}
    if not isinstance(raw, dict):
        return {}
    return {str(k): np.array(v, dtype=np.int64) for k, v in raw.items()
            if isinstance(v, list) and len(v) == 2 and all(isinstance(x, int) for x in v)}
