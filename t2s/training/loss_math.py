"""The trainer's arithmetic, free of TRL: the KL controller's proportional step, the k3 estimator, and the
length groups the log-prob passes run in."""

from __future__ import annotations

import math

import torch


ERROR_BAND = 0.2  # the controller's proportional error is clipped to ±0.2
GROUP_OVERHEAD_TOKENS = 1024  # a forward call's fixed cost in padded tokens, for length_groups: tiny groups don't pay


def kl_controller_update(beta: float, kl: float, n: int, *, target: float, horizon: float, beta_min: float,
                         beta_max: float) -> float:
    """One proportional-controller step: ``β · (1 + clip(KL/target − 1, ±0.2) · n / horizon)``, clamped."""
    if not math.isfinite(kl):
        return beta
    error = min(max(kl / target - 1.0, -ERROR_BAND), ERROR_BAND)
    return min(max(beta * (1.0 + error * n / horizon), beta_min), beta_max)


def k3(ref_logps: torch.Tensor, logps: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimator of KL(π_θ ‖ π_ref): ``exp(ref − logp) − (ref − logp) − 1``."""
    delta = ref_logps - logps
    return torch.exp(delta) - delta - 1.0


def length_groups(lengths: list[int], max_rows: int | None = None,
                  overhead: int = GROUP_OVERHEAD_TOKENS) -> list[list[int]]:
    """Rows split into groups of similar length, each in its original order, for the log-prob passes.

    Over the rows sorted by length, a dynamic programme picks contiguous groups of at most ``max_rows`` (no limit when
    None) minimising Σ (rows × longest length) + ``overhead`` per group: the tokens the forward passes really process,
    padding included, plus a fixed cost per call. One group holding every row means no grouping.
    """
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    limit = max_rows or len(order) or 1
    best = [0] + [math.inf] * len(order)  # best[j]: the cost of the j shortest rows
    start_of = [0] * (len(order) + 1)
    for end in range(1, len(order) + 1):
        width = lengths[order[end - 1]]
        for start in range(max(0, end - limit), end):
            cost = best[start] + (end - start) * width + overhead
            if cost < best[end]:
                best[end], start_of[end] = cost, start
    groups, end = [], len(order)
    while end > 0:
        groups.append(sorted(order[start_of[end]:end]))
        end = start_of[end]
    return groups[::-1]


def original_order(order: list[int], device=None) -> torch.Tensor:
    """Indices that put rows computed in ``order`` (a permutation of the batch's rows) back in the batch's order."""
    computed = torch.tensor(order, dtype=torch.long)
    return torch.empty_like(computed).scatter_(0, computed, torch.arange(len(order))).to(device)
