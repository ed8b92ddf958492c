"""Make the small example meshes in data/ (run from the repository root).

    python scripts/make_data_meshes.py          # rewrites data/*.{msh,inp,vtu,xdmf}
    python scripts/make_data_meshes.py NAME     # only data/NAME

Each mesh is built with adaptmg itself (Mesh.box, a coordinate map, cell
removal with Mesh.from_cells) and written through adaptmg.io in a different
format, so the files double as reader fixtures.  Provenance: data/README.md.
"""
from __future__ import annotations

import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import adaptmg  # noqa: E402
import adaptmg.mesh.reference  # noqa: E402
from adaptmg import io  # noqa: E402

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data")


def keep_cells(mesh, keep):
    """Sub-mesh of the cells where ``keep`` is True (no refinement tree)."""
    cells = np.asarray(mesh.cells)[keep]
    return adaptmg.Mesh.from_cells(mesh.points, cells)


def lshape_quad():
    """L-shaped domain (-1,1)^2 minus [0,1)x(-1,0], 8x8 cells per unit square."""
    m = adaptmg.Mesh.box([-1, -1], [1, 1], [16, 16])
    c = m.points[m.cells].mean(axis=1)
    return keep_cells(m, ~((c[:, 0] > 0) & (c[:, 1] < 0)))


def annulus_quad():
    """Quarter annulus 1 <= r <= 2, 0 <= theta <= pi/2: 12 (angle) x 4 (radius) quads."""
    def polar(x):
        r, th = x[:, 0], x[:, 1]
        return np.stack([r * np.cos(th), r * np.sin(th)], axis=1)
    return adaptmg.Mesh.box([1, 0], [2, np.pi / 2], [4, 12], map=polar)


def rod_hex():
    """Round rod of radius 0.5 and length 4 (square-to-disc map), 16 x 4 x 4 hexes."""
    def disc(x):
        y, z = x[:, 1], x[:, 2]
        u = y * np.sqrt(1 - z ** 2 / 2)
        v = z * np.sqrt(1 - y ** 2 / 2)
        return np.stack([x[:, 0], 0.5 * u, 0.5 * v], axis=1)
    return adaptmg.Mesh.box([0, -1, -1], [4, 1, 1], [16, 4, 4], map=disc)


def bracket_hex():
    """L-shaped bracket: (0,2)x(0,2)x(0,0.5) minus (0.5,2)x(0.5,2)x(0,0.5), 0.25 hexes."""
    m = adaptmg.Mesh.box([0, 0, 0], [2, 2, 0.5], [8, 8, 2])
    c = m.points[m.cells].mean(axis=1)
    return keep_cells(m, ~((c[:, 0] > 0.5) & (c[:, 1] > 0.5)))


def channel_quad():
    """Channel (0,4)x(0,1) around a square obstacle [1.5,2]x[0.25,0.75], h = 1/4, with named
    boundaries (Gmsh physical groups): inlet (x = 0), outlet (x = 4), wall (y = 0, 1),
    obstacle; regions upstream (x < 2) and downstream."""
    m = adaptmg.Mesh.box([0, 0], [4, 1], [16, 4])
    c = m.points[m.cells].mean(axis=1)
    keep = ~((c[:, 0] > 1.5) & (c[:, 0] < 2) & (c[:, 1] > 0.25) & (c[:, 1] < 0.75))
    cells = np.asarray(m.cells)[keep]
    fc = m.points[cells[:, adaptmg.mesh.reference.face_vertices(2)]].mean(axis=2)     # (nc, 4, 2)
    x, y = fc[..., 0], fc[..., 1]
    ids = np.where(x < 1e-9, 1, np.where(x > 4 - 1e-9, 2, np.where((y < 1e-9) | (y > 1 - 1e-9), 3, 4)))
    region = np.where(c[keep, 0] < 2, 1, 2)
    return adaptmg.Mesh.from_cells(m.points, cells, ids, regions=region,
                                   boundary_names={"inlet": 1, "outlet": 2, "wall": 3, "obstacle": 4},
                                   region_names={"upstream": 1, "downstream": 2})


#: io.write options per file (default: the plain mesh, no groups)
OPTIONS = {"channel_quad.msh": dict(file_format="gmsh22", mesh_data=True)}

MESHES = {
    "channel_quad.msh": channel_quad,
    "lshape_quad.msh": lshape_quad,
    "annulus_quad.xdmf": annulus_quad,
    "rod_hex.inp": rod_hex,
    "bracket_hex.vtu": bracket_hex,
}


def main():
    os.makedirs(DATA, exist_ok=True)
    only = sys.argv[1:]
    for name, make in MESHES.items():
        if only and name not in only:
            continue
        mesh = make()
        path = os.path.join(DATA, name)
        io.write(path, mesh, **OPTIONS.get(name, dict(mesh_data=False)))
        back = io.read(path)
        assert np.array_equal(back.cells, mesh.cells)
        assert back.boundary_names == mesh.boundary_names
        assert np.array_equal(back.boundary_ids, mesh.boundary_ids)
        print(f"{name:20s} {mesh!r}  {os.path.getsize(path)} bytes")


if __name__ == "__main__":
    main()
