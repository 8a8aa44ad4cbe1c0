"""Voting at k: the official EX of execution-consistency voting over each question's k samples (docs/design.md §7)."""

from __future__ import annotations


def accuracy_of(votes: dict[str, dict]) -> float:
    """The official EX of ``question_votes``' choices."""
    return round(sum(v["official"] for v in votes.values()) / len(votes), 6) if votes else 0.0


def question_votes(lines: list[dict], rows_by_id: dict[str, dict]) -> dict[str, dict]:
    """Each scored question's vote: ``{question_id: {"sample": the sample voted for (None when no sample ran),
    "official": 1 or 0}}``."""
    from t2s.env import databases
    from t2s.env.databases import ref_from_row
    from t2s.scoring.metrics import vote

    by_question: dict[str, list[dict]] = {}
    for line in lines:
        if line["official"] is None:  # the gold SQL failed: not scored
            continue
        by_question.setdefault(str(line["question_id"]), []).append(line)
    votes = {}
    for question_id, samples in by_question.items():
        samples.sort(key=lambda line: line["sample"])
        row = rows_by_id[question_id]
        ref = ref_from_row(row)
        gold = databases.gold_result(ref, row["gold_sql"])
        timeout = databases.scoring_timeout(gold.seconds)
        results, cache = [], {}
        for line in samples:
            sql = line.get("final_sql")
            if not (isinstance(sql, str) and sql.strip()):
                results.append(None)
                continue
            if sql not in cache:
                cache[sql] = databases.run_scoring_query(ref, sql, timeout=timeout)
            results.append(cache[sql])
        chosen = vote(results)
        votes[question_id] = {"sample": None if chosen is None else samples[chosen]["sample"],
                              "official": int(chosen is not None and samples[chosen]["official"] == 1)}
    return votes
