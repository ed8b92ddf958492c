"""Untrusted mesh files: size limits, prechecks, and meshio's readers in a child process.

Before any parser runs, :func:`precheck` refuses (``ValueError`` starting with
the path) a file that is empty, larger than ``max_bytes``, gzip-compressed
(decompression bombs), an XML document with a DOCTYPE/ENTITY declaration
(entity expansion), a VTU/XDMF whose declared point/cell counts exceed
``max_points``/``max_cells``, or an XDMF that refers to binary/HDF5 data
outside its folder.  Nothing is unpickled or evaluated.  :func:`read_isolated`
runs one of meshio's readers in a child process with a wall-clock timeout and
an address-space limit, so that a hang or a memory blow-up becomes an error.
"""
from __future__ import annotations

import os
import re
import struct
import xml.etree.ElementTree as ET
import zlib
from pathlib import Path

import numpy as np

DEFAULT_LIMITS = {"max_bytes": 1 << 30, "max_points": 50_000_000, "max_cells": 50_000_000}
UNSAFE_READERS = {"ansys"}          # meshio's ANSYS reader loops at end of a truncated file

# What a parser raises on a malformed file besides ValueError, MemoryError and
# ImportError (which read() reports on their own): the types seen when meshio's
# readers and adaptmg's XDMF parser were fed truncated and corrupted files
# (IndexError, KeyError, AssertionError, zlib.error, struct.error, ...), their
# base classes, and OSError / EOFError / StopIteration for files that end early.
_PARSE_ERRORS = (LookupError, TypeError, AttributeError, AssertionError, ArithmeticError,
                 RuntimeError, EOFError, StopIteration, SyntaxError, OSError, struct.error,
                 zlib.error)


def parse_errors():
    """Exceptions by which a parser reports a malformed file (meshio's own included)."""
    from meshio._exceptions import CorruptionError, ReadError
    return (ReadError, CorruptionError, *_PARSE_ERRORS)


def check_path(path, what="path") -> Path:
    """``path`` as a :class:`Path`; ``TypeError``/``ValueError`` for a non-path or empty one."""
    if isinstance(path, bool) or not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"{what} must be a str or os.PathLike, got {type(path).__name__}")
    p = Path(path)
    if str(p) == "" or str(path).strip() == "":
        raise ValueError(f"{what} must not be empty")
    return p


def file_error(p, msg) -> ValueError:
    """The error for a file that cannot be read: a ``ValueError`` whose message starts with ``p``."""
    return ValueError(f"{p}: {msg}")


def limits(max_bytes, max_points, max_cells) -> dict:
    """The read limits, ``None`` meaning the value in :data:`DEFAULT_LIMITS`."""
    out = {}
    for name, v in (("max_bytes", max_bytes), ("max_points", max_points), ("max_cells", max_cells)):
        v = DEFAULT_LIMITS[name] if v is None else v
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
            raise ValueError(f"{name} must be a positive integer, got {v!r}")
        out[name] = int(v)
    return out


def precheck(p: Path, fmt: str, lim: dict):
    """Refuse ``p`` before any parser sees it (see the module docstring)."""
    if not p.exists():
        raise FileNotFoundError(f"{p}: no such file")
    if not p.is_file():
        raise ValueError(f"{p}: not a regular file")
    size = p.stat().st_size
    if size == 0:
        raise file_error(p, "the file is empty")
    if size > lim["max_bytes"]:
        raise file_error(p, f"the file has {size} bytes, more than max_bytes={lim['max_bytes']} "
                            "(raise max_bytes if the file is trusted)")
    if p.name.lower().endswith(".gz"):
        raise file_error(p, "compressed (.gz) mesh files are refused (decompression bombs); "
                            "decompress it yourself first")
    with open(p, "rb") as f:
        head = f.read(1 << 16)
    if head.lstrip()[:1] == b"<":                       # XML: VTU, XDMF, dolfin-xml, ...
        text = p.read_bytes()
        if re.search(rb"<!\s*(DOCTYPE|ENTITY)", text, flags=re.I):
            raise file_error(p, "XML files with DOCTYPE/ENTITY declarations are refused "
                                "(entity expansion attacks)")
        if fmt == "vtu":
            for key, lk in ((rb"NumberOfPoints", "max_points"), (rb"NumberOfCells", "max_cells")):
                for m in re.finditer(key + rb'\s*=\s*"([^"]*)"', text):
                    try:
                        v = int(m.group(1))
                    except ValueError:
                        raise file_error(p, f"{key.decode()}={m.group(1)[:40]!r} is not an "
                                            "integer") from None
                    if v < 0 or v > lim[lk]:
                        raise file_error(p, f"{key.decode()}={v} is outside [0, {lim[lk]}] ({lk})")
        if fmt == "xdmf":
            _precheck_xdmf(p, text, lim)


def _precheck_xdmf(p: Path, text: bytes, lim: dict):
    try:
        root = ET.fromstring(text)
    except (ET.ParseError, LookupError) as exc:   # LookupError: unknown encoding declared
        raise file_error(p, f"not a well-formed XDMF (XML) file: {exc}") from None
    base = p.parent.resolve()
    cap = max(lim["max_points"], lim["max_cells"]) * 27
    for item in root.iter():
        if not item.tag.endswith("DataItem"):
            continue
        dims = item.get("Dimensions", "")
        try:
            shape = [int(s) for s in dims.split()]
        except ValueError:
            raise file_error(p, f"DataItem Dimensions={dims[:40]!r} is not a list of integers") from None
        if any(s < 0 for s in shape) or int(np.prod(np.array(shape, dtype=object) if shape else [0])) > cap:
            raise file_error(p, f"DataItem Dimensions={dims!r} is larger than the limits allow "
                                f"(max_points={lim['max_points']}, max_cells={lim['max_cells']})")
        fmtattr = item.get("Format", "XML")
        if fmtattr in ("HDF", "Binary") and item.text:
            ref = item.text.strip().split(":")[0]
            target = (p.parent / ref).resolve()
            if Path(ref).is_absolute() or base not in target.parents:
                raise file_error(p, f"DataItem refers to {ref!r}, outside the folder of the XDMF "
                                    "file (refused)")


# meshio readers run in a child process (wall-clock timeout, address-space
# limit): several of meshio's text readers trust counts in the file (Gmsh
# np.full of a corrupt element count) or loop at end of file, so only a
# separate process can guarantee "an error, never a hang".  The child is a
# script run with ``python -c`` (it imports numpy and meshio, not adaptmg) and
# sends plain arrays back in an .npz read with allow_pickle=False.  Its last
# handler catches everything on purpose: the child's one job is to report any
# failure of the parser as one line on stderr and a non-zero exit status.
_CHILD = r"""
import sys, json, warnings, numpy as np
path, fmt, out = sys.argv[1:4]
try:
    import resource
    lim = int(sys.argv[4])
    resource.setrlimit(resource.RLIMIT_AS, (lim, lim))
except (ImportError, ValueError, OSError):
    pass
warnings.simplefilter("ignore")
try:
    from meshio._helpers import reader_map
    m = reader_map[fmt](path)
    arrs = {"points": np.asarray(m.points)}
    meta = {"types": [], "point_data": [], "cell_data": [], "field_data": [], "cell_sets": []}
    for i, b in enumerate(m.cells):
        meta["types"].append(str(b.type))
        arrs[f"cells{i}"] = np.asarray(b.data)
    for k, v in (m.point_data or {}).items():
        meta["point_data"].append(str(k)); arrs[f"pd{len(meta['point_data']) - 1}"] = np.asarray(v)
    for k, vs in (m.cell_data or {}).items():
        j = len(meta["cell_data"]); meta["cell_data"].append([str(k), len(vs)])
        for i, v in enumerate(vs):
            arrs[f"cd{j}_{i}"] = np.asarray(v)
    for k, v in (getattr(m, "field_data", None) or {}).items():
        meta["field_data"].append(str(k)); arrs[f"fd{len(meta['field_data']) - 1}"] = np.asarray(v)
    for k, vs in (getattr(m, "cell_sets", None) or {}).items():
        j = len(meta["cell_sets"]); meta["cell_sets"].append([str(k), len(vs)])
        for i, v in enumerate(vs):
            arrs[f"cs{j}_{i}"] = np.asarray(v if v is not None else [], dtype=np.int64)
    for k, a in arrs.items():
        if a.dtype == object:
            raise ValueError(f"array {k} is not numeric")
    arrs["meta"] = np.array(json.dumps(meta))
    np.savez(out, **arrs)
except MemoryError:
    print("MemoryError: the file asks for more memory than the reader may use", file=sys.stderr)
    sys.exit(3)
except BaseException as exc:
    print(f"{type(exc).__name__}: {exc}"[:400], file=sys.stderr)
    sys.exit(2)
"""


def read_isolated(p: Path, fmt: str, timeout: float):
    """meshio.Mesh read from ``p`` by meshio's ``fmt`` reader in a child process.

    ``ValueError`` (naming ``p``) when the reader fails or runs longer than
    ``timeout`` seconds; the child may use ``max(4 GiB, 64 x file size)`` of
    address space.
    """
    import json
    import subprocess
    import sys
    import tempfile

    import meshio
    mem = int(max(4 << 30, 64 * p.stat().st_size))
    with tempfile.TemporaryDirectory(prefix="adaptmg-io-") as d:
        out = os.path.join(d, "mesh.npz")
        try:
            proc = subprocess.run([sys.executable, "-c", _CHILD, str(p), fmt, out, str(mem)],
                                  capture_output=True, text=True, timeout=timeout,
                                  env={**os.environ, "OMP_NUM_THREADS": "1",
                                       "OPENBLAS_NUM_THREADS": "1"})
        except subprocess.TimeoutExpired:
            raise file_error(p, f"reading as {fmt!r} did not finish within {timeout} s "
                                "(corrupt file? raise timeout= if it is large and trusted)") from None
        if proc.returncode != 0 or not os.path.exists(out):
            msg = (proc.stderr.strip().splitlines() or ["reader failed"])[-1]
            raise file_error(p, f"could not be read as {fmt!r}: {msg}")
        with np.load(out, allow_pickle=False) as z:
            meta = json.loads(str(z["meta"]))
            cells = [(t, z[f"cells{i}"]) for i, t in enumerate(meta["types"])]
            pd = {k: z[f"pd{i}"] for i, k in enumerate(meta["point_data"])}
            cd = {k: [z[f"cd{j}_{i}"] for i in range(nb)] for j, (k, nb) in enumerate(meta["cell_data"])}
            fd = {k: z[f"fd{i}"] for i, k in enumerate(meta["field_data"])}
            cs = {k: [z[f"cs{j}_{i}"] for i in range(nb)] for j, (k, nb) in enumerate(meta["cell_sets"])}
            points = z["points"]
    return meshio.Mesh(points, cells, point_data=pd, cell_data=cd, field_data=fd, cell_sets=cs)
