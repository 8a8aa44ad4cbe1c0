"""`python -m t2s bench env`: the pinned workload runs end to end and prints its figures (no speed assertions here:
runs of one pass are not judged against the ratio target, and in-process runs set the target out of reach or to 0)."""

from __future__ import annotations

import json
import re
import subprocess
import sys

from t2s.env import databases
from t2s.bench.env import workload_turns
from t2s.data.loaders import load_json_rows
from t2s.env.schema import get_schema
from t2s.settings import REPO_ROOT

LAST_LINE = re.compile(r"^env_step_seconds=(\d+\.\d+) overhead_ratio=(\d+\.\d+)$")


def in_process(argv: list[str]) -> int:
    """``python -m t2s bench ARGV`` in this process (so a test may patch the benchmark's module)."""
    from t2s.commands import main

    return main(["bench", *argv])


def bench(*args):
    return subprocess.run([sys.executable, "-m", "t2s", "bench", "env", *map(str, args)], capture_output=True,
                          text=True, cwd=REPO_ROOT, timeout=300)


def test_workload_is_the_pinned_sequence(bird_superhero_dir):
    row = next(r for r in load_json_rows(bird_superhero_dir / "dev.json") if "JOIN" in r["gold_sql"].upper())
    schema = get_schema(databases.ref_from_row(row))
    turns = workload_turns(row, schema)
    calls = [json.loads(c) for turn in turns for c in turn]
    assert [c["tool"] for c in calls] == ["list_tables", "describe_table", "describe_table", "sample_rows",
                                           "distinct_values", "run_query", "run_query", "run_query", "submit_sql"]
    first = calls[1]["args"]["table_name"]
    from_table = re.search(r"\bFROM\s+(\w+)", row["gold_sql"], re.I).group(1)
    assert first.lower() == from_table.lower()  # the first table the gold SQL reads: its FROM, not the schema's first
    assert calls[3]["args"] == {"table_name": first, "limit": 5}
    assert calls[4]["args"]["limit"] == 20
    assert "TEXT" in schema.column_types(first)[calls[4]["args"]["column_name"]].upper()
    assert calls[5]["args"]["sql"].startswith("SELECT COUNT(*) FROM ")
    assert calls[6]["args"]["sql"].endswith(" LIMIT 5")
    assert calls[7]["args"]["sql"] == calls[8]["args"]["sql"] == row["gold_sql"]
    assert len(turns) <= 6 and all(len(t) <= 8 for t in turns)


def test_bench_env_on_superhero(bird_superhero_dir):
    out = bench("--data", bird_superhero_dir / "dev.json", "--workers", 2, "--repeats", 1)
    assert out.returncode == 0, out.stderr
    match = LAST_LINE.match(out.stdout.strip().splitlines()[-1])
    assert match, out.stdout
    assert float(match.group(1)) > 0 and float(match.group(2)) > 0
    assert "144/144" in out.stderr  # every gold episode scores, so the workload ran as pinned
    assert "Warning" not in out.stderr  # every timed pass ended as the recorded one


def test_bench_env_on_demo(demo_dir):
    out = bench("--data", demo_dir / "dev.json", "--workers", 1, "--repeats", 1)
    assert out.returncode == 0, out.stderr
    assert LAST_LINE.match(out.stdout.strip().splitlines()[-1])


def test_bench_env_bad_data(tmp_path):
    out = bench("--data", tmp_path / "missing.json")
    assert out.returncode != 0 and out.stderr.strip().startswith("Error:")
    assert "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1


def test_default_repeats_stop_after_the_minimum_once_the_time_budget_is_spent(demo_dir, monkeypatch, capsys):

    from t2s.bench import env

    monkeypatch.setattr(env, "REPEAT_SECONDS", 0.0)  # every pass counts as a slow one
    monkeypatch.setattr(env, "MAX_RATIO", float("inf"))  # whatever the machine's load
    assert in_process(["env", "--data", str(demo_dir / "dev.json"), "--workers", "1"]) == 0
    out = capsys.readouterr()
    assert f"best of {env.MIN_REPEATS}" in out.err
    assert LAST_LINE.match(out.out.strip().splitlines()[-1])
    assert in_process(["env", "--data", str(demo_dir / "dev.json"), "--workers", "1", "--repeats", "4"]) == 0
    assert "best of 4" in capsys.readouterr().err  # an explicit count is kept


def test_a_timed_pass_that_ends_otherwise_is_reported_not_fatal(demo_dir, monkeypatch, capsys):

    from t2s.bench import env

    original = env._env_pass

    def drifting(pool, workers, refs, episodes, config, recorder=None):
        seconds, results, statements = original(pool, workers, refs, episodes, config, recorder)
        if recorder is None:  # a timed pass: its first episode now scores otherwise
            record, score, log = results[0]
            results[0] = (record, {**score, "official": 1 - score["official"]}, log)
        return seconds, results, statements

    monkeypatch.setattr(env, "_env_pass", drifting)
    argv = ["--data", str(demo_dir / "dev.json"), "--workers", "1", "--repeats", "2"]
    assert in_process(["env", *argv]) == 0
    out = capsys.readouterr()
    assert "Warning: up to 1 of " in out.err and "episodes ended otherwise" in out.err
    assert LAST_LINE.match(out.out.strip().splitlines()[-1])


def test_the_sibling_in_native_calls_plays_the_same_workload(bird_superhero_dir):
    """bench env --dialect sibling --tool-format native: the same work through the sibling's tools and native calls,
    each one a call the episode reads and runs without error."""
    from t2s.env.episode import Episode, EpisodeConfig
    from t2s.rollout.text_policy import play
    from t2s.backends.scripted import ScriptPolicy

    row = next(r for r in load_json_rows(bird_superhero_dir / "dev.json") if "JOIN" in r["gold_sql"].upper())
    schema = get_schema(databases.ref_from_row(row))
    turns = workload_turns(row, schema, "sibling", "native")
    episode = play(Episode(row, EpisodeConfig(dialect="sibling", tool_format="native")), ScriptPolicy(turns))
    record = episode.record()
    assert [c["tool"] for t in record.turns for c in t["calls"]] == [
        "inspect_schema", "inspect_schema", "inspect_schema", "sample_rows", "run_sql", "run_sql", "run_sql", "run_sql",
        "submit"]
    assert record.counters["tool_errors"] == 0 and record.counters["format_deviations"] == 0
    assert record.final_sql == row["gold_sql"] and record.final_sql_source == "submitted"
    distinct = record.turns[0]["calls"][4]["args"]["sql"]
    assert "GROUP BY" in distinct and distinct.endswith("LIMIT 21")


def test_bench_env_takes_the_tool_set_and_format(demo_dir):
    result = bench("--data", demo_dir / "dev.json", "--repeats", "1", "--dialect", "sibling", "--tool-format", "native")
    assert result.returncode == 0, result.stderr
    assert LAST_LINE.match(result.stdout.strip().splitlines()[-1])


def test_a_ratio_above_the_target_exits_1_and_a_short_run_is_not_judged(demo_dir, monkeypatch, capsys):
    from t2s.bench import env

    monkeypatch.setattr(env, "MAX_RATIO", 0.0)  # every ratio is above it
    data = ["--data", str(demo_dir / "dev.json"), "--workers", "1"]
    assert in_process(["env", *data, "--repeats", str(env.MIN_REPEATS)]) == 1
    out = capsys.readouterr()
    assert "Error: the environment took " in out.err and "above the target of 0x" in out.err
    assert LAST_LINE.match(out.out.strip().splitlines()[-1])  # the figures are printed all the same
    assert in_process(["env", *data, "--repeats", "1"]) == 0
    out = capsys.readouterr()
    assert "not judged: the best of 1 pass(es)" in out.err and "Error" not in out.err
    assert LAST_LINE.match(out.out.strip().splitlines()[-1])


def test_a_workload_where_no_gold_episode_scores_exits_1(demo_dir, tmp_path, monkeypatch, capsys):
    """Databases that open but hold none of the gold SQL's tables: the figures time errors, not the workload."""
    import contextlib
    import sqlite3

    from t2s.bench import env

    monkeypatch.setattr(env, "MAX_RATIO", 0.0)  # above the target too: the gold's failure is the one error
    for db in ("cycling_club", "village_library"):
        (tmp_path / db).mkdir()
        with contextlib.closing(sqlite3.connect(tmp_path / db / f"{db}.sqlite")) as connection:
            connection.execute("CREATE TABLE unrelated (a INTEGER)")
    assert in_process(["env", "--data", str(demo_dir / "dev.json"), "--db-root", str(tmp_path), "--workers", "1",
                       "--repeats", "1"]) == 1
    out = capsys.readouterr()
    assert [line for line in out.err.splitlines() if line.startswith("Error:")] == [
        f"Error: none of the {env.QUESTIONS * env.ROLLOUTS} gold episodes scored correct (gold EX "
        f"0/{env.QUESTIONS * env.ROLLOUTS}), so the timed workload is not the gold's; check --data and --db-root"]
    assert LAST_LINE.match(out.out.strip().splitlines()[-1])  # the figures are printed all the same
