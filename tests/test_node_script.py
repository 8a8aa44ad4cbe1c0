"""``slurm/node.sh`` as a training task meets it before any training starts: how it reads its arguments, and that a
marker an earlier job left in the same job folder is not taken for this job's (no server, no vLLM: the task stops at
its wait for the server, with one ``Error:`` line)."""

from __future__ import annotations

import http.server
import os
import socket
import subprocess
import threading
import time

import pytest

from t2s.settings import REPO_ROOT


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _trainer(tmp_path, *args, wait: int = 2) -> subprocess.CompletedProcess:
    """Task 1 of a two-task job whose server (task 0) never answers."""
    env = {**os.environ, "T2S_RANK": "1", "T2S_HOSTS": "127.0.0.1 127.0.0.1", "T2S_JOB_DIR": str(tmp_path / "job"),
           "SERVER_PORT": str(_free_port()), "T2S_SERVER_WAIT": str(wait), "GPUS_PER_NODE": "0"}
    return subprocess.run(["bash", str(REPO_ROOT / "slurm" / "node.sh"), *args], env=env, capture_output=True,
                          text=True, timeout=120)


@pytest.mark.parametrize("args", [["demo", "--output_dir", "x"], ["demo", "multi_gpu", "--output_dir", "x"],
                                  ["demo"]])
def test_a_flag_after_the_recipe_is_a_train_flag_not_an_accelerate_config(tmp_path, args):
    done = _trainer(tmp_path, *args)
    assert done.returncode == 1
    [line] = [line for line in done.stderr.splitlines() if line.startswith("Error:")]
    assert "did not answer /health within 2 s" in line, done.stderr  # the arguments were taken: it waited


def test_an_unknown_accelerate_config_is_still_named(tmp_path):
    done = _trainer(tmp_path, "demo", "no_such_config")
    assert done.returncode == 1
    assert done.stderr.strip() == "Error: no accelerate config accelerate_configs/no_such_config.yaml"


def test_an_earlier_jobs_marker_is_not_this_jobs(tmp_path):
    """A rerun into the same job folder (a requeued job, or the same T2S_JOB_DIR by hand) finds the last job's
    server-died: the trainer waits for this job's server instead of failing at once, and its wait is in seconds."""
    (tmp_path / "job").mkdir()
    (tmp_path / "job" / "server-died").touch()
    old = time.time() - 60
    os.utime(tmp_path / "job" / "server-died", (old, old))
    start = time.monotonic()
    done = _trainer(tmp_path, "demo", wait=3)
    elapsed = time.monotonic() - start
    assert done.returncode == 1 and "did not answer /health within 3 s" in done.stderr, done.stderr
    assert 2 <= elapsed < 30  # it waited (bash's SECONDS counts whole seconds), where the old marker ended it at once
    assert [p.name for p in (tmp_path / "job").iterdir()] == ["server-died"]  # its own start file is gone


class _Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 - http.server's name
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args):
        pass


def test_a_training_machine_that_fails_ends_its_task_with_its_own_error_line_and_no_launcher_traceback(tmp_path):
    """Training that stops at set-up (here a dataset that is not there), behind a server that answers /health: the task
    shows the trainer's one ``Error:`` line, not the launcher's traceback nor a second ``Error:`` line of its own, exits
    1, and marks the job failed with the training process's own exit code (2) for the other tasks."""
    server = http.server.HTTPServer(("127.0.0.1", 0), _Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    env = {**os.environ, "T2S_RANK": "1", "T2S_HOSTS": "127.0.0.1 127.0.0.1", "T2S_JOB_DIR": str(tmp_path / "job"),
           "SERVER_PORT": str(server.server_port), "MAIN_PORT": str(_free_port()), "GPUS_PER_NODE": "0",
           "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    try:
        done = subprocess.run(["bash", str(REPO_ROOT / "slurm" / "node.sh"), "smoke", "--dataset_path",
                               str(tmp_path / "missing.json"), "--output_dir", str(tmp_path / "run")], env=env,
                              capture_output=True, text=True, timeout=300)
    finally:
        server.shutdown()
    text = done.stdout + done.stderr
    assert done.returncode == 1, text[-3000:]
    errors = [line for line in text.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and "missing.json' not found" in errors[0], text[-3000:]
    assert "Traceback" not in text and "ChildFailedError" not in text, text[-3000:]
    assert "t2s: training on machine 0 (127.0.0.1) exited 2; the job stops" in done.stderr
    assert (tmp_path / "job" / "failed").read_text().strip() == "machine 0 exited 2"
