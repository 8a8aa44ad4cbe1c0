"""Train the smoke recipe for 2 steps with generation on real vLLM, then check that the engine follows the trainer.

    python tests/_vllm_train_script.py MODEL_DIR OUTPUT_DIR [--lora [--default-targets]] [--server URL] [RECIPE KEYS]
    torchrun --nproc_per_node 2 tests/_vllm_train_script.py MODEL_DIR OUTPUT_DIR

The smoke recipe in ``withheld`` mode (prompts without the schema, so shorter steps: what is checked is where the
weights are, not what the episodes hold). Colocated (the default) or through a server (``--server``: ``rollout_backend:
vllm_server``, weights synced through files). After every optimiser step a callback moves every weight by noise (a tiny
random policy's rewards are often all equal, so its own updates can be zero), so each step's sampler must have received
the new weights for ``sampling/logp_gap`` to stay small. After training the weights are pushed once more, and the
engine's logprobs for a fixed sequence are compared with transformers' on the trained weights and on the starting ones.
Each rank writes ``OUTPUT_DIR/result_rank{R}.json``. Each run is its own process, as a user starts one. Any further
arguments are recipe overrides (``--max_tokens_per_turn 16``); ``--default-targets`` leaves LoRA's target modules to
peft's defaults for the architecture.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TEXT = "SELECT name FROM singer WHERE age > 30 ORDER BY name"


def perturb_callback():
    import torch
    from transformers import TrainerCallback

    class Perturb(TrainerCallback):
        def on_step_end(self, args, state, control, model=None, **kwargs):
            generator = torch.Generator().manual_seed(state.global_step)
            with torch.no_grad():
                for param in model.parameters():
                    param.add_(torch.randn(param.shape, generator=generator) * 0.3 * float(param.std() or 0.02))

    return Perturb()


def model_logprobs(model, ids: list[int]) -> list[float]:
    import torch

    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0, :-1].float()
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(ids[1:])[:, None])[:, 0].tolist()


def engine_logprobs(trainer, ids: list[int]) -> list[float]:
    generation = trainer.vllm_generation
    if generation.mode == "colocate":
        from vllm import SamplingParams, TokensPrompt

        params = SamplingParams(max_tokens=1, temperature=1.0, prompt_logprobs=0)
        out = generation.llm.generate([TokensPrompt(prompt_token_ids=ids)], params, use_tqdm=False)[0]
        return [next(iter(entry.values())).logprob for entry in out.prompt_logprobs[1:]]
    client = generation.vllm_client
    model = client.session.get(f"{client.base_url}/v1/models").json()["data"][0]["id"]
    response = client.session.post(f"{client.base_url}/v1/completions", json={
        "model": model, "prompt": ids, "max_tokens": 1, "temperature": 1.0, "prompt_logprobs": 0})
    entries = response.json()["choices"][0]["prompt_logprobs"][1:]
    return [entry[str(token)]["logprob"] for entry, token in zip(entries, ids[1:])]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("output")
    parser.add_argument("--lora", action="store_true")
    parser.add_argument("--default-targets", action="store_true")
    parser.add_argument("--server", default=None)
    args, overrides = parser.parse_known_args()
    sys.path.insert(0, str(REPO))

    from t2s.settings import RECIPES_DIR
    from t2s.training.configs import parse_recipe
    from t2s.training.pipeline import build_trainer, free_finished_run
    from t2s.training.vllm_sync import release_engine

    backend = ["--rollout_backend", "vllm_server", "--vllm_server_base_url", args.server] if args.server else \
        ["--rollout_backend", "vllm_colocate", "--vllm_max_model_length", "4096"]
    targets = [] if args.default_targets else ["--lora_target_modules", "q_proj", "v_proj", "gate_proj"]
    peft = ["--use_peft", "true", "--lora_r", "8", "--lora_alpha", "16", "--lora_dropout", "0", *targets] \
        if args.lora else []
    script_args, training_args, model_args = parse_recipe([
        "--config", str(RECIPES_DIR / "smoke.yaml"), "--model_name_or_path", args.model, "--output_dir", args.output,
        "--max_steps", "2", "--mode", "withheld", *backend, *peft,  # withheld: no schema, prompts ~40% shorter
        *overrides,
    ])
    trainer, counts = build_trainer(script_args, training_args, model_args, callbacks=[perturb_callback()])
    rank = trainer.accelerator.process_index
    seen: list[list[str]] = []
    rollout = trainer.rollout_func

    def capture(prompts, trainer_):
        seen.append([str(row["question_id"]) for row in trainer_._batch_rows])
        return rollout(prompts, trainer_)

    trainer.rollout_func = capture
    engine = trainer.vllm_generation.llm.llm_engine if not args.server else None
    dtype = str(engine.model_config.dtype) if engine is not None else None
    ids = trainer.processing_class(TEXT)["input_ids"]
    checked = rank == 0 or not args.server
    start_lp = model_logprobs(trainer.model, ids) if checked else None  # the starting weights (LoRA's B is zero)
    trainer.train()  # as `fit` does, but the engine is checked before the run ends

    trainer.vllm_generation.sync_weights()  # the last step's weights (TRL pushes before each generation)
    result = {"rank": rank, "world_size": trainer.accelerator.num_processes, "dtype": dtype, "seen": seen,
              "global_step": trainer.state.global_step, "lora": any("lora_" in n for n, _ in
                                                                    trainer.model.named_parameters())}
    trainer.model.eval()
    if checked:
        engine_lp = engine_logprobs(trainer, ids)
        trained_lp = model_logprobs(trainer.model, ids)
        result.update(
            engine=engine_lp,
            trained_gap=max(abs(a - b) for a, b in zip(engine_lp, trained_lp)),
            start_gap=max(abs(a - b) for a, b in zip(engine_lp, start_lp)),
        )
    Path(args.output, f"result_rank{rank}.json").write_text(json.dumps(result))
    release_engine(trainer)
    trainer.accelerator.end_training()
    del trainer
    free_finished_run()  # as the entry point does
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
