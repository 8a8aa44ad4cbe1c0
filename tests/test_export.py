"""`export`: the tiny model round trip, with and without a LoRA adapter, and a composite Qwen3.5 base."""

from __future__ import annotations

import json

import pytest
import torch

from t2s.export.folder import ExportError, export_model, read_safetensors


def _logits(folder, text="SELECT name FROM customers"):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    ids = tok(text, return_tensors="pt")
    with torch.no_grad():
        return model(**ids).logits


def _stop_ids(tokenizer):
    return sorted(tokenizer.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>"))


def test_export_tiny_model_round_trip(tiny_model_dir, tiny_tokenizer, tmp_path, capsys):
    out = export_model(tiny_model_dir, tmp_path / "export")
    assert "no --recipe given: system_prompt.txt holds t2s's default exec_plan prompt" in capsys.readouterr().out
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["Qwen3_5ForCausalLM"]
    gen = json.loads((out / "generation_config.json").read_text())
    assert sorted(gen["eos_token_id"]) == _stop_ids(tiny_tokenizer)
    # a plain client samples as eval did: the card's figures' settings, not transformers' T 1.0
    assert (gen["do_sample"], gen["temperature"], gen["top_p"], gen["top_k"]) == (True, 0.6, 0.95, 20)
    from transformers import GenerationConfig

    loaded = GenerationConfig.from_pretrained(out)
    assert (loaded.temperature, loaded.top_p, loaded.top_k) == (0.6, 0.95, 20)
    assert (out / "chat_template.jinja").read_text() == (tiny_model_dir / "chat_template.jinja").read_text()
    assert (out / "tokenizer.json").is_file() and (out / "README.md").is_file()
    assert torch.allclose(_logits(out), _logits(tiny_model_dir), atol=1e-5)
    # weight names are the checkpoint's own
    assert set(read_safetensors(out)) == set(read_safetensors(tiny_model_dir))


def test_export_merges_lora_adapter(tiny_model_dir, tiny_tokenizer, tmp_path):
    from peft import LoraConfig, PeftModel, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    lora = get_peft_model(
        base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    )
    adapter_dir = tmp_path / "adapter"
    lora.save_pretrained(adapter_dir)
    assert json.loads((adapter_dir / "adapter_config.json").read_text())["base_model_name_or_path"]

    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("name: smoke\nlearning_rate: 1.0e-5\n")
    out = export_model(adapter_dir, tmp_path / "export", recipe=str(recipe))
    assert not (out / "adapter_config.json").exists()
    assert not any("lora" in name for name in read_safetensors(out))
    gen = json.loads((out / "generation_config.json").read_text())
    assert sorted(gen["eos_token_id"]) == _stop_ids(tiny_tokenizer)

    reference = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32), adapter_dir
    )
    ids = tiny_tokenizer("SELECT name FROM customers", return_tensors="pt")
    with torch.no_grad():
        expected = reference(**ids).logits
    merged = _logits(out)
    assert torch.allclose(merged, expected, atol=1e-4)
    assert not torch.allclose(merged, _logits(tiny_model_dir), atol=1e-4)  # the adapter changed something
    assert "learning_rate: 1.0e-5" in (out / "README.md").read_text()


def _composite_base(folder, vocab_size):
    """A tiny Qwen3_5ForConditionalGeneration with a vision tower and an extra MTP tensor, like the real checkpoint."""
    from safetensors.torch import load_file, save_file
    from transformers import Qwen3_5Config, Qwen3_5ForConditionalGeneration

    text = dict(vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                layer_types=["linear_attention", "full_attention"], num_attention_heads=4, num_key_value_heads=2,
                head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
                linear_value_head_dim=16, linear_conv_kernel_dim=4, tie_word_embeddings=True)
    vision = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64, patch_size=4,
                  spatial_merge_size=2, temporal_patch_size=2)
    torch.manual_seed(1)
    config = Qwen3_5Config(text_config=text, vision_config=vision, tie_word_embeddings=True)
    model = Qwen3_5ForConditionalGeneration(config)
    model.save_pretrained(folder)
    tensors = load_file(str(folder / "model.safetensors"))
    tensors["mtp.fc.weight"] = torch.randn(64, 128)
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    (folder / "preprocessor_config.json").write_text('{"processor_class": "Qwen3VLProcessor"}\n')
    return tensors


def test_export_keeps_composite_base_architecture(tiny_model_dir, tiny_tokenizer, tmp_path):
    from transformers import AutoModelForCausalLM

    base_dir = tmp_path / "base"
    base_tensors = _composite_base(base_dir, len(tiny_tokenizer))
    # training loads the base as the text-only CausalLM and changes its weights
    trained = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    assert type(trained).__name__ == "Qwen3_5ForCausalLM"
    with torch.no_grad():
        trained.model.layers[1].self_attn.q_proj.weight.add_(0.5)
    ckpt = tmp_path / "ckpt"
    trained.save_pretrained(ckpt)
    tiny_tokenizer.save_pretrained(ckpt)

    out = export_model(ckpt, tmp_path / "export", base=str(base_dir))
    assert json.loads((out / "config.json").read_text())["architectures"] == ["Qwen3_5ForConditionalGeneration"]
    assert (out / "preprocessor_config.json").is_file()
    exported = read_safetensors(out)
    assert set(exported) == set(base_tensors)  # the base's weight names, vision tower and MTP head included
    for name in base_tensors:
        if name.startswith("model.visual.") or name.startswith("mtp."):
            assert torch.equal(exported[name], base_tensors[name])
    q = "model.language_model.layers.1.self_attn.q_proj.weight"
    assert torch.allclose(exported[q], base_tensors[q] + 0.5)
    gen = json.loads((out / "generation_config.json").read_text())
    assert sorted(gen["eos_token_id"]) == _stop_ids(tiny_tokenizer)


def test_export_refuses_mismatched_base_and_bad_inputs(tiny_model_dir, tiny_tokenizer, tmp_path):
    base_dir = tmp_path / "base"
    _composite_base(base_dir, len(tiny_tokenizer) + 8)  # another vocabulary size: shapes disagree
    with pytest.raises(ExportError, match="shape"):
        export_model(tiny_model_dir, tmp_path / "export", base=str(base_dir), verify=False)
    with pytest.raises(ExportError, match="not found"):
        export_model(tmp_path / "nope", tmp_path / "export2")
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "x").write_text("x")
    with pytest.raises(ExportError, match="not empty"):
        export_model(tiny_model_dir, busy)


def test_export_cli_error_line(tmp_path, capsys):
    from t2s.commands import main

    assert main(["export", "--checkpoint", str(tmp_path / "missing"), "--output", str(tmp_path / "o")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("Error: checkpoint folder not found")


@pytest.mark.parametrize("name", ["config.json", "adapter_config.json"])
@pytest.mark.parametrize("content, problem", [
    (b"[1]", "is not a JSON object (it holds a JSON list)"),
    (b'"a model"', "is not a JSON object (it holds a JSON str)"),
    (b"{bad", "is not valid JSON: Expecting property name enclosed in double quotes"),
    (b"\xff\xfe{}", "is not valid JSON: not UTF-8 text"),
])
def test_a_model_config_that_is_not_a_json_object_is_one_error_line(tmp_path, capsys, name, content, problem):
    from t2s.commands import main

    checkpoint = tmp_path / "checkpoint"
    checkpoint.mkdir()
    (checkpoint / name).write_bytes(content)
    assert main(["export", "--checkpoint", str(checkpoint), "--output", str(tmp_path / "o"), "--no-verify"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"Error: cannot load the model {checkpoint}: {name} {problem}"]
    assert not (tmp_path / "o").exists()


def model_eval(model_dir, demo_dir, output, *modes, n=3) -> dict:
    """A short eval of ``model_dir`` (its weights recorded, as ``export --eval`` needs); returns {mode: summary}."""
    from t2s.evaluation.runner import evaluate
    from t2s.commands.eval import eval_config

    return evaluate(eval_config(
        ["--policy", "model", "--model", str(model_dir), "--data", str(demo_dir), "--n", str(n), "--mode",
         *(modes or ("full",)), "--max-turns", "1", "--max-tokens-per-turn", "8", "--output", str(output), "--quiet"]))


def test_export_model_card_holds_the_eval_summary(tiny_model_dir, demo_dir, tmp_path):
    summary = model_eval(tiny_model_dir, demo_dir, tmp_path / "eval")["full"]
    out = export_model(tiny_model_dir, tmp_path / "export", eval_dir=str(tmp_path / "eval"), verify=False)
    card = (out / "README.md").read_text()
    official = f"{summary['execution_accuracy_official']:.3f}"
    assert "## Evaluation" in card and f"| official EX | {official} |" in card and "Qwen3_5ForCausalLM" in card


def test_export_refuses_an_eval_of_other_weights(tiny_model_dir, demo_dir, tmp_path):
    """The card's figures must be this checkpoint's: an eval of other weights, or one that recorded none, is refused;
    an eval of an earlier export into the same folder is taken."""
    import shutil

    from t2s.evaluation.runner import evaluate
    from t2s.commands.eval import eval_config

    other = tmp_path / "other"
    shutil.copytree(tiny_model_dir, other)
    tensors = read_safetensors(other)
    name = sorted(tensors)[0]
    tensors[name] = tensors[name] + 1.0  # other weights, same architecture
    from safetensors.torch import save_file

    save_file(tensors, other / "model.safetensors", metadata={"format": "pt"})
    model_eval(other, demo_dir, tmp_path / "eval-other", n=1)
    with pytest.raises(ExportError, match="ran other weights than"):
        export_model(tiny_model_dir, tmp_path / "export", eval_dir=str(tmp_path / "eval-other"), verify=False)
    evaluate(eval_config(["--policy", "gold", "--data", str(demo_dir), "--n", "1",
                              "--output", str(tmp_path / "eval-gold"), "--quiet"]))
    with pytest.raises(ExportError, match="recorded no model weights"):
        export_model(tiny_model_dir, tmp_path / "export", eval_dir=str(tmp_path / "eval-gold"), verify=False)
    first = export_model(tiny_model_dir, tmp_path / "export", verify=False)
    model_eval(first, demo_dir, tmp_path / "eval-export", n=1)  # the exported folder, evaluated, then re-exported
    again = export_model(tiny_model_dir, tmp_path / "export", eval_dir=str(tmp_path / "eval-export"), verify=False,
                         force=True)
    assert "## Evaluation" in (again / "README.md").read_text()
    # an export of other weights into that folder, evaluated, does not vouch for this checkpoint
    export_model(other, tmp_path / "export", verify=False, force=True)
    model_eval(tmp_path / "export", demo_dir, tmp_path / "eval-export-other", n=1)
    with pytest.raises(ExportError, match="ran other weights than"):
        export_model(tiny_model_dir, tmp_path / "export", eval_dir=str(tmp_path / "eval-export-other"), verify=False,
                     force=True)


@pytest.mark.parametrize("relative", [False, True])
def test_export_model_card_names_no_local_path(tiny_model_dir, demo_dir, tmp_path, monkeypatch, relative):
    """An eval of a local model, named by an absolute or a relative path, and a run whose overrides hold paths (as
    ``--key value`` and ``--key=value``): the card names each by its last part only, and takes the run's own
    prompt settings."""
    import shutil

    from t2s.settings import RECIPES_DIR

    checkpoint = tmp_path / "runs" / "mine"
    shutil.copytree(tiny_model_dir, checkpoint)
    (checkpoint / "train_summary.json").write_text(json.dumps({"global_step": 1, "recipe": "demo.yaml", "overrides": [
        "--output_dir", str(checkpoint), f"--dataset_path={tmp_path / 'data' / 'train.json'}", "--dialect=sibling",
        "--model_name_or_path", "Qwen/Qwen3.5-2B"]}))
    monkeypatch.chdir(tmp_path)
    model = "runs/mine" if relative else str(checkpoint)
    model_eval(model, demo_dir, tmp_path / "eval", n=1)
    config = json.loads((tmp_path / "eval" / "full" / "eval_config.json").read_text())
    assert config["model"] == model  # the eval folder keeps where it came from
    out = export_model(checkpoint, tmp_path / "export", eval_dir=str(tmp_path / "eval"),
                       recipe=str(RECIPES_DIR / "demo.yaml"), verify=False)
    card = (out / "README.md").read_text()
    assert "target `mine`" in card and str(tmp_path) not in card and "runs/mine" not in card
    assert ("`--output_dir mine --dataset_path=train.json --dialect=sibling --model_name_or_path Qwen/Qwen3.5-2B`"
            in card)  # a hub id is not a local path
    args = [line for line in card.splitlines() if line.startswith("python -m t2s eval")][0]
    assert "--dialect sibling" in args  # the run's own --dialect, over the recipe's exec_plan


def test_export_model_card_takes_a_several_mode_eval_folder(tiny_model_dir, demo_dir, tmp_path):

    summaries = model_eval(tiny_model_dir, demo_dir, tmp_path / "eval", "full", "withheld")
    out = export_model(tiny_model_dir, tmp_path / "export", eval_dir=str(tmp_path / "eval"), verify=False)
    card = (out / "README.md").read_text()
    official = " | ".join(f"{summaries[m]['execution_accuracy_official']:.3f}" for m in ("full", "withheld"))
    assert "| metric | full | withheld |" in card and f"| official EX | {official} |" in card
    with pytest.raises(ExportError, match="no summary.json"):
        export_model(tiny_model_dir, tmp_path / "export2", eval_dir=str(tmp_path), verify=False)


def _hub_cached(model_dir, cache, repo_id, revision="0" * 40):
    """``model_dir`` laid out as the hub cache holds ``repo_id`` (found offline by snapshot_download)."""
    import shutil

    repo = cache / f"models--{repo_id.replace('/', '--')}"
    shutil.copytree(model_dir, repo / "snapshots" / revision)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(revision)


def test_export_model_card_metadata_and_usage_snippet(tiny_model_dir, demo_dir, tmp_path, monkeypatch):
    """The card's metadata parses back with ModelCard.load, and its usage commands parse with t2s's own CLI."""
    import shlex

    import huggingface_hub
    from huggingface_hub import ModelCard

    from t2s.commands import build_parser

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    _hub_cached(tiny_model_dir, tmp_path / "hub", "t2s-test/tiny-base")
    summary = model_eval(tiny_model_dir, demo_dir, tmp_path / "eval", n=4)["full"]
    out = export_model(tiny_model_dir, tmp_path / "export", base="t2s-test/tiny-base", eval_dir=str(tmp_path / "eval"),
                       repo_id="t2s-test/tiny-sql", verify=False)
    card = ModelCard.load(out / "README.md")
    assert card.data.base_model == "t2s-test/tiny-base" and card.data.library_name == "transformers"
    assert card.data.model_name == "t2s-test/tiny-sql"
    scores = {(r.task_name, r.metric_type): r.metric_value for r in card.data.eval_results}
    task = "agentic text-to-SQL (full schema, n=4)"
    assert scores == {(task, key): summary[key] for key in ("execution_accuracy_official", "strict", "soft_f1")}
    assert {r.dataset_name for r in card.data.eval_results} == {"demo/dev.json"}
    assert str(tmp_path) not in card.content and str(tiny_model_dir) not in card.content  # no local paths

    snippet = card.text.split("```bash\n", 1)[1].split("```", 1)[0]
    commands = [shlex.split(line) for line in snippet.strip().splitlines()]
    assert commands[0][:3] == ["vllm", "serve", "t2s-test/tiny-sql"]
    assert commands[1] == ["hf", "download", "t2s-test/tiny-sql", "system_prompt.txt", "--local-dir", "."]
    t2s_commands = [argv[3:] for argv in commands if argv[:3] == ["python", "-m", "t2s"]]
    assert [argv[0] for argv in t2s_commands] == ["eval", "ask"]
    for argv in t2s_commands:
        args = build_parser(argv[0]).parse_args(argv)  # the real parser: a missing required option exits
        assert args.endpoint == ["http://localhost:8000"]  # --endpoint repeats: a list of servers
        # the system prompt the model was trained with (no --recipe: t2s's own exec_plan prompt), in its tool set
        assert args.system_prompt_file == "system_prompt.txt"
        assert (args.dialect, args.tool_format) == ("exec_plan", "json")
    from t2s.env.protocol import default_system_prompt

    assert (out / "system_prompt.txt").read_text() == default_system_prompt() + "\n"

    # a base given as a local folder that is no hub snapshot: no base_model, and only the folder's name in the text
    local = export_model(tiny_model_dir, tmp_path / "local", base=str(tiny_model_dir), verify=False)
    card = ModelCard.load(local / "README.md")
    assert card.data.base_model is None and card.data.model_name == "local"
    assert f"a local folder, `{tiny_model_dir.name}`" in card.text and str(tiny_model_dir) not in card.content


def test_export_shards_with_huggingface_hub(tiny_model_dir, tiny_tokenizer, tmp_path, capsys):
    from t2s.commands import main

    out = export_model(tiny_model_dir, tmp_path / "export", max_shard_size="200KB")  # verified: reloads and generates
    shards = sorted(path.name for path in out.glob("*.safetensors"))
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert len(shards) >= 2 and shards == sorted(set(index["weight_map"].values()))
    assert all(name.startswith("model-") and name.endswith(f"-of-{len(shards):05d}.safetensors") for name in shards)
    assert set(index["weight_map"]) == set(read_safetensors(tiny_model_dir)) == set(read_safetensors(out))
    assert torch.allclose(_logits(out), _logits(tiny_model_dir), atol=1e-5)

    # a composite base keeps its names and architecture when sharded
    from transformers import AutoModelForCausalLM

    base_dir = tmp_path / "base"
    base_tensors = _composite_base(base_dir, len(tiny_tokenizer))
    ckpt = tmp_path / "ckpt"
    AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32).save_pretrained(ckpt)
    tiny_tokenizer.save_pretrained(ckpt)
    composite = export_model(ckpt, tmp_path / "composite", base=str(base_dir), max_shard_size="100KB", verify=False)
    assert json.loads((composite / "config.json").read_text())["architectures"] == ["Qwen3_5ForConditionalGeneration"]
    weight_map = json.loads((composite / "model.safetensors.index.json").read_text())["weight_map"]
    assert set(weight_map) == set(base_tensors) and len(set(weight_map.values())) >= 2

    # the CLI takes the size, and refuses one it cannot read
    assert main(["export", "--checkpoint", str(tiny_model_dir), "--output", str(tmp_path / "cli"), "--no-verify",
                 "--max-shard-size", "300KB"]) == 0
    assert len(list((tmp_path / "cli").glob("model-*.safetensors"))) >= 2
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        main(["export", "--checkpoint", str(tiny_model_dir), "--output", str(tmp_path / "bad"), "--max-shard-size",
              "lots"])
    assert exit_info.value.code == 2 and "is not a size" in capsys.readouterr().err


@pytest.mark.parametrize("recipe, dialect, tool_format", [("demo.yaml", "exec_plan", "json"),
                                                          ("demo_sft.yaml", "exec_plan", "json"),
                                                          ("bird_tools.yaml", "sibling", "native")])
def test_export_ships_the_recipes_system_prompt(tiny_model_dir, tmp_path, recipe, dialect, tool_format):
    """The card's eval and ask commands pass the system prompt the recipe trained with, and its tool set and format."""
    import shlex

    from t2s.commands import build_parser
    from t2s.env.protocol import default_system_prompt
    from t2s.evaluation.config import read_system_prompt
    from t2s.settings import RECIPES_DIR

    out = export_model(tiny_model_dir, tmp_path / "export", recipe=str(RECIPES_DIR / recipe), verify=False)
    expected = (read_system_prompt(RECIPES_DIR / "demo_system_prompt.txt") if recipe.startswith("demo")
                else default_system_prompt(dialect, tool_format))  # demo_sft.yaml's prompt: its rl_recipe's
    assert (out / "system_prompt.txt").read_text() == expected + "\n"
    snippet = (out / "README.md").read_text().split("```bash\n", 1)[1].split("```", 1)[0]
    for line in snippet.strip().splitlines():
        argv = shlex.split(line)
        if argv[:3] == ["python", "-m", "t2s"]:
            args = build_parser(argv[3]).parse_args(argv[3:])
            assert args.system_prompt_file == "system_prompt.txt"
            assert (args.dialect, args.tool_format) == (dialect, tool_format)


def test_export_finds_a_recipe_as_train_does(tiny_model_dir, tmp_path, monkeypatch):
    """``--recipe recipes/demo.yaml`` outside the checkout is the shipped recipe, as ``train --config`` finds it."""
    from t2s.evaluation.config import read_system_prompt
    from t2s.settings import RECIPES_DIR

    monkeypatch.chdir(tmp_path)
    assert not (tmp_path / "recipes").exists()
    out = export_model(tiny_model_dir, tmp_path / "export", recipe="recipes/demo.yaml", verify=False)
    assert (out / "system_prompt.txt").read_text() == read_system_prompt(RECIPES_DIR / "demo_system_prompt.txt") + "\n"
    with pytest.raises(ExportError, match="recipe file not found: recipes/nope.yaml"):
        export_model(tiny_model_dir, tmp_path / "export2", recipe="recipes/nope.yaml", verify=False)


def _with_config(model, **changes):
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, **changes}))


@pytest.mark.parametrize("damage, problem", [
    (lambda m: _with_config(m, vocab_size=2000), "cannot load the model"),  # at odds with the weights
    (lambda m: _with_config(m, vocab_size=-5), "cannot load the model"),
    (lambda m: _with_config(m, dtype=["bfloat16"]), "cannot load the model"),
    (lambda m: (m / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": 5})),
     "records a base model that is not a name: 5; pass --base"),
])
def test_a_model_folder_the_libraries_refuse_is_one_error_line_and_no_folder(tiny_model_dir, tmp_path, capsys,
                                                                               damage, problem):
    import shutil

    from t2s.commands import main

    checkpoint = tmp_path / "checkpoint"
    shutil.copytree(tiny_model_dir, checkpoint)
    damage(checkpoint)
    assert main(["export", "--checkpoint", str(checkpoint), "--output", str(tmp_path / "o"), "--no-verify"]) == 1
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("Error")]  # (an exception
    # would have left main: returning 1 is having caught it)
    assert len(err) == 1 and err[0].startswith("Error: ") and problem in err[0], err
    assert not (tmp_path / "o").exists()


def test_a_checkpoint_without_a_chat_template_is_refused_unloaded_and_exports_with_one_given(tiny_model_dir, tmp_path,
                                                                                               capsys, monkeypatch):
    """A model whose tokenizer has no chat template (a base model) is refused before its weights load, leaving no
    folder, with the advice export now takes: ``--chat-template FILE``, which the exported tokenizer then carries."""
    import shutil

    import transformers

    from t2s.commands import main

    checkpoint = tmp_path / "checkpoint"
    shutil.copytree(tiny_model_dir, checkpoint)
    template = (checkpoint / "chat_template.jinja").read_text()
    (checkpoint / "chat_template.jinja").unlink()
    config = json.loads((checkpoint / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (checkpoint / "tokenizer_config.json").write_text(json.dumps(config))
    loading = transformers.AutoModelForCausalLM.from_pretrained

    def refused_before(*args, **kwargs):
        raise AssertionError("the weights loaded before the chat template was checked")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", refused_before)
    assert main(["export", "--checkpoint", str(checkpoint), "--output", str(tmp_path / "o"), "--no-verify"]) == 1
    [line] = [line for line in capsys.readouterr().err.splitlines() if line.startswith("Error")]
    assert "no chat template" in line and "--chat-template FILE" in line, line
    assert not (tmp_path / "o").exists()
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", loading)
    given = tmp_path / "template.jinja"
    given.write_text(template)
    assert main(["export", "--checkpoint", str(checkpoint), "--output", str(tmp_path / "o"), "--no-verify",
                 "--chat-template", str(given)]) == 0, capsys.readouterr().err
    assert (tmp_path / "o" / "chat_template.jinja").read_text() == template
    assert main(["export", "--from-gguf", str(given), "--output", str(tmp_path / "g"), "--chat-template",
                 str(given)]) == 2  # a checkpoint's option: --from-gguf takes none
