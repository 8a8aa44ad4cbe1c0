"""`python -m t2s eval`: the command's options and entry point.

Agentic evaluation with the same episode, tools and metrics code as training. Policies:
- ``model``: a transformers checkpoint through ``backends.hf_generate`` (CPU or GPU);
- ``vllm``: an offline ``vllm.LLM`` through ``backends.vllm_colocate``;
- ``endpoint``: an OpenAI-compatible server. ``--endpoint-mode completions`` (vLLM) sends token-id prompts with
  ``return_token_ids`` through ``backends.vllm_server``: the same token stream as training. ``chat`` works with any
  server through ``backends.chat_endpoint``; it re-renders history and drops earlier thinking, so its results are
  marked not comparable. ``tools`` is the same with the server's own function calling (``backends.tools_endpoint``:
  ``tools=``, ``tool_calls``, ``role: "tool"``), so the call format is native;
- ``gold``: the scripted self-check (``backends.scripted.GoldPolicy``), which must score 1.0;
- ``predictions``: a file of predicted SQL in the formats ``score`` reads.

Modes: ``full`` (schema in the prompt), ``withheld`` (schema found through tools), ``single`` (schema in, SQL out, no
tools: one turn, see ``t2s.evaluation.policies``).

The library is ``t2s.evaluation``: ``config`` (``EvalConfig``, built here once from the options), ``options`` (the
option groups, shared with ``ask``, ``data passrate`` and the benchmarks), ``policies`` (who plays an episode),
``records`` (an episode scored into an eval line), ``runner`` (the output folder, resume and the run) and ``report``
(summary, markdown, plot, console table); voting at k is ``t2s.scoring.voting``.
"""

from __future__ import annotations

from t2s.evaluation.options import add_eval_arguments


def add_arguments(parser) -> None:
    add_eval_arguments(parser)


def eval_config(argv: list[str]):
    """The ``EvalConfig`` that ``python -m t2s eval ARGV`` builds (bad usage exits 2, as the command does)."""
    import argparse

    from t2s.evaluation.config import EvalConfig

    parser = argparse.ArgumentParser(prog="t2s eval")
    add_arguments(parser)
    return EvalConfig.from_options(vars(parser.parse_args([str(arg) for arg in argv])))

def run(args) -> int:
    import logging

    from t2s.settings import command_environment

    command_environment()
    logging.getLogger("t2s.data.loaders").setLevel(logging.ERROR)  # eval reports missing databases itself
    from t2s.evaluation.config import EvalConfig
    from t2s.evaluation.runner import evaluate

    evaluate(EvalConfig.from_options(vars(args)))  # an EvalError or OSError becomes one Error: line in commands.main
    return 0
