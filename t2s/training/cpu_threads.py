"""How many threads a CPU run gives torch, chosen in one place for ``demo``, ``bench learn``, ``sft``, ``train`` and the
transformers policy of ``eval`` and ``ask``; and how every ``t2s`` command's OpenMP threads wait.

On a CPU, torch's OpenMP pool defaults to one thread per core and **spins** while it waits at each parallel region. On
a small machine with other work running, a spinning thread that lost its core holds every region up: a tiny model's
thousands of small ops per step then run 10-20 times slower (``make demo``: 121-244 s against 13 s). Spinning is the
culprit, not the thread count: with ``OMP_WAIT_POLICY=PASSIVE`` a waiting thread sleeps, and a pool as wide as the
usable cores is the fastest choice both idle and loaded. On 2 cores, 20 steps of the demo warm start took 13 s on two
passive threads against 23 s on one when idle, 24 s against 23 s beside one busy process, and 40 s against 50 s
beside three (two spinning threads: 77 s). So a CPU run gives torch's intra-op pool every usable core, one inter-op
thread (nothing here runs torch ops concurrently), and asks OpenMP to sleep, not spin, while it waits. The rollout's
tool threads block in SQLite or the GIL, run between generation rounds, and need no cores of their own. Evaluation
spins the same way when left alone: ``eval --policy model`` on SmolLM2 (two BIRD questions, both modes) took 110 s
beside one busy process with torch's defaults and 63 s with passive waiting (44 s on the idle machine).

An explicit ``OMP_NUM_THREADS`` or ``T2S_TORCH_THREADS`` in the environment wins.

On a CPU, transformers also warns once per function that Qwen3.5's linear-attention layers fall back from the
``causal_conv1d`` and ``flash-linear-attention`` kernels to their PyTorch reference (four warnings in a training run),
though those kernels need a GPU and could not apply: ``quiet_kernel_fallbacks`` says it in one line instead.

``score_labelled_positions_only``: on a CPU, GRPO's log-prob passes and the warm start's loss project only the
completion through the LM head.
"""

from __future__ import annotations

import os


def usable_cores() -> int:
    """Cores this process may run on (its CPU affinity), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not Linux
        return max(1, os.cpu_count() or 1)


def torch_threads() -> int:
    """The intra-op thread count for a CPU run: ``T2S_TORCH_THREADS``, else ``OMP_NUM_THREADS``, else the usable
    cores."""
    for name in ("T2S_TORCH_THREADS", "OMP_NUM_THREADS"):
        value = os.environ.get(name, "").strip()
        if value.isdigit() and int(value) > 0:
            return int(value)
    return usable_cores()


def sleep_while_waiting() -> None:
    """Ask OpenMP to put a waiting thread to sleep rather than spin (``OMP_WAIT_POLICY=PASSIVE``), unless the
    environment already chose. It takes effect only in a process that has not imported torch yet: every ``t2s``
    command calls it first (``t2s.commands.main``), so that evaluation, ``ask`` and the pass-rate filter wait the way
    training does."""
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def configure_cpu_threads(on_cpu: bool | None = None) -> int | None:
    """Set torch's thread pools for a CPU run; returns the intra-op thread count, or None when the run is not on a CPU.

    ``on_cpu`` None means "when no GPU is visible". Call it first, before torch is imported: ``OMP_WAIT_POLICY`` only
    takes effect then (a GPU run's few CPU ops lose nothing by sleeping instead of spinning either).
    """
    sleep_while_waiting()
    import torch

    if on_cpu is None:
        on_cpu = not torch.cuda.is_available()
    if not on_cpu:
        return None

    quiet_kernel_fallbacks()
    threads = torch_threads()
    torch.set_num_threads(threads)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:  # already set, or inter-op work already started: the pool keeps its size
        pass
    return threads


KERNEL_FALLBACK = "is falling back to its reference PyTorch implementation"
KERNEL_FALLBACK_LINE = ("CPU run: Qwen3.5's linear-attention layers use their PyTorch reference (the causal_conv1d and "
                        "flash-linear-attention kernels need a GPU)")
HUB_KERNELS_LOGGER = "transformers.integrations.hub_kernels"


class _KernelFallbackLine:
    """A logging filter: drops transformers' kernel-fallback warnings, and prints ``KERNEL_FALLBACK_LINE`` on stderr
    for the first of them in the process.

    The line is printed here, not handed on as a log record: with ``CI`` set, transformers' logger also propagates to
    the root logger, so a record would be printed once by each handler.
    """

    said = False  # once per process, however many filters or handlers a run has

    def filter(self, record) -> bool:
        if KERNEL_FALLBACK not in str(record.msg):
            return True
        if not _KernelFallbackLine.said:
            _KernelFallbackLine.said = True
            from t2s.ui.console import print_line

            print_line(KERNEL_FALLBACK_LINE, stderr=True)
        return False


def quiet_kernel_fallbacks() -> None:
    """For a run on a CPU: one line instead of transformers' kernel-fallback warnings (``_KernelFallbackLine``).
    Other warnings pass."""
    import logging

    logger = logging.getLogger(HUB_KERNELS_LOGGER)
    if not any(isinstance(f, _KernelFallbackLine) for f in logger.filters):
        logger.addFilter(_KernelFallbackLine())


def score_labelled_positions_only() -> None:
    """On a CPU, project only the positions that have a label through the LM head, as TRL does on CUDA.

    TRL 1.16's fused LM head (``trl.trainer.utils.add_fused_lm_head``, used by every log-prob pass of GRPO and by
    ``SFTTrainer``'s loss) scores only the labelled positions (the completion) where Triton runs; elsewhere it projects
    every position, the prompt's included, and masks the prompt's afterwards, so that the tile shapes never change on
    devices that recompile for a new shape. A CPU does not recompile, and there the wasted projection is most of a
    step for a large vocabulary: Gemma 3's 262k tokens over a 950-token withheld prompt and a 150-token completion.
    The per-token values are the same rows' values either way (``tests/test_trainer_loss.py`` checks it). This widens
    TRL's choice to the CPU; other devices keep TRL's own. Idempotent.
    """
    import trl.trainer.utils as trl_utils

    choose = getattr(trl_utils, "_use_triton", None)
    if choose is None or getattr(choose, "cpu_compact", False):
        return

    def compact(device) -> bool:
        return device.type == "cpu" or choose(device)

    compact.cpu_compact = True
    trl_utils._use_triton = compact
