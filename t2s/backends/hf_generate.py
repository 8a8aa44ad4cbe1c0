"""transformers ``generate`` as a turn-synchronous backend (CPU, and GPUs without vLLM).

Each call left-pads the batch, generates up to the largest per-sequence ``max_tokens``, then cuts every sequence at
its first stop token (kept, finish "stop") or at its own limit (finish "length"). Logprobs are computed from the raw
logits as ``log_softmax(logits / T)`` at the sampled token, with no top-k/top-p/min-p: the training side's definition,
whatever sampling filters were used to draw the token.

Inside a trainer, pass a callable that yields the model, so ZeRO-3/FSDP gathering happens per call::

    backend = HFGenerateBackend.for_trainer(trainer)

With several processes, entering that context is collective (ZeRO-3 gathers, FSDP summons parameters), so every rank
must enter it the same number of times although their episodes end after different numbers of turns. Each round
therefore starts with a sum over ranks of "still generating", and ``end_rollout`` (called by the rollout when its
own episodes are done) keeps entering the context, without generating, until every rank is done.
"""

from __future__ import annotations

import contextlib
from typing import Callable, ContextManager, Sequence

from t2s.backends.base import SamplingSettings, TurnOutput, TurnSyncBackend, finish_turn, stop_token_ids


class HFGenerateBackend(TurnSyncBackend):
    """Batches of token-id prompts through ``model.generate``; ``model`` is a model or a context-manager factory."""

    def __init__(
        self,
        model,
        tokenizer,
        *,
        max_batch_size: int | None = None,
        stop_ids: Sequence[int] | None = None,
        ranks_active: Callable[[bool], int] | None = None,
    ) -> None:
        if callable(model) and not hasattr(model, "generate"):
            self._model_context: Callable[[], ContextManager] = model
        else:
            self._model_context = lambda: contextlib.nullcontext(model)
        self.stop_token_ids = list(stop_ids) if stop_ids is not None else stop_token_ids(tokenizer)
        pad = tokenizer.pad_token_id
        self.pad_token_id = pad if pad is not None else self.stop_token_ids[-1]
        self.max_batch_size = max_batch_size
        self._ranks_active = ranks_active  # (this rank generates?) -> how many ranks do; None on one process
        self._calls = 0

    @classmethod
    def for_trainer(cls, trainer, **kwargs) -> HFGenerateBackend:
        """A backend that unwraps the trainer's model for every generate call (DDP, ZeRO-3)."""
        from trl.models import unwrap_model_for_generation

        args, accelerator = trainer.args, trainer.accelerator

        @contextlib.contextmanager
        def model_context():
            with contextlib.ExitStack() as stack:
                model = stack.enter_context(
                    unwrap_model_for_generation(
                        trainer.model_wrapped, accelerator,
                        gather_deepspeed3_params=getattr(args, "ds3_gather_for_generation", True),
                        gradient_checkpointing_kwargs=getattr(args, "gradient_checkpointing_kwargs", None),
                    )
                )  # fmt: skip
                dist = getattr(trainer, "_dist", None)
                if dist is not None:
                    stack.enter_context(dist.summon_full_params(trainer.model_wrapped, recurse=False))
                yield model

        def ranks_active(active: bool) -> int:
            import torch

            flag = torch.tensor([1 if active else 0], device=accelerator.device)
            return int(accelerator.gather(flag).sum().item())

        if accelerator.num_processes > 1:
            kwargs.setdefault("ranks_active", ranks_active)
        return cls(model_context, trainer.processing_class, **kwargs)

    def end_rollout(self) -> None:
        """Enter the model context (without generating) until no rank generates any more (multi-process only)."""
        if self._ranks_active is None:
            return
        while self._ranks_active(False):
            with self._model_context():
                pass

    def _generate(self, prompts, max_tokens, sampling: SamplingSettings, seeds) -> list[TurnOutput]:
        if self._ranks_active is not None:
            self._ranks_active(True)
        size = self.max_batch_size or len(prompts)
        outputs: list[TurnOutput] = []
        with self._model_context() as model:
            for start in range(0, len(prompts), size):
                chunk_seed = next((s for s in seeds[start : start + size] if s is not None), None)
                outputs += self._generate_batch(
                    model, prompts[start : start + size], max_tokens[start : start + size], sampling, chunk_seed
                )
        return outputs

    def _generate_batch(self, model, prompts, max_tokens, sampling: SamplingSettings, seed) -> list[TurnOutput]:
        import torch
        from transformers import GenerationConfig

        device = next(model.parameters()).device
        width = max(len(p) for p in prompts)
        input_ids = torch.full((len(prompts), width), self.pad_token_id, dtype=torch.long)
        attention = torch.zeros((len(prompts), width), dtype=torch.long)
        for i, ids in enumerate(prompts):
            input_ids[i, width - len(ids) :] = torch.tensor(ids, dtype=torch.long)
            attention[i, width - len(ids) :] = 1
        if sampling.presence_penalty or sampling.frequency_penalty:
            raise ValueError("Error: the transformers backend has no presence or frequency penalty; set both to 0")
        greedy = sampling.temperature <= 0
        # When sampling, every filter is set explicitly: transformers fills the None fields from the checkpoint's
        # generation_config (Qwen3.5 ships top_p/top_k defaults), which would silently reshape training sampling.
        config = GenerationConfig(
            max_new_tokens=max(1, max(max_tokens)),
            do_sample=not greedy,
            temperature=None if greedy else sampling.temperature,
            top_p=None if greedy else min(1.0, sampling.top_p),
            top_k=0 if greedy or sampling.top_k <= 0 else sampling.top_k,
            min_p=None if greedy else max(0.0, sampling.min_p),
            typical_p=None if greedy else 1.0,
            repetition_penalty=sampling.repetition_penalty,
            eos_token_id=list(self.stop_token_ids),
            pad_token_id=self.pad_token_id,
            output_logits=True,
            return_dict_in_generate=True,
        )
        if seed is not None:
            torch.manual_seed(seed)
        self._calls += 1
        with torch.no_grad():
            out = model.generate(
                input_ids=input_ids.to(device), attention_mask=attention.to(device), generation_config=config
            )
        new_ids = out.sequences[:, width:].cpu()
        scale = 1.0 if greedy else sampling.temperature
        logits = torch.stack(out.logits, dim=1).float().cpu()  # (batch, steps, vocab), raw (unprocessed)
        token_lp = torch.log_softmax(logits / scale, dim=-1).gather(-1, new_ids[:, : logits.shape[1], None])[..., 0]
        results = []
        for i, limit in enumerate(max_tokens):
            results.append(finish_turn(new_ids[i].tolist(), token_lp[i].tolist(), limit, self.stop_token_ids))
        return results
