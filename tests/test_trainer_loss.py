"""The published loss (DESIGN §8) on real TRL training steps with the tiny Qwen3.5 and a scripted rollout.

- env tokens get exactly zero gradient, model tokens non-zero;
- the loss equals the hand-computed value on a constructed batch (sequence-level ratio against the sampler's
  logprobs, clip 0.2/0.28, k3 × β, sum over model tokens / 1024, mean over sequences);
- one optimiser step's update is the same whether the step is 1 micro-batch of 8 or 4 micro-batches of 2;
- ``sampler`` runs no old-logprob forward pass, ``recompute`` runs one.
"""

from __future__ import annotations

import pytest
import torch

from _train_script import PROMPT_TOKENS, build_trainer, make_rows

pytestmark = pytest.mark.slow


def _generation_batch(trainer, n_questions: int = 2) -> dict:
    """One real generation batch through the trainer's stash, rollout, rewards and advantages."""
    rows = [dict(row) for row in make_rows(n_questions) for _ in range(trainer.num_generations)]
    trainer.model.train()
    batch = trainer._generate_and_score_completions(rows)
    trainer.current_gradient_accumulation_steps = 1
    return batch


def _policy_logps(model, batch, temperature: float) -> torch.Tensor:
    """log π_θ of each completion token, computed independently of TRL (no padding: equal lengths by construction)."""
    ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
    logits = model(input_ids=ids).logits.float() / temperature
    logps = torch.log_softmax(logits[:, PROMPT_TOKENS - 1 : -1], dim=-1)
    return logps.gather(-1, ids[:, PROMPT_TOKENS:].unsqueeze(-1)).squeeze(-1)


def test_env_tokens_get_zero_gradient_model_tokens_do_not(tiny_model_dir, tmp_path):
    trainer, _ = build_trainer(tiny_model_dir, tmp_path)
    batch = _generation_batch(trainer)
    captured = {}
    original = trainer._get_per_token_logps_and_entropies

    def capture(*args, **kwargs):
        logps, entropies, aux = original(*args, **kwargs)
        logps.retain_grad()
        captured["logps"] = logps
        return logps, entropies, aux

    trainer._get_per_token_logps_and_entropies = capture
    loss = trainer._compute_loss(trainer.model, batch)
    loss.backward()
    grad = captured["logps"].grad
    env = (batch["tool_mask"] == 0) & (batch["completion_mask"] == 1)
    model_tokens = (batch["tool_mask"] == 1) & (batch["completion_mask"] == 1)
    assert env.any() and model_tokens.any()
    assert torch.count_nonzero(grad[env]) == 0, "environment tokens must get exactly zero gradient"
    assert torch.all(grad[model_tokens] != 0), "every model token must get a gradient"


def test_loss_equals_hand_computed_value(tiny_model_dir, tmp_path):
    trainer, _ = build_trainer(tiny_model_dir, tmp_path, loss_norm_constant=1024.0, beta=0.05, beta_max=1.0)
    batch = _generation_batch(trainer)
    mask = (batch["completion_mask"] * batch["tool_mask"]).float()
    n = batch["completion_ids"].size(0)
    # Move the sampler's logprobs so the ratios spread over both clip edges, and the reference so k3 > 0.
    shifts = torch.linspace(-0.6, 0.6, n).unsqueeze(1)
    batch["sampling_per_token_logps"] = batch["sampling_per_token_logps"] + shifts * mask
    ref_shift = torch.linspace(0.0, 0.4, batch["completion_ids"].size(1)).unsqueeze(0)
    batch["ref_per_token_logps"] = batch["ref_per_token_logps"] + ref_shift

    with torch.no_grad():
        got = trainer._compute_loss(trainer.model, batch).item()
        logp = _policy_logps(trainer.model, batch, trainer.temperature)
    sampler, ref, adv = batch["sampling_per_token_logps"], batch["ref_per_token_logps"], batch["advantages"]
    expected = []
    for i in range(n):
        m = mask[i].bool()
        rho = torch.exp((logp[i][m] - sampler[i][m]).mean())
        surrogate = -torch.min(rho * adv[i], torch.clamp(rho, 0.8, 1.28) * adv[i])
        d = ref[i][m] - logp[i][m]
        k3 = torch.exp(d) - d - 1
        expected.append((surrogate * m.sum() + 0.05 * k3.sum()) / 1024.0)
    expected = torch.stack(expected).mean().item()
    ratios = torch.exp(((logp - sampler) * mask).sum(-1) / mask.sum(-1))
    assert (ratios < 0.8).any() and (ratios > 1.28).any(), "the constructed batch must exercise both clip edges"
    assert got == pytest.approx(expected, rel=1e-5, abs=1e-9)
    assert abs(expected) > 1e-6


def _one_step_update(model_dir, output_dir, **overrides) -> dict[str, torch.Tensor]:
    trainer, runner = build_trainer(model_dir, output_dir, n_rows=2, max_steps=1, optim="sgd", learning_rate=0.5,
                                    max_grad_norm=0.0, weight_decay=0.0, lr_scheduler_type="constant",
                                    **overrides)
    before = {k: v.detach().clone() for k, v in trainer.model.named_parameters()}
    trainer.train()
    assert len(runner.seen) == 1 and sorted(runner.seen[0]) == sorted(["scripted:0"] * 4 + ["scripted:1"] * 4)
    return {k: v.detach() - before[k] for k, v in trainer.model.named_parameters()}


def test_step_update_is_independent_of_micro_batch_split(tiny_model_dir, tmp_path):
    one = _one_step_update(tiny_model_dir, tmp_path / "one", per_device_train_batch_size=8,
                           gradient_accumulation_steps=1)
    four = _one_step_update(tiny_model_dir, tmp_path / "four", per_device_train_batch_size=2,
                            gradient_accumulation_steps=4, steps_per_generation=4)
    total = sum(float(d.abs().sum()) for d in one.values())
    assert total > 1e-6, "the step must move the weights"
    for name in one:
        torch.testing.assert_close(four[name], one[name], rtol=1e-4, atol=1e-8, msg=name)


def _count_old_logprob_passes(trainer) -> list[int]:
    """Counts forward passes of the policy (not the reference) made without gradients, i.e. outside the loss."""
    calls = [0]
    original = trainer._get_per_token_logps_and_entropies

    def counting(model, *args, **kwargs):
        if not torch.is_grad_enabled() and model is not trainer.ref_model:
            calls[0] += 1
        return original(model, *args, **kwargs)

    trainer._get_per_token_logps_and_entropies = counting
    return calls


def test_sampler_mode_runs_no_old_logprob_pass(tiny_model_dir, tmp_path):
    trainer, _ = build_trainer(tiny_model_dir, tmp_path, old_logprobs="sampler", max_steps=2)
    calls = _count_old_logprob_passes(trainer)
    trainer.train()
    assert trainer.state.global_step == 2
    assert calls[0] == 0
    assert not trainer.vllm_importance_sampling_correction


def test_recompute_mode_runs_one_old_logprob_pass_per_generation(tiny_model_dir, tmp_path):
    trainer, runner = build_trainer(tiny_model_dir, tmp_path, old_logprobs="recompute", max_steps=2)
    calls = _count_old_logprob_passes(trainer)
    trainer.train()
    assert trainer.state.global_step == 2
    assert calls[0] == len(runner.seen) == 2
    assert trainer.args.vllm_importance_sampling_mode == "token_truncate"
