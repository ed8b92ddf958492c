r"""VTU files with raw appended data: the uncompressed writer behind ``write(..., compression=None)``.

The file is an XML header in which every ``DataArray`` is ``format="appended"`` with the
byte ``offset`` of its block, followed by one ``<AppendedData encoding="raw">_`` section::

    <VTKFile type="UnstructuredGrid" version="1.0" byte_order="LittleEndian" header_type="UInt64">
    <UnstructuredGrid><FieldData>...names...</FieldData>
    <Piece NumberOfPoints="n" NumberOfCells="m"> <Points> <Cells> <PointData> <CellData>
    </Piece></UnstructuredGrid>
    <AppendedData encoding="raw">_[n_0 bytes_0][n_1 bytes_1]...
    </AppendedData></VTKFile>

where block ``k`` is its byte count :math:`n_k` (UInt64) and the array's little-endian bytes,
and ``offset_k = \sum_{j<k} (8 + n_j)``.  The arrays are handed to the file as NumPy buffers
(no base64 encoding or compression in Python: the buffer writes release the GIL, which
the thread that runs the solver needs to launch its kernels), the names (:func:`~adaptmg.io.groups.vtu_field_data`) are
inline ASCII, and nothing is read back or rewritten.  The content is that of the zlib file
:func:`adaptmg.io.write` writes through meshio: points padded to 3-D (float64), connectivity
in VTK vertex order (:data:`~adaptmg.io.convert.PERM`, Int64), end offsets (Int64), cell types
VTK_QUAD = 9 / VTK_HEXAHEDRON = 12 (UInt8), then the point and cell data in the order given
(a ``(rows, c)`` array is a ``NumberOfComponents="c"`` vector).  meshio's VTU reader, and so
:func:`adaptmg.io.read`, reads it; ParaView / VTK read it natively.  A 1M-cell 2-D mesh with
three point fields and the mesh data (``scripts/bench_vtu.py``, a 2-core box): 125 MB in 0.34 s,
where meshio's zlib file is 34 MB in 4.8 s.
"""
from __future__ import annotations

from xml.sax.saxutils import quoteattr

import numpy as np

from .convert import PERM
from .groups import field_data, vtu_field_data

VTK_CELL = {2: 9, 3: 12}                 # VTK_QUAD, VTK_HEXAHEDRON
VTU_TYPE = {np.dtype(t).str[1:]: name for t, name in (
    (np.float32, "Float32"), (np.float64, "Float64"), (np.int8, "Int8"), (np.int16, "Int16"),
    (np.int32, "Int32"), (np.int64, "Int64"), (np.uint8, "UInt8"), (np.uint16, "UInt16"),
    (np.uint32, "UInt32"), (np.uint64, "UInt64"))}


def _le(p, what, a):
    """``a`` C-contiguous little-endian, with its VTU type name; ValueError for dtypes VTU lacks."""
    a = np.asarray(a)
    key = a.dtype.str[1:]
    if key not in VTU_TYPE:
        raise ValueError(f"{p}: {what} has dtype {a.dtype}, which VTU cannot hold (use an integer "
                         "or float32/float64 array)")
    return np.ascontiguousarray(a, dtype=a.dtype.newbyteorder("<")), VTU_TYPE[key]


def write_raw_vtu(p, mesh, pd, cd, names=True):
    """Write ``mesh`` (a :class:`~adaptmg.Mesh` on the host or a
    :class:`~adaptmg.io.convert.HostMesh`) with the collected fields ``pd`` / ``cd``
    (:func:`~adaptmg.io.convert.collect_fields`) to ``p`` as raw appended VTU; ``names``:
    also the boundary and region names.  Returns ``p``."""
    d = mesh.dim
    src = np.asarray(mesh.points, dtype=np.float64)
    pts = np.zeros((src.shape[0], 3))
    pts[:, :d] = src
    conn = np.asarray(mesh.cells, dtype=np.int64)[:, PERM[d]].reshape(-1)
    nc = conn.size // 2 ** d
    blocks = [("Points", "Points", pts), ("Cells", "connectivity", conn),
              ("Cells", "offsets", np.arange(1, nc + 1, dtype=np.int64) * (2 ** d)),
              ("Cells", "types", np.full(nc, VTK_CELL[d], dtype=np.uint8))]
    blocks += [("PointData", k, v) for k, v in pd.items()]
    blocks += [("CellData", k, v) for k, v in cd.items()]
    sections = {"Points": [], "Cells": [], "PointData": [], "CellData": []}
    arrays, offset = [], 0
    for sec, name, a in blocks:
        a, vtype = _le(p, f"{sec} {name!r}", a)
        comp = f' NumberOfComponents="{a.shape[1]}"' if a.ndim == 2 else ""
        sections[sec].append(f'<DataArray type="{vtype}" Name={quoteattr(name)}{comp} '
                             f'format="appended" offset="{offset}"/>')
        arrays.append(a)
        offset += 8 + a.nbytes
    body = "".join(f"<{sec}>{''.join(items)}</{sec}>" for sec, items in sections.items() if items)
    head = ('<?xml version="1.0"?>\n<VTKFile type="UnstructuredGrid" version="1.0" '
            'byte_order="LittleEndian" header_type="UInt64">\n<UnstructuredGrid>'
            + vtu_field_data(field_data(mesh) if names else {})
            + f'<Piece NumberOfPoints="{pts.shape[0]}" NumberOfCells="{nc}">{body}</Piece>'
            + '</UnstructuredGrid>\n<AppendedData encoding="raw">_')
    try:
        with open(p, "wb") as f:
            f.write(head.encode())
            for a in arrays:                     # buffered writes of the arrays' own memory
                f.write(np.array(a.nbytes, dtype="<u8").tobytes())
                f.write(a.reshape(-1).view(np.uint8))
            f.write(b"\n</AppendedData>\n</VTKFile>\n")
    except OSError as exc:
        raise type(exc)(f"{p}: writing failed: {exc}") from exc
    return p
