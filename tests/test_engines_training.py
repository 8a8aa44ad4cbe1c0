"""Two GRPO steps of the smoke recipe on each engine: data/demo converted to DuckDB files and to PostgreSQL
databases, the recipe's ``engine`` (and ``dsn``) keys pointing the rows at them."""

from __future__ import annotations

import pytest

from t2s.settings import RECIPES_DIR

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("engine", ["duckdb", "postgres"])
def test_two_grpo_steps_on_each_engine(request, tiny_model_dir, tmp_path, engine):
    from t2s.training.configs import parse_recipe
    from t2s.training.pipeline import build_trainer, fit

    extra = []
    if engine == "duckdb":
        folder, _ = request.getfixturevalue("duckdb_demo")
    else:
        folder, _, dsn = request.getfixturevalue("postgres_demo")
        extra = ["--dsn", dsn]
    script_args, training_args, model_args = parse_recipe(
        ["--config", str(RECIPES_DIR / "smoke.yaml"), "--model_name_or_path", str(tiny_model_dir),
         "--output_dir", str(tmp_path / "run"), "--max_steps", "2", "--engine", engine,
         "--dataset_path", str(folder / "dev.json"), *extra])
    trainer, counts = build_trainer(script_args, training_args, model_args)
    assert counts["kept"] > 0 and counts["dropped_gold_hygiene"] == 0
    assert all(row["db_path"].endswith(".duckdb") if engine == "duckdb" else row["db_path"].startswith("postgresql://")
               for row in trainer.train_dataset)
    records = []
    rollout = trainer._rollout

    def capture(prompts, trainer_):
        out = rollout(prompts, trainer_)
        records.extend(out["record"])
        return out

    trainer.rollout_func = capture
    fit(trainer, counts)
    assert trainer.state.global_step == 2
    assert records and all(record.counters["turns"] >= 1 for record in records)
    assert any("reward" in key for entry in trainer.state.log_history for key in entry)
