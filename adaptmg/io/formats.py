"""Public :func:`write` and :func:`read`: a mesh file in any format meshio knows.

The format comes from the suffix (``.msh`` means Gmsh) or ``file_format=``.
XDMF goes through adaptmg's own writer and reader (:mod:`adaptmg.io.xdmf`),
every other format through meshio.  Reading runs the checks of
:mod:`adaptmg.io.sandbox` first.
"""
from __future__ import annotations

import struct
import warnings
from pathlib import Path

from .convert import collect_fields, host_mesh, import_meshio, to_adaptmg, to_meshio
from .groups import add_vtu_field_data
from .sandbox import (UNSAFE_READERS, check_path, file_error, limits, parse_errors, precheck,
                      read_isolated)
from .vtu_raw import write_raw_vtu
from .xdmf import NotInline, parse_xdmf, write_xdmf

# What meshio's writers raise for data a format cannot hold, besides OSError and
# TypeError (re-raised with the path) and meshio's WriteError: the types seen
# when every writer got a 2-D and a 3-D adaptive mesh (ImportError for formats
# with optional dependencies, IndexError, AttributeError), and their kin.
_WRITE_ERRORS = (ValueError, LookupError, AttributeError, ImportError, AssertionError,
                 ArithmeticError, RuntimeError, struct.error)


def format_of(p: Path, file_format):
    """meshio format name: ``file_format`` if given, else from the suffix of ``p`` (.msh: Gmsh)."""
    if file_format is not None:
        if not isinstance(file_format, str):
            raise TypeError(f"file_format must be a str, got {type(file_format).__name__}")
        return file_format
    meshio = import_meshio()
    from meshio._helpers import _filetypes_from_path
    try:
        types = _filetypes_from_path(p)
    except meshio.ReadError:
        raise ValueError(f"{p}: cannot tell the mesh format from the file name suffix "
                         f"{''.join(p.suffixes)!r}; use .vtu, .xdmf, .msh, .inp, ... or pass "
                         "file_format=") from None
    return "gmsh" if "gmsh" in types else types[0]      # .msh: Gmsh, not ANSYS


def write(path, mesh, point_data=None, cell_data=None, *, space=None, file_format=None,
          mesh_data=True, compression="zlib"):
    """Write ``mesh`` and fields to ``path`` (format from the suffix: .vtu, .xdmf, .msh, ...).

    Parameters
    ----------
    path : str or PathLike
        Output file; missing parent folders are created.
    mesh : Mesh
        On the host or the GPU (the arrays a file holds are copied to the host,
        :func:`~adaptmg.io.convert.host_mesh`), or such a ``HostMesh`` (then no ``space=``).
    point_data : dict name -> array, optional
        One entry per mesh node: shape ``(num_nodes,)``, ``(num_nodes, c)``,
        or a flat DoF vector ``(num_nodes * c,)`` (DoF ``= node * c + comp``),
        written as an ``(num_nodes, c)`` vector field.  NumPy or CuPy arrays.
        With ``space=`` a DoF vector of that space (``space.num_dofs``) is
        accepted; for Q2 the vertex values are written.
    cell_data : dict name -> array, optional
        One value (or vector) per active cell, e.g. error indicators.
    mesh_data : bool
        Also write ``hanging`` (point), ``level``, ``boundary_ids`` and ``region`` (cell), and
        the boundary and region names.  Gmsh files (``.msh``: 4.1, ``file_format="gmsh22"``:
        2.2) hold the boundary ids as physical groups of boundary elements (lines in 2-D,
        quads in 3-D), the regions as those of the cells, the names as ``$PhysicalNames``
        (:mod:`adaptmg.io.groups`); VTU and XDMF hold the arrays and the names.
    file_format : str, optional
        meshio format name, overriding the suffix.
    compression : "zlib" or None
        VTU only: "zlib" (default) writes binary zlib-compressed data through meshio;
        None writes the same arrays uncompressed as raw appended data
        (:mod:`adaptmg.io.vtu_raw`: larger files, written several times faster).

    XDMF is written with inline XML data (17 significant digits, exact for
    float64; no h5py needed).
    """
    p = check_path(path)
    fmt = format_of(p, file_format)
    if compression is not None and (not isinstance(compression, str) or compression != "zlib"):
        raise ValueError(f"compression must be 'zlib' or None, got {compression!r}")
    if compression is None and fmt != "vtu":
        raise ValueError(f"{p}: compression=None (raw appended data) is for VTU files only, "
                         f"not format {fmt!r}")
    mesh = host_mesh(mesh, space)
    pd, cd = collect_fields(mesh, point_data, cell_data, None, mesh_data)
    p.parent.mkdir(parents=True, exist_ok=True)
    if compression is None:
        return write_raw_vtu(p, mesh, pd, cd, names=mesh_data)
    if fmt == "xdmf":
        write_xdmf(p, mesh, pd, cd, names=mesh_data)
        return p
    if fmt not in ("vtu", "vtk") and mesh_data:
        cd.pop("boundary_ids", None)                    # (nc, 2d) arrays: VTK/XDMF only
    if fmt == "gmsh22":
        # meshio 5.3's Gmsh 2.2 reader cannot read back the ElementData its writer writes
        if cell_data:
            raise ValueError(f"{p}: cell_data cannot be written to Gmsh 2.2 (meshio reads it back "
                             "wrongly); write .msh (Gmsh 4.1), .vtu or .xdmf")
        cd.pop("level", None)
    m = to_meshio(mesh, pd, cd, pad3=fmt in ("vtu", "vtk"), fmt=fmt, groups=mesh_data)
    meshio = import_meshio()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            meshio.write(str(p), m, file_format=fmt)
        except (OSError, TypeError) as exc:
            raise type(exc)(f"{p}: writing failed: {exc}") from exc
        except (meshio.WriteError, *_WRITE_ERRORS) as exc:
            raise ValueError(f"{p}: meshio could not write format {fmt!r}: "
                             f"{type(exc).__name__}: {exc}") from exc
    if fmt == "vtu":
        add_vtu_field_data(p, m.field_data)
    return p


def read(path, *, file_format=None, with_data=False, max_bytes=None, max_points=None,
         max_cells=None, trusted=False, isolate=None, timeout=120.0):
    """Read a quad (2D) or hexahedral (3D) mesh file into a new coarse :class:`Mesh`.

    Any format meshio reads (VTU, XDMF with XML or Binary data, Gmsh, Abaqus,
    Medit, Nastran, ...).  Lower-dimensional cells (vertices, lines, and in 3D
    boundary quads/triangles, as Gmsh writes them) are skipped; other cell
    types raise ``ValueError``.  Planar 2-D meshes stored with 3-D points (VTU)
    lose their constant z.  Boundary elements with physical groups (Gmsh's
    ``gmsh:physical``, with the names of ``$PhysicalNames``; else element sets
    such as Abaqus' ``*Elset``) set the ``boundary_ids`` of the cell faces they
    cover (faces not covered: 0) and ``mesh.boundary_names``; the cells' groups
    become ``mesh.regions`` / ``mesh.region_names`` (:mod:`adaptmg.mesh.tags`).
    ``boundary_ids`` / ``region`` cell arrays written by :func:`write` take
    precedence.

    Returns the mesh, or ``(mesh, point_data, cell_data)`` (dicts of NumPy
    arrays, one row per mesh node / cell) with ``with_data=True``.

    meshio's readers run in a child process with a wall-clock ``timeout``
    (seconds) and a memory limit (``isolate=None``: all formats except VTU,
    whose reader checks its sizes, and XDMF with inline data, which adaptmg
    parses itself); ``isolate=False`` reads in-process (trusted files).
    Readers that hang on malformed input (meshio's ANSYS reader loops at end
    of file) are refused unless ``trusted=True``; ``.msh`` means Gmsh.

    Raises ``FileNotFoundError`` for a missing file and ``ValueError`` (whose
    message starts with the path) for anything malformed, too large (limits
    ``max_bytes``, ``max_points``, ``max_cells``; defaults in
    :data:`~adaptmg.io.DEFAULT_LIMITS`) or refused for safety (see
    :mod:`adaptmg.io.sandbox`).
    """
    p = check_path(path)
    lim = limits(max_bytes, max_points, max_cells)
    fmt = format_of(p, file_format)
    if isolate is not None and not isinstance(isolate, bool):
        raise TypeError(f"isolate must be None, True or False, got {isolate!r}")
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    if fmt in UNSAFE_READERS and not trusted:
        raise ValueError(f"{p}: meshio's {fmt!r} reader can loop forever on a truncated file; "
                         "it is used only with trusted=True")
    precheck(p, fmt, lim)
    import_meshio()                             # imports meshio (clear error if missing)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            m = None
            if fmt == "xdmf":
                try:
                    m = parse_xdmf(p)[0]
                except NotInline:
                    m = None            # HDF5 / binary data: meshio (needs h5py for HDF5)
            if m is None:
                # the format's reader itself: meshio.read() prints and calls
                # sys.exit(1) when a reader fails, which a library must not do
                from meshio._helpers import reader_map
                if fmt not in reader_map:
                    raise file_error(p, f"unknown mesh format {fmt!r}; "
                                        f"meshio reads {sorted(reader_map)}")
                if isolate is None:
                    isolate = fmt != "vtu"
                m = read_isolated(p, fmt, timeout) if isolate else reader_map[fmt](str(p))
        except ValueError as exc:
            if str(exc).startswith(str(p)):
                raise
            raise file_error(p, f"could not be read as {fmt!r}: {exc}") from None
        except ImportError as exc:
            raise ValueError(f"{p}: reading format {fmt!r} needs an optional package: {exc}") from None
        except MemoryError:
            raise file_error(p, f"not enough memory to read it as {fmt!r} "
                                "(corrupt sizes in the file?)") from None
        except RecursionError:
            raise file_error(p, f"could not be read as {fmt!r}: nesting too deep") from None
        except (SystemExit, *parse_errors()) as exc:
            raise file_error(p, f"could not be read as {fmt!r}: {type(exc).__name__}: "
                                f"{str(exc)[:300]}") from None
    if not hasattr(m, "points") or not hasattr(m, "cells"):
        raise file_error(p, f"the {fmt!r} reader returned {type(m).__name__}, not a mesh")
    mesh, pd, cd = to_adaptmg(p, m, lim)
    return (mesh, pd, cd) if with_data else mesh
