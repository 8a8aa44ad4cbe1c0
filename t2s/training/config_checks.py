"""The start-up checks of a training config (DESIGN §8), run when ``T2SGRPOConfig`` is built: one clear ``Error:``
line (:class:`t2s.errors.ConfigError`) for the first problem, before any data or model loads.

- values of the wrong kind (a list or text where a number belongs) and numbers out of range (``num_generations`` below
  2, a learning rate, temperature, size, timeout or episode limit that is not a finite number above 0, a clip range or
  norm below 0, ``top_p`` outside (0, 1]);
- names that must be known (rollout backend, sync mode, engine dtype, dialect, tool format, rewards);
- settings that contradict the published loss or its sampling (top-k/top-p/min-p filters, TRL loss settings the t2s
  loss never reads, a group split across ranks, a KL controller out of range).

The checks that need the tokenizer or model (think block, eos ids) run in the trainer (``t2s.training.startup``).
"""

from __future__ import annotations

import math
import os
from dataclasses import fields

from t2s.backends.vllm_engine import ENGINE_DTYPES
from t2s.errors import ConfigError

ROLLOUT_BACKENDS = ("transformers", "vllm_colocate", "vllm_server")
OLD_LOGPROBS_MODES = ("sampler", "recompute")
SERVER_SYNC_MODES = ("nccl", "files")
# an episode's limits, each a number above 0 (eval's options for them: t2s.evaluation.options.EPISODE_LIMITS)
LIMIT_FIELDS = ("max_turns", "episode_token_budget", "max_tokens_per_turn", "min_episode_tokens", "forced_turn_reserve",
                "max_calls_per_turn", "max_failed_queries", "tool_timeout", "episode_tool_seconds")
# other numbers that must be finite and above 0 (a 0 divides, an infinity never ends a wait or moves a controller)
POSITIVE_FIELDS = ("learning_rate", "temperature", "target_kl", "kl_horizon", "loss_norm_constant", "beta_max",
                   "rollout_concurrency", "rollout_request_timeout", "num_iterations", "per_device_train_batch_size",
                   "gradient_accumulation_steps", "steps_per_generation", "num_train_epochs", "adam_epsilon",
                   "max_completion_length", "max_length")
# numbers that must be finite and 0 or more (None: unset, where the field allows it)
NON_NEGATIVE_FIELDS = ("epsilon", "epsilon_high", "max_grad_norm", "weight_decay", "fallback_reward_scale",
                       "rollout_max_batch_size", "dataloader_num_workers", "warmup_steps", "warmup_ratio", "seed")
UNIT_INTERVAL_FIELDS = ("adam_beta1", "adam_beta2")  # numbers in [0, 1)
KNOWN_VALUES = {"importance_sampling_level": ("token", "sequence"),  # TRL's own
                "scale_rewards": ("group", "batch", "none", True, False)}
LIST_SETTINGS = ("reward_names", "reward_weights", "difficulties")  # t2s's list settings a recipe may write as one item


def check_kinds(args) -> None:
    """Every number setting (a field whose default is a number) holds a number: YAML hands a list or a word to the
    dataclass as it is, and the library that first compares or divides it fails with a traceback. A list setting
    (``LIST_SETTINGS``) written as one item (``reward_names: dense``) becomes a list of it, not of its letters."""
    for name in LIST_SETTINGS:
        value = getattr(args, name, None)
        if isinstance(value, (str, int, float)):
            setattr(args, name, [value])
    for name in ("reward_names", "difficulties"):
        value = getattr(args, name, None)
        if value is not None and not (isinstance(value, list) and all(isinstance(item, str) for item in value)):
            raise ConfigError(f"Error: {name} must be a list of names, got {value!r}")
    own = _own_settings(args)
    if not isinstance(getattr(args, "chat_template_kwargs", None) or {}, dict):  # TRL's, annotated as text
        raise ConfigError(f"Error: chat_template_kwargs must be a mapping, got {args.chat_template_kwargs!r}")
    for item in fields(args):
        default, value = item.default, getattr(args, item.name, None)
        kind = item.type if isinstance(item.type, str) else getattr(item.type, "__name__", str(item.type))
        if value is not None and item.name in own and kind in TEXT_KINDS and not isinstance(value, str):
            raise ConfigError(f"Error: {item.name} must be text, got {value!r}")
        if value is not None and item.name in own and kind.startswith("dict") and not isinstance(value, dict):
            raise ConfigError(f"Error: {item.name} must be a mapping of settings, got {value!r}")
        if isinstance(default, bool) or not isinstance(default, (int, float)) or value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"Error: {item.name} must be a number, got {value!r}")


TEXT_KINDS = ("str", "str | None")
LIBRARY_SETTINGS = ("output_dir", "model_name_or_path")  # the libraries' text settings that t2s reads as paths


def _own_settings(args) -> set[str]:
    """The settings t2s declares (in its own config classes), and the libraries' that it reads itself: their kinds
    are checked by their annotations (text, a mapping), which the libraries' other fields do not keep to."""
    own = set(LIBRARY_SETTINGS)
    for cls in type(args).__mro__:
        if cls.__module__.startswith("t2s."):
            own.update(vars(cls).get("__annotations__", {}))
    return own


def check_choices(args) -> None:
    """A setting with a fixed set of values holds one of them: refused when the recipe is read, not once the model
    has loaded and the data's gold SQL has run."""
    from t2s.data.loaders import KINDS

    for name, allowed in (("dataset_kind", (*KINDS, "json", "auto")), ("mode", ("full", "withheld")),
                          ("engine", ("sqlite", "duckdb", "postgres"))):
        value = getattr(args, name, None)
        if value is not None and value not in allowed:  # exactly: the loaders and prompts compare them so
            raise ConfigError(f"Error: {name} {value!r} is unknown; use one of {', '.join(allowed)}.")
    rows = getattr(args, "max_train_rows", None)
    if rows is not None and rows < 0:  # rows[:-1] would drop one row
        raise ConfigError(f"Error: max_train_rows must be 0 or more (None: all), got {rows!r}")


def check_groups_per_rank(args) -> None:
    """A rank's generation batch (per_device_train_batch_size × steps_per_generation) must hold whole groups."""
    if not isinstance(args.num_generations, int) or args.num_generations < 2:
        raise ConfigError(f"Error: num_generations must be 2 or more (got {args.num_generations}): GRPO's advantages "
                          "compare the rollouts of one group")
    steps = args.steps_per_generation
    if steps is None and args.generation_batch_size is None:
        steps = args.gradient_accumulation_steps
    if steps is None:  # derived from generation_batch_size, whose divisibility TRL checks
        return
    per_rank = args.per_device_train_batch_size * steps
    if per_rank % args.num_generations != 0:
        raise ConfigError(
            f"Error: a GRPO group would be split across ranks: per_device_train_batch_size × steps_per_generation = "
            f"{args.per_device_train_batch_size} × {steps} = {per_rank} is not a multiple of "
            f"num_generations ({args.num_generations}). Groups must stay on one rank (consensus and advantages "
            "need the whole group)."
        )


def _sampling_filters(args) -> list[str]:
    found = []
    gen = dict(args.generation_kwargs or {})
    top_k = gen.get("top_k", args.top_k)
    top_p = gen.get("top_p", args.top_p)
    min_p = gen.get("min_p", args.min_p)
    if top_k not in (None, 0, -1):
        found.append(f"top_k={top_k}")
    if top_p is not None and float(top_p) < 1.0:
        found.append(f"top_p={top_p}")
    if min_p not in (None, 0, 0.0):
        found.append(f"min_p={min_p}")
    return found


def _unused_loss_settings(args) -> list[str]:
    """TRL loss settings changed from their neutral value that the t2s loss (DESIGN §8) never reads."""
    found = []
    if getattr(args, "loss_type", "grpo") != "grpo":
        found.append(f"loss_type={args.loss_type!r}")
    for name in ("delta", "off_policy_mask_threshold"):
        if getattr(args, name, None) is not None:
            found.append(f"{name}={getattr(args, name)}")
    if getattr(args, "top_entropy_quantile", 1.0) < 1.0:
        found.append(f"top_entropy_quantile={args.top_entropy_quantile}")
    if getattr(args, "entropy_coef", 0.0) or getattr(args, "use_adaptive_entropy", False):
        found.append("an entropy bonus (entropy_coef / use_adaptive_entropy)")
    if getattr(args, "use_bias_correction_kl", False):
        found.append("use_bias_correction_kl=True")
    return found


def check_output_dir(output_dir: str | None, model: str | None) -> None:
    """``train``'s and ``sft``'s output folder: not a file, not an eval's results, and not the model folder the run
    starts from, whose weights, config and tokenizer the run's saves would replace."""
    if not output_dir:
        return
    if os.path.isfile(output_dir):
        raise ConfigError(f"Error: output_dir {output_dir} is a file, not a folder.")
    if os.path.isdir(output_dir) and any(  # an eval's mode folders (t2s.evaluation)
            os.path.isfile(os.path.join(entry.path, "eval_config.json")) for entry in os.scandir(output_dir)):
        raise ConfigError(f"Error: output_dir {output_dir} holds an eval's results; choose another folder.")
    if model and os.path.isdir(model) and os.path.realpath(output_dir) == os.path.realpath(model):
        raise ConfigError(f"Error: output_dir {output_dir} is the model folder the run starts from; its saves would "
                          "write over that model. Choose another folder.")


def check_report_to(args) -> None:
    """Each ``report_to`` integration is one transformers knows and this machine has installed (``wandb`` missing
    failed the run only once both models had loaded)."""
    names = getattr(args, "report_to", None)
    names = [names] if isinstance(names, str) else list(names or [])
    names = [name for name in names if name not in ("none", "all")]
    if not names:
        return
    from transformers.integrations import get_available_reporting_integrations
    from transformers.integrations.integration_utils import INTEGRATION_TO_CALLBACK

    available = get_available_reporting_integrations()
    for name in names:
        if name not in INTEGRATION_TO_CALLBACK:
            raise ConfigError(f"Error: report_to {name!r} is unknown; use none or one of "
                              f"{', '.join(sorted(INTEGRATION_TO_CALLBACK))}.")
        if name not in available:
            raise ConfigError(f"Error: report_to {name!r}: its package is not installed here (the integrations "
                              f"installed: {', '.join(available) or 'none'}).")


def check_numbers(args) -> None:
    """Every number setting of ``POSITIVE_FIELDS``, ``NON_NEGATIVE_FIELDS``, ``UNIT_INTERVAL_FIELDS`` and
    ``LIMIT_FIELDS`` that ``args`` has is finite and in its range (``train``'s and ``sft``'s configs alike)."""
    for name in (*LIMIT_FIELDS, *POSITIVE_FIELDS, *NON_NEGATIVE_FIELDS, *UNIT_INTERVAL_FIELDS):
        if not hasattr(args, name):
            continue
        value = getattr(args, name)
        if value is None and name not in LIMIT_FIELDS + ("learning_rate", "temperature"):
            continue
        if name in UNIT_INTERVAL_FIELDS:
            low, fits = "in [0, 1)", lambda v: 0 <= v < 1
        elif name in NON_NEGATIVE_FIELDS:
            low, fits = "0 or more", lambda v: v >= 0
        else:
            low, fits = "above 0", lambda v: v > 0
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                or not fits(value):
            raise ConfigError(f"Error: {name} must be a finite number {low}, got {value!r}")


def validate_training_config(args, reward_names=None) -> None:
    """Start-up checks that need only the config (DESIGN §8); raises :class:`ConfigError` on the first problem.

    The checks that need the tokenizer or model (think block, eos ids) run in the trainer.
    """
    check_output_dir(args.output_dir, getattr(args, "model_name_or_path", None))
    if args.rollout_backend not in ROLLOUT_BACKENDS:
        raise ConfigError(f"Error: rollout_backend {args.rollout_backend!r} is unknown; use one of "
                          f"{', '.join(ROLLOUT_BACKENDS)}.")
    for name, known in (("vllm_server_sync", SERVER_SYNC_MODES), ("vllm_dtype", ENGINE_DTYPES)):
        if getattr(args, name, None) not in (None, *known):  # `--vllm_dtype None` arrives as the string
            raise ConfigError(f"Error: {name} {getattr(args, name)!r} is unknown; use one of {', '.join(known)}.")
    if args.old_logprobs not in OLD_LOGPROBS_MODES:
        raise ConfigError(f"Error: old_logprobs {args.old_logprobs!r} is unknown; use 'sampler' or 'recompute'.")
    from t2s.env import tool_schemas

    try:
        tool_schemas.check_dialect(args.dialect)
        tool_schemas.check_tool_format(args.tool_format)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    check_numbers(args)
    for name, known in KNOWN_VALUES.items():
        if getattr(args, name, known[0]) not in known:
            raise ConfigError(f"Error: {name} {getattr(args, name)!r} is unknown; use one of "
                              f"{', '.join(map(str, known))}.")
    if args.reward_weights is not None and not all(
            isinstance(w, (int, float)) and not isinstance(w, bool) and math.isfinite(w) for w in args.reward_weights):
        raise ConfigError(f"Error: reward_weights must be finite numbers, got {args.reward_weights!r}")
    problem = args.episode_config().budget_problem() if hasattr(args, "episode_config") else None
    if problem:
        raise ConfigError(problem)
    if args.top_p is not None and not 0 < args.top_p <= 1:
        raise ConfigError(f"Error: top_p must lie in (0, 1] (got {args.top_p}).")
    filters = _sampling_filters(args)
    if filters:
        raise ConfigError(
            f"Error: training sampling must be temperature-only, but {', '.join(filters)} is set. The trainer's "
            "logprobs never apply top-k/top-p/min-p, so the sampler's would not match; remove them (evaluation "
            "sampling is separate)."
        )
    check_groups_per_rank(args)
    if not args.beta > 0:
        raise ConfigError(f"Error: beta must be > 0 (got {args.beta}): TRL builds the reference model only when "
                          "beta != 0, and the KL controller needs one.")
    if not 0 < args.beta_min <= args.beta <= args.beta_max:
        raise ConfigError(f"Error: need 0 < beta_min <= beta <= beta_max (got {args.beta_min}, {args.beta}, "
                          f"{args.beta_max}).")
    if not args.target_kl > 0 or not args.kl_horizon > 0:
        raise ConfigError("Error: target_kl and kl_horizon must be > 0.")
    if not args.loss_norm_constant > 0:
        raise ConfigError(f"Error: loss_norm_constant must be > 0 (got {args.loss_norm_constant}).")
    generate_every = args.steps_per_generation * args.num_iterations
    if args.old_logprobs == "sampler" and args.gradient_accumulation_steps % generate_every != 0:
        raise ConfigError(
            f"Error: old_logprobs 'sampler' needs gradient_accumulation_steps ({args.gradient_accumulation_steps}) to "
            f"be a multiple of steps_per_generation × num_iterations ({generate_every}); otherwise samples come from "
            "an older policy and old logprobs must be recomputed (use old_logprobs: recompute)."
        )
    if args.rollout_backend == "vllm_colocate" and args.vllm_tensor_parallel_size != 1:
        raise ConfigError(
            f"Error: rollout_backend vllm_colocate needs vllm_tensor_parallel_size 1 (got "
            f"{args.vllm_tensor_parallel_size}): each rank drives its own engine with its own episodes, while a "
            "tensor-parallel group needs identical generate calls on all of its ranks. Use vllm_server for a sharded "
            "engine."
        )
    if args.mask_truncated_completions:
        raise ConfigError("Error: mask_truncated_completions must be off: truncated episodes train with their "
                          "reward (DESIGN §8).")
    unused = _unused_loss_settings(args)
    if unused:
        raise ConfigError(
            f"Error: {', '.join(unused)} would be ignored: the t2s trainer's loss (DESIGN §8: clipped ratio, k3 KL, "
            "sum over tokens / loss_norm_constant) does not use it. Remove it from the recipe."
        )
    names = args.reward_names if reward_names is None else reward_names
    if not names:
        raise ConfigError("Error: reward_names is empty; name at least one of t2s.scoring.rewards.REWARD_FUNCS.")
    from t2s.scoring.rewards import REWARD_FUNCS

    unknown = [name for name in names if name not in REWARD_FUNCS]
    if unknown:
        raise ConfigError(f"Error: unknown reward name {unknown[0]!r}; known: {', '.join(sorted(REWARD_FUNCS))}.")
    if args.reward_weights is not None and len(args.reward_weights) != len(names):
        raise ConfigError(f"Error: {len(args.reward_weights)} reward_weights for {len(names)} reward_names.")
