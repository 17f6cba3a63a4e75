"""The job scripts in job_scripts/, run for real with tiny sizes.

The Slurm scripts go through ``sbatch --wait`` on a real single-node Slurm brought up on
localhost for this session (slurmctld, slurmd and a private munged in a
scratch folder, on free ports, so that it touches no other Slurm or munged on the machine). The
fixture skips, saying why, when not root, when the Debian packages cannot be installed, or when
the daemons do not come up within a minute. The mpiexec scripts need no Slurm.
"""
from __future__ import annotations

import glob
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
JOBS = os.path.join(ROOT, "job_scripts")
SCHEMA = "pycollect.bench/1"
PACKAGES = ("slurmctld", "slurmd", "slurm-client", "munge")
BRING_UP_S = 60
INFO_MISMATCH = 3  # pycollect info's exit status when MPI's world size is not the launcher's
JOB_TIMEOUT_S = 150

# Tiny sweeps: each script finishes in seconds on two cores.
TINY = {
    "PYCOLLECT_TIERS_ARGS": "-b 8 -e 1K -f 128 -n 3 --collectives allreduce",
    "PYCOLLECT_SWEEP_ARGS": "-b 8 -e 1K -f 128 -n 3 -w 1 --algorithm all",
    "PYCOLLECT_COLLECTIVE": "allreduce",
    "PYCOLLECT_PYTHON": sys.executable,
    "OMP_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "MPIEXEC_TIMEOUT": "120",
    "PYTHONUNBUFFERED": "1",
}
# Set by an enclosing launcher or allocation; they would point srun and mpiexec at the wrong job.
FOREIGN = ("SLURM_", "SBATCH_", "SALLOC_", "SRUN_", "PMI_", "PMIX_", "OMPI_", "HYDRA_", "MPIR_CVAR_")


def clean_env(**extra: str) -> dict:
    """This process's environment without any launcher's or allocation's variables, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(FOREIGN)}
    env.update(extra)
    return env


def results_of(base: str) -> str:
    """The one run directory a script made under ``base`` (``base/<job id or timestamp>``)."""
    runs = [d for d in glob.glob(os.path.join(base, "*")) if os.path.isdir(d)]
    assert len(runs) == 1, f"expected one run directory under {base}, found {runs}"
    return runs[0]


def check_results(run_dir: str, world_size: int, tier_records: bool = True,
                  plots: tuple[str, ...] = ("tiers", "sweep")) -> None:
    """info/tiers/sweep JSON in the shared schema from ``world_size`` ranks, CSV beside them, PNG plots."""
    for kind in ("info", "tiers", "sweep"):
        path = os.path.join(run_dir, f"{kind}.json")
        assert os.path.isfile(path), f"{path} missing; the run directory holds {sorted(os.listdir(run_dir))}"
        with open(path) as f:
            data = json.load(f)
        assert data["schema"] == SCHEMA, (path, data.get("schema"))
        assert data["header"]["world_size"] == world_size, (path, data["header"].get("world_size"))
        if kind == "sweep" or (kind == "tiers" and tier_records):
            assert data["records"], f"{path} has no records"
            with open(os.path.join(run_dir, f"{kind}.csv")) as f:
                assert len(f.read().splitlines()) >= 2, f"{kind}.csv has no rows"
    for name in plots:
        with open(os.path.join(run_dir, f"{name}.png"), "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n", f"{name}.png is not a PNG"


def run_script(cmd: list[str], env: dict, cwd: str, timeout: float = JOB_TIMEOUT_S) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, (f"{' '.join(cmd)} exited {proc.returncode}\n--- stdout ---\n"
                                  f"{proc.stdout[-8000:]}\n--- stderr ---\n{proc.stderr[-8000:]}")
    return proc


# ---------------------------------------------------------------------------------------- Slurm


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _install_packages() -> None:
    """apt-get install the Slurm and munge packages, or skip saying why."""
    if shutil.which("apt-get") is None:
        pytest.skip("slurmctld is not installed and there is no apt-get to install it")
    cmd = ["apt-get", "install", "-y", "--no-install-recommends", "-o", "DPkg::Lock::Timeout=60", *PACKAGES]
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
        if proc.returncode != 0:  # stale package lists: refresh once
            subprocess.run(["apt-get", "update"], env=env, capture_output=True, timeout=300)
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired:
        pytest.skip(f"{' '.join(cmd)} took more than 300 s")
    if proc.returncode != 0 or shutil.which("slurmctld") is None:
        pytest.skip(f"could not install {' '.join(PACKAGES)}: {(proc.stdout + proc.stderr)[-1500:]}")


SLURM_CONF = """\
ClusterName=pycollect-ci
SlurmctldHost=localhost
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={dir}/munge/munge.socket
StateSaveLocation={dir}/state
SlurmdSpoolDir={dir}/spool
SlurmctldPidFile={dir}/slurmctld.pid
SlurmdPidFile={dir}/slurmd.pid
SlurmctldLogFile={dir}/log/slurmctld.log
SlurmdLogFile={dir}/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
MpiDefault=pmi2
ReturnToService=2
MinJobAge=4
{gres_types}NodeName=localhost CPUs=8 RealMemory=1000 {node_gres}State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP
"""


# MinJobAge=4 keeps `sbatch --wait` polling every 2 s: it lengthens its sleeps (2, 8, 32 s) only
# while they stay under MinJobAge/2, so that a finished job is not purged unseen; with the
# default (300 s) a 3-second job took 10 s to report and a 9-second one 42 s.
class LocalSlurm:
    """Slurm on localhost in a scratch folder: munged (private socket), slurmctld, slurmd."""

    def __init__(self, devices: list[str]):
        # In /tmp, not pytest's 0700 tmp folder: munged runs as the munge user and must reach its socket.
        self.dir = tempfile.mkdtemp(prefix="pycollect-slurm-")
        os.chmod(self.dir, 0o755)
        self.conf = os.path.join(self.dir, "slurm.conf")
        self.pid_files = [os.path.join(self.dir, f) for f in ("slurmd.pid", "slurmctld.pid", "munge/munged.pid")]
        self.devices = devices  # GPU device files, offered to jobs as gres "gpu"
        self.gpus = len(devices)
        self.bring_up_s: float | None = None

    def env(self, **extra: str) -> dict:
        return clean_env(SLURM_CONF=self.conf, **extra)

    def start(self) -> None:
        """Start the three daemons; raise RuntimeError if the node is not idle within BRING_UP_S."""
        t0 = time.monotonic()
        munge = os.path.join(self.dir, "munge")
        for sub in ("state", "spool", "log"):
            os.makedirs(os.path.join(self.dir, sub))
        os.makedirs(munge)
        shutil.chown(munge, "munge", "munge")
        ctld_port, slurmd_port = _free_ports(2)
        gres = {"gres_types": "GresTypes=gpu\n", "node_gres": f"Gres=gpu:{self.gpus} "} if self.gpus else \
            {"gres_types": "", "node_gres": ""}
        with open(self.conf, "w") as f:
            f.write(SLURM_CONF.format(dir=self.dir, ctld_port=ctld_port, slurmd_port=slurmd_port, **gres))
        if self.gpus:
            with open(os.path.join(self.dir, "gres.conf"), "w") as f:
                f.writelines(f"Name=gpu File={d}\n" for d in self.devices)
        key = "/etc/munge/munge.key"
        if not (os.path.isfile(key) and os.path.getsize(key) > 0):
            self._check(["mungekey", "--create", "--force"])
            shutil.chown(key, "munge", "munge")
        # munged refuses to run as root without --force; run it as munge, on a socket of its own.
        self._check(["runuser", "-u", "munge", "--", "munged", f"--socket={munge}/munge.socket",
                     f"--pid-file={munge}/munged.pid", f"--log-file={munge}/munged.log",
                     f"--seed-file={munge}/munged.seed"])
        env = self.env()
        self._check(["slurmctld", "-c"], env)
        self._check(["slurmd", "-N", "localhost"], env)
        while time.monotonic() - t0 < BRING_UP_S:
            state = subprocess.run(["sinfo", "-h", "-o", "%T"], env=env, capture_output=True, text=True, timeout=10)
            if state.stdout.strip() == "idle":
                self.bring_up_s = time.monotonic() - t0
                return
            time.sleep(0.2)
        raise RuntimeError(f"the node is not idle after {BRING_UP_S} s (sinfo: {state.stdout.strip()!r})")

    def stop(self) -> None:
        """Cancel every job, stop slurmd, slurmctld and munged by their pid files, remove the folder."""
        try:
            subprocess.run(["scancel", "--full", "--user=root"], env=self.env(), capture_output=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            pass
        pids = []
        for path in self.pid_files:
            try:
                with open(path) as f:
                    pid = int(f.read().split()[0])
                os.kill(pid, signal.SIGTERM)
                pids.append(pid)
            except (OSError, ValueError, IndexError):
                pass
        deadline = time.monotonic() + 10
        for pid in pids:
            while _alive(pid) and time.monotonic() < deadline:
                time.sleep(0.05)
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
        shutil.rmtree(self.dir, ignore_errors=True)

    def logs(self) -> str:
        out = []
        for path in sorted(glob.glob(os.path.join(self.dir, "log", "*.log")) + [f"{self.dir}/munge/munged.log"]):
            if os.path.exists(path):
                with open(path, errors="replace") as f:
                    out.append(f"--- {path}\n" + "".join(f.readlines()[-15:]))
        return "\n".join(out)

    def sbatch(self, script: str, *options: str, env: dict, cwd: str) -> subprocess.CompletedProcess:
        """``sbatch --wait`` a job script; returns the finished process (the job's exit status is its own)."""
        cmd = ["sbatch", "--wait", "--time=5", f"--output={cwd}/slurm-%j.out", *options, os.path.join(JOBS, script)]
        proc = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=JOB_TIMEOUT_S)
        logs = glob.glob(os.path.join(cwd, "slurm-*.out"))
        if logs:
            with open(logs[0], errors="replace") as f:
                proc.stdout += "\n--- job output ---\n" + f.read()[-8000:]
        return proc

    @staticmethod
    def _check(cmd: list[str], env: dict | None = None) -> None:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=30)
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}: {proc.stderr.strip()[-500:]}")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie of ours counts as gone
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _gpu_devices() -> list[str]:
    return sorted(glob.glob("/dev/nvidia[0-9]*"), key=lambda d: int(d.removeprefix("/dev/nvidia")))


@pytest.fixture(scope="session")
def slurm():
    """A running single-node Slurm on localhost with SLURM_CONF exported; torn down at the end."""
    if os.geteuid() != 0:
        pytest.skip("bringing up Slurm on localhost needs root")
    t0 = time.monotonic()
    if shutil.which("slurmctld") is None or shutil.which("munged") is None:
        _install_packages()
    t_install = time.monotonic() - t0
    # With GPUs, first with them as gres; should that configuration fail, without (GPU test skips).
    failures = []
    for devices in ([_gpu_devices(), []] if _gpu_devices() else [[]]):
        cluster = LocalSlurm(devices)
        try:
            cluster.start()
            break
        except (RuntimeError, OSError, subprocess.TimeoutExpired) as e:
            failures.append(f"{e}\n{cluster.logs()}")
            cluster.stop()
    else:
        pytest.skip("Slurm did not come up on localhost: " + "\n".join(failures))
    print(f"\nSlurm on localhost: packages {t_install:.1f} s, daemons up and idle in {cluster.bring_up_s:.2f} s",
          file=sys.stderr)
    mp = pytest.MonkeyPatch()
    mp.setenv("SLURM_CONF", cluster.conf)
    try:
        yield cluster
    finally:
        mp.undo()
        cluster.stop()


def _assert_job_ok(proc: subprocess.CompletedProcess, slurm: LocalSlurm) -> None:
    assert proc.returncode == 0, (f"sbatch --wait exited {proc.returncode}\n{proc.stdout[-10000:]}\n"
                                  f"--- stderr ---\n{proc.stderr[-3000:]}\n{slurm.logs()}")


@pytest.mark.parametrize("script, options", [
    ("slurm_1node.sbatch", ("--ntasks=2",)),
    ("slurm_multinode.sbatch", ("--nodes=1", "--ntasks=2", "--ntasks-per-node=2")),
])
def test_slurm_script(slurm, tmp_path, script, options):
    base = tmp_path / "results"
    proc = slurm.sbatch(script, *options, env=slurm.env(**TINY, PYCOLLECT_RESULTS=str(base)), cwd=str(tmp_path))
    _assert_job_ok(proc, slurm)
    run_dir = results_of(str(base))
    assert os.path.basename(run_dir).isdigit(), f"{run_dir} is not named by the job id"
    check_results(run_dir, world_size=2)


def test_slurm_gpu_script(slurm, tmp_path):
    cupy = pytest.importorskip("cupy")
    if not cupy.cuda.is_available() or not slurm.gpus:
        pytest.skip("no GPU here (CuPy sees none, or no /dev/nvidiaN for Slurm)")
    tasks = min(2, slurm.gpus)
    base = tmp_path / "results"
    proc = slurm.sbatch("slurm_gpu.sbatch", f"--ntasks={tasks}", f"--ntasks-per-node={tasks}", "--cpus-per-task=1",
                        env=slurm.env(**TINY, PYCOLLECT_RESULTS=str(base)), cwd=str(tmp_path))
    _assert_job_ok(proc, slurm)
    run_dir = results_of(str(base))
    # One rank has no pairs: its tiers file holds no records and no plot.
    check_results(run_dir, world_size=tasks, tier_records=tasks > 1,
                  plots=("tiers", "sweep") if tasks > 1 else ("sweep",))
    with open(os.path.join(run_dir, "sweep.json")) as f:
        assert json.load(f)["header"]["backend"] == "cupy", "the sweep did not run on CuPy arrays"


def test_a_failing_step_fails_the_job(slurm, tmp_path):
    """PYCOLLECT_SRUN_MPI=none starts two singletons: info fails, so does the job, and nothing runs after."""
    env = slurm.env(**TINY, PYCOLLECT_SRUN_MPI="none", PYCOLLECT_RESULTS=str(tmp_path / "results"))
    proc = slurm.sbatch("slurm_1node.sbatch", "--ntasks=2", env=env, cwd=str(tmp_path))
    assert proc.returncode != 0, proc.stdout[-5000:]
    assert re.search(r"ERROR: MPI world has 1 rank but SLURM_\w+ says 2", proc.stdout), proc.stdout[-5000:]
    assert "bench tiers" not in proc.stdout, proc.stdout[-5000:]


def test_srun_singletons_are_a_loud_error(slurm):
    """``srun --mpi=none -n 2``: two worlds of one while Slurm says two tasks; info exits 3 and says why."""
    proc = subprocess.run(["srun", "--mpi=none", "-n", "2", sys.executable, "-m", "pycollect", "info"],
                          env=slurm.env(), capture_output=True, text=True, timeout=60)
    output = proc.stdout + proc.stderr
    assert proc.returncode == INFO_MISMATCH, output
    assert re.search(r"ERROR: MPI world has 1 rank but SLURM_\w+ says 2", proc.stderr), output


def test_srun_pmi2_info_passes(slurm):
    proc = subprocess.run(["srun", "--mpi=pmi2", "-n", "2", sys.executable, "-m", "pycollect", "info"],
                          env=slurm.env(), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout[-5000:] + proc.stderr[-5000:]
    assert "world size      2" in proc.stdout, proc.stdout


# ------------------------------------------------------------------------------ mpiexec, no Slurm


@pytest.mark.parametrize("by_block", [False, True])
def test_local_two_nodes(tmp_path, by_block):
    base = tmp_path / "results"
    env = clean_env(**TINY, PYCOLLECT_RESULTS=str(base))
    if by_block:
        env["CLIQUES_BY_BLOCK"] = "1"
    run_script([os.path.join(JOBS, "local_two_nodes.sh")], env, str(tmp_path))
    run_dir = results_of(str(base))
    check_results(run_dir, world_size=4)
    with open(os.path.join(run_dir, "info.json")) as f:
        node_of = json.load(f)["header"]["node_of"]
    assert node_of == ([0, 0, 1, 1] if by_block else [0, 1, 0, 1]), node_of


def test_mpirun_hostfile_mpich(tmp_path):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("# one host, two ranks on it\nlocalhost\n")
    base = tmp_path / "results"
    env = clean_env(**TINY, PYCOLLECT_RESULTS=str(base), PYCOLLECT_MPI_FLAVOR="mpich",
                    PYCOLLECT_HOSTFILE=str(hostfile), PYCOLLECT_PPN="2")
    proc = run_script([os.path.join(JOBS, "mpirun_hostfile.sh")], env, str(tmp_path))
    assert f"mpiexec -f {hostfile} -ppn 2 -n 2" in proc.stdout, proc.stdout[-3000:]
    check_results(results_of(str(base)), world_size=2)


FAKE_OPENMPI_MPIRUN = """#!/bin/sh
# Stands in for Open MPI's mpirun: records its arguments, then runs the command under MPICH's
# mpiexec. Every flag mpirun_hostfile.sh gives takes one value.
echo "$@" >> "$FAKE_MPIRUN_LOG"
while [ "${1#-}" != "$1" ]; do
    [ "$1" = -n ] && np=$2
    shift 2
done
exec mpiexec -n "$np" "$@"
"""


def test_mpirun_hostfile_openmpi_command_line(tmp_path):
    """The Open MPI variant's command line (ppr mapping, -x forwarding), run through a stand-in mpirun."""
    hostfile = tmp_path / "hosts"
    hostfile.write_text("localhost slots=2\n")
    fake = tmp_path / "mpirun"
    fake.write_text(FAKE_OPENMPI_MPIRUN)
    fake.chmod(0o755)
    log = tmp_path / "mpirun.log"
    base = tmp_path / "results"
    env = clean_env(**TINY, PYCOLLECT_RESULTS=str(base), PYCOLLECT_HOSTFILE=str(hostfile), PYCOLLECT_PPN="2",
                    PYCOLLECT_MPIRUN=str(fake), FAKE_MPIRUN_LOG=str(log))
    run_script([os.path.join(JOBS, "mpirun_hostfile.sh")], env, str(tmp_path))
    calls = log.read_text().splitlines()
    assert len(calls) == 3, calls  # info, tiers, sweep
    for call in calls:
        assert call.startswith(f"--hostfile {hostfile} --map-by ppr:2:node -n 2 "), call
        for name in ("OMP_NUM_THREADS", "PYCOLLECT_SWEEP_ARGS", "PATH"):
            assert f"-x {name} " in call, (name, call)
    check_results(results_of(str(base)), world_size=2)
