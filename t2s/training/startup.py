"""What the trainer checks and sets up before its first step, beyond the config (``validate_training_config``):
the think block of the generation prompt, the chat template's stop tokens in the eos ids, the policy's load
arguments, the reward functions, and the shape of what the rollout returns; and ``setup_error``, the one line
``train`` and ``sft`` print when any of it, or the recipe, the data or the model, stops them."""

from __future__ import annotations

from typing import Callable

from t2s.env.chat_format import ChatFormatError, chat_format
from t2s.training.configs import ConfigError


def _format(tokenizer):
    try:
        return chat_format(tokenizer)
    except ChatFormatError as exc:
        raise ConfigError(str(exc)) from None


def check_eos_ids(eos_token_ids, tokenizer) -> None:
    """Every stop token of the chat template (for Qwen3.5 ``<|im_end|>`` and ``<|endoftext|>``) must end a
    completion; a ConfigError names the missing one."""
    fmt = _format(tokenizer)
    for token, token_id in zip(fmt.stop_tokens, fmt.stop_ids):
        if token_id not in list(eos_token_ids):
            raise ConfigError(
                f"Error: the eos ids {list(eos_token_ids)} do not include {token} (id {token_id}); generation must "
                f"stop on every stop token of the chat template: {', '.join(fmt.stop_tokens)}."
            )


def check_think_prompt(tokenizer, chat_template_kwargs: dict | None, enable_thinking: bool) -> None:
    """With thinking on and a template that has a think block, the prompt TRL renders with
    ``chat_template_kwargs`` must open it (end in ``<think>\\n``). A template without one plays without thinking
    (``chat_format`` says so once)."""
    if not enable_thinking or not _format(tokenizer).thinking:
        return
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Which tables exist?"}], tokenize=False, add_generation_prompt=True,
        **dict(chat_template_kwargs or {}),
    )
    if not rendered.endswith("<think>\n"):
        raise ConfigError(
            f"Error: thinking is on but the chat template's generation prompt does not open a think block: it ends "
            f"with {rendered[-40:]!r}, expected '<think>\\n'. Pass enable_thinking=True to the template."
        )


def set_generation_eos(model, tokenizer) -> list[int]:
    """Set ``model.generation_config.eos_token_id`` to the chat template's stop ids (Qwen3.5 defaults to
    ``<|endoftext|>`` alone; its turns end on ``<|im_end|>``)."""
    ids = list(_format(tokenizer).stop_ids)
    model.generation_config.eos_token_id = ids
    return ids


def check_rollout_output(output: dict, n: int) -> None:
    """Assert the rollout's TRL dict is flat and consistent: n sequences, per-token lists of equal length."""
    for key in ("prompt_ids", "completion_ids", "logprobs", "env_mask"):
        if key not in output:
            raise RuntimeError(f"rollout output lacks {key!r}")
        if output[key] is None or len(output[key]) != n:
            raise RuntimeError(f"rollout output {key!r} has {None if output[key] is None else len(output[key])} "
                               f"entries for {n} rows")
    for i, (completion, logprobs, mask) in enumerate(
        zip(output["completion_ids"], output["logprobs"], output["env_mask"], strict=True)
    ):
        if not all(isinstance(t, int) for t in completion):
            raise RuntimeError(f"rollout completion {i} is not a flat list of ints")
        if len(logprobs) != len(completion) or len(mask) != len(completion):
            raise RuntimeError(f"rollout sequence {i}: {len(completion)} completion ids, {len(logprobs)} logprobs, "
                               f"{len(mask)} env_mask entries")
        if logprobs and not isinstance(logprobs[0], (int, float)):
            raise RuntimeError(f"rollout logprobs {i} must be a flat list of floats, not {type(logprobs[0]).__name__}")
    for key in output:
        if key not in ("prompt_ids", "completion_ids", "logprobs", "env_mask") and isinstance(output[key], list):
            if len(output[key]) != n:
                raise RuntimeError(f"rollout extra {key!r} has {len(output[key])} entries for {n} rows")


def policy_init_kwargs(args) -> dict:
    """``from_pretrained`` kwargs for the policy, as TRL builds them for a model given by path.

    Under DDP or DeepSpeed every rank holds a whole copy on its own device, so ``device_map`` is None: the default
    ``"auto"`` would spread each rank's copy over every visible GPU.
    """
    kwargs = dict(args.model_init_kwargs or {})
    if args.distributed_state.distributed_type in ("MULTI_GPU", "DEEPSPEED"):
        kwargs["device_map"] = None
    kwargs.setdefault("trust_remote_code", args.trust_remote_code)
    return kwargs


def resolve_reward_funcs(names, args) -> list[Callable]:
    """TRL reward functions for ``names`` (validated); ``dense`` gets the recipe's fallback scale and group size."""
    from t2s.scoring import rewards

    funcs = []
    for name in names:
        if name not in rewards.REWARD_FUNCS:
            raise ConfigError(f"Error: unknown reward name {name!r}; known: {', '.join(sorted(rewards.REWARD_FUNCS))}.")
        if name == "dense":
            settings = rewards.RewardSettings(fallback_reward_scale=args.fallback_reward_scale)
            funcs.append(rewards.make_dense_reward(settings, group_size=args.num_generations))
        else:
            funcs.append(rewards.REWARD_FUNCS[name])
    return funcs


def setup_error(exc: Exception) -> int:
    """A recipe, config, data or model error at start-up on stderr (a ConfigError as it is, any other as its first
    line, prefixed ``Error:``), once for the processes of one launch (``t2s.training.launch``); returns the exit code
    (2)."""
    from t2s.ui.console import print_error_once

    if isinstance(exc, ConfigError):
        print_error_once(str(exc))
        return 2
    message = str(exc) if str(exc).startswith("Error:") else f"Error: {exc}"
    print_error_once((message.splitlines() or [""])[0])
    return 2
