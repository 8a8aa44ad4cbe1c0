"""A 2-process CPU run (torchrun, gloo) of the trainer completes 2 steps, with groups kept whole on each rank; two
machines launched as ``slurm/node.sh`` launches them make the update one machine makes on the same rollouts. Each
process frees its trainer before it exits (a gloo group torn down at the interpreter's shutdown aborts the process
after a finished run)."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from t2s.backends.vllm_engine import free_port
from t2s.settings import REPO_ROOT
from tests import preloaded

pytestmark = pytest.mark.slow


def test_a_finished_run_is_freed_though_an_import_error_kept_the_frame_that_built_it(monkeypatch):
    """A module that keeps an import error keeps its traceback, and so every frame on the stack of that import; the
    frame that built the trainer is one of them when the import happened there (vLLM, first imported while the trainer
    is built). ``free_finished_run`` frees the dropped trainer anyway, and the error keeps its type and message."""
    import types
    import weakref

    from t2s.training.pipeline import free_finished_run

    class Trainer:  # stands in for the trainer, its DDP model and process group
        pass

    library = types.ModuleType("a_library_keeping_its_import_error")
    monkeypatch.setitem(sys.modules, library.__name__, library)
    monkeypatch.setitem(sys.modules, "not_a_module", 42)  # sys.modules may hold anything: no __dict__ here

    def build():
        trainer = Trainer()
        try:  # the library's first import, inside the function that builds the trainer
            raise ModuleNotFoundError("No module named 'optional_codec'")
        except ModuleNotFoundError as exc:
            library.kept = exc
        return trainer

    trainer = build()
    alive = weakref.ref(trainer)
    del trainer
    gc.collect()
    assert alive() is not None  # the kept traceback holds build()'s frame, and the trainer in it
    free_finished_run()
    assert alive() is None
    assert isinstance(library.kept, ModuleNotFoundError) and "optional_codec" in str(library.kept)


def test_a_finished_run_hands_the_heap_pages_it_freed_back_to_the_system():
    """glibc keeps pages freed below memory still in use; ``free_finished_run`` asks it to return them, so a process
    that trained in-process (``bench learn-real``'s warm start) does not hold its run's memory through what follows.
    In a fresh interpreter: 256 MiB of heap blocks, one more block above them, the 256 MiB freed."""
    import platform
    import textwrap

    if platform.libc_ver()[0] != "glibc":
        pytest.skip(f"malloc_trim is glibc's; this C library is {platform.libc_ver()[0] or 'unknown'}")
    script = textwrap.dedent("""
        import gc
        from t2s.training.pipeline import free_finished_run

        def resident_mib():
            return next(int(line.split()[1]) // 1024 for line in open("/proc/self/status") if line.startswith("VmRSS:"))

        blocks = [bytearray(65536) for _ in range(4096)]  # under the mmap threshold: in the heap
        above = bytearray(65536)  # still in use, above them: the heap cannot shrink from its top
        held = resident_mib()
        del blocks
        gc.collect()
        freed = resident_mib()
        free_finished_run()
        print(held, freed, resident_mib())
    """)
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    assert done.returncode == 0, done.stderr[-3000:]
    held, freed, trimmed = map(int, done.stdout.split())
    assert freed > held - 32  # freeing alone returned (almost) nothing: the pages stay resident
    assert freed - trimmed >= 200, (held, freed, trimmed)  # the trim returned them


def test_the_runs_last_gather_returns_only_once_the_gloo_workers_let_go_of_its_tensors(tmp_path):
    """A gloo worker marks a collective done before it drops its hold on the tensors, and that drop takes the GIL; a
    process that frees its group at once (holding the GIL while it joins the workers) can hang. ``gather_counts``, the
    run's last collective with tensors, returns only once no worker holds them. Two processes, 200 gathers each: on
    every return, the tensors it gathered with are gone."""
    import textwrap

    script = tmp_path / "gather.py"
    script.write_text(textwrap.dedent("""
        import sys
        import weakref
        from pathlib import Path
        import torch.distributed as dist
        from t2s.training.pipeline import gather_counts

        dist.init_process_group("gloo")
        rank, real, seen = dist.get_rank(), dist.all_gather, []

        def recording(outputs, tensor, *args, **kwargs):
            seen.extend(weakref.ref(t) for t in (tensor, *outputs))
            return real(outputs, tensor, *args, **kwargs)

        dist.all_gather = recording
        held = 0
        for i in range(200):
            assert gather_counts(10 * i + rank) == [10 * i, 10 * i + 1]
            held += any(alive() is not None for alive in seen)  # a tensor a worker still holds is still alive
            seen.clear()
        Path(sys.argv[1], f"rank{rank}.txt").write_text(f"held on return {held} of 200")  # the ranks share stdout
        dist.destroy_process_group()
    """))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO_ROOT)}
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
               "--master_port", str(free_port()), str(script), str(tmp_path)]
    result = subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-4000:]
    for rank in (0, 1):
        assert (tmp_path / f"rank{rank}.txt").read_text() == "held on return 0 of 200", rank


def test_two_process_cpu_run_completes_two_steps(tiny_model_dir, tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRL_EXPERIMENTAL_SILENCE": "1", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": str(REPO_ROOT)}
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
               "--master_port", str(free_port()), str(REPO_ROOT / "tests" / "_train_script.py"), str(tiny_model_dir),
               str(tmp_path)]
    result = subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=400)
    (tmp_path / "torchrun.log").write_text(result.stdout + result.stderr)  # the whole story, for a failure
    errors = [line for line in result.stderr.splitlines() if "Error" in line or "error" in line or "abort" in line]
    written = sorted(path.name for path in tmp_path.iterdir())
    assert result.returncode == 0, "\n".join(errors)[-4000:] + f"\nwritten: {written}; log: {tmp_path / 'torchrun.log'}"
    results = [json.loads((tmp_path / f"result_rank{rank}.json").read_text()) for rank in (0, 1)]
    for r in results:
        assert r["world_size"] == 2 and "MULTI_CPU" in r["distributed_type"]
        assert r["global_step"] == 2 and len(r["seen"]) == 2
        assert r["trainer_freed"], "the trainer, its DDP model and process group outlive the run"
        for batch in r["seen"]:  # one whole group of 4 on each rank
            assert list(Counter(batch).values()) == [4]
    for step in range(2):  # the ranks played different questions
        assert set(results[0]["seen"][step]).isdisjoint(results[1]["seen"][step])
    # beta comes from KL gathered over both ranks: identical everywhere
    assert results[0]["beta"] == results[1]["beta"] != 0.01


def _launch(command: list[str], env: dict, log: Path) -> subprocess.Popen:
    return subprocess.Popen(command, cwd=REPO_ROOT, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT)


def _weights(folder: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(folder / "model.safetensors"))


def test_two_machines_make_the_update_one_machine_makes_on_the_same_rollouts(attention_model_dir, tmp_path):
    """Two "machines" on loopback, launched as ``slurm/node.sh`` launches them (``accelerate launch --num_machines 2
    --machine_rank R --rdzv_backend static`` through ``t2s.training.launch``, one process each, 4 rollouts per
    process), train two steps on the scripted rollouts; one process with 8 rollouts a step trains on the very same
    rollouts (the scripted runner's completions, rewards and sampler logprobs depend only on the question and the
    copy). The global batches are equal, so the trained weights must be equal within float tolerance: advantages are
    taken over the gathered group, the loss is normalised by the gathered token count, and DDP averages the two
    machines' gradients. Plain SGD, so that a gradient off by any factor would show. The machines run the
    shared-prompt pass (each question's prompt once, its rollouts against its cache: several forward calls under DDP
    before one backward), the one process TRL's whole-row pass, on the full-attention tiny model that takes the
    former."""

    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRL_EXPERIMENTAL_SILENCE": "1", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": str(REPO_ROOT)}
    script = str(REPO_ROOT / "tests" / "_train_script.py")
    port = str(free_port())
    machines = [_launch([sys.executable, "-m", "t2s.training.launch", "--config_file",
                         str(REPO_ROOT / "accelerate_configs" / "multi_gpu.yaml"), "--mixed_precision", "no",
                         "--num_machines", "2", "--machine_rank", str(rank), "--num_processes", "2",
                         "--main_process_ip", "127.0.0.1", "--main_process_port", port, "--rdzv_backend", "static",
                         script, str(attention_model_dir), str(tmp_path / "two"), "4", "sgd", "shared"],
                        env, tmp_path / f"machine{rank}.log")
                for rank in (0, 1)]
    try:
        codes = [machine.wait(timeout=400) for machine in machines]
    finally:
        for machine in machines:
            if machine.poll() is None:
                machine.kill()
    assert codes == [0, 0], [(tmp_path / f"machine{rank}.log").read_text()[-3000:] for rank in (0, 1)]
    one = preloaded.run([sys.executable, script, str(attention_model_dir), str(tmp_path / "one"), "8", "sgd"],
                        preload="grpo", env=env, timeout=400, cwd=REPO_ROOT)
    assert one.returncode == 0, one.stderr[-3000:]

    results = [json.loads((tmp_path / "two" / f"result_rank{rank}.json").read_text()) for rank in (0, 1)]
    assert [r["world_size"] for r in results] == [2, 2] and all("MULTI_CPU" in r["distributed_type"] for r in results)
    single = json.loads((tmp_path / "one" / "result_rank0.json").read_text())
    assert single["world_size"] == 1
    # the machines' passes were the shared-prompt pass's, every one (a fallback would compare the whole-row pass twice)
    assert all(len(r["shared_passes"]) >= 2 and all(r["shared_passes"]) for r in results), results
    assert single["shared_passes"] == []
    for step in range(2):  # the same global batch: the two machines' shares make up the one machine's
        assert sorted(results[0]["seen"][step] + results[1]["seen"][step]) == sorted(single["seen"][step])
    start, two, one = _weights(attention_model_dir), _weights(tmp_path / "two"), _weights(tmp_path / "one")
    assert two.keys() == one.keys()
    moved = max((one[name] - start[name]).abs().max().item() for name in one)
    apart = max((two[name] - one[name]).abs().max().item() for name in one)
    assert moved > 1e-4  # the update is real
    assert apart <= 1e-4 * moved, (apart, moved)  # measured: 6.0e-8 apart on a move of 2.0e-3
