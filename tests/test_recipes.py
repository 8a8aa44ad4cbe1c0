"""Every recipe parses with the pinned TRL's TrlParser, passes start-up validation, and names known rewards."""

from __future__ import annotations

import pytest
import yaml

from t2s.training.config_checks import validate_training_config
from t2s.training.configs import parse_recipe
from t2s.scoring.rewards import REWARD_FUNCS
from t2s.settings import REPO_ROOT, RECIPES_DIR

RECIPES = ("bird", "sqale", "synsql", "bird_tools", "bird_tools_lora", "smoke", "demo", "learn_real")
ACCELERATE_CONFIGS = ("single_gpu", "multi_gpu", "zero2", "zero3", "fsdp2")


def _parse(name: str, tmp_path):
    """Parse a recipe; recipes with bf16 get --use_cpu so transformers accepts bf16 on this CPU machine."""
    argv = ["--config", str(RECIPES_DIR / f"{name}.yaml"), "--output_dir", str(tmp_path)]
    if yaml.safe_load((RECIPES_DIR / f"{name}.yaml").read_text()).get("bf16"):
        argv += ["--use_cpu", "true"]
    return parse_recipe(argv)


@pytest.mark.parametrize("name", RECIPES)
def test_recipe_parses_validates_and_names_known_rewards(name, tmp_path):
    script_args, training_args, model_args = _parse(name, tmp_path)
    validate_training_config(training_args)
    assert training_args.reward_names and all(r in REWARD_FUNCS for r in training_args.reward_names)
    assert model_args.model_name_or_path and script_args.dataset_path
    assert training_args.chat_template_kwargs == {"enable_thinking": True}
    assert training_args.temperature == 1.0 and training_args.top_k == 0 and training_args.top_p == 1.0
    assert not training_args.mask_truncated_completions
    episode = training_args.episode_config()
    assert episode.max_turns == training_args.max_turns and episode.enable_thinking


def test_recipe_keys_are_all_known_to_the_parser(tmp_path):
    # TrlParser fails on unknown keys; make sure each file is a flat mapping it fully consumed
    for name in RECIPES:
        data = yaml.safe_load((RECIPES_DIR / f"{name}.yaml").read_text())
        assert isinstance(data, dict) and "env" not in data
        _parse(name, tmp_path)


def test_bird_recipe_holds_every_published_hyperparameter(tmp_path):
    script_args, args, model_args = _parse("bird", tmp_path)
    assert model_args.model_name_or_path == "Qwen/Qwen3.5-2B"
    assert args.enable_thinking
    assert args.loss_norm_constant == 1024 and args.scale_rewards == "none"
    assert args.target_kl == 0.005 and not args.use_bias_correction_kl
    assert args.old_logprobs == "sampler" and args.importance_sampling_level == "sequence"
    assert (args.epsilon, args.epsilon_high) == (0.2, 0.28)
    assert not args.vllm_importance_sampling_correction
    ranks = 3
    episodes_per_step = args.per_device_train_batch_size * args.gradient_accumulation_steps * ranks
    assert episodes_per_step == 144 and args.num_generations == 8 and episodes_per_step // 8 == 18
    assert args.num_iterations == 1 and args.gradient_accumulation_steps % args.steps_per_generation == 0
    assert args.learning_rate == 1e-5 and args.lr_scheduler_type == "cosine" and args.warmup_steps == 0.05
    assert (args.max_turns, args.episode_token_budget, args.mode, args.dialect) == (6, 12288, "full", "exec_plan")
    assert args.rollout_backend == "vllm_colocate" and args.use_vllm and args.vllm_mode == "colocate"
    assert script_args.difficulties == ["simple", "moderate"] and script_args.difficulty_estimated
    assert args.reward_names == ["dense"]


def test_bird_recipe_marks_sources_and_says_the_filter_is_ours():
    text = (RECIPES_DIR / "bird.yaml").read_text()
    values = [line for line in text.splitlines() if line and not line.startswith((" ", "#"))]
    unmarked = [line for line in values if "# card" not in line and "# our choice" not in line
                and "OUR ESTIMATE" not in line]
    assert not unmarked, f"every value needs its source: {unmarked}"
    assert "OUR ESTIMATE" in text and "unknown" in text and "difficulty_estimated: true" in text


def test_sibling_recipe_is_the_9b_recipe(tmp_path):
    script_args, args, _ = _parse("bird_tools", tmp_path)
    assert args.dialect == "sibling" and args.reward_names == ["sibling"]
    assert script_args.pass_rate_file


def test_smoke_recipe_runs_on_a_cpu_offline(tmp_path):
    script_args, args, model_args = _parse("smoke", tmp_path)
    assert args.rollout_backend == "transformers" and not args.use_vllm and args.use_cpu
    assert script_args.build_tiny_model and model_args.model_name_or_path.startswith(".cache/")
    assert (REPO_ROOT / script_args.dataset_path).is_file()
    assert args.max_steps >= 3


@pytest.mark.parametrize("name", ACCELERATE_CONFIGS)
def test_accelerate_configs_parse(name):
    config = yaml.safe_load((REPO_ROOT / "accelerate_configs" / f"{name}.yaml").read_text())
    assert config["num_machines"] == 1 and "distributed_type" in config
    if name == "multi_gpu":
        assert config["distributed_type"] == "MULTI_GPU" and config["num_processes"] == 3
    if name.startswith("zero"):
        assert config["deepspeed_config"]["zero_stage"] == int(name[-1])
    if name == "fsdp2":
        assert config["fsdp_config"]["fsdp_version"] == 2


def test_bird_recipe_gives_each_of_three_ranks_whole_groups(tmp_path):
    """144 episodes per step on 3 ranks: TRL's sampler stream, cut into per-rank generation batches as accelerate
    shards them (batch k to rank k mod 3), holds 6 whole groups of 8 copies per rank, 18 questions per step."""
    from trl.trainer.utils import RepeatSampler

    _, args, _ = _parse("bird", tmp_path)
    ranks, group = 3, args.num_generations
    per_rank = args.per_device_train_batch_size * args.steps_per_generation
    assert per_rank * ranks == 144 and per_rank % group == 0
    sampler = RepeatSampler(list(range(90)), mini_repeat_count=group, batch_size=per_rank * ranks // group,
                            repeat_count=args.num_iterations * args.steps_per_generation, seed=0)
    stream = list(sampler)
    batches = [stream[i : i + per_rank] for i in range(0, len(stream), per_rank)]
    first_step = batches[:ranks]  # one generation batch per rank
    questions = set()
    for batch in first_step:
        groups = [batch[i : i + group] for i in range(0, per_rank, group)]
        assert all(len(set(g)) == 1 for g in groups), "a group straddles a micro-batch boundary or a rank"
        assert len({g[0] for g in groups}) == per_rank // group == 6
        questions |= {g[0] for g in groups}
    assert len(questions) == 18


def test_bird_tools_lora_is_bird_tools_with_adapters(tmp_path):
    _, lora, lora_model = _parse("bird_tools_lora", tmp_path)
    _, full, full_model = _parse("bird_tools", tmp_path)
    assert lora_model.use_peft and not full_model.use_peft and lora_model.lora_r > 0
    assert set(lora_model.lora_target_modules) >= {"q_proj", "v_proj"}
    same = ("dialect", "tool_format", "reward_names", "num_generations", "max_turns", "episode_token_budget",
            "rollout_backend", "temperature", "beta", "target_kl")
    assert {k: getattr(lora, k) for k in same} == {k: getattr(full, k) for k in same}
    assert lora_model.model_name_or_path == full_model.model_name_or_path
