"""Evaluation across several servers of one model (``--endpoint A --endpoint B``, ``t2s.backends.server_pool``): the
episodes spread over the servers, each episode stays on one server, and a server that dies mid-eval has its turns
taken by the others, with every episode written exactly once and the summary a clean run's."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from t2s.commands.eval import eval_config
from t2s.evaluation.runner import evaluate
from tests.fake_vllm import CompletionsGoodAgent, FakeVLLMServer, refused_url

FIGURES = ("n", "execution_accuracy_official", "strict", "submit_rate", "mean_turns", "stop_reasons")


def gold_by_question(data_dir: Path) -> dict[str, str]:
    return {r["question"]: r["SQL"] for r in json.loads((data_dir / "dev.json").read_text())}


def episodes(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "full" / "episodes.jsonl").read_text().splitlines() if line]


def run(tiny_model_dir, demo_dir, output, *urls, mode="completions", extra=()):
    argv = ["--policy", "endpoint", "--model", tiny_model_dir, "--data", demo_dir, "--n", "12", "--endpoint-mode",
            mode, "--retries", "1", "--backoff", "0.01", "--output", output, "--quiet", *extra]
    for url in urls:
        argv += ["--endpoint", url]
    return evaluate(eval_config(argv))["full"]


def test_several_endpoints_are_one_option_and_recorded(tiny_model_dir, demo_dir, tmp_path):
    config = eval_config(["--policy", "endpoint", "--endpoint", "http://a:1", "--endpoint", "http://b:2,http://c:3",
                          "--endpoint", "http://a:1", "--data", demo_dir, "--output", tmp_path])
    assert config.policy.endpoint.urls == ("http://a:1", "http://b:2", "http://c:3")


@pytest.mark.parametrize("mode", ["completions", "tools"])
def test_two_servers_share_the_episodes_and_score_as_one(tiny_model_dir, tiny_tokenizer, demo_dir, tmp_path, mode):
    from tests.test_tools_endpoint import gold_replies

    gold = gold_by_question(demo_dir)
    agent = CompletionsGoodAgent(tiny_tokenizer, gold)
    reply = gold_replies(gold) if mode == "tools" else ("Thinking.", "The answer.")
    extra = ["--dialect", "sibling"] if mode == "tools" else []
    with FakeVLLMServer(agent, chat_reply=reply) as one:
        alone = run(tiny_model_dir, demo_dir, tmp_path / "one", one.base_url, mode=mode, extra=extra)
    with FakeVLLMServer(agent, chat_reply=reply) as a, FakeVLLMServer(agent, chat_reply=reply) as b:
        both = run(tiny_model_dir, demo_dir, tmp_path / "two", a.base_url, b.base_url, mode=mode, extra=extra)
    served = {server.base_url: [tuple(r["prompt"]) for r in server.requests] + server.chat_requests
              for server in (a, b)}
    assert all(served.values()) and {k: both[k] for k in FIGURES} == {k: alone[k] for k in FIGURES}
    assert alone["execution_accuracy_official"] == 1.0 and alone["mean_turns"] == 2.0
    assert both["config"]["endpoints"] == [a.base_url, b.base_url] and "endpoints" not in alone["config"]
    if mode == "completions":  # an episode keeps its server: a later turn's prompt extends one sent to that server
        every = [p for prompts in served.values() for p in prompts]
        for prompts in served.values():
            for prompt in prompts:
                earlier = [q for q in every if len(q) < len(prompt) and prompt[: len(q)] == q]
                assert not earlier or any(q in prompts for q in earlier)


def test_a_server_killed_mid_eval_loses_no_episode(tiny_model_dir, tiny_tokenizer, demo_dir, tmp_path, capsys):
    agent = CompletionsGoodAgent(tiny_tokenizer, gold_by_question(demo_dir))
    with FakeVLLMServer(agent) as one:
        clean = run(tiny_model_dir, demo_dir, tmp_path / "clean", one.base_url, extra=["--concurrency", "2"])
    survivor, doomed = FakeVLLMServer(agent), FakeVLLMServer(agent)
    with survivor, doomed:
        def kill_after_some_turns():
            deadline = time.monotonic() + 60
            while len(doomed.requests) < 4 and time.monotonic() < deadline:
                time.sleep(0.005)
            doomed.__exit__(None, None, None)  # the server goes away: new connections are refused

        killer = threading.Thread(target=kill_after_some_turns)
        killer.start()
        summary = run(tiny_model_dir, demo_dir, tmp_path / "killed", survivor.base_url, doomed.base_url,
                      extra=["--concurrency", "2"])
        killer.join()
    assert len(doomed.requests) >= 4 and survivor.requests
    lines = episodes(tmp_path / "killed")
    assert sorted(line["question_id"] for line in lines) == sorted(line["question_id"] for line in
                                                                   episodes(tmp_path / "clean"))
    assert len({line["question_id"] for line in lines}) == len(lines) == 12  # each written once
    assert {k: summary[k] for k in FIGURES} == {k: clean[k] for k in FIGURES}
    err = capsys.readouterr().err
    assert err.count(f"Warning: the server at {doomed.base_url} is left out") == 1


def test_with_every_server_gone_the_eval_fails_with_one_line(tiny_model_dir, demo_dir, tmp_path):
    from t2s.errors import EvalError

    with pytest.raises(EvalError, match="is the server running"):
        run(tiny_model_dir, demo_dir, tmp_path / "none", refused_url(), refused_url())


@pytest.mark.parametrize("mode", ["completions", "tools"])
def test_a_server_answering_nonsense_is_left_out_and_its_turns_go_to_the_other(tiny_model_dir, tiny_tokenizer,
                                                                               demo_dir, tmp_path, capsys, mode):
    """A 200 that is no answer (a proxy's page, another API) is the server's fault, as a refused connection is: the
    turn goes to the other server, so the run scores as a clean one instead of failing those episodes (completions)
    or stopping (tools)."""
    from tests.test_tools_endpoint import gold_replies

    gold = gold_by_question(demo_dir)
    agent = CompletionsGoodAgent(tiny_tokenizer, gold)
    reply = gold_replies(gold) if mode == "tools" else ("Thinking.", "The answer.")
    extra = ["--dialect", "sibling"] if mode == "tools" else []
    def served(server) -> int:
        return len(server.requests) + len(server.chat_requests)

    with FakeVLLMServer(agent, chat_reply=reply) as one:
        clean = run(tiny_model_dir, demo_dir, tmp_path / "clean", one.base_url, mode=mode, extra=extra)
    with FakeVLLMServer(agent, chat_reply=reply, faults=["garbage"] * 1000) as bad, \
            FakeVLLMServer(agent, chat_reply=reply) as good:
        summary = run(tiny_model_dir, demo_dir, tmp_path / "mixed", bad.base_url, good.base_url, mode=mode,
                      extra=extra)
    # the nonsense server got the requests routed before its first answer, then none; the other played every turn
    assert served(bad) >= 1 and served(good) == served(one)
    lines = episodes(tmp_path / "mixed")
    assert len({line["question_id"] for line in lines}) == len(lines) == 12
    assert {k: summary[k] for k in FIGURES} == {k: clean[k] for k in FIGURES}
    assert clean["execution_accuracy_official"] == 1.0
    err = capsys.readouterr().err
    assert err.count(f"Warning: the server at {bad.base_url} is left out") == 1, err


def test_one_request_no_server_answers_usably_fails_alone_and_takes_no_server_down():
    """An unusable answer moves the turn to another server; a server is left out only after three in a row. So a
    request that every server answers with nonsense fails on its own, and the next is played as usual."""
    from t2s.backends.base import SamplingSettings, TurnOutput
    from t2s.backends.http_retry import UnusableAnswer
    from t2s.backends.server_pool import UNUSABLE_IN_A_ROW, ServerPool

    class Stub:
        stop_token_ids = (0,)

        def __init__(self, url, broken=()):
            self.base_url, self.broken, self.seen = url, set(broken), []

        async def arequest_turn(self, prompt_ids, max_tokens, sampling, seed=None):
            self.seen.append(prompt_ids[0])
            if prompt_ids[0] in self.broken or "always" in self.broken:
                raise UnusableAnswer(f"unreadable completion from {self.base_url}")
            return TurnOutput([5, 0], [-0.1, -0.2], "stop", 0)

        async def aclose(self):
            pass

    reports = []
    a, b = Stub("http://a", broken={666}), Stub("http://b", broken={666})
    pool = ServerPool([a, b], report=lambda url, reason, left: reports.append(url))
    odd, plain = pool.generate([[666], [1]], [4, 4], SamplingSettings())
    assert odd.finish_reason == "error" and "no server answered this turn" in odd.error and plain.token_ids == [5, 0]
    assert a.seen.count(666) == b.seen.count(666) == 1 and not reports and not pool.health.down

    bad, good = Stub("http://bad", broken={"always"}), Stub("http://good")
    pool = ServerPool([bad, good], report=lambda url, reason, left: reports.append((url, reason)))
    turns = [pool.generate([[n]], [4], SamplingSettings())[0] for n in range(2 * UNUSABLE_IN_A_ROW)]
    assert all(turn.token_ids == [5, 0] for turn in turns)  # every turn went on to the good server
    assert len(bad.seen) == UNUSABLE_IN_A_ROW and len(good.seen) == len(turns)
    (url, reason), = reports
    assert url == "http://bad" and reason.startswith(f"{UNUSABLE_IN_A_ROW} unusable answers in a row")
