"""TRL's colocated vLLM engine, as the trainer builds and feeds it: in the checkpoint's dtype, with weights pushed
through vLLM's layerwise reload.

- **dtype.** TRL 1.16 builds ``vllm.LLM(...)`` with no ``dtype``, so vLLM picks one: on an x86 CPU it turns a float32
  checkpoint into bfloat16 (and on a GPU, float32 into half precision). A bf16 engine beside a float32 trainer breaks
  token identity and inflates the logprob gap. :func:`engine_dtype` gives that one ``LLM(...)`` call the checkpoint's
  own dtype (``vllm_dtype`` overrides it).
- **Weight sync.** TRL pushes weights with ``model.load_weights`` into the live layers. vLLM's CPU linear layers repack
  their weights after loading and drop ``layer.weight``, so that path fails there (``'Parameter' object has no
  attribute 'weight_loader'``). :func:`reload_weights` uses vLLM's layerwise reload instead
  (``Worker.reload_weights``, which re-runs each layer's post-loading step), on CPU and GPU alike, so the tests run
  the sync that ships. A tied output head is fed explicitly as ``lm_head.weight``: ``named_parameters()`` holds only
  the embedding, and a reload without it keeps the engine's old head (its logprobs then follow the old weights).
  The reload holds tensors until each layer is complete, so gathered ZeRO-3 / FSDP parameters, and LoRA-merged
  ones (unmerged after the walk), are copied first.
  Sleep mode (off by default) wakes the weights first, as TRL does; it does nothing on a CPU, so that path is
  untested there.
"""

from __future__ import annotations

import contextlib
import functools
import logging

log = logging.getLogger(__name__)


def checkpoint_dtype(model) -> str:
    """The dtype a checkpoint's config names (``float32``, ``bfloat16``, ...), or ``auto`` when it names none."""
    config = model.config
    dtype = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    if dtype is None and hasattr(config, "get_text_config"):
        dtype = getattr(config.get_text_config(), "dtype", None)
    if dtype is None:
        return "auto"
    return str(dtype).removeprefix("torch.")


@contextlib.contextmanager
def engine_dtype(dtype: str):
    """While open, TRL's colocated ``LLM(...)`` is built with ``dtype``."""
    from trl.generation import vllm_generation

    original = vllm_generation.LLM
    vllm_generation.LLM = functools.partial(original, dtype=dtype)
    try:
        yield
    finally:
        vllm_generation.LLM = original


def _tied(model) -> bool:
    config = model.config
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    return bool(getattr(text, "tie_word_embeddings", getattr(config, "tie_word_embeddings", False)))


def engine_weights(generation) -> list[tuple[str, object]]:
    """The trainer's current weights under vLLM's names (LoRA merged), with ``lm_head.weight`` for a tied head."""
    model = generation.accelerator.unwrap_model(generation.model)
    # gathered shards are released, and merged adapters unmerged, once the iteration moves on: keep copies
    copy = generation._dist.is_fsdp or generation._dist.is_zero3 or hasattr(model, "peft_config")
    weights = []
    for name, tensor in generation._iter_named_params():
        weights.append((name, tensor.detach().clone() if copy else tensor.detach()))
    names = {name for name, _ in weights}
    if _tied(model) and not any(name.endswith("lm_head.weight") for name in names):
        embedding = next((t for n, t in weights if n.endswith("embed_tokens.weight")), None)
        if embedding is None:
            raise RuntimeError("the model ties its output head but no embed_tokens.weight reached the sync")
        weights.append(("lm_head.weight", embedding))
    return weights


def reload_weights(generation) -> None:
    """TRL's ``VLLMGeneration.sync_weights`` for colocate mode, through vLLM's layerwise reload."""
    if generation.enable_sleep_mode:
        generation.llm.wake_up(tags=["weights"])
        generation._llm_weights_sleeping = False
    weights = engine_weights(generation)
    generation.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights})
    generation.llm.reset_prefix_cache()


def install(trainer) -> None:
    """Make the trainer's colocated engine (when it has one) take its weights through :func:`reload_weights`."""
    generation = getattr(trainer, "vllm_generation", None)
    if generation is None or getattr(generation, "mode", None) != "colocate":
        return
    generation.sync_weights = functools.partial(reload_weights, generation)
