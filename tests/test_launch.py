"""``t2s.training.launch``: ``accelerate launch`` that ends as a failed training process ends, with its exit code and
without the launcher's traceback; a process killed by a signal gets one ``Error:`` line; an ``Error:`` line that every
process meets alike is printed once. (The multi-process path, the elastic agent's ``ChildFailedError``, is also run by
``tests/test_node_script.py`` and ``tests/test_torchrun.py``.)"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys

import pytest

from t2s.settings import REPO_ROOT
from t2s.training import launch
from t2s.training.launch import exit_code, main, reported_failure
from t2s.ui import console
from t2s.ui.console import LAUNCH_ERRORS_DIR, print_error_once


def test_an_exit_code_is_passed_on_and_a_signal_is_named(capsys):
    assert exit_code(0) == 0 and exit_code(2, rank=1) == 2
    assert capsys.readouterr().err == ""
    assert exit_code(-signal.SIGKILL, rank=1) == 128 + signal.SIGKILL
    assert capsys.readouterr().err.splitlines() == [
        "Error: training process rank 1 was killed by SIGKILL (out of memory is the usual cause)"]
    assert exit_code(-signal.SIGSEGV) == 128 + signal.SIGSEGV
    assert capsys.readouterr().err.splitlines() == ["Error: the training process was killed by SIGSEGV"]


def _failure(exitcode: int, timestamp: int):
    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

    failure = ProcessFailure(local_rank=0, pid=1, exitcode=exitcode, error_file="")
    failure.timestamp = timestamp
    return failure


def test_of_several_failures_a_signal_other_than_the_agents_sigterm_is_reported():
    # rank 1 killed (out of memory), rank 0's collective broken in the same second, rank 2 stopped by the agent
    killed = {0: _failure(1, 100), 1: _failure(-signal.SIGKILL, 100), 2: _failure(-signal.SIGTERM, 100)}
    assert reported_failure(killed) == (1, -signal.SIGKILL)
    assert reported_failure({0: _failure(-signal.SIGTERM, 101), 1: _failure(2, 100)}) == (1, 2)  # the earliest
    assert reported_failure({1: _failure(3, 100), 0: _failure(2, 100)}) == (0, 2)  # the same second: the lowest rank
    # rank 1 stopped by its own Error line (exit 2), rank 0 stopped by the agent in the same second: rank 1's code
    assert reported_failure({0: _failure(-signal.SIGTERM, 100), 1: _failure(2, 100)}) == (1, 2)
    assert reported_failure({1: _failure(-signal.SIGTERM, 100), 0: _failure(-signal.SIGTERM, 101)}) == (1, -15)
    # the agent's SIGKILL, 30 s after a SIGTERM that did not stop rank 1, follows from rank 0's failure
    assert reported_failure({0: _failure(2, 100), 1: _failure(-signal.SIGKILL, 131)}) == (0, 2)
    # rank 0 stopped by someone else's SIGTERM, rank 1's collective broken seconds later: the SIGTERM came first
    assert reported_failure({0: _failure(-signal.SIGTERM, 100), 1: _failure(1, 105)}) == (0, -signal.SIGTERM)


def test_of_the_agents_log_only_its_report_of_the_failure_is_left_out():
    def record(msg: str, *args) -> logging.LogRecord:
        return logging.LogRecord(launch.AGENT_LOGGER, logging.WARNING, __file__, 1, msg, args, None)

    assert not launch._not_a_failure_report(record("failed (exitcode: %s) local_rank: %s", 2, 1))
    assert not launch._not_a_failure_report(record("Sending process %s closing signal %s", 7, "SIGTERM"))
    assert launch._not_a_failure_report(record("Process %s did not exit after %s within %ss; abandoning", 7, 9, 30))
    assert launch._not_a_failure_report(record("Unable to shutdown process %s via %s, forcefully exiting", 7, 15))


def test_a_command_of_the_launchers_own_that_fails_is_raised_as_accelerate_raises_it(monkeypatch):
    import accelerate.commands.launch as accelerate_launch

    def launch_command(args):  # not accelerate's simple_launcher: as its `mpirun --version` check would fail
        raise subprocess.CalledProcessError(1, ["mpirun", "--version"])

    monkeypatch.setattr(accelerate_launch, "launch_command", launch_command)
    with pytest.raises(subprocess.CalledProcessError):
        main(["--cpu", "--num_processes", "1", "train.py"])


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


def test_an_error_line_is_printed_once_by_the_processes_of_one_launch(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv(LAUNCH_ERRORS_DIR, raising=False)
    print_error_once("Error: outside a launch")
    print_error_once("Error: outside a launch")
    assert capsys.readouterr().err.splitlines() == ["Error: outside a launch"] * 2
    monkeypatch.setenv(LAUNCH_ERRORS_DIR, str(tmp_path))
    for line in ["Error: a bad recipe", "Error: a bad recipe", "Error: rank 1's own", "Error: a bad recipe"]:
        print_error_once(line)
    assert capsys.readouterr().err.splitlines() == ["Error: a bad recipe", "Error: rank 1's own"]
    monkeypatch.setenv(LAUNCH_ERRORS_DIR, str(tmp_path / "gone"))  # a folder that cannot be written: printed
    print_error_once("Error: a bad recipe")
    assert capsys.readouterr().err.splitlines() == ["Error: a bad recipe"]


def test_a_command_line_error_is_printed_once_by_the_processes_of_one_launch(tmp_path, monkeypatch, capsys):
    from t2s.commands import main as t2s_main

    monkeypatch.setenv(LAUNCH_ERRORS_DIR, str(tmp_path))
    for _ in range(2):  # two ranks of `t2s train` without its recipe
        with pytest.raises(SystemExit) as stopped:
            t2s_main(["train"])
        assert stopped.value.code == 2
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith("Error: t2s train: ") and "--config" in line, line


def test_a_line_whose_first_process_was_stopped_before_printing_it_is_printed_by_another(tmp_path, monkeypatch,
                                                                                       capsys):
    import hashlib

    monkeypatch.setenv(LAUNCH_ERRORS_DIR, str(tmp_path))
    monkeypatch.setattr(console, "ERROR_PRINTED_WAIT_S", 0.2)
    (tmp_path / hashlib.sha256(b"Error: a bad recipe").hexdigest()).touch()  # marked, never said printed
    print_error_once("Error: a bad recipe")
    assert capsys.readouterr().err.splitlines() == ["Error: a bad recipe"]


def test_two_processes_that_meet_the_same_setup_error_print_it_once_without_the_agents_log():
    env = {k: v for k, v in os.environ.items() if k != LAUNCH_ERRORS_DIR} | {"OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "t2s.training.launch", "--config_file",
                           "accelerate_configs/multi_gpu.yaml", "--num_processes", "2", "-m", "t2s", "train",
                           "--config", "recipes/no-such-recipe.yaml"],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 1, done.stderr[-3000:]
    lines = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    assert lines == ["Error: recipe recipes/no-such-recipe.yaml not found."], lines  # not the agent's "failed" line
