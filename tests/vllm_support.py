"""What the real-vLLM tests share: the environment every vLLM process runs with (and :func:`environment_kept`, which
undoes what a command run in the test's own process sets), the tiny model in the shape vLLM's
CPU backend runs, the OpenAI server started the way ``make serve`` starts it, one server for the whole session whose
weights each test sets (:class:`SharedServer`), and several ``t2s`` commands run in one process (``python -m
tests.vllm_support``), so that a vLLM engine starts once for them."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
import urllib.request
from pathlib import Path

from t2s.backends.vllm_engine import free_port, has_cuda

ROOT = Path(__file__).resolve().parents[1]
VLLM_ENV = {"HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "VLLM_HOST_IP": "127.0.0.1",
            "VLLM_CPU_KVCACHE_SPACE": "1", "TOKENIZERS_PARALLELISM": "false"}
SERVER_MAX_MODEL_LEN = 8192
# The tests' servers run eager (``--enforce-eager``) and without TorchDynamo, as t2s's offline engine runs on a CPU
# (t2s.backends.vllm_engine): no C++ compile of vLLM's sampler kernels at each start. On a CPU their engine-core process
# also runs the model itself (``VLLM_ENABLE_V1_MULTIPROCESSING=0``): no worker process that imports vLLM and torch once
# more (about 7 of a start's 26 CPU-seconds) and spins on shared memory for a second after every message.
EAGER_SERVE_ARGS = "--enforce-eager"
SERVER_ENV = {"TORCHDYNAMO_DISABLE": "1"} | ({} if has_cuda() else {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"})
EAGER_SERVER_ENV = {"SERVE_ARGS": EAGER_SERVE_ARGS, **SERVER_ENV}  # `make serve`'s variables, as the Slurm job has them
# Hang guards, not speed targets: a subprocess or server start that takes longer than this has hung. Generous, since
# the suite must pass on one core beside other work (`taskset -c 0`), where a start takes several times as long.
HANG_GUARD_S = 1200
MODULE_TIMEOUT_S = 3600  # pytest-timeout for a whole vLLM test (its fixtures included)




def attention_model(folder: Path, noise: float = 0.0) -> Path:
    """The tiny model's ``attention`` preset (full attention, head_dim 32, float32: the shape vLLM's CPU backend runs)
    in ``folder``; with ``noise``, seeded noise of that std added to its matrices (as built, its greedy turns are
    newlines only, which would make token identity say little; perturbed, they are varied text)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from t2s.training.tiny_model import build_tiny_model

    built = build_tiny_model(folder / "built", preset="attention")
    if not noise:
        return built
    model = AutoModelForCausalLM.from_pretrained(built, dtype=torch.float32)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() == 2:
                param.add_(torch.randn(param.shape, generator=generator) * noise)
    out = folder / "noisy"
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(built).save_pretrained(out)
    return out


@contextlib.contextmanager
def environment_kept():
    """``os.environ`` as it was on entry, again on exit (what was set, changed or removed in between)."""
    before = dict(os.environ)
    try:
        yield
    finally:
        if dict(os.environ) != before:
            os.environ.clear()
            os.environ.update(before)


def session_processes(session: int) -> set[str]:
    """The names of the processes now running in ``session`` (``/proc``)."""
    names = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            head, _, tail = stat.read_text().rpartition(")")
            if int(tail.split()[3]) == session:  # the session id, after state, ppid and process group
                names.add(head.partition("(")[2])
    return names


@contextlib.contextmanager
def served(model_dir: Path, log_path: Path, *serve_args: str):
    """The OpenAI server as `make serve` starts it (``t2s.bench.eval_scale.make_serve``) on a free loopback port, with
    the tests' vLLM environment; yields its URL, after checking that its entry point warned of no deprecation."""
    from t2s.bench.eval_scale import make_serve

    with make_serve(model_dir, free_port(), log_path, max_model_len=SERVER_MAX_MODEL_LEN,
                    env=VLLM_ENV | SERVER_ENV, serve_args=" ".join([EAGER_SERVE_ARGS, *serve_args]),
                    timeout=HANG_GUARD_S) as url:
        started = Path(log_path).read_text(encoding="utf-8", errors="replace")
        assert not [line for line in started.splitlines() if "DeprecationWarning" in line and "vllm" in line], (
            f"the server's entry point is deprecated; see {log_path}")
        yield url


def run_watching_processes(argv: list[str], env: dict, preload: str, timeout: float = HANG_GUARD_S):
    """Run ``argv`` in a session of its own (started as :func:`tests.preloaded.start` starts it); returns its
    CompletedProcess (text output) and the names of every process seen in that session while it ran (``/proc``,
    polled every 0.1 s), its own among them."""
    import subprocess
    import time

    from tests import preloaded

    names: set[str] = set()
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = preloaded.start(argv, preload=preload, env=env, stdout=out, stderr=err, new_session=True)
        deadline = time.monotonic() + timeout
        while proc.poll() is None:
            names |= session_processes(proc.pid)
            if time.monotonic() > deadline:
                proc.kill()
                raise subprocess.TimeoutExpired(argv, timeout)
            time.sleep(0.1)
        out.seek(0)
        err.seek(0)
        return subprocess.CompletedProcess(argv, proc.returncode, out.read(), err.read()), names


def post(url: str, body: dict | None = None, timeout: float = HANG_GUARD_S) -> bytes:
    request = urllib.request.Request(url, data=json.dumps(body or {}).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as reply:
        assert reply.status == 200, (url, reply.status)
        return reply.read()


def prompt_logprobs(url: str, ids: list[int]) -> list[float]:
    """The server's logprob of each token of ``ids`` after the ones before it."""
    model = json.loads(urllib.request.urlopen(url + "/v1/models", timeout=60).read())["data"][0]["id"]
    reply = json.loads(post(url + "/v1/completions", {"model": model, "prompt": ids, "max_tokens": 1,
                                                      "temperature": 1.0, "prompt_logprobs": 0}))
    entries = reply["choices"][0]["prompt_logprobs"][1:]
    return [entry[str(token)]["logprob"] for entry, token in zip(entries, ids[1:], strict=True)]


def model_logprobs(model_dir: Path, ids: list[int]) -> list[float]:
    """transformers' logprob of each token of ``ids`` after the ones before it, on ``model_dir``'s weights."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0, :-1].float()
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(ids[1:])[:, None])[:, 0].tolist()


def generation_defaults(model_dir: Path) -> dict:
    """A folder's ``generation_config.json`` (a server's sampling defaults), a token id and a list of one alike."""
    path = model_dir / "generation_config.json"
    config = json.loads(path.read_text()) if path.is_file() else {}
    return {key: sorted(value if isinstance(value, list) else [value]) if key.endswith("token_id") else value
            for key, value in config.items() if key != "transformers_version"}


PROBE = "SELECT name FROM singer WHERE age > 30 ORDER BY name"
HOLD_BOUND = 1e-3  # float32 server and transformers on one CPU: about 1e-6; another model's weights: above 1e-2


class SharedServer:
    """One `make serve` server for the session (the sibling's flags: ``qwen3_xml`` calls, and no prefix cache, so that
    a prompt is computed the same way whatever ran before). A test takes it with :meth:`hold`, which loads a model's
    weights into it the way training's ``vllm_server_sync: files`` does (``POST /collective_rpc`` ``reload_weights``,
    every architecture and tokenizer here being the tiny ``attention`` preset's) and proves the server then computes
    that model: its logprobs on a fixed text equal transformers' on the folder's weights."""

    FLAGS = ("--enable-auto-tool-choice", "--tool-call-parser", "qwen3_xml", "--no-enable-prefix-caching")

    def __init__(self, url: str, model_dir: Path, scratch: Path):
        self.url, self.scratch, self.holding, self.served = url, scratch, model_dir, model_dir

    def hold(self, model_dir: Path) -> str:
        """Load ``model_dir``'s weights unless the server holds them already; returns the server's URL."""
        model_dir = Path(model_dir)
        if self.holding != model_dir:
            from safetensors.torch import load_file, save_file
            from transformers import AutoTokenizer

            # the server keeps the served folder's tokenizer, chat template and sampling defaults: a model held must
            # have the same ones, as if the server had been started on it
            mine, served = AutoTokenizer.from_pretrained(model_dir), AutoTokenizer.from_pretrained(self.served)
            assert mine.get_vocab() == served.get_vocab() and mine.chat_template == served.chat_template, model_dir
            assert mine.all_special_tokens == served.all_special_tokens, model_dir
            assert generation_defaults(model_dir) == generation_defaults(self.served), model_dir

            self.holding = None
            tensors = load_file(str(model_dir / "model.safetensors"))
            config = json.loads((model_dir / "config.json").read_text())
            if config.get("tie_word_embeddings") and "lm_head.weight" not in tensors:  # the reload keeps a head
                tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"].clone()  # it is not given
            folder = self.scratch / f"weights-{len(list(self.scratch.glob('weights-*')))}"
            folder.mkdir(parents=True)
            save_file(tensors, str(folder / "model.safetensors"))
            post(self.url + "/collective_rpc", {"method": "reload_weights", "kwargs": {"weights_path": str(folder)}})
            post(self.url + "/reset_prefix_cache")
            ids = mine(PROBE)["input_ids"]
            gap = max(abs(a - b) for a, b in zip(prompt_logprobs(self.url, ids), model_logprobs(model_dir, ids)))
            assert gap < HOLD_BOUND, f"the shared server does not compute {model_dir} after reloading it: gap {gap}"
            self.holding = model_dir
        return self.url

    def released(self) -> None:
        """Called by a test that changed the server's weights itself (training): the next :meth:`hold` reloads."""
        self.holding = None


def run_t2s_commands(runs: list[list[str]]) -> int:
    """Run each argv of ``runs`` as ``python -m t2s`` would, in this one process, in order; a ``vllm.LLM`` built with
    the same arguments as an earlier one is that engine again, its prefix cache emptied (each run then starts from
    the state a fresh engine has). vLLM is imported at the first run that names it, so that runs before it (the
    transformers policy) run in a process vLLM has not touched. Returns the first non-zero exit status, else 0."""
    from t2s.commands import main

    built: dict[str, object] = {}
    patched = False
    for argv in runs:
        if "vllm" in argv and not patched:
            import vllm

            real_llm = vllm.LLM

            def llm(*args, **kwargs):
                key = repr((args, sorted(kwargs.items())))
                if key in built:
                    built[key].reset_prefix_cache()
                else:
                    built[key] = real_llm(*args, **kwargs)
                return built[key]

            vllm.LLM, patched = llm, True
        status = main(argv)
        if status:
            print(f"t2s {' '.join(argv)} exited {status}", file=sys.stderr)
            return status
    return 0


if __name__ == "__main__":  # python -m tests.vllm_support RUNS.json (a list of t2s argv lists)
    raise SystemExit(run_t2s_commands(json.loads(Path(sys.argv[1]).read_text())))
