"""Whether a CPU run may compute in bfloat16: only where the processor has bfloat16 instructions.

A recipe's ``bf16: true`` (TRL's configs also default ``bf16`` to true when ``fp16`` is unset) and an engine's
``bfloat16`` dtype pay off on a CPU with bfloat16 arithmetic (x86 ``avx512_bf16`` or ``amx_bf16``, Arm ``bf16``). On
one without, every bfloat16 matrix product is converted to and from float32 in software: on an AVX2-only processor (2
cores) one forward and backward pass of SmolLM2-135M over 600 tokens took 130 s under bf16 autocast against 5.6 s in
float32, and a bfloat16 vLLM engine beside a bf16 warm start played 67 of 350 one-turn episodes in 35 minutes.

On such a CPU a run computes in float32 instead, and says so in one line: autocast off (``bf16``, or ``accelerate
launch``'s ``mixed_precision: bf16``), and an engine of dtype ``bfloat16`` or ``auto`` built in ``float32``: the
colocated one, ``eval``'s, and ``make serve``'s (its ``DTYPE`` comes from
:func:`t2s.backends.vllm_engine.engine_dtype`). The CPU recipes' weights are float32 already (``dtype: float32``), so
nothing is lost but the rounding bfloat16 would have added. A recipe's weights in ``dtype: bfloat16`` and an engine
asked for ``float16`` are left as asked.

``T2S_CPU_BF16=1`` or ``0`` states the answer instead of reading it from the processor (``/proc/cpuinfo``); where
neither tells, bfloat16 is kept as asked.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16", "bf16"})  # x86 (AVX-512 BF16, AMX), Arm (FEAT_BF16)
CPUINFO = Path("/proc/cpuinfo")
STATED = {"1": True, "true": True, "yes": True, "on": True, "0": False, "false": False, "no": False, "off": False}
_noted: set[str] = set()


def cpu_flags(cpuinfo: str) -> set[str]:
    """The feature flags of the first processor a ``/proc/cpuinfo`` text lists (x86 ``flags``, Arm ``Features``)."""
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() in ("flags", "Features"):
            return set(value.split())
    return set()


def native_bf16() -> bool | None:
    """True where this CPU has bfloat16 instructions, False where it has none, None where nothing tells."""
    stated = os.environ.get("T2S_CPU_BF16", "").strip().lower()
    if stated in STATED:
        return STATED[stated]
    if stated:
        _note(f"T2S_CPU_BF16={stated!r} is neither 0 nor 1, so the processor is read", about_cpu=False)
    try:
        flags = cpu_flags(CPUINFO.read_text(encoding="utf-8", errors="replace"))
    except OSError:
        return None
    return bool(flags & BF16_FLAGS) if flags else None


def _note(what: str, about_cpu: bool = True) -> None:
    """One line on stderr, once a process: ``what`` runs in float32 on this CPU (or, not ``about_cpu``, ``what``)."""
    if what not in _noted:
        _noted.add(what)
        if about_cpu:
            what = (f"this CPU has no bfloat16 instructions (avx512_bf16, amx_bf16 or bf16); {what} runs in float32, "
                    "many times faster here")
        print(f"note: {what}", file=sys.stderr, flush=True)


def has_accelerator() -> bool:
    """Whether torch sees a CUDA, XPU or MPS device (else a run is on the CPU, whatever its recipe says)."""
    import torch

    return torch.cuda.is_available() or torch.xpu.is_available() or torch.backends.mps.is_available()


def cpu_autocast(config) -> None:
    """Turn a CPU run's bf16 autocast off where the CPU has no bfloat16 instructions: ``config.bf16``, and
    ``mixed_precision``, which transformers derives from it or from ``accelerate launch``'s environment
    (``ACCELERATE_MIXED_PRECISION``: every config in accelerate_configs/ says bf16). ``config``: a TRL or transformers
    training config of a run on the CPU."""
    if (getattr(config, "bf16", False) or getattr(config, "mixed_precision", None) == "bf16") \
            and native_bf16() is False:
        config.bf16 = False
        if getattr(config, "mixed_precision", None) == "bf16":
            config.mixed_precision = "no"
        _note("bf16 autocast (bf16: true, or accelerate's mixed_precision: bf16)")


def cpu_engine_dtype(dtype: str) -> str:
    """The dtype a vLLM CPU engine is built in: ``dtype``, except where the CPU has no bfloat16 instructions: then
    ``float32`` for ``bfloat16`` and for ``auto`` (with which vLLM's CPU build picks bfloat16 for a float32 or bfloat16
    checkpoint, on any x86 processor)."""
    if dtype in ("bfloat16", "auto") and native_bf16() is False:
        _note(f"a vLLM engine of dtype {dtype}")
        return "float32"
    return dtype
