"""A scripted episode runner and small config helpers for the trainer tests; also the torchrun entry point.

The scripted runner stands in for the real rollout where a test needs exact control of the token stream: each row
gets a deterministic completion (model turn, environment turn, model turn ending in <|im_end|>), an env_mask, and
sampler logprobs computed from the current policy (so the ratio starts at 1), plus a scripted reward.

    torchrun --nproc_per_node 2 tests/_train_script.py MODEL_DIR OUTPUT_DIR [PER_DEVICE_BATCH [OPTIMIZER [shared]]]
"""

from __future__ import annotations

import hashlib
import json
import sys
import weakref
from pathlib import Path

from t2s.env.record import EpisodeRecord, counters as record_counters

PROMPT_TOKENS = 6
TURN_TOKENS = 5
ENV_TOKENS = 4


def make_rows(n: int) -> list[dict]:
    """n question rows in the common row shape, with a TRL ``prompt`` column."""
    return [
        {
            "prompt": f"Question number {i}: how many orders were shipped?",
            "question_id": f"scripted:{i}",
            "question": f"Question number {i}: how many orders were shipped?",
            "evidence": "",
            "gold_sql": "SELECT 1",
            "db_id": "none",
            "db_path": None,
            "schema_id": None,
            "difficulty": "simple",
            "source": "scripted",
        }
        for i in range(n)
    ]


def _ids(seed: str, n: int, low: int = 300, high: int = 700) -> list[int]:
    digest = hashlib.sha256(seed.encode()).digest()
    return [low + (digest[i % len(digest)] * 7 + i * 13) % (high - low) for i in range(n)]


def sampler_noise(sequence: int, position: int) -> float:
    """A fixed pattern in [-1, 1] that ``logprob_noise`` scales: half a per-sequence offset, half a per-token one, so
    both sequence-level and token-level ratios against the sampler spread out."""
    return ((sequence * 5) % 9 - 4) / 8 + ((sequence * 7 + position * 3) % 11 - 5) / 10


class ScriptedEpisodes:
    """``runner(rows, trainer) -> dict`` for ``Text2SQLGRPOTrainer(episode_runner=...)``; records what it saw.

    ``ragged``: the last model turn is 0-2 tokens shorter by copy, so completions differ in length (TRL pads them).
    Sampler logprobs are the policy's plus ``logprob_shift`` plus ``logprob_noise × sampler_noise(i, t)``.
    """

    def __init__(self, tokenizer, *, exact_logprobs: bool = True, logprob_shift: float = 0.0,
                 logprob_noise: float = 0.0, ragged: bool = False):
        self.im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
        self.exact_logprobs = exact_logprobs
        self.logprob_shift = logprob_shift
        self.logprob_noise = logprob_noise
        self.ragged = ragged
        self.seen: list[list[str]] = []  # question ids per call

    def __call__(self, rows: list[dict], trainer) -> dict:

        self.seen.append([row["question_id"] for row in rows])
        group = trainer.num_generations
        prompt_ids, completion_ids, env_mask, rewards, records = [], [], [], [], []
        for index, row in enumerate(rows):
            copy = index % group
            key = f"{row['question_id']}#{copy}"
            turn1 = _ids(key + "a", TURN_TOKENS - 1) + [self.im_end]
            env = _ids(key + "env", ENV_TOKENS, 100, 200)
            turn2 = _ids(key + "b", TURN_TOKENS - 1 - (copy % 3 if self.ragged else 0)) + [self.im_end]
            prompt_ids.append(_ids(row["question_id"], PROMPT_TOKENS))
            completion_ids.append(turn1 + env + turn2)
            env_mask.append([1] * len(turn1) + [0] * len(env) + [1] * len(turn2))
            rewards.append(float(copy))  # different within a group: non-zero advantages
            records.append(EpisodeRecord(
                question_id=row["question_id"], db_id=row.get("db_id"), mode="full", turns=[], final_sql=None,
                final_sql_source="none", submitted_sql=None, stop_reason="submitted" if copy % 2 == 0 else "turn_limit",
                counters=record_counters(turns=2, calls=2, tool_errors=copy % 2, submitted=copy % 2 == 0,
                                         forced=copy % 2 == 1)))
        logprobs = self._logprobs(trainer, prompt_ids, completion_ids, env_mask) if self.exact_logprobs else [
            [-2.0 if m else 0.0 for m in mask] for mask in env_mask]
        return {"prompt_ids": prompt_ids, "completion_ids": completion_ids, "logprobs": logprobs,
                "env_mask": env_mask, "scripted_reward": rewards, "record": records}

    def _logprobs(self, trainer, prompt_ids, completion_ids, env_mask):
        import torch

        model = trainer.accelerator.unwrap_model(trainer.model)
        out = []
        for i, (prompt, completion, mask) in enumerate(zip(prompt_ids, completion_ids, env_mask)):
            ids = torch.tensor([prompt + completion], device=trainer.accelerator.device)
            with torch.no_grad():
                logits = model(input_ids=ids).logits.float() / trainer.temperature
            logps = torch.log_softmax(logits[:, len(prompt) - 1 : -1], dim=-1)
            picked = logps.gather(-1, ids[:, len(prompt):].unsqueeze(-1)).squeeze(-1)[0].tolist()
            out.append([lp + self.logprob_shift + self.logprob_noise * sampler_noise(i, t) if m else 0.0
                        for t, (lp, m) in enumerate(zip(picked, mask))])
        return out


def scripted_reward(prompts, completions, scripted_reward=None, **kwargs):
    """TRL reward function reading the scripted runner's ``scripted_reward`` extra."""
    return [float(r) for r in scripted_reward]


def make_config(output_dir, **overrides):
    """A CPU-friendly T2SGRPOConfig: 2 questions × 4 rollouts per step, fp32, no checkpointing, logging each step."""
    from t2s.training.configs import T2SGRPOConfig

    values = dict(
        output_dir=str(output_dir),
        per_device_train_batch_size=8,
        gradient_accumulation_steps=1,
        num_generations=4,
        max_steps=2,
        learning_rate=1e-3,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        bf16=False,
        gradient_checkpointing=False,
        seed=0,
        max_completion_length=64,
        dataloader_num_workers=0,
        disable_tqdm=True,
    )
    values.update(overrides)
    return T2SGRPOConfig(**values)


def build_trainer(model_dir, output_dir, n_rows: int = 4, runner=None, **overrides):
    """A Text2SQLGRPOTrainer on scripted rows and episodes; returns (trainer, runner)."""
    from datasets import Dataset
    from transformers import AutoTokenizer

    from t2s.training.trainer import Text2SQLGRPOTrainer

    tokenizer = AutoTokenizer.from_pretrained(model_dir, padding_side="left")
    runner = runner or ScriptedEpisodes(tokenizer)
    args = make_config(output_dir, **overrides)
    trainer = Text2SQLGRPOTrainer(
        str(model_dir), args, train_dataset=Dataset.from_list(make_rows(n_rows)), processing_class=tokenizer,
        reward_funcs=[scripted_reward], episode_runner=runner,
    )
    return trainer, runner


def main(argv: list[str]) -> int:
    """torchrun (or accelerate launch) entry: 2 training steps under gloo on CPU, PER_DEVICE_BATCH rollouts per
    process and step (default 4), with AdamW or (OPTIMIZER ``sgd``) plain SGD, and with ``shared`` the recipe key
    ``shared_prompt_pass`` on; each rank writes what happened to OUTPUT_DIR/result_rank{rank}.json (with, for each
    log-prob pass, whether the shared-prompt pass answered it), and the trained model is saved in OUTPUT_DIR."""
    import os

    import t2s.training.trainer as trainer_module
    from t2s.settings import offline_environment
    from t2s.training.pipeline import fit, free_finished_run

    offline_environment()
    model_dir, output_dir = argv[0], Path(argv[1])
    per_device = int(argv[2]) if len(argv) > 2 else 4
    # plain SGD: the update is the learning rate times the gradient, so a gradient off by any factor shows (Adam's
    # update hardly depends on the gradient's scale)
    optimizer = {"optim": "sgd", "learning_rate": 0.5} if argv[3:4] == ["sgd"] else {}
    shared_passes = []
    real_pass = trainer_module.shared_prompt_pass

    def counted_pass(*args, **kwargs):
        result = real_pass(*args, **kwargs)
        shared_passes.append(result is not None)
        return result

    trainer_module.shared_prompt_pass = counted_pass
    trainer, runner = build_trainer(model_dir, output_dir, n_rows=4, per_device_train_batch_size=per_device,
                                    max_steps=2, shared_prompt_pass=argv[4:5] == ["shared"], **optimizer)
    fit(trainer, {"rows": 4})  # the entry point's own train, save and end of run
    rank = int(os.environ.get("RANK", "0"))
    result = {
        "rank": rank,
        "world_size": trainer.accelerator.num_processes,
        "distributed_type": str(trainer.accelerator.distributed_type),
        "global_step": trainer.state.global_step,
        "beta": trainer.beta,
        "seen": runner.seen,
        "log_history": trainer.state.log_history,
        "shared_passes": shared_passes,
    }
    alive = weakref.ref(trainer)
    del trainer
    free_finished_run()  # as the entry point does after ``fit``
    result["trainer_freed"] = alive() is None  # nothing left for the interpreter's shutdown to tear down
    (output_dir / f"result_rank{rank}.json").write_text(json.dumps(result, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
