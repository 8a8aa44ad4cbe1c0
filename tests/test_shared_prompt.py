"""``shared_prompt_pass``: each distinct prompt of a GRPO batch runs once, its keys and values shared by its rows.

On tiny random models with plain full attention (Qwen3's, Llama's as in SmolLM2, and Qwen3.5's gated attention as in
the tiny model's attention preset) carrying TRL's fused LM head, a batch of three prompts with G rows each
(left-padded differently, completions of many lengths) gives the log-probs, entropies and parameter gradients TRL's
whole-row pass gives, up to float rounding, with 0 at padding; the model sees each prompt once. Models whose caches
are not plain full attention (Gemma 3's sliding windows, Qwen3.5's linear attention), and checkpointed ones, get None,
for the caller's whole-row pass.
"""

from __future__ import annotations

import contextlib
import types

import pytest
import torch

from t2s.training.shared_prompt import plain_attention, prompt_groups, shared_prompt_pass

PROMPT_WIDTH = 12
PROMPTS = [12, 9, 5]  # real tokens of each distinct prompt
COMPLETIONS = [[7, 30, 1, 18], [25, 4, 9, 12], [3, 40, 11, 6]]  # G = 4 rows of each prompt


def _model(family: str):
    import transformers
    from trl.trainer.utils import add_fused_lm_head

    torch.manual_seed(0)
    common = dict(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=256)
    if family == "qwen3":
        model = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(head_dim=16, **common))
    elif family == "qwen3_5_full_attention":  # the tiny model's attention preset: Qwen3.5's gated attention only
        config = transformers.Qwen3_5TextConfig(head_dim=16, layer_types=["full_attention"] * 2, **common)
        model = transformers.Qwen3_5ForCausalLM(config)
    else:
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**common))
    model.float().train()
    add_fused_lm_head(model, temperature=0.7, outputs=("log_probs", "entropy"))
    return model


def _batch(vocab: int, order: list[int]):
    """Left-padded prompts then right-padded completions, TRL's layout; rows of one prompt are interleaved."""
    generator = torch.Generator().manual_seed(1)
    prompts = [torch.randint(3, vocab, (n,), generator=generator) for n in PROMPTS]
    width = max(max(c) for c in COMPLETIONS) + 2  # a micro-batch padded to the generation batch's longest
    rows = [(p, COMPLETIONS[p][g]) for g in range(4) for p in range(len(PROMPTS))]
    rows = [rows[i] for i in order]
    ids = torch.zeros(len(rows), PROMPT_WIDTH + width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, (p, length) in enumerate(rows):
        ids[row, PROMPT_WIDTH - PROMPTS[p]:PROMPT_WIDTH] = prompts[p]
        ids[row, PROMPT_WIDTH:PROMPT_WIDTH + length] = torch.randint(3, vocab, (length,), generator=generator)
        mask[row, PROMPT_WIDTH - PROMPTS[p]:PROMPT_WIDTH + length] = 1
    return ids, mask, width


def _trl_pass(model, ids, mask, width, batch_size=None, compute_entropy=True):
    from trl import GRPOTrainer

    accelerator = types.SimpleNamespace(autocast=contextlib.nullcontext, is_main_process=True)
    host = types.SimpleNamespace(accelerator=accelerator)
    return GRPOTrainer._get_per_token_logps_and_entropies(host, model, ids, mask, width, batch_size=batch_size,
                                                          compute_entropy=compute_entropy)[:2]


def _with_gradients(run, model, mask, width):
    model.zero_grad(set_to_none=True)
    logps, entropies = run()
    weights = torch.linspace(-1.0, 1.0, width)
    loss = ((logps * weights + 0.3 * logps.exp() + 0.1 * entropies) * mask[:, -width:].float()).sum()
    loss.backward()
    return logps.detach(), entropies.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("family", ["qwen3", "llama", "qwen3_5_full_attention"])
@pytest.mark.parametrize("batch_size", [None, 3])
def test_each_prompt_runs_once_and_the_pass_equals_the_whole_row_pass(family, batch_size):
    model = _model(family)
    ids, mask, width = _batch(model.config.vocab_size, order=list(range(12))[::-1])
    whole = _with_gradients(lambda: _trl_pass(model, ids, mask, width, batch_size), model, mask, width)
    calls = []
    forward = model.forward

    def spy(*args, **kwargs):
        calls.append(kwargs)
        return forward(*args, **kwargs)

    model.forward = spy
    shared = _with_gradients(lambda: shared_prompt_pass(model, ids, mask, width, batch_size, contextlib.nullcontext,
                                                        compute_entropy=True), model, mask, width)
    prefixes = [c for c in calls if not c.get("fused_lm_head")]
    assert sorted(c["input_ids"].size(1) for c in prefixes) == sorted(n - 1 for n in PROMPTS)  # each prompt once
    scored = [c for c in calls if c.get("fused_lm_head")]
    assert sum(c["input_ids"].size(0) for c in scored) == ids.size(0)
    assert all(c["input_ids"].size(1) <= 1 + max(max(c) for c in COMPLETIONS) for c in scored)
    if batch_size:
        assert all(c["input_ids"].size(0) <= batch_size for c in scored)
    padding = mask[:, -width:] == 0
    for got, expected in zip(shared[:2], whole[:2]):
        assert torch.count_nonzero(got[padding]) == 0
        torch.testing.assert_close(got, expected, rtol=0, atol=2e-5)
    for name, grad in whole[2].items():
        assert grad.abs().max() > 0, name
        assert (shared[2][name] - grad).abs().max() <= 1e-4 * grad.abs().max(), name


def test_rows_are_grouped_by_their_prompts_real_tokens_whatever_the_padding():
    ids = torch.tensor([[0, 5, 6, 1], [5, 6, 0, 2], [0, 5, 6, 3], [0, 0, 6, 4]])
    mask = torch.tensor([[0, 1, 1, 1], [1, 1, 0, 1], [0, 1, 1, 1], [0, 0, 1, 1]])
    assert prompt_groups(ids, mask, 3) == [[0, 1, 2], [3]]


def test_models_without_plain_full_attention_get_none():
    import transformers

    def cache(config):
        return transformers.DynamicCache(config=config)

    assert plain_attention(cache(transformers.LlamaConfig(num_hidden_layers=2)))
    assert plain_attention(cache(transformers.Qwen3Config(num_hidden_layers=2)))
    gemma = transformers.Gemma3TextConfig(num_hidden_layers=6, sliding_window=16)
    assert not plain_attention(cache(gemma))
    qwen35 = transformers.Qwen3_5TextConfig(num_hidden_layers=4)
    assert not plain_attention(cache(qwen35))
    model = transformers.Gemma3ForCausalLM(transformers.Gemma3TextConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, head_dim=16, sliding_window=4, layer_types=["sliding_attention", "full_attention"]))
    ids = torch.randint(3, 64, (2, 10))
    assert shared_prompt_pass(model, ids, torch.ones_like(ids), 4, None, contextlib.nullcontext) is None
    plain = _model("llama")  # checkpointed layers rerun in the backward pass, the cache's update with them
    assert shared_prompt_pass(plain, ids, torch.ones_like(ids), 4, None, contextlib.nullcontext) is not None
    plain.gradient_checkpointing_enable()
    assert shared_prompt_pass(plain, ids, torch.ones_like(ids), 4, None, contextlib.nullcontext) is None


@pytest.fixture(scope="module")
def trainer(tiny_model_dir, tmp_path_factory):
    from _train_script import build_trainer

    trainer, _ = build_trainer(tiny_model_dir, tmp_path_factory.mktemp("shared"))
    trainer.model.train()
    return trainer


@pytest.mark.slow
def test_the_trainer_takes_the_shared_pass_when_the_recipe_asks_and_the_model_allows(trainer, monkeypatch):
    """The tiny Qwen3.5 has linear-attention layers: with ``shared_prompt_pass`` on, its passes stay the length-grouped
    ones, value for value; a model the shared pass accepts gets the shared pass's values."""
    import t2s.training.trainer as trainer_module

    ids, mask, width = _batch(trainer.model.config.vocab_size, order=list(range(12)))
    with torch.no_grad():
        grouped = trainer._get_per_token_logps_and_entropies(trainer.model, ids, mask, width, compute_entropy=True)
        monkeypatch.setattr(trainer.args, "shared_prompt_pass", True)
        asked = []
        real = trainer_module.shared_prompt_pass

        def spy(*args, **kwargs):
            asked.append(real(*args, **kwargs))
            return asked[-1]

        monkeypatch.setattr(trainer_module, "shared_prompt_pass", spy)
        fallback = trainer._get_per_token_logps_and_entropies(trainer.model, ids, mask, width, compute_entropy=True)
        assert asked == [None]
        assert torch.equal(fallback[0], grouped[0]) and torch.equal(fallback[1], grouped[1])
        shared = (torch.full_like(grouped[0], -1.0), torch.full_like(grouped[1], 2.0))
        monkeypatch.setattr(trainer_module, "shared_prompt_pass", lambda *a, **k: shared)
        taken = trainer._get_per_token_logps_and_entropies(trainer.model, ids, mask, width, compute_entropy=True)
        assert taken[0] is shared[0] and taken[1] is shared[1] and taken[2] is None
        monkeypatch.setattr(trainer.args, "shared_prompt_pass", False)
        off = trainer._get_per_token_logps_and_entropies(trainer.model, ids, mask, width, compute_entropy=True)
        assert torch.equal(off[0], grouped[0])
