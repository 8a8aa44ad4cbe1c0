"""`python -m t2s export`: write a model folder that vLLM loads directly from a trained checkpoint (LoRA merged, the
base's architecture and weight names, both stop tokens, a model card); the library is ``t2s.export.folder``. With
``--from-gguf FILE`` instead of ``--checkpoint``, an ordinary Hugging Face folder converted from a GGUF file
(``t2s.export.gguf``)."""

from __future__ import annotations

from t2s.export.folder import MAX_SHARD_SIZE
from t2s.ui.args import non_empty_path


def shard_size(text: str) -> str:
    """An argparse type: a size as ``huggingface_hub`` reads it (``5GB``, ``500MB``, a number of bytes)."""
    import argparse

    from huggingface_hub.serialization._base import parse_size_to_int

    try:
        if parse_size_to_int(text) > 0:
            return text
    except ValueError:
        pass
    raise argparse.ArgumentTypeError(f"{text!r} is not a size such as 5GB, 500MB or 1000000")


def add_arguments(parser) -> None:
    parser.add_argument("--checkpoint", type=non_empty_path,
                        help="trained model folder, or a LoRA adapter folder (this or --from-gguf)")
    parser.add_argument("--from-gguf", type=non_empty_path, metavar="FILE",
                        help="instead of --checkpoint: convert this GGUF file into a Hugging Face folder (float32 "
                        "weights, its tokenizer and chat template; none of the options below apply)")
    parser.add_argument("--output", required=True, type=non_empty_path,
                        help="folder to write (must be empty or absent)")
    parser.add_argument(
        "--base",
        default=None,
        help="base checkpoint (folder or hub id) whose architecture and weight names the export keeps; needed for "
        "LoRA adapters without a readable base path, and for Qwen3.5 to carry the vision tower and MTP head over",
    )
    parser.add_argument("--eval", default=None, help="an `eval` output folder whose summary goes in the model card")
    parser.add_argument("--repo-id", default=None, help="the hub id the folder will be published as, for the model "
                        "card's title and usage snippet (default: the output folder's name)")
    parser.add_argument("--max-shard-size", type=shard_size, default=MAX_SHARD_SIZE,
                        help="largest safetensors shard, e.g. 5GB or 500MB (default: %(default)s)")
    parser.add_argument("--recipe", default=None, help="the recipe YAML the model was trained with, for the model card")
    parser.add_argument("--chat-template", default=None, type=non_empty_path, metavar="FILE",
                        help="a Jinja chat template the exported tokenizer carries instead of its own (the one the "
                        "model trained with, where its own has none: a base model)")
    parser.add_argument("--no-verify", action="store_true", help="skip reloading the export and generating")
    parser.add_argument("--force", action="store_true",
                        help="write into a non-empty output folder (--from-gguf replaces it)")


# The options of a checkpoint export, with the values that mean "not given"; --from-gguf takes none of them.
CHECKPOINT_OPTIONS = {"base": None, "eval": None, "repo_id": None, "max_shard_size": MAX_SHARD_SIZE, "recipe": None,
                      "no_verify": False, "chat_template": None}


def check_sources(args) -> None:
    """Exactly one of --checkpoint and --from-gguf, and no checkpoint option with --from-gguf."""
    from t2s.errors import UsageError

    if bool(args.checkpoint) == bool(args.from_gguf):
        raise UsageError("Error: export: pass either --checkpoint DIR or --from-gguf FILE" + (
            ", not both" if args.checkpoint else ""))
    if args.from_gguf:
        given = [name for name, unset in CHECKPOINT_OPTIONS.items() if getattr(args, name) != unset]
        if given:
            flags = ", ".join("--" + name.replace("_", "-") for name in given)
            raise UsageError(f"Error: export: {flags} {'applies' if len(given) == 1 else 'apply'} to a checkpoint "
                             "export, not to --from-gguf")


def run(args) -> int:
    from t2s.settings import command_environment

    check_sources(args)
    command_environment()
    from t2s.ui.console import print_line

    if args.from_gguf:
        from t2s.export.gguf import convert_gguf

        print_line(f"Converted to {convert_gguf(args.from_gguf, args.output, force=args.force)}")
        return 0
    from t2s.export.folder import export_model

    out = export_model(  # an ExportError is one Error: line in t2s.commands.main
        args.checkpoint,
        args.output,
        base=args.base,
        eval_dir=args.eval,
        recipe=args.recipe,
        verify=not args.no_verify,
        force=args.force,
        repo_id=args.repo_id,
        max_shard_size=args.max_shard_size,
        chat_template=args.chat_template,
    )
    print_line(f"Exported to {out}")
    return 0


