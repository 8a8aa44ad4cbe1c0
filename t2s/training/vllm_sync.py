"""How the trainer's weights reach vLLM: TRL's colocated engine, built in the checkpoint's dtype and fed through vLLM's
layerwise reload; and a vLLM server, fed over NCCL by TRL where CUDA is, or through files the server reloads.

- **dtype.** TRL 1.16 builds ``vllm.LLM(...)`` with no ``dtype``, so vLLM picks one: on an x86 CPU it turns a float32
  checkpoint into bfloat16 (and on a GPU, float32 into half precision). A bf16 engine beside a float32 trainer breaks
  token identity and inflates the logprob gap. :func:`engine_settings` gives that one ``LLM(...)`` call the
  checkpoint's own dtype (``vllm_dtype`` overrides it) and the CPU build's settings (``t2s.backends.vllm_engine``).
- **Rendezvous port.** The colocated engine joins a one-process torch.distributed group at ``MASTER_PORT``. A launcher
  of several processes sets it; for a lone process TRL takes the first of 29500, 23456, 12355 and 12345 that is free
  when it looks, so two runs started together on one machine can both take 29500, and the later engine fails with
  ``EADDRINUSE``. :func:`engine_settings` gives an unset ``MASTER_PORT`` a port the operating system hands out.
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
- **Server sync** (``vllm_server_sync``). ``nccl`` is TRL's: the trainer joins the server's NCCL weight-transfer group
  (``init_communicator``), which needs a CUDA device. ``files`` works on any machine that shares a filesystem with the
  server: the main process writes the weights (tied head included) as ``model.safetensors`` in
  ``OUTPUT/.server-weights/`` and asks the dev-mode server (``VLLM_SERVER_DEV_MODE=1``) to reload them through
  ``POST /collective_rpc`` (``reload_weights``, the same layerwise reload), then resets its prefix cache. The default is
  ``nccl`` where CUDA is and ``files`` elsewhere, so a CPU run (the tests) never enters TRL's CUDA-only communicator.
  Either way every rank then waits until the server holds the main process's new weight version and checks it
  against its own, since each rank sends its own episodes' requests to the server (:class:`ServerSync`). Across
  machines, ``files`` needs ``OUTPUT`` on a filesystem the server's machine sees.
"""

from __future__ import annotations

import contextlib
import functools
import os


@contextlib.contextmanager
def engine_settings(dtype: str):
    """While open, TRL's colocated ``LLM(...)`` is built with ``dtype`` and the settings of
    ``t2s.backends.vllm_engine`` (no tokenizer of its own; on a CPU: eager, a prompt never prefilled in pieces), and
    an unset ``MASTER_PORT`` is a free port of the operating system's choosing, not TRL's first guess (29500)."""
    from trl.generation import vllm_generation

    from t2s.backends.vllm_engine import cpu_engine_kwargs, engine_dtype, free_port, token_ids_only

    dtype = engine_dtype(dtype)
    if not os.environ.get("MASTER_PORT"):
        os.environ["MASTER_PORT"] = str(free_port())

    original = vllm_generation.LLM

    @functools.wraps(original)
    def build(*args, **kwargs):
        return original(*args, **{**kwargs, "dtype": dtype, **token_ids_only(),
                                   **cpu_engine_kwargs(kwargs.get("max_model_len"))})

    vllm_generation.LLM = build
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


SERVER_WEIGHTS = ".server-weights"


def server_sync_mode(args) -> str:
    """``vllm_server_sync``, or its default: nccl where CUDA is, files elsewhere."""
    from t2s.backends.vllm_engine import has_cuda

    return args.vllm_server_sync or ("nccl" if has_cuda() else "files")


@contextlib.contextmanager
def server_setup(args):
    """While open, TRL's server set-up skips the NCCL communicator when the sync goes through files."""
    if args.rollout_backend != "vllm_server" or server_sync_mode(args) != "files":
        yield
        return
    from trl.generation.vllm_client import VLLMClient

    original = VLLMClient.init_communicator
    VLLMClient.init_communicator = lambda self, device=0: None
    try:
        yield
    finally:
        VLLMClient.init_communicator = original


class ServerSync:
    """TRL's ``sync_weights`` in server mode, followed by a check that every rank agrees on the server's weights.

    ``push`` sends the weights (every rank walks them, since gathering is collective; the main process sends them):
    TRL's own NCCL transfer, or :func:`reload_through_files`. Then every rank waits for the main process's weight
    version and checks it against its own count of syncs. Each rank sends its own episodes' requests to the server
    (they are not gathered on the main process), so without this wait a rank could start its next rollouts on the old
    weights; a rank that skipped or repeated a sync stops the run instead of training on other weights' rollouts."""

    def __init__(self, generation, push):
        self.generation, self.push, self.version = generation, push, 0

    def __call__(self) -> None:
        from accelerate.utils import broadcast_object_list

        self.push()
        self.version += 1
        main = self.generation.accelerator.is_main_process
        [served] = broadcast_object_list([self.version if main else None], from_process=0)
        if served != self.version:
            raise RuntimeError(f"rank {self.generation.accelerator.process_index} has taken part in {self.version} "
                               f"weight pushes but the main process in {served}: the ranks are out of step")


def reload_through_files(generation, folder) -> None:
    """The weight push of ``vllm_server_sync: files``: every rank walks the weights; the main process saves them in
    ``folder`` and has the server reload them."""
    from pathlib import Path

    from safetensors.torch import save_file

    weights = engine_weights(generation)
    if not generation.accelerator.is_main_process:
        return
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {name: tensor.to("cpu").contiguous() for name, tensor in weights}
    if "lm_head.weight" in tensors:  # safetensors stores no tensor twice: a tied head gets its own copy
        tensors["lm_head.weight"] = tensors["lm_head.weight"].clone()
    save_file(tensors, str(folder / "model.safetensors"))
    client = generation.vllm_client
    response = client.session.post(f"{client.base_url}/collective_rpc", json={
        "method": "reload_weights", "kwargs": {"weights_path": str(folder.resolve())}})
    if response.status_code != 200:
        raise RuntimeError(f"the vLLM server at {client.base_url} did not reload the weights (HTTP "
                           f"{response.status_code}: {response.text[:300]}); start it with VLLM_SERVER_DEV_MODE=1")
    client.reset_prefix_cache()


def install(trainer) -> None:
    """Point TRL's ``sync_weights`` at :func:`reload_weights` (colocate), or in server mode at a :class:`ServerSync`
    around TRL's NCCL push or :func:`reload_through_files` (``vllm_server_sync: files``)."""
    generation = getattr(trainer, "vllm_generation", None)
    if generation is None:
        return
    if generation.mode == "colocate":
        generation.sync_weights = functools.partial(reload_weights, generation)
    elif generation.mode == "server":
        push = generation.sync_weights
        if server_sync_mode(trainer.args) == "files":
            folder = os.path.join(trainer.args.output_dir, SERVER_WEIGHTS)
            push = functools.partial(reload_through_files, generation, folder)
        generation.sync_weights = ServerSync(generation, push)


def release_engine(trainer) -> None:
    """Shut the colocated engine down with vLLM's own process groups, before the run ends its process group (a run's
    ``fit`` does this). Left to the interpreter's exit, the engine's finaliser would find that group already gone;
    released here, a second run in the same process (``bench learn``'s control) builds its engine afresh."""
    generation = getattr(trainer, "vllm_generation", None)
    if generation is None or getattr(generation, "mode", None) != "colocate" or generation.llm is None:
        return
    import gc

    from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

    generation.llm = None
    gc.collect()
    cleanup_dist_env_and_memory()

