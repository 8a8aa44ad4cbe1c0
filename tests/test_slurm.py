"""Multi-node training as ``slurm/train.sbatch`` runs it: ``slurm/node.sh`` once per task, task 0 the vLLM server
(`make serve`) and each other task one training machine (``accelerate launch`` with its machine rank).

Three tasks stand in for three nodes on loopback, each its own process group with its own rank. The module runs one
such job that trains (``two_machine_job``): ``slurm/train.sbatch`` itself, submitted to a real one-host Slurm cluster
(Debian's ``slurm-wlm``, ``make install-slurm``) that the fixture starts in a temp folder with its own munge socket
and ports (three tasks on one host, as ``--nodes 1 --ntasks 3``); where no cluster can start here, the three tasks as
Slurm's ``srun`` would start them (``T2S_RANK`` for ``SLURM_PROCID``, ``T2S_HOSTS`` for the job's node list). Either
way the two machines form one gloo group of two processes, train the tiny model two steps against the real vLLM CPU
server, and each plays its own share of every batch. A server that dies ends every task with one ``Error:`` line.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.vllm_support import EAGER_SERVER_ENV, HANG_GUARD_S, MODULE_TIMEOUT_S, ROOT, SERVER_MAX_MODEL_LEN, \
    VLLM_ENV, attention_model, free_port

pytest.importorskip("vllm", reason="vLLM is not installed (make install-vllm)")

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(MODULE_TIMEOUT_S)]

NODE = ROOT / "slurm" / "node.sh"
TASKS = 3  # the server and two training machines
STEPS, BATCH = 2, 4  # per machine: one group of 4 rollouts per step
LOGP_GAP_BOUND = 0.01


def job_env(job: Path) -> dict[str, str]:
    """What every task of a test job sees: its folder, free ports, a CPU machine, and the tests' server settings."""
    python = ROOT / ".venv" / "bin" / "python"
    return os.environ | VLLM_ENV | {
        "T2S_JOB_DIR": str(job), "SERVER_PORT": str(free_port()), "MAIN_PORT": str(free_port()), "GPUS_PER_NODE": "0",
        "MAX_MODEL_LEN": str(SERVER_MAX_MODEL_LEN), **EAGER_SERVER_ENV, "OMP_NUM_THREADS": "1",
        "PYTHON": str(python) if python.is_file() else "python3"}


def train_flags(model: Path, output: Path) -> list[str]:
    return ["--model_name_or_path", str(model), "--output_dir", str(output), "--max_steps", str(STEPS), "--mode",
            "withheld", "--per_device_train_batch_size", str(BATCH), "--num_generations", str(BATCH),
            "--save_strategy", "no"]


def check_trained_as_one_group(output: Path, server_log: Path) -> None:
    summary = json.loads((output / "train_summary.json").read_text())
    assert summary["global_step"] == STEPS and summary["processes"] == 2
    assert summary["episodes_by_process"] == [STEPS * BATCH, STEPS * BATCH]  # both machines played their share
    steps = [json.loads(line) for line in (output / "metrics.jsonl").read_text().splitlines()]
    gaps = [step["sampling/logp_gap/mean"] for step in steps if "sampling/logp_gap/mean" in step]
    assert len(gaps) == STEPS and max(gaps) < LOGP_GAP_BOUND, gaps  # every step sampled the trainer's weights
    assert server_log.read_text(errors="replace").count("POST /collective_rpc") >= STEPS - 1  # synced between steps
    assert (output / ".server-weights" / "model.safetensors").is_file()


def run_job(tmp_path: Path, *train_flags: str) -> list[subprocess.CompletedProcess]:
    """Start every task of one job as its own process group; when one fails, stop the others, as
    ``srun --kill-on-bad-exit`` does. Returns each task's finished process, in rank order."""
    env = job_env(tmp_path / "job") | {"T2S_HOSTS": " ".join(["127.0.0.1"] * TASKS)}
    logs = [open(tmp_path / f"task{rank}.log", "w+") for rank in range(TASKS)]
    tasks = [subprocess.Popen(["bash", str(NODE), "smoke", "multi_gpu", *train_flags], cwd=ROOT,
                              env=env | {"T2S_RANK": str(rank)}, stdout=logs[rank], stderr=subprocess.STDOUT,
                              start_new_session=True) for rank in range(TASKS)]
    deadline = time.monotonic() + HANG_GUARD_S
    try:
        while any(task.poll() is None for task in tasks):
            if any(task.returncode not in (None, 0) for task in tasks) or time.monotonic() > deadline:
                break
            time.sleep(1)
        settle = time.monotonic() + 5  # after a failure, the others' own ends, as the failed task's markers reach them
        while any(task.poll() is None for task in tasks) and time.monotonic() < settle:
            time.sleep(0.2)
    finally:
        for task in tasks:
            if task.poll() is None:
                os.killpg(task.pid, signal.SIGTERM)
                task.wait(60)
    done = []
    for rank, (task, log) in enumerate(zip(tasks, logs)):
        log.seek(0)
        done.append(subprocess.CompletedProcess(task.args, task.returncode, log.read(), ""))
        log.close()
    return done


def test_a_server_that_dies_ends_every_task_with_one_error_line(tmp_path):
    done = run_job(tmp_path, "--model_name_or_path", str(tmp_path / "no-such-model"), "--output_dir",
                   str(tmp_path / "run"))
    assert [task.returncode for task in done] == [1, 1, 1], [task.stdout[-2000:] for task in done]
    for task in done:
        errors = [line for line in task.stdout.splitlines() if line.startswith("Error:")]
        assert len(errors) == 1 and "vLLM server" in errors[0] and "exited" in errors[0], task.stdout[-2000:]
        assert "Traceback" not in task.stdout
    assert not (tmp_path / "run").exists()  # no trainer started


# ------------------------------------------------------------------------------------------ a real Slurm cluster
@contextlib.contextmanager
def one_host_slurm(folder: Path):
    """A one-host Slurm cluster (slurmctld, slurmd, and a munged of its own) in ``folder``; yields the environment its
    commands need (``SLURM_CONF``), or the reason none can run here (a str), and shuts it down afterwards."""
    missing = [name for name in ("slurmctld", "slurmd", "sbatch", "scontrol", "munged") if shutil.which(name) is None]
    if missing:
        yield f"Slurm is not installed ({', '.join(missing)}): `make install-slurm` (as root) installs it"
        return
    if os.geteuid() != 0:
        yield "a one-host Slurm cluster is started as root (slurmd runs each job as its user)"
        return
    munge_socket, host = folder / "munge.socket", socket.gethostname().split(".")[0]
    key = folder / "munge.key"  # a key of its own: the cluster needs nothing from /etc/munge
    key.write_bytes(os.urandom(1024))
    key.chmod(0o600)
    subprocess.run(["munged", "--force", f"--socket={munge_socket}", f"--key-file={key}",
                    f"--pid-file={folder / 'munged.pid'}",
                    f"--log-file={folder / 'munged.log'}", f"--seed-file={folder / 'munged.seed'}"], check=True,
                   capture_output=True, timeout=60)
    (folder / "state").mkdir()
    (folder / "spool").mkdir()
    conf = folder / "slurm.conf"
    conf.write_text("\n".join([
        "ClusterName=t2stest", f"SlurmctldHost={host}(127.0.0.1)", "SlurmUser=root", "SlurmdUser=root",
        f"SlurmctldPort={free_port()}", f"SlurmdPort={free_port()}", "AuthType=auth/munge",
        f"AuthInfo=socket={munge_socket}", f"StateSaveLocation={folder / 'state'}",
        f"SlurmdSpoolDir={folder / 'spool'}",
        f"SlurmctldPidFile={folder / 'slurmctld.pid'}", f"SlurmdPidFile={folder / 'slurmd.pid'}",
        f"SlurmctldLogFile={folder / 'slurmctld.log'}", f"SlurmdLogFile={folder / 'slurmd.log'}",
        "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none", "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core", "ReturnToService=2", "MpiDefault=none", "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
        # `sbatch --wait` asks for the job's state after 2 s, 8 s later, then every 32 s, unless a finished job's
        # record may be purged sooner (MinJobAge, 300 s by default): at 5 s it asks every 2 s, and sees the job end
        # within 2 s instead of up to 32
        "MinJobAge=5",
        # as many CPUs as tasks (three nodes' worth on one host); slurmd takes the configured count as given
        "SlurmdParameters=config_overrides",
        f"NodeName={host} NodeAddr=127.0.0.1 CPUs={max(TASKS, os.cpu_count() or 1)} RealMemory=4000",
        f"PartitionName=t2stest Nodes={host} Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE", ""]))
    env = os.environ | {"SLURM_CONF": str(conf)}
    try:
        for daemon in ("slurmctld", "slurmd"):
            started = subprocess.run([daemon], env=env, capture_output=True, text=True, timeout=60)
            if started.returncode != 0:  # a machine that cannot host one (a container without what slurmd needs)
                yield f"{daemon} did not start here: {(started.stderr or started.stdout).strip()[-300:]}"
                return
        deadline = time.monotonic() + 120
        while "idle" not in subprocess.run(["sinfo", "-h", "-o", "%t"], env=env, capture_output=True,
                                           text=True).stdout:
            if time.monotonic() > deadline:
                logs = " | ".join(p.read_text(errors="replace").strip()[-300:] for p in folder.glob("slurm*.log"))
                yield f"the one-host Slurm cluster's node did not come up within 120 s: {logs}"
                return
            time.sleep(1)
        yield env
    finally:
        subprocess.run(["scontrol", "shutdown"], env=env, capture_output=True, timeout=60)
        subprocess.run(["munged", "--stop", f"--socket={munge_socket}"], capture_output=True, timeout=60)


@dataclass(frozen=True)
class TrainingJob:
    """The module's one training job: how it was launched (``slurm`` is None when it ran without Slurm, with
    ``no_slurm`` saying why), each task's exit code and output (one log for the whole job under Slurm), and its
    folders."""

    slurm: dict | None
    no_slurm: str
    exits: list[int]
    outputs: list[str]
    output: Path
    job: Path


@pytest.fixture(scope="module")
def two_machine_job(tmp_path_factory) -> TrainingJob:
    """One job of three tasks that trains: under a real one-host Slurm cluster where one starts here, else as
    :func:`run_job`'s three process groups. It runs once: both launch the same ``slurm/node.sh`` on one host."""
    tmp_path = tmp_path_factory.mktemp("two-machine-job")
    output, job = tmp_path / "run", tmp_path / "job"
    flags = train_flags(attention_model(tmp_path / "model"), output)
    (tmp_path / "slurm").mkdir()
    with one_host_slurm(tmp_path / "slurm") as slurm:
        if isinstance(slurm, str):
            done = run_job(tmp_path, *flags)
            return TrainingJob(None, slurm, [t.returncode for t in done], [t.stdout for t in done], output, job)
        log = tmp_path / "slurm.out"
        done = subprocess.run(["sbatch", "--wait", "--nodes", "1", "--ntasks", str(TASKS), "--ntasks-per-node",
                               str(TASKS), "--output", str(log), "slurm/train.sbatch", "smoke", "multi_gpu", *flags],
                              cwd=ROOT, env=job_env(job) | slurm, capture_output=True, text=True,
                              timeout=HANG_GUARD_S)
        text = log.read_text(errors="replace") if log.is_file() else ""
        return TrainingJob(slurm, "", [done.returncode], [done.stdout + done.stderr + text], output, job)


def test_two_machines_train_as_one_group_against_the_server(two_machine_job):
    for rank, (code, text) in enumerate(zip(two_machine_job.exits, two_machine_job.outputs)):
        assert code == 0, f"task {rank}:\n{text[-4000:]}"
    text = "\n".join(two_machine_job.outputs)
    assert "machine 0 of 2" in text and "machine 1 of 2" in text, text[-2000:]
    if two_machine_job.slurm is None:  # each task's own log: the machines are tasks 1 and 2
        assert "machine 0 of 2" in two_machine_job.outputs[1] and "machine 1 of 2" in two_machine_job.outputs[2]
    check_trained_as_one_group(two_machine_job.output, two_machine_job.job / "server.log")


def test_the_sbatch_script_trains_under_a_real_slurm(two_machine_job):
    if two_machine_job.slurm is None:
        pytest.skip(two_machine_job.no_slurm)
    assert two_machine_job.exits == [0], two_machine_job.outputs[0][-4000:]  # sbatch --wait: the job's exit code
    assert "SLURM_CONF" in two_machine_job.slurm
    check_trained_as_one_group(two_machine_job.output, two_machine_job.job / "server.log")
