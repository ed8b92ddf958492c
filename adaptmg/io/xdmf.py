"""adaptmg's own XDMF writer and reader, :class:`TimeSeriesWriter` and :func:`read_time_series`.

meshio's XDMF writer imports h5py even for inline XML data and its attribute
typing rejects ``(n, 4)`` arrays, so adaptmg writes XDMF itself: inline XML
data with 17 significant digits (exact float64), in the layout meshio's
readers parse.  :func:`parse_xdmf` reads that layout back; XDMF with HDF5 or
binary data is left to meshio (:class:`NotInline`).
"""
from __future__ import annotations

import os
import xml.etree.ElementTree as ET

import numpy as np

from .convert import PERM, collect_fields, host_mesh, import_meshio, to_adaptmg
from .groups import field_data, names_from_json, names_json
from .sandbox import check_path, file_error, limits, parse_errors, precheck

NAMES_INFO = "adaptmg:names"       # Information element: {name: [id, dim]} as JSON
_XDMF_TOPO = {2: "Quadrilateral", 3: "Hexahedron"}
_XDMF_DTYPES = {("Float", "4"): np.float32, ("Float", "8"): np.float64, ("Int", "1"): np.int8,
                ("Int", "2"): np.int16, ("Int", "4"): np.int32, ("Int", "8"): np.int64,
                ("UInt", "1"): np.uint8, ("UInt", "2"): np.uint16, ("UInt", "4"): np.uint32,
                ("UInt", "8"): np.uint64}


class NotInline(Exception):
    """The XDMF file keeps its data in HDF5 or binary files (not parsed by adaptmg)."""


# ---------------------------------------------------------------------------- writing
def _xdmf_text(a):
    a = np.ascontiguousarray(a).ravel()
    if a.dtype.kind == "f":
        return "\n" + " ".join(np.char.mod("%.17g", a.astype(np.float64)).tolist()) + "\n"
    return "\n" + " ".join(map(str, a.tolist())) + "\n"


def _xdmf_item(parent, a):
    a = np.asarray(a)
    if a.dtype.kind == "f":
        a = a.astype(np.float64) if a.dtype != np.float32 else a
        dt, prec = "Float", str(a.dtype.itemsize)
    elif a.dtype.kind == "u":
        dt, prec = "UInt", str(a.dtype.itemsize)
    else:
        a = a.astype(np.int64) if a.dtype.kind == "b" else a
        dt, prec = "Int", str(a.dtype.itemsize)
    item = ET.SubElement(parent, "DataItem", DataType=dt, Dimensions=" ".join(map(str, a.shape)),
                         Format="XML", Precision=prec)
    item.text = _xdmf_text(a)
    return item


def _xdmf_attribute_type(a):
    if a.ndim == 1 or a.shape[1] == 1:
        return "Scalar"
    if a.ndim == 2 and a.shape[1] in (2, 3):
        return "Vector"
    if a.ndim == 2 and a.shape[1] == 9:
        return "Tensor"
    if a.ndim == 2 and a.shape[1] == 6:
        return "Tensor6"
    return "Matrix"


def _xdmf_attributes(grid, pd, cd):
    for center, data in (("Node", pd), ("Cell", cd)):
        for name, a in data.items():
            a = np.asarray(a)
            att = ET.SubElement(grid, "Attribute", Name=name, AttributeType=_xdmf_attribute_type(a),
                                Center=center)
            _xdmf_item(att, a)


def _xdmf_geometry(grid, mesh):
    cells = np.asarray(mesh.cells, dtype=np.int64)[:, PERM[mesh.dim]]
    topo = ET.SubElement(grid, "Topology", TopologyType=_XDMF_TOPO[mesh.dim],
                         NumberOfElements=str(cells.shape[0]))
    _xdmf_item(topo, cells)
    geo = ET.SubElement(grid, "Geometry", GeometryType="XY" if mesh.dim == 2 else "XYZ")
    _xdmf_item(geo, np.asarray(mesh.points, dtype=np.float64))


def write_xdmf(p, mesh, pd, cd, names=True):
    """Write ``mesh`` and the collected fields ``pd``/``cd`` to the XDMF file ``p`` (with
    ``names`` the boundary and region names, as an ``Information`` element)."""
    root = ET.Element("Xdmf", Version="3.0")
    dom = ET.SubElement(root, "Domain")
    grid = ET.SubElement(dom, "Grid", Name="mesh", GridType="Uniform")
    fd = field_data(mesh) if names else {}
    if fd:
        ET.SubElement(grid, "Information", Name=NAMES_INFO, Value=names_json(fd))
    _xdmf_geometry(grid, mesh)
    _xdmf_attributes(grid, pd, cd)
    ET.ElementTree(root).write(str(p), xml_declaration=True, encoding="utf-8")


# ---------------------------------------------------------------------------- reading
def _xdmf_read_item(p, item):
    """Inline XML DataItem -> array (HDF/Binary items are left to meshio)."""
    if item is None:
        raise file_error(p, "XDMF element without DataItem")
    if item.get("Format", "XML") != "XML":
        raise NotInline()
    key = (item.get("DataType", item.get("NumberType", "Float")), item.get("Precision", "4"))
    if key not in _XDMF_DTYPES:
        raise file_error(p, f"unsupported XDMF DataType/Precision {key}")
    shape = tuple(int(s) for s in item.get("Dimensions", "").split())
    text = item.text or ""
    try:
        a = np.array(text.split(), dtype=np.float64 if key[0] == "Float" else np.int64)
    except (ValueError, OverflowError):
        raise file_error(p, f"XDMF DataItem holds text that is not a list of {key[0]} numbers") from None
    if a.size != int(np.prod(shape, dtype=np.int64)):
        raise file_error(p, f"XDMF DataItem has {a.size} values for Dimensions {shape}")
    return a.astype(_XDMF_DTYPES[key]).reshape(shape)


def _xdmf_grid_fields(p, grid):
    pd, cd = {}, {}
    for att in grid.findall("Attribute"):
        center, name = att.get("Center"), att.get("Name")
        if center not in ("Node", "Cell") or not name:
            raise file_error(p, f"XDMF Attribute needs a Name and Center Node/Cell, got {att.attrib}")
        (pd if center == "Node" else cd)[name] = _xdmf_read_item(p, att.find("DataItem"))
    return pd, cd


def parse_xdmf(p):
    """(meshio.Mesh of the first uniform grid with topology, [(t, pd, cd)]) from inline-XML XDMF.

    ``p`` must have passed :func:`~adaptmg.io.sandbox.precheck`; raises
    :class:`NotInline` for HDF5/binary data.
    """
    meshio = import_meshio()
    root = ET.parse(str(p)).getroot()        # already checked: well-formed, no DOCTYPE
    if root.tag != "Xdmf":
        raise file_error(p, f"root element is {root.tag!r}, not Xdmf")
    grids = list(root.iter("Grid"))
    base = next((g for g in grids if g.find("Topology") is not None), None)
    if base is None:
        raise file_error(p, "no Grid with a Topology")
    topo, geo = base.find("Topology"), base.find("Geometry")
    if geo is None:
        raise file_error(p, "the Grid has no Geometry")
    ttype = topo.get("TopologyType", topo.get("Type", ""))
    inv = {"Quadrilateral": "quad", "Hexahedron": "hexahedron"}
    if ttype not in inv:
        raise file_error(p, f"XDMF topology {ttype!r} is not supported (only Quadrilateral / Hexahedron)")
    cells = _xdmf_read_item(p, topo.find("DataItem"))
    pts = _xdmf_read_item(p, geo.find("DataItem"))
    if geo.get("GeometryType", "XYZ") not in ("XY", "XYZ"):
        raise file_error(p, f"XDMF geometry {geo.get('GeometryType')!r} is not supported (XY/XYZ)")
    if cells.ndim != 2 or pts.ndim != 2:
        raise file_error(p, f"XDMF topology/geometry must be 2-D arrays, got {cells.shape}, {pts.shape}")
    pd, cd = _xdmf_grid_fields(p, base)
    info = next((i for i in base.findall("Information") if i.get("Name") == NAMES_INFO), None)
    m = meshio.Mesh(pts, [(inv[ttype], cells)], point_data=pd, cell_data={k: [v] for k, v in cd.items()},
                    field_data=names_from_json(info.get("Value")) if info is not None else None)
    steps = []
    for coll in grids:
        if coll.get("GridType") != "Collection":
            continue
        for g in coll.findall("Grid"):
            tel = g.find("Time")
            try:
                t = float(tel.get("Value")) if tel is not None else float(len(steps))
            except (TypeError, ValueError):
                raise file_error(p, f"XDMF Time value {tel.get('Value')!r} is not a number") from None
            spd, scd = _xdmf_grid_fields(p, g)
            steps.append((t, spd, scd))
    return m, steps


# ---------------------------------------------------------------------------- time series
class TimeSeriesWriter:
    """Time series of fields on one mesh as XDMF (inline XML data, exact float64).

    ::

        with adaptmg.io.TimeSeriesWriter("out/u.xdmf", mesh) as ts:
            for k, t in enumerate(times):
                ts.write(t, point_data={"u": u_k}, cell_data={"eta": eta_k})

    The mesh (points, cells, ``hanging``/``level``/``boundary_ids``) is
    written once; each :meth:`write` adds one time step.  Fields follow the
    conventions of :func:`~adaptmg.io.write` (``space=`` for DoF vectors of a
    space).  An adaptive run whose mesh changes writes one series per mesh.
    ParaView opens the file with the XDMF reader.
    """

    def __init__(self, path, mesh, *, space=None, mesh_data=True):
        self.path = check_path(path)
        if self.path.suffix.lower() not in (".xdmf", ".xmf"):
            raise ValueError(f"path must end in .xdmf or .xmf, got {str(self.path)!r}")
        self.mesh = host_mesh(mesh, space)     # validates mesh/space; a device mesh copied once
        self.space = space
        self._mesh_data = mesh_data
        self._writer = None
        self._last_t = None
        self.steps = 0

    def __enter__(self):
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._root = ET.Element("Xdmf", Version="3.0")
        dom = ET.SubElement(self._root, "Domain")
        grid = ET.SubElement(dom, "Grid", Name="mesh", GridType="Uniform")
        _xdmf_geometry(grid, self.mesh)
        self._collection = ET.SubElement(dom, "Grid", Name="TimeSeries", GridType="Collection",
                                         CollectionType="Temporal")
        self._writer = True
        self._flush()
        return self

    def _flush(self):
        ET.register_namespace("xi", "http://www.w3.org/2003/XInclude")
        tmp = self.path.with_name(self.path.name + ".part")
        ET.ElementTree(self._root).write(str(tmp), xml_declaration=True, encoding="utf-8")
        os.replace(tmp, self.path)

    def write(self, t, point_data=None, cell_data=None):
        """Add the fields of time ``t`` (a finite number, increasing).

        The XDMF file is written when the ``with`` block ends (also on an
        exception) or at :meth:`close`.
        """
        if self._writer is None:
            raise RuntimeError("TimeSeriesWriter.write outside its 'with' block (or after close())")
        if isinstance(t, bool) or not isinstance(t, (int, float, np.integer, np.floating)) \
                or not np.isfinite(t):
            raise ValueError(f"t must be a finite number, got {t!r}")
        t = float(t)
        if self._last_t is not None and t <= self._last_t:
            raise ValueError(f"t must increase: got t={t} after t={self._last_t}")
        pd, cd = collect_fields(self.mesh, point_data, cell_data, None, self._mesh_data)
        grid = ET.SubElement(self._collection, "Grid", Name=f"step{self.steps}", GridType="Uniform")
        ET.SubElement(grid, "{http://www.w3.org/2003/XInclude}include",
                      xpointer='xpointer(//Grid[@Name="mesh"]/*[self::Topology or self::Geometry])')
        ET.SubElement(grid, "Time", Value=repr(t))
        _xdmf_attributes(grid, pd, cd)
        self._last_t = t
        self.steps += 1

    def close(self):
        if self._writer is not None:
            self._flush()
            self._writer = None

    def __exit__(self, *exc):
        self.close()
        return False


def read_time_series(path, *, max_bytes=None, max_points=None, max_cells=None):
    """Read an XDMF time series: ``(mesh, [(t, point_data, cell_data), ...])``.

    Same safety checks as :func:`~adaptmg.io.read`.
    """
    p = check_path(path)
    lim = limits(max_bytes, max_points, max_cells)
    precheck(p, "xdmf", lim)
    meshio = import_meshio()
    try:
        m, raw = parse_xdmf(p)
    except NotInline:
        raise file_error(p, "only XDMF time series with inline XML data are supported "
                            "(as written by adaptmg.io.TimeSeriesWriter)") from None
    except ValueError:
        raise
    except (MemoryError, *parse_errors()) as exc:
        raise file_error(p, f"could not be read as an XDMF time series: {type(exc).__name__}: "
                            f"{str(exc)[:300]}") from None
    mesh, _, _ = to_adaptmg(p, m, lim)
    steps = []
    for t, pd, cd in raw:
        mk = meshio.Mesh(m.points, m.cells, point_data=pd, cell_data={k: [v] for k, v in cd.items()})
        _, pdk, cdk = to_adaptmg(p, mk, lim)
        steps.append((t, pdk, cdk))
    return mesh, steps
