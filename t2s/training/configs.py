"""Training configuration: the dataclasses a recipe YAML is parsed into with TRL's ``TrlParser``.

A recipe is one YAML mapping whose keys are fields of three dataclasses (open-r1 style)::

    T2SScriptArguments   data, filtering and the tiny-model switch of the smoke recipe
    T2SGRPOConfig        trl.GRPOConfig plus the loss, KL controller, rollout backend, episode and reward settings
    trl.ModelConfig      model path, dtype, attention implementation, LoRA

``python -m t2s train --config recipes/bird.yaml --learning_rate 5e-6`` parses the YAML, then the overrides.

Some GRPOConfig fields are derived from ours in ``__post_init__`` so that a recipe cannot contradict itself:
``use_vllm``/``vllm_mode`` from ``rollout_backend`` (``use_vllm: true`` beside the transformers backend is refused);
the vLLM importance-sampling correction from ``old_logprobs``; ``chat_template_kwargs["enable_thinking"]`` from
``enable_thinking``; on a CPU, ``bf16`` off where it has no bfloat16 instructions (:mod:`t2s.backends.cpu_precision`).
:func:`t2s.training.config_checks.validate_training_config` checks the rest when the config is built, one clear
``Error:`` message per problem (DESIGN §8): the one place a recipe is validated, whether from a YAML file or Python.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from trl import GRPOConfig, ModelConfig

from t2s.backends.cpu_precision import cpu_autocast, has_accelerator
from t2s.env.episode import EpisodeConfig
from t2s.errors import ConfigError  # defined with the other errors; imported from here by most of training

_EPISODE = EpisodeConfig()  # the episode settings' defaults, declared once there

@dataclass
class T2SScriptArguments:
    """Where the training rows come from and how they are filtered."""

    dataset_kind: str = field(
        default="bird",
        metadata={"help": "Loader kind: bird, spider, sqale, synsql, or json (BIRD/Spider-style JSON, auto-detected)."},
    )
    dataset_path: str | None = field(
        default=None,
        metadata={"help": "The data file (or its folder, or a dataset id for sqale). Relative paths are read from the "
                  "working directory, then from the repository root."},
    )
    db_root: str | None = field(
        default=None,
        metadata={"help": "Folder holding one sub-folder per db_id. Default: the data file's sibling "
                  "dev_databases/, train_databases/, database/ or databases/ folder."},
    )
    engine: str = field(
        default="sqlite",
        metadata={"help": "The databases' engine: sqlite (the files as shipped), "
                  "duckdb (<db_root>/<db_id>/<db_id>.duckdb, "
                  "as `t2s data convert --engine duckdb` writes them) or postgres (one database per db_id on the "
                  "server at `dsn`). The prompts name the engine's SQL dialect."},
    )
    dsn: str | None = field(
        default=None,
        metadata={"help": "engine postgres: the server's URL, e.g. postgresql://reader@host/postgres "
                  "(keep passwords in PGPASSWORD or ~/.pgpass). Default: $T2S_DSN."},
    )
    sqale_schemas: str | None = field(
        default=None,
        metadata={"help": "SQaLe only: the schema table (local parquet/JSONL/JSON, a folder, or a Hub id) joined to "
                  "the query rows on the schema id. None: inline DDL columns, else the published schema table."},
    )
    difficulties: list[str] | None = field(
        default=None,
        metadata={"help": "Keep only rows with these difficulty labels (simple, moderate, challenging). None keeps "
                  "every row."},
    )
    difficulty_estimated: bool = field(
        default=False,
        metadata={"help": "Estimate difficulty from the gold SQL's structure (t2s.data.difficulty) for rows without a "
                  "label (BIRD train has none) before filtering by `difficulties`. Our estimate: how the published "
                  "recipe chose simple + moderate is unknown."},
    )
    pass_rate_file: str | None = field(
        default=None,
        metadata={"help": "A JSONL of {question_id, ...} kept by the pass-rate filter (`t2s data passrate`); when "
                  "set, only those question ids train (the sibling recipe's prompts solved 1-7 times out of 8)."},
    )
    gold_hygiene: bool = field(
        default=True,
        metadata={"help": "Drop rows whose gold SQL errors, times out or returns nothing (counted and logged)."},
    )
    max_train_rows: int | None = field(
        default=None,
        metadata={"help": "Keep at most this many rows after filtering (None: all)."},
    )
    rows_seed: int = field(
        default=0,
        metadata={"help": "Seed of the shuffle applied before `max_train_rows` is taken."},
    )
    build_tiny_model: bool = field(
        default=False,
        metadata={"help": "Build the tiny offline Qwen3.5 (t2s.training.tiny_model) at model_name_or_path "
                  "when it is absent. For the smoke recipe and the CPU demo only."},
    )


@dataclass
class T2SGRPOConfig(GRPOConfig):
    """``trl.GRPOConfig`` with the published recipe's loss, the KL controller, rollouts, episodes and rewards.

    Defaults that differ from TRL's are the recipe's: ``scale_rewards="none"``, ``epsilon_high=0.28``,
    ``importance_sampling_level="sequence"``, ``use_bias_correction_kl=False``, ``beta=0.01``.
    ``loss_type`` stays ``"grpo"``: :class:`t2s.training.trainer.Text2SQLGRPOTrainer` replaces TRL's loss with
    DESIGN §8's, and start-up rejects TRL loss settings it would ignore.
    """

    # ---- loss
    loss_norm_constant: float = field(
        default=1024.0,
        metadata={"help": "Per-sequence loss L_i = sum_t(mask * token_loss) / loss_norm_constant; the step loss is "
                  "the mean of L_i over every sequence of the optimiser step. Published: 1024. Independent of "
                  "max_completion_length."},
    )
    old_logprobs: str = field(
        default="sampler",
        metadata={"help": "'sampler' (published): the ratio is taken against the rollout's own logprobs, with no "
                  "old-logprob forward pass and TRL's vLLM IS correction off. 'recompute': old logprobs come from a "
                  "forward pass before the update and TRL's token_truncate IS correction handles the sampler "
                  "mismatch. The two are different algorithms."},
    )
    shared_prompt_pass: bool = field(
        default=False,
        metadata={"help": "Run each distinct prompt of a log-prob pass once, its keys and values shared by the "
                  "episodes of that question (t2s.training.shared_prompt): the same values up to float rounding. "
                  "Models with sliding windows or linear attention (Gemma 3, Qwen3.5), and runs with gradient "
                  "checkpointing, keep the whole-row pass."},
    )
    # ---- KL controller
    target_kl: float = field(
        default=0.005,
        metadata={"help": "Target of the proportional KL controller: mean k3 over model tokens per step. Published."},
    )
    kl_horizon: float = field(
        default=10000.0,
        metadata={"help": "Controller horizon: beta <- beta * (1 + clip(KL/target - 1, -0.2, 0.2) * n / horizon), "
                  "n = episodes in the step. Our choice (Ziegler et al. 2019)."},
    )
    beta_min: float = field(default=1e-4, metadata={"help": "Lower bound of beta (must be > 0). Our choice."})
    beta_max: float = field(default=1.0, metadata={"help": "Upper bound of beta. Our choice."})
    # ---- rollout backend
    rollout_backend: str = field(
        default="transformers",
        metadata={"help": "transformers (turn-synchronous model.generate; CPU or GPUs without vLLM), vllm_colocate "
                  "(the trainer's own vLLM engine, turn-synchronous), or vllm_server (per-episode async requests to "
                  "`make serve`; each rank talks to the server itself)."},
    )
    rollout_concurrency: int = field(
        default=64, metadata={"help": "vllm_server: at most this many requests in flight per rank."})
    rollout_request_timeout: float = field(
        default=600.0, metadata={"help": "vllm_server: seconds before one /v1/completions request is abandoned."})
    vllm_dtype: str | None = field(
        default=None,
        metadata={"help": "vllm_colocate: the engine's dtype (float32, bfloat16, ...). Default: the checkpoint's own, "
                  "so that the sampler's logprobs match the trainer's (vLLM's own default turns float32 into bf16 on "
                  "a CPU)."},
    )
    vllm_server_sync: str | None = field(
        default=None,
        metadata={"help": "vllm_server: how weights reach the server after each step: nccl (TRL's weight-transfer "
                  "group; needs CUDA) or files (saved under output_dir, reloaded by the dev-mode server through "
                  "/collective_rpc; any machine sharing a filesystem with the server). Default: nccl where CUDA is, "
                  "else files."},
    )
    rollout_max_batch_size: int | None = field(
        default=None, metadata={"help": "transformers backend: sequences per generate call (None: a whole turn)."})
    # ---- episode (t2s.env.episode.EpisodeConfig, whose defaults these are)
    mode: str = field(
        default=_EPISODE.mode,
        metadata={"help": "full (CREATE TABLEs in the prompt) or withheld (schema discovered through tools)."},
    )
    dialect: str = field(default=_EPISODE.dialect, metadata={"help": "Tool dialect: exec_plan or sibling."})
    tool_format: str = field(
        default=_EPISODE.tool_format,
        metadata={"help": "Call format: json (one JSON object per call) or native (the chat template's tool "
                          "calling, tools=)."},
    )
    max_turns: int = field(
        default=_EPISODE.max_turns,
        metadata={"help": "Tool turns per episode before the forced final turn. Published: 6."},
    )
    max_calls_per_turn: int = field(
        default=_EPISODE.max_calls_per_turn,
        metadata={"help": "Tool calls run per turn; more get an error line."},
    )
    max_failed_queries: int = field(
        default=_EPISODE.max_failed_queries,
        metadata={"help": "Consecutive failed run_query calls that end the exploration."},
    )
    episode_tool_seconds: float = field(
        default=_EPISODE.episode_tool_seconds,
        metadata={"help": "Tool-time budget of one episode (seconds)."},
    )
    tool_timeout: float = field(default=_EPISODE.tool_timeout, metadata={"help": "Seconds one tool query may run."})
    episode_token_budget: int = field(
        default=_EPISODE.episode_token_budget,
        metadata={"help": "Tokens of one whole episode, prompt included. Published: 12288."},
    )
    max_tokens_per_turn: int = field(
        default=_EPISODE.max_tokens_per_turn,
        metadata={"help": "Cap on one generation call."},
    )
    forced_turn_reserve: int = field(
        default=_EPISODE.forced_turn_reserve,
        metadata={"help": "Budget tokens kept for the forced final turn."},
    )
    min_episode_tokens: int = field(
        default=_EPISODE.min_episode_tokens,
        metadata={"help": "Rows whose prompt leaves less than this of the budget are dropped from training (counted)."},
    )
    column_descriptions: bool = field(
        default=_EPISODE.column_descriptions,
        metadata={"help": "Add BIRD column descriptions to describe_table."},
    )
    system_prompt_file: str | None = field(
        default=_EPISODE.system_prompt_file,
        metadata={"help": "Replace the system prompt with this file's text."},
    )
    enable_thinking: bool = field(
        default=_EPISODE.enable_thinking,
        metadata={"help": "Render every prompt with enable_thinking=True (Qwen3.5-2B ships the no-think template); a "
                  "template without a think block plays without thinking."},
    )
    chat_template: str | None = field(
        default=None,
        metadata={"help": "A Jinja chat template file for a tokenizer that has none (a base model such as Gemma 3 "
                  "270M); it is saved with every checkpoint."},
    )
    # ---- rewards
    reward_names: list[str] = field(
        default_factory=lambda: ["dense"],
        metadata={"help": "Reward functions by name, from t2s.scoring.rewards.REWARD_FUNCS (dense, sibling)."},
    )
    fallback_reward_scale: float = field(
        default=1.0,
        metadata={"help": "Multiplies the dense reward of episodes whose final SQL came from the fallback. "
                  "Our choice."},
    )

    # ---- TRL defaults the recipe changes
    beta: float = field(default=0.01, metadata={"help": "Initial KL coefficient beta0 (controller start). Never 0: "
                                                        "TRL builds the reference model only when beta != 0."})
    scale_rewards: str = field(default="none", metadata={"help": "Advantage std normalisation: none (published)."})
    epsilon_high: float = field(default=0.28, metadata={"help": "Upper clip (DAPO clip-higher). Published: 0.28."})
    importance_sampling_level: str = field(default="sequence", metadata={"help": "Sequence-level ratio. Published."})
    use_bias_correction_kl: bool = field(default=False, metadata={"help": "Plain k3 (off). Published."})
    loss_type: str = field(default="grpo", metadata={"help": "Must stay grpo: the t2s trainer replaces TRL's loss "
                                                            "aggregation with sum over tokens / loss_norm_constant."})
    num_completions_to_print: int | None = field(
        default=0, metadata={"help": "Completions TRL prints to the console at each log (0: none; with "
                             "log_completions they are written to <output_dir>/completions "
                             "and `t2s show` reads them)."})

    def __post_init__(self) -> None:
        from t2s.training.config_checks import check_groups_per_rank, check_kinds, validate_training_config

        check_kinds(self)  # before anything compares or divides them
        check_groups_per_rank(self)
        if self.rollout_backend in ("vllm_colocate", "vllm_server"):
            self.use_vllm = True
            self.vllm_mode = "colocate" if self.rollout_backend == "vllm_colocate" else "server"
        elif self.rollout_backend == "transformers" and self.use_vllm:  # TRL's switch; here the backend chooses
            raise ConfigError("Error: use_vllm: true with rollout_backend: transformers; t2s chooses the generator "
                              "with rollout_backend (vllm_colocate or vllm_server), which sets use_vllm and vllm_mode")
        # sampler: the ratio is taken against the rollout's logprobs directly; recompute: TRL's correction.
        self.vllm_importance_sampling_correction = self.old_logprobs == "recompute"
        if self.old_logprobs == "recompute":
            self.vllm_importance_sampling_mode = "token_truncate"
        self.chat_template_kwargs = {**(self.chat_template_kwargs or {}), "enable_thinking": bool(self.enable_thinking)}
        if not (self.use_cpu or has_accelerator()):
            # without this, a run started by a GPU launch config (accelerate's torchrun path, as slurm/node.sh starts
            # machines) on a CPU-only machine sees no device group: every process would train alone
            self.use_cpu = True
        super().__post_init__()
        if self.use_cpu:
            cpu_autocast(self)  # TRL's bf16 (true unless set) only where the CPU has bfloat16 instructions
        validate_training_config(self)  # the one place a recipe is validated: every config is, when it is built

    def episode_config(self):
        """The :class:`t2s.env.episode.EpisodeConfig` these settings describe."""
        names = {f.name for f in fields(EpisodeConfig)}
        return EpisodeConfig(**{name: getattr(self, name) for name in names if hasattr(self, name)})


def parse_recipe(argv: list[str] | None = None):
    """Parse ``--config recipe.yaml [overrides]`` into (script_args, training_args, model_args)."""
    from trl import TrlParser

    return parse_with(TrlParser((T2SScriptArguments, T2SGRPOConfig, ModelConfig)), argv)


def parse_with(parser, argv: list[str] | None):
    """``parser.parse_args_and_config(argv)`` (a ``TrlParser``; ``train`` and ``sft``), its refusals as one
    ConfigError line each: the recipe's YAML, a value argparse cannot read (with no usage text), settings it does not
    know (with the nearest known name)."""
    import difflib

    recipe = argv[argv.index("--config") + 1] if argv and "--config" in argv[:-1] else None
    if recipe:
        check_recipe_yaml(recipe)
    where = f"recipe {recipe} or the flags after it" if recipe else "the flags"

    def error(message: str):
        raise ConfigError(f"Error: {where}: {message}")

    parser.error = error  # argparse would print its usage text and exit
    try:
        parsed = parser.parse_args_and_config(argv)
        from t2s.training.config_checks import check_choices, check_kinds, check_numbers, check_output_dir, \
            check_report_to

        for settings in parsed:  # the script arguments too, which check nothing when built
            check_kinds(settings)
            check_choices(settings)
            check_numbers(settings)  # sft's config too (train's is checked as it is built)
        config, model = parsed[1], parsed[-1]
        check_report_to(config)
        check_output_dir(getattr(config, "output_dir", None), getattr(model, "model_name_or_path", None))
        return parsed
    except TypeError as exc:  # a library's own setting of the wrong kind, taken apart in its __post_init__
        from t2s.errors import first_line

        raise ConfigError(f"Error: {where}: a setting holds a value of the wrong kind ({first_line(exc)})") from None
    except ValueError as exc:
        if not str(exc).startswith("Unknown arguments from config file"):
            raise
        import yaml

        known = [action.dest for action in parser._actions]
        with open(recipe, encoding="utf-8") as handle:
            keys = [str(key) for key in yaml.safe_load(handle) if key != "env" and key not in known]
        named = [key + "".join(f" (did you mean {m}?)" for m in difflib.get_close_matches(key, known, 1))
                 for key in keys]
        raise ConfigError(f"Error: recipe {recipe} has settings t2s does not know: {', '.join(named)}") from None


MAX_RECIPE_DEPTH = 8


def check_recipe_yaml(path) -> None:
    """ConfigError naming the file and line when a recipe is not a YAML mapping of settings."""
    import yaml

    class UniqueKeys(yaml.SafeLoader):  # a setting written twice is a mistake that PyYAML resolves silently
        def construct_mapping(self, node, deep=False):
            seen = set()
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *anchor`: merged keys may be overridden
                    continue
                key = self.construct_object(key_node, deep=deep)
                if isinstance(key, str) and key in seen:
                    raise yaml.constructor.ConstructorError(None, None, f"{key!r} is set a second time",
                                                            key_node.start_mark)
                if isinstance(key, str):
                    seen.add(key)
            return super().construct_mapping(node, deep=deep)

    try:
        with open(path, encoding="utf-8") as handle:
            document = yaml.load(handle, Loader=UniqueKeys)  # noqa: S506 - a SafeLoader
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1} column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"Error: recipe {path} is not valid YAML{where}: {problem}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"Error: recipe {path} is not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except RecursionError:
        raise ConfigError(f"Error: recipe {path} nests too deeply to be a recipe") from None
    if not isinstance(document, dict):
        raise ConfigError(f"Error: recipe {path} must be a YAML mapping of settings, found {type(document).__name__}")
    named = [key for key in document if not isinstance(key, str)]
    if named:  # `5: 3` or `~: 3` names no setting
        raise ConfigError(f"Error: recipe {path} has a setting whose name is not text: {named[0]!r}")
    for key in ("output_dir", "model_name_or_path"):  # paths the libraries take apart before any check of ours
        if not isinstance(document.get(key, ""), (str, type(None))):
            raise ConfigError(f"Error: recipe {path}: {key} must be text, got {document[key]!r}")
    stack, seen = [(document, 0)], 0  # walked without recursion: aliases can make a small file a huge tree
    while stack:
        value, depth = stack.pop()
        seen += 1
        if depth > MAX_RECIPE_DEPTH or seen > 100_000:  # a setting's value: a mapping or list (DeepSpeed's nest 4)
            raise ConfigError(f"Error: recipe {path} " + (f"nests deeper than {MAX_RECIPE_DEPTH} levels" if depth >
                              MAX_RECIPE_DEPTH else "expands to over 100,000 values (YAML aliases?)"))
        items = value.values() if isinstance(value, dict) else value if isinstance(value, list) else ()
        stack += [(item, depth + 1) for item in items]
