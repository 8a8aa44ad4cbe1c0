"""Converting a GGUF file (llama.cpp's single-file format) into an ordinary Hugging Face model folder.

``convert_gguf(gguf_path, output_dir)`` loads the file with transformers' own GGUF reader
(``AutoModelForCausalLM.from_pretrained(folder, gguf_file=name)`` and ``AutoTokenizer.from_pretrained`` likewise),
every weight dequantised to ``dtype`` (float32 by default), and writes what transformers, TRL and vLLM load like any
checkpoint: ``model.safetensors``, ``config.json``, ``generation_config.json`` and the tokenizer files. The command is
``t2s export --from-gguf FILE --output DIR``.

- **Quantizer marks cleared.** transformers records a GGUF load as a quantized model (``hf_quantizer``, the config's
  ``quantization_config``) and refuses to save one ("quantized with QuantizationMethod.GGUF and is not serializable").
  Every weight is dense here (the load asks for ``GgufConfig(dequantize=True)``, and this is checked), so the marks
  are dropped and the folder's ``config.json`` describes a plain model of ``dtype``.
- **What the GGUF says is kept.** The config, generation config, special tokens and chat template are the ones
  transformers reads from the file; nothing is corrected, not even a tokenizer whose ``eos_token`` disagrees with
  its chat template or its generation config (SmolLM2's: transformers' reader makes it ``<|im_start|>``, while the
  file and the config say ``<|im_end|>``; callers that care handle that). Two things the reader loses are put back
  as the file says them: ``tokenizer.ggml.add_bos_token`` / ``add_eos_token`` (Gemma's BOS), and a SentencePiece
  vocabulary's segmentation (:func:`spm_as_bpe`: BPE merges by score, as llama.cpp tokenizes it).
- **The tokenizer reads back.** The saved tokenizer is reloaded with ``AutoTokenizer`` and must match the one read
  from the file (size, special tokens, chat template, the ids of a probe text), or the conversion fails.
- **Atomic.** The folder is written under a hidden temporary name beside ``output_dir`` (``.NAME.partial-*``) and
  renamed into place at the end, so an interrupted conversion never leaves a half-written ``output_dir`` (a killed
  one may leave the hidden folder, which nothing reads); ``force`` replaces an existing folder.
- **Checksummed.** ``t2s_gguf.json`` records the source file's name and sha256 and :func:`content_sha256` of the
  result (tensor names, dtypes, shapes and bytes in sorted order, plus the tokenizer's vocabulary), so a fixture can
  tell a finished, unchanged conversion from anything else.
- **Read once.** transformers parses the whole file for the config, again for the model, and twice more for the
  tokenizer (each time every one of its metadata fields, the vocabulary's strings among them), and maps tensor names
  anew for each of the model's modules. While a file loads (:func:`_parsed_once`), ``gguf.GGUFReader`` hands back the
  one reader of that file and ``gguf.get_tensor_name_map`` the one map of an architecture and depth: the same bytes,
  read once (a conversion in a fresh process: SmolLM2's 25 s to 12 s, Gemma 3's 71 s to 36 s, the same folders).
- **Errors.** A missing, unreadable or corrupt file (the header is read first, and the file must hold all the tensor
  data it declares), an architecture this transformers cannot load, or an output folder in the way is one
  :class:`~t2s.errors.ExportError` (one ``Error:`` line on the command line).
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import os
import shutil
import struct
import tempfile
from contextlib import contextmanager
from pathlib import Path

from t2s.env.databases.hashing import file_checksum as file_sha256
from t2s.errors import ExportError
from t2s.settings import match_umask

GGUF_MAGIC = b"GGUF"
SOURCE_FILE = "t2s_gguf.json"  # {source_file, source_sha256, content_sha256, architecture, dtype}
DTYPES = ("float32", "bfloat16", "float16")


_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}  # value types
_STRING, _ARRAY = 8, 9
# The header fields read_header keeps (the rest is skipped).
_FIELDS = {"general.architecture": "architecture", "general.alignment": "alignment",
           "tokenizer.ggml.model": "tokenizer", "tokenizer.ggml.add_bos_token": "add_bos_token",
           "tokenizer.ggml.add_eos_token": "add_eos_token"}
_TOKEN_TYPES = "tokenizer.ggml.token_type"  # per token: 1 normal, 2 unknown, 3 control, 4 user-defined, 6 byte
CONTROL, USER_DEFINED = 3, 4


class _Header:
    """A sequential reader of a GGUF header (little-endian) that fails with ``EOFError`` past the end of the file."""

    def __init__(self, handle, size: int):
        self.handle, self.size = handle, size

    def take(self, size: int) -> bytes:
        if self.handle.tell() + size > self.size:  # before reading: a corrupt length may be any 64-bit number
            raise EOFError("the file ends inside its header")
        data = self.handle.read(size)
        if len(data) != size:
            raise EOFError("the file ends inside its header")
        return data

    def number(self, fmt: str) -> int:
        return struct.unpack("<" + fmt, self.take(struct.calcsize(fmt)))[0]

    def string(self) -> str:
        return self.take(self.number("Q")).decode("utf-8", errors="replace")

    def value(self, kind: int):
        """A string or a number; None (skipped) for an array."""
        if kind in _SCALARS:
            return self.number(_SCALARS[kind])
        if kind == _STRING:
            return self.string()
        self.skip_value(kind)
        return None

    def int_array(self) -> list[int]:
        """An array of integers (the kind already read), as a list; other arrays are skipped and give []."""
        item, count = self.number("I"), self.number("Q")
        if item not in _SCALARS or _SCALARS[item] in "f?d":
            for _ in range(count):
                self.skip_value(item)
            return []
        fmt = _SCALARS[item]
        return list(struct.unpack(f"<{count}{fmt}", self.take(struct.calcsize(fmt) * count)))

    def skip_value(self, kind: int) -> None:
        if kind in _SCALARS:
            self.take(struct.calcsize(_SCALARS[kind]))
        elif kind == _STRING:
            self.handle.seek(self.number("Q"), os.SEEK_CUR)
        elif kind == _ARRAY:
            item, count = self.number("I"), self.number("Q")
            if item in _SCALARS:
                self.handle.seek(struct.calcsize(_SCALARS[item]) * count, os.SEEK_CUR)
            else:
                for _ in range(count):
                    self.skip_value(item)
        else:
            raise ValueError(f"unknown value type {kind}")


def read_header(path: Path) -> dict:
    """``{"architecture", "version", "tensors", "size"}`` of a GGUF file, with ``tokenizer`` (``tokenizer.ggml.model``),
    ``add_bos_token`` and ``add_eos_token`` where it has them, read from its header without loading any tensor or
    vocabulary (gguf's own reader parses every token, half a minute for a 262k vocabulary). Raises an
    :class:`ExportError` for a file that is not GGUF, or whose header or tensor data the file cuts short."""
    import gguf

    try:
        size = path.stat().st_size
        with open(path, "rb") as handle:
            header = _Header(handle, size)
            if handle.read(4) != GGUF_MAGIC:
                raise ExportError(f"{path} is not a GGUF file (it does not start with the bytes 'GGUF')")
            version = header.number("I")
            if version not in (2, 3):
                raise ExportError(f"{path} is GGUF version {version}; only versions 2 and 3 are read")
            tensors, keys = header.number("Q"), header.number("Q")
            fields = {}
            for _ in range(keys):
                key, kind = header.string(), header.number("I")
                if key in _FIELDS:
                    fields[_FIELDS[key]] = header.value(kind)
                elif key == _TOKEN_TYPES and kind == _ARRAY:
                    fields["token_types"] = header.int_array()
                else:
                    header.skip_value(kind)
            end = 0
            for _ in range(tensors):
                header.string()
                dims = [header.number("Q") for _ in range(header.number("I"))]
                block, type_size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(header.number("I"))]
                end = max(end, header.number("Q") + math.prod(dims) // block * type_size)
            alignment = int(fields.get("alignment") or gguf.GGUF_DEFAULT_ALIGNMENT)
            data_start = -(-handle.tell() // alignment) * alignment
    except OSError as exc:
        raise ExportError(f"cannot read the GGUF file {path}: {exc.strerror or exc}") from exc
    except (EOFError, ValueError, KeyError, struct.error) as exc:
        raise ExportError(f"{path} is not a readable GGUF file (truncated or corrupt?): {exc}") from exc
    if data_start + end > size:
        raise ExportError(f"{path} is truncated: its tensors need {data_start + end} bytes, the file has {size}")
    if not isinstance(fields.get("architecture"), str) or not fields["architecture"]:
        raise ExportError(f"{path} names no architecture (general.architecture is missing)")
    return {**fields, "version": version, "tensors": tensors, "size": size}


def _torch_dtype(dtype):
    import torch

    name = str(dtype).replace("torch.", "")
    if name not in DTYPES:
        raise ExportError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    return getattr(torch, name)


@contextmanager
def _parsed_once():
    """While in the block, ``gguf.GGUFReader(path)`` returns one reader per file and mode, and
    ``gguf.get_tensor_name_map(arch, n_blocks)`` one map per architecture and depth (transformers imports both from
    ``gguf`` at each call, so the module's names are what it gets). Both are only read from."""
    import gguf

    reader_class, name_map = gguf.GGUFReader, gguf.get_tensor_name_map
    read = functools.cache(reader_class)  # by (real path, mode)

    def reader(path, mode="r"):
        return read(os.path.realpath(path), mode)

    gguf.GGUFReader, gguf.get_tensor_name_map = reader, functools.cache(name_map)
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map = reader_class, name_map


def load_gguf(path: Path, dtype="float32", *, header: dict | None = None):
    """(model, tokenizer) read from a GGUF file by transformers, every weight dequantised to ``dtype`` and the
    quantizer marks cleared, so the model saves and behaves as an ordinary dense one; a SentencePiece vocabulary is
    tokenized by BPE merges (:func:`spm_as_bpe`)."""
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    path = Path(path)
    torch_dtype = _torch_dtype(dtype)
    header = header or read_header(path)
    architecture = header["architecture"]
    try:
        with _parsed_once():
            model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch_dtype,
                                                         quantization_config=GgufConfig(dequantize=True))
            tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    except OSError:
        raise
    except Exception as exc:  # noqa: BLE001 - an architecture or tensor layout transformers does not handle
        raise ExportError(f"transformers {transformers.__version__} cannot load {path.name} (GGUF architecture "
                          f"{architecture!r}): {type(exc).__name__}: {exc}") from exc
    clear_quantizer(model, torch_dtype)
    if header.get("tokenizer") == "llama":
        spm_as_bpe(tokenizer)
    mark_control_tokens(tokenizer, header.get("token_types") or [])
    for flag in ("add_bos_token", "add_eos_token"):  # transformers' reader drops them (Gemma's add_bos_token)
        if header.get(flag) is not None and bool(getattr(tokenizer, flag, header[flag])) != header[flag]:
            setattr(tokenizer, flag, bool(header[flag]))
    return model, tokenizer


def mark_control_tokens(tokenizer, token_types: list[int]) -> int:
    """Match the file's control tokens (special) and user-defined tokens (plain) as whole tokens, with their own ids,
    as llama.cpp does. transformers' reader keeps only bos, eos, unk and pad special, so Gemma's ``<start_of_turn>`` was
    cut into ``<``, ``start``, ``_``, ... and no chat turn could be written. Returns how many tokens were marked."""
    from tokenizers import AddedToken

    names = tokenizer.convert_ids_to_tokens(list(range(min(len(token_types), len(tokenizer)))))
    have = set(tokenizer.get_added_vocab())
    special = [AddedToken(name, special=True, normalized=False) for name, kind in zip(names, token_types)
               if kind == CONTROL and name and name not in have]
    plain = [AddedToken(name, special=False, normalized=False) for name, kind in zip(names, token_types)
             if kind == USER_DEFINED and name and name not in have]
    size = len(tokenizer)
    if special:
        tokenizer.add_tokens(special, special_tokens=True)
    if plain:
        tokenizer.add_tokens(plain)
    if len(tokenizer) != size:  # every one of them was in the vocabulary already: ids never move
        raise ExportError("marking the GGUF's control tokens grew the vocabulary; the ids would not be the file's")
    return len(special) + len(plain)


def spm_as_bpe(tokenizer) -> bool:
    """Give a SentencePiece vocabulary (GGUF ``tokenizer.ggml.model`` ``llama``, llama.cpp's SPM) BPE merges ordered by
    its scores, as llama.cpp tokenizes it: join the adjacent pair whose union scores highest, again and again.

    transformers' GGUF reader builds a Unigram model from some of them (Gemma's), and their scores are merge priorities,
    not log-probabilities, so Unigram cuts words into short pieces ("capital" as "c", "ap", "it", "al"); its
    ``GemmaTokenizer`` then reloads the saved folder as BPE without merges, one character a token. The vocabulary and
    ids stay; the byte token ``<0x09>``, which the reader renames to a second ``\\t``, gets its name back. Returns
    whether the model was replaced (not when it is not a Unigram)."""
    from tokenizers.models import BPE, Unigram
    from transformers.convert_slow_tokenizer import generate_merges

    backend = tokenizer.backend_tokenizer
    if not isinstance(backend.model, Unigram):
        return False
    state = json.loads(backend.to_str())["model"]
    vocab, scores = {}, {}
    for index, (piece, score) in enumerate(state["vocab"]):
        if piece in vocab and len(piece) == 1 and ord(piece) < 256:  # a byte token renamed to the character
            vocab[f"<0x{ord(piece):02X}>"] = vocab.pop(piece)
            scores[f"<0x{ord(piece):02X}>"] = scores.pop(piece)
        vocab[piece], scores[piece] = index, score
    unk = state["vocab"][state["unk_id"]][0] if state.get("unk_id") is not None else None
    backend.model = BPE(vocab, generate_merges(vocab, scores), unk_token=unk, fuse_unk=True,
                        byte_fallback=bool(state.get("byte_fallback")))
    return True


def clear_quantizer(model, torch_dtype) -> None:
    """Drop what marks ``model`` as a GGUF-quantized load, after checking every parameter is a dense ``torch_dtype``
    tensor (a weight left in GGUF blocks would be saved as garbage)."""
    packed = sorted({type(module).__name__ for module in model.modules() if "gguf" in type(module).__name__.lower()})
    odd = [name for name, tensor in model.state_dict().items()
           if tensor.is_floating_point() and tensor.dtype != torch_dtype]
    if packed or odd:
        raise ExportError(f"the GGUF load left weights that are not dense {torch_dtype}: "
                          f"{', '.join(packed) or ', '.join(odd[:3])}")
    model.hf_quantizer = None
    for config in (model.config, getattr(model.config, "text_config", None)):
        if config is not None and hasattr(config, "quantization_config"):
            delattr(config, "quantization_config")
    model.config.dtype = torch_dtype


# Spaces, a tab, a newline, digits, accents, CJK, an emoji and special tokens, for check_tokenizer_reloads.
PROBE = "The capital of  France is\tParis.\n  x = 1234 + 56; café 東京 🙂"


def check_tokenizer_reloads(tokenizer, folder: Path) -> None:
    """The tokenizer ``AutoTokenizer`` reads back from ``folder`` has the same size, special tokens and chat template
    and tokenizes a probe text (with every special token) as ``tokenizer`` does; else an :class:`ExportError`."""
    from transformers import AutoTokenizer

    reloaded = AutoTokenizer.from_pretrained(str(folder))
    probe = PROBE + "".join(str(token) for token in tokenizer.all_special_tokens)
    checks = {"size": (len(tokenizer), len(reloaded)),
              "special tokens": (tokenizer.special_tokens_map, reloaded.special_tokens_map),
              "chat template": (tokenizer.chat_template, reloaded.chat_template),
              "tokens of a probe text": (tokenizer(probe)["input_ids"], reloaded(probe)["input_ids"])}
    differ = [name for name, (before, after) in checks.items() if before != after]
    if differ:
        raise ExportError(f"the saved tokenizer ({type(reloaded).__name__}) does not read back as the GGUF's: its "
                          f"{', '.join(differ)} differ")


def content_sha256(folder) -> str:
    """A checksum of what a model folder holds, independent of file layout and metadata: every safetensors tensor's
    name, dtype, shape and bytes in name order, then the tokenizer's vocabulary (token -> id, sorted) and the tokens it
    matches whole (added tokens, with whether each is special)."""
    import contextlib

    import torch
    from safetensors import safe_open
    from transformers import AutoTokenizer

    folder = Path(folder)
    digest = hashlib.sha256()
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ExportError(f"{folder} has no .safetensors weights")
    with contextlib.ExitStack() as stack:
        handles = [stack.enter_context(safe_open(str(file), framework="pt")) for file in files]
        where = {name: handle for handle in handles for name in handle.keys()}
        for name in sorted(where):
            tensor = where[name].get_tensor(name).contiguous()
            digest.update(f"{name}\0{str(tensor.dtype).replace('torch.', '')}\0{list(tensor.shape)}\0".encode())
            digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    digest.update(json.dumps(sorted(tokenizer.get_vocab().items()), ensure_ascii=False).encode("utf-8"))
    added = sorted((token, tokenizer.convert_tokens_to_ids(token), token in tokenizer.all_special_tokens)
                   for token in tokenizer.get_added_vocab())
    digest.update(json.dumps(added, ensure_ascii=False).encode("utf-8"))
    return digest.hexdigest()


def read_source(folder) -> dict:
    """The folder's ``t2s_gguf.json`` (empty when absent or unreadable)."""
    try:
        data = json.loads((Path(folder) / SOURCE_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _check_output(out: Path, force: bool) -> None:
    if out.exists() and not out.is_dir():
        raise ExportError(f"output {out} is a file, not a folder")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise ExportError(f"output folder {out} is not empty (pass --force to replace it)")


def _replace(tmp: Path, out: Path) -> None:
    """Move the finished folder ``tmp`` to ``out``; an existing ``out`` is moved aside first and removed after."""
    if not out.exists():
        os.rename(tmp, out)
        return
    old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent))
    os.rename(out, old / "folder")
    try:
        os.rename(tmp, out)
    except OSError:
        os.rename(old / "folder", out)  # the earlier folder stays as it was
        raise
    finally:
        shutil.rmtree(old, ignore_errors=True)


def convert_gguf(gguf_path, output_dir, *, dtype="float32", force: bool = False) -> Path:
    """Write ``output_dir``, a Hugging Face model folder with the GGUF file's model and tokenizer in ``dtype``
    (``float32``, ``bfloat16`` or ``float16``); returns its resolved path. ``force`` replaces an existing folder."""
    path = Path(gguf_path).expanduser()
    if not path.exists():
        raise ExportError(f"GGUF file not found: {path}")
    if not path.is_file():
        raise ExportError(f"{path} is not a file (pass the .gguf file itself)")
    path = path.resolve()
    out = Path(output_dir).expanduser().resolve()
    _check_output(out, force)
    torch_dtype = _torch_dtype(dtype)
    header = read_header(path)
    model, tokenizer = load_gguf(path, torch_dtype, header=header)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-", dir=out.parent))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        check_tokenizer_reloads(tokenizer, tmp)
        match_umask(tmp)
        tmp.chmod(0o777 & ~_umask())  # mkdtemp's 0700 would hide the folder from a server running as another user
        record = {"source_file": path.name, "source_sha256": file_sha256(path), "content_sha256": content_sha256(tmp),
                  "architecture": header["architecture"], "dtype": str(torch_dtype).replace("torch.", "")}
        (tmp / SOURCE_FILE).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
        _check_output(out, force)  # nothing took the place meanwhile
        _replace(tmp, out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
