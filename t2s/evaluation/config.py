"""What an evaluation plays, as typed records built once per command from its options.

- :class:`EndpointConfig`: how to reach an OpenAI-compatible server;
- :class:`PolicyConfig`: who plays and how: the policy, its model or endpoint, sampling (``SamplingSettings``), the
  episode (``EpisodeConfig``), the database engine, samples per question and threads. ``eval``, ``ask``, ``data
  passrate`` and ``solve_counts`` share it;
- :class:`EvalConfig`: an ``eval`` run: the questions, the modes, the output folder, and its ``PolicyConfig``.

Each default is declared once: the episode's in ``EpisodeConfig``, sampling's in ``SamplingSettings.evaluation``, the
rest here; the command-line options (``t2s.evaluation.options``) read theirs from these. ``from_options`` builds a
record from option values named as the flags are (``max_turns`` for ``--max-turns``); values it does not name keep
their defaults. A record that no episode can run with is refused when it is built (``EvalError``), so a command fails
before it loads a model.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any, Mapping
from urllib.parse import urlsplit

from t2s.backends.base import SamplingSettings
from t2s.env.episode import EpisodeConfig
from t2s.errors import EvalError
from t2s.ui.args import MAX_SAMPLES

POLICIES = ("model", "vllm", "endpoint", "gold", "predictions")
MODES = ("full", "withheld", "single")
ENDPOINT_MODES = ("completions", "chat", "tools")
DATABASE_ENGINES = ("sqlite", "duckdb", "postgres")

#: The ``EpisodeConfig`` fields an eval sets from options of the same name. Not here: ``mode`` (each run's, from
#: ``--mode``) and ``column_descriptions`` (a property of the data: the recipe's ``column_descriptions``).
EPISODE_OPTIONS = ("max_turns", "episode_token_budget", "max_tokens_per_turn", "min_episode_tokens",
                   "forced_turn_reserve", "max_calls_per_turn", "max_failed_queries", "tool_timeout",
                   "episode_tool_seconds", "dialect", "tool_format", "system_prompt_file", "enable_thinking")
SAMPLING_OPTIONS = ("temperature", "top_p", "top_k")


def _pick(values: Mapping[str, Any], names) -> dict:
    return {name: values[name] for name in names if name in values}


@dataclass(frozen=True)
class EndpointConfig:
    """OpenAI-compatible servers of one model: ``urls`` (several spread the episodes, ``t2s.backends.server_pool``);
    ``mode`` completions (token ids on a vLLM server, the training stream), chat (any server, history re-rendered: not
    comparable) or tools (the server's function calling); retries with exponential backoff from ``backoff`` seconds;
    ``concurrency`` requests in flight per server."""

    urls: tuple[str, ...] = ()
    mode: str = "completions"
    served_model: str | None = None  # default: the first of /v1/models
    api_key: str | None = field(default_factory=lambda: os.environ.get("OPENAI_API_KEY"), repr=False)  # a secret
    retries: int = 3
    backoff: float = 2.0
    request_timeout: float = 600.0
    concurrency: int = 64

    def __post_init__(self):
        urls = (self.urls,) if isinstance(self.urls, str) else tuple(self.urls or ())
        split = [url.strip() for value in urls for url in str(value).split(",") if url.strip()]
        object.__setattr__(self, "urls", tuple(dict.fromkeys(split)))  # a server named twice is one server
        for url in self.urls:  # refused at once, not retried with backoff as a server that is down
            try:
                parts = urlsplit(url)
                usable = parts.scheme in ("http", "https") and bool(parts.hostname) and parts.port != 0
            except ValueError:  # a port that is no number, a broken IPv6 address
                usable = False
            shown = url if "@" not in url else "...@" + url.rsplit("@", 1)[1]  # never a user name and token
            if not usable:
                raise EvalError(f"Error: --endpoint {shown!r} is not a server URL such as http://localhost:8000")
            if parts.username is not None or parts.password is not None:  # it would be in eval_config.json, the
                # summary, the report and every error line
                raise EvalError(f"Error: --endpoint {shown!r} holds a user name or password (NAME:KEY@): every file "
                                "the run writes records its servers' URLs; pass the key with --api-key or "
                                "$OPENAI_API_KEY, which no file records")

    @property
    def url(self) -> str | None:
        """The first server (the one of a single-server run)."""
        return self.urls[0] if self.urls else None

    @classmethod
    def from_options(cls, values: Mapping[str, Any]) -> EndpointConfig:
        """``endpoint`` is one URL, a comma-separated list, or a list of either (``--endpoint`` repeated)."""
        picked = _pick(values, ("served_model", "api_key", "retries", "backoff", "request_timeout", "concurrency"))
        if values.get("endpoint") is not None:
            picked["urls"] = values["endpoint"]
        if "endpoint_mode" in values:
            picked["mode"] = values["endpoint_mode"]
        return cls(**picked)


@dataclass(frozen=True)
class PolicyConfig:
    """Who plays episodes, and how.

    ``policy`` is one of ``POLICIES`` (``data passrate`` adds its scripted ones); ``seed`` seeds sampling and picks
    the questions; ``k`` samples per question; ``batch_size`` 0 means 64 episodes per batch (256 for an endpoint);
    ``workers`` threads for scripted episodes, tools and scoring. ``episode.mode`` is set per run
    (:meth:`episode_for`).
    """

    policy: str = "gold"
    model: str | None = None
    tokenizer: str | None = None  # default: ``model``, else the served name
    chat_template: str | None = None  # a Jinja template for a tokenizer that has none
    seed: int | None = 0  # None: unseeded (``ask``'s default)
    k: int = 1
    sampling: SamplingSettings = field(default_factory=SamplingSettings.evaluation)
    episode: EpisodeConfig = field(default_factory=EpisodeConfig)
    endpoint: EndpointConfig = field(default_factory=EndpointConfig)
    engine: str = "sqlite"  # the databases' engine
    dsn: str | None = field(default_factory=lambda: os.environ.get("T2S_DSN"), repr=False)  # may hold a password
    predictions: str | None = None
    batch_size: int = 0
    device: str | None = None
    dtype: str | None = None
    gpu_memory_utilization: float = 0.85
    workers: int = 4
    quiet: bool = False

    def __post_init__(self):
        if not 1 <= self.k <= MAX_SAMPLES:
            raise EvalError(f"Error: --k must be from 1 to {MAX_SAMPLES}, got {self.k}")
        if self.engine == "postgres" and not self.dsn:
            raise EvalError("Error: --engine postgres needs --dsn postgresql://... (or T2S_DSN)")
        if self.sampling.seed != self.seed:
            object.__setattr__(self, "sampling", dataclasses.replace(self.sampling, seed=self.seed))
        if self.policy == "endpoint" and self.endpoint.mode == "tools" and self.episode.tool_format != "native":
            # the server's function calling is the native call format
            object.__setattr__(self, "episode", dataclasses.replace(self.episode, tool_format="native"))
        if self.episode.system_prompt_file:
            read_system_prompt(self.episode.system_prompt_file)
        problem = self.episode.budget_problem(as_flags=True)
        if problem:
            raise EvalError(problem)

    @classmethod
    def from_options(cls, values: Mapping[str, Any]) -> PolicyConfig:
        """The record of option values named as the flags are; what ``values`` leaves out keeps its default."""
        picked = _pick(values, ("policy", "model", "tokenizer", "chat_template", "seed", "k", "engine", "dsn",
                                "predictions", "batch_size", "device", "dtype", "gpu_memory_utilization", "workers",
                                "quiet"))
        picked = {name: value for name, value in picked.items() if value is not None or name in NULLABLE}
        sampling = dataclasses.replace(SamplingSettings.evaluation(), **_pick(values, SAMPLING_OPTIONS))
        episode = EpisodeConfig(**_pick(values, EPISODE_OPTIONS))
        return cls(sampling=sampling, episode=episode, endpoint=EndpointConfig.from_options(values), **picked)

    def episode_for(self, mode: str) -> EpisodeConfig:
        """The episode in ``mode`` (``single``: the single-turn protocol, ``t2s.env.single_turn``)."""
        return dataclasses.replace(self.episode, mode=mode)

    @property
    def generates(self) -> bool:
        """True for a policy that generates its turns (a model, vLLM or an endpoint)."""
        return self.policy in ("model", "vllm", "endpoint")

    def default_batch_size(self) -> int:
        return self.batch_size or (256 if self.policy == "endpoint" else 64)


#: options whose value may be None on purpose (None is their default or means "none given")
NULLABLE = frozenset({"model", "tokenizer", "chat_template", "seed", "dsn", "predictions", "device", "dtype"})


@dataclass(frozen=True)
class EvalConfig:
    """An ``eval`` run: ``data`` (a BIRD/Spider-style JSON file or a folder holding dev.json), ``db_root`` (default:
    beside the data file), ``modes`` played in order into ``output/<mode>/``, ``n`` questions picked with the
    policy's seed (0: all), and whether questions whose database is missing are skipped and counted."""

    data: str
    output: str
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    modes: tuple[str, ...] = ("full",)
    n: int = 0
    db_root: str | None = None
    skip_missing_dbs: bool = False

    def __post_init__(self):
        modes = tuple(dict.fromkeys(self.modes))
        unknown = [mode for mode in modes if mode not in MODES]
        if unknown or not modes:
            raise EvalError(f"Error: unknown mode {unknown[0] if unknown else '(none)'!r} (choose from "
                            f"{', '.join(MODES)})")
        object.__setattr__(self, "modes", modes)

    @classmethod
    def from_options(cls, values: Mapping[str, Any]) -> EvalConfig:
        """The record of ``eval``'s option values (``mode`` is the list of modes)."""
        picked = _pick(values, ("data", "output", "n", "db_root", "skip_missing_dbs"))
        if values.get("mode") is not None:
            picked["modes"] = tuple(values["mode"])
        return cls(policy=PolicyConfig.from_options(values), **picked)


def read_system_prompt(path) -> str:
    """The text of a ``--system-prompt-file`` (stripped), read as train reads it (``t2s.errors.read_text_file``):
    EvalError when it is absent, no regular file, over 4 MiB, not UTF-8 or blank."""
    from t2s.errors import read_text_file

    return read_text_file(path, "system prompt file", error=EvalError).strip()
