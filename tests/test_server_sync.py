"""Server-mode weight sync (``t2s.training.vllm_sync.ServerSync``): after each push every rank checks the weight
version the main process broadcasts against its own count. In one process the broadcast hands back what was sent, so a
rank that is not the main one sees no version: the case of a rank that missed the main process's push."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from t2s.training.vllm_sync import ServerSync


def generation(main: bool, rank: int = 0):
    return SimpleNamespace(accelerator=SimpleNamespace(is_main_process=main, process_index=rank))


def test_each_sync_pushes_once_and_counts_a_version():
    pushes = []
    sync = ServerSync(generation(main=True), lambda: pushes.append(len(pushes)))
    sync()
    sync()
    assert pushes == [0, 1] and sync.version == 2


def test_a_rank_out_of_step_with_the_main_process_stops_the_run():
    pushes = []
    sync = ServerSync(generation(main=False, rank=1), lambda: pushes.append(1))
    out_of_step = "rank 1 has taken part in 1 weight pushes but the main process in None: the ranks are out of step"
    with pytest.raises(RuntimeError, match=out_of_step):
        sync()
    assert pushes == [1]  # the push ran (every rank walks the weights) before the check
