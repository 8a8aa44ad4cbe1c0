"""``t2s.training.launch``: ``accelerate launch`` that ends as a failed training process ends, with its exit code and
without the launcher's traceback; a process killed by a signal gets one ``Error:`` line. (The multi-process path, the
elastic agent's ``ChildFailedError``, is run by ``tests/test_node_script.py`` and ``tests/test_torchrun.py``.)"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from t2s.settings import REPO_ROOT
from t2s.training.launch import exit_code


def test_an_exit_code_is_passed_on_and_a_signal_is_named(capsys):
    assert exit_code(0) == 0 and exit_code(2, rank=1) == 2
    assert capsys.readouterr().err == ""
    assert exit_code(-signal.SIGKILL, rank=1) == 128 + signal.SIGKILL
    assert capsys.readouterr().err.splitlines() == [
        "Error: training process rank 1 was killed by SIGKILL (out of memory is the usual cause)"]


@pytest.mark.parametrize("body, code", [("sys.exit(3)", 3), ("os.kill(os.getpid(), signal.SIGKILL)", 137)])
def test_a_failed_single_process_run_ends_with_its_code_and_no_traceback(tmp_path, body, code):
    script = tmp_path / "train.py"
    script.write_text(f"import os, signal, sys\nprint('started', flush=True)\n{body}\n")
    done = subprocess.run([sys.executable, "-m", "t2s.training.launch", "--cpu", "--num_processes", "1",
                           "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", str(script)],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=300,
                          env=os.environ | {"OMP_NUM_THREADS": "1"})
    assert done.returncode == code, done.stderr[-3000:]
    assert done.stdout.splitlines() == ["started"]
    assert "Traceback" not in done.stderr and "CalledProcessError" not in done.stderr, done.stderr[-3000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("Error:")]
    assert errors == ([] if code == 3 else ["Error: the training process was killed by SIGKILL (out of memory is "
                                            "the usual cause)"]), done.stderr[-3000:]
