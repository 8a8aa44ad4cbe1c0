"""Who plays an eval episode: a transformers model, offline vLLM, an OpenAI-compatible endpoint, the scripted gold
policy, a predictions file, or (for ``data passrate``) any scripted policy. :class:`Runner` plays jobs
``(row, sample)`` and hands each finished, scored record on.

Every mode is an episode mode (``single`` too: ``t2s.env.single_turn``), and every policy plays through the one
episode driver (``t2s.rollout.driver``): a token backend on the driver's schedules, a text policy (gold, scripted, a
chat or tools endpoint, a predictions file) through ``t2s.rollout.text_policy``, one episode a worker thread. A
prediction is a single-turn answer whose SQL is the file's, as filed, whatever mode it is evaluated under.
"""

from __future__ import annotations

import threading
import zlib
from pathlib import Path

from t2s.env.databases import file_checksum
from t2s.env.record import one_turn_record
from t2s.env.turns import ParsedTurn, ToolCall
from t2s.evaluation.records import eval_line, score_final_sql, score_record
from t2s.training.checkpoints import weights_fingerprint
from t2s.errors import EvalError

def unplayed_record(row: dict, mode: str, error: str, stop_reason: str = "error", prompt_tokens: int = 0):
    """The ``EpisodeRecord`` of an episode that could not be played (``error`` says why; it scores 0)."""
    return one_turn_record(row, mode, None, None, stop_reason=stop_reason, error=error, prompt_tokens=prompt_tokens)


def load_tokenizer(name: str | None, required: bool, chat_template: str | None = None):
    """A tokenizer by folder or hub id, with ``chat_template`` (a Jinja file) when given; None when it cannot be loaded
    and is not required. Its chat format is read here, so a template t2s cannot use stops the command at once."""
    if not name:
        if required:
            raise EvalError("Error: token-id prompts need a tokenizer: pass --tokenizer (or --model)")
        return None
    local = name.startswith(("/", ".", "~")) or name.count("/") > 1  # a hub id is "name" or "owner/name"
    if required and local and not Path(name).expanduser().exists():
        raise EvalError(f"Error: model or tokenizer folder not found: {name} (an endpoint's served name is read as a "
                        "local folder: pass --tokenizer with one, or use --endpoint-mode chat)")
    from transformers import AutoTokenizer

    from t2s.env.chat_format import ChatFormatError, apply_chat_template_file, chat_format

    try:
        tokenizer = AutoTokenizer.from_pretrained(name)
    except Exception as exc:  # noqa: BLE001 - one clear line
        if required:
            raise EvalError(f"Error: cannot load the tokenizer {name!r} ({type(exc).__name__}); pass --tokenizer, "
                            "or use --endpoint-mode chat") from None
        return None
    try:
        chat_format(apply_chat_template_file(tokenizer, chat_template))
    except ChatFormatError as exc:
        raise EvalError(str(exc)) from None
    return tokenizer


def model_backend(model: str, tokenizer_name: str | None = None, device: str | None = None,
                  max_batch_size: int | None = None, chat_template: str | None = None):
    """(HFGenerateBackend, tokenizer, device) for a transformers checkpoint (bf16 on GPU, fp32 on CPU)."""
    check_model(model)  # a bad folder is told before torch's import
    tokenizer = load_tokenizer(tokenizer_name or model, required=True, chat_template=chat_template)
    import torch
    from transformers import AutoModelForCausalLM

    from t2s.backends.hf_generate import HFGenerateBackend

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    if device == "cpu":
        from t2s.training.cpu_threads import configure_cpu_threads

        configure_cpu_threads(on_cpu=True)  # every usable core, one inter-op thread, quiet kernel fallbacks
    try:
        loaded = AutoModelForCausalLM.from_pretrained(model, dtype=dtype).to(device).eval()
    except Exception as exc:  # noqa: BLE001
        raise EvalError(f"Error: cannot load the model {model!r}: {exc}") from None
    return HFGenerateBackend(loaded, tokenizer, max_batch_size=max_batch_size), tokenizer, device


def check_model(model) -> None:
    """``checkpoints.check_model_folder`` as an EvalError: a local model folder that cannot be loaded (not a JSON
    config, weights missing or cut off), named before any library reads it."""
    from t2s.errors import ConfigError
    from t2s.training.checkpoints import check_model_folder

    try:
        check_model_folder(model) if model else None
    except ConfigError as exc:
        raise EvalError(str(exc)) from None


def model_context_length(model: str) -> int | None:
    """The longest sequence the model's config allows (``max_position_embeddings``), or None when it says none."""
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(model)
    except Exception:  # noqa: BLE001 - vLLM reports an unloadable model itself
        return None
    value = getattr(config.get_text_config(), "max_position_embeddings", None)
    return value if isinstance(value, int) and value > 0 else None


def endpoint_client(endpoint, enable_thinking: bool, episode_token_budget: int | None = None):
    """A chat client for ``endpoint`` (an ``EndpointConfig``) whose served model name is known (fails fast, after
    retries); several servers make one ``ChatClientPool``, which must all serve the same model. With
    ``episode_token_budget``, a server that states a ``max_model_len`` below it is refused here, before any episode
    (its late turns would each be refused, so that resuming the run could never finish it)."""
    from t2s.backends.chat_endpoint import ChatEndpointClient, EndpointError
    from t2s.backends.server_pool import ChatClientPool
    from t2s.backends.vllm_server import context_error

    clients = [ChatEndpointClient(
        url, model=endpoint.served_model, api_key=endpoint.api_key, request_timeout=endpoint.request_timeout,
        retries=endpoint.retries, backoff=endpoint.backoff, enable_thinking=enable_thinking,
    ) for url in endpoint.urls]  # fmt: skip
    try:
        names = {client.base_url: client.model_name() for client in clients}
    except EndpointError as exc:
        raise EvalError(f"{exc} (is the server running?)") from None
    if len(set(names.values())) > 1:
        served = ", ".join(f"{url} serves {name}" for url, name in names.items())
        raise EvalError(f"Error: the servers serve different models ({served}); name one with --served-model")
    for client in clients if episode_token_budget else ():
        problem = context_error(client.base_url, client.served_max_model_len(), episode_token_budget)
        if problem is not None:
            raise EvalError(problem)
    return clients[0] if len(clients) == 1 else ChatClientPool(clients)


def completions_backend(endpoint, tokenizer, served: str, episode_token_budget: int):
    """The vLLM server backend (token-id prompts, ``return_token_ids``): the same token stream as training; several
    servers make one ``ServerPool``. A server whose ``max_model_len`` cannot hold ``episode_token_budget`` tokens is
    refused here, before any episode."""
    from t2s.backends.server_pool import ServerPool
    from t2s.backends.vllm_server import VLLMServerBackend, context_error

    backends = [VLLMServerBackend(
        url, tokenizer, model=served, max_concurrency=endpoint.concurrency, request_timeout=endpoint.request_timeout,
        retries=endpoint.retries, backoff=endpoint.backoff, api_key=endpoint.api_key,
    ) for url in endpoint.urls]  # fmt: skip
    for backend in backends:
        try:
            problem = context_error(backend.base_url, backend.served_max_model_len(), episode_token_budget)
        except RuntimeError as exc:
            raise EvalError(str(exc)) from None
        if problem is not None:
            raise EvalError(problem)
    return backends[0] if len(backends) == 1 else ServerPool(backends)


class Runner:
    """Plays jobs ``(row, sample)`` for one policy (a ``PolicyConfig``) and calls ``emit(row, sample, record)`` as each
    finishes."""

    def __init__(self, config):
        self.config = config
        self.tokenizer = None
        self.backend = None
        self.chat_client = None
        self.predictions = None
        self.scripted = None  # policy_factory(row, sample) -> a scripted policy, played instead of config.policy
        self.target: dict = {}
        self.stopping = threading.Event()  # set on an interrupt: endpoint episodes send no further request

    # -- set-up -------------------------------------------------------------------------------------------------
    def setup(self, all_rows: list[dict], questions: list[dict] | None = None) -> None:
        """Load what the policy needs; ``questions``: the rows to play (default: all), over which a predictions
        file's questions without a prediction are counted."""
        config = self.config
        if config.policy in ("model", "vllm") and not config.model:
            raise EvalError(f"Error: --policy {config.policy} needs --model PATH")
        if config.policy == "endpoint" and not config.endpoint.url:
            raise EvalError("Error: --policy endpoint needs --endpoint URL")
        if config.policy == "predictions":
            self._setup_predictions(all_rows, questions)
        elif config.policy == "endpoint":
            self._setup_endpoint()
        elif config.policy == "model":
            self._setup_model()
        elif config.policy == "vllm":
            self._setup_vllm()

    def _setup_predictions(self, all_rows: list[dict], questions: list[dict] | None) -> None:
        from t2s.evaluation.score import PredictionsError, print_warnings, read_predictions

        path = self.config.predictions
        if not path:
            raise EvalError("Error: --policy predictions needs --predictions FILE")
        try:
            self.predictions = read_predictions(path, all_rows, questions)
        except (PredictionsError, ValueError) as exc:
            raise EvalError(str(exc)) from None
        print_warnings(self.predictions.warnings)  # the lines `score` prints for the same file
        self.target = {"predictions": str(Path(path).resolve()), "predictions_sha256": file_checksum(path)}

    def _setup_endpoint(self) -> None:
        config, endpoint = self.config, self.config.endpoint
        self.chat_client = endpoint_client(endpoint, config.episode.enable_thinking,
                                           config.episode.episode_token_budget)
        served = self.chat_client.model
        self.tokenizer = load_tokenizer(config.tokenizer or config.model or served,
                                        required=endpoint.mode == "completions", chat_template=config.chat_template)
        if endpoint.mode == "completions":
            self.backend = completions_backend(endpoint, self.tokenizer, served, config.episode.episode_token_budget)
        self.target = {"endpoint": self.chat_client.base_url, "endpoint_mode": endpoint.mode,
                       "served_model": served, "model": config.model}
        if len(endpoint.urls) > 1:  # recorded only for several, so single-server folders resume as before
            from t2s.backends.http_retry import normalise_base_url

            self.target["endpoints"] = [normalise_base_url(url) for url in endpoint.urls]

    def _setup_model(self) -> None:
        config = self.config
        self.backend, self.tokenizer, device = model_backend(config.model, config.tokenizer, config.device,
                                                             config.batch_size or None, config.chat_template)
        from importlib import metadata

        self.target = {"model": config.model, "device": device,
                       "engine": f"transformers {metadata.version('transformers')}"}
        self.target["weights_sha256"] = weights_fingerprint(config.model)

    def _setup_vllm(self) -> None:
        config = self.config
        budget = config.episode.episode_token_budget
        check_model(config.model)  # the model, its tokenizer and context first: a bad one is told before vLLM's import
        self.tokenizer = load_tokenizer(config.tokenizer or config.model, required=True,
                                        chat_template=config.chat_template)
        context = model_context_length(config.model)
        if context is not None and budget > context:
            raise EvalError(f"Error: --episode-token-budget {budget} is longer than the model's "
                            f"context of {context} tokens (max_position_embeddings); pass a budget of at most "
                            f"{context}")
        try:
            from vllm import LLM
        except ImportError:
            raise EvalError("Error: --policy vllm needs vLLM (pip install -r requirements-gpu.txt)") from None
        import vllm

        from t2s.backends.vllm_colocate import VLLMColocateBackend
        from t2s.backends.vllm_engine import checkpoint_dtype, cpu_engine_kwargs, engine_dtype, has_cuda, \
            token_ids_only, vllm_environment

        vllm_environment()
        dtype = engine_dtype(config.dtype or checkpoint_dtype(config.model))
        max_model_len = min(budget + 512, context or budget + 512)
        memory = {"gpu_memory_utilization": config.gpu_memory_utilization} if has_cuda() else {}
        try:
            llm = LLM(
                model=config.model, tokenizer=config.tokenizer or config.model, seed=config.seed, dtype=dtype,
                enable_prefix_caching=True, max_model_len=max_model_len, **memory, **token_ids_only(),
                **cpu_engine_kwargs(max_model_len),
            )  # fmt: skip
        except Exception as exc:  # noqa: BLE001 - a folder vLLM cannot load: its reason, in one line
            from t2s.errors import first_line

            raise EvalError(f"Error: vLLM cannot load the model {config.model}: {first_line(exc)}") from None
        self.backend = VLLMColocateBackend(llm, self.tokenizer)
        self.target = {"model": config.model, "engine": f"vllm {getattr(vllm, '__version__', 'unknown')}",
                       "dtype": dtype}
        self.target["weights_sha256"] = weights_fingerprint(config.model)

    # -- playing ------------------------------------------------------------------------------------------------
    def batch_size(self) -> int:
        return self.config.default_batch_size()

    def play(self, jobs: list[tuple[dict, int]], mode: str, emit) -> None:
        policy = self.config.policy
        if self.scripted is not None:
            self._play_threads(jobs, mode, emit, self._scripted_record)
        elif policy == "predictions":
            self._play_threads(jobs, mode, emit, self._prediction_record)
        elif policy == "gold":
            self._play_threads(jobs, mode, emit, self._gold_record)
        elif policy == "endpoint" and self.config.endpoint.mode in ("chat", "tools"):
            self._play_threads(jobs, mode, emit, self._chat_record, workers=self.config.endpoint.concurrency)
        else:
            self._play_rollout(jobs, mode, emit)

    def _play_threads(self, jobs, mode, emit, make_record, workers: int | None = None) -> None:
        from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait

        with ThreadPoolExecutor(max(1, workers or self.config.workers)) as pool:
            pending = {pool.submit(self._scored, make_record, row, sample, mode): (row, sample) for row, sample in jobs}
            try:
                while pending:
                    finished, _ = wait(pending, return_when=FIRST_COMPLETED)
                    failed = None
                    for future in finished:  # keep every finished result before reporting a failure
                        row, sample = pending.pop(future)
                        if future.exception() is not None:
                            failed = failed or future
                        else:
                            emit(row, sample, future.result(), scored=True)
                    if failed is not None:
                        failed.result()
            except BaseException:
                self.stopping.set()  # an endpoint's episodes in flight end at their next turn, unwritten
                for future in pending:
                    future.cancel()
                running = {future: job for future, job in pending.items() if not future.cancelled()}
                wait(running)  # as leaving the pool would: the requests already sent are answered
                for future, (row, sample) in running.items():
                    if future.exception() is None and future.result().get("error") != INTERRUPTED:
                        emit(row, sample, future.result(), scored=True)  # episodes that finished are kept
                raise

    def _scored(self, make_record, row, sample, mode) -> dict:  # make_record: (row, sample, mode) -> EpisodeRecord
        return score_record(row, make_record(row, sample, mode), sample)

    def _gold_record(self, row: dict, sample: int, mode: str):
        from t2s.backends.scripted import GoldPolicy
        from t2s.env.databases import ref_from_row
        from t2s.env.schema import get_schema
        from t2s.rollout.text_policy import run_text_episode

        try:
            schema = get_schema(ref_from_row(row))
        except Exception as exc:  # noqa: BLE001 - an unreadable database scores 0 with the reason recorded
            return unplayed_record(row, mode, f"Error: cannot read the database: {exc}")
        config = self.config.episode_for(mode)
        policy = GoldPolicy.for_episode(row, schema, config)
        return run_text_episode(row, config, policy, tokenizer=self.tokenizer)

    def _scripted_record(self, row: dict, sample: int, mode: str):
        from t2s.rollout.text_policy import run_text_episode

        return run_text_episode(row, self.config.episode_for(mode), self.scripted(row, sample),
                                tokenizer=self.tokenizer)

    def _prediction_record(self, row: dict, sample: int, mode: str):
        """A single-turn episode answered with the file's SQL (as a server-read ``submit_sql`` call: the SQL is taken
        as filed, never re-read from text); the record keeps the mode it is evaluated under."""
        import dataclasses

        from t2s.rollout.text_policy import run_text_episode

        sql = self.predictions.sql.get(row["question_id"])
        record = run_text_episode(row, self.config.episode_for("single"), PredictionPolicy(sql))
        return dataclasses.replace(record, mode=mode)

    def _chat_record(self, row: dict, sample: int, mode: str):
        from t2s.backends.chat_endpoint import ChatEndpointPolicy, EndpointError
        from t2s.backends.tools_endpoint import ToolsEndpointPolicy
        from t2s.rollout.text_policy import run_text_episode

        config = self.config
        seed = (config.seed or 0) * 1_000_003 + sample * 7919 + zlib.crc32(str(row["question_id"]).encode()) % 997
        # a single-turn answer offers no tools, in either endpoint mode
        chat_policy = ToolsEndpointPolicy if config.endpoint.mode == "tools" and mode != "single" \
            else ChatEndpointPolicy
        client = _StoppableClient(self.chat_client, self.stopping)
        try:  # without a tokenizer the episode counts the turns the server cut (finish reason "length")
            return run_text_episode(row, config.episode_for(mode), chat_policy(client, config.sampling, seed=seed),
                                    tokenizer=self.tokenizer)
        except EndpointError as exc:
            if exc.unreachable:  # no server answers: the run stops, and resumes from here
                raise EvalError(str(exc)) from None
            # the server refused this request or answered it with nothing usable: this episode ends in an error,
            # scored 0 and said in the summary, and the run goes on (a resume would meet the same answer)
            return unplayed_record(row, mode, str(exc))

    def _play_rollout(self, jobs, mode, emit) -> None:
        from t2s.rollout.driver import Rollout

        rows = [row for row, _ in jobs]
        failures: list[str] = []

        def on_finish(trace) -> None:  # scored in the rollout's worker threads (scorer), written here
            row, sample = jobs[trace.index]
            if trace.error and trace.unreachable:  # no server answers: the run stops, and resumes from here
                failures.append(trace.error)
                return
            if trace.error:  # a refused or garbled request, or an engine's failed one: as in chat mode, this episode
                # ends in an error, scored 0 and said in the summary, and the run goes on
                emit(row, sample, score_record(row, unplayed_record(row, mode, trace.error), sample), scored=True)
                return
            emit(row, sample, eval_line(row, trace.record, trace.outcome, sample), scored=True)

        try:
            rollout = Rollout(self.backend, self.tokenizer, self.config.episode_for(mode),
                              sampling=self.config.sampling, scorer=score_final_sql, on_finish=on_finish,
                              tool_workers=self.config.workers)
        except ValueError as exc:
            raise EvalError(str(exc)) from None
        rollout.run(rows)
        if failures:
            raise EvalError(f"{failures[0]} ({len(failures)} episode(s) failed; finished results are kept)")


INTERRUPTED = "Error: the run was interrupted before this turn"


class _StoppableClient:
    """A chat client that sends no request once ``stopping`` is set (Ctrl-C): each episode in flight then ends at its
    next turn, so an interrupt waits for the requests already sent, not for every turn of every episode in flight
    (an episode so ended is not written: a resume plays it)."""

    def __init__(self, client, stopping: threading.Event):
        self.client, self.stopping = client, stopping
        self.enable_thinking = client.enable_thinking

    def _go_on(self) -> None:
        from t2s.backends.chat_endpoint import EndpointError

        if self.stopping.is_set():
            raise EndpointError(INTERRUPTED)

    def complete(self, *args, **kwargs):
        self._go_on()
        return self.client.complete(*args, **kwargs)

    def complete_message(self, *args, **kwargs):
        self._go_on()
        return self.client.complete_message(*args, **kwargs)


class PredictionPolicy:
    """The text policy of a predictions file's answer: one turn whose call a reader already took, ``submit_sql`` of
    the file's SQL (no call when the file has none for the question: no answer)."""

    def __init__(self, sql: str | None):
        self.sql = sql

    def __call__(self, episode=None) -> ParsedTurn:
        text = self.sql if isinstance(self.sql, str) else ""
        calls = [ToolCall("submit_sql", {"sql": self.sql})] if isinstance(self.sql, str) else []
        return ParsedTurn(calls=calls, deviations=0, errors=[], text=text, think_end=-1, body=text)
