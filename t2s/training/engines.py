"""The generation backend a training run uses (``rollout_backend``): transformers ``generate`` on the policy, TRL's
colocated vLLM engine, or a vLLM server, whose context is checked against the episode budget before the first step."""

from __future__ import annotations

import logging

from t2s.training.configs import ConfigError

log = logging.getLogger(__name__)


def server_url(args) -> str:
    """The vLLM server the ``vllm_server`` backend talks to."""
    return args.vllm_server_base_url or f"http://{args.vllm_server_host}:{args.vllm_server_port}"


def check_server_context(args) -> None:
    """The server's ``max_model_len`` must hold a whole episode (``episode_token_budget``), or late turns are refused
    with HTTP 400 and their episodes end as errors. Waits up to ``vllm_server_timeout`` for a server still starting."""
    from t2s.backends.vllm_server import VLLMServerBackend, context_error

    url = server_url(args)
    try:
        length = VLLMServerBackend(url, stop_ids=()).served_max_model_len(wait=args.vllm_server_timeout)
    except RuntimeError as exc:
        raise ConfigError(str(exc)) from None
    if length is None:
        log.warning("the server at %s reports no max_model_len; cannot check it against episode_token_budget %d",
                    url, args.episode_token_budget)
    elif (problem := context_error(url, length, args.episode_token_budget)) is not None:
        raise ConfigError(problem)


def build_backend(trainer):
    """The generation backend that ``trainer.args.rollout_backend`` names, bound to the trainer's model or engine."""
    name = trainer.args.rollout_backend
    if name == "transformers":
        from t2s.backends.hf_generate import HFGenerateBackend

        return HFGenerateBackend.for_trainer(trainer, max_batch_size=trainer.args.rollout_max_batch_size)
    if name == "vllm_colocate":
        from t2s.backends.vllm_colocate import VLLMColocateBackend

        return VLLMColocateBackend.for_trainer(trainer)
    if name == "vllm_server":
        from t2s.backends.vllm_server import VLLMServerBackend

        args = trainer.args
        return VLLMServerBackend(server_url(args), trainer.processing_class, max_concurrency=args.rollout_concurrency,
                                 request_timeout=args.rollout_request_timeout)
    raise ConfigError(f"Error: rollout_backend {name!r} is unknown.")
