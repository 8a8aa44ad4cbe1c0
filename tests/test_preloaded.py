"""``tests.preloaded``: a command started from a preloaded interpreter behaves as the same command in a fresh one.

Each check runs one probe both ways (``T2S_TEST_FRESH_PROCESSES=1`` for the fresh one) and compares what the probe
saw and printed, and how it ended: arguments, search path, working folder, environment, torch's thread count, output,
``atexit`` handlers, a thread left running, exit statuses, an uncaught exception's traceback, a signal and a timeout.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from tests import preloaded

PROBE = textwrap.dedent("""\
    import atexit, json, os, sys, threading, time
    if "threads" in sys.argv:
        import torch
    if "vllm" in sys.argv:
        import vllm.entrypoints.llm

    atexit.register(lambda: print("atexit ran", flush=True))
    worker = threading.Thread(target=lambda: (time.sleep(0.3), print("thread joined", flush=True)))
    worker.start()
    print(json.dumps({"argv": sys.argv, "path": sys.path[:3], "cwd": os.getcwd(), "name": __name__,
                      "file": globals().get("__file__"), "marker": os.environ.get("T2S_PROBE_MARKER"),
                      "threads": "threads" in sys.argv and torch.get_num_threads(), "tty": sys.stdout.isatty(),
                      "vllm_imported": "vllm" in sys.modules,
                      "set_by_vllm": os.environ.get("TORCHINDUCTOR_COMPILE_THREADS")}), flush=True)
    print("to stderr", file=sys.stderr)
    how = sys.argv[-1]
    if how == "raise":
        raise ValueError("from the probe")
    if how == "interrupt":
        raise KeyboardInterrupt
    if how == "message":
        sys.exit("a message")
    if how == "kill":
        os.kill(os.getpid(), 9)
    sys.exit(int(how))
""")


def both(argv: list[str], env: dict, cwd, preload: str = "torch"):
    """``argv`` in a fresh interpreter (``subprocess.run``), then from ``preload``, with the same environment and
    folder: the two CompletedProcesses."""
    fresh = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=300)
    forked = preloaded.run(argv, preload=preload, env=env, timeout=300, cwd=cwd)
    return fresh, forked


@pytest.fixture
def probe(tmp_path, monkeypatch):
    """The probe as a script and as a module of a package on ``PYTHONPATH``; the worker's environment with a marker."""
    monkeypatch.delenv(preloaded.FRESH, raising=False)
    (tmp_path / "pkg" / "probes").mkdir(parents=True)
    (tmp_path / "pkg" / "probes" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "probes" / "probe.py").write_text(PROBE)
    (tmp_path / "probe.py").write_text(PROBE)
    env = dict(os.environ, T2S_PROBE_MARKER="marked", PYTHONPATH=str(tmp_path / "pkg"))
    return tmp_path, env


def test_fresh_processes_start_fresh_interpreters(monkeypatch, tmp_path):
    monkeypatch.setenv(preloaded.FRESH, "1")
    (tmp_path / "pid.py").write_text("import os\nprint(os.getppid())\n")
    with open(tmp_path / "out", "w") as out:
        process = preloaded.start([sys.executable, str(tmp_path / "pid.py")], preload="torch", env=dict(os.environ),
                                  stdout=out, stderr=out)
        assert isinstance(process, subprocess.Popen) and process.wait(timeout=60) == 0
    assert (tmp_path / "out").read_text() == f"{os.getpid()}\n"  # started by this process itself


@pytest.mark.parametrize("how", ["0", "3", "message", "raise", "interrupt", "kill"])
@pytest.mark.parametrize("form", ["script", "module"])
def test_a_preloaded_command_is_the_fresh_command(probe, form, how):
    folder, env = probe
    target = [str(folder / "probe.py")] if form == "script" else ["-m", "probes.probe"]
    fresh, forked = both([sys.executable, *target, "x y", how], env, cwd=folder)
    assert (forked.returncode, forked.stdout, forked.stderr) == (fresh.returncode, fresh.stdout, fresh.stderr)
    expected = {"0": 0, "3": 3, "message": 1, "raise": 1, "interrupt": -signal.SIGINT, "kill": -signal.SIGKILL}[how]
    assert fresh.returncode == expected, fresh.stderr[-2000:]
    assert '"marker": "marked"' in fresh.stdout and '"vllm_imported": false' in fresh.stdout
    if how != "kill":  # a killed process runs no exit handlers, fresh or forked
        assert fresh.stdout.endswith("thread joined\natexit ran\n"), fresh.stdout
    if how == "raise":
        assert fresh.stderr.endswith("ValueError: from the probe\n")


def test_a_variable_read_at_import_gets_an_interpreter_of_its_own(probe):
    """torch reads ``OMP_NUM_THREADS`` as it is imported: a command with another count than the worker's is served by
    an interpreter started with its count, not the worker's."""
    folder, env = probe
    probe_argv = [sys.executable, str(folder / "probe.py"), "threads", "0"]
    mine = preloaded.run(probe_argv, preload="torch", env=env, timeout=300, cwd=folder)
    other = "2" if json.loads(mine.stdout.splitlines()[0])["threads"] == 1 else "1"  # torch caps it at the cores
    fresh, forked = both(probe_argv, env | {"OMP_NUM_THREADS": other}, cwd=folder)
    assert forked.stdout == fresh.stdout and f'"threads": {other},' in forked.stdout


def test_what_the_preloaded_imports_set_in_the_environment_the_command_has(probe):
    """vLLM's import sets ``TORCHINDUCTOR_COMPILE_THREADS``: a command from the vLLM preload (forked from the torch
    one) has it, as the same command importing vLLM itself does."""
    pytest.importorskip("vllm", reason="vLLM is not installed (make install-vllm)")
    folder, env = probe
    env = {key: value for key, value in env.items() if key != "TORCHINDUCTOR_COMPILE_THREADS"}  # as a user's shell
    fresh, forked = both([sys.executable, str(folder / "probe.py"), "vllm", "0"], env, cwd=folder, preload="vllm")
    assert forked.returncode == fresh.returncode == 0, fresh.stderr[-2000:]
    seen = [json.loads(done.stdout.splitlines()[0]) for done in (fresh, forked)]
    assert seen[0] == seen[1] and seen[0]["set_by_vllm"] == "1" and seen[0]["vllm_imported"]


def test_a_vllm_command_shares_the_workers_interpreters():
    """The suite's vLLM commands run with VLLM_ENV on top of the worker's environment: nothing in it that a library
    reads as it is imported differs from the worker's own (conftest sets ``DO_NOT_TRACK``), so they are served by the
    same preloaded interpreters as every other command, not by a second chain that imports torch and vLLM again."""
    from tests.vllm_support import VLLM_ENV

    assert preloaded._import_key(os.environ | VLLM_ENV) == preloaded._import_key(dict(os.environ))


def test_a_command_past_its_timeout_is_killed(probe):
    folder, env = probe
    (folder / "slow.py").write_text("import time\ntime.sleep(120)\n")
    with pytest.raises(subprocess.TimeoutExpired):
        preloaded.run([sys.executable, str(folder / "slow.py")], preload="torch", env=env, timeout=1, cwd=folder)
    with open(folder / "out", "w") as out:
        process = preloaded.start([sys.executable, str(folder / "slow.py")], preload="torch", env=env, stdout=out,
                                  stderr=out, cwd=folder, new_session=True)
        assert isinstance(process, preloaded.Started) and process.poll() is None
        assert os.getpgid(process.pid) == process.pid  # a session of its own, as start_new_session gives
        process.kill()
        assert process.wait(timeout=60) == -signal.SIGKILL
