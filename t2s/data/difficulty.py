"""Difficulty estimated from the gold SQL's structure, for data without labels (BIRD train has none).

Features come from sqlglot's parse tree (joins, tables, subqueries, aggregates, CASE/IIF, set operations, window
functions, CAST and arithmetic, nesting depth, ORDER BY/LIMIT, length) plus the length of the evidence. A small
multinomial logistic regression (pure numpy) turns them into probabilities of simple / moderate / challenging,
calibrated on BIRD mini-dev's 500 labels. The recipe's filter keeps simple + moderate: a row is estimated
``challenging`` when its probability of being challenging exceeds a threshold tuned, under cross-validation, to keep
``KEEP_TARGET`` (93%) of the simple and moderate questions. The fitted coefficients live in ``MODEL`` below, so
estimation needs no data; ``calibrate`` refits them and reports k-fold figures (never in-sample).

This filter is the project's own estimate: how the published recipe picked simple + moderate is unknown.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Iterable, Sequence

CLASSES = ("simple", "moderate", "challenging")
KEEP = ("simple", "moderate")
KEEP_TARGET = 0.93  # share of simple + moderate the fitted threshold keeps (the built-in model's setting)

FEATURES = (
    "tokens",
    "tables",
    "joins",
    "selects",
    "depth",
    "aggregates",
    "case",
    "set_ops",
    "windows",
    "casts",
    "arithmetic",
    "divisions",
    "conditions",
    "group_by",
    "having",
    "order_by",
    "limit",
    "distinct",
    "functions",
    "ctes",
    "like_in_between",
    "evidence_words",
    "evidence_formula",
    "parse_failed",
)


def _parse(sql: str):
    import sqlglot
    from sqlglot.errors import ParseError

    try:
        return sqlglot.parse_one(sql, read="sqlite")
    except (ParseError, ValueError, TypeError, RecursionError):
        return None


def _select_depth(node, depth: int = 0) -> int:
    import sqlglot.expressions as exp

    here = depth + 1 if isinstance(node, exp.Select) else depth
    best = here
    for child in node.iter_expressions():
        best = max(best, _select_depth(child, here))
    return best


def sql_features(sql: str, evidence: str = "") -> dict[str, float]:
    """Structural counts of one gold SQL (and its evidence), as raw numbers."""
    import sqlglot.expressions as exp

    words = len(sql.split())
    evidence = evidence or ""
    feats = dict.fromkeys(FEATURES, 0.0)
    feats["tokens"] = float(words)
    feats["evidence_words"] = float(len(evidence.split()))
    feats["evidence_formula"] = float(sum(evidence.count(c) for c in "/*()%") + evidence.upper().count("DIVIDE"))
    tree = _parse(sql)
    if tree is None:
        feats["parse_failed"] = 1.0
        lowered = f" {sql.lower()} "
        feats["joins"] = float(lowered.count(" join "))
        feats["selects"] = float(lowered.count("select "))
        return feats

    def count(*types) -> float:
        return float(sum(1 for _ in tree.find_all(*types)))

    feats["tables"] = float(len({t.name.lower() for t in tree.find_all(exp.Table) if t.name}))
    feats["joins"] = count(exp.Join)
    feats["selects"] = count(exp.Select)
    feats["depth"] = float(_select_depth(tree))
    feats["aggregates"] = count(exp.AggFunc)
    feats["case"] = count(exp.Case, exp.If)  # CASE expressions and their WHEN branches, IIF
    feats["set_ops"] = count(exp.Union, exp.Intersect, exp.Except)
    feats["windows"] = count(exp.Window)
    feats["casts"] = count(exp.Cast, exp.TryCast)
    feats["arithmetic"] = count(exp.Add, exp.Sub, exp.Mul, exp.Div, exp.Mod)
    feats["divisions"] = count(exp.Div)
    feats["conditions"] = count(exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE, exp.Like, exp.In, exp.Between,
                                exp.Is)
    feats["group_by"] = count(exp.Group)
    feats["having"] = count(exp.Having)
    feats["order_by"] = count(exp.Order)
    feats["limit"] = count(exp.Limit)
    feats["distinct"] = count(exp.Distinct)
    feats["functions"] = count(exp.Func)
    feats["ctes"] = count(exp.CTE)
    feats["like_in_between"] = count(exp.Like, exp.In, exp.Between)
    return feats


def feature_vector(sql: str, evidence: str = "") -> list[float]:
    """The model's inputs: log(1 + count) of each feature, in ``FEATURES`` order."""
    raw = sql_features(sql, evidence)
    return [math.log1p(raw[name]) for name in FEATURES]


# ----------------------------------------------------------------------------------------------------------------
# The model


@dataclass
class DifficultyModel:
    """Standardisation, multinomial logistic-regression weights, and the challenging-probability threshold."""

    features: tuple[str, ...]
    mean: list[float]
    scale: list[float]
    weights: list[list[float]]  # one row per class, one column per feature
    bias: list[float]
    threshold: float  # P(challenging) above this -> "challenging" (excluded by the filter)
    report: dict = field(default_factory=dict)

    def probabilities(self, vectors: Sequence[Sequence[float]]):
        import numpy as np

        x = (np.asarray(vectors, dtype=float) - np.asarray(self.mean)) / np.asarray(self.scale)
        logits = x @ np.asarray(self.weights).T + np.asarray(self.bias)
        logits -= logits.max(axis=1, keepdims=True)
        p = np.exp(logits)
        return p / p.sum(axis=1, keepdims=True)

    def predict(self, vectors: Sequence[Sequence[float]]) -> list[str]:
        """Challenging when P(challenging) > threshold, else the likelier of simple and moderate."""
        p = self.probabilities(vectors)
        labels = []
        for simple, moderate, challenging in p:
            if challenging > self.threshold:
                labels.append("challenging")
            else:
                labels.append("simple" if simple >= moderate else "moderate")
        return labels

    def to_dict(self) -> dict:
        return {
            "features": list(self.features),
            "mean": self.mean,
            "scale": self.scale,
            "weights": self.weights,
            "bias": self.bias,
            "threshold": self.threshold,
            "report": self.report,
        }

    @classmethod
    def from_dict(cls, data: dict) -> "DifficultyModel":
        return cls(
            features=tuple(data["features"]),
            mean=list(data["mean"]),
            scale=list(data["scale"]),
            weights=[list(w) for w in data["weights"]],
            bias=list(data["bias"]),
            threshold=float(data["threshold"]),
            report=dict(data.get("report", {})),
        )


def read_model(path) -> DifficultyModel:
    """A model JSON written by ``data difficulty --save-model``; DataError naming the file when it is not one."""
    import json

    from t2s.data.rows import DataError, read_text_file

    text = read_text_file(path, what="difficulty model")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DataError(f"Error: {path}: not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    except RecursionError:
        raise DataError(f"Error: {path} is not a difficulty model: it nests too deeply") from None
    width, classes = len(FEATURES), len(CLASSES)

    def numbers(value, length: int) -> bool:  # finite ones: json reads NaN and Infinity
        return (isinstance(value, list) and len(value) == length
                and all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in value))

    problem = None
    if not isinstance(data, dict):
        problem = f"expected a JSON object, found {type(data).__name__}"
    elif data.get("features") != list(FEATURES):
        problem = f"'features' must be the {width} feature names of this version ({', '.join(FEATURES[:3])}, ...)"
    elif not all(numbers(data.get(key), width) for key in ("mean", "scale")) or 0 in data["scale"]:
        problem = f"'mean' and 'scale' must be lists of {width} finite numbers, no scale 0"
    elif not (isinstance(data.get("weights"), list) and len(data["weights"]) == classes
              and all(numbers(row, width) for row in data["weights"])):
        problem = f"'weights' must be {classes} lists of {width} numbers"
    elif not numbers(data.get("bias"), classes):
        problem = f"'bias' must be a list of {classes} numbers"
    elif not numbers([data.get("threshold")], 1):
        problem = "'threshold' must be a number"
    elif not isinstance(data.get("report", {}), dict):
        problem = "'report' must be an object"
    if problem:
        raise DataError(f"Error: {path} is not a difficulty model: {problem}")
    return DifficultyModel.from_dict(data)


def fit_logistic(vectors, labels, *, l2: float = 10.0, steps: int = 600, lr: float = 0.5, class_weight=True):
    """Multinomial logistic regression by full-batch gradient descent; returns (mean, scale, weights, bias)."""
    import numpy as np

    x = np.asarray(vectors, dtype=float)
    y = np.asarray([CLASSES.index(label) for label in labels])
    mean = x.mean(axis=0)
    scale = x.std(axis=0)
    scale[scale == 0] = 1.0
    z = (x - mean) / scale
    n, d = z.shape
    k = len(CLASSES)
    onehot = np.eye(k)[y]
    counts = onehot.sum(axis=0)
    sample_weight = (n / (k * np.maximum(counts, 1)))[y] if class_weight else np.ones(n)
    w = np.zeros((k, d))
    b = np.zeros(k)
    for _ in range(steps):
        logits = z @ w.T + b
        logits -= logits.max(axis=1, keepdims=True)
        p = np.exp(logits)
        p /= p.sum(axis=1, keepdims=True)
        g = (p - onehot) * sample_weight[:, None] / n
        w -= lr * (g.T @ z + l2 * w / n)
        b -= lr * g.sum(axis=0)
    return mean.tolist(), scale.tolist(), w.tolist(), b.tolist()


def _threshold_for_keep(p_challenging: Sequence[float], labels: Sequence[str], keep_target: float) -> float:
    """The smallest threshold that keeps at least ``keep_target`` of the simple + moderate questions."""
    kept_side = sorted(p for p, label in zip(p_challenging, labels) if label in KEEP)
    if not kept_side:
        return 0.5
    index = min(len(kept_side) - 1, max(0, math.ceil(keep_target * len(kept_side)) - 1))
    return float(kept_side[index])


def filter_figures(true: Sequence[str], predicted: Sequence[str]) -> dict:
    """Confusion matrix, accuracy, and the filter's kept share of simple + moderate and excluded share of
    challenging."""
    matrix = {t: {p: 0 for p in CLASSES} for t in CLASSES}
    for t, p in zip(true, predicted):
        if t in CLASSES and p in CLASSES:
            matrix[t][p] += 1
    labelled = sum(sum(r.values()) for r in matrix.values())
    correct = sum(matrix[c][c] for c in CLASSES)
    easy_total = sum(sum(matrix[t].values()) for t in KEEP)
    easy_kept = sum(matrix[t][p] for t in KEEP for p in KEEP)
    hard_total = sum(matrix["challenging"].values())
    hard_excluded = matrix["challenging"]["challenging"]
    return {
        "labelled": labelled,
        "confusion": matrix,
        "accuracy": correct / labelled if labelled else None,
        "kept_simple_moderate": easy_kept / easy_total if easy_total else None,
        "excluded_challenging": hard_excluded / hard_total if hard_total else None,
    }


def cross_validate(vectors, labels, *, folds: int = 5, keep_target: float = KEEP_TARGET, seed: int = 0,
                   **fit_opts) -> dict:
    """k-fold figures: each fold's threshold is tuned on its training part only, then applied to the held-out part."""
    import numpy as np

    rng = np.random.default_rng(seed)
    order = rng.permutation(len(labels))
    predicted: list[str | None] = [None] * len(labels)
    for fold in range(folds):
        test = order[fold::folds]
        train = np.setdiff1d(order, test)
        model = _fit_model([vectors[i] for i in train], [labels[i] for i in train], keep_target, **fit_opts)
        for i, label in zip(test, model.predict([vectors[i] for i in test])):
            predicted[i] = label
    figures = filter_figures(labels, predicted)
    figures["folds"] = folds
    figures["keep_target"] = keep_target
    return figures


def _fit_model(vectors, labels, keep_target: float, **fit_opts) -> DifficultyModel:
    mean, scale, weights, bias = fit_logistic(vectors, labels, **fit_opts)
    model = DifficultyModel(FEATURES, mean, scale, weights, bias, threshold=0.5)
    # tune the threshold with an inner split so it is not set on the very probabilities it was fitted to
    p = _inner_cv_challenging(vectors, labels, **fit_opts)
    model.threshold = _threshold_for_keep(p, labels, keep_target)
    return model


def _inner_cv_challenging(vectors, labels, folds: int = 5, **fit_opts) -> list[float]:
    p_out = [0.0] * len(labels)
    for fold in range(folds):
        test = list(range(fold, len(labels), folds))
        test_set = set(test)
        train = [i for i in range(len(labels)) if i not in test_set]
        mean, scale, weights, bias = fit_logistic([vectors[i] for i in train], [labels[i] for i in train], **fit_opts)
        model = DifficultyModel(FEATURES, mean, scale, weights, bias, threshold=0.5)
        for i, p in zip(test, model.probabilities([vectors[i] for i in test])[:, 2]):
            p_out[i] = float(p)
    return p_out


def calibrate(rows: Iterable[dict], *, folds: int = 5, keep_target: float = KEEP_TARGET, **fit_opts) -> DifficultyModel:
    """Fit on labelled rows (common row shape); the returned model's ``report`` holds the cross-validated figures."""
    labelled = [r for r in rows if r.get("difficulty") in CLASSES]
    vectors = [feature_vector(r["gold_sql"], r.get("evidence", "")) for r in labelled]
    labels = [r["difficulty"] for r in labelled]
    report = cross_validate(vectors, labels, folds=folds, keep_target=keep_target, **fit_opts)
    model = _fit_model(vectors, labels, keep_target, **fit_opts)
    model.report = report
    return model


# Fitted on BIRD mini-dev (500 labelled questions) by `calibrate`; see `report` for the cross-validated figures.
MODEL: dict = {'features': ['tokens', 'tables', 'joins', 'selects', 'depth', 'aggregates', 'case', 'set_ops',
              'windows', 'casts', 'arithmetic', 'divisions', 'conditions', 'group_by', 'having',
              'order_by', 'limit', 'distinct', 'functions', 'ctes', 'like_in_between', 'evidence_words',
              'evidence_formula', 'parse_failed'],
 'mean': [3.35307, 1.0987, 0.658211, 0.757027, 0.748945, 0.466721, 0.21681, 0.00415888, 0.00693147,
          0.14618, 0.274239, 0.149348, 1.33293, 0.0778681, 0.0194081, 0.150191, 0.141873, 0.122361,
          1.02996, 0.010515, 0.100155, 2.89382, 0.871003, 0.0],
 'scale': [0.415427, 0.230288, 0.366463, 0.177687, 0.149803, 0.503811, 0.49235, 0.0535296, 0.0689673,
           0.329749, 0.498946, 0.304084, 0.363433, 0.222918, 0.11435, 0.291737, 0.285963, 0.279034,
           0.747744, 0.0999529, 0.270517, 0.52643, 0.899816, 1.0],
 'weights': [[-0.71471, 0.00960256, -0.285575, -0.0410876, 0.045864, 0.0802141, 0.0248213, -0.120758,
              0.148334, -0.0381121, -0.188999, -0.16375, -0.194906, -0.196937, 0.174939, -0.135817,
              -0.0218409, -0.259921, -0.120568, -0.00986738, -0.158649, -0.478855, -0.0984904, 0.0],
             [0.173117, -0.00311428, 0.00261113, -0.0969794, -0.016135, -0.0252389, -0.171572,
              0.0375764, -0.0087678, -0.0252839, -0.251815, 0.29096, -0.0256285, -0.074999, 0.116974,
              0.152393, 0.032302, -0.132361, 0.0727867, 0.0225004, -0.0333581, 0.124729, -0.0290483,
              0.0],
             [0.541594, -0.00648828, 0.282964, 0.138067, -0.029729, -0.0549752, 0.146751, 0.0831815,
              -0.139566, 0.063396, 0.440814, -0.12721, 0.220534, 0.271936, -0.291913, -0.0165762,
              -0.0104611, 0.392282, 0.0477815, -0.012633, 0.192007, 0.354126, 0.127539, 0.0]],
 'bias': [-0.145384, 0.469745, -0.32436],
 'threshold': 0.584922,
 'report': {'labelled': 500,
            'confusion': {'simple': {'simple': 110, 'moderate': 37, 'challenging': 1},
                          'moderate': {'simple': 45, 'moderate': 176, 'challenging': 29},
                          'challenging': {'simple': 11, 'moderate': 25, 'challenging': 66}},
            'accuracy': 0.704,
            'kept_simple_moderate': 0.924623,
            'excluded_challenging': 0.647059,
            'folds': 5,
            'keep_target': 0.93}}


@lru_cache(maxsize=1)
def default_model() -> DifficultyModel:
    if not MODEL:
        raise RuntimeError("Error: the difficulty model has no coefficients; run calibrate() on labelled data")
    return DifficultyModel.from_dict(MODEL)


def estimate(rows: Sequence[dict], model: DifficultyModel | None = None) -> list[str]:
    """Estimated difficulty of each row (common row shape, or BIRD/Spider records with SQL/query)."""
    model = model or default_model()
    vectors = [feature_vector(_sql_of(r), r.get("evidence") or r.get("external_knowledge") or "") for r in rows]
    return model.predict(vectors) if vectors else []


def labelled_rows(records: list, data_file) -> list[dict]:
    """The rows ``data difficulty`` estimates or calibrates on (gold SQL, evidence, the data's own label): a DataError
    naming the row for one without SQL, or whose evidence is not text."""
    from t2s.data.loaders import synsql_difficulty
    from t2s.data.rows import DataError, _difficulty

    rows = []
    for position, record in enumerate(records):
        sql = _sql_of(record)
        where = f"Error: {data_file}: row {position} (0-based)"
        if not sql.strip():
            raise DataError(f"{where} has no SQL (`SQL`, `query` or `sql`)")
        evidence = record.get("evidence") or record.get("external_knowledge") or ""
        if not isinstance(evidence, str):
            raise DataError(f"{where}: the evidence must be text, got {type(evidence).__name__}")
        label = synsql_difficulty(record.get("sql_complexity")) or _difficulty(record.get("difficulty"))
        rows.append({"gold_sql": sql, "evidence": evidence, "difficulty": label})
    return rows


def _sql_of(row: dict) -> str:
    for name in ("gold_sql", "SQL", "query", "sql"):
        if isinstance(row.get(name), str):
            return row[name]
    return ""


def keep_simple_moderate(rows: Sequence[dict], model: DifficultyModel | None = None) -> tuple[list[dict], dict]:
    """The recipe's filter: rows labelled, or else estimated, simple or moderate; returns (kept, counts)."""
    unlabelled = [r for r in rows if r.get("difficulty") not in CLASSES]
    estimated = iter(estimate(unlabelled, model))
    kept, counts = [], {"kept": 0, "dropped_challenging": 0, "estimated": len(unlabelled)}
    for row in rows:
        level = row.get("difficulty") if row.get("difficulty") in CLASSES else next(estimated)
        if level in KEEP:
            kept.append(row)
            counts["kept"] += 1
        else:
            counts["dropped_challenging"] += 1
    return kept, counts


def model_json(model: DifficultyModel) -> str:
    """The model as a JSON literal (what ``MODEL`` holds)."""
    return json.dumps(model.to_dict(), indent=1)
