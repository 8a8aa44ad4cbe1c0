"""Numbers and paths that mean nothing are refused by the argument parser: one `Error:` line, exit status 2."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from t2s.commands import main
from t2s.settings import REPO_ROOT


def _eval(*extra, output="out"):
    return ["eval", "--policy", "gold", "--data", "data/demo", "--output", output, "--quiet", *extra]


BAD_ARGUMENTS = [
    (_eval("--batch-size", "-1"), "--batch-size"),
    (_eval("--n", "-1"), "--n"),
    (_eval("--k", "0"), "--k"),
    (_eval("--k", "100000000"), "--k"),  # a job list past the machine's memory
    (["data", "passrate", "--data", "data/demo", "--k", "1025"], "--k"),
    (_eval("--max-turns", "0"), "--max-turns"),
    (_eval("--episode-token-budget", "0"), "--episode-token-budget"),
    (_eval("--max-tokens-per-turn", "-5"), "--max-tokens-per-turn"),
    (_eval("--workers", "0"), "--workers"),
    (_eval("--top-p", "1.5"), "--top-p"),
    (_eval("--top-k", "-5"), "--top-k"),  # "0: off"; a negative one meant off too, silently
    (["ask", "--db", "x.sqlite", "--replay", "t.jsonl", "--top-k", "-1", "q"], "--top-k"),
    (_eval("--temperature", "nan"), "--temperature"),
    (_eval("--policy", "vllm", "--dtype", "None"), "--dtype"),
    (_eval(output=""), "--output"),
    (_eval(output="  "), "--output"),
    (["score", "--data", "d.json", "--predictions", "p.json", "--output", ""], "--output"),
    (["score", "--data", "d.json", "--predictions", "p.json", "--output", "o", "--workers", "0"], "--workers"),
    (["compare", "a", "b", "--output", ""], "--output"),
    (["ask", "--db", "x.sqlite", "--replay", "t.jsonl", "--max-turns", "0", "q"], "--max-turns"),
    (["data", "check", "--data", "data/demo", "--n", "-3"], "--n"),
    (["data", "check", "--data", "data/demo", "--n", "0"], "--n"),
    (["data", "passrate", "--data", "data/demo", "--min-solved", "-1"], "--min-solved"),
    (["data", "difficulty", "--data", "data/demo/dev.json", "--keep-target", "0"], "--keep-target"),
    (["bench", "env", "--data", "data/demo/dev.json", "--workers", "0"], "--workers"),
    (["export", "--checkpoint", "ck", "--output", ""], "--output"),
]


@pytest.mark.parametrize("argv, flag", BAD_ARGUMENTS, ids=[" ".join(a[:1] + [f]) + f" {i}" for i, (a, f) in
                                                           enumerate(BAD_ARGUMENTS)])
def test_meaningless_values_are_refused_at_the_parser(argv, flag, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(REPO_ROOT)
    with pytest.raises(SystemExit) as stopped:
        main(argv)
    assert stopped.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("Error: t2s ") and f"argument {flag}" in err[0]


def test_passrate_range_that_keeps_nothing_is_refused(demo_dir, tmp_path, capsys):
    out = tmp_path / "kept.json"
    for low, high in (("5", "1"), ("2", "9")):  # lowest above highest; highest above k
        code = main(["data", "passrate", "--data", str(demo_dir), "--min-solved", low, "--max-solved", high,
                     "--output", str(out)])
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and len(err) == 1 and err[0].startswith("Error:") and "--min-solved" in err[0]
    assert not out.exists()


def test_a_usage_error_through_the_command_line_is_one_line(tmp_path):
    done = subprocess.run([sys.executable, "-m", "t2s", *_eval("--n", "-1", output=str(tmp_path / "out"))],
                          capture_output=True, text=True, timeout=120, cwd=REPO_ROOT)
    assert done.returncode == 2
    assert done.stderr.strip() == "Error: t2s eval: argument --n: must be 0 or more, got -1 (see `t2s eval --help`)"
    assert not (tmp_path / "out").exists()


def test_the_types_themselves():
    from t2s.ui.args import non_empty_path, non_negative_int, positive_float, positive_int, unit_float

    assert positive_int("3") == 3 and non_negative_int("0") == 0 and positive_float("0.5") == 0.5
    assert unit_float("1") == 1.0 and non_empty_path("a/b") == "a/b"
    for function, text in ((positive_int, "0"), (positive_int, "1.5"), (non_negative_int, "-1"),
                           (positive_float, "0"), (positive_float, "inf"), (unit_float, "0"), (non_empty_path, "")):
        with pytest.raises(argparse.ArgumentTypeError):
            function(text)


@pytest.mark.parametrize("verb", ["train", "sft"])
def test_output_names_the_output_folder_for_recipe_commands_too(verb, tmp_path):
    """Every verb takes --output; train and sft also keep TRL's --output_dir, and both reach the recipe's output_dir."""
    from t2s.commands import build_parser

    for given in (["--output", "runs/a"], ["--output=runs/a"], ["--output_dir", "runs/a"]):
        args = build_parser(verb).parse_args([verb, "--config", "recipes/smoke.yaml", *given, "--max_steps", "1"])
        assert args.overrides[-2:] == ["--max_steps", "1"]
        assert args.overrides[:-2] in (["--output_dir", "runs/a"], ["--output_dir=runs/a"])
    if verb == "train":  # TRL's parser takes it: no "ambiguous option", and the run writes where --output says
        from t2s.training.configs import parse_recipe

        overrides = build_parser(verb).parse_args([verb, "--config", "x", "--output", str(tmp_path / "out")]).overrides
        _, training_args, _ = parse_recipe(["--config", "recipes/smoke.yaml", *overrides])
        assert training_args.output_dir == str(tmp_path / "out")
