"""Load a file of scripts/ as a module for a test (imported by basename: pytest puts this folder on sys.path)."""
import importlib.util
import os

SCRIPTS = os.path.join(os.path.dirname(__file__), "..", "..", "scripts")


def load_script(name):
    """``scripts/<name>.py`` as a fresh module (the scripts are not a package)."""
    spec = importlib.util.spec_from_file_location(f"{name}_script_under_test", os.path.join(SCRIPTS, f"{name}.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
