"""Length-grouped log-prob passes: ``length_groups`` and ``Text2SQLGRPOTrainer._get_per_token_logps_and_entropies``.

- ``length_groups`` finds the cheapest split of the length-sorted rows (checked against every split), within
  ``max_rows``, each row once, each group in the rows' order;
- on the tiny Qwen3.5 with real TRL passes, a batch with a few long completions runs in several forward calls, each
  cut after its rows' last real token, with fewer padded tokens; log-probs, entropies and the gradients of a loss built
  from them equal the whole-batch pass up to float summation order, and the cut columns are exactly 0, as TRL
  returns padding;
- a batch with nothing to gain runs TRL's pass itself, bit for bit; multimodal inputs go to TRL's pass unchanged.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from _train_script import build_trainer
from t2s.training.loss_math import length_groups

PROMPT_WIDTH = 7
PROMPT_LENGTHS = [7, 5, 6, 7, 3, 7, 6, 4, 7, 5, 7, 6]  # left padding, as TRL pads prompts
COMPLETION_LENGTHS = [10, 150, 12, 9, 11, 140, 13, 10, 90, 12, 8, 1]  # a few long episodes among short ones


def _split_cost(lengths, groups, overhead) -> int:
    return sum(len(group) * max(lengths[i] for i in group) + overhead for group in groups)


def _cheapest_split(lengths, max_rows, overhead) -> int:
    """The cost of the cheapest split of the length-sorted rows into contiguous groups, by trying every split."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    best = None
    for cuts in itertools.product([False, True], repeat=len(order) - 1):
        groups, current = [], [order[0]]
        for row, cut in zip(order[1:], cuts):
            if cut:
                groups.append(current)
                current = []
            current.append(row)
        groups.append(current)
        if max_rows is None or all(len(g) <= max_rows for g in groups):
            cost = _split_cost(lengths, groups, overhead)
            best = cost if best is None else min(best, cost)
    return best


@pytest.mark.parametrize("lengths, max_rows, overhead", [
    ([200, 523, 196, 201, 438, 190, 230, 225, 396, 192], None, 1024),
    ([200, 523, 196, 201, 438, 190, 230, 225, 396, 192], 3, 1024),
    ([30, 5, 5, 31, 90, 6, 60, 5, 29], None, 20),
    ([30, 5, 5, 31, 90, 6, 60, 5, 29], 2, 0),
    ([64] * 7, None, 1),
    ([1, 2, 3, 4, 5, 6, 7, 8, 9, 10], 4, 5),
])
def test_length_groups_is_the_cheapest_split_of_the_sorted_rows(lengths, max_rows, overhead):
    groups = length_groups(lengths, max_rows, overhead)
    assert sorted(i for group in groups for i in group) == list(range(len(lengths)))
    assert all(group == sorted(group) for group in groups), "each group keeps the rows' order"
    assert all(len(group) <= (max_rows or len(lengths)) for group in groups)
    assert _split_cost(lengths, groups, overhead) == _cheapest_split(lengths, max_rows, overhead)


def test_length_groups_sets_long_rows_apart_and_keeps_equal_rows_together():
    assert length_groups([10, 10, 500, 10, 10, 10], overhead=100) == [[0, 1, 3, 4, 5], [2]]
    assert length_groups([10, 10, 500, 10, 10, 10], overhead=10_000) == [[0, 1, 2, 3, 4, 5]]
    assert length_groups([40] * 5, overhead=0) == [[0, 1, 2, 3, 4]]
    assert length_groups([]) == []


# ---------------------------------------------------------------------------------------------------- the trainer


@pytest.fixture(scope="module")
def trainer(tiny_model_dir, tmp_path_factory):
    trainer, _ = build_trainer(tiny_model_dir, tmp_path_factory.mktemp("groups"))
    trainer.model.train()
    return trainer


def _batch(vocab: int, completion_lengths=COMPLETION_LENGTHS) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Left-padded prompts and right-padded completions, as TRL builds the log-prob passes' input."""
    generator = torch.Generator().manual_seed(0)
    width = max(completion_lengths)
    ids = torch.zeros(len(completion_lengths), PROMPT_WIDTH + width, dtype=torch.long)
    attention = torch.zeros_like(ids)
    for row, (prompt, completion) in enumerate(zip(PROMPT_LENGTHS, completion_lengths)):
        span = slice(PROMPT_WIDTH - prompt, PROMPT_WIDTH + completion)
        ids[row, span] = torch.randint(3, vocab, (prompt + completion,), generator=generator)
        attention[row, span] = 1
    return ids, attention, width


def _forward_shapes(trainer, monkeypatch) -> list[tuple[int, int, bool]]:
    """(rows, width, last column holds a real token) of each forward call the model gets."""
    calls = []
    forward = trainer.model.forward

    def spy(*args, **kwargs):
        calls.append((*kwargs["input_ids"].shape, bool(kwargs["attention_mask"][:, -1].any())))
        return forward(*args, **kwargs)

    monkeypatch.setattr(trainer.model, "forward", spy)
    return calls


def _pass_with_gradients(method, trainer, ids, attention, width, **kwargs):
    """log-probs, entropies and the parameter gradients of a loss built from both."""
    trainer.model.zero_grad(set_to_none=True)
    logps, entropies, _ = method(trainer.model, ids, attention, width, compute_entropy=True, **kwargs)
    mask = attention[:, -width:].float()
    weights = torch.linspace(-1.0, 1.0, width)
    loss = ((logps * weights + 0.3 * logps.exp() + 0.1 * entropies) * mask).sum() / 1024
    loss.backward()
    grads = {name: p.grad.clone() for name, p in trainer.model.named_parameters() if p.grad is not None}
    return logps.detach(), entropies.detach(), grads


def _trl_pass(trainer):
    from trl import GRPOTrainer

    return lambda *args, **kwargs: GRPOTrainer._get_per_token_logps_and_entropies(trainer, *args, **kwargs)


def _assert_same_up_to_summation_order(grouped, whole, attention, width):
    """Equal where real tokens are, exactly 0 at the cut columns (TRL's 0 at padding); gradients to float rounding:
    each parameter's gradient sums the rows in another order, as TRL's own ``batch_size`` chunks do."""
    padding = attention[:, -width:] == 0
    for got, expected in zip(grouped[:2], whole[:2]):
        assert torch.count_nonzero(got[padding]) == 0 and torch.count_nonzero(expected[padding]) == 0
        torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)
    assert grouped[2].keys() == whole[2].keys() and grouped[2]
    for name, grad in whole[2].items():
        assert grad.abs().max() > 0, name
        assert (grouped[2][name] - grad).abs().max() <= 1e-4 * grad.abs().max(), name


@pytest.mark.slow
def test_grouped_pass_cuts_padding_and_matches_the_whole_batch(trainer, monkeypatch):
    ids, attention, width = _batch(trainer.model.config.vocab_size)
    whole = _pass_with_gradients(_trl_pass(trainer), trainer, ids, attention, width)
    calls = _forward_shapes(trainer, monkeypatch)
    grouped = _pass_with_gradients(trainer._get_per_token_logps_and_entropies, trainer, ids, attention, width)
    assert len(calls) >= 2, calls
    assert sum(rows for rows, _, _ in calls) == ids.size(0)
    assert all(last_real for _, _, last_real in calls), "each group is cut right after its last real token"
    assert sum(rows * columns for rows, columns, _ in calls) < 0.5 * ids.numel(), calls
    _assert_same_up_to_summation_order(grouped, whole, attention, width)


@pytest.mark.slow
def test_groups_hold_at_most_batch_size_rows(trainer, monkeypatch):
    ids, attention, width = _batch(trainer.model.config.vocab_size)
    whole = _pass_with_gradients(_trl_pass(trainer), trainer, ids, attention, width, batch_size=3)
    calls = _forward_shapes(trainer, monkeypatch)
    grouped = _pass_with_gradients(trainer._get_per_token_logps_and_entropies, trainer, ids, attention, width,
                                   batch_size=3)
    assert all(rows <= 3 for rows, _, _ in calls) and sum(rows for rows, _, _ in calls) == ids.size(0)
    assert any(columns < ids.size(1) for _, columns, _ in calls), calls
    _assert_same_up_to_summation_order(grouped, whole, attention, width)


@pytest.mark.slow
def test_one_group_is_cut_to_its_rows_when_the_batch_is_wider(trainer, monkeypatch):
    """A micro-batch of a generation batch is padded to the generation batch's longest completion."""
    ids, attention, width = _batch(trainer.model.config.vocab_size)
    short = [row for row, length in enumerate(COMPLETION_LENGTHS) if length < 20]
    ids, attention = ids[short], attention[short]
    whole = _pass_with_gradients(_trl_pass(trainer), trainer, ids, attention, width)
    calls = _forward_shapes(trainer, monkeypatch)
    grouped = _pass_with_gradients(trainer._get_per_token_logps_and_entropies, trainer, ids, attention, width)
    assert calls == [(len(short), PROMPT_WIDTH + 13, True)]
    _assert_same_up_to_summation_order(grouped, whole, attention, width)


@pytest.mark.slow
def test_a_batch_with_nothing_to_cut_runs_trls_pass_bit_for_bit(trainer, monkeypatch):
    lengths = [18, 19, 20, 18, 19, 20, 18, 19, 20, 18, 19, 20]  # ragged by a few tokens, as in the stock-TRL oracle
    ids, attention, width = _batch(trainer.model.config.vocab_size, lengths)
    whole = _pass_with_gradients(_trl_pass(trainer), trainer, ids, attention, width)
    calls = _forward_shapes(trainer, monkeypatch)
    grouped = _pass_with_gradients(trainer._get_per_token_logps_and_entropies, trainer, ids, attention, width)
    assert calls == [(*ids.shape, True)]
    assert torch.equal(grouped[0], whole[0]) and torch.equal(grouped[1], whole[1])
    for name, grad in whole[2].items():
        assert torch.equal(grouped[2][name], grad), name


@pytest.mark.slow
def test_multimodal_inputs_go_to_trls_pass_unchanged(trainer, monkeypatch):
    from trl import GRPOTrainer

    seen = []

    def trl_pass(self, model, input_ids, attention_mask, logits_to_keep, **kwargs):
        seen.append((input_ids, logits_to_keep, kwargs))
        return torch.zeros(input_ids.size(0), logits_to_keep), None, None

    monkeypatch.setattr(GRPOTrainer, "_get_per_token_logps_and_entropies", trl_pass)
    ids, attention, width = _batch(trainer.model.config.vocab_size)
    token_types = torch.zeros_like(ids)
    trainer._get_per_token_logps_and_entropies(trainer.model, ids, attention, width, batch_size=4,
                                               token_type_ids=token_types)
    assert len(seen) == 1
    input_ids, keep, kwargs = seen[0]
    assert input_ids is ids and keep == width
    assert kwargs["token_type_ids"] is token_types and kwargs["batch_size"] == 4
