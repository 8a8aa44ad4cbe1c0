"""vLLM colocate: turn-synchronous batches through an in-process ``vllm.LLM`` (the published 3-rank layout).

The engine is the trainer's own ``trainer.vllm_generation.llm`` (TRL pushes the weights into it before each rollout).
We call ``llm.generate`` directly with one ``SamplingParams`` per request, so every turn gets its own ``max_tokens``;
TRL's ``VLLMGeneration.generate`` would force ``max_completion_length`` and re-sync weights under sleep mode.
With ``vllm_enable_sleep_mode`` the engine sleeps (level 2) between rollouts: the first turn of a rollout wakes its
KV cache (re-pushing the weights first if level-2 sleep discarded them since TRL's last sync), and ``end_rollout``
puts it back to sleep, as TRL's own ``generate`` does around one call.
vLLM is imported lazily; tests inject a ``SamplingParams``-shaped class and an ``LLM``-shaped object.
"""

from __future__ import annotations

from typing import Sequence

from t2s.backends.base import SamplingSettings, TurnOutput, TurnSyncBackend, engine_turn, stop_token_ids


class VLLMColocateBackend(TurnSyncBackend):
    """Batches of token-id prompts through ``llm.generate``; ``llm`` is a ``vllm.LLM`` or an object shaped like it."""

    def __init__(self, llm, tokenizer=None, *, stop_ids: Sequence[int] | None = None, sampling_params_cls=None,
                 generation=None):
        if stop_ids is None and tokenizer is None:
            raise ValueError("VLLMColocateBackend needs a tokenizer or stop_ids")
        self.llm = llm
        self.stop_token_ids = list(stop_ids) if stop_ids is not None else stop_token_ids(tokenizer)
        self._sampling_params_cls = sampling_params_cls
        self._generation = generation  # TRL's VLLMGeneration: its sleep-mode state and weight sync
        self._awake = False

    @classmethod
    def for_trainer(cls, trainer, **kwargs) -> VLLMColocateBackend:
        """The engine TRL built for ``vllm_mode="colocate"``."""
        generation = getattr(trainer, "vllm_generation", None)
        if generation is None or getattr(generation, "llm", None) is None:
            raise ValueError("Error: the trainer has no colocated vLLM engine (set rollout_backend: vllm_colocate)")
        return cls(generation.llm, trainer.processing_class, generation=generation, **kwargs)

    def _wake(self) -> None:
        """Sleep mode only: wake the KV cache for this rollout, re-pushing discarded weights first."""
        generation = self._generation
        if self._awake or generation is None or not getattr(generation, "enable_sleep_mode", False):
            return
        if getattr(generation, "_llm_weights_sleeping", False):
            generation.sync_weights()  # level-2 sleep dropped the weights and TRL did not sync this time
        self.llm.wake_up(tags=["kv_cache"])
        self._awake = True

    def end_rollout(self) -> None:
        """Sleep mode only: put the engine back to sleep (level 2) once this rank's episodes are done."""
        if self._awake:
            self.llm.sleep(level=2)
            self._generation._llm_weights_sleeping = True
            self._awake = False

    def sampling_params(self, max_tokens: int, sampling: SamplingSettings, seed: int | None = None):
        cls = self._sampling_params_cls
        if cls is None:
            from vllm import SamplingParams as cls  # noqa: N813 - lazy: vllm is a GPU-only dependency
        return cls(
            n=1,
            max_tokens=max(1, int(max_tokens)),
            **sampling.engine_fields(),
            seed=seed,
            logprobs=0,
            stop_token_ids=list(self.stop_token_ids),
            skip_special_tokens=False,
        )

    def _generate(self, prompts, max_tokens, sampling: SamplingSettings, seeds) -> list[TurnOutput]:
        self._wake()
        params = [self.sampling_params(m, sampling, s) for m, s in zip(max_tokens, seeds)]
        outputs = self.llm.generate(
            prompts=[{"prompt_token_ids": list(p)} for p in prompts], sampling_params=params, use_tqdm=False
        )
        if len(outputs) != len(prompts):
            raise RuntimeError(f"vLLM answered {len(outputs)} outputs for {len(prompts)} prompts")
        return [self._turn(out, m) for out, m in zip(outputs, max_tokens)]

    def _turn(self, request_output, max_tokens: int) -> TurnOutput:
        completion = request_output.outputs[0]
        ids = [int(t) for t in completion.token_ids]
        logprobs = [_sampled_logprob(step, tid) for step, tid in zip(completion.logprobs or [], ids)]
        if len(logprobs) != len(ids):
            raise RuntimeError("vLLM returned no logprobs: SamplingParams(logprobs=0) is required")
        return engine_turn(ids, logprobs, completion.finish_reason, max_tokens, self.stop_token_ids)


def _sampled_logprob(step: dict, token_id: int) -> float:
    """The logprob of the sampled token from one step's ``{token_id: Logprob}`` dict (vLLM's shape)."""
    entry = step[token_id]
    return float(getattr(entry, "logprob", entry))
