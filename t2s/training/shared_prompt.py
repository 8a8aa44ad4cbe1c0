"""The log-prob passes with each prompt run once: a GRPO batch holds G episodes of each question, and their prompts are
the same tokens (in full mode, the whole schema), so the passes spend most of their time on G copies of one prompt.

:func:`shared_prompt_pass` groups a batch's rows by their prompt's tokens. For each group it runs the prompt, less its
last token, once, keeping its keys and values, then the rows' completions (each led by the prompt's last token) in
chunks that attend to those keys and values (``length_groups`` over the completions, each chunk cut after its last
real token). Gradients reach the shared prompt's activations from every row, as they do when each row holds its own
copy. A real token sees the same tokens at the same distances as in the whole-row pass, so the values agree up to
float rounding; positions start at 0 at the first real prompt token, as the sampler's do, instead of after the left
padding (rotary positions depend only on those distances).

It needs a model whose cache layers are all plain full-attention ``DynamicLayer``s (Llama, Qwen2/3, SmolLM2) and no
gradient checkpointing: sliding windows (Gemma 3), linear-attention states (Qwen3.5) and checkpointed layers get
``None``, and the caller runs the whole-row pass. The trainer takes this path when the recipe sets
``shared_prompt_pass: true``.
"""

from __future__ import annotations

from typing import Callable

import torch

from t2s.training.loss_math import length_groups, original_order


def prompt_groups(input_ids: torch.Tensor, attention_mask: torch.Tensor, prompt_width: int) -> list[list[int]]:
    """The batch's rows grouped by their prompt's real tokens (left padding aside), in order of first appearance."""
    groups: dict[bytes, list[int]] = {}
    for row in range(input_ids.size(0)):
        tokens = input_ids[row, :prompt_width][attention_mask[row, :prompt_width].bool()]
        groups.setdefault(tokens.cpu().numpy().tobytes(), []).append(row)
    return list(groups.values())


def plain_attention(cache) -> bool:
    """Whether every layer of ``cache`` (a ``DynamicCache``) is plain full attention."""
    from transformers.cache_utils import DynamicLayer

    return all(type(layer) is DynamicLayer for layer in cache.layers)


def shared_prompt_pass(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, logits_to_keep: int,
                       batch_size: int | None, autocast: Callable, compute_entropy: bool = False):
    """``(logps, entropies or None)`` of the last ``logits_to_keep`` columns, as TRL's pass gives them (0 at padding),
    with each distinct prompt run once; None when the model's cache is not plain full attention.

    ``input_ids``/``attention_mask`` are TRL's: left-padded prompts, then right-padded completions; ``model`` carries
    TRL's fused LM head (``fused_lm_head=True`` returns per-token log-probs); ``autocast`` is the accelerator's."""
    from transformers import DynamicCache

    core = getattr(model, "module", model)  # under DDP, the wrapped model
    if not plain_attention(DynamicCache(config=core.config)) or getattr(core, "is_gradient_checkpointing", False):
        return None  # checkpointing reruns each layer in the backward pass, and with it the cache's update

    width = input_ids.size(1)
    prompt_width = width - logits_to_keep
    columns = torch.arange(1, logits_to_keep + 1, device=attention_mask.device)
    # a completion's length: up to its last real token, at least one column
    ends = (attention_mask[:, prompt_width:].bool() * columns).amax(dim=1).clamp(min=1).tolist()
    logps, entropies, order = [], [], []
    for group in prompt_groups(input_ids, attention_mask, prompt_width):
        prompt = input_ids[group[0], :prompt_width][attention_mask[group[0], :prompt_width].bool()]
        if prompt.numel() == 0:
            raise ValueError("a row has no prompt token: the log-prob pass needs one before its completion")
        kept = []
        if prompt.numel() > 1:
            cache = DynamicCache(config=core.config)
            with autocast():
                model(input_ids=prompt[None, :-1], attention_mask=torch.ones_like(prompt[None, :-1]),
                      past_key_values=cache, use_cache=True, logits_to_keep=1)
            if not plain_attention(cache) or cache.get_seq_length() != prompt.numel() - 1:
                return None  # layers the config did not name, made as the model ran; or a cache it did not fill
            kept = [(layer.keys, layer.values) for layer in cache.layers]
        for chunk in length_groups([ends[row] for row in group], batch_size):
            chunk_rows = [group[i] for i in chunk]
            end = max(ends[row] for row in chunk_rows)
            index = torch.tensor(chunk_rows, device=input_ids.device)
            completion = input_ids[index, prompt_width:prompt_width + end]
            completion_mask = attention_mask[index, prompt_width:prompt_width + end]
            lead = prompt[-1:].expand(len(chunk_rows), 1)
            ids = torch.cat([lead, completion], dim=1)
            mask = torch.cat([torch.ones(len(chunk_rows), prompt.numel(), dtype=completion_mask.dtype,
                                         device=completion_mask.device), completion_mask], dim=1)
            labels = ids.masked_fill(mask[:, -ids.size(1):] == 0, -100)
            past = DynamicCache(ddp_cache_data=[(keys.expand(len(chunk_rows), -1, -1, -1),
                                                 values.expand(len(chunk_rows), -1, -1, -1))
                                                for keys, values in kept]) if kept else None
            with autocast():
                outputs = model(input_ids=ids, attention_mask=mask, past_key_values=past, labels=labels,
                                fused_lm_head=True)
            logps.append(torch.nn.functional.pad(outputs.log_probs, (0, logits_to_keep - end)))
            if compute_entropy:
                entropies.append(torch.nn.functional.pad(outputs.entropy, (0, logits_to_keep - end)))
            order.extend(chunk_rows)
    back = original_order(order, input_ids.device)
    return torch.cat(logps)[back], (torch.cat(entropies)[back] if compute_entropy else None)
