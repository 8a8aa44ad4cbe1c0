"""``Text2SQLGRPOTrainer``: TRL 1.16's GRPOTrainer driving multi-turn SQL episodes, with the published loss (DESIGN §8).

What the subclass changes, and where:

- **Rows reach the rollout** through a stash: ``_generate_and_score_completions`` keeps its ``inputs`` (the batch's
  rows, already repeated G times) for the duration of the call; the rollout function asserts the counts match and
  plays one episode per row. Rows are never looked up by prompt text.
- **The rollout** (``t2s.rollout.driver``) returns flat ``prompt_ids``/``completion_ids``/``logprobs``/``env_mask`` plus
  per-episode extras for the reward functions; shapes are asserted here.
- **The loss** (``_compute_loss``): per sequence ``L_i = Σ_t m_t ℓ_t / loss_norm_constant`` with ``m`` = env_mask ×
  padding, and the returned micro-batch loss is ``Σ_i L_i / (B_micro × GA)``. TRL's Trainer does not rescale it for
  gradient accumulation (``loss_is_scaled_for_ga``) and DDP averages gradients over ranks, so each optimiser step's
  gradient is that of the mean ``L_i`` over all of the step's sequences, however it is split.
  ``ℓ_t = -min(ρ A, clip(ρ, 1-ε_low, 1+ε_high) A) + β k3_t``. With ``old_logprobs: sampler`` the ratio ``ρ_i =
  exp(mean_t(log π_θ − log π_sampler))`` uses the rollout's own logprobs and no old-logprob forward pass runs;
  with ``recompute`` the old logprobs come from a forward pass and TRL's token_truncate IS correction multiplies the
  token loss (a different algorithm).
- **The KL controller**: after each optimiser step, the mean k3 over the step's model tokens (all ranks) moves β
  proportionally toward ``target_kl`` (Ziegler et al. 2019), within [β_min, β_max]. β is saved in every checkpoint
  (``t2s_kl_controller.json``, before HF's ``trainer_state.json``) and restored on resume; a checkpoint without it
  resumes with the last β its ``trainer_state.json`` logged (``restored_beta``), with a warning.
- **Log-prob passes run in length groups** (``_get_per_token_logps_and_entropies``: the reference pass, the
  old-logprob pass and the loss's forward). Completions are right-padded to the batch's longest, so a batch with a few
  long episodes is mostly padding. The rows are sorted by their last real token and split into contiguous groups
  (``length_groups``: at most ``batch_size`` rows each, chosen to minimise padded tokens plus ``GROUP_OVERHEAD_TOKENS``
  per forward call); each group runs TRL's pass cut after its last real column, and the results are put back full
  width, in the rows' order, 0 at the cut columns as TRL gives padding. Left padding is never cut (positions stay), and
  under causal attention a real token sees the same tokens. The values equal the whole-batch pass up to float
  rounding: a parameter's gradient sums the rows in another order (as TRL's own ``batch_size`` chunks do), and CPU
  attention kernels pick block sizes by sequence length. A batch that forms one group with nothing to cut runs TRL's
  pass itself. With ``shared_prompt_pass``, each distinct prompt runs once instead, its keys and values shared by
  its G episodes (``t2s.training.shared_prompt``), where the model's attention allows.
- **EOS**: generation stops on the chat template's stop tokens (``t2s.env.chat_format``; for Qwen3.5 ``<|im_end|>``
  and ``<|endoftext|>``); all are in ``trainer.eos_token_ids``.
- **Step metrics** besides TRL's: episode counters (``EPISODE_METRICS``), each stop reason's share of the step's
  episodes (``episodes/stop/<reason>``, with a warning when any ended before its first turn);
  ``sampling/logp_gap/{mean,max}``, the |log π_θ − log π_sampler| over model tokens in the loss's forward pass (≈ 0
  when the sampler is the policy); and
  rank 0's time split in seconds (``TIME_METRICS``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from typing import Any, Callable

import torch
from trl import GRPOTrainer

from t2s.backends.vllm_engine import checkpoint_dtype, vllm_environment
from t2s.env.record import STOP_REASONS, no_turn_line
from t2s.settings import match_umask
from t2s.training.cpu_threads import score_labelled_positions_only
from t2s.training.checkpoints import KL_STATE_FILE, loading_model, restored_beta
from t2s.training.configs import ConfigError
from t2s.training.progress import metrics_file
from t2s.training.engines import build_backend, check_server_context
from t2s.training.loss_math import k3, kl_controller_update, length_groups, original_order
from t2s.training.shared_prompt import shared_prompt_pass
from t2s.training.startup import (check_eos_ids, check_rollout_output, check_think_prompt, policy_init_kwargs,
                                  resolve_reward_funcs, set_generation_eos)

log = logging.getLogger(__name__)


# Episode counters (DESIGN §10) summarised per step: metric name -> (numerator counter, denominator).
# Denominator "episodes" divides by the number of episodes, otherwise by the sum of that counter.
EPISODE_METRICS = {
    "episodes/turns_mean": ("turns", "episodes"),
    "episodes/calls_mean": ("calls", "episodes"),
    "episodes/submit_rate": ("submitted", "episodes"),
    "episodes/fallback_rate": ("fallback_used", "episodes"),
    "episodes/forced_rate": ("forced", "episodes"),
    "episodes/truncated_rate": ("truncated", "episodes"),
    "episodes/turn_cutoffs_per_turn": ("turn_cutoffs", "turns"),  # eval's turn_cutoff_rate counts episodes
    "episodes/tool_error_rate": ("tool_errors", "calls"),
    "episodes/format_deviations_mean": ("format_deviations", "episodes"),
    "episodes/write_attempts_mean": ("write_attempts", "episodes"),
}

# Where a step's wall time went, in seconds on rank 0 (generation and environment overlap inside the rollout).
TIME_METRICS = {
    "time/rollout": "the whole rollout: episodes played and scored",
    "time/generation": "the rollout's generation calls in flight",
    "time/environment": "the rollout's tools, final SQL and scoring in flight",
    "time/reward": "the reward functions",
    "time/forward_backward": "the rest of the step: reference and old-logprob passes, the loss's forward and backward",
}


class _DropMessage(logging.Filter):
    def __init__(self, needle: str) -> None:
        super().__init__()
        self.needle = needle

    def filter(self, record: logging.LogRecord) -> bool:
        return self.needle not in record.getMessage()


# ---------------------------------------------------------------------------------------------------- the trainer


class Text2SQLGRPOTrainer(GRPOTrainer):
    """GRPOTrainer for agentic text-to-SQL (DESIGN §8). ``args`` is a :class:`t2s.training.configs.T2SGRPOConfig`.

    ``model`` is a path or a loaded model with a ``name_or_path`` (the reference model and vLLM load by path).
    ``reward_funcs`` defaults to ``args.reward_names``. ``episode_runner(rows, trainer) -> dict`` replaces the real
    rollout (tests use scripted ones); by default episodes run through ``t2s.rollout.driver`` on the backend that
    ``args.rollout_backend`` names.
    """

    def __init__(self, model, args, train_dataset=None, processing_class=None, reward_funcs=None, *,
                 episode_runner: Callable[[list[dict], Any], dict] | None = None, **kwargs) -> None:
        if args.rollout_backend == "vllm_server":
            check_server_context(args)
        if isinstance(model, str):
            from trl.trainer.utils import create_model_from_path

            with loading_model(model):  # a config.json at odds with its weights: one Error: line
                model = create_model_from_path(model, **policy_init_kwargs(args))
        if not getattr(model.config, "_name_or_path", ""):
            raise ConfigError("Error: the model has no path (built from a config?): save it with save_pretrained and "
                              "pass the folder; the reference model and vLLM load it by path.")
        if processing_class is None:
            from transformers import AutoTokenizer

            processing_class = AutoTokenizer.from_pretrained(model.config._name_or_path, padding_side="left")
        check_think_prompt(processing_class, args.chat_template_kwargs, args.enable_thinking)
        set_generation_eos(model, processing_class)
        if reward_funcs is None:
            reward_funcs = resolve_reward_funcs(args.reward_names, args)
        self._episode_runner = episode_runner
        self._batch_rows: list[dict] | None = None
        self.episodes_played = 0  # by this process: its share of every generation batch
        self._backend = None
        self._kl_window = torch.zeros(3, dtype=torch.float64)  # Σ k3·m, Σ m, sequences since the last step
        self._rollout_timings: dict[str, float] = {}  # set by the real rollout: generation and environment seconds
        self._outside_passes = 0.0  # seconds of rollout and rewards inside the current training_step call
        self._passes_seconds = 0.0  # forward/backward seconds of the optimiser step so far
        # The model is loaded here (its eos must be set first); TRL still uses model_init_kwargs for the reference
        # model, so its "model_init_kwargs will be ignored" warning would mislead.
        trl_logger = logging.getLogger("trl.trainer.grpo_trainer")
        quiet = _DropMessage("model_init_kwargs")
        trl_logger.addFilter(quiet)
        from t2s.training import vllm_sync

        engine = contextlib.nullcontext()
        if args.rollout_backend == "vllm_colocate":
            vllm_environment(torch_compile=bool(args.torch_compile))
            engine = vllm_sync.engine_settings(args.vllm_dtype or checkpoint_dtype(model.config._name_or_path))
        try:
            with engine, vllm_sync.server_setup(args):
                super().__init__(model=model, reward_funcs=reward_funcs, args=args, train_dataset=train_dataset,
                                 processing_class=processing_class, rollout_func=self._rollout, **kwargs)
        finally:
            trl_logger.removeFilter(quiet)
        vllm_sync.install(self)
        self.add_callback(metrics_file())
        score_labelled_positions_only()  # on a CPU, the LM head projects the completion only (t2s.training.cpu_threads)
        check_eos_ids(self.eos_token_ids, self._tokenizer)
        if self.beta == 0.0 or self.ref_model is None and not self._peft_model():
            raise ConfigError("Error: no reference model was built; beta must be > 0 at start.")

    def _peft_model(self) -> bool:
        try:
            from peft import PeftModel
        except ImportError:  # pragma: no cover - peft is a requirement
            return False
        return isinstance(self.accelerator.unwrap_model(self.model), PeftModel)

    # ------------------------------------------------------------------------------------------------ rollout

    def _generate_and_score_completions(self, inputs):
        self._batch_rows = inputs  # the rows of this generation batch, G consecutive copies per question
        self.episodes_played += len(inputs)
        try:
            output = super()._generate_and_score_completions(inputs)
        finally:
            self._batch_rows = None
        if self.args.old_logprobs == "recompute" and "old_per_token_logps" not in output:
            self._recompute_old_logprobs(output)
        return output

    def _rollout(self, prompts: list, trainer) -> dict:
        rows = self._batch_rows
        if rows is None or len(rows) != len(prompts):
            raise RuntimeError(f"rollout got {len(prompts)} prompts but {0 if rows is None else len(rows)} stashed "
                               "rows; rows must reach the rollout through _generate_and_score_completions")
        runner = self._episode_runner or self._run_episodes
        self._rollout_timings = {}
        started = time.perf_counter()
        output = runner([dict(row) for row in rows], self)
        elapsed = time.perf_counter() - started
        self._outside_passes += elapsed
        check_rollout_output(output, len(rows))
        mode = "train" if self.model.training else "eval"
        self._metrics[mode]["time/rollout"].append(elapsed)
        for kind, seconds in self._rollout_timings.items():
            self._metrics[mode][f"time/{kind}"].append(seconds)
        self._log_episodes(output.get("record"))
        return output

    def _run_episodes(self, rows: list[dict], trainer) -> dict:
        from t2s.backends.base import SamplingSettings
        from t2s.rollout.driver import Rollout

        if self._backend is None:
            self._backend = build_backend(self)
        if self.args.rollout_backend == "vllm_server" and self.accelerator.num_processes > 1:
            # Rank 0 alone pushes the weights to the server (then resets its prefix cache) before rollout_func; the
            # other ranks must not send requests before that is done, or their turns sample from the old weights.
            self.accelerator.wait_for_everyone()
        sampling = SamplingSettings.training(temperature=self.args.temperature)
        rollout = Rollout(self._backend, self.processing_class, self.args.episode_config(), sampling=sampling)
        traces = rollout.run(rows)
        self._rollout_timings = rollout.timings
        return rollout.to_trl(traces)

    def _log_episodes(self, records) -> None:
        """Per-step episode behaviour, summed over ranks (every rank runs this collective once per generation): the
        counters' ``EPISODE_METRICS``, and each stop reason's share (``episodes/stop/<reason>``). Episodes that ended
        before their first turn are also named in one warning line."""
        if records is None:
            return
        counters = sorted({c for c, _ in EPISODE_METRICS.values()})
        sums = ([float(len(records))] + [float(sum(float(r.counters.get(c) or 0) for r in records)) for c in counters]
                + [float(sum(r.stop_reason == reason for r in records)) for reason in STOP_REASONS])
        totals = self.accelerator.reduce(torch.tensor(sums, device=self.accelerator.device), reduction="sum").tolist()
        by_name = dict(zip(["episodes", *counters, *STOP_REASONS], totals, strict=True))
        mode = "train" if self.model.training else "eval"
        for metric, (numerator, denominator) in EPISODE_METRICS.items():
            if by_name[denominator] > 0:
                self._metrics[mode][metric].append(by_name[numerator] / by_name[denominator])
        for reason in STOP_REASONS:
            self._metrics[mode][f"episodes/stop/{reason}"].append(by_name[reason] / max(by_name["episodes"], 1))
        if by_name["prompt_too_long"] and self.accelerator.is_main_process:
            config = self.args.episode_config()
            longest = max((r.prompt_tokens for r in records if r.played_no_turn), default=0)  # this rank's
            log.warning(no_turn_line(int(by_name["prompt_too_long"]), int(by_name["episodes"]), longest,
                                     config.episode_token_budget, config.min_episode_tokens))
        if self.log_completions:  # with the rewards' tier, f1, join and consensus: what `t2s show RUN` reads
            self._log_completion_extra("episode", [json.dumps(r.to_json(), default=str) for r in records])
            self._log_completion_extra("turns", [int(r.counters["turns"]) for r in records])
            self._log_completion_extra("submitted", [bool(r.counters["submitted"]) for r in records])

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        started = time.perf_counter()
        rewards = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        elapsed = time.perf_counter() - started
        self._outside_passes += elapsed
        self._metrics["train" if self.model.training else "eval"]["time/reward"].append(elapsed)
        return rewards

    # ------------------------------------------------------------------------------------------------ old logprobs

    def _recompute_old_logprobs(self, output: dict) -> None:
        """``recompute`` without vLLM: the old-logprob forward pass and TRL's token_truncate IS ratio, done here."""
        prompt_completion_ids = torch.cat([output["prompt_ids"], output["completion_ids"]], dim=1)
        attention_mask = torch.cat([output["prompt_mask"], output["completion_mask"]], dim=1)
        with torch.no_grad():
            old, _, _ = self._get_per_token_logps_and_entropies(
                self.model, prompt_completion_ids, attention_mask, output["completion_ids"].size(1),
                batch_size=self.args.per_device_train_batch_size,
            )
        output["old_per_token_logps"] = old
        sampler = output.get("sampling_per_token_logps")
        if sampler is not None:
            mask = output["completion_mask"] * output.get("tool_mask", torch.ones_like(output["completion_mask"]))
            diff = torch.nan_to_num((old - sampler) * mask, nan=0.0)
            output["importance_sampling_ratio"] = torch.clamp(
                torch.exp(diff), min=self.args.vllm_importance_sampling_clip_min,
                max=self.args.vllm_importance_sampling_clip_max,
            )

    # ------------------------------------------------------------------------------------------------ log-prob passes

    def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep, batch_size=None,
                                           compute_entropy=False, compute_aux_loss=False, **multimodal):
        """TRL's pass, run once per length group (``length_groups``) on the group's rows cut after their last real
        column, or with each distinct prompt run once (``shared_prompt_pass``, where the model's attention allows);
        results come back full width, in the rows' order, 0 at the cut columns as TRL gives padding. Groups hold at
        most ``batch_size`` rows, each one forward call (TRL's chunk); an MoE aux loss is the mean over the calls, as
        TRL averages its chunks. Multimodal inputs (TRL's image and token-type keywords) go to TRL's pass unchanged.
        """
        plain = not compute_aux_loss and all(value is None for value in multimodal.values())
        if plain and self.args.shared_prompt_pass:
            shared = shared_prompt_pass(model, input_ids, attention_mask, logits_to_keep, batch_size,
                                        self.accelerator.autocast, compute_entropy)
            if shared is not None:
                return (*shared, None)
        width = input_ids.size(1)
        columns = torch.arange(1, width + 1, device=attention_mask.device)
        # a row's length: up to its last real token, and at least the prompt plus one completion column
        ends = (attention_mask.bool() * columns).amax(dim=1).clamp(min=width - logits_to_keep + 1).tolist()
        groups = length_groups(ends, batch_size)
        if any(value is not None for value in multimodal.values()) or (len(groups) == 1 and max(ends) == width):
            return super()._get_per_token_logps_and_entropies(
                model, input_ids, attention_mask, logits_to_keep, batch_size=batch_size,
                compute_entropy=compute_entropy, compute_aux_loss=compute_aux_loss, **multimodal)
        logps, entropies, aux_losses = [], [], []
        for group in groups:
            end = max(ends[i] for i in group)
            rows = torch.tensor(group, device=input_ids.device)
            group_logps, group_entropies, aux_loss = super()._get_per_token_logps_and_entropies(
                model, input_ids[rows, :end], attention_mask[rows, :end], logits_to_keep - (width - end),
                compute_entropy=compute_entropy, compute_aux_loss=compute_aux_loss)
            logps.append(torch.nn.functional.pad(group_logps, (0, width - end)))
            if compute_entropy:
                entropies.append(torch.nn.functional.pad(group_entropies, (0, width - end)))
            aux_losses.append(aux_loss)
        back = original_order([i for group in groups for i in group], input_ids.device)
        return (torch.cat(logps)[back], torch.cat(entropies)[back] if compute_entropy else None,
                torch.stack(aux_losses).mean() if compute_aux_loss else None)

    # ------------------------------------------------------------------------------------------------ loss

    def _compute_loss(self, model, inputs):
        prompt_ids, prompt_mask = inputs["prompt_ids"], inputs["prompt_mask"]
        completion_ids, completion_mask = inputs["completion_ids"], inputs["completion_mask"]
        input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
        attention_mask = torch.cat([prompt_mask, completion_mask], dim=1)
        mask = completion_mask if "tool_mask" not in inputs else completion_mask * inputs["tool_mask"]
        mask = mask.to(torch.float32)
        logps, entropies, _ = self._get_per_token_logps_and_entropies(
            model, input_ids, attention_mask, completion_ids.size(1), compute_entropy=True
        )

        if self.args.old_logprobs == "sampler":
            old = inputs.get("sampling_per_token_logps")
            if old is None:
                raise RuntimeError("old_logprobs 'sampler' needs the rollout's logprobs, but the rollout returned none")
        else:
            old = inputs.get("old_per_token_logps")
            old = logps.detach() if old is None else old
        log_ratio = torch.nan_to_num(logps - old, nan=0.0) * mask
        tokens = mask.sum(-1).clamp(min=1.0)
        if self.importance_sampling_level == "sequence":
            coef_1 = torch.exp(log_ratio.sum(-1) / tokens).unsqueeze(-1)  # (B, 1)
        else:
            coef_1 = torch.exp(log_ratio)  # (B, T)
        coef_2 = torch.clamp(coef_1, 1 - self.epsilon_low, 1 + self.epsilon_high)
        advantages = inputs["advantages"]
        if advantages.dim() == 1:
            advantages = advantages.unsqueeze(1)
        per_token_loss = -torch.min(coef_1 * advantages, coef_2 * advantages)
        if self.args.old_logprobs == "recompute" and "importance_sampling_ratio" in inputs:
            per_token_loss = per_token_loss * inputs["importance_sampling_ratio"]
        per_token_kl = k3(inputs["ref_per_token_logps"], logps) if "ref_per_token_logps" in inputs else None
        if per_token_kl is not None:
            per_token_loss = per_token_loss + self.beta * per_token_kl

        seq_loss = (per_token_loss * mask).sum(-1) / self.args.loss_norm_constant  # L_i
        mode = "train" if self.model.training else "eval"
        if mode == "train":
            loss = seq_loss.sum() / (seq_loss.size(0) * self.current_gradient_accumulation_steps)
        else:
            loss = seq_loss.mean()
        sampler = inputs.get("sampling_per_token_logps")
        self._log_loss_metrics(mode, mask, entropies, coef_1, advantages, per_token_kl,
                               None if sampler is None else (logps.detach() - sampler).abs())
        return loss

    def _log_loss_metrics(self, mode, mask, entropies, coef_1, advantages, per_token_kl, logp_gap) -> None:
        def global_mean(values: torch.Tensor, weights: torch.Tensor) -> float:
            totals = self.accelerator.reduce(torch.stack([(values * weights).sum(), weights.sum()]).detach(),
                                             reduction="sum")
            return (totals[0] / totals[1].clamp(min=1.0)).item()

        self._metrics[mode]["entropy"].append(global_mean(entropies, mask))
        if logp_gap is not None:  # the sampler's logprobs against the policy's, on model tokens (NaN: unscored)
            gap_mask = mask * ~torch.isnan(logp_gap)
            gap = torch.nan_to_num(logp_gap, nan=0.0)
            self._metrics[mode]["sampling/logp_gap/mean"].append(global_mean(gap, gap_mask))
            local_max = (gap * gap_mask).max() if gap.numel() else gap.new_zeros(())
            self._metrics[mode]["sampling/logp_gap/max"].append(
                self.accelerator.reduce(local_max.detach(), reduction="max").item()
            )
        if per_token_kl is not None:
            kl_sum, tokens = (per_token_kl * mask).sum().detach(), mask.sum().detach()
            self._metrics[mode]["kl"].append(global_mean(per_token_kl, mask))
            if mode == "train":
                window = torch.stack([kl_sum.double().cpu(), tokens.double().cpu(),
                                      torch.tensor(float(mask.size(0)), dtype=torch.float64)])
                self._kl_window = self._kl_window + window
        seq_weights = torch.ones(coef_1.size(0), device=coef_1.device)
        ratio = coef_1 if coef_1.size(1) == 1 else None
        if ratio is not None:
            low = ((ratio < 1 - self.epsilon_low) & (advantages < 0)).float().squeeze(-1)
            high = ((ratio > 1 + self.epsilon_high) & (advantages > 0)).float().squeeze(-1)
            self._metrics[mode]["clip_ratio/low_mean"].append(global_mean(low, seq_weights))
            self._metrics[mode]["clip_ratio/high_mean"].append(global_mean(high, seq_weights))
            self._metrics[mode]["clip_ratio/region_mean"].append(global_mean(low + high, seq_weights))
        else:
            low = ((coef_1 < 1 - self.epsilon_low) & (advantages < 0)).float()
            high = ((coef_1 > 1 + self.epsilon_high) & (advantages > 0)).float()
            self._metrics[mode]["clip_ratio/low_mean"].append(global_mean(low, mask))
            self._metrics[mode]["clip_ratio/high_mean"].append(global_mean(high, mask))
            self._metrics[mode]["clip_ratio/region_mean"].append(global_mean(low + high, mask))

    # ------------------------------------------------------------------------------------------------ KL controller

    def training_step(self, model, inputs, num_items_in_batch):
        self._outside_passes = 0.0
        started = time.perf_counter()
        output = super().training_step(model, inputs, num_items_in_batch)
        self._passes_seconds += time.perf_counter() - started - self._outside_passes
        if self._step % self.current_gradient_accumulation_steps == 0:  # the optimiser step's last micro-batch
            self._metrics["train"]["time/forward_backward"].append(self._passes_seconds)
            self._passes_seconds = 0.0
            self._update_beta()
        return output

    def _update_beta(self) -> None:
        """The proportional KL controller, after each optimiser step, on the step's k3 gathered over ranks."""
        window = self.accelerator.reduce(self._kl_window.to(self.accelerator.device, torch.float32), reduction="sum")
        self._kl_window = torch.zeros(3, dtype=torch.float64)
        kl_sum, tokens, episodes = (float(x) for x in window.tolist())
        if tokens > 0:
            self.beta = kl_controller_update(
                self.beta, kl_sum / tokens, int(round(episodes)), target=self.args.target_kl,
                horizon=self.args.kl_horizon, beta_min=self.args.beta_min, beta_max=self.args.beta_max,
            )
        self._metrics["train"]["beta"].append(self.beta)

    def _save_checkpoint(self, model, trial):
        # β goes in first: HF writes trainer_state.json last, so a checkpoint that has it has β too.
        if self.args.should_save:
            from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

            folder = os.path.join(self._get_output_dir(trial=trial),
                                  f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}")
            os.makedirs(folder, exist_ok=True)
            with open(os.path.join(folder, KL_STATE_FILE), "w") as f:
                json.dump({"beta": self.beta, "global_step": self.state.global_step}, f)
        super()._save_checkpoint(model, trial)
        if self.args.should_save:
            match_umask(folder)

    def _load_optimizer_and_scheduler(self, checkpoint):
        super()._load_optimizer_and_scheduler(checkpoint)
        if checkpoint is not None:
            self.beta = restored_beta(checkpoint, self.beta)


