"""Small meshes for the spectral tests (the library's builders, unscrambled when asked)."""
from adaptmg.spectral.meshes import distorted_box, scramble as scrambled, wavy  # noqa: F401
