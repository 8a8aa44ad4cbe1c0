"""One run at a time per output folder: a second `eval` or `score` into a folder in use stops at once, naming the
holder, and writes nothing; the lock goes with its holder, however it ends."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import textwrap

import pytest

from t2s.commands import main
from t2s.settings import REPO_ROOT

HOLDER = textwrap.dedent("""
    import sys, time
    from t2s.run_lock import run_folder_lock
    with run_folder_lock(sys.argv[1], command="t2s eval --output somewhere (the holder)"):
        print("held", flush=True)
        time.sleep(600)
""")


@pytest.fixture()
def holder(tmp_path):
    """A live process holding the run lock of tmp_path / "out"."""
    process = subprocess.Popen([sys.executable, "-c", HOLDER, str(tmp_path / "out")], stdout=subprocess.PIPE,
                               text=True, cwd=REPO_ROOT)
    try:
        assert process.stdout.readline().strip() == "held"
        yield process
    finally:
        process.kill()
        process.wait(timeout=30)


def _eval_args(demo_dir, out):
    return ["eval", "--policy", "gold", "--data", str(demo_dir), "--n", "3", "--output", str(out), "--quiet"]


def test_a_second_run_into_a_folder_in_use_stops_naming_the_holder(demo_dir, tmp_path, holder, capsys):
    out = tmp_path / "out"
    assert main(_eval_args(demo_dir, out)) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"Error: {out} is in use by another run")
    assert f"pid {holder.pid} on {socket.gethostname()}" in err[0] and "(the holder)" in err[0]
    assert not (out / "full" / "episodes.jsonl").exists() and not (out / "full" / "eval_config.json").exists()

    predictions = tmp_path / "p.jsonl"
    first = json.loads((demo_dir / "dev.json").read_text())[0]["question_id"]  # a prediction of the data
    predictions.write_text(json.dumps({"question_id": first, "sql": "SELECT 1"}))
    assert main(["score", "--data", str(demo_dir / "dev.json"), "--predictions", str(predictions), "--output",
                 str(out), "--quiet"]) == 1
    assert "in use by another run" in capsys.readouterr().err
    assert not (out / "scores.jsonl").exists()

    holder.send_signal(signal.SIGKILL)  # the holder dies without cleaning up: its lock goes with it
    holder.wait(timeout=30)
    from t2s.run_lock import LOCK_NAME

    assert (out / LOCK_NAME).is_file()  # a killed run leaves its file; only the lock counts
    assert main(_eval_args(demo_dir, out)) == 0
    assert len((out / "full" / "episodes.jsonl").read_text().splitlines()) == 3
    assert not (out / LOCK_NAME).exists()  # a run that ends removes it: nothing of the holder is uploaded with it


def test_two_evals_at_once_one_runs(demo_dir, tmp_path):
    """Two real processes into one folder: exactly one plays, the other stops with one line."""
    out = tmp_path / "out"
    command = [sys.executable, "-m", "t2s", "eval", "--policy", "gold", "--data", str(demo_dir), "--n", "12",
               "--output", str(out), "--quiet", "--workers", "1"]
    first = subprocess.Popen(command, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    second = subprocess.Popen(command, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    results = [(p.wait(timeout=300), p.communicate()[1]) for p in (first, second)]
    codes = sorted(code for code, _ in results)
    lines = (out / "full" / "episodes.jsonl").read_text().splitlines()
    if codes == [0, 0]:  # the first had finished before the second started: the second resumed, played nothing
        assert len(lines) == 12
        return
    assert codes == [0, 1]
    refused = next(err for code, err in results if code == 1)
    assert refused.strip().splitlines() == [refused.strip()] and "in use by another run" in refused
    assert f"t2s eval --policy gold --data {demo_dir} --n 12 --output {out}" in refused  # the holder's command
    assert len(lines) == 12 and len({json.loads(line)["question_id"] for line in lines}) == 12


def test_the_lock_in_one_process(tmp_path, monkeypatch):
    from t2s.run_lock import RunFolderBusy, rank_zero_lock, run_folder_lock

    with run_folder_lock(tmp_path / "a", command="first"):
        with pytest.raises(RunFolderBusy, match="first"):
            with run_folder_lock(tmp_path / "a"):
                pass
        with run_folder_lock(tmp_path / "b"):  # another folder is free
            pass
    with run_folder_lock(tmp_path / "a"):  # released
        pass
    with rank_zero_lock(tmp_path / "c"):
        with pytest.raises(RunFolderBusy):
            with run_folder_lock(tmp_path / "c"):
                pass
        monkeypatch.setenv("RANK", "1")
        with rank_zero_lock(tmp_path / "c"):  # the other ranks of a run take nothing
            pass


@pytest.mark.slow
def test_a_second_training_into_an_output_dir_in_use_stops(tiny_model_dir, holder, tmp_path, capsys):
    out = tmp_path / "out"
    code = main(["train", "--config", str(REPO_ROOT / "recipes" / "smoke.yaml"), "--model_name_or_path",
                 str(tiny_model_dir), "--output_dir", str(out), "--max_steps", "1"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and err[-1].startswith(f"Error: {out} is in use by another run"), err
    assert f"pid {holder.pid}" in err[-1]
    assert not list(out.glob("checkpoint-*")) and not (out / "data_summary.json").exists()


def test_a_run_that_meets_the_lock_before_its_details_waits_for_them(tmp_path):
    """The holder writes its details just after taking the lock; a run arriving in between still names it."""
    import fcntl
    import threading

    from t2s.run_lock import LOCK_NAME, RunFolderBusy, run_folder_lock

    folder = tmp_path / "out"
    folder.mkdir()
    holder = open(folder / LOCK_NAME, "a+", encoding="utf-8")
    fcntl.flock(holder, fcntl.LOCK_EX | fcntl.LOCK_NB)  # taken, details not written yet

    def write_details():
        holder.write(json.dumps({"pid": 4242, "host": "h", "command": "t2s eval --output out",
                                 "started_at": "2026-01-01T00:00:00+0000"}) + "\n")
        holder.flush()

    timer = threading.Timer(0.3, write_details)
    timer.start()
    try:
        with pytest.raises(RunFolderBusy) as refused:
            with run_folder_lock(folder):
                pass
    finally:
        timer.join()
        holder.close()
    assert "pid 4242 on h" in str(refused.value) and "t2s eval --output out" in str(refused.value)


def test_a_lock_file_removed_while_it_was_taken_is_taken_anew(tmp_path, monkeypatch):
    """A run that ends removes the lock file: a run that had just opened and locked that file checks it is still the
    folder's, and takes the new one, so two runs never both hold the folder."""
    import fcntl
    import os

    from t2s import run_lock

    folder = tmp_path / "out"
    folder.mkdir()
    real_flock, replaced = fcntl.flock, []

    def flock(handle, operation):
        real_flock(handle, operation)
        if not replaced:  # the file this run locked is removed, and another run creates the folder's new one
            replaced.append(True)
            (folder / run_lock.LOCK_NAME).unlink()
            (folder / run_lock.LOCK_NAME).touch()

    monkeypatch.setattr(run_lock.fcntl, "flock", flock)
    with run_lock.run_folder_lock(folder):
        assert json.loads((folder / run_lock.LOCK_NAME).read_text())["pid"] == os.getpid()
    assert replaced and not (folder / run_lock.LOCK_NAME).exists()
