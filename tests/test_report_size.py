"""report.html at the sizes real evals reach: with k samples per question it grows with the questions, not with k;
`bench report` builds an eval folder the size of BIRD dev in both modes and measures the page, show and compare."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from t2s.commands import main


def _payload(page: str) -> str:
    return re.search(r'<script type="application/json" id="data">(.*?)</script>', page, re.S).group(1)


def page_data(page: str) -> dict:
    """The page's data as its script reads it: every episode with its details (``data.details[i]``) merged in."""
    data = json.loads(_payload(page))
    for episode, details in zip(data["episodes"], data.get("details") or []):
        episode.update(json.loads(details))
    return data


def _eval(demo_dir, out: Path, k: int) -> None:
    assert main(["eval", "--policy", "gold", "--data", str(demo_dir), "--n", "63", "--k", str(k), "--mode", "full",
                 "--output", str(out), "--quiet"]) == 0


def test_many_samples_keep_the_page_the_size_of_the_questions(demo_dir, tmp_path):
    _eval(demo_dir, tmp_path / "k1", 1)
    _eval(demo_dir, tmp_path / "k8", 8)
    episodes = {k: (tmp_path / k / "full" / "episodes.jsonl").stat().st_size for k in ("k1", "k8")}
    assert episodes["k8"] > 7 * episodes["k1"]  # the run holds every sample
    pages = {k: (tmp_path / k / "report.html").read_text(encoding="utf-8") for k in ("k1", "k8")}
    assert len(pages["k8"].encode()) < 2 * len(pages["k1"].encode())
    assert len(_payload(pages["k8"])) < 2 * len(_payload(pages["k1"]))  # the data alone, without script and plot
    data = page_data(pages["k8"])
    assert len(data["episodes"]) == 63 and {e["sample"] for e in data["episodes"]} == {0}
    votes = [json.loads(line) for line in (tmp_path / "k8" / "full" / "votes.jsonl").read_text().splitlines()]
    assert len(votes) == 63 and all(set(v) == {"question_id", "sample", "official"} for v in votes)
    by_id = {str(v["question_id"]): v for v in votes}
    for episode in data["episodes"]:  # each question: its first sample in full, every sample's scores, its vote
        assert [s["sample"] for s in episode["samples"]] == list(range(8))
        assert all(s["official"] == 1 for s in episode["samples"]) and episode["turns"]
        assert episode["vote"] == {"sample": by_id[str(episode["question_id"])]["sample"], "official": 1}
    assert data["summaries"]["full"]["vote_at_k"] == 1.0
    one = page_data(pages["k1"])
    assert len(one["episodes"]) == 63 and not any("samples" in e or "vote" in e for e in one["episodes"])
    assert not (tmp_path / "k1" / "full" / "votes.jsonl").exists()


def test_the_page_data_reads_back_whatever_the_text(demo_dir, tmp_path):
    """Text that would end or alter the <script> block ("</script>", "<!--") stays inside it, as JSON that parses."""
    from t2s.evaluation.report_html import render_page

    hostile = "<!-- <script> x </script> <\\!-- \\u0021 </ <img src=x onerror=alert(1)>"
    page = render_page({"title": hostile, "episodes": [{"question": hostile, "question_id": 1}],
                        "details": [json.dumps({"turns": [{"observation": hostile}]})]})
    payload = _payload(page)
    assert "</" not in payload and "<!--" not in payload
    data = page_data(page)
    assert data["title"] == data["episodes"][0]["question"] == hostile
    assert data["episodes"][0]["turns"][0]["observation"] == hostile
    import html
    import re

    named = 'runs/résultats "A" & B\u202e'  # a run's name, as the page's title and heading show it: as written
    page = render_page({"title": named, "episodes": []})
    shown = html.escape('runs/résultats "A" & B\\u202e')
    assert re.search("<title>(.*)</title>", page).group(1) == shown and f'<h1 id="title">{shown}</h1>' in page


def test_bidi_overrides_show_as_escapes_on_the_page():
    """A right-to-left override in model text would reverse what follows it on the page (a SQL shown backwards):
    the page holds none raw, and its data reads back with a visible escape, as the terminal shows it."""
    from t2s.evaluation.report_html import render_page

    spoof = "SELECT 1 -- \u202e;elbat PORD"
    page = render_page({"title": "t", "episodes": [{"question": spoof, "question_id": 1}],
                        "details": [json.dumps({"turns": [{"assistant": spoof}]}, ensure_ascii=False)]})
    assert "\u202e" not in page
    data = page_data(page)
    shown = "SELECT 1 -- \\u202e;elbat PORD"
    assert data["episodes"][0]["question"] == shown and data["episodes"][0]["turns"][0]["assistant"] == shown


REPORT_LINE = re.compile(r"report: episodes=(\d+) episodes_mb=([\d.]+) write_s=([\d.]+) size_mb=([\d.]+) "
                         r"list_s=([\d.]+|nan) open_s=([\d.]+|nan)")


def _bench_report(tmp_path, *extra):
    import subprocess
    import sys

    out = tmp_path / "run"
    done = subprocess.run([sys.executable, "-m", "t2s", "bench", "report", "--questions", "12", "--output", str(out),
                           *extra], capture_output=True, text=True, timeout=600)
    last = done.stdout.strip().splitlines()[-1]
    match = REPORT_LINE.fullmatch(last)
    assert match, done.stdout + done.stderr
    return done, match, out


def test_bench_report_builds_a_full_size_folder_and_prints_its_last_line(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")  # no Chromium on this PATH: the browser figures are nan, not guessed
    done, match, out = _bench_report(tmp_path)
    episodes, episodes_mb, size_mb = int(match.group(1)), float(match.group(2)), float(match.group(4))
    assert episodes == 24 and match.group(5) == match.group(6) == "nan"
    files = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    assert files == ["full/episodes.jsonl", "full/eval_config.json", "full/scores.jsonl", "report.html",
                     "summary.json", "summary.png", "withheld/episodes.jsonl", "withheld/eval_config.json",
                     "withheld/scores.jsonl"]
    sizes = [len(line.encode()) for mode in ("full", "withheld")
             for line in (out / mode / "episodes.jsonl").read_text(encoding="utf-8").splitlines()]
    assert len(sizes) == 24 and min(sizes) >= 14_000  # each episode at least the 14 KB measured on real ones
    assert abs(episodes_mb - sum(sizes) / 1e6) < 0.06
    assert abs(size_mb - (out / "report.html").stat().st_size / 1e6) < 0.06
    lines = [json.loads(line) for line in (out / "full" / "episodes.jsonl").read_text().splitlines()]
    assert all(len(line["turns"]) == 6 and line["gold_result"]["rows"] for line in lines)
    assert "show RUN --wrong" in done.stderr and "compare RUN/full RUN/withheld" in done.stderr
    assert "Chromium is not installed" in done.stdout


def _chromium():
    import shutil

    return shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.skipif(_chromium() is None,
                    reason="headless Chromium is not installed: `make install-chromium` (as root) installs it")
def test_bench_report_times_the_page_in_chromium(tmp_path):
    done, match, out = _bench_report(tmp_path)
    list_s, open_s = float(match.group(5)), float(match.group(6))
    assert 0 < list_s < 60 and 0 <= open_s < 60 and "target missed: the page lists" not in done.stdout
