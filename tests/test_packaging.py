"""The distribution as installed: its own name, its version from git, MPI as an extra, hints that name it."""
import importlib.metadata
import os
import re
import subprocess
import sys

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
