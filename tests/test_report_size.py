"""report.html at the sizes real evals reach: with k samples per question it grows with the questions, not with k."""

from __future__ import annotations

import json
import re
from pathlib import Path

from t2s.commands import main


def _payload(page: str) -> str:
    return re.search(r'<script type="application/json" id="data">(.*?)</script>', page, re.S).group(1)


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
    data = json.loads(_payload(pages["k8"]).replace("<\\/", "</"))
    assert len(data["episodes"]) == 63 and {e["sample"] for e in data["episodes"]} == {0}
    votes = [json.loads(line) for line in (tmp_path / "k8" / "full" / "votes.jsonl").read_text().splitlines()]
    assert len(votes) == 63 and all(set(v) == {"question_id", "sample", "official"} for v in votes)
    by_id = {str(v["question_id"]): v for v in votes}
    for episode in data["episodes"]:  # each question: its first sample in full, every sample's scores, its vote
        assert [s["sample"] for s in episode["samples"]] == list(range(8))
        assert all(s["official"] == 1 for s in episode["samples"]) and episode["turns"]
        assert episode["vote"] == {"sample": by_id[str(episode["question_id"])]["sample"], "official": 1}
    assert data["summaries"]["full"]["vote_at_k"] == 1.0
    one = json.loads(_payload(pages["k1"]).replace("<\\/", "</"))
    assert len(one["episodes"]) == 63 and not any("samples" in e or "vote" in e for e in one["episodes"])
    assert not (tmp_path / "k1" / "full" / "votes.jsonl").exists()
