"""``EvalConfig`` and ``PolicyConfig``: what ``eval``'s options become, built once, with each default declared once."""

from __future__ import annotations

import dataclasses

import pytest

from t2s.backends.base import SamplingSettings
from t2s.commands.eval import eval_config
from t2s.env.episode import EpisodeConfig
from t2s.errors import EvalError
from t2s.evaluation.config import EPISODE_OPTIONS, EvalConfig, PolicyConfig
from t2s.evaluation.options import EPISODE_LIMITS

BASE = ["--policy", "gold", "--data", "data/demo", "--output", "out"]


def test_the_command_lines_defaults_are_the_records_defaults():
    parsed = eval_config(BASE)
    built = EvalConfig(data="data/demo", output="out", policy=PolicyConfig(policy="gold"))
    assert parsed == built
    assert parsed.policy.episode == EpisodeConfig() and parsed.policy.sampling == SamplingSettings.evaluation(seed=0)


def test_every_episode_option_reaches_the_episode():
    values = {"max_turns": "3", "episode_token_budget": "9000", "max_tokens_per_turn": "300",
              "min_episode_tokens": "1000", "forced_turn_reserve": "100", "max_calls_per_turn": "2",
              "max_failed_queries": "1", "tool_timeout": "1.5", "episode_tool_seconds": "7"}
    assert set(values) == {name for name, _, _ in EPISODE_LIMITS} <= set(EPISODE_OPTIONS)
    argv = [*BASE, "--mode", "withheld", "single", "--dialect", "sibling", "--tool-format", "native",
            "--no-enable-thinking", "--temperature", "0", "--top-k", "0", "--seed", "5"]
    for name, value in values.items():
        argv += ["--" + name.replace("_", "-"), value]
    config = eval_config(argv)
    episode = config.policy.episode_for("single")
    assert episode.mode == "single" and config.policy.episode_for("withheld").mode == "withheld"
    for name, value in values.items():
        assert getattr(episode, name) == type(getattr(episode, name))(value), name
    assert (episode.dialect, episode.tool_format, episode.enable_thinking) == ("sibling", "native", False)
    assert config.policy.sampling == dataclasses.replace(SamplingSettings.evaluation(), temperature=0.0, top_k=0,
                                                         seed=5)
    assert config.modes == ("withheld", "single")


def test_the_tools_endpoint_plays_the_native_format_and_secrets_stay_out_of_the_repr():
    config = eval_config([*BASE[2:], "--policy", "endpoint", "--endpoint", "http://127.0.0.1:9", "--endpoint-mode",
                          "tools", "--api-key", "sk-secret-value"])
    assert config.policy.episode.tool_format == "native" and config.policy.endpoint.api_key == "sk-secret-value"
    assert "sk-secret-value" not in repr(config)
    assert eval_config(BASE).policy.episode.tool_format == "json"


@pytest.mark.parametrize("options,message", [
    ({"k": 0}, "--k must be from 1 to 1024, got 0"),
    ({"k": 100_000_000}, "--k must be from 1 to 1024, got 100000000"),  # jobs and records for every sample
    ({"engine": "postgres", "dsn": None}, "--engine postgres needs --dsn"),
    ({"episode_token_budget": 2048}, "--episode-token-budget 2048 cannot leave --min-episode-tokens"),
    ({"forced_turn_reserve": 99_999_999}, r"--forced-turn-reserve 99999999 leaves no tool turn to an episode that "
                                          r"starts with --min-episode-tokens \(2048\) of its budget; keep it below "
                                          "2047"),
    ({"system_prompt_file": "/nonexistent/prompt.txt"}, "prompt.txt"),
])
def test_a_config_no_episode_can_run_with_is_refused_as_it_is_built(options, message):
    with pytest.raises(EvalError, match=message):
        PolicyConfig.from_options({"policy": "gold", **options})


def test_repeated_modes_play_once_and_an_unknown_mode_is_refused():
    assert EvalConfig(data="d", output="o", modes=("full", "full", "withheld")).modes == ("full", "withheld")
    with pytest.raises(EvalError, match="unknown mode 'partial'"):
        EvalConfig(data="d", output="o", modes=("partial",))


def test_asks_unseeded_default_stays_unseeded():
    config = PolicyConfig.from_options({"policy": "model", "seed": None, "temperature": 0.7})
    assert config.seed is None and config.sampling.seed is None and config.sampling.temperature == 0.7


@pytest.mark.parametrize("url", ["notaurl", "localhost:8000", "ftp://host:21", "http://", "http://host:port",
                                 "http://[::1", "https://host:0", "me:s3cret@host:8000"])
def test_an_endpoint_that_is_not_a_server_url_is_refused_at_once(url, demo_dir, tmp_path, capsys):
    from t2s.commands import main
    from t2s.evaluation.config import EndpointConfig

    with pytest.raises(EvalError, match="is not a server URL such as http://localhost:8000"):
        EndpointConfig(urls=("http://127.0.0.1:9", url))
    code = main(["eval", "--policy", "endpoint", "--endpoint", url, "--tokenizer", str(tmp_path), "--data",
                 str(demo_dir), "--output", str(tmp_path / "out"), "--quiet"])
    shown = url if "@" not in url else "...@host:8000"  # never the user name and token before an @
    assert code == 1 and capsys.readouterr().err.strip().splitlines() == [
        f"Error: --endpoint {shown!r} is not a server URL such as http://localhost:8000"]
    assert EndpointConfig(urls=("http://127.0.0.1:9", "https://host.example/v1")).urls[1] == "https://host.example/v1"


@pytest.mark.parametrize("url", ["http://alice:s3cretTOKEN@127.0.0.1:8000", "https://s3cretTOKEN@host.example/v1"])
def test_an_endpoint_with_a_key_in_its_url_is_refused_before_any_file_records_it(url, demo_dir, tmp_path, capsys):
    """The URL lands in eval_config.json, summary.json, summary.md, report.html and error lines: a password in it
    would be in all of them. Refused at once, naming --api-key, never showing what precedes the @."""
    from t2s.commands import main

    code = main(["eval", "--policy", "endpoint", "--endpoint", url, "--endpoint-mode", "chat", "--data",
                 str(demo_dir), "--output", str(tmp_path / "out"), "--quiet"])
    err = capsys.readouterr().err
    assert code == 1 and "s3cretTOKEN" not in err and not (tmp_path / "out").exists()
    [line] = err.strip().splitlines()
    assert line.startswith("Error: --endpoint '...@") and "holds a user name or password" in line
    assert "--api-key" in line
