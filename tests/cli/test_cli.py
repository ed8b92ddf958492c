"""The adaptmg command through subprocess, problem discovery, packaging, plus the progress and plot helpers."""
import configparser
import io as _io
import os
import re
import subprocess
import sys
import types
import uuid

import numpy as np
import pytest

import adaptmg
import adaptmg.io
from adaptmg import cli
from adaptmg.progress import progress

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")


def adaptmg_cmd(*args, env=None, timeout=120):
    e = dict(os.environ, ADAPTMG_QUIET="1")
    e.update(env or {})
    return subprocess.run([sys.executable, "-m", "adaptmg", *args], capture_output=True, text=True,
                          timeout=timeout, env=e, cwd=ROOT)


def test_run_poisson_writes_files_and_reports_error(tmp_path):
    r = adaptmg_cmd("run", "poisson", "--refine", "3", "--local", "2", "--backend", "cpu",
                    "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr
    m = re.search(r"(\d+) DoFs, error: L2 ([0-9.e+-]+), H1 ([0-9.e+-]+)", r.stdout)
    assert m, r.stdout
    dofs, l2, h1 = int(m.group(1)), float(m.group(2)), float(m.group(3))
    assert 0 < l2 < 1e-2 and 0 < h1 < 0.2
    mesh, pd, cd = adaptmg.io.read(tmp_path / "poisson.vtu", with_data=True)
    assert mesh.num_nodes == dofs
    assert pd["hanging"].sum() > 0                        # locally refined: hanging nodes
    # the written solution is close to the written exact interpolant
    assert np.max(np.abs(pd["u"] - pd["u_exact"])) < 0.05
    png = (tmp_path / "poisson.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"


def test_poisson_error_decreases_with_refinement():
    from adaptmg_problems import poisson
    e = [poisson.run(refine=k, local=1, backend="cpu", quiet=True)["error"]["L2"] for k in (2, 3)]
    assert e[1] < e[0] / 3                                 # O(h^2) in L2


def test_run_transport_diffusion_small(tmp_path):
    r = adaptmg_cmd("run", "transport_diffusion", "--n", "4", "--steps", "3", "--backend", "cpu",
                    "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "transport_diffusion.vtu").exists()
    assert "error" in r.stdout


def test_info_and_list():
    r = adaptmg_cmd("info")
    assert r.returncode == 0, r.stderr
    assert re.search(r"numpy\s+" + re.escape(np.__version__), r.stdout)
    assert "backend" in r.stdout and "meshio" in r.stdout and "pyamg" in r.stdout
    r = adaptmg_cmd("list")
    assert r.returncode == 0 and "poisson" in r.stdout and "--refine" in r.stdout
    # problems that are packages are found too; helper modules (no run()) are not listed
    listed = [line.split()[0] for line in r.stdout.splitlines() if line and not line[0].isspace()]
    assert {"navier_stokes", "transport_diffusion", "elasticity", "lshape"} <= set(listed)
    assert not any(n.startswith("_") for n in listed), listed


def _fake_problems(tmp_path, monkeypatch):
    """A throw-away problems package: one problem, one module that fails to import, one helper."""
    name = f"fake_problems_{uuid.uuid4().hex[:8]}"
    pkg = tmp_path / name
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "good.py").write_text('"""A good problem."""\ndef run(n: int = 3, quiet=False):\n    return {}\n')
    (pkg / "broken.py").write_text("x = undefined_name\ndef run():\n    return {}\n")
    (pkg / "helper.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(cli, "PROBLEMS_PACKAGE", name)
    return name


def test_problem_that_fails_to_import_is_reported_not_swallowed(tmp_path, monkeypatch, capsys):
    _fake_problems(tmp_path, monkeypatch)
    assert cli.discover_problems() == ["broken", "good", "helper"]
    assert cli.load_problem("helper") is None                     # no run(): not a problem
    with pytest.raises(cli.ProblemImportError, match="'broken'.*NameError.*undefined_name") as ei:
        cli.load_problem("broken")
    assert isinstance(ei.value.__cause__, NameError)
    # list: every problem, the broken one with its exception, exit status 1
    assert cli.main(["list"]) == 1
    out, err = capsys.readouterr()
    assert re.search(r"broken\s+\(import failed: NameError: name 'undefined_name'", out), out
    assert re.search(r"good\s+A good problem", out) and "--n 3" in out
    assert "helper" not in out and "1 problem module(s) failed to import" in err
    # run: a clear error and exit status 1 (ADAPTMG_DEBUG re-raises with the traceback)
    monkeypatch.delenv("ADAPTMG_DEBUG", raising=False)
    assert cli.main(["run", "broken"]) == 1
    err = capsys.readouterr().err
    assert "adaptmg: error: problem 'broken'" in err and "NameError" in err
    monkeypatch.setenv("ADAPTMG_DEBUG", "1")
    with pytest.raises(cli.ProblemImportError):
        cli.main(["run", "broken"])
    with pytest.raises(SystemExit) as ex:
        cli.main(["run", "helper"])
    assert ex.value.code == 2 and "'helper' is not a problem" in capsys.readouterr().err


def test_setup_cfg_lists_every_package_and_problems_install_as_adaptmg_problems(tmp_path):
    """setup.cfg lists the packages by hand (``problems/`` is installed as ``adaptmg_problems``):
    every folder with an ``__init__.py`` must be listed, and the install must not create a
    top-level ``problems`` package."""
    cfg = configparser.ConfigParser()
    cfg.read(os.path.join(ROOT, "setup.cfg"))
    listed = set(cfg["options"]["packages"].split())
    mapping = dict(line.split("=") for line in cfg["options"]["package_dir"].strip().splitlines())
    folder_to_pkg = {v.strip(): k.strip() for k, v in mapping.items()}
    found = set()
    for top in ("adaptmg", "problems"):
        for d, _, files in os.walk(os.path.join(ROOT, top)):
            if "__init__.py" in files:
                rel = os.path.relpath(d, ROOT).split(os.sep)
                found.add(".".join([folder_to_pkg.get(rel[0], rel[0])] + rel[1:]))
    assert listed == found, (sorted(found - listed), sorted(listed - found))
    # outside the repository: adaptmg_problems is the installed folder problems/, and no
    # top-level "problems" package exists
    r = subprocess.run([sys.executable, "-c", "import importlib.util as u, adaptmg_problems as p; "
                        "print(p.__file__); print(u.find_spec('problems'))"],
                       capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert r.returncode == 0, r.stderr
    file_, spec = r.stdout.split()
    assert file_.endswith(os.path.join("__init__.py")) and spec == "None"


@pytest.mark.parametrize("args,pattern,code", [
    ([], "required|usage", 2),
    (["frobnicate"], "invalid choice", 2),
    (["run", "no_such_problem"], "unknown problem 'no_such_problem'.*poisson", 2),
    (["run", "poisson", "--refine", "x"], "argument --refine: invalid int value: 'x'", 2),
    (["run", "poisson", "--backend", "tpu"], "argument --backend: invalid choice: 'tpu'", 2),
    (["run", "poisson", "--bogus", "1"], "unrecognized arguments: --bogus", 2),
    (["run", "poisson", "--refine", "99", "--backend", "cpu"], "refine must be an integer in", 1),
    (["bench", "no_such_bench"], "no benchmark 'no_such_bench'", 2),
    (["bench", "../../etc/passwd"], "bench name must be", 2),
])
def test_bad_arguments_exit_nonzero_with_message(args, pattern, code):
    r = adaptmg_cmd(*args)
    assert r.returncode == code, (r.returncode, r.stdout, r.stderr)
    assert re.search(pattern, r.stderr), r.stderr


def test_bench_runs_script_with_arguments(tmp_path):
    (tmp_path / "bench_hello.py").write_text("import sys\nprint('hello', *sys.argv[1:])\nsys.exit(3)\n")
    r = adaptmg_cmd("bench", "hello", "--size", "2", env={"ADAPTMG_SCRIPTS": str(tmp_path)})
    assert r.returncode == 3 and "hello --size 2" in r.stdout


def test_problem_options_from_signature_and_OPTIONS():
    def run(n: int = 3, *, dt: "float" = 0.1, name="x", flag: bool = True, steps: "int | None" = None,
            shape=(1, 2), backend="auto", quiet=False, out=None):
        return {}
    mod = types.SimpleNamespace(run=run)
    opts = {o[0]: o[1:3] for o in cli.problem_options(mod)}
    assert opts == {"n": (int, 3), "dt": (float, 0.1), "name": (str, "x"), "flag": (bool, True),
                    "steps": (int, None)}
    mod.OPTIONS = {"size": {"type": int, "default": 5, "help": "cells"}}
    assert cli.problem_options(mod) == [("size", int, 5, "cells")]


def test_progress_is_silent_off_terminal_and_passes_items():
    buf = _io.StringIO()
    assert list(progress(range(5), "steps", stream=buf)) == list(range(5))
    assert list(progress(3, "count", stream=buf)) == [0, 1, 2]
    with progress(total=4, description="manual", stream=buf) as bar:
        for _ in range(4):
            bar.advance()
    assert buf.getvalue() == ""
    with pytest.raises(ValueError, match="total must be a non-negative integer"):
        progress(total=-1)
    with pytest.raises(TypeError, match="iterable must be"):
        progress(3.5)


def test_plots_write_png(tmp_path):
    pytest.importorskip("matplotlib")
    from adaptmg import plot
    p = plot.convergence({"V": [1, 0.1, 0.01], "W": ([0, 1], [1, 0.05])}, tmp_path / "c.png")
    q = plot.timings({"cpu": {"init": 1.0, "solve": 3.0}, "gpu": {"init": 0.5, "solve": 0.2}},
                     tmp_path / "t.png")
    for f in (p, q):
        assert f.read_bytes()[:4] == b"\x89PNG" and f.stat().st_size > 5000
    with pytest.raises(ValueError, match=r"timings\['cpu'\]\['solve'\] must be a non-negative"):
        plot.timings({"cpu": {"solve": -1.0}}, tmp_path / "bad.png")
    with pytest.raises(ValueError, match="must end in .png"):
        plot.convergence({"a": [1]}, tmp_path / "c.jpg")


@pytest.mark.gpu
def test_run_poisson_on_gpu_matches_cpu(tmp_path):
    out = {}
    for be in ("cpu", "gpu"):
        r = adaptmg_cmd("run", "poisson", "--refine", "4", "--local", "2", "--backend", be)
        assert r.returncode == 0, r.stderr
        out[be] = float(re.search(r"error: L2 ([0-9.e+-]+)", r.stdout).group(1))
    assert abs(out["gpu"] - out["cpu"]) <= 1e-6 * out["cpu"]
