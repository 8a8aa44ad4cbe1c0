"""The chat format read from a model's template (t2s.env.chat_format): the tiny Qwen3.5 reads as before, byte for
byte; the real SmolLM2 and Gemma 3 tokenizers read as their families write; and on every tokenizer the raw token
stream a rollout builds decodes to what the model's own template renders for the same messages, with the model's
tokens (env_mask 1) exactly the assistant turns."""

from __future__ import annotations

import copy

import pytest

from t2s.rollout.text_policy import TextPolicies
from t2s.env.chat_format import ChatFormatError, apply_chat_template_file, chat_format
from t2s.env.episode import Episode, EpisodeConfig
from t2s.errors import FileError
from t2s.rollout.driver import Rollout
from t2s.settings import shipped

GEMMA_TEMPLATE = shipped("recipes/chat_templates/gemma3.jinja")
CHATML_NO_THINK = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
                   "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
NO_SYSTEM = ("{% for m in messages %}{% if m.role == 'system' %}{{ raise_exception('System role not supported') }}"
             "{% endif %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
             "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def _with_template(tokenizer, template: str):
    other = copy.deepcopy(tokenizer)
    other.chat_template = template
    return other


def test_the_tiny_qwen_template_reads_as_the_chatml_it_always_was(tiny_tokenizer):
    fmt = chat_format(tiny_tokenizer)
    assert (fmt.end_of_turn, fmt.stop_tokens) == ("<|im_end|>", ("<|im_end|>", "<|endoftext|>"))
    assert fmt.stop_ids == tuple(tiny_tokenizer.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"]))
    assert fmt.thinking and fmt.system_role and fmt.native_tools and fmt.notes == ()
    assert fmt.user_head == {True: "\n<|im_start|>user\n", False: "\n<|im_start|>user\n"}
    assert fmt.user_tail == {True: "<|im_end|>\n<|im_start|>assistant\n<think>\n",
                             False: "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"}
    assert chat_format(tiny_tokenizer) is fmt  # read once


def test_a_template_without_a_think_block_means_no_thinking(tiny_tokenizer):
    fmt = chat_format(_with_template(tiny_tokenizer, CHATML_NO_THINK))
    assert not fmt.thinking and fmt.thinking_for(True) is False
    assert any("opens no think block" in note for note in fmt.notes)
    assert fmt.episode_config(EpisodeConfig(enable_thinking=True)).enable_thinking is False
    assert fmt.user_tail[False] == "<|im_end|>\n<|im_start|>assistant\n"
    with pytest.raises(ChatFormatError, match="tool_format: json"):  # no native calls in this template
        fmt.episode_config(EpisodeConfig(tool_format="native"))


def test_a_template_without_a_system_role_gets_the_system_prompt_in_the_first_user_turn(tiny_tokenizer):
    tokenizer = _with_template(tiny_tokenizer, NO_SYSTEM)
    fmt = chat_format(tokenizer)
    assert not fmt.system_role and any("no system role" in note for note in fmt.notes)
    folded = fmt.fold_system([{"role": "system", "content": "Rules."}, {"role": "user", "content": "Q?"}])
    assert folded == [{"role": "user", "content": "Rules.\n\nQ?"}]
    from t2s.env.protocol import generation_prompt_ids

    text = tokenizer.decode(generation_prompt_ids(tokenizer, [{"role": "system", "content": "Rules."},
                                                              {"role": "user", "content": "Q?"}]))
    assert text == "<|im_start|>user\nRules.\n\nQ?<|im_end|>\n<|im_start|>assistant\n"


def test_no_template_is_a_clear_error_naming_the_fix(tiny_tokenizer, tmp_path):
    bare = _with_template(tiny_tokenizer, None)
    with pytest.raises(ChatFormatError, match="no chat template.*--chat-template FILE.*chat_template: FILE"):
        chat_format(bare)
    path = tmp_path / "chatml.jinja"
    path.write_text(CHATML_NO_THINK)
    assert chat_format(apply_chat_template_file(bare, path)).end_of_turn == "<|im_end|>"
    (tmp_path / "empty.jinja").write_text(" \n")
    with pytest.raises(FileError, match="^Error: chat template file is empty: "):
        apply_chat_template_file(bare, tmp_path / "empty.jinja")
    with pytest.raises(FileError, match="^Error: chat template file not found: "):
        apply_chat_template_file(bare, tmp_path / "missing.jinja")


# ---------------------------------------------------------------------------------------------- the stream invariant
def _scripted(texts):
    turns = iter(texts)
    return lambda _episode: next(turns, '{"tool": "submit_sql", "args": {"sql": "SELECT 1"}}')


def _stream(tokenizer, row, texts, config):
    backend = TextPolicies([_scripted(texts)], tokenizer, schedule="turnsync")
    trace = Rollout(backend, tokenizer, config, score=False).run([row])[0]
    assert trace.error is None
    return trace


def assert_stream_is_the_template(tokenizer, row, texts, config):
    """The raw stream decodes to the template's rendering of the same messages; env_mask 1 covers exactly the
    assistant turns (each closed by the end of turn)."""
    fmt = chat_format(tokenizer)
    trace = _stream(tokenizer, row, texts, config)
    decode = lambda ids: tokenizer.decode(ids, skip_special_tokens=False)  # noqa: E731
    messages = fmt.fold_system(Episode(row, fmt.episode_config(config)).messages)
    for turn in trace.record.turns:
        messages.append({"role": "assistant", "content": turn["assistant"]})
        if turn["observation"]:
            messages.append({"role": "user", "content": turn["observation"]})
    rendered = tokenizer.apply_chat_template(messages, tokenize=False, enable_thinking=False)
    streamed = decode(trace.prompt_ids + trace.completion_ids)
    assert rendered.startswith(streamed) and rendered[len(streamed):].strip() == ""
    model_runs, run = [], []
    for tid, mask in zip(trace.completion_ids, trace.env_mask):
        if mask:
            run.append(tid)
        elif run:
            model_runs.append(run)
            run = []
    model_runs += [run] if run else []
    assert [decode(r) for r in model_runs] == [t["assistant"] + fmt.end_of_turn for t in trace.record.turns]
    return trace


def test_the_stream_is_the_template_on_a_no_think_chatml_template(tiny_tokenizer, demo_dir):
    from t2s.data.loaders import load_json_rows

    row = load_json_rows(demo_dir / "dev.json")[0]
    tokenizer = _with_template(tiny_tokenizer, CHATML_NO_THINK)
    texts = ['{"tool": "list_tables", "args": {}}', '{"tool": "submit_sql", "args": {"sql": "SELECT 1"}}']
    trace = assert_stream_is_the_template(tokenizer, row, texts, EpisodeConfig(max_turns=3))
    assert len(trace.record.turns) == 2


# ------------------------------------------------------------------------------------------------- real tokenizers
@pytest.fixture(scope="module")
def smollm2_tokenizer(smollm2_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2_dir)


@pytest.fixture(scope="module")
def gemma3_tokenizer(gemma3_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(gemma3_dir)


def test_smollm2_stops_on_its_end_of_turn_not_on_the_eos_its_gguf_names(smollm2_tokenizer):
    assert smollm2_tokenizer.eos_token == "<|im_start|>"  # the GGUF conversion's trap
    fmt = chat_format(smollm2_tokenizer)
    assert fmt.end_of_turn == "<|im_end|>" and fmt.stop_tokens == ("<|im_end|>",)
    assert fmt.stop_ids == (smollm2_tokenizer.convert_tokens_to_ids("<|im_end|>"),)
    assert any("<|im_start|>" in note and "opens turns" in note for note in fmt.notes)
    assert not fmt.thinking and fmt.system_role and not fmt.native_tools


def test_gemma3_base_has_no_template_until_one_is_given(gemma3_tokenizer):
    turn = gemma3_tokenizer("<start_of_turn>user\nhi<end_of_turn>", add_special_tokens=False)["input_ids"]
    assert turn[0] == 105 and turn[-1] == 106  # the GGUF's control tokens are whole tokens, with the file's ids
    bare = copy.deepcopy(gemma3_tokenizer)
    bare.chat_template = None
    with pytest.raises(ChatFormatError, match="--chat-template"):
        chat_format(bare)
    fmt = chat_format(apply_chat_template_file(bare, GEMMA_TEMPLATE))
    assert fmt.end_of_turn == "<end_of_turn>" and fmt.stop_tokens[0] == "<end_of_turn>"
    assert "<start_of_turn>" not in fmt.stop_tokens and not fmt.thinking
    assert fmt.user_head[False] == "\n<start_of_turn>user\n"
    assert fmt.user_tail[False] == "<end_of_turn>\n<start_of_turn>model\n"


@pytest.mark.parametrize("family", ["smollm2", "gemma3"])
def test_the_stream_is_the_template_on_real_tokenizers(family, request, demo_dir):
    from t2s.data.loaders import load_json_rows

    tokenizer = request.getfixturevalue(f"{family}_tokenizer")
    if family == "gemma3":
        tokenizer = apply_chat_template_file(copy.deepcopy(tokenizer), GEMMA_TEMPLATE)
    row = load_json_rows(demo_dir / "dev.json")[1]
    texts = ['{"tool": "list_tables", "args": {}}',
             'Let me look.\n{"tool": "run_query", "args": {"sql": "SELECT COUNT(*) FROM sqlite_master"}}',
             '{"tool": "submit_sql", "args": {"sql": "SELECT 1"}}']
    trace = assert_stream_is_the_template(tokenizer, row, texts, EpisodeConfig(max_turns=4))
    assert len(trace.record.turns) == 3 and trace.record.stop_reason == "submitted"


def test_a_template_without_a_generation_prompt_is_refused(tiny_tokenizer):
    """Every prompt t2s renders ends in the generation prompt that opens the model's turn: without it the model
    writes on inside the user's turn, and training rewards whatever that gives."""
    no_prompt = CHATML_NO_THINK.split("{% if add_generation_prompt %}")[0]
    with pytest.raises(ChatFormatError, match="renders no generation prompt .*--chat-template FILE"):
        chat_format(_with_template(tiny_tokenizer, no_prompt))
    assert not chat_format(_with_template(tiny_tokenizer, CHATML_NO_THINK)).thinking  # with it: read as before


def test_a_template_that_loops_is_refused_in_seconds_and_an_outer_timer_keeps_its_time(tiny_tokenizer, monkeypatch):
    """99,999 x 99,999 iterations hung start-up with no output (train, sft, export and eval read the format first):
    refused after RENDER_SECONDS. A timer already running (pytest-timeout's) is left with the time it had, less the
    time spent."""
    import signal
    import time

    from t2s.env import chat_format as module

    monkeypatch.setattr(module, "RENDER_SECONDS", 0.5)
    looping = "{% for i in range(99999) %}{% for j in range(99999) %}{% endfor %}{% endfor %}" + CHATML_NO_THINK
    fired = []
    previous = signal.signal(signal.SIGALRM, lambda *args: fired.append(args))
    before = signal.setitimer(signal.ITIMER_REAL, 60.0)
    try:
        started = time.monotonic()
        with pytest.raises(ChatFormatError, match=r"takes more than 0\.5 s to render a plain conversation \(a loop"):
            chat_format(_with_template(tiny_tokenizer, looping))
        spent = time.monotonic() - started
        remaining, _ = signal.getitimer(signal.ITIMER_REAL)
        assert spent < 10 and 60.0 - spent - 1 < remaining <= 60.0 - spent + 0.1 and not fired
        assert chat_format(_with_template(tiny_tokenizer, CHATML_NO_THINK)).end_of_turn == "<|im_end|>"
        # an outer timer due first fires once, its handler runs, and the render goes on under the time it has left
        signal.setitimer(signal.ITIMER_REAL, 0.2)
        monkeypatch.setattr(module, "RENDER_SECONDS", 5.0)
        # a slow, finite template: about 0.2 s a render here, well inside RENDER_SECONDS
        slow = "{% for i in range(3000) %}{% for j in range(1000) %}{% endfor %}{% endfor %}" + CHATML_NO_THINK
        started = time.monotonic()
        assert chat_format(_with_template(tiny_tokenizer, slow)).end_of_turn == "<|im_end|>"
        time.sleep(0.3)  # had the outer timer been set again, it would fire here a second time
        assert time.monotonic() - started > 0.2  # the render ran past the outer timer, which fired once only
        assert len(fired) == 1 and signal.getitimer(signal.ITIMER_REAL)[0] == 0
    finally:
        signal.setitimer(signal.ITIMER_REAL, *before)
        signal.signal(signal.SIGALRM, previous)
