"""Multi-node training as ``slurm/train.sbatch`` runs it: ``slurm/node.sh`` once per task, task 0 the vLLM server
(`make serve`) and each other task one training machine (``accelerate launch`` with its machine rank).

Here three tasks stand in for three nodes on loopback, each its own process group with its own rank, as Slurm's
``srun`` would start them (``T2S_RANK`` for ``SLURM_PROCID``, ``T2S_HOSTS`` for the job's node list). The two machines
form one gloo group of two processes, train the tiny model two steps against the real vLLM CPU server, and each plays
its own share of every batch. A server that dies ends every task with one ``Error:`` line.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.vllm_support import HANG_GUARD_S, MODULE_TIMEOUT_S, ROOT, SERVER_MAX_MODEL_LEN, VLLM_ENV, attention_model, \
    free_port

pytest.importorskip("vllm", reason="vLLM is not installed (make install-vllm)")

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(MODULE_TIMEOUT_S)]

NODE = ROOT / "slurm" / "node.sh"
TASKS = 3  # the server and two training machines
STEPS, BATCH = 2, 4  # per machine: one group of 4 rollouts per step
LOGP_GAP_BOUND = 0.01


def run_job(tmp_path: Path, *train_flags: str) -> list[subprocess.CompletedProcess]:
    """Start every task of one job as its own process group; when one fails, stop the others, as
    ``srun --kill-on-bad-exit`` does. Returns each task's finished process, in rank order."""
    job = tmp_path / "job"
    env = os.environ | VLLM_ENV | {
        "T2S_HOSTS": " ".join(["127.0.0.1"] * TASKS), "T2S_JOB_DIR": str(job), "SERVER_PORT": str(free_port()),
        "MAIN_PORT": str(free_port()), "GPUS_PER_NODE": "0", "MAX_MODEL_LEN": str(SERVER_MAX_MODEL_LEN),
        "SERVE_ARGS": "--enforce-eager", "OMP_NUM_THREADS": "1", "PYTHON": str(ROOT / ".venv" / "bin" / "python")
        if (ROOT / ".venv" / "bin" / "python").is_file() else "python3"}
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
        time.sleep(5)  # the others' own ends, as a failed task's markers reach them
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


def test_two_machines_train_as_one_group_against_the_server(tmp_path):
    model = attention_model(tmp_path / "model")
    output = tmp_path / "run"
    done = run_job(tmp_path, "--model_name_or_path", str(model), "--output_dir", str(output), "--max_steps",
                   str(STEPS), "--mode", "withheld", "--per_device_train_batch_size", str(BATCH), "--num_generations",
                   str(BATCH), "--save_strategy", "no")
    for rank, task in enumerate(done):
        assert task.returncode == 0, f"task {rank}:\n{task.stdout[-4000:]}"
    assert "machine 0 of 2" in done[1].stdout and "machine 1 of 2" in done[2].stdout
    summary = json.loads((output / "train_summary.json").read_text())
    assert summary["global_step"] == STEPS and summary["processes"] == 2
    assert summary["episodes_by_process"] == [STEPS * BATCH, STEPS * BATCH]  # both machines played their share
    steps = [json.loads(line) for line in (output / "metrics.jsonl").read_text().splitlines()]
    gaps = [step["sampling/logp_gap/mean"] for step in steps if "sampling/logp_gap/mean" in step]
    assert len(gaps) == STEPS and max(gaps) < LOGP_GAP_BOUND, gaps  # every step sampled the trainer's weights
    server_log = (tmp_path / "job" / "server.log").read_text(errors="replace")
    assert server_log.count("POST /collective_rpc") >= STEPS - 1  # the weights reached the server between steps
    assert (output / ".server-weights" / "model.safetensors").is_file()


def test_a_server_that_dies_ends_every_task_with_one_error_line(tmp_path):
    done = run_job(tmp_path, "--model_name_or_path", str(tmp_path / "no-such-model"), "--output_dir",
                   str(tmp_path / "run"))
    assert [task.returncode for task in done] == [1, 1, 1], [task.stdout[-2000:] for task in done]
    for task in done:
        errors = [line for line in task.stdout.splitlines() if line.startswith("Error:")]
        assert len(errors) == 1 and "vLLM server" in errors[0] and "exited" in errors[0], task.stdout[-2000:]
        assert "Traceback" not in task.stdout
    assert not (tmp_path / "run").exists()  # no trainer started
