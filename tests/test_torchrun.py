"""A 2-process CPU run (torchrun, gloo) of the trainer completes 2 steps, with groups kept whole on each rank."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections import Counter

import pytest

from t2s.settings import REPO_ROOT

pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_process_cpu_run_completes_two_steps(tiny_model_dir, tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRL_EXPERIMENTAL_SILENCE": "1", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": str(REPO_ROOT)}
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
               "--master_port", str(_free_port()), str(REPO_ROOT / "tests" / "_train_script.py"), str(tiny_model_dir),
               str(tmp_path)]
    result = subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=400)
    errors = [line for line in result.stderr.splitlines() if "Error" in line or "error" in line or "abort" in line]
    assert result.returncode == 0, "\n".join(errors)[-4000:]
    results = [json.loads((tmp_path / f"result_rank{rank}.json").read_text()) for rank in (0, 1)]
    for r in results:
        assert r["world_size"] == 2 and "MULTI_CPU" in r["distributed_type"]
        assert r["global_step"] == 2 and len(r["seen"]) == 2
        for batch in r["seen"]:  # one whole group of 4 on each rank
            assert list(Counter(batch).values()) == [4]
    for step in range(2):  # the ranks played different questions
        assert set(results[0]["seen"][step]).isdisjoint(results[1]["seen"][step])
    # beta comes from KL gathered over both ranks: identical everywhere
    assert results[0]["beta"] == results[1]["beta"] != 0.01
