"""A tiny, random-weight Qwen3.5 text model and a tokenizer shaped like Qwen3.5-2B's, built with no network.

Used by the tests and by the CPU demo recipe. Everything that matters for the recipe's correctness is real:
- the tokenizer is a byte-level BPE trained on a small embedded SQL/English corpus, with Qwen3.5's special tokens
  and its eos defaulting to ``<|endoftext|>`` (as Qwen3.5's tokenizer does), so the trainer's eos handling is exercised;
- the chat template is Qwen3.5-2B's own *no-think* template, read from the installed TRL, so prompts render exactly as
  they will for the real model when ``enable_thinking=True`` is passed;
- the model is a ``Qwen3_5ForCausalLM``, saved to a folder and loaded back by path, since TRL's reference model and
  vLLM both need a path. Two sizes (``PRESETS``): ``hybrid``, the tests' model, with a gated-delta-net and a full
  attention layer like the target; ``attention``, the demo's and ``bench learn``'s, four full-attention layers and
  hidden size 128, because the gated-delta-net kernels are slow on a CPU and a model that must learn needs the width.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]
TOOL_CALL_TOKENS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]  # ordinary added tokens
TEMPLATE_NAME = "qwen3_5_nothink.jinja"
VOCAB_SIZE = 1024
_BUILD_VERSION = "3"  # bump when the builder changes, so cached folders are rebuilt
# preset -> the Qwen3_5TextConfig fields that differ between the tiny models
PRESETS = {
    "hybrid": dict(hidden_size=64, intermediate_size=128, head_dim=16,
                   layer_types=["linear_attention", "full_attention"]),
    # the demo's learner: its tokenizer also learns the demo's prompts and SQL, so a query is a few dozen tokens and a
    # prompt about 100
    "attention": dict(hidden_size=128, intermediate_size=256, head_dim=32, layer_types=["full_attention"] * 4,
                      vocab_size=2048, demo_words=True),
}

_CORPUS_SQL = [
    "SELECT COUNT(*) FROM orders WHERE status = 'shipped';",
    "SELECT name, city FROM customers ORDER BY name LIMIT 5;",
    "SELECT T1.name, SUM(T2.amount) FROM customers AS T1 INNER JOIN orders AS T2 ON T1.id = T2.customer_id "
    "GROUP BY T1.name;",
    "SELECT DISTINCT category FROM products WHERE price > 10.5;",
    "SELECT AVG(rating) FROM reviews WHERE product_id IN (SELECT id FROM products WHERE category = 'books');",
    "SELECT strftime('%Y', order_date) AS year, COUNT(*) FROM orders GROUP BY year HAVING COUNT(*) > 3;",
    "WITH RECURSIVE n(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM n WHERE x < 10) SELECT SUM(x) FROM n;",
    "SELECT CAST(SUM(CASE WHEN gender = 'F' THEN 1 ELSE 0 END) AS REAL) * 100 / COUNT(*) FROM members;",
    'SELECT "Order Id", "Unit Price" FROM "Order Lines" WHERE quantity >= 2 AND note IS NOT NULL;',
    "CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT NOT NULL, city TEXT, joined DATE);",
    "CREATE TABLE orders (id INTEGER PRIMARY KEY, customer_id INTEGER REFERENCES customers(id), amount REAL);",
    "PRAGMA table_info(orders); SELECT name FROM sqlite_master WHERE type = 'table';",
]
_CORPUS_TEXT = [
    "How many orders were shipped last year? List the names of the customers who live in Paris.",
    "The question asks for the average rating of books. I should look at the reviews table first.",
    "Let me check which tables exist, then describe the relevant ones and run a query.",
    "The result has one row. The answer is the count of rows in the orders table.",
    "Evidence: shipped refers to status = 'shipped'; last year refers to strftime('%Y', order_date) = '2023'.",
    "Error: no such column. Did you mean one of these columns? Showing the first 5 rows; more rows exist.",
    "You have 3 tool turns left before you must answer. Return the final SQL only.",
    "system user assistant tool list_tables describe_table foreign_keys join_path sample_rows distinct_values",
    "run_query submit_sql table_name column_name limit sql args",
]
_CORPUS_JSON = [
    '{"tool": "list_tables", "args": {}}',
    '{"tool": "describe_table", "args": {"table_name": "orders"}}',
    '{"tool": "run_query", "args": {"sql": "SELECT COUNT(*) FROM orders"}}',
    '{"tool": "submit_sql", "args": {"sql": "SELECT name FROM customers"}}',
    '{"tool": "sample_rows", "args": {"table_name": "customers", "limit": 5}}',
]


def chat_template_path() -> Path:
    """Path of Qwen3.5-2B's no-think chat template inside the installed TRL (found without importing trl)."""
    spec = importlib.util.find_spec("trl")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("trl is not installed; the tiny tokenizer takes its chat template from trl")
    path = Path(list(spec.submodule_search_locations)[0]) / "chat_templates" / TEMPLATE_NAME
    if not path.is_file():
        raise RuntimeError(f"{path} not found; the pinned trl (1.16.0) ships it")
    return path


def demo_corpus() -> list[str]:
    """The demo's prompt texts and gold SQL: its system prompt, then per ``data/demo`` question (written by this
    project) the withheld-mode user message (question, evidence, the note on the schema) and the SQL."""
    from t2s.env.protocol import user_prompt
    from t2s.settings import DEMO_DIR, RECIPES_DIR

    records = json.loads((DEMO_DIR / "dev.json").read_text(encoding="utf-8"))
    system = (RECIPES_DIR / "demo_system_prompt.txt").read_text(encoding="utf-8")
    return [system] * 4 + [text for r in records for text in (user_prompt(r, "withheld"), str(r.get("SQL") or ""))]


def build_tokenizer(vocab_size: int = VOCAB_SIZE, extra_corpus: list[str] | None = None, tool_call_tokens: bool = True):
    """Train the byte-level BPE tokenizer offline and wrap it as a ``PreTrainedTokenizerFast``.

    ``extra_corpus`` adds texts whose words should become tokens (the ``attention`` preset adds the demo data's).
    ``tool_call_tokens`` adds Qwen3.5's native tool-calling tags as tokens.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    corpus = (_CORPUS_SQL + _CORPUS_TEXT + _CORPUS_JSON) * 4 + list(extra_corpus or [])
    tok.train_from_iterator(corpus, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|endoftext|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>", "<|im_end|>"],
        padding_side="left",
        clean_up_tokenization_spaces=False,
    )
    # <think> and </think> are ordinary added tokens in Qwen3.5 (not "special"): decoding keeps them.
    fast.add_tokens(["<think>", "</think>"], special_tokens=False)
    if tool_call_tokens:
        fast.add_tokens(TOOL_CALL_TOKENS, special_tokens=False)  # likewise the native tool-calling tags
    fast.chat_template = chat_template_path().read_text()
    return fast


def build_model(tokenizer, seed: int = 0, preset: str = "hybrid"):
    """A random-weight ``Qwen3_5ForCausalLM`` small enough to train on a CPU in well under a second per step."""
    import torch
    from transformers import GenerationConfig, Qwen3_5ForCausalLM, Qwen3_5TextConfig

    if preset not in PRESETS:
        raise ValueError(f"Error: unknown tiny model preset {preset!r}; known: {', '.join(PRESETS)}")
    sizes = PRESETS[preset]
    torch.manual_seed(seed)
    config = Qwen3_5TextConfig(
        vocab_size=len(tokenizer),
        hidden_size=sizes["hidden_size"],
        intermediate_size=sizes["intermediate_size"],
        num_hidden_layers=len(sizes["layer_types"]),
        layer_types=list(sizes["layer_types"]),
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=sizes["head_dim"],
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
        linear_conv_kernel_dim=4,
        max_position_embeddings=32768,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
        pad_token_id=tokenizer.pad_token_id,
    )
    model = Qwen3_5ForCausalLM(config)
    # Like the real checkpoint's file: eos is <|endoftext|> only. The trainer adds <|im_end|> (docs/design.md §8).
    model.generation_config = GenerationConfig(
        eos_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
        pad_token_id=tokenizer.pad_token_id,
        do_sample=True,
    )
    return model


def build_tiny_model(output_dir: str | Path, seed: int = 0, preset: str = "hybrid") -> Path:
    """Build (or reuse) the tokenizer and model in ``output_dir``; returns the folder to load by path."""
    out = Path(output_dir)
    marker = out / "t2s_tiny.json"
    if preset not in PRESETS:
        raise ValueError(f"Error: unknown tiny model preset {preset!r}; known: {', '.join(PRESETS)}")
    wanted = {"version": _BUILD_VERSION, "seed": seed}
    if preset != "hybrid":  # the hybrid's marker predates presets
        wanted.update(preset=preset, sizes=PRESETS[preset])
    if marker.is_file() and json.loads(marker.read_text()) == wanted:
        return out
    if not marker.is_file() and any((out / name).is_file() for name in ("config.json", "model.safetensors")):
        raise ValueError(f"Error: {out} holds a model t2s did not build; the tiny model is never written over it")
    out.mkdir(parents=True, exist_ok=True)
    sizes = PRESETS[preset]
    # the demo's learner keeps the vocabulary its figures were measured with; the test model has the tool-call tags
    tokenizer = build_tokenizer(sizes.get("vocab_size", VOCAB_SIZE), demo_corpus() if sizes.get("demo_words") else None,
                                tool_call_tokens=preset == "hybrid")
    model = build_model(tokenizer, seed=seed, preset=preset)
    tokenizer.save_pretrained(out)
    model.save_pretrained(out)
    marker.write_text(json.dumps(wanted))
    return out


def default_tiny_model_dir() -> Path:
    """Where the demo recipe keeps its tiny model (the workspace's git-ignored ``.cache``)."""
    from t2s.settings import workspace

    return workspace() / ".cache" / "tiny-qwen3.5"
