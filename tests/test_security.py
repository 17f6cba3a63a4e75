"""No pickle on the library's paths: mpi4py's lowercase calls (which pickle their objects) stay out of pycollect/.

mpi4py's lowercase methods (``comm.allgather(obj)``, ``comm.bcast(obj)``, ...) pickle what they
send and unpickle what they receive, so a peer could run code in this process. The library
(pycollect/ outside tools/, which are stand-alone programs) moves only buffers. A lowercase
call with one of those names is allowed only on pycollect's own objects: a module imported
from the package (``_ring.allgather``), the Communicator's own methods (``self.isend``) and
the ``"mpi"`` stand-in ``self._native``. Everything else, ``comm.mpi.allgather``,
``self._lib.bcast``, ``MPI.COMM_WORLD.gather``, ``local.allreduce``, is reported.
"""
import ast
import io
import pathlib
import tokenize

import pytest

from pycollect.select import Selector

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "pycollect"
PICKLING = {"allgather", "allreduce", "alltoall", "bcast", "bsend", "exscan", "gather", "ibsend", "irecv", "isend",
            "issend", "mrecv", "recv", "reduce", "scan", "scatter", "send", "sendrecv", "ssend"}
# pycollect's own objects: the "mpi" stand-in, and the groups the model layers are handed, which
# by the project's convention are pycollect Communicators (buffer-based methods of the same names),
# as are a ProcessMesh's groups and the mpi4py face's own Communicator (its wrapped MPI communicator is self.mpi).
OWN_OBJECTS = {"self._native", "group", "self.group", "mesh.tp", "mesh.dp", "mesh.pp", "self.tp", "self.dp", "self.pp",
               "self._embedding_group", "self.opt", "self.model_parallel", "self.pycollect"}
PICKLE_NAMES = {"pickle", "cPickle", "cloudpickle", "dill"}


def library_files() -> list[pathlib.Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "tools" not in p.relative_to(PACKAGE).parts)


class _Calls(ast.NodeVisitor):
    """Lowercase pickling calls of a module: (line, receiver, name, allowed)."""

    def __init__(self, tree: ast.Module):
        self.own_modules = {a.asname or a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.level
                            for a in n.names}
        self.classes: list[set[str]] = []
        self.found: list[tuple[int, str, str, bool]] = []

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self.classes.append({f.name for f in node.body if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))})
        self.generic_visit(node)
        self.classes.pop()

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr in PICKLING:
            receiver = ast.unparse(func.value)
            own_method = receiver == "self" and bool(self.classes) and func.attr in self.classes[-1]
            allowed = own_method or receiver in self.own_modules or receiver in OWN_OBJECTS
            self.found.append((node.lineno, receiver, func.attr, allowed))
        self.generic_visit(node)


def pickling_calls(source: str) -> list[tuple[int, str, str, bool]]:
    tree = ast.parse(source)
    calls = _Calls(tree)
    calls.visit(tree)
    return calls.found


def pickle_uses(source: str) -> list[tuple[int, str]]:
    """``pickle`` (and kin) as a name in code, and ``allow_pickle=True`` (comments and strings do not count)."""
    tokens = [t for t in tokenize.generate_tokens(io.StringIO(source).readline)
              if t.type not in (tokenize.COMMENT, tokenize.STRING, tokenize.NL, tokenize.NEWLINE)]
    found = [(t.start[0], t.string) for t in tokens if t.type == tokenize.NAME and t.string in PICKLE_NAMES]
    for a, b, c in zip(tokens, tokens[1:], tokens[2:]):
        if a.string == "allow_pickle" and b.string == "=" and c.string == "True":
            found.append((a.start[0], "allow_pickle=True"))
    return found


# -- the scan of the library ------------------------------------------------------------------------------------
def test_the_library_makes_no_pickling_mpi_call():
    bad, allowed = [], 0
    for path in library_files():
        for line, receiver, name, ok in pickling_calls(path.read_text()):
            allowed += ok
            if not ok:
                bad.append(f"{path.relative_to(PACKAGE.parent)}:{line}: {receiver}.{name}(...)")
    assert not bad, "mpi4py's pickling calls in the library (use the buffer-based capitalised ones):\n" + "\n".join(bad)
    assert allowed > 5, "the scan saw none of the library's own calls (_ring.allgather, self._native.allreduce)"


def test_the_library_does_not_use_pickle():
    bad = [f"{path.relative_to(PACKAGE.parent)}:{line}: {what}"
           for path in library_files() for line, what in pickle_uses(path.read_text())]
    assert not bad, "pickle in the library:\n" + "\n".join(bad)


def test_the_scan_covers_the_communicator_and_the_engine():
    names = {str(p.relative_to(PACKAGE)) for p in library_files()}
    assert {"comm.py", "engine/executor.py", "engine/validate.py", "engine/watchdog.py", "engine/trace.py"} <= names
    assert not any(n.startswith("tools/") for n in names)


# -- the scanner itself ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("code", [
    "comm.mpi.allgather(x)", "self.mpi.bcast(x, root=0)", "self._lib.allreduce(x)", "self._p2p.send(x, 1)",
    "MPI.COMM_WORLD.gather(x)", "local.allreduce(rank, op=MPI.MIN)", "comm.allgather(leader)",
    "mpi_comm.bcast(MPI.Wtime(), root=0)", "c.irecv(source=0)", "world.sendrecv(x, 1)", "comm._lib.scatter(parts)"])
def test_scanner_reports_pickling_calls(code):
    assert [ok for *_, ok in pickling_calls(code)] == [False]


@pytest.mark.parametrize("code", [
    "from . import _ring\n_ring.allgather(pos, ring, ranges, 'out')",
    "from .engine import mpi_native\nmpi_native.allreduce(comm, x, op, out, xp, True)",
    "class C:\n    def isend(self): pass\n    def send(self): self.isend()",
    "self._native.reduce(self, x, root, op, out, xp)",
    "comm._lib.Allgather(send, recv)", "MPI.COMM_WORLD.Bcast(buf, root=0)"])
def test_scanner_allows_the_librarys_own_and_buffer_calls(code):
    assert all(ok for *_, ok in pickling_calls(code))


def test_scanner_finds_pickle_but_not_in_words_or_comments():
    found = pickle_uses("import pickle\nnp.load(f, allow_pickle=True)\n")
    assert [w for _, w in found] == ["pickle", "allow_pickle=True"]
    assert pickle_uses("# no pickle here\ns = 'pickle'\nnp.load(f, allow_pickle=False)\npickled = 1\n") == []


def test_tuning_files_are_json_only(tmp_path):
    """A tuning file is parsed as JSON: a pickle is refused, never loaded."""
    path = tmp_path / "tuning.pkl"
    path.write_bytes(b"\x80\x04\x95\x15\x00\x00\x00\x00\x00\x00\x00}\x94\x8c\tallreduce\x94]\x94s.")
    with pytest.raises(ValueError):
        Selector(str(path))


GUARD = """
import sys
from mpi4py import MPI

def forbidden(*args, **kwargs):
    raise RuntimeError("pickle used on an MPI message")

MPI.pickle.__init__(forbidden, forbidden)   # every lowercase (pickling) mpi4py call now fails
from pycollect.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize("argv", [
    ["info"],
    ["bench", "all", "-b", "8", "-e", "1K", "-f", "32", "-n", "2", "-w", "1", "--algorithm", "all"],
    ["bench", "tiers", "-b", "8", "-e", "4K", "-f", "16", "-n", "2"],
    # a sweep up to 256K: below a few KiB the ping-pong shows no bandwidth and fit refuses the degenerate fit
    ["bench", "fit", "-b", "8", "-e", "256K", "-f", "32", "-n", "2", "--collectives", "allreduce"],
], ids=["info", "sweep", "tiers", "fit"])
def test_the_tools_never_pickle_at_run_time(tmp_path, argv):
    """The command line under mpiexec with mpi4py's pickling disabled: any lowercase call would fail it."""
    import os
    import subprocess
    import sys
    script = tmp_path / "guarded.py"
    script.write_text(GUARD)
    env = dict(os.environ, MPIEXEC_TIMEOUT="120", OMP_NUM_THREADS="1")
    proc = subprocess.run(["mpiexec", "-n", "2", sys.executable, str(script), *argv], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "pickle used" not in proc.stderr
