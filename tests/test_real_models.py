"""Real pretrained language models through t2s (`make install-models`): SmolLM2-135M-Instruct (Llama, ChatML without
a think block, a GGUF tokenizer that names ``<|im_start|>`` as its eos) and Google's base Gemma 3 270M (no chat
template; ``recipes/chat_templates/gemma3.jinja`` supplies Gemma's turn format).

On SmolLM2, in both modes, with real tools on held-out BIRD questions (superhero, where the shared data is present;
else the demo's) under bench learn-real's two-line system prompt (``ask`` keeps the tool manual, about 460 tokens more
to prefill in every episode): ``eval --policy vllm`` plays the same greedy episodes as ``--policy model`` (a
difference is allowed only at a near-tie, detected from the model's logprobs and reported); ``ask`` answers; ``sft``
then two GRPO steps colocated with vLLM, full and LoRA with peft's default targets, keep ``sampling/logp_gap/mean``
under 0.01; ``export`` writes a folder that ``make serve`` loads, stopping on ``<|im_end|>``; and ``eval --policy
endpoint`` runs against it in chat and completions modes. On Gemma 3: one clear error line without a template, then
an eval and a GRPO step with one, after which the engine holds the trained weights.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from t2s.backends.vllm_engine import has_cuda
from t2s.settings import shared_data_dir
from tests import preloaded
from tests.vllm_support import (HANG_GUARD_S, MODULE_TIMEOUT_S, ROOT, VLLM_ENV, environment_kept,
                                 run_watching_processes, served)

pytest.importorskip("vllm", reason="vLLM is not installed (make install-vllm)")

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(MODULE_TIMEOUT_S)]

DEMO = ROOT / "data" / "demo"
SUPERHERO = shared_data_dir() / "bird_dev_superhero"
# greedy identity is checked on held-out BIRD questions (superhero) where the shared data is present, else on the demo
HELD_OUT = SUPERHERO if (SUPERHERO / "dev.json").is_file() else DEMO
GEMMA_TEMPLATE = ROOT / "recipes" / "chat_templates" / "gemma3.jinja"
# the two-line system prompt of bench learn-real instead of the tool manual: prompts of about 100 tokens, not 460
SHORT_PROMPT = ROOT / "recipes" / "learn_real_system_prompt.txt"
EPISODES = ["--data", str(DEMO), "--n", "2", "--max-turns", "2", "--max-tokens-per-turn", "24",
            "--episode-token-budget", "4096", "--temperature", "0", "--system-prompt-file", str(SHORT_PROMPT),
            "--quiet"]
LOGP_GAP_BOUND = 0.01
NEAR_TIE = 1e-4  # two best next tokens this close in logprob: either may win on another kernel
TRAIN_SCRIPT = ROOT / "tests" / "_vllm_train_script.py"
SMALL_STEPS = ["--per_device_train_batch_size", "2", "--num_generations", "2", "--max_turns", "1",
               "--max_tokens_per_turn", "16", "--forced_turn_reserve", "16", "--system_prompt_file", str(SHORT_PROMPT)]


@pytest.fixture(scope="module", autouse=True)
def models_left_unchanged():
    """No command here writes into the converted model folders (each file's size and time, before and after)."""
    folders = sorted((ROOT / ".cache" / "models").glob("*"))
    state = lambda: {str(p): (p.stat().st_size, p.stat().st_mtime_ns) for f in folders for p in f.iterdir()}  # noqa: E731
    before = state()
    yield
    assert state() == before


def t2s(*argv, timeout: float = HANG_GUARD_S) -> subprocess.CompletedProcess:
    return preloaded.run([sys.executable, "-m", "t2s", *map(str, argv)], preload="torch", env=os.environ | VLLM_ENV,
                         timeout=timeout)


def episodes(out: Path, mode: str) -> list[dict]:
    lines = (out / mode / "episodes.jsonl").read_text().splitlines()
    return sorted((json.loads(line) for line in lines if line.strip()), key=lambda e: (e["question_id"], e["sample"]))


def turn_texts(out: Path, mode: str) -> list[list[str]]:
    return [[turn["assistant"] for turn in episode["turns"]] for episode in episodes(out, mode)]


# --------------------------------------------------------------------------------------- greedy: vLLM = transformers
@pytest.fixture(scope="module")
def offline_runs(smollm2_dir, tmp_path_factory):
    """``eval --policy model`` then ``--policy vllm`` on SmolLM2, both modes, in one process, on ``HELD_OUT``."""
    base = tmp_path_factory.mktemp("smollm2-offline")
    runs = [["eval", "--policy", policy, "--model", str(smollm2_dir), "--mode", "full", "withheld", *EPISODES,
             "--data", str(HELD_OUT), "--output", str(base / policy)]  # this --data wins over EPISODES
            for policy in ("model", "vllm")]
    (base / "runs.json").write_text(json.dumps(runs))
    # transformers' runs first, in a process vLLM has not touched: preloaded with torch and transformers only
    done = preloaded.run([sys.executable, "-m", "tests.vllm_support", str(base / "runs.json")], preload="torch",
                         env=os.environ | VLLM_ENV, timeout=HANG_GUARD_S)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "<|im_start|> as its eos token" in done.stderr and "opens no think block" in done.stderr
    assert "Traceback" not in done.stdout + done.stderr  # vLLM's tokenless chat-template warmup included
    return base


def _divergence_gap(model_dir: Path, record: dict, mode: str, turn: int, a: str, b: str) -> float:
    """The logprob gap between the two best next tokens where turn texts ``a`` and ``b`` first differ, under
    transformers, after the episode's own stream up to that point (rebuilt as the rollout builds it)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from t2s.data.loaders import load_json_rows
    from t2s.env.chat_format import chat_format
    from t2s.env.episode import Episode, EpisodeConfig
    from t2s.env.protocol import env_suffix_ids
    from t2s.rollout.tokens import first_prompt_ids

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    rows = load_json_rows(HELD_OUT / "dev.json")
    row = next(r for r in rows if str(r["question_id"]) == str(record["question_id"]))
    config = chat_format(tokenizer).episode_config(EpisodeConfig(mode=mode, max_turns=2, max_tokens_per_turn=24,
                                                                 episode_token_budget=4096,
                                                                 system_prompt_file=str(SHORT_PROMPT)))
    ids = first_prompt_ids(tokenizer, Episode(row, config))
    literal = dict(add_special_tokens=False, split_special_tokens=True)
    for earlier in record["turns"][:turn]:
        ids += tokenizer(earlier["assistant"], **literal)["input_ids"] + [chat_format(tokenizer).end_of_turn_id]
        ids += env_suffix_ids(tokenizer, earlier["observation"], needs_end_of_turn=False, enable_thinking=False)
    ids += tokenizer(os.path.commonprefix([a, b]), **literal)["input_ids"]
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        logprobs = torch.log_softmax(model(torch.tensor([ids])).logits[0, -1].float(), dim=-1)
    top = torch.topk(logprobs, 2).values
    return float(top[0] - top[1])


@pytest.mark.parametrize("mode", ["full", "withheld"])
def test_vllm_plays_smollm2_like_transformers(offline_runs, smollm2_dir, mode):
    model, engine = turn_texts(offline_runs / "model", mode), turn_texts(offline_runs / "vllm", mode)
    assert len(model) == len(engine) == 2 and all(model)
    config = json.loads((offline_runs / "vllm" / mode / "eval_config.json").read_text())
    assert config["engine"].startswith("vllm ")
    for m_turns, e_turns, record in zip(model, engine, episodes(offline_runs / "model", mode)):
        if m_turns == e_turns:
            continue
        turn = next(i for i, (x, y) in enumerate(zip(m_turns + [""], e_turns + [""])) if x != y)
        a, b = (m_turns + [""])[turn], (e_turns + [""])[turn]
        gap = _divergence_gap(smollm2_dir, record, mode, turn, a, b)
        assert gap < NEAR_TIE, f"vLLM and transformers differ at episode {record['question_id']} turn {turn}, " \
                               f"not at a near-tie (gap {gap:.2e})"
        pytest.xfail(f"a near-tie (gap {gap:.1e}) at episode {record['question_id']} turn {turn}")
    summary = json.loads((offline_runs / "vllm" / "summary.json").read_text())["modes"][mode]
    assert summary["n"] == 2 and {"submit_rate", "executes_rate", "mean_turns", "format_deviation_rate"} <= set(summary)


# ------------------------------------------------------------------------------------------------- GRPO on vLLM
@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora-default-targets"])
def test_two_grpo_steps_colocated_on_smollm2(smollm2_dir, tmp_path, lora):
    output = tmp_path / "run"
    flags = ["--lora", "--default-targets"] if lora else []
    env = os.environ | VLLM_ENV | {"PYTHONPATH": str(ROOT)}
    done = preloaded.run([sys.executable, str(TRAIN_SCRIPT), str(smollm2_dir), str(output), *flags, *SMALL_STEPS],
                         preload="grpo", env=env, timeout=HANG_GUARD_S)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    assert "Traceback" not in done.stdout + done.stderr  # the colocated engine's start logged none
    [result] = [json.loads(p.read_text()) for p in output.glob("result_rank*.json")]
    assert result["global_step"] == 2 and result["lora"] is lora and result["dtype"] == "torch.float32"
    steps = [json.loads(line) for line in (output / "metrics.jsonl").read_text().splitlines()]
    gaps = [step["sampling/logp_gap/mean"] for step in steps if "sampling/logp_gap/mean" in step]
    assert len(gaps) == 2 and max(gaps) < LOGP_GAP_BOUND, gaps
    assert result["trained_gap"] < 1e-3 and result["start_gap"] > 1e-2, result


# ---------------------------------------------------------------------- sft, export, make serve, endpoint, ask
@pytest.fixture(scope="module")
def sft_run(smollm2_dir, tmp_path_factory) -> tuple[Path, str]:
    """``t2s sft`` from SmolLM2 (the demo's warm-start recipe, whose tiny-model key never writes over a real model):
    the folder and the command's output."""
    out = tmp_path_factory.mktemp("smollm2-sft") / "warm"
    done = t2s("sft", "--config", "recipes/demo_sft.yaml", "--model_name_or_path", smollm2_dir, "--max_steps", "2",
               "--per_device_train_batch_size", "4", "--near_misses", "0", "--max_length", "4096",
               "--learning_rate", "1e-5", "--output_dir", out)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return out, done.stdout


def test_sft_trains_smollm2_in_its_own_format(sft_run, smollm2_dir):
    warm, stdout = sft_run
    assert json.loads((warm / "t2s_sft.json").read_text())["global_step"] == 2
    assert stdout.strip().splitlines()[-1].endswith("trajectories off the call format: 0)"), stdout[-1000:]
    from transformers import AutoTokenizer

    assert AutoTokenizer.from_pretrained(warm).get_vocab() == AutoTokenizer.from_pretrained(smollm2_dir).get_vocab()
    assert json.loads((warm / "config.json").read_text())["architectures"] == ["LlamaForCausalLM"]


def test_export_serve_and_endpoints_on_smollm2(sft_run, tmp_path, capsys):
    from t2s.commands import main

    warm, exported = sft_run[0], tmp_path / "export"
    with environment_kept():  # export and the endpoint evaluations in this process; `make serve` in its own
        assert main(["export", "--checkpoint", str(warm), "--output", str(exported), "--recipe",
                     "recipes/demo_sft.yaml"]) == 0, capsys.readouterr().err[-3000:]
    generation = json.loads((exported / "generation_config.json").read_text())
    from transformers import AutoTokenizer

    im_end = AutoTokenizer.from_pretrained(exported).convert_tokens_to_ids("<|im_end|>")
    assert generation["eos_token_id"] in ([im_end], im_end)  # the family's end of turn, not the GGUF's eos
    assert "`<|im_end|>`" in (exported / "README.md").read_text()
    with served(exported, tmp_path / "server.log") as url:
        for mode in ("chat", "completions"):
            out = tmp_path / mode
            with environment_kept():
                code = main(["eval", "--policy", "endpoint", "--endpoint", url, "--endpoint-mode", mode,
                             "--tokenizer", str(exported), "--mode", "withheld", *EPISODES, "--output", str(out)])
            assert code == 0, capsys.readouterr().err[-3000:]
            assert len(episodes(out, "withheld")) == 2
            assert json.loads((out / "summary.json").read_text())["modes"]["withheld"]["n"] == 2


def test_ask_answers_on_a_demo_database_with_smollm2(smollm2_dir, capsys):
    from t2s.commands import main

    db = next((DEMO / "dev_databases").glob("*/*.sqlite"))
    with environment_kept():
        code = main(["ask", "How many tables are there?", "--db", str(db), "--model", str(smollm2_dir), "--max-turns",
                     "1", "--max-tokens-per-turn", "24", "--temperature", "0"])
    out, err = capsys.readouterr()
    assert code == 0, out[-2000:] + err[-3000:]
    assert "Traceback" not in err and out.strip()


# ------------------------------------------------------------------------------------------------------ Gemma 3
def test_gemma3_base_without_a_template_is_one_error_line(gemma3_dir, tmp_path, capsys):
    from t2s.commands import main

    code = main(["eval", "--policy", "model", "--model", str(gemma3_dir), "--mode", "withheld", *EPISODES,
                 "--output", str(tmp_path / "eval")])  # in this process: an exception would fail the test
    stderr = capsys.readouterr().err
    assert code == 1 and "Traceback" not in stderr
    [line] = [line for line in stderr.splitlines() if line.startswith("Error:")]
    assert "no chat template" in line and "--chat-template FILE" in line


def test_gemma3_evaluates_and_trains_with_a_chat_template(gemma3_dir, tmp_path):
    argv = [sys.executable, "-m", "t2s", "eval", "--policy", "vllm", "--model", str(gemma3_dir), "--chat-template",
            str(GEMMA_TEMPLATE), "--mode", "withheld", *EPISODES, "--output", str(tmp_path / "eval")]
    done, processes = run_watching_processes(argv, os.environ | VLLM_ENV, preload="vllm")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert len(episodes(tmp_path / "eval", "withheld")) == 2
    if not has_cuda():  # on a CPU the offline engine runs in the calling process: no engine-core or worker process,
        # and without TorchDynamo no compiler builds vLLM's sampler kernels
        assert "python" in processes and not [name for name in processes if name.startswith("VLLM::")], processes
        assert not processes & {"cc1plus", "g++", "gcc", "cc", "c++"}, processes
    output = tmp_path / "run"
    env = os.environ | VLLM_ENV | {"PYTHONPATH": str(ROOT)}
    done = preloaded.run([sys.executable, str(TRAIN_SCRIPT), str(gemma3_dir), str(output), *SMALL_STEPS,
                          "--max_steps", "1", "--chat_template", str(GEMMA_TEMPLATE)],
                         preload="grpo", env=env, timeout=HANG_GUARD_S)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    [result] = [json.loads(p.read_text()) for p in output.glob("result_rank*.json")]
    assert result["global_step"] == 1
    steps = [json.loads(line) for line in (output / "metrics.jsonl").read_text().splitlines()]
    gaps = [step["sampling/logp_gap/mean"] for step in steps if "sampling/logp_gap/mean" in step]
    assert gaps and max(gaps) < LOGP_GAP_BOUND, gaps
    # after the step the engine holds the trained weights, not the start's (262k-way softmax: a looser bound than 1e-3)
    assert result["trained_gap"] < LOGP_GAP_BOUND and result["start_gap"] > 1e-2, result


def test_a_budget_longer_than_the_models_context_is_refused_before_the_engine_starts(smollm2_dir, tmp_path, capsys,
                                                                                      monkeypatch):
    import vllm

    from t2s.commands import main

    def no_engine(*args, **kwargs):
        raise AssertionError("the engine was started")

    monkeypatch.setattr(vllm, "LLM", no_engine)
    budget = ["--episode-token-budget", "12288"]  # SmolLM2's context is 8192 tokens
    with environment_kept():  # in this process: an exception would fail the test
        code = main(["eval", "--policy", "vllm", "--model", str(smollm2_dir), "--mode", "withheld", *EPISODES, *budget,
                     "--output", str(tmp_path / "eval")])
    stderr = capsys.readouterr().err
    assert code == 1 and "Traceback" not in stderr
    [line] = [line for line in stderr.splitlines() if line.startswith("Error:")]
    assert "longer than the model's context of 8192 tokens" in line
