"""Start-up validation (DESIGN §8): each bad configuration fails with one clear ``Error:`` message."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from _train_script import build_trainer, make_config
from t2s.training.config_checks import validate_training_config
from t2s.training.configs import ConfigError
from t2s.settings import REPO_ROOT
from t2s.training.startup import check_eos_ids, check_think_prompt, policy_init_kwargs

CHATML_NO_THINK = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _error(excinfo) -> str:
    message = str(excinfo.value)
    assert message.startswith("Error:"), message
    return message


@pytest.mark.parametrize(
    "overrides, needle",
    [
        (dict(top_k=20), "top_k=20"),
        (dict(top_p=0.95), "top_p=0.95"),
        (dict(generation_kwargs={"top_k": 5}), "top_k=5"),
        (dict(min_p=0.1), "min_p=0.1"),
    ],
)
def test_top_k_or_top_p_in_training_sampling_is_rejected(tmp_path, overrides, needle):
    with pytest.raises(ConfigError) as excinfo:
        validate_training_config(make_config(tmp_path, **overrides))
    message = _error(excinfo)
    assert needle in message and "temperature-only" in message


def test_group_split_across_ranks_is_rejected(tmp_path):
    # per rank 2 × 3 = 6 sequences with G = 4: a group would straddle ranks
    with pytest.raises(ConfigError) as excinfo:
        make_config(tmp_path, per_device_train_batch_size=2, gradient_accumulation_steps=3, num_generations=4)
    assert "split across ranks" in _error(excinfo) and "2 × 3 = 6" in str(excinfo.value)
    # the same check on a config changed after construction (as a launcher with more ranks would see it)
    args = make_config(tmp_path)
    args.per_device_train_batch_size = 2
    with pytest.raises(ConfigError, match="split across ranks"):
        validate_training_config(args)


def test_unknown_reward_name_is_rejected(tmp_path):
    with pytest.raises(ConfigError) as excinfo:
        validate_training_config(make_config(tmp_path, reward_names=["dense", "exact_match"]))
    assert "unknown reward name 'exact_match'" in _error(excinfo) and "dense" in str(excinfo.value)


@pytest.mark.parametrize(
    "overrides, needle",
    [
        (dict(beta=0.0, beta_min=0.0), "beta must be > 0"),
        (dict(beta_min=0.0), "beta_min"),
        (dict(beta=2.0), "beta_max"),
        (dict(old_logprobs="cached"), "old_logprobs 'cached'"),
        (dict(rollout_backend="sglang"), "rollout_backend 'sglang'"),
        (dict(vllm_server_sync="gloo"), "vllm_server_sync 'gloo' is unknown; use one of nccl, files"),
        (dict(vllm_dtype="None"), "vllm_dtype 'None' is unknown; use one of auto, float32, bfloat16"),
        (dict(mask_truncated_completions=True), "mask_truncated_completions"),
        (dict(per_device_train_batch_size=4, gradient_accumulation_steps=1, steps_per_generation=2),
         "multiple of steps_per_generation"),
        (dict(rollout_backend="vllm_colocate", vllm_tensor_parallel_size=2), "vllm_tensor_parallel_size"),
        # TRL loss settings the t2s loss never reads
        (dict(loss_type="dr_grpo"), "loss_type='dr_grpo' would be ignored"),
        (dict(delta=1.5), "delta=1.5 would be ignored"),
        (dict(top_entropy_quantile=0.2), "top_entropy_quantile=0.2"),
        (dict(entropy_coef=0.01), "entropy bonus"),
        (dict(use_adaptive_entropy=True), "entropy bonus"),
        (dict(off_policy_mask_threshold=0.5), "off_policy_mask_threshold=0.5"),
        (dict(use_bias_correction_kl=True), "use_bias_correction_kl=True"),
    ],
)
def test_other_bad_settings_are_rejected(tmp_path, overrides, needle):
    with pytest.raises(ConfigError) as excinfo:
        validate_training_config(make_config(tmp_path, **overrides))
    assert needle in _error(excinfo)


def test_think_block_check(tiny_tokenizer):
    check_think_prompt(tiny_tokenizer, {"enable_thinking": True}, True)  # Qwen3.5-2B's template, thinking on
    with pytest.raises(ConfigError) as excinfo:  # the same template without enable_thinking closes the block
        check_think_prompt(tiny_tokenizer, {}, True)
    assert "does not open a think block" in _error(excinfo)
    check_think_prompt(tiny_tokenizer, {}, False)  # thinking off: nothing to check


def test_trainer_plays_a_template_without_a_think_block_without_thinking(tiny_model_dir, tmp_path):
    """A template with no think block (SmolLM2's, say) means no thinking, said once: never a refusal."""
    from datasets import Dataset
    from transformers import AutoTokenizer

    from _train_script import make_rows, scripted_reward
    from t2s.env.chat_format import chat_format
    from t2s.training.trainer import Text2SQLGRPOTrainer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir, padding_side="left")
    tokenizer.chat_template = CHATML_NO_THINK
    check_think_prompt(tokenizer, {"enable_thinking": True}, True)
    fmt = chat_format(tokenizer)
    assert not fmt.thinking and any("opens no think block" in note for note in fmt.notes)
    assert fmt.episode_config(make_config(tmp_path).episode_config()).enable_thinking is False
    trainer = Text2SQLGRPOTrainer(str(tiny_model_dir), make_config(tmp_path),
                                  train_dataset=Dataset.from_list(make_rows(2)), processing_class=tokenizer,
                                  reward_funcs=[scripted_reward])
    assert list(trainer.model.generation_config.eos_token_id) == list(fmt.stop_ids)


def test_eos_check_names_the_missing_token(tiny_tokenizer):
    im_end = tiny_tokenizer.convert_tokens_to_ids("<|im_end|>")
    endoftext = tiny_tokenizer.convert_tokens_to_ids("<|endoftext|>")
    check_eos_ids([im_end, endoftext], tiny_tokenizer)
    with pytest.raises(ConfigError) as excinfo:
        check_eos_ids([endoftext], tiny_tokenizer)  # Qwen3.5's own default
    assert "<|im_end|>" in _error(excinfo)
    with pytest.raises(ConfigError, match="<\\|endoftext\\|>"):
        check_eos_ids([im_end], tiny_tokenizer)


@pytest.mark.slow
def test_trainer_stops_on_both_eos_ids(tiny_model_dir, tmp_path):
    trainer, _ = build_trainer(tiny_model_dir, tmp_path)
    tokenizer = trainer.processing_class
    for token in ("<|im_end|>", "<|endoftext|>"):
        assert tokenizer.convert_tokens_to_ids(token) in trainer.eos_token_ids
    assert trainer.model.generation_config.eos_token_id == [
        tokenizer.convert_tokens_to_ids("<|im_end|>"), tokenizer.convert_tokens_to_ids("<|endoftext|>")]
    assert trainer.ref_model is not None and trainer.beta == 0.01


def test_model_without_a_path_is_rejected(tiny_model_dir, tmp_path):
    from transformers import AutoConfig, AutoModelForCausalLM

    from t2s.training.trainer import Text2SQLGRPOTrainer

    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(tiny_model_dir))
    model.config._name_or_path = ""
    with pytest.raises(ConfigError, match="has no path"):
        Text2SQLGRPOTrainer(model, make_config(tmp_path))


def _train_cli(capsys, *args: str) -> tuple[int, str]:
    """``t2s train ARGS`` in this process: (exit code, stderr). An exception would fail the test, not print."""
    from t2s.commands import main

    code = main(["train", *args])
    return code, capsys.readouterr().err


def test_train_cli_missing_data_path_is_one_clear_line(tmp_path, capsys):
    code, stderr = _train_cli(capsys, "--config", str(REPO_ROOT / "recipes/smoke.yaml"), "--dataset_path",
                              str(tmp_path / "nowhere.json"), "--output_dir", str(tmp_path / "out"))
    assert code == 2
    lines = stderr.strip().splitlines()
    assert lines[-1].startswith("Error: dataset_path") and "nowhere.json" in lines[-1] and "not found" in lines[-1]
    assert "Traceback" not in stderr
    assert not (tmp_path / "out").exists(), "nothing is written before the data is found"


@pytest.mark.parametrize("override, message", [
    (("--top_k", "20"), "Error: training sampling must be temperature-only"),
    # the parser reads a `None` on the command line as the string 'None'; the engine would fail on it much later
    (("--vllm_dtype", "None"), "Error: vllm_dtype 'None' is unknown"),
])
def test_train_cli_bad_recipe_value_is_one_clear_line(tmp_path, capsys, override, message):
    code, stderr = _train_cli(capsys, "--config", str(REPO_ROOT / "recipes/smoke.yaml"), *override,
                              "--output_dir", str(tmp_path / "out"))
    assert code == 2 and "Traceback" not in stderr
    assert stderr.strip().splitlines()[-1].startswith(message)


def _rollout_dict(**changes):
    out = {"prompt_ids": [[1, 2], [1, 2]], "completion_ids": [[5, 6, 7], [5, 6]], "logprobs": [[-1.0, 0.0, -2.0],
           [-1.0, -0.5]], "env_mask": [[1, 0, 1], [1, 1]], "record": [{}, {}]}
    out.update(changes)
    return out


@pytest.mark.parametrize(
    "changes, needle",
    [
        (dict(logprobs=[[[-1.0], [0.0], [-2.0]], [[-1.0], [-0.5]]]), "flat list of floats"),  # TRL clients' (T, 1)
        (dict(env_mask=[[1, 0], [1, 1]]), "2 env_mask entries"),
        (dict(completion_ids=[[5, 6, 7]]), "'completion_ids' has 1 entries for 2 rows"),
        (dict(record=[{}]), "extra 'record' has 1 entries"),
        (dict(completion_ids=[[[5], [6], [7]], [[5], [6]]]), "flat list of ints"),
    ],
)
def test_rollout_output_shapes_are_asserted(changes, needle):
    from t2s.training.startup import check_rollout_output

    check_rollout_output(_rollout_dict(), 2)
    with pytest.raises(RuntimeError, match=__import__("re").escape(needle)):
        check_rollout_output(_rollout_dict(**changes), 2)


@pytest.mark.slow
def test_rollout_needs_the_stashed_rows(tiny_model_dir, tmp_path):
    trainer, _ = build_trainer(tiny_model_dir, tmp_path)
    with pytest.raises(RuntimeError, match="stashed rows"):  # called outside _generate_and_score_completions
        trainer._rollout(["Question number 0"] * 4, trainer)


@pytest.mark.parametrize("distributed_type, device_map", [("MULTI_GPU", None), ("DEEPSPEED", None), ("NO", "absent")])
def test_policy_loads_whole_on_each_rank_under_ddp_and_deepspeed(distributed_type, device_map):
    """As TRL loads a policy given by path: device_map None under DDP/DeepSpeed ("auto" spreads a rank's copy)."""
    from types import SimpleNamespace

    from accelerate.utils import DistributedType

    args = SimpleNamespace(model_init_kwargs={"dtype": "bfloat16"}, trust_remote_code=False,
                           distributed_state=SimpleNamespace(distributed_type=DistributedType[distributed_type]))
    kwargs = policy_init_kwargs(args)
    assert kwargs.get("device_map", "absent") == device_map
    assert kwargs["dtype"] == "bfloat16" and kwargs["trust_remote_code"] is False
    assert args.model_init_kwargs == {"dtype": "bfloat16"}, "the recipe's kwargs are not mutated"


# ---------------------------------------------------------------------------------------------------- vLLM server


def _server_config(tmp_path, url, **overrides):
    return make_config(tmp_path, rollout_backend="vllm_server", vllm_server_base_url=url, **overrides)


def test_server_context_must_hold_the_episode_budget(tmp_path, caplog):
    from tests.fake_vllm import FakeVLLMServer, refused_url
    from t2s.training.engines import check_server_context

    never = lambda prompt, max_tokens: []  # noqa: E731 - no completion is requested
    with FakeVLLMServer(never, max_model_len=12288) as server:
        check_server_context(_server_config(tmp_path, server.base_url, episode_token_budget=12288))
        with pytest.raises(ConfigError) as excinfo:
            check_server_context(_server_config(tmp_path, server.base_url, episode_token_budget=12289))
    message = _error(excinfo)
    assert "max_model_len 12288, below episode_token_budget 12289" in message and "--max-model-len 12289" in message
    with FakeVLLMServer(never, max_model_len=None) as server:  # a server that does not say: checked later, warned
        check_server_context(_server_config(tmp_path, server.base_url))
    assert "reports no max_model_len" in caplog.text
    with pytest.raises(ConfigError) as excinfo:
        check_server_context(_server_config(tmp_path, refused_url(), vllm_server_timeout=0.0))
    assert "no vLLM server answers" in _error(excinfo)


@pytest.mark.slow
def test_train_cli_short_server_context_is_one_clear_line(tiny_model_dir, demo_dir, tmp_path, capsys):
    from tests.fake_vllm import FakeVLLMServer
    from t2s.commands import main
    from t2s.settings import RECIPES_DIR

    with FakeVLLMServer(lambda prompt, max_tokens: [], max_model_len=1024) as server:
        code = main(["train", "--config", str(RECIPES_DIR / "smoke.yaml"), "--model_name_or_path", str(tiny_model_dir),
                     "--output_dir", str(tmp_path / "out"), "--rollout_backend", "vllm_server",
                     "--vllm_server_base_url", server.base_url])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert (err[0].startswith("Error: the vLLM server at")
            and "max_model_len 1024, below episode_token_budget 2048" in err[0])
    assert not server.requests  # refused before any episode ran


@pytest.mark.parametrize("command", ["train", "sft"])
def test_a_missing_recipe_is_bad_input_exit_1(command, tmp_path):
    """A recipe file that is not there exits 1, as every other missing file does (2 is for bad usage), and is answered
    before torch, transformers or TRL are imported."""
    script = ("import sys\nfrom t2s.commands import main\ncode = main(sys.argv[1:])\n"
              "print(sorted(set(sys.modules) & {'torch', 'transformers', 'trl'}))\nsys.exit(code)\n")
    result = subprocess.run([sys.executable, "-c", script, command, "--config", str(tmp_path / "missing.yaml")],
                            capture_output=True, text=True, timeout=300, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert result.returncode == 1, result.stderr
    assert result.stderr.strip().splitlines() == [f"Error: recipe {tmp_path / 'missing.yaml'} not found."]
    assert result.stdout.strip() == "[]"


@pytest.mark.parametrize("overrides, message", [
    (dict(num_generations=0), "num_generations must be 2 or more (got 0)"),
    (dict(num_generations=None), "num_generations must be 2 or more (got None)"),
    (dict(learning_rate=-1.0), "learning_rate must be a finite number above 0, got -1.0"),
    (dict(temperature=-1.0), "temperature must be a finite number above 0, got -1.0"),
    (dict(top_p=5.0), "top_p must lie in (0, 1] (got 5.0)"),
    (dict(max_turns=0), "max_turns must be a finite number above 0, got 0"),
    (dict(max_tokens_per_turn=-3), "max_tokens_per_turn must be a finite number above 0, got -3"),
    (dict(tool_timeout=0.0), "tool_timeout must be a finite number above 0, got 0.0"),
    # an infinity never ends a wait (a runaway query) or moves a controller; a 0 divides or waits for ever
    (dict(tool_timeout=float("inf"), episode_tool_seconds=float("inf")), "tool_timeout must be a finite number above "
                                                                          "0, got inf"),
    (dict(learning_rate=float("inf")), "learning_rate must be a finite number above 0, got inf"),
    (dict(kl_horizon=float("inf")), "kl_horizon must be a finite number above 0, got inf"),
    (dict(loss_norm_constant=float("inf")), "loss_norm_constant must be a finite number above 0, got inf"),
    (dict(num_iterations=0), "num_iterations must be a finite number above 0, got 0"),
    (dict(rollout_concurrency=0), "rollout_concurrency must be a finite number above 0, got 0"),
    (dict(per_device_train_batch_size=0), "per_device_train_batch_size must be a finite number above 0, got 0"),
    (dict(epsilon=-1.0), "epsilon must be a finite number 0 or more, got -1.0"),
    (dict(epsilon_high=float("nan")), "epsilon_high must be a finite number 0 or more, got nan"),
    (dict(rollout_max_batch_size=-2), "rollout_max_batch_size must be a finite number 0 or more, got -2"),
    (dict(reward_weights=[float("nan")]), "reward_weights must be finite numbers, got [nan]"),
    (dict(importance_sampling_level="foo"), "importance_sampling_level 'foo' is unknown; use one of token, sequence"),
    (dict(scale_rewards="foo"), "scale_rewards 'foo' is unknown; use one of group, batch, none"),
    (dict(max_steps=[1, 2]), "max_steps must be a number, got [1, 2]"),
    (dict(learning_rate="fast"), "learning_rate must be a number, got 'fast'"),
    (dict(max_turns=True), "max_turns must be a number, got True"),
    (dict(forced_turn_reserve=99_999), "forced_turn_reserve 99999 leaves no tool turn to an episode that starts with "
                                       "min_episode_tokens (2048) of its budget"),
    (dict(use_vllm=True, vllm_mode="colocate"), "use_vllm: true with rollout_backend: transformers; t2s chooses the "
                                                "generator with rollout_backend (vllm_colocate or vllm_server)"),
])
def test_values_of_the_wrong_kind_or_out_of_range_fail_when_the_config_is_built(tmp_path, overrides, message):
    """Each would otherwise reach a library that fails with a traceback (a list compared, a modulo by 0), fails only
    once the model has loaded (a negative learning rate), or trains on nothing and exits 0 (no turn, no token)."""
    with pytest.raises(ConfigError) as excinfo:
        make_config(tmp_path, **overrides)
    assert _error(excinfo).startswith(f"Error: {message}")


@pytest.mark.parametrize("flags, message", [
    (["--engine", "oracle"], "engine 'oracle' is unknown; use one of sqlite, duckdb, postgres"),
    (["--max_train_rows", "-1"], "max_train_rows must be 0 or more (None: all), got -1"),  # rows[:-1]: one row less
])
def test_a_script_setting_out_of_its_range_is_refused_when_the_recipe_is_read(flags, message):
    from t2s.training.configs import parse_recipe

    with pytest.raises(ConfigError, match=re.escape(message)):
        parse_recipe(["--config", str(REPO_ROOT / "recipes" / "smoke.yaml"), *flags])


def test_every_episode_limit_eval_takes_is_checked_for_training_too():
    from t2s.training.config_checks import LIMIT_FIELDS
    from t2s.evaluation.options import EPISODE_LIMITS

    assert {name for name, _, _ in EPISODE_LIMITS} == set(LIMIT_FIELDS)


@pytest.mark.parametrize("verb", ["train", "sft"])
@pytest.mark.parametrize("line, message", [
    ("learning_rate: fast", "or the flags after it: argument --learning_rate/--learning-rate: invalid float value: "
                            "'fast'"),
    ("learing_rate: 1.0e-4", "has settings t2s does not know: learing_rate (did you mean learning_rate?)"),
    ("max_steps: [1, 2]", "max_steps must be a number, got [1, 2]"),
    ("output_dir: [a]", "output_dir must be text, got ['a']"),  # each a TypeError deep in a library before
    ("5: 3", "has a setting whose name is not text: 5"),
])
def test_a_recipe_value_it_cannot_read_is_one_line_without_the_usage_text(tmp_path, capsys, verb, line, message):
    from t2s.training.configs import parse_recipe
    from t2s.training.warm_start import parse_sft_recipe

    source = REPO_ROOT / "recipes" / ("smoke.yaml" if verb == "train" else "demo_sft.yaml")
    key = line.split(":")[0]
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("".join(kept for kept in source.read_text().splitlines(keepends=True)
                              if not kept.startswith(f"{key}:")) + line + "\n")
    with pytest.raises(ConfigError) as excinfo:
        (parse_recipe if verb == "train" else parse_sft_recipe)(["--config", str(recipe)])
    assert message in _error(excinfo) and "\n" not in str(excinfo.value)
    assert capsys.readouterr().err == ""  # no usage text


@pytest.mark.parametrize("line, message", [
    ("dataset_path: 5", "dataset_path must be text, got 5"),
    ("system_prompt_file: {a: 1}", "system_prompt_file must be text, got {'a': 1}"),
    ("model_name_or_path: [a, b]", "model_name_or_path must be text, got ['a', 'b']"),
    ("chat_template_kwargs: [1]", "chat_template_kwargs must be a mapping, got [1]"),
    ("difficulties: [[simple]]", "difficulties must be a list of names, got [['simple']]"),
])
def test_a_text_or_mapping_setting_of_another_kind_is_one_line(tmp_path, line, message):
    """Each was a TypeError deep in a library (a path joined, a mapping unpacked) or an unhashable name."""
    from t2s.training.configs import parse_recipe

    source = REPO_ROOT / "recipes" / "smoke.yaml"
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("".join(kept for kept in source.read_text().splitlines(keepends=True)
                              if not kept.startswith(line.split(":")[0] + ":")) + line + "\n")
    with pytest.raises(ConfigError) as excinfo:
        parse_recipe(["--config", str(recipe)])
    assert message in _error(excinfo)


@pytest.mark.parametrize("line, message", [
    ("mode: bogus", "mode 'bogus' is unknown; use one of full, withheld."),
    ("mode: FULL", "mode 'FULL' is unknown; use one of full, withheld."),
    ("dataset_kind: nope", "dataset_kind 'nope' is unknown; use one of bird, spider, sqale, synsql, json, auto."),
])
def test_a_setting_outside_its_choices_is_refused_when_the_recipe_is_read(tmp_path, line, message):
    from t2s.training.configs import parse_recipe

    key = line.split(":")[0]
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("".join(kept for kept in (REPO_ROOT / "recipes" / "smoke.yaml").read_text().splitlines(
        keepends=True) if not kept.startswith(f"{key}:")) + line + "\n")
    with pytest.raises(ConfigError) as excinfo:  # before any model or data loads
        parse_recipe(["--config", str(recipe)])
    assert _error(excinfo) == f"Error: {message}"


BROKEN_MODELS = {  # what is done to a copy of the tiny model: the one line train and sft print
    "config-list": (lambda m: (m / "config.json").write_text("[1, 2]"),
                    "config.json is not a JSON object (it holds a JSON list)"),
    "config-garbage": (lambda m: (m / "config.json").write_text("{bad"),
                       "config.json is not valid JSON: Expecting property name enclosed in double quotes"),
    "weights-random": (lambda m: (m / "model.safetensors").write_bytes(bytes(range(256)) * 4),
                       "model.safetensors is cut off: its header runs past the end"),
    "weights-missing": (lambda m: (m / "model.safetensors").unlink(),
                        "no model weights: model.safetensors is missing"),
    "empty": (lambda m: [p.unlink() for p in m.iterdir() if p.is_file()],
              "it holds neither config.json nor adapter_config.json"),
    # a field of the wrong kind: huggingface_hub's StrictDataclassError (no ValueError) was a traceback
    "config-field-kind": (lambda m: (m / "config.json").write_text(json.dumps(
        {**json.loads((m / "config.json").read_text()), "num_hidden_layers": "two"})),
        "Validation error for field 'num_hidden_layers':"),
}


@pytest.mark.parametrize("verb", ["train", "sft"])
@pytest.mark.parametrize("broken", sorted(BROKEN_MODELS))
def test_a_model_folder_that_cannot_load_is_one_line_before_the_data_loads(tiny_model_dir, tmp_path, capsys,
                                                                           monkeypatch, verb, broken):
    import shutil

    from t2s.commands import main
    from t2s.training import pipeline

    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    (model / "t2s_tiny.json").unlink()  # a model of the user's: the recipes' tiny-model switch never rebuilds it
    damage, problem = BROKEN_MODELS[broken]
    damage(model)

    def no_rows(*args, **kwargs):
        raise AssertionError("the data loaded before the model folder was checked")

    monkeypatch.setattr(pipeline, "load_training_rows", no_rows)
    recipe = "recipes/smoke.yaml" if verb == "train" else "recipes/learn_real_sft.yaml"  # no tiny-model switch
    code = main([verb, "--config", str(REPO_ROOT / recipe), "--model_name_or_path", str(model), "--output_dir",
                 str(tmp_path / "out")])
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if not line.startswith("note:")]  # the CPU's bf16 note aside
    assert code == 2 and errors == [f"Error: cannot load the model {model}: {problem}"], err  # a recipe error's code


@pytest.mark.parametrize("verb", ["train", "sft"])
def test_an_output_dir_that_is_the_model_folder_is_refused_before_anything_loads(tiny_model_dir, tmp_path, capsys,
                                                                                 monkeypatch, verb):
    """Training into the folder it starts from would write the run's model, config and tokenizer over the base model
    (both commands did, and exited 0): refused when the recipe is read, with the folder left as it was."""
    import shutil

    from t2s.commands import main
    from t2s.training import pipeline

    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    (model / "t2s_tiny.json").unlink()  # a model of the user's: the recipes' tiny-model switch never rebuilds it
    before = {p.name: p.read_bytes() for p in model.iterdir()}

    def no_rows(*args, **kwargs):
        raise AssertionError("the data loaded before the output folder was checked")

    monkeypatch.setattr(pipeline, "load_training_rows", no_rows)
    recipe = "recipes/smoke.yaml" if verb == "train" else "recipes/learn_real_sft.yaml"
    for named in (model, tmp_path / "." / "model"):  # the same folder, however it is written
        code = main([verb, "--config", str(REPO_ROOT / recipe), "--model_name_or_path", str(model), "--output_dir",
                     str(named), "--max_steps", "1"])
        errors = [line for line in capsys.readouterr().err.splitlines() if not line.startswith("note:")]
        assert code == 2 and errors == [f"Error: output_dir {named} is the model folder the run starts from; its "
                                        "saves would write over that model. Choose another folder."], errors
    assert {p.name: p.read_bytes() for p in model.iterdir()} == before


@pytest.mark.parametrize("verb", ["train", "sft"])
@pytest.mark.parametrize("flag, value, message", [
    ("learning_rate", "nan", "learning_rate must be a finite number above 0, got nan"),
    ("learning_rate", "-1", "learning_rate must be a finite number above 0, got -1.0"),
    ("per_device_train_batch_size", "0", "per_device_train_batch_size must be a finite number above 0, got 0"),
    ("num_train_epochs", "nan", "num_train_epochs must be a finite number above 0, got nan"),
    ("warmup_steps", "nan", "warmup_steps must be a finite number 0 or more, got nan"),
    ("adam_beta1", "1.5", "adam_beta1 must be a finite number in [0, 1), got 1.5"),
    ("adam_epsilon", "nan", "adam_epsilon must be a finite number above 0, got nan"),
    ("seed", "-1", "seed must be a finite number 0 or more, got -1"),
])
def test_optimizer_and_schedule_numbers_are_refused_when_the_recipe_is_read(tmp_path, capsys, verb, flag, value,
                                                                           message):
    """Each reached the optimizer or the scheduler (a traceback, after the model had loaded and, for sft, after the
    trajectories had been played), or trained with a step count of nan."""
    from t2s.commands import main

    recipe = "recipes/smoke.yaml" if verb == "train" else "recipes/learn_real_sft.yaml"
    code = main([verb, "--config", str(REPO_ROOT / recipe), f"--{flag}", value, "--output_dir", str(tmp_path / "o")])
    errors = [line for line in capsys.readouterr().err.splitlines() if not line.startswith("note:")]
    assert code == 2 and len(errors) == 1 and errors[0].endswith(message), errors
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("verb", ["train", "sft"])
def test_a_report_to_integration_that_is_unknown_or_not_installed_is_refused_when_the_recipe_is_read(tmp_path, capsys,
                                                                                                     verb):
    """``report_to: wandb`` without wandb failed only once both models had loaded (a traceback)."""
    from transformers.integrations import get_available_reporting_integrations

    from t2s.commands import main

    recipe = "recipes/smoke.yaml" if verb == "train" else "recipes/learn_real_sft.yaml"
    missing = "wandb" if "wandb" not in get_available_reporting_integrations() else "clearml"
    for value, message in ((missing, f"report_to {missing!r}: its package is not installed here"),
                           ("nosuch", "report_to 'nosuch' is unknown; use none or one of azure_ml, ")):
        code = main([verb, "--config", str(REPO_ROOT / recipe), "--report_to", value, "--output_dir",
                     str(tmp_path / "o")])
        errors = [line for line in capsys.readouterr().err.splitlines() if not line.startswith("note:")]
        assert code == 2 and len(errors) == 1 and message in errors[0], errors
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("line, key, value", [
    ("reward_names: dense", "reward_names", ["dense"]),  # not ['d', 'e', 'n', 's', 'e']
    ("difficulties: simple", "difficulties", ["simple"]),  # not a filter that drops every row
])
def test_a_list_setting_written_as_one_item_is_a_list_of_it(tmp_path, line, key, value):
    from t2s.training.configs import parse_recipe

    source = REPO_ROOT / "recipes" / "smoke.yaml"
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("".join(kept for kept in source.read_text().splitlines(keepends=True)
                              if not kept.startswith(f"{key}:")) + line + "\n")
    script_args, training_args, _ = parse_recipe(["--config", str(recipe)])
    assert getattr(script_args if key == "difficulties" else training_args, key) == value


def test_a_file_for_a_model_and_a_tokenizer_that_is_not_json_are_named(tiny_model_dir, tmp_path):
    import shutil

    from t2s.training.checkpoints import check_model_folder
    from t2s.training.pipeline import load_chat_tokenizer

    (tmp_path / "weights.bin").write_bytes(b"x")
    with pytest.raises(ConfigError, match="^Error: cannot load the model .*weights.bin: it is a file, not a model "):
        check_model_folder(tmp_path / "weights.bin")
    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    (model / "tokenizer.json").write_text("garbage{")
    with pytest.raises(ConfigError) as excinfo:
        load_chat_tokenizer(model)
    assert _error(excinfo).startswith(f"Error: cannot load the tokenizer of {model}: Expecting value")


def test_an_output_dir_that_is_a_file_fails_when_the_config_is_built(tmp_path):
    (tmp_path / "taken").write_text("keep me")
    with pytest.raises(ConfigError, match="^Error: output_dir .*taken is a file, not a folder"):
        make_config(tmp_path / "taken")
    assert (tmp_path / "taken").read_text() == "keep me"


def test_an_output_dir_that_holds_an_eval_fails_when_the_config_is_built(demo_dir, tmp_path):
    from t2s.commands import main

    assert main(["eval", "--policy", "gold", "--data", str(demo_dir), "--n", "2", "--output", str(tmp_path / "ev"),
                 "--quiet"]) == 0
    before = sorted(p.name for p in (tmp_path / "ev").rglob("*"))
    with pytest.raises(ConfigError, match=f"^Error: output_dir {tmp_path / 'ev'} holds an eval's results; choose "
                                          "another folder"):
        make_config(tmp_path / "ev")
    assert sorted(p.name for p in (tmp_path / "ev").rglob("*")) == before
    make_config(tmp_path / "fresh")  # an empty or new folder is taken


def test_a_recipe_may_merge_anchors_and_nest_a_mapping_as_deepspeed_configs_do(tmp_path):
    from t2s.training.configs import parse_recipe

    recipe = tmp_path / "recipe.yaml"
    recipe.write_text((REPO_ROOT / "recipes" / "smoke.yaml").read_text() + (
        "model_init_kwargs: &m {low_cpu_mem_usage: true}\n"
        "gradient_checkpointing_kwargs: {<<: *m, use_reentrant: false}\n"  # a merged key, then one of its own
        "lr_scheduler_kwargs: {a: {b: {c: {d: 1}}}}\n"))  # four levels, as zero_optimization.offload_param.device
    _, training_args, _ = parse_recipe(["--config", str(recipe)])
    assert training_args.model_init_kwargs == {"low_cpu_mem_usage": True}
    assert training_args.gradient_checkpointing_kwargs == {"low_cpu_mem_usage": True, "use_reentrant": False}


def test_fewer_rows_than_one_generation_batch_samples_is_refused(demo_dir, tiny_model_dir, tmp_path, monkeypatch):
    """TRL's sampler yields whole batches of questions only: with fewer rows the trainer stops at step 0 and would
    write an untrained model after a clean-looking run. Refused before the model loads."""
    import json

    from trl import ModelConfig

    import t2s.training.trainer as trainer_module
    from t2s.training.configs import T2SScriptArguments
    from t2s.training.pipeline import build_trainer as build_from_recipe

    def no_model(*args, **kwargs):
        raise AssertionError("the trainer was built")

    monkeypatch.setattr(trainer_module, "Text2SQLGRPOTrainer", no_model)
    data = tmp_path / "dev.json"
    data.write_text(json.dumps(json.loads((demo_dir / "dev.json").read_text())[:1]))
    (tmp_path / "dev_databases").symlink_to(demo_dir / "dev_databases")
    script = T2SScriptArguments(dataset_kind="bird", dataset_path=str(data), gold_hygiene=False)
    config = make_config(tmp_path / "run")  # 8 rollouts a device, 4 a group: 2 questions a generation batch
    with pytest.raises(ConfigError, match=r"^Error: 1 training rows left after filtering, fewer than the 2 questions "
                                          r"one generation batch samples \(generation_batch_size 8 / num_generations "
                                          r"4\), so no step would run"):
        build_from_recipe(script, config, ModelConfig(model_name_or_path=str(tiny_model_dir)))
    data.write_text(json.dumps(json.loads((demo_dir / "dev.json").read_text())[:2]))
    with pytest.raises(AssertionError, match="the trainer was built"):  # two rows: on to the trainer
        build_from_recipe(script, config, ModelConfig(model_name_or_path=str(tiny_model_dir)))


@pytest.mark.parametrize("content", ['[{"id": 1}]', "[1, 2]", "5", '{"question_id": 1}\n[2]\n'])
def test_a_pass_rate_file_of_another_shape_is_one_error_line(tmp_path, content):
    """``pass_rate_file`` is what ``t2s data passrate`` writes; anything else (or a FIFO, which would wait for a
    writer for ever) is refused before training, not a KeyError."""
    import os

    from t2s.data.rows import DataError
    from t2s.training.pipeline import pass_rate_ids

    kept = tmp_path / "kept.json"
    kept.write_text(content)
    with pytest.raises(DataError, match="^Error: "):
        pass_rate_ids(kept)
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    with pytest.raises(DataError, match="is not a regular file"):
        pass_rate_ids(fifo)
    kept.write_text('[{"question_id": 7}, {"question_id": "a"}]')
    assert pass_rate_ids(kept) == {"7", "a"}


def test_a_model_with_custom_code_is_left_to_the_loader(tiny_model_dir, tmp_path):
    """A config.json with an ``auto_map`` runs the folder's own code when read: the start-up check leaves it to the
    loader, which runs it only with ``trust_remote_code`` (it was refused, "contains custom code", whatever the
    recipe said), while a field of the wrong kind in an ordinary config is still found."""
    import shutil

    from t2s.errors import ConfigError
    from t2s.training.checkpoints import check_model_folder

    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "model_type": "t2s_custom",
                                                   "auto_map": {"AutoConfig": "custom.CustomConfig"}}))
    check_model_folder(model)
    (model / "config.json").write_text(json.dumps({**config, "num_hidden_layers": "two"}))
    with pytest.raises(ConfigError, match="num_hidden_layers"):
        check_model_folder(model)
