"""The command-line options of ``eval``, in groups that ``ask``, ``data passrate``, ``score`` and the benchmarks share.

Each group adds its options to a parser; their defaults are the records' own (``t2s.evaluation.config``: each default
is declared once), and a command turns the parsed values into those records (``EvalConfig.from_options``).
"""

from __future__ import annotations

from t2s.backends.vllm_engine import ENGINE_DTYPES
from t2s.evaluation.config import (DATABASE_ENGINES, ENDPOINT_MODES, MODES, POLICIES, EndpointConfig, EvalConfig,
                                   PolicyConfig)
from t2s.ui.args import (BooleanOptionalAction, add_hidden_alias, non_empty_path, non_negative_float, non_negative_int,
                         positive_float, positive_int, sample_count, unit_float)


def add_sampling_arguments(p) -> None:
    """Sampling and thinking (shared with ``ask``): evaluation defaults T 0.6, top-p 0.95, top-k 20, thinking on."""
    evaluated = PolicyConfig().sampling
    p.add_argument("--temperature", type=non_negative_float, default=evaluated.temperature, help="sampling temperature")
    p.add_argument("--top-p", type=unit_float, default=evaluated.top_p, help="nucleus sampling share")
    p.add_argument("--top-k", type=non_negative_int, default=evaluated.top_k,
                   help="sample from the k likeliest tokens (0: off)")
    p.add_argument("--enable-thinking", action=BooleanOptionalAction, default=PolicyConfig().episode.enable_thinking,
                   help="render prompts with thinking on (default: on)")


def add_tool_arguments(p) -> None:
    """The tool set and the call format (shared with ``ask``, ``data passrate`` and ``bench env``): defaults exec_plan
    and json."""
    from t2s.env.tool_schemas import DIALECTS, TOOL_FORMATS

    p.add_argument("--dialect", default=PolicyConfig().episode.dialect, choices=DIALECTS,
                   help="tool set: exec_plan (8 tools) or sibling (inspect_schema, sample_rows, run_sql, submit)")
    p.add_argument("--tool-format", default=PolicyConfig().episode.tool_format, choices=TOOL_FORMATS,
                   help="call format: json (one JSON object per call) or native (the chat template's tool calling)")


def add_engine_arguments(p) -> None:
    """Which engine holds the databases (shared by ``eval`` and ``score``): sqlite files by default, DuckDB files
    (``<db_root>/<db_id>/<db_id>.duckdb``) or PostgreSQL databases named by db_id on the server at ``--dsn``."""
    p.add_argument("--engine", default=PolicyConfig().engine, choices=DATABASE_ENGINES,
                   help="database engine: sqlite (default), duckdb (<db_id>/<db_id>.duckdb files, as `data convert` "
                   "writes them) or postgres (one database per db_id on the server at --dsn)")
    p.add_argument("--dsn", default=PolicyConfig().dsn,
                   help="PostgreSQL server URL for --engine postgres, e.g. postgresql://reader@host/postgres "
                   "(default: $T2S_DSN; keep the password in PGPASSWORD or ~/.pgpass)")


def add_endpoint_arguments(p) -> None:
    """How to reach an OpenAI-compatible server (shared with ``ask``)."""
    p.add_argument("--endpoint", action="append", default=None, metavar="URL",
                   help="base URL of an OpenAI-compatible server, e.g. http://localhost:8000; repeat it (or give a "
                   "comma-separated list) to spread the episodes over several servers of one model")
    p.add_argument("--endpoint-mode", default=EndpointConfig().mode, choices=ENDPOINT_MODES,
                   help="completions: token ids on a vLLM server (comparable); chat: any server (not comparable); "
                   "tools: any server's function calling (native format, not comparable)")
    p.add_argument("--served-model", default=None, help="model name on the server (default: the first of /v1/models)")
    p.add_argument("--tokenizer", default=None,
                   help="tokenizer folder or hub id (default: --model, else the served name)")
    p.add_argument("--chat-template", type=non_empty_path, default=None, metavar="FILE",
                   help="a Jinja chat template for a tokenizer that has none (a base model)")
    p.add_argument("--api-key", default=EndpointConfig().api_key,
                   help="bearer token (default: $OPENAI_API_KEY)")
    p.add_argument("--retries", type=non_negative_int, default=EndpointConfig().retries,
                   help="endpoint retries, with exponential backoff")
    p.add_argument("--backoff", type=non_negative_float, default=EndpointConfig().backoff,
                   help="first endpoint retry delay in seconds")
    p.add_argument("--request-timeout", type=positive_float, default=EndpointConfig().request_timeout,
                   help="seconds before one request is abandoned")
    p.add_argument("--concurrency", type=positive_int, default=EndpointConfig().concurrency,
                   help="endpoint requests in flight")


# The episode limits ``eval`` (and ``data passrate``) set: (EpisodeConfig field, type, help). Their defaults are
# EpisodeConfig's own. The other fields of ``config.EPISODE_OPTIONS`` (dialect, tool_format, system_prompt_file and
# enable_thinking) have options of their own.
EPISODE_LIMITS = (
    ("max_turns", positive_int, "tool turns before the forced final turn"),
    ("episode_token_budget", positive_int, "tokens an episode may use, prompt and observations included"),
    ("max_tokens_per_turn", positive_int, "tokens one model turn may generate"),
    ("min_episode_tokens", positive_int, "an episode whose prompt leaves less than this of the budget ends before "
     "its first turn"),
    ("forced_turn_reserve", positive_int, "tokens kept for the forced final turn"),
    ("max_calls_per_turn", positive_int, "tool calls run per turn; later ones are refused"),
    ("max_failed_queries", positive_int, "failed queries in a row before the forced final turn"),
    ("tool_timeout", positive_float, "seconds one tool call may run"),
    ("episode_tool_seconds", positive_float, "seconds of tool time an episode may use"),
)


def add_episode_arguments(p) -> None:
    """The episode limits (``EPISODE_LIMITS``), defaulting to ``EpisodeConfig``'s."""
    defaults = PolicyConfig().episode
    for name, kind, help_text in EPISODE_LIMITS:
        default = getattr(defaults, name)
        p.add_argument("--" + name.replace("_", "-"), type=kind, default=default,
                       help=f"{help_text} (default: {default})")


def add_policy_arguments(p) -> None:
    """How a policy plays episodes: the model, endpoint or vLLM to use, sampling, episode limits and threads.

    Shared by ``eval`` and ``data passrate`` (whose episodes run through :func:`solve_counts`).
    """
    p.add_argument("--seed", type=int, default=PolicyConfig().seed,
                   help="seeds sampling, and picks the --n questions (the same pick in eval and data passrate)")
    add_sampling_arguments(p)
    add_episode_arguments(p)
    add_tool_arguments(p)
    p.add_argument("--system-prompt-file", type=non_empty_path, default=None,
                   help="replace the exec_plan system prompt with this file's text")
    p.add_argument("--model", default=None,
                   help="model folder or hub id (policies model, vllm; tokenizer for endpoint)")
    add_endpoint_arguments(p)
    p.add_argument("--batch-size", type=non_negative_int, default=PolicyConfig().batch_size,
                   help="episodes per rollout batch (default: 64, 256 for endpoints)")
    p.add_argument("--device", default=None, help="policy model: cpu, cuda, ... (default: cuda when available)")
    p.add_argument("--dtype", default=None, choices=ENGINE_DTYPES,
                   help="weights' dtype for vLLM (policy vllm; default: the checkpoint config's, else auto)")
    p.add_argument("--gpu-memory-utilization", type=unit_float, default=PolicyConfig().gpu_memory_utilization,
                   help="share of GPU memory vLLM may take (policy vllm)")
    p.add_argument("--workers", type=positive_int, default=PolicyConfig().workers,
                   help="threads for scripted episodes and scoring")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    add_hidden_alias(p, "--quiet", "--no-progress", action="store_true")


def add_eval_arguments(parser) -> None:
    """Every option of ``eval``: the questions, modes, samples and output, then the policy's options."""
    p = parser
    p.add_argument("--policy", required=True, choices=POLICIES, help="who plays: " + ", ".join(POLICIES))
    p.add_argument("--data", required=True, type=non_empty_path,
                   help="BIRD/Spider-style JSON (or a folder holding dev.json)")
    p.add_argument("--db-root", type=non_empty_path, default=None,
                   help="folder of per-db_id folders (default: beside the data file)")
    add_engine_arguments(p)
    p.add_argument("--mode", nargs="+", default=list(EvalConfig.modes), choices=MODES,
                   help="one or more of full, withheld, single")
    p.add_argument("--n", type=non_negative_int, default=EvalConfig.n,
                   help="questions to evaluate, picked with --seed from the whole file (0 = all)")
    p.add_argument("--k", type=sample_count, default=PolicyConfig().k,
                   help="samples per question (k > 1 adds vote_at_k)")
    p.add_argument("--output", required=True, type=non_empty_path,
                   help="output folder (re-running the same command resumes it)")
    p.add_argument("--skip-missing-dbs", action="store_true",
                   help="skip (and count) questions whose database is missing or cannot be read")
    p.add_argument("--predictions", type=non_empty_path, default=None, help="predictions file (policy predictions)")
    add_policy_arguments(p)
