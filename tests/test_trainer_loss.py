"""The published loss (DESIGN §8) on real TRL training steps with the tiny Qwen3.5 and a scripted rollout.

- env tokens get exactly zero gradient, model tokens non-zero;
- the loss equals the hand-computed value on a constructed batch (sequence-level ratio against the sampler's
  logprobs, clip 0.2/0.28, k3 × β, sum over model tokens / 1024, mean over sequences);
- one optimiser step's update is the same whether the step is 1 micro-batch of 8 or 4 micro-batches of 2;
- ``sampler`` runs no old-logprob forward pass, ``recompute`` runs one;
- against stock TRL (``dr_grpo``, ``max_completion_length`` 1024, plain k3, the sampler's logprobs as its old
  logprobs): equal loss and bit-identical gradients for token and sequence ratios, β 0 and > 0, gradient
  accumulation 1 and 2, and recompute mode, on ragged completions with environment tokens (a few tokens apart, so
  each batch is one length group and runs TRL's own log-prob pass; how length groups compare with one pass over the
  padded batch is tests/test_trainer_length_groups.py's);
- d loss / d logits is exactly zero at environment tokens and padding.
"""

from __future__ import annotations

import pytest
import torch

from _train_script import build_trainer, make_rows

pytestmark = pytest.mark.slow


def _generation_batch(trainer, n_questions: int = 2) -> dict:
    """One real generation batch through the trainer's stash, rollout, rewards and advantages."""
    rows = [dict(row) for row in make_rows(n_questions) for _ in range(trainer.num_generations)]
    trainer.model.train()
    batch = trainer._generate_and_score_completions(rows)
    trainer.current_gradient_accumulation_steps = 1
    return batch


def _completion_logps(logits, input_ids, width: int, temperature: float) -> torch.Tensor:
    """log π of the last ``width`` tokens of ``input_ids`` (padding included) from the model's full logits."""
    scaled = logits[:, -width - 1 : -1].float() / temperature
    return torch.log_softmax(scaled, dim=-1).gather(-1, input_ids[:, -width:, None])[..., 0]


def _policy_logps(model, batch, temperature: float) -> torch.Tensor:
    """log π_θ of each completion position, computed independently of TRL, from the full logits."""
    ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
    attention = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
    logits = model(input_ids=ids, attention_mask=attention).logits
    return _completion_logps(logits, ids, batch["completion_ids"].size(1), temperature)


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


# ---------------------------------------------------------------------------------------------------- stock TRL oracle
# The published loss is TRL's dr_grpo with max_completion_length 1024 and plain k3, except that the ratio is taken
# against the sampler's logprobs: given those as its old logprobs, stock GRPOTrainer must agree in loss and gradient.

SAMPLER_NOISE = 0.8  # sampler logprobs off the policy by up to ±0.8 nats: ratios cross both clip edges
REF_SHIFT = 0.3  # the reference off the policy, so k3 and its gradient are not zero


def _stock_trainer(model_dir, output_dir, **overrides):
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from _train_script import scripted_reward

    values = dict(output_dir=str(output_dir), loss_type="dr_grpo", max_completion_length=1024, beta=0.05,
                  use_bias_correction_kl=False, epsilon=0.2, epsilon_high=0.28, scale_rewards="none",
                  temperature=1.0, per_device_train_batch_size=8, num_generations=4, max_steps=1, use_cpu=True,
                  bf16=False, gradient_checkpointing=False, report_to="none", save_strategy="no", seed=0,
                  disable_tqdm=True)
    values.update(overrides)
    return GRPOTrainer(model=str(model_dir), reward_funcs=[scripted_reward], args=GRPOConfig(**values),
                       train_dataset=Dataset.from_list(make_rows(4)),
                       processing_class=AutoTokenizer.from_pretrained(model_dir, padding_side="left"))


@pytest.fixture(scope="module")
def oracle_cases(tiny_model_dir, tmp_path_factory):
    """Built once per module: our trainer and its generation batch per (old_logprobs, level), stock TRL per
    (level, β)."""
    from transformers import AutoTokenizer

    from _train_script import ScriptedEpisodes, sampler_noise

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    ours, stock = {}, {}

    def ours_for(mode: str, level: str):
        if (mode, level) not in ours:
            runner = ScriptedEpisodes(tokenizer, ragged=True, logprob_noise=SAMPLER_NOISE)
            trainer, _ = build_trainer(tiny_model_dir, tmp_path_factory.mktemp("ours"), runner=runner, beta=0.05,
                                       beta_max=1.0, importance_sampling_level=level, old_logprobs=mode)
            batch = _generation_batch(trainer)
            mask = (batch["completion_mask"] * batch["tool_mask"]).float()
            assert (batch["completion_mask"] == 0).any(), "completions of unequal length: TRL pads them"
            positions = torch.arange(batch["completion_ids"].size(1))
            batch["ref_per_token_logps"] = batch["ref_per_token_logps"] + REF_SHIFT * (positions % 3 - 0.5) * mask
            if mode == "recompute":  # as if the policy had moved since the old logprobs were taken
                moved = torch.tensor([[sampler_noise(i, t) for t in positions.tolist()] for i in range(mask.size(0))])
                batch["old_per_token_logps"] = batch["old_per_token_logps"] + SAMPLER_NOISE * moved * mask
            ours[(mode, level)] = trainer, batch
        return ours[(mode, level)]

    def stock_for(level: str, beta: float, recompute: bool = False):
        if (level, beta, recompute) not in stock:
            trainer = _stock_trainer(tiny_model_dir, tmp_path_factory.mktemp("stock"), beta=beta,
                                     importance_sampling_level=level)
            if recompute:  # TRL applies its IS correction only with vLLM; the batch brings the ratio
                trainer.use_vllm, trainer.vllm_importance_sampling_correction = True, True
            stock[(level, beta, recompute)] = trainer
        return stock[(level, beta, recompute)]

    return ours_for, stock_for


def _micro_batches(batch: dict, n: int) -> list[dict]:
    size = batch["completion_ids"].size(0)
    parts = []
    for i in range(n):
        part = {}
        for key, value in batch.items():
            if isinstance(value, torch.Tensor) and value.dim() > 0 and value.size(0) == size:
                value = value.chunk(n)[i]
            part[key] = value
        parts.append(part)
    return parts


def _step_loss_and_grads(trainer, batch: dict, ga: int) -> tuple[float, dict[str, torch.Tensor]]:
    """One optimiser step's summed micro-batch losses and accumulated gradients (no update)."""
    trainer.model.train()
    trainer.model.zero_grad(set_to_none=True)
    trainer.current_gradient_accumulation_steps = ga
    total = 0.0
    for part in _micro_batches(batch, ga):
        loss = trainer._compute_loss(trainer.model, part)
        loss.backward()
        total += loss.item()
    return total, {name: p.grad.detach().clone() for name, p in trainer.model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("ga", [1, 2])
@pytest.mark.parametrize("beta", [0.0, 0.05])
@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("mode", ["sampler", "recompute"])
def test_loss_and_gradients_match_stock_trl_dr_grpo(oracle_cases, mode, level, beta, ga):
    ours_for, stock_for = oracle_cases
    ours, batch = ours_for(mode, level)
    stock = stock_for(level, beta, recompute=mode == "recompute")
    mask = (batch["completion_mask"] * batch["tool_mask"]).float()
    assert ((batch["tool_mask"] == 0) & (batch["completion_mask"] == 1)).any(), "env tokens inside completions"
    if mode == "sampler":
        stock_batch = dict(batch, old_per_token_logps=batch["sampling_per_token_logps"])
        with torch.no_grad():  # the case is only worth checking when the clip is active on both sides
            log_ratio = (_policy_logps(ours.model, batch, ours.temperature) - batch["sampling_per_token_logps"]) * mask
            ratio = log_ratio.exp() if level == "token" else (log_ratio.sum(-1) / mask.sum(-1)).exp().unsqueeze(1)
        adv = batch["advantages"].unsqueeze(1)
        assert (((ratio < 0.8) & (adv < 0)) * mask).any() and (((ratio > 1.28) & (adv > 0)) * mask).any()
    else:
        stock_batch = dict(batch)
        assert "importance_sampling_ratio" in batch and not torch.all(batch["importance_sampling_ratio"][mask > 0] == 1)
    ours.beta = beta  # the controller's β at this step (start-up refuses 0, the loss must still agree)
    ours_loss, ours_grads = _step_loss_and_grads(ours, batch, ga)
    stock_loss, stock_grads = _step_loss_and_grads(stock, stock_batch, ga)
    assert abs(ours_loss) > 1e-4
    assert ours_loss == pytest.approx(stock_loss, abs=1e-8, rel=0)  # they differ in float summation order only
    assert ours_grads.keys() == stock_grads.keys() and ours_grads
    for name, grad in ours_grads.items():  # the same operations on the same tensors: bit for bit
        torch.testing.assert_close(grad, stock_grads[name], rtol=0, atol=0, msg=name)


@pytest.mark.parametrize("level", ["token", "sequence"])
def test_logit_gradient_is_exactly_zero_at_env_tokens_and_padding(oracle_cases, level):
    """d loss / d logits from a forward that materialises the logits (TRL's fused head never does)."""
    ours_for, _ = oracle_cases
    trainer, batch = ours_for("sampler", level)
    trainer.beta = 0.05
    trainer.model.train()
    trainer.model.zero_grad(set_to_none=True)
    trainer.current_gradient_accumulation_steps = 1
    with torch.no_grad():
        fused = trainer._compute_loss(trainer.model, batch).item()
    captured = []

    def full_logits(model, input_ids, attention_mask, logits_to_keep, batch_size=None, compute_entropy=False, **_):
        logits = model(input_ids=input_ids, attention_mask=attention_mask).logits
        logits.retain_grad()
        captured.append(logits)
        logps = _completion_logps(logits, input_ids, logits_to_keep, trainer.temperature)
        return logps, torch.zeros_like(logps) if compute_entropy else None, None  # entropy: a metric only

    trainer._get_per_token_logps_and_entropies = full_logits
    try:
        loss = trainer._compute_loss(trainer.model, batch)
        loss.backward()
    finally:
        del trainer._get_per_token_logps_and_entropies
    assert loss.item() == pytest.approx(fused, abs=1e-8)  # the same loss as through the fused head
    per_row = captured[0].grad.abs().amax(-1)  # (B, prompt + completion): the largest |d loss / d logit| per row
    width = batch["completion_ids"].size(1)
    scoring = per_row[:, -width - 1 : -1]  # row t predicts completion token t
    model_tokens = (batch["completion_mask"] * batch["tool_mask"]).bool()
    env = (batch["tool_mask"] == 0) & (batch["completion_mask"] == 1)
    padding = batch["completion_mask"] == 0
    assert env.any() and padding.any()
    assert torch.count_nonzero(scoring[env]) == 0, "environment tokens must get exactly zero logit gradient"
    assert torch.count_nonzero(scoring[padding]) == 0, "padding must get exactly zero logit gradient"
    assert torch.all(scoring[model_tokens] > 0), "every model token's logits must get a gradient"
    assert torch.count_nonzero(per_row[:, : -width - 1]) == 0 and torch.count_nonzero(per_row[:, -1]) == 0



def test_on_a_cpu_the_lm_head_projects_only_the_labelled_positions(tiny_model_dir, lm_head_rows):
    """``score_labelled_positions_only``: TRL's fused LM head, which on a CPU projects every position (prompt included)
    through the vocabulary, projects only the labelled ones there, with the same log-probabilities, entropies and
    gradients."""
    import trl.trainer.utils as trl_utils
    from transformers import AutoModelForCausalLM

    from t2s.training.cpu_threads import score_labelled_positions_only

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    trl_utils.add_fused_lm_head(model, outputs=("log_probs", "entropy"))
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(10, model.config.vocab_size - 1, (3, 40), generator=generator)
    labels = ids.clone()
    labels[:, :30] = -100  # a 30-token prompt, a 10-token completion
    labels[2, 35:] = -100  # one completion shorter

    def run():
        model.zero_grad()
        out = model(input_ids=ids, labels=labels, fused_lm_head=True)
        out.log_probs.sum().backward()
        grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
        return out.log_probs.detach(), out.entropy.detach(), grads

    full = run()
    score_labelled_positions_only()
    score_labelled_positions_only()  # idempotent
    compact = run()
    assert lm_head_rows == [3 * 39, 10 + 10 + 5]  # every shifted position, then only the labelled ones
    torch.testing.assert_close(compact[0], full[0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(compact[1], full[1], rtol=1e-5, atol=1e-6)
    assert len(compact[2]) == len(full[2])
    for got, want in zip(compact[2], full[2]):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)
    assert trl_utils._use_triton(torch.device("cpu")) and not trl_utils._use_triton(torch.device("meta"))
