"""A model folder is untrusted input: a damaged one (the tiny model's, copied and broken) gives one clear ``Error:``
line, never a traceback, a hang or a silently wrong value. Covers what t2s reads of the folder itself (the
generation config's eos ids, config.json's vocab_size, the chat template's turns) and what ``train`` and ``sft`` say
when transformers cannot load the weights."""

from __future__ import annotations

import json
import os
import shutil
import threading

import pytest

from t2s.env.chat_format import ChatFormatError, chat_format
from t2s.settings import RECIPES_DIR, REPO_ROOT

CONTENT_WITHOUT_PROMPT = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{% if not add_generation_prompt %}"
                          "{{ m.content }}{% endif %}<|im_end|>\n{% endfor %}"
                          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
NO_END_WITH_PROMPT = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
                      "{% if not add_generation_prompt %}<|im_end|>{% endif %}\n{% endfor %}"
                      "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
NO_ASSISTANT_END_WITH_PROMPT = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
                                "{% if not (add_generation_prompt and m.role == 'assistant') %}<|im_end|>{% endif %}"
                                "\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def _copy(tiny_model_dir, tmp_path):
    folder = tmp_path / "model"
    shutil.copytree(tiny_model_dir, folder)
    return folder


def _edit_json(path, **changes):
    value = json.loads(path.read_text())
    value.update(changes)
    path.write_text(json.dumps(value))


def _format(folder):
    from transformers import AutoTokenizer

    return chat_format(AutoTokenizer.from_pretrained(folder))


def _within(seconds: float, call, release=None):
    """``call()``'s result or exception, failing the test when it has not returned after ``seconds`` (``release``
    then unblocks it, so that no thread is left waiting)."""
    box = {}

    def run():
        try:
            box["value"] = call()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            box["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        if release is not None:
            release()
        thread.join(seconds)
        pytest.fail(f"still reading the model folder after {seconds}s")
    if "error" in box:
        raise box["error"]
    return box["value"]


def test_the_undamaged_copy_reads_as_the_tiny_model(tiny_model_dir, tmp_path):
    fmt = _format(_copy(tiny_model_dir, tmp_path))
    assert fmt.stop_tokens == ("<|im_end|>", "<|endoftext|>") and fmt.stop_ids == (2, 0)


@pytest.mark.parametrize("eos", [-1, 2**63, [-1, 781, 2**63], [781, 10**6, -(2**70)]])
def test_generation_eos_ids_that_are_no_token_are_left_out(tiny_model_dir, tmp_path, eos):
    """An eos id outside ``0..len(tokenizer)-1`` names no token: left out as an eos the tokenizer does not know, the
    others kept (781: the added token ``</tool_response>``)."""
    folder = _copy(tiny_model_dir, tmp_path)
    _edit_json(folder / "generation_config.json", eos_token_id=eos)
    fmt = _format(folder)
    kept = (781,) if isinstance(eos, list) else ()
    assert fmt.stop_ids == (2, 0, *kept)
    assert fmt.stop_tokens[:2] == ("<|im_end|>", "<|endoftext|>") and len(fmt.stop_tokens) == 2 + len(kept)


@pytest.mark.parametrize("template, message", [
    (CONTENT_WITHOUT_PROMPT, "does not render an assistant message's content with add_generation_prompt=True"),
    (NO_END_WITH_PROMPT, "does not end an assistant turn with <|im_end|> with add_generation_prompt=True"),
    (NO_ASSISTANT_END_WITH_PROMPT, "does not end an assistant turn with <|im_end|> with add_generation_prompt=True"),
])
def test_a_template_that_renders_turns_otherwise_with_a_generation_prompt_is_refused(tiny_model_dir, tmp_path,
                                                                                    template, message):
    folder = _copy(tiny_model_dir, tmp_path)
    (folder / "chat_template.jinja").write_text(template)
    with pytest.raises(ChatFormatError, match="--chat-template FILE") as excinfo:
        _format(folder)
    text = str(excinfo.value)
    assert text.startswith("Error: the chat template of ") and message in text and "\n" not in text


def test_a_generation_config_that_is_no_regular_file_is_refused_unread(tiny_model_dir, tmp_path):
    """A FIFO would wait for a writer forever, /dev/zero never ends: neither is opened."""
    from transformers import AutoTokenizer

    folder = _copy(tiny_model_dir, tmp_path)
    config = folder / "generation_config.json"
    config.unlink()
    os.mkfifo(config)
    tokenizer = AutoTokenizer.from_pretrained(folder)

    def release():  # a reader waiting on the FIFO sees its end
        os.close(os.open(config, os.O_WRONLY | os.O_NONBLOCK))

    with pytest.raises(ChatFormatError, match=r"^Error: generation_config\.json of .* is not a regular file"):
        _within(30, lambda: chat_format(tokenizer), release)
    config.unlink()
    config.symlink_to("/dev/zero")  # only once the FIFO is refused unopened: read, it would fill the memory
    with pytest.raises(ChatFormatError, match=r"^Error: generation_config\.json of .* is not a regular file"):
        _format(folder)


def test_a_generation_config_over_one_mib_is_refused(tiny_model_dir, tmp_path):
    folder = _copy(tiny_model_dir, tmp_path)
    config = folder / "generation_config.json"
    config.write_text(json.dumps({"eos_token_id": 781}) + " " * (1 << 20))
    with pytest.raises(ChatFormatError, match=r"^Error: generation_config\.json of .* is larger than 1 MiB"):
        _format(folder)
    config.write_text(json.dumps({"eos_token_id": 781}) + " " * ((1 << 20) - 100))  # just under: read
    assert _format(folder).stop_ids == (2, 0, 781)


@pytest.mark.parametrize("where", ["top", "text_config"])
def test_a_stop_token_past_the_models_embedding_is_refused(tiny_model_dir, tmp_path, where):
    """A tokenizer with a token the weights have no row for, which the template ends turns with: the environment
    would write it into the stream and the model index past its embedding."""
    from transformers import AutoTokenizer

    folder = _copy(tiny_model_dir, tmp_path)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    rows = len(tokenizer)
    tokenizer.add_tokens(["<|turn_end|>"], special_tokens=True)
    tokenizer.chat_template = NO_END_WITH_PROMPT.replace("{% if not add_generation_prompt %}<|im_end|>{% endif %}",
                                                         "<|turn_end|>")
    tokenizer.save_pretrained(folder)
    config = json.loads((folder / "config.json").read_text())
    assert config["vocab_size"] == rows
    if where == "text_config":
        config["text_config"] = {"vocab_size": config.pop("vocab_size")}
        (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ChatFormatError) as excinfo:
        _format(folder)
    assert str(excinfo.value).startswith(f"Error: the stop token <|turn_end|> of {folder} (id {rows}) is past the "
                                         f"model's embedding (config.json vocab_size {rows})")
    _edit_json(folder / "config.json", vocab_size=rows + 1)  # a row for it: read
    assert _format(folder).end_of_turn == "<|turn_end|>"


def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("Error:")]
    assert len(lines) == 1 and "Traceback" not in err, err[-3000:]
    return lines[0]


@pytest.mark.parametrize("vocab_size", [-5, 5000])
def test_train_on_weights_that_do_not_match_config_vocab_size_is_one_error_line(tiny_model_dir, demo_dir, tmp_path,
                                                                                capsys, vocab_size):
    from t2s.commands import main

    folder = _copy(tiny_model_dir, tmp_path)
    _edit_json(folder / "config.json", vocab_size=vocab_size)
    code = main(["train", "--config", str(RECIPES_DIR / "smoke.yaml"), "--model_name_or_path", str(folder),
                 "--build_tiny_model", "false", "--output_dir", str(tmp_path / "out")])
    line = _one_error_line(capsys)
    assert code == 2 and line.startswith(f"Error: cannot load the model {folder}: ")
    assert ("negative dimension -5" if vocab_size < 0 else "ignore_mismatched_sizes") in line
    assert not list((tmp_path / "out").glob("checkpoint-*"))


def test_sft_on_a_negative_config_vocab_size_is_one_error_line(tiny_model_dir, demo_dir, tmp_path, capsys,
                                                               monkeypatch):
    from t2s.commands import main

    monkeypatch.chdir(REPO_ROOT)  # the recipe's rl_recipe is a checkout path
    folder = _copy(tiny_model_dir, tmp_path)
    _edit_json(folder / "config.json", vocab_size=-5)
    code = main(["sft", "--config", str(RECIPES_DIR / "sft_warmstart.yaml"), "--model_name_or_path", str(folder),
                 "--rl_recipe", "recipes/demo.yaml", "--gold_style", "submit", "--dtype", "float32", "--bf16",
                 "false", "--use_cpu", "true", "--max_length", "4096", "--output_dir", str(tmp_path / "out")])
    line = _one_error_line(capsys)
    assert code == 2 and line.startswith(f"Error: cannot load the model {folder}: ")
    assert "negative dimension -5" in line
    assert not (tmp_path / "out" / "config.json").exists()


def test_several_named_chat_templates_are_refused_naming_them(tiny_model_dir):
    """transformers renders "tool_use" when a request declares tools and "default" otherwise: a format read from
    one would not be what the other renders, so t2s asks for the one template to train and serve with."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    template = tokenizer.chat_template
    tokenizer.chat_template = {"default": template, "tool_use": template}
    with pytest.raises(ChatFormatError, match=r"several named chat templates \(default, tool_use\).*--chat-template"):
        chat_format(tokenizer)


@pytest.mark.parametrize("eos, token", [(5, "'!'"), (4, "'</think>'")])
def test_an_eos_that_is_text_or_a_think_tag_is_left_out_with_a_note(tiny_model_dir, tmp_path, eos, token):
    """A generation config naming an ordinary token (``!``) or a think tag as its eos would stop every turn there:
    the stop tokens stay the template's, and the note says why."""
    folder = _copy(tiny_model_dir, tmp_path)
    _edit_json(folder / "generation_config.json", eos_token_id=[2, eos])
    fmt = _format(folder)
    assert fmt.stop_ids == (2, 0) and fmt.stop_tokens == ("<|im_end|>", "<|endoftext|>")
    assert any(f"names {token} as an eos token, but it is no special token" in note for note in fmt.notes), fmt.notes


def test_only_a_config_at_odds_with_its_weights_is_blamed_on_the_model():
    """An out-of-memory error, a missing implementation or a bug raised while the weights load keeps its traceback:
    only the errors of a config.json at odds with its weights become the one line naming the folder."""
    import torch

    from t2s.errors import ConfigError
    from t2s.training.checkpoints import loading_model

    with pytest.raises(ConfigError, match="^Error: cannot load the model m: Trying to create tensor with negative"):
        with loading_model("m"):
            raise RuntimeError("Trying to create tensor with negative dimension -5: [-5, 64]")
    for error in (torch.OutOfMemoryError("CUDA out of memory"), NotImplementedError("no kernel"),
                  RuntimeError("an unrelated failure")):
        with pytest.raises(type(error)):
            with loading_model("m"):
                raise error
