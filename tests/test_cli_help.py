"""A CLI that explains itself: every option of every command has help text and shows its default, one vocabulary
across commands, and `train --help` lists every recipe key with its help and default, grouped as the recipes are."""

from __future__ import annotations

import argparse
import re
import subprocess
import sys

import pytest

from t2s.commands import available_commands, build_parser, main
from t2s.ui.args import DefaultsHelpFormatter

COMMON_SPELLINGS = {"--n", "--quiet", "--max-turns", "--output"}
RETIRED = {"--limit", "--eval-n", "--episodes", "--no-progress", "--max_turns"}


def command_parsers():
    """(name, parser) of every command and sub-command."""
    found = []

    def walk(parser, name):
        found.append((name, parser))
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub_name, sub in action.choices.items():
                    walk(sub, f"{name} {sub_name}".strip())

    for name in available_commands():
        walk(next(a for a in build_parser(name)._actions if isinstance(a, argparse._SubParsersAction)).choices[name],
             name)
    return found


def test_every_option_has_help_and_a_shown_default():
    missing = []
    for name, parser in command_parsers():
        formatter = DefaultsHelpFormatter(name)
        for action in parser._actions:
            if not action.option_strings or action.help == argparse.SUPPRESS or action.dest == "help":
                continue
            shown = formatter._get_help_string(action)
            if not (action.help or "").strip() or (not action.required and "default" not in shown.lower()):
                missing.append(f"{name} {'/'.join(action.option_strings)}")
    assert not missing, missing


def test_one_vocabulary_across_commands():
    listed = {}
    for name, parser in command_parsers():
        for action in parser._actions:
            if action.help != argparse.SUPPRESS:
                for flag in action.option_strings:
                    listed.setdefault(flag, []).append(name)
    assert not RETIRED & set(listed), {flag: listed[flag] for flag in RETIRED & set(listed)}
    assert {"eval", "data check", "data passrate", "bench rollout"} <= set(listed["--n"])
    assert {"eval", "score", "data passrate"} <= set(listed["--quiet"])
    assert {"eval", "ask", "data passrate"} <= set(listed["--max-turns"])
    outputs = {name: next(a.help for a in parser._actions if "--output" in a.option_strings)
               for name, parser in command_parsers() if any("--output" in a.option_strings for a in parser._actions)}
    assert {"eval", "score", "compare", "export", "data check", "data difficulty", "data passrate"} <= set(outputs)
    assert all("folder" in text for text in outputs.values()), outputs  # --output is always a folder


def test_a_data_output_that_is_a_file_is_bad_usage(demo_dir, tmp_path, capsys):
    taken = tmp_path / "kept.json"
    taken.write_text("[]")
    assert main(["data", "passrate", "--data", str(demo_dir), "--policy", "gold", "--k", "2", "--n", "2",
                 "--output", str(taken), "--quiet"]) == 2
    printed = capsys.readouterr()
    assert printed.err.strip().splitlines() == [
        f"Error: --output is a folder (it gets passrate_kept.json); {taken} is a file"]
    assert "pass rate" not in printed.out  # refused before any episode was played
    assert taken.read_text() == "[]"


def test_old_spellings_still_parse(demo_dir, tmp_path, capsys):
    assert main(["data", "check", "--data", str(demo_dir), "--limit", "2", "--no-cache"]) == 0
    assert "--limit" not in build_parser("data").format_help()
    args = build_parser("score").parse_args(["score", "--data", "d", "--predictions", "p", "--output", "o",
                                             "--no-progress"])
    assert args.quiet is True


def test_the_help_shows_defaults():
    text = subprocess.run([sys.executable, "-m", "t2s", "eval", "--help"], capture_output=True, text=True,
                          timeout=120).stdout
    flat = " ".join(text.split())
    assert "--max-turns MAX_TURNS tool turns before the forced final turn (default: 6)" in flat
    assert "--quiet no progress bar (default: off)" in flat
    assert "--enable-thinking, --no-enable-thinking render prompts with thinking on (default: on)" in flat


def test_train_help_lists_every_recipe_key_grouped_as_the_recipes():
    from t2s.training.recipe_help import recipe_groups, train_recipes

    done = subprocess.run([sys.executable, "-m", "t2s", "train", "--help"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    text = done.stdout
    groups = recipe_groups()
    assert list(groups)[:4] == ["model", "data", "algorithm", "optimiser"]
    headings = [text.index(f"\n{group}:\n") for group in groups]
    assert headings == sorted(headings)
    keys = set()
    for recipe in train_recipes():  # the warm-start recipes are `t2s sft`'s
        keys |= {m.group(1) for m in re.finditer(r"^([a-z_0-9]+):", recipe.read_text(), re.M)}
    for key in keys:
        entry = re.search(rf"^  --{key.replace('_', '-')} \(default: [^\n]*\)\n {{6}}\S", text, re.M)
        assert entry, key
    assert "  --max-turns (default: 6)\n" in text and "  --learning-rate (default: " in text


def test_train_help_lists_every_key_t2s_adds_also_where_no_recipe_sets_it():
    import dataclasses

    from trl import GRPOConfig

    from t2s.training.configs import T2SGRPOConfig, T2SScriptArguments
    from t2s.training.recipe_help import OWN_KEYS_GROUP, recipe_groups

    inherited = {f.name for f in dataclasses.fields(GRPOConfig)}
    own = {f.name for f in dataclasses.fields(T2SGRPOConfig)} - inherited
    own |= {f.name for f in dataclasses.fields(T2SScriptArguments)}
    text = _help("train")
    for key in own:
        assert re.search(rf"^  --{key.replace('_', '-')} \(default: [^\n]*\)\n {{6}}\S", text, re.M), key
    listed = {key for keys in recipe_groups().values() for key in keys}
    unset = sorted(own - listed)
    assert "chat_template" in unset and "engine" in unset  # keys a user sets, that no shipped recipe does
    section = text[text.index(f"\n{OWN_KEYS_GROUP}:\n"):]
    assert all(f"  --{key.replace('_', '-')} (default: " in section for key in unset)


@pytest.mark.parametrize("argv, code", [
    (["eval", "--policy", "gold"], 2),  # bad usage: a required option missing
    (["eval", "--policy", "gold", "--data", "no/such/data.json", "--output", "x"], 1),  # bad input
])
def test_exit_codes(argv, code, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) if code == 2 else _nothing():
        assert main(argv) == code
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("Error:")


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


HEAVY = ("torch", "transformers", "trl", "vllm")


def test_no_help_imports_torch():
    """`--help` of every command, `train` included (its recipe keys are read from the dataclasses' source), and of
    the top level imports no torch, transformers, trl or vLLM: help answers at once."""
    script = (
        "import sys\nfrom t2s.commands import available_commands, main\n"
        "for argv in [[]] + [[name, '--help'] for name in available_commands()]:\n"
        "    try:\n        main(argv or ['--help'])\n    except SystemExit:\n        pass\n"
        f"    heavy = [m for m in {HEAVY!r} if m in sys.modules]\n"
        "    if heavy:\n        sys.exit(f'{argv}: imported {heavy}')\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "recipe keys:" in done.stdout and "warm-start keys:" in done.stdout


def test_recipe_keys_read_from_source_are_the_dataclasses():
    import dataclasses

    from trl import ModelConfig

    from t2s.training.configs import T2SGRPOConfig, T2SScriptArguments
    from t2s.training.recipe_help import recipe_fields, recipe_groups

    imported = {}
    for kind in (ModelConfig, T2SGRPOConfig, T2SScriptArguments):
        imported.update({f.name: f for f in dataclasses.fields(kind)})
    read = recipe_fields()
    keys = [key for group in recipe_groups().values() for key in group]
    assert len(keys) > 50
    for key in keys:
        spec = imported[key]
        default = (spec.default if spec.default is not dataclasses.MISSING
                   else spec.default_factory() if spec.default_factory is not dataclasses.MISSING else None)
        assert str(read[key][0]) == str(default), key
        assert " ".join(read[key][1].split()) == " ".join(str(spec.metadata.get("help") or "").split()), key


def test_train_help_groups_and_names():
    from t2s.training.recipe_help import recipe_groups

    groups = list(recipe_groups())
    # headings, never a recipe's comment on one ("environment: one short turn", "algorithm (GRPO)")
    assert groups[:5] == ["model", "data", "algorithm", "optimiser", "environment"]
    assert {"rollout backend and hardware", "logging and checkpoints"} <= set(groups)
    assert len(groups) == len(set(groups)) and not any(":" in g or "(" in g for g in groups), groups
    text = _help("train")
    data_commands = {name.split()[1] for name, _ in command_parsers() if name.startswith("data ")}
    named = set(re.findall(r"t2s data ([a-z-]+)", text))
    assert named and named <= data_commands, named  # `t2s data passrate`, never a command that does not exist


def _help(*argv) -> str:
    done = subprocess.run([sys.executable, "-m", "t2s", *argv, "--help"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_recipe_examples_are_the_commands_own():
    from t2s.settings import REPO_ROOT

    for command, warm_start in (("train", False), ("sft", True)):
        text = " ".join(_help(command).split())
        named = re.findall(r"recipes/[a-z_]+\.yaml", re.search(r"--config CONFIG recipe YAML \(([^)]*)\)", text)[1])
        assert len(named) >= 2, (command, named)
        for recipe in named:
            assert ("rl_recipe:" in (REPO_ROOT / recipe).read_text()) is warm_start, (command, recipe)


def test_every_benchmark_is_named_in_the_help():
    from t2s.commands.bench import BENCHMARKS

    for text in (_help(), _help("bench")):
        line = re.sub(r"(\w)- (\w)", r"\1-\2", " ".join(text.split()))  # argparse may wrap a line after a hyphen
        bench = line[line.index("bench"):]
        for name in BENCHMARKS:
            assert name in bench.split("options:")[0], (name, bench)


def test_defaults_are_written_one_way():
    """"(default: X)" everywhere; never "(default X)"."""
    odd = []
    for name, parser in command_parsers():
        for action in parser._actions:
            text = DefaultsHelpFormatter(name)._get_help_string(action) or ""
            if action.help != argparse.SUPPRESS and re.search(r"\bdefault(?!:)\s", text, re.I) and "(default" in text:
                odd.append(f"{name} {action.option_strings}: {text}")
    assert not odd, odd


def test_version_says_which_t2s_runs_and_from_where():
    """``--version``: the version and the folder the package runs from (and the checkout's commit in a checkout)."""
    from t2s.settings import PACKAGE_DIR

    done = subprocess.run([sys.executable, "-m", "t2s", "--version"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    line = done.stdout.strip()
    assert re.fullmatch(rf"t2s \d+\.\d+\.\d+ from {re.escape(str(PACKAGE_DIR))}( \(git [0-9a-f]{{4,}}(-dirty)?\))?",
                        line), line
    assert "git " in line or not (PACKAGE_DIR.parent / ".git").exists()


def test_top_level_help_names_every_engine_ask_opens():
    text = build_parser().format_help()
    assert "any SQLite file" not in text
    assert "SQLite or DuckDB file or a PostgreSQL database" in " ".join(text.split())
