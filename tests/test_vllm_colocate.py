"""Colocated training on the real vLLM engine (vLLM's CPU build here): TRL builds its ``vllm.LLM`` in the trainer, the
rollout generates through it, and the trainer's weights reach it after every step through vLLM's layerwise reload.

The proof is logprobs, not greedy tokens: after updates large enough to move them, the engine's logprobs for a fixed
sequence equal transformers' on the trainer's current weights (tied head included), and the sampler-policy gap that
the trainer logs stays small on every step (read back from ``metrics.jsonl``).
"""

from __future__ import annotations

import json

import pytest

from t2s.settings import RECIPES_DIR

vllm = pytest.importorskip("vllm", reason="vLLM is not installed (make install-vllm)")

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

LOGP_GAP_BOUND = 0.01  # float32 engine and trainer on one CPU: measured ~1e-6


@pytest.fixture(scope="module")
def attention_model_dir(tmp_path_factory):
    """The tiny Qwen3.5 with four full-attention layers (head_dim 32): the shape vLLM's CPU kernels run."""
    from t2s.training.tiny_model import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny-attention"), preset="attention")


def _engine_logprobs(llm, ids: list[int]) -> list[float]:
    from vllm import SamplingParams, TokensPrompt

    params = SamplingParams(max_tokens=1, temperature=1.0, prompt_logprobs=0)
    out = llm.generate([TokensPrompt(prompt_token_ids=ids)], params, use_tqdm=False)[0]
    return [next(iter(entry.values())).logprob for entry in out.prompt_logprobs[1:]]


def _model_logprobs(model, ids: list[int]) -> list[float]:
    import torch

    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0, :-1].float()
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(ids[1:])[:, None])[:, 0].tolist()


def _perturb_callback():
    import torch
    from transformers import TrainerCallback

    class Perturb(TrainerCallback):
        """After each optimiser step, move every weight by noise: a tiny random policy's rewards are often all equal
        (no gradient), and the sync must be seen to carry an update that moves the logprobs."""

        def on_step_end(self, args, state, control, model=None, **kwargs):
            generator = torch.Generator().manual_seed(state.global_step)
            with torch.no_grad():
                for param in model.parameters():
                    param.add_(torch.randn(param.shape, generator=generator) * 0.3 * float(param.std() or 0.02))

    return Perturb()


def test_colocated_engine_trains_and_follows_the_trainer_weights(attention_model_dir, tmp_path):
    from t2s.training.configs import parse_recipe
    from t2s.training.pipeline import build_trainer, fit

    output = tmp_path / "run"
    script_args, training_args, model_args = parse_recipe([
        "--config", str(RECIPES_DIR / "smoke.yaml"), "--model_name_or_path", str(attention_model_dir),
        "--output_dir", str(output), "--rollout_backend", "vllm_colocate", "--max_steps", "2",
        "--vllm_max_model_length", "4096",
    ])
    trainer, counts = build_trainer(script_args, training_args, model_args, callbacks=[_perturb_callback()])
    llm = trainer.vllm_generation.llm
    assert llm.llm_engine.model_config.dtype.__str__() == "torch.float32"  # the checkpoint's, not vLLM's CPU bf16
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    fit(trainer, counts)

    steps = [json.loads(line) for line in (output / "metrics.jsonl").read_text().splitlines()]
    gaps = [s["sampling/logp_gap/mean"] for s in steps if "sampling/logp_gap/mean" in s]
    assert len(gaps) == 2 and max(gaps) < LOGP_GAP_BOUND, gaps  # every step sampled with the weights it trained
    moved = max((p.detach() - before[n]).abs().max().item() for n, p in trainer.model.named_parameters())
    assert moved > 1e-3

    ids = trainer.processing_class("SELECT name FROM singer WHERE age > 30 ORDER BY name")["input_ids"]
    trainer.vllm_generation.sync_weights()  # the weights of the last step (TRL pushes before each generation)
    engine, model = _engine_logprobs(llm, ids), _model_logprobs(trainer.model, ids)
    assert max(abs(a - b) for a, b in zip(engine, model)) < 1e-3
    stale = _model_logprobs(trainer.model.__class__.from_pretrained(attention_model_dir), ids)
    assert max(abs(a - b) for a, b in zip(engine, stale)) > 1e-2  # the update moved them: the check can fail
