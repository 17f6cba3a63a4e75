"""The distribution as installed: its own name, its version from git, MPI as an extra, hints that name it."""
import configparser
import importlib.metadata
import json
import os
import re
import subprocess
import sys

import pytest

import pycollect

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DIST = "pycollect-mpi"   # "pycollect" on PyPI is another project's


def test_the_version_is_the_installed_distribution_s_and_the_cli_prints_it():
    version = importlib.metadata.version(DIST)
    assert pycollect.__version__ == version and re.match(r"\d+\.\d+", version)
    proc = subprocess.run([sys.executable, "-m", "pycollect", "--version"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == f"pycollect {version}", (proc.stdout, proc.stderr)


def test_the_mpi_wheel_comes_only_with_the_mpich_extra():
    """A cluster install (no extra, mpi4py built against the site MPI) must not pull an MPI wheel."""
    requires = importlib.metadata.requires(DIST) or []
    mpich = [r for r in requires if r.lower().startswith("mpich")]
    assert mpich and all('extra == "mpich"' in r for r in mpich), requires
    assert any(r.startswith("matplotlib") and "extra" not in r for r in requires), "plots need no extra"


def test_metadata_names_the_licence_it_ships():
    meta = importlib.metadata.metadata(DIST)
    assert meta["Name"] == DIST
    with open(os.path.join(ROOT, "LICENSE")) as f:
        assert f.readline().strip() == "MIT License"


def test_no_hint_installs_the_other_project():
    """Every install hint in the package names our distribution (or a plain dependency), never bare 'pycollect'."""
    bad = []
    for folder, _, files in os.walk(os.path.join(ROOT, "pycollect")):
        for name in files:
            if name.endswith(".py"):
                with open(os.path.join(folder, name)) as f:
                    text = f.read()
                bad += [f"{name}: {m}" for m in re.findall(r"pip install[^\n]*", text)
                        if re.search(r"['\" ]pycollect(\[|['\" ]|$)", m)]
    assert not bad, bad


def test_metadata_lives_in_pyproject_and_setup_cfg_configures_tools_only():
    tomllib = pytest.importorskip("tomllib")   # Python 3.11 on
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        project = tomllib.load(f)["project"]
    assert project["name"] == DIST and project["dynamic"] == ["version"] and project["license"] == {"file": "LICENSE"}
    config = configparser.ConfigParser()
    config.read(os.path.join(ROOT, "setup.cfg"))
    assert config.sections() and all(s.startswith("tool:") or s == "mypy" or s.startswith("mypy-")
                                      for s in config.sections()), config.sections()


def test_readme_installs_with_an_mpi_or_against_the_site_s():
    """The default install brings MPICH's wheel; the cluster install is one command that names no MPI extra."""
    with open(os.path.join(ROOT, "README.md")) as f:
        installs = re.findall(r"^.*pip install .*$", f.read(), re.M)
    assert any('".[mpich]"' in line for line in installs) and any('".[mpich,test]"' in line for line in installs)
    site = [line for line in installs if "--no-binary=mpi4py" in line]
    assert len(site) == 1 and "mpich" not in site[0] and site[0].startswith("MPICC="), installs


def test_markdown_links_stay_inside_the_repository():
    """Every relative link of the project's Markdown names a file or folder of the repository (no path outside it)."""
    bad = []
    for folder, dirs, files in os.walk(ROOT):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        for name in files:
            if not name.endswith(".md"):
                continue
            path = os.path.join(folder, name)
            with open(path, encoding="utf-8") as f:
                targets = re.findall(r"\]\(([^)\s]+)\)", f.read())
            for target in targets:
                if re.match(r"[a-z]+:", target) or target.startswith("#"):
                    continue   # a web address or an anchor
                resolved = os.path.normpath(os.path.join(folder, target.split("#")[0]))
                if target.startswith("/") or not resolved.startswith(ROOT + os.sep) or not os.path.exists(resolved):
                    bad.append(f"{os.path.relpath(path, ROOT)}: {target}")
    assert not bad, bad


# each command line in one interpreter whose matplotlib cannot be imported: [argv, rc, stdout, stderr] per line
WITHOUT_MATPLOTLIB = """
import contextlib, io, json, sys
sys.modules["matplotlib"] = None
from pycollect import cli
for argv in json.loads(sys.argv[1]):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = cli.main(argv)
        except SystemExit as e:
            rc = e.code
    print(json.dumps([argv, rc, out.getvalue(), err.getvalue()]))
"""


def test_a_plot_without_matplotlib_is_one_line_and_exit_2(tmp_path):
    """matplotlib is a dependency; where it is missing anyway, each command that plots says so in one line."""
    argvs = [["explain", "pipeline", "--schedule", "gpipe", "--stages", "2", "--microbatches", "2"],
             ["bench", "allreduce", "-b", "8", "-e", "8"], ["bench", "tiers"]]
    argvs = [argv + ["--plot", str(tmp_path / f"{i}.png")] for i, argv in enumerate(argvs)]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "OMPI_", "SLURM_", "PYCOLLECT_"))}
    proc = subprocess.run([sys.executable, "-c", WITHOUT_MATPLOTLIB, json.dumps(argvs)], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, env={**env, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    runs = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [argv for argv, *_ in runs] == argvs
    for argv, rc, _, err in runs:
        assert rc == 2 and err.splitlines() == [f"pycollect {' '.join(argv[:2]) if argv[0] == 'bench' else argv[0]}: "
                                                "error: --plot needs matplotlib (pip install matplotlib)"], (argv, err)
    assert list(tmp_path.iterdir()) == []
