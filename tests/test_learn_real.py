"""bench learn-real: its split by database, its eval flags, its targets, and a smoke-sized run end to end with the real
vLLM engine (a warm start on two questions, two GRPO steps of one question's two rollouts with short turns, four unseen
questions) on the tiny model's attention preset (``--model``): the run's chain of stages, processes, caches and files is
what it tests; SmolLM2 itself trains (SFT, GRPO full and LoRA) and evaluates in tests/test_real_models.py. The full
experiment is `python -m t2s bench learn-real` (docs/benchmarks.md), a benchmark, not a test."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from t2s.bench import learn_real
from tests import preloaded

UNSEEN_N = 4  # the smoke run's unseen questions


@pytest.fixture(scope="module")
def split(tmp_path_factory, spider_dev_dir, bird_superhero_dir):
    return learn_real.write_split(spider_dev_dir.parent, tmp_path_factory.mktemp("split"), seed=3, sft_questions=40,
                                  grpo_questions=8)


def _rows(path):
    return json.loads(path.read_text(encoding="utf-8"))


def test_split_is_by_database_and_the_training_sets_are_disjoint(split):
    sft, grpo, unseen = _rows(split.sft), _rows(split.grpo), _rows(split.unseen)
    assert len(sft) == 40 and len(grpo) == 8
    unseen_dbs = {row["db_id"] for row in unseen}
    assert unseen_dbs == {*learn_real.UNSEEN_SPIDER, "superhero"}
    assert not unseen_dbs & {row["db_id"] for row in sft + grpo}  # no unseen database is trained on
    assert set(split.train_dbs).isdisjoint(unseen_dbs) and len(split.train_dbs) == 14
    assert not {row["question_id"] for row in sft} & {row["question_id"] for row in grpo}
    assert sum(split.unseen_counts.values()) == len(unseen) == 350  # 221 Spider and 129 BIRD superhero
    assert all(row["SQL"] and row["question"] for row in sft + grpo + unseen)
    for db in unseen_dbs | set(split.train_dbs):  # each database reachable through the split's own folder
        assert any((split.folder / "databases" / db).glob("*.sqlite"))


def test_split_follows_the_seed(split, tmp_path, spider_dev_dir):
    same = learn_real.write_split(spider_dev_dir.parent, tmp_path / "a", seed=3, sft_questions=40, grpo_questions=8)
    other = learn_real.write_split(spider_dev_dir.parent, tmp_path / "b", seed=4, sft_questions=40, grpo_questions=8)
    assert _rows(same.sft) == _rows(split.sft)
    assert _rows(other.sft) != _rows(split.sft)
    assert _rows(other.unseen) == _rows(split.unseen)  # the unseen databases are fixed, never drawn
    with pytest.raises(ValueError, match="must fit the training ones"):
        learn_real.write_split(spider_dev_dir.parent, tmp_path / "c", seed=0, sft_questions=700, grpo_questions=60)


def test_eval_flags_are_the_grpo_recipes_episode_settings(split):
    import dataclasses

    from t2s.commands.eval import eval_config
    from t2s.settings import RECIPES_DIR
    from t2s.training.configs import parse_recipe

    config = eval_config([*learn_real.eval_flags(split, n=12), "--model", "m", "--output", "o"])
    _, training, _ = parse_recipe(["--config", str(RECIPES_DIR / learn_real.RL_RECIPE)])
    episode = training.episode_config()
    assert config.policy.dtype == training.vllm_dtype == "bfloat16"  # the engine GRPO sampled from
    float32 = eval_config([*learn_real.eval_flags(split, 12, ("--vllm_dtype", "float32")), "--model", "m", "--output",
                           "o"])  # a GRPO run's override reaches its evaluations' engine too
    assert float32.policy.dtype == "float32"
    assert config.policy.episode.system_prompt_file == str(RECIPES_DIR / Path(episode.system_prompt_file).name)
    assert dataclasses.replace(config.policy.episode, system_prompt_file=episode.system_prompt_file) == episode
    assert config.modes == ("full",) and (config.n, config.policy.seed) == (12, 0)  # the same questions every seed
    assert (config.policy.sampling.temperature, config.policy.policy, config.data) == (0.0, "vllm", str(split.unseen))
    shorter = eval_config([*learn_real.eval_flags(split, 12, ("--max_tokens_per_turn", "32", "--num_generations", "2")),
                           "--model", "m", "--output", "o"])  # the GRPO runs' overrides reach their episodes only
    assert shorter.policy.episode == dataclasses.replace(config.policy.episode, max_tokens_per_turn=32)
    assert episode.max_tokens_per_turn != 32


def test_zero_shot_key_follows_contents_not_where_the_checkout_is(split, tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"architectures": ["LlamaForCausalLM"]}')
    flags = learn_real.eval_flags(split, n=12)
    prompt = flags.index("--system-prompt-file") + 1
    moved = [*flags[:prompt], "/elsewhere/recipes/" + Path(flags[prompt]).name, *flags[prompt + 1:]]
    key = learn_real.zero_shot_key(model, split, flags)
    assert learn_real.zero_shot_key(model, split, moved) == key  # another clone's path to the same prompt
    assert learn_real.zero_shot_key(model, split, [*flags[:-1], "7"]) != key  # another setting
    (model / "config.json").write_text('{"architectures": ["MistralForCausalLM"]}')
    assert learn_real.zero_shot_key(model, split, flags) != key  # another base model


def test_missed_targets_name_each_one():
    ex = {"zero_shot": 0.0, "warm": 0.1, "grpo": 0.15, "control": 0.1}
    assert learn_real.missed_targets(ex, 0.05, 0.05, 0.2, 3000) == []
    missed = learn_real.missed_targets({**ex, "grpo": 0.0, "warm": 0.0}, 0.2, 0.0, 0.05, 6000)
    assert [line.split(" ")[0] for line in missed] == ["warm", "warm", "train_gain", "GRPO", "GRPO", "seconds"]
    assert missed[-1] == "seconds 6000 > 5400"
    slow = learn_real.missed_targets(ex, 0.05, 0.05, 0.2, 6000, no_bf16=True)
    assert slow == ["seconds 6000 > 5400 on a CPU without bfloat16 instructions"]


def test_an_evaluation_that_fails_raises_with_the_tail_of_its_log(tmp_path):
    pending = learn_real.PendingEval.start(tmp_path / "no-model", ["--policy", "vllm", "--data", str(tmp_path / "none"),
                                                                   "--quiet"], tmp_path / "eval")
    with pytest.raises(RuntimeError, match=r"Error: eval of .*no-model failed \(exit [1-9]\); .*eval\.log: .*Error:"):
        pending.summary()


def test_a_pending_evaluation_is_cached_only_when_it_succeeds(tmp_path):
    out = tmp_path / "eval"
    out.mkdir()
    (out / "summary.json").write_text(json.dumps({"modes": {"full": {"n": 3}}}))
    stored = []
    done = learn_real.PendingEval(out, subprocess.Popen([sys.executable, "-c", "pass"]), tmp_path / "m",
                                  then=lambda: stored.append("ok"))
    assert done.summary() == {"n": 3} and done.summary() == {"n": 3} and stored == ["ok"]  # waited for, stored once
    (tmp_path / "eval.log").write_text("Error: the engine died\n")
    exits_3 = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    failed = learn_real.PendingEval(out, exits_3, tmp_path / "m", then=lambda: stored.append("failed"))
    with pytest.raises(RuntimeError, match=r"exit 3\).*Error: the engine died"):
        failed.summary()
    assert stored == ["ok"]


def test_stopping_an_evaluation_ends_its_whole_process_group(tmp_path):
    """A stage beside an evaluation failed: the eval and the engine processes it started all end."""
    script = ("import subprocess, sys, time; "
              "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
              "print(p.pid, flush=True); time.sleep(60)")
    process = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, start_new_session=True)
    grandchild = int(process.stdout.readline())
    learn_real.PendingEval(tmp_path, process, tmp_path).stop()
    assert process.returncode is not None

    def ended(pid: int) -> bool:  # gone, or dead and waiting for whoever adopted it to reap it
        try:
            return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X")
        except (OSError, IndexError):
            return True

    for _ in range(50):
        if ended(grandchild):
            break
        time.sleep(0.1)
    assert ended(grandchild)


def test_a_model_folder_that_is_not_one_is_one_error_line(tmp_path, capsys):
    assert learn_real.run(output=str(tmp_path / "out"), model=tmp_path / "nothing", cache=tmp_path / "cache") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"Error: no model folder at {tmp_path / 'nothing'} (no config.json)"]
    assert not (tmp_path / "out").exists() and not (tmp_path / "cache").exists()


@pytest.mark.parametrize("stated", ["0", "1"])
def test_a_cpu_without_bfloat16_is_told_first_that_the_time_target_assumes_it(tmp_path, capsys, monkeypatch, stated):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    monkeypatch.setenv("T2S_CPU_BF16", stated)
    monkeypatch.setenv("T2S_DATA_DIR", str(tmp_path / "no-data"))  # the run ends at the split, after the note
    assert learn_real.run(output=str(tmp_path / "out"), model=tmp_path / "model", cache=tmp_path / "cache") == 2
    out, err = capsys.readouterr()
    notes = [line.split("] ", 1)[1] for line in out.splitlines() if "note:" in line]  # after the clock
    assert notes == ([f"note: {learn_real.NO_BF16_NOTE}"] if stated == "0" else []), out
    assert err.startswith("Error: ") and len(err.strip().splitlines()) == 1, err


def preloaded_launch(command, *, stdout, stderr, env, start_new_session):
    """``PendingEval.launch`` from the worker's preloaded vLLM interpreter (tests/preloaded.py): the evaluations are
    ``t2s eval --policy vllm`` as the bench starts them, without paying torch's and vLLM's imports each time."""
    assert stderr == subprocess.STDOUT
    return preloaded.start(command, preload="vllm", env=env, stdout=stdout, stderr=stdout, cwd=Path.cwd(),
                           new_session=start_new_session)


@pytest.fixture
def grpo_children_from_a_fork_server(monkeypatch):
    """The GRPO stages' children forked from multiprocessing's fork server, which imports TRL (and with it torch and
    vLLM) once for both, instead of spawned as the bench spawns them, each importing it again; the server is stopped
    after the test."""
    import multiprocessing
    import multiprocessing.forkserver

    multiprocessing.get_context("forkserver").set_forkserver_preload(["datasets", "trl.trainer.grpo_trainer"])
    monkeypatch.setattr(learn_real, "GRPO_START_METHOD", "forkserver")
    yield
    multiprocessing.forkserver._forkserver._stop()  # and with it the memory its imports hold
    multiprocessing.get_context("forkserver").set_forkserver_preload(["__main__"])  # multiprocessing's default


@pytest.mark.slow
@pytest.mark.timeout(1500)  # six vLLM engines (four evals, two GRPO runs) and an SFT
def test_smoke_run_writes_every_stage_and_its_last_line(tmp_path, attention_model_dir, spider_dev_dir,
                                                        bird_superhero_dir, capsys, monkeypatch,
                                                        grpo_children_from_a_fork_server):
    pytest.importorskip("vllm", reason="vLLM is not installed (make install-vllm)")
    monkeypatch.setenv("T2S_DATA_DIR", str(spider_dev_dir.parent))
    monkeypatch.setattr(learn_real.PendingEval, "launch", staticmethod(preloaded_launch))
    small_steps = ("--num_generations", "2", "--per_device_train_batch_size", "2", "--gradient_accumulation_steps",
                   "1", "--steps_per_generation", "1",  # one question of 2 rollouts a step
                   "--max_tokens_per_turn", "32", "--forced_turn_reserve", "32")  # short turns: the run, not the SQL
    code = learn_real.run(seed=0, output=str(tmp_path / "out"), steps=2, sft_questions=2, grpo_questions=1,
                          unseen_n=UNSEEN_N, model=attention_model_dir, cache=tmp_path / "cache",
                          grpo_overrides=small_steps)
    out = capsys.readouterr().out
    last = out.strip().splitlines()[-1]
    number = r"-?\d\.\d{3}"
    assert re.fullmatch(rf"learn-real: zero_shot={number} warm={number} grpo={number} control={number} "
                        rf"delta={number} ci=\[{number},{number}\] train_gain={number} control_gain={number} "
                        r"seconds=\d+", last), last
    assert code in (0, 1)  # two steps meet no learning target: the code says which were missed, above the last line
    assert (code == 1) == ("target missed:" in out)
    folder = tmp_path / "out"
    result = json.loads((folder / "learn_real.json").read_text())
    for stage in learn_real.STAGES:
        summary = json.loads((folder / "eval" / stage / "summary.json").read_text())
        assert summary["modes"]["full"]["n"] == UNSEEN_N
        assert result["ex"][stage] == summary["modes"]["full"]["execution_accuracy_official"]
    for name in ("warm", "grpo", "control"):  # model folders `eval --model` loads
        assert (folder / name / "config.json").is_file() and (folder / name / "tokenizer.json").is_file()
        assert any(folder.joinpath(name).glob("*.safetensors"))
    assert [len(result["runs"][name]) for name in ("grpo", "control")] == [2, 2]
    assert (folder / "learn_real.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (folder / "eval_args.txt").read_text().split() == learn_real.eval_flags(
        learn_real.Split(folder / "data", 0, folder / "data/sft.json", folder / "data/grpo.json",
                         folder / "data/unseen.json", (), {}), UNSEEN_N, small_steps)
    assert [p.name.rsplit("-", 1)[0] for p in sorted((tmp_path / "cache").iterdir())] == [
        "learn-real-warm", "learn-real-zero-shot"]  # both cached: a rerun trains and evaluates only GRPO's stages


def test_a_model_copy_takes_the_files_and_leaves_folders_and_dangling_links(tmp_path):
    source = tmp_path / "source"
    (source / "checkpoint-1").mkdir(parents=True)
    (source / "config.json").write_text("{}")
    (source / "checkpoint-1" / "optimizer.pt").write_text("x")
    (source / "dangling").symlink_to(tmp_path / "nowhere")
    target = learn_real.copy_model(source, tmp_path / "target")
    assert sorted(path.name for path in target.iterdir()) == ["config.json"]
