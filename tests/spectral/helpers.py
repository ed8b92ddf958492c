"""Small meshes for the spectral tests (the library's builders, unscrambled when asked)."""
from adaptmg.spectral.meshes import distorted_box, scramble as scrambled, wavy  # noqa: F401


def nvcc_resources(sources, names, tmp_path):
    """Compile CUDA ``sources`` for sm_90 with ``nvcc -Xptxas -v``; ``{name: (static shared
    memory bytes, spill-free)}`` of the kernels ``names``."""
    import re
    import subprocess
    cu = tmp_path / "kernels.cu"
    cu.write_text("".join(sources))
    p = subprocess.run(["nvcc", "-arch=sm_90", "-cubin", "-Xptxas", "-v", str(cu), "-o",
                        str(tmp_path / "kernels.cubin")], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr[-3000:]
    out = {}
    for name in names:
        info = p.stderr.split(f"Compiling entry function '{name}'")[1].split("Compiling entry")[0]
        out[name] = (int(re.search(r"(\d+) bytes smem", info).group(1)),
                     re.search(r"\b0 bytes spill stores", info) is not None)
    return out
