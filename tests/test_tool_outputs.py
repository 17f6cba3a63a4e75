"""The tools' output files: checked before any work, one line and exit status 2 when one cannot be written, and
never a partial or temporary file left behind (``report``, ``info``, ``explain``)."""
import os
import subprocess
import sys

import pytest

from pycollect import cli
from pycollect.tools import report

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LEAKY = ("SLURM_", "PMI_", "PMIX_", "OMPI_", "HYDRA_", "MPI_LOCAL", "MPIR_CVAR_", "PYCOLLECT_")
UNWRITABLE = "/proc/nope/x.json"   # /proc takes no new files, even from root


def _main(*argv):
    """``pycollect ARGV`` in this process: its exit status."""
    try:
        return cli.main(list(argv))
    except SystemExit as e:
        return e.code


class Unprintable:
    def __str__(self):
        raise RuntimeError("a record that cannot be written")


@pytest.mark.parametrize("write", [lambda p: report.write_json(p, "test", {}, [{"a": 1}, {"a": Unprintable()}]),
                                   lambda p: report.write_csv(p, [{"a": 1}, {"a": Unprintable()}], ["a"])])
def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary_one(tmp_path, write):
    target = tmp_path / "out"
    target.write_text("the last run's")
    with pytest.raises((TypeError, RuntimeError)):   # halfway through the records
        write(str(target))
    assert [p.name for p in tmp_path.iterdir()] == ["out"] and target.read_text() == "the last run's"


def test_a_failed_rename_leaves_no_temporary_file(tmp_path):
    target = tmp_path / "taken"
    target.mkdir()                     # the rename onto a folder fails after the whole file was written
    with pytest.raises(OSError):
        report.write_json(str(target), "test", {}, [{"a": 1}])
    assert [p.name for p in tmp_path.iterdir()] == ["taken"] and not list(target.iterdir())


def test_output_problem_names_the_flag_and_why(tmp_path):
    assert report.output_problem(str(tmp_path / "new" / "dir" / "x.json"), "--json") is None   # folders are made
    assert not (tmp_path / "new").exists() and not list(tmp_path.iterdir())                    # ... when written
    assert "--json" in report.output_problem(UNWRITABLE, "--json") and "/proc" in report.output_problem(UNWRITABLE,
                                                                                                         "--json")
    assert report.output_problem(str(tmp_path), "--csv") == f"--csv {tmp_path}: is a directory"
    (tmp_path / "file").write_text("")
    assert "is not a directory" in report.output_problem(str(tmp_path / "file" / "x.json"), "--plot")


def test_info_json_to_a_folder_is_one_line_exit_2_and_leaves_nothing(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(LEAKY)}
    folder = tmp_path / "out.json"
    folder.mkdir()
    proc = subprocess.run([sys.executable, "-m", "pycollect", "info", "--json", str(folder)], cwd=ROOT, timeout=90,
                          env={**env, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.splitlines() == [f"pycollect info: error: --json {folder}: is a directory"], proc.stderr
    assert [p.name for p in tmp_path.iterdir()] == ["out.json"] and not list(folder.iterdir())


@pytest.mark.parametrize("argv, flag", [
    (["explain", "allreduce", "--algorithm", "ring", "--size", "4", "--bytes", "1K", "--json", UNWRITABLE], "--json"),
    (["explain", "pipeline", "--schedule", "1f1b", "--stages", "2", "--microbatches", "2", "--json", UNWRITABLE],
     "--json"),
    (["explain", "pipeline", "--schedule", "1f1b", "--stages", "2", "--microbatches", "2", "--plot", UNWRITABLE],
     "--plot"),
])
def test_explain_refuses_an_unwritable_output_before_any_work(argv, flag, capsys):
    status = _main(*argv)
    out, err = capsys.readouterr()
    assert status == 2 and out == "", (status, out)
    assert err.startswith(f"pycollect explain: error: {flag} {UNWRITABLE}") and err.count("\n") == 1, err


def test_explain_write_failure_after_the_check_is_exit_2(tmp_path, capsys, monkeypatch):
    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied", str(tmp_path / "x.json"))
    monkeypatch.setattr(report, "write_json", refuse)    # the file system changed between the check and the write
    status = _main("explain", "allreduce", "--algorithm", "ring", "--size", "4", "--bytes", "1K",
                   "--json", str(tmp_path / "x.json"))
    err = capsys.readouterr().err
    assert status == 2 and err.startswith("pycollect explain: error: cannot write --json"), err
