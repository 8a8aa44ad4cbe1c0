"""What t2s reads from a model's chat template and generation config, instead of assuming one chat family.

Chat families differ in the token that ends a turn (``<|im_end|>``, ``<end_of_turn>``, ``<|eot_id|>``), in whether a
system role exists (Gemma has none), in whether the template opens a think block (Qwen3.5 does when asked with
``enable_thinking=True``; SmolLM2's does not), and in how tool calls are written. :func:`chat_format` renders a few
probe conversations through the tokenizer's own template once and reads each of these from the result:

- **end of turn**: the first special token the template writes after an assistant message's content;
- **stop tokens**: the end of turn, then the tokenizer's ``eos_token`` and the generation config's ``eos_token_id``
  (read from the tokenizer's folder; an id that is not one of the tokenizer's is left out, as an eos the tokenizer
  does not know), without any token that opens a turn in the template (a GGUF-converted tokenizer can name
  ``<|im_start|>`` as its eos, and stopping there would be wrong), and without one that is no special or added token,
  or is a think tag (a ``)`` or a ``</think>`` would cut every turn short). Such a disagreement is said once. A stop
  token past the model's embedding (``vocab_size`` of the folder's ``config.json``, or of its ``text_config``) is
  refused: the environment writes the end of turn into the token stream, and the model cannot read it;
- **thinking**: whether the generation prompt ends in ``<think>\\n`` when rendered with ``enable_thinking=True``.
  Without a think block, thinking is off, said once;
- **system role**: a template that refuses a system message gets the system prompt folded into the first user
  message, as templates that fold it themselves (Gemma 3's) do;
- **native tools**: whether the template writes a tool call as Qwen3.5's ``<tool_call><function=...>`` XML. The native
  tool format needs it; every template takes the json format;
- **the environment's turn**: the template's text between the end of an assistant turn and a user message's content
  (``user_head``), and from the end of that content to the next generation prompt's end (``user_tail``).

A tokenizer with no chat template (a base model) gets a clear error naming the fix: ``--chat-template FILE`` or the
recipe key ``chat_template``, read by :func:`apply_chat_template_file`. A template that fails on a probe, or takes
more than ``RENDER_SECONDS`` to render one (a loop; timed in the main thread, where commands read it), is refused the
same way.

The folder's ``generation_config.json`` and ``config.json`` are read only when they are regular files of at most
1 MiB and 16 MiB; anything else (a FIFO, a device, a larger file: no model's config is) is refused with a
:class:`ChatFormatError` naming the file, unread. A file that is unreadable or not a JSON object counts as absent.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import stat
import threading
import time
import weakref
from dataclasses import dataclass
from pathlib import Path

from t2s.errors import T2SError, read_text_file

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
_SENTINEL = "\x00t2s-{}\x00"  # survives a template's trim; never in a rendered template
_PROBE_USER, _PROBE_SYSTEM = "Which tables exist?", "You answer questions."
_MAX_FOLDER_JSON = 1 << 20  # bytes of a model folder's generation_config.json (a few hundred)
_MAX_MODEL_CONFIG = 16 << 20  # bytes of its config.json (kilobytes; a quantization config can list many modules)


class ChatFormatError(T2SError, ValueError):
    """A tokenizer whose chat template t2s cannot use; the message is one ``Error:`` line with the fix."""


@dataclass(frozen=True)
class ChatFormat:
    """One tokenizer's chat format, as its template renders it (see the module docstring)."""

    end_of_turn: str
    end_of_turn_id: int
    stop_ids: tuple[int, ...]  # the end of turn first
    stop_tokens: tuple[str, ...]
    thinking: bool
    system_role: bool
    native_tools: bool
    user_head: dict  # {enable_thinking: the template's text between the end of turn and a user message's content}
    user_tail: dict  # {enable_thinking: the text from the end of that content to the generation prompt's end}
    notes: tuple[str, ...] = ()

    def thinking_for(self, requested: bool) -> bool:
        """Thinking as the template can render it: off when it has no think block (said once, see ``notes``)."""
        return bool(requested and self.thinking)

    def fold_system(self, messages: list[dict]) -> list[dict]:
        """``messages`` as the template takes them: without a system role, the system prompt opens the first user
        message (separated by a blank line)."""
        if self.system_role or not messages or messages[0].get("role") != "system":
            return messages
        system, rest = messages[0], list(messages[1:])
        for i, message in enumerate(rest):
            if message.get("role") == "user":
                rest[i] = {**message, "content": f"{str(system['content']).strip()}\n\n{message['content']}"}
                return rest
        return [{"role": "user", "content": system["content"]}, *rest]

    def episode_config(self, config):
        """``config`` (an ``EpisodeConfig``) as this template can play it: thinking off where it has no think block;
        the native tool format refused where the template does not write native calls."""
        if getattr(config, "tool_format", "json") == "native" and not self.native_tools:
            raise ChatFormatError(
                "Error: the chat template does not write tool calls in Qwen3.5's XML form (<tool_call><function=...>), "
                "so the native tool format cannot be used with this model; use tool_format: json (--tool-format json)"
            )
        if config.enable_thinking and not self.thinking:
            return dataclasses.replace(config, enable_thinking=False)
        return config


_CACHE: dict[tuple, tuple] = {}  # key -> (the tokenizer, its format)
_SAID: set[str] = set()
_LOCK = threading.Lock()


def chat_format(tokenizer) -> ChatFormat:
    """The tokenizer's chat format, read from its template once (cached per tokenizer and template: an entry holds the
    tokenizer weakly and serves only that object, never a later tokenizer that reuses a freed one's ``id``)."""
    template = getattr(tokenizer, "chat_template", None)
    key = (id(tokenizer), template if isinstance(template, str) else repr(template), len(tokenizer))
    with _LOCK:
        ref, found = _CACHE.get(key, (None, None))
    if found is not None and ref() is tokenizer:
        return found
    fmt = _read(tokenizer)
    with _LOCK:
        for stale in [k for k, (r, _) in _CACHE.items() if r() is None]:
            del _CACHE[stale]
        _CACHE[key] = (_ref(tokenizer), fmt)
        fresh = [note for note in fmt.notes if note not in _SAID]
        _SAID.update(fresh)
    if fresh:
        from t2s.ui.console import print_line

        for note in fresh:
            print_line(f"note: {note}", stderr=True)
    return fmt


def _ref(tokenizer):
    """A weak reference to ``tokenizer``; a strong one where its type takes none (kept, so its id stays its own)."""
    try:
        return weakref.ref(tokenizer)
    except TypeError:
        return lambda: tokenizer


def apply_chat_template_file(tokenizer, path: str | Path | None):
    """Give ``tokenizer`` the Jinja chat template in ``path`` (``--chat-template`` / recipe ``chat_template``)."""
    if not path:
        return tokenizer
    text = read_text_file(path, "chat template file")
    tokenizer.chat_template = text
    return tokenizer


def _name(tokenizer) -> str:
    return str(getattr(tokenizer, "name_or_path", "") or "the model")


RENDER_SECONDS = 10.0  # a probe conversation renders in milliseconds; a template that loops never ends


class _RenderTimeout(BaseException):  # BaseException: no handler inside the template's code can swallow it
    pass


@contextlib.contextmanager
def _time_limit(seconds: float):
    """Raise _RenderTimeout in the block after ``seconds`` (main thread only, by SIGALRM; elsewhere no limit). A timer
    already set (pytest-timeout's) keeps its time: due first, it fires then (its handler runs, and the block goes on
    under the time it has left); due later, it is set again afterwards with what remains of it."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "setitimer"):
        yield
        return
    started = time.monotonic()
    outer = {"due_first": False, "fired": False}

    def on_alarm(signum, frame):
        if outer["due_first"]:
            outer["due_first"], outer["fired"] = False, True
            if callable(previous):
                previous(signum, frame)  # may raise: it ends the block as it would have
            left = seconds - (time.monotonic() - started)
            if left > 0:
                signal.setitimer(signal.ITIMER_REAL, left)
                return
        raise _RenderTimeout

    previous = signal.signal(signal.SIGALRM, on_alarm)
    old_delay, old_interval = signal.setitimer(signal.ITIMER_REAL, seconds)
    if old_delay and old_delay < seconds:  # the outer timer is due first
        outer["due_first"] = True
        signal.setitimer(signal.ITIMER_REAL, old_delay)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        if old_delay and not outer["fired"]:
            signal.setitimer(signal.ITIMER_REAL, max(old_delay - (time.monotonic() - started), 1e-3), old_interval)
        elif outer["fired"] and old_interval:  # a repeating outer timer goes on repeating
            signal.setitimer(signal.ITIMER_REAL, old_interval, old_interval)


def _too_slow(tokenizer) -> ChatFormatError:
    return ChatFormatError(f"Error: the chat template of {_name(tokenizer)} takes more than {RENDER_SECONDS:g} s to "
                           "render a plain conversation (a loop?); fix it or pass --chat-template FILE")


def _render(tokenizer, messages, *, generation: bool, thinking: bool = False, **extra) -> str:
    try:
        with _time_limit(RENDER_SECONDS):
            return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation,
                                                 enable_thinking=thinking, **extra)
    except _RenderTimeout:
        raise _too_slow(tokenizer) from None
    except Exception as exc:  # noqa: BLE001 - a template's own error, one line
        raise ChatFormatError(f"Error: the chat template of {_name(tokenizer)} fails on a plain conversation: "
                              f"{type(exc).__name__}: {exc}") from None


def _special_tokens(tokenizer) -> list[str]:
    """Added and special tokens, longest first (a template's tags)."""
    tokens = set(getattr(tokenizer, "all_special_tokens", ()) or ())
    try:
        tokens.update(tokenizer.get_added_vocab())
    except Exception:  # noqa: BLE001 - a tokenizer without added vocab
        pass
    return sorted((t for t in tokens if isinstance(t, str) and t), key=len, reverse=True)


def _first_token(text: str, tokens: list[str]) -> str | None:
    """The first of ``tokens`` that occurs in ``text`` (template text is short: a plain scan)."""
    for pos in range(len(text)):
        for token in tokens:
            if text.startswith(token, pos):
                return token
    return None


def _token_id(tokenizer, token: str | None) -> int | None:
    if not token:
        return None
    tid = tokenizer.convert_tokens_to_ids(token)
    return tid if isinstance(tid, int) and tid != getattr(tokenizer, "unk_token_id", None) else None


def _folder_json(tokenizer, file_name: str, limit: int = _MAX_FOLDER_JSON) -> dict:
    """The JSON object in ``file_name`` beside the tokenizer (a local folder): ``{}`` when there is none (a hub id, a
    dangling link), or it is unreadable or not a JSON object; a ChatFormatError, the file unread, when it is not a
    regular file or is larger than ``limit`` bytes."""
    name = str(getattr(tokenizer, "name_or_path", "") or "")
    path = Path(name) / file_name
    if not name or not os.path.exists(path):
        return {}
    try:
        regular = path.is_file()  # stat, not open: opening a FIFO waits for a writer, a device may act on it
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY) if regular else None
    except OSError:
        return {}
    if fd is not None:
        with os.fdopen(fd, "rb") as handle:
            regular = stat.S_ISREG(os.fstat(fd).st_mode)  # the file opened: it may have been replaced since
            try:
                data = handle.read(limit + 1) if regular else b""
            except OSError:
                return {}
    if not regular:
        raise ChatFormatError(f"Error: {file_name} of {name} is not a regular file; a model folder's {file_name} is "
                              "a JSON file. Replace it or remove it")
    if len(data) > limit:
        raise ChatFormatError(f"Error: {file_name} of {name} is larger than {limit >> 20} MiB; a model "
                              f"folder's {file_name} is a few kilobytes of JSON. Replace it or remove it")
    try:
        value = json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError):  # not UTF-8, not JSON, nested past Python's limits
        return {}
    return value if isinstance(value, dict) else {}


def _ids(value) -> list[int]:
    values = value if isinstance(value, list) else [value]
    return [v for v in values if isinstance(v, int) and not isinstance(v, bool)]


def _generation_eos(tokenizer) -> list[int]:
    """``eos_token_id`` of ``generation_config.json`` beside the tokenizer, as a list of the tokenizer's ids (an id
    outside ``0..len(tokenizer)-1`` names no token: left out, as an eos the tokenizer does not know)."""
    return [v for v in _ids(_folder_json(tokenizer, "generation_config.json").get("eos_token_id"))
            if 0 <= v < len(tokenizer)]


def _vocab_size(tokenizer) -> int | None:
    """The model's embedding rows: ``vocab_size`` of ``config.json`` beside the tokenizer (or of its
    ``text_config``); None where the folder names no positive number."""
    config = _folder_json(tokenizer, "config.json", _MAX_MODEL_CONFIG)
    text_config = config.get("text_config")
    for value in (config.get("vocab_size"), text_config.get("vocab_size") if isinstance(text_config, dict) else None):
        if isinstance(value, int) and not isinstance(value, bool):
            return value if value > 0 else None
    return None


def _read(tokenizer) -> ChatFormat:
    name = _name(tokenizer)
    if not getattr(tokenizer, "chat_template", None):
        raise ChatFormatError(
            f"Error: the tokenizer of {name} has no chat template (a base model?); t2s renders every prompt with the "
            "model's chat template. Pass --chat-template FILE (a Jinja chat template) or set chat_template: FILE in "
            "the recipe"
        )
    if not isinstance(tokenizer.chat_template, str):  # named templates: transformers picks "tool_use" when a request
        # declares tools and "default" otherwise, so a format read from one would not be what the other renders
        named = ", ".join(map(str, tokenizer.chat_template)) if isinstance(tokenizer.chat_template, dict) else "?"
        raise ChatFormatError(
            f"Error: the tokenizer of {name} has several named chat templates ({named}); t2s renders every prompt "
            "with one template. Pass --chat-template FILE (the one to train and serve with) or set chat_template: "
            "FILE in the recipe"
        )
    notes: list[str] = []
    tokens = _special_tokens(tokenizer)
    system = [{"role": "system", "content": _PROBE_SYSTEM}]
    user = [{"role": "user", "content": _PROBE_USER}]
    try:
        with _time_limit(RENDER_SECONDS):
            tokenizer.apply_chat_template(system + user, tokenize=False, add_generation_prompt=True)
        system_role = True
    except _RenderTimeout:
        raise _too_slow(tokenizer) from None
    except Exception:  # noqa: BLE001 - the template refuses a system message
        system_role = False
        notes.append(f"the chat template of {name} has no system role; the system prompt opens the first user message")
    lead = system if system_role else []

    answer = _SENTINEL.format("assistant")
    closed = _render(tokenizer, lead + user + [{"role": "assistant", "content": answer}] + user, generation=False)
    if answer not in closed:
        raise ChatFormatError(f"Error: the chat template of {name} does not render an assistant message's content")
    after = closed[closed.index(answer) + len(answer):]
    end_of_turn = _first_token(after[: after.find(_PROBE_USER)] if _PROBE_USER in after else after, tokens)
    end_id = _token_id(tokenizer, end_of_turn)
    if end_id is None or not after.lstrip(" ").startswith(end_of_turn):
        raise ChatFormatError(
            f"Error: the chat template of {name} does not end an assistant turn with a special token right after its "
            f"content (it writes {after[:40]!r}); t2s stops generation on that token. Pass --chat-template FILE"
        )

    prompt_text = _render(tokenizer, lead + user, generation=True, thinking=True)
    if prompt_text == _render(tokenizer, lead + user, generation=False, thinking=True):
        raise ChatFormatError(
            f"Error: the chat template of {name} renders no generation prompt (add_generation_prompt adds nothing "
            "after the user's turn), so the model would go on writing the user's turn. Pass --chat-template FILE"
        )
    thinking = prompt_text.endswith(f"{THINK_OPEN}\n")
    openers = {t for t in tokens if t != end_of_turn and t in prompt_text}  # bos, turn openers: never a stop
    stop_ids, stop_tokens = [end_id], [end_of_turn]
    candidates = [getattr(tokenizer, "eos_token", None)] + [tokenizer.convert_ids_to_tokens(i)
                                                            for i in _generation_eos(tokenizer)]
    for token in candidates:
        tid = _token_id(tokenizer, token) if isinstance(token, str) else None
        if tid is None or tid in stop_ids:
            continue
        if token in openers:
            notes.append(f"the tokenizer of {name} names {token} as its eos token, but its chat template opens turns "
                         f"with it; generation stops on {end_of_turn}, the template's end of turn")
            continue
        if token not in tokens or token in (THINK_OPEN, THINK_CLOSE):  # text a turn holds, or its thinking's tags
            notes.append(f"the tokenizer of {name} names {token!r} as an eos token, but it is no special token that "
                         f"ends a turn (stopping there would cut turns short); generation stops on {end_of_turn}")
            continue
        stop_ids.append(tid)
        stop_tokens.append(token)
    vocab_size = _vocab_size(tokenizer)
    for token, tid in zip(stop_tokens, stop_ids):
        if vocab_size is not None and tid >= vocab_size:
            raise ChatFormatError(
                f"Error: the stop token {token} of {name} (id {tid}) is past the model's embedding (config.json "
                f"vocab_size {vocab_size}), so the model cannot read it when a turn ends with it. Resize the model's "
                "embeddings to the tokenizer, or pass --chat-template FILE"
            )

    heads, tails = {}, {}
    observation = _SENTINEL.format("observation")
    for think in (True, False):
        text = _render(tokenizer, lead + user + [{"role": "assistant", "content": answer},
                                                 {"role": "user", "content": observation}],
                       generation=True, thinking=think)
        when = f"with add_generation_prompt=True and enable_thinking={think}"
        start = text.find(answer)
        if start < 0:
            raise ChatFormatError(f"Error: the chat template of {name} does not render an assistant message's content "
                                  f"{when}; t2s renders every earlier turn as the template writes it. Pass "
                                  "--chat-template FILE")
        rest = text[start + len(answer):]
        seen = rest.find(observation)
        if seen < 0:
            raise ChatFormatError(f"Error: the chat template of {name} does not render a user message's content after "
                                  f"an assistant turn {when}. Pass --chat-template FILE")
        end = rest.find(end_of_turn, 0, seen)
        if end < 0:
            raise ChatFormatError(f"Error: the chat template of {name} does not end an assistant turn with "
                                  f"{end_of_turn} {when}, as it does without a generation prompt; t2s writes the "
                                  "turns as the template does. Pass --chat-template FILE")
        heads[think], tails[think] = rest[end + len(end_of_turn):seen], rest[seen + len(observation):]
    if not thinking:
        notes.append(f"the chat template of {name} opens no think block; turns are read without thinking")

    call = {"type": "function", "function": {"name": "probe_tool", "arguments": {"sql": "SELECT 1"}}}
    try:
        rendered = _render(tokenizer, lead + user + [{"role": "assistant", "content": "", "tool_calls": [call]}],
                           generation=False)
    except ChatFormatError:
        rendered = ""
    native = "<tool_call>" in rendered and "<function=probe_tool>" in rendered
    return ChatFormat(end_of_turn, end_id, tuple(stop_ids), tuple(stop_tokens), thinking, system_role, native,
                      heads, tails, tuple(notes))
