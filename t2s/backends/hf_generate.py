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

**Keys and values kept from one call to the next.** A multi-turn episode's next prompt is its last prompt, the turn's
tokens and the environment's reply, so most of it was already run through the model. Where the model's cache is plain
full attention (every layer a ``DynamicLayer``: Llama, Qwen3, SmolLM2; not sliding-window or linear-attention layers,
whose state cannot be cut back to a prefix), each call keeps every row's keys and values (up to ``reuse_cache_bytes``)
and the next call starts from the longest prefix a row shares with one of them, so only the rest is prefilled. The
kept cache is dropped at ``end_rollout`` and whenever the weights change (a parameter's version counter, or the
trainer's step), so a cache never outlives the weights that computed it. The tokens are the same as a fresh prefill's
wherever the two best next tokens are not a near-tie (the sums run in another order).
"""

from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Callable, ContextManager, Sequence

from t2s.backends.base import SamplingSettings, TurnOutput, TurnSyncBackend, finish_turn, stop_token_ids


REUSE_CACHE_BYTES = 1 << 30  # the most keys and values kept from one call to the next (1 GiB)


@dataclass(frozen=True)
class KeptRow:
    """One row's tokens as the model saw them (prompt and the sampled tokens fed back), and each layer's keys and
    values for them, ``(heads, len(tokens), head_dim)`` each."""

    tokens: Any  # torch.LongTensor (len,)
    layers: list[tuple[Any, Any]]


@dataclass(frozen=True)
class KeptCall:
    """What the last call kept: the weights' version it ran on and its rows."""

    version: object = None
    rows: list[KeptRow] = field(default_factory=list)

    @cached_property
    def table(self):
        """The rows' tokens, one row each, padded with -1 (never a token id): built once, matched by every chunk."""
        import torch

        longest = max((len(row.tokens) for row in self.rows), default=0)
        table = torch.full((len(self.rows), longest), -1, dtype=torch.long)
        for k, row in enumerate(self.rows):
            table[k, : len(row.tokens)] = row.tokens
        return table


@dataclass(frozen=True)
class ReusedPrefix:
    """A batch's cache built from kept rows (a ``DynamicCache`` of its first positions) and how many of its prompt
    tokens it holds."""

    cache: Any
    tokens: int


class HFGenerateBackend(TurnSyncBackend):
    """Batches of token-id prompts through ``model.generate``; ``model`` is a model or a context-manager factory.
    ``reuse_cache_bytes`` caps the keys and values kept for the next call (0 keeps none); ``weights_version`` says
    when the weights changed (default: the parameters' in-place version counters)."""

    def __init__(
        self,
        model,
        tokenizer,
        *,
        max_batch_size: int | None = None,
        stop_ids: Sequence[int] | None = None,
        ranks_active: Callable[[bool], int] | None = None,
        reuse_cache_bytes: int = REUSE_CACHE_BYTES,
        weights_version: Callable[[Any], object] | None = None,
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
        self.reuse_cache_bytes = reuse_cache_bytes
        self._weights_version = weights_version or parameter_versions
        self._kept = KeptCall()
        self._kept_lock = threading.Lock()
        self.reused_tokens = 0  # prompt tokens taken from kept keys and values instead of prefilled
        self.prompt_tokens = 0

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
        kwargs.setdefault("weights_version", lambda model: (trainer.state.global_step, parameter_versions(model)))
        return cls(model_context, trainer.processing_class, **kwargs)

    def end_rollout(self) -> None:
        """Drop the kept keys and values; with several ranks, enter the model context (without generating) until no
        rank generates any more."""
        with self._kept_lock:
            self._kept = KeptCall()
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
            version = self._weights_version(model) if self.reuse_cache_bytes > 0 else None
            with self._kept_lock:
                kept = self._kept if self._kept.version == version else KeptCall()
            keep: list[KeptRow] | None = [] if self.reuse_cache_bytes > 0 else None
            for start in range(0, len(prompts), size):
                chunk_seed = next((s for s in seeds[start : start + size] if s is not None), None)
                outputs += self._generate_batch(
                    model, prompts[start : start + size], max_tokens[start : start + size], sampling, chunk_seed,
                    kept, keep,
                )
        if keep is not None:
            with self._kept_lock:
                self._kept = KeptCall(version, keep)
        return outputs

    def _generate_batch(
        self, model, prompts, max_tokens, sampling: SamplingSettings, seed, kept: KeptCall,
        keep: list[KeptRow] | None,
    ) -> list[TurnOutput]:
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
        past = reused_cache(prompts, width, kept)
        self.prompt_tokens += sum(len(p) for p in prompts)
        with torch.no_grad():
            out = model.generate(
                input_ids=input_ids.to(device), attention_mask=attention.to(device), generation_config=config,
                **({"past_key_values": past.cache} if past else {}),
            )
        self.reused_tokens += past.tokens if past else 0
        if keep is not None and not keep_rows(out, prompts, width, self.reuse_cache_bytes, keep):
            keep.clear()  # a cache this call cannot keep: the next call prefills every row
        new_ids = out.sequences[:, width:].cpu()
        scale = 1.0 if greedy else sampling.temperature
        logits = torch.stack(out.logits, dim=1).float().cpu()  # (batch, steps, vocab), raw (unprocessed)
        token_lp = torch.log_softmax(logits / scale, dim=-1).gather(-1, new_ids[:, : logits.shape[1], None])[..., 0]
        results = []
        for i, limit in enumerate(max_tokens):
            results.append(finish_turn(new_ids[i].tolist(), token_lp[i].tolist(), limit, self.stop_token_ids))
        return results


def parameter_versions(model) -> object:
    """The sum of the parameters' in-place version counters: it grows whenever an optimizer step changes a weight.
    Inference tensors keep no counter: then a new object each call, equal to no other, so nothing is reused."""
    try:
        return sum(param._version for param in model.parameters())
    except RuntimeError:
        return object()


def reused_cache(prompts: list[list[int]], width: int, kept: KeptCall) -> ReusedPrefix | None:
    """The cache for a left-padded batch of ``prompts`` (padded to ``width``) from the rows the last call kept, or
    None where no row can start from a kept prefix.

    Row ``i``'s longest shared prefix with a kept row is ``m_i`` tokens (at most its length less one, so that at
    least one token is fed); it needs ``s_i = len_i - m_i`` tokens run. The batch's cache covers the first ``width -
    max(s_i)`` positions, the same for every row: row ``i``'s part of it is its padding (zeros, masked out) and then
    its first ``len_i - max(s_i)`` tokens' kept keys and values. Positions come from the attention mask, so a row's
    keys are reused at the positions they were computed at, however much padding the batch gives it."""
    if not kept.rows or not prompts:
        return None
    import torch
    from transformers import DynamicCache

    table = kept.table
    longest = table.shape[1]
    matches = []
    for ids in prompts:
        n = min(longest, len(ids) - 1)
        if n <= 0:
            return None
        same = (table[:, :n] == torch.tensor(ids[:n], dtype=torch.long)).long().cumprod(dim=1).sum(dim=1)
        best = int(same.argmax())
        matches.append((best, int(same[best])))
    run = max(len(ids) - shared for ids, (_, shared) in zip(prompts, matches))
    start = width - run
    if start <= 0:
        return None
    reused = 0
    layers = []
    first = kept.rows[0].layers
    for layer, (key0, value0) in enumerate(first):
        heads, dim = key0.shape[0], key0.shape[2]
        keys = key0.new_zeros((len(prompts), heads, start, dim))
        values = value0.new_zeros((len(prompts), value0.shape[0], start, value0.shape[2]))
        for i, (ids, (best, _)) in enumerate(zip(prompts, matches)):
            pad = width - len(ids)
            take = start - pad
            if take > 0:
                key, value = kept.rows[best].layers[layer]
                keys[i, :, pad:start] = key[:, :take]
                values[i, :, pad:start] = value[:, :take]
                reused += take if layer == 0 else 0
        layers.append((keys, values))
    return ReusedPrefix(DynamicCache(ddp_cache_data=layers), reused)


def keep_rows(out, prompts: list[list[int]], width: int, budget: int, keep: list[KeptRow]) -> bool:
    """Append each row of ``out`` (a ``generate`` output with its cache) to ``keep``: the tokens it holds keys and
    values for (its prompt, without padding, and the sampled tokens fed back: all but the last step's) and those keys
    and values. False where the cache is not plain full attention, or would pass ``budget`` bytes with what is kept."""
    import torch
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    cache = getattr(out, "past_key_values", None)
    if type(cache) is not DynamicCache or not cache.layers:
        return False
    if any(type(layer) is not DynamicLayer or layer.keys is None for layer in cache.layers):
        return False
    length = cache.layers[0].keys.shape[2]
    fed = length - width  # sampled tokens run through the model (the last one sampled never is)
    if fed < 0 or any(layer.keys.shape[2] != length or layer.values.shape[2] != length for layer in cache.layers):
        return False
    size = sum(layer.keys.numel() * layer.keys.element_size() * 2 for layer in cache.layers)
    size += sum(sum(k.numel() * k.element_size() * 2 for k, _ in row.layers) for row in keep)
    if size > budget:
        return False
    sampled = out.sequences[:, width : width + fed].cpu()
    for i, ids in enumerate(prompts):
        pad = width - len(ids)
        tokens = torch.cat([torch.tensor(ids, dtype=torch.long), sampled[i]])
        keep.append(KeptRow(tokens, [(layer.keys[i, :, pad:], layer.values[i, :, pad:]) for layer in cache.layers]))
    return True
