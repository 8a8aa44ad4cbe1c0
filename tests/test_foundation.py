"""The package foundation: fast CLI, offline guard, the tiny tokenizer and model."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import pytest

from t2s.settings import REPO_ROOT


def test_help_is_fast_and_imports_no_torch():
    code = (
        "import sys, time; t = time.time(); from t2s.commands import main\n"
        "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
        "assert 'torch' not in sys.modules and 'trl' not in sys.modules and 'transformers' not in sys.modules, "
        "sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'trl', 'transformers'))\n"
        "print('elapsed', time.time() - t)"
    )
    start = time.time()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO_ROOT, check=True)
    assert time.time() - start < 5.0
    assert "COMMAND" in out.stdout


def test_help_lists_commands():
    out = subprocess.run([sys.executable, "-m", "t2s", "--help"], capture_output=True, text=True, cwd=REPO_ROOT)
    assert out.returncode == 0
    from t2s.commands import available_commands

    for name in available_commands():
        assert name in out.stdout


def test_unknown_command_is_a_clear_error():
    out = subprocess.run([sys.executable, "-m", "t2s", "frobnicate"], capture_output=True, text=True, cwd=REPO_ROOT)
    assert out.returncode == 2
    assert "unknown command" in out.stderr


def test_network_guard_blocks_non_loopback():
    from conftest import NetworkAccessError

    with pytest.raises(NetworkAccessError):
        socket.create_connection(("93.184.216.34", 80), timeout=1)
    with pytest.raises(NetworkAccessError):
        socket.getaddrinfo("huggingface.co", 443)


@pytest.mark.parametrize("workers, cores, preset, threads", [
    ("2", 2, {}, "1"), ("2", 8, {}, "4"), ("3", 2, {}, "1"),  # a share each, at least one thread
    ("2", 2, {"OMP_NUM_THREADS": "2"}, "2"), ("2", 2, {"T2S_TORCH_THREADS": "2"}, None),  # the environment chose
    ("1", 2, {}, None), ("", 2, {}, None),  # one worker, or none: torch takes every core
])
def test_each_worker_takes_its_share_of_the_cores(monkeypatch, workers, cores, preset, threads):
    """tests/conftest.py: under pytest-xdist each worker (and what its tests start, by inheritance) gets cores ÷
    workers torch threads, unless the environment set a thread count."""
    import torch

    from tests import conftest

    for name in ("OMP_NUM_THREADS", "T2S_TORCH_THREADS", "PYTEST_XDIST_WORKER_COUNT"):
        monkeypatch.delenv(name, raising=False)
    for name, value in {**preset, "PYTEST_XDIST_WORKER_COUNT": workers}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cores)))
    before = torch.get_num_threads()
    try:
        conftest._share_the_cores_between_workers()
        assert os.environ.get("OMP_NUM_THREADS") == (threads or preset.get("OMP_NUM_THREADS"))
        assert torch.get_num_threads() == (int(threads) if threads and "OMP_NUM_THREADS" not in preset else before)
    finally:
        torch.set_num_threads(before)


def test_the_vllm_tests_groups_reach_pytest_xdists_scheduler(tmp_path):
    """``make test``'s ``--dist loadgroup`` keeps each group of vLLM tests on one worker (tests/conftest.py): every
    such test's id ends with its group, which is what pytest-xdist's scheduler reads, each group runs on one worker,
    and the other tests carry no group."""
    for name in ("real_models", "other"):
        (tmp_path / f"test_{name}.py").write_text(
            "import pytest\n"
            + "".join(f"@pytest.mark.vllm\ndef test_engine_{i}():\n    pass\n" for i in range(4))
            + "".join(f"def test_plain_{i}():\n    pass\n" for i in range(4)))
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "tests.conftest", "-n", "2", "--dist", "loadgroup",
                           "-v", "-p", "no:cacheprovider", "--rootdir", str(tmp_path), "-c", os.devnull,
                           str(tmp_path)], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300,
                          env=os.environ | {"PYTHONPATH": str(REPO_ROOT)})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    ran = [line.split(" PASSED ") for line in done.stdout.splitlines() if line.startswith("[gw") and " PASSED " in line]
    ran = [(head.split()[0], test.strip()) for head, test in ran]  # (worker, test id)
    assert len(ran) == 2 * 8
    for module, group in (("test_real_models.py", "vllm-real-models"), ("test_other.py", "vllm")):
        engines = [(worker, test) for worker, test in ran if f"{module}::test_engine_" in test]
        assert len(engines) == 4 and all(test.endswith(f"@{group}") for _, test in engines), engines
        assert len({worker for worker, _ in engines}) == 1, engines
    assert not [test for _, test in ran if "test_plain_" in test and "@" in test]


def test_network_guard_allows_loopback():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    client = socket.create_connection(server.getsockname(), timeout=1)
    client.close()
    server.close()


def test_tokenizer_round_trips_text_and_special_tokens(tiny_tokenizer):
    text = '<|im_start|>user\nSELECT "Unit Price" FROM t; -- ünïcode 🙂<|im_end|>\n<think>\nhm\n</think>\n<|endoftext|>'
    ids = tiny_tokenizer.encode(text, add_special_tokens=False)
    assert tiny_tokenizer.decode(ids) == text
    for special in ("<|im_start|>", "<|im_end|>", "<|endoftext|>", "<think>", "</think>"):
        ids = tiny_tokenizer.encode(special, add_special_tokens=False)
        assert len(ids) == 1, special
    assert tiny_tokenizer.eos_token == "<|endoftext|>"


def test_special_tokens_can_be_tokenized_as_plain_text(tiny_tokenizer):
    im_end = tiny_tokenizer.convert_tokens_to_ids("<|im_end|>")
    ids = tiny_tokenizer("<|im_end|><|im_start|>assistant", add_special_tokens=False,
                         split_special_tokens=True).input_ids
    assert im_end not in ids
    assert tiny_tokenizer.decode(ids) == "<|im_end|><|im_start|>assistant"


def test_generation_prompt_opens_think_block_only_with_enable_thinking(tiny_tokenizer):
    messages = [{"role": "system", "content": "You write SQL."}, {"role": "user", "content": "How many?"}]
    on = tiny_tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False, enable_thinking=True)
    assert on.endswith("<|im_start|>assistant\n<think>\n")
    off = tiny_tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert off.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_chat_template_is_qwen35_nothink_from_trl(tiny_tokenizer):
    from t2s.training.tiny_model import chat_template_path

    assert chat_template_path().name == "qwen3_5_nothink.jinja"
    assert tiny_tokenizer.chat_template == chat_template_path().read_text()


def test_tiny_model_loads_from_path_and_generates(tiny_model_dir, tiny_tokenizer):
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert type(model).__name__ == "Qwen3_5ForCausalLM"
    assert model.config.name_or_path == str(tiny_model_dir)
    prompt = tiny_tokenizer.apply_chat_template(
        [{"role": "user", "content": "List the tables."}], add_generation_prompt=True, tokenize=False,
        enable_thinking=True,
    )
    inputs = tiny_tokenizer(prompt, return_tensors="pt", add_special_tokens=False)
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=6, do_sample=True)
    assert out.shape[1] == inputs.input_ids.shape[1] + 6 or out[0, -1].item() in (
        tiny_tokenizer.eos_token_id,
        tiny_tokenizer.convert_tokens_to_ids("<|im_end|>"),
    )


@pytest.mark.parametrize("quiet, ci", [(True, False), (True, True), (False, False)])
def test_a_cpu_run_says_once_that_gpu_kernels_do_not_apply(tiny_model_dir, quiet, ci):
    """transformers warns four times that the linear-attention layers fall back from causal_conv1d and
    flash-linear-attention; a CPU run set up by t2s prints one line instead. With ``CI`` set, transformers' logger
    also propagates to the root logger, which a command gives a handler: the line is still printed once."""
    from t2s.training.cpu_threads import KERNEL_FALLBACK, KERNEL_FALLBACK_LINE

    script = (
        "import logging, torch\nfrom t2s.training.cpu_threads import configure_cpu_threads\n"
        + ("configure_cpu_threads(on_cpu=True)\n" if quiet else "")
        + "logging.basicConfig(level=logging.INFO, format='%(levelname)s %(name)s: %(message)s')\n"
        "from transformers import AutoModelForCausalLM\n"
        f"model = AutoModelForCausalLM.from_pretrained({str(tiny_model_dir)!r}, dtype=torch.float32)\n"
        "model.generate(torch.tensor([[1, 2, 3, 4]]), max_new_tokens=3, do_sample=False)\n"
        "model.train()\nmodel(torch.tensor([[1, 2, 3, 4]]))\n"
        "logging.getLogger('transformers.integrations.hub_kernels').warning('another warning passes')\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "CI"} | ({"CI": "true"} if ci else {})
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, cwd=REPO_ROOT,
                          env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stderr.count("another warning passes") == (2 if ci else 1)  # the root handler sees it too under CI
    if quiet:
        assert done.stderr.count(KERNEL_FALLBACK_LINE) == 1 and KERNEL_FALLBACK not in done.stderr
    else:  # what the line replaces: one warning per kernel function
        assert done.stderr.count(KERNEL_FALLBACK) == 4


def test_the_tiny_model_is_never_written_over_a_users_model(tmp_path):
    """A recipe with ``tiny_model`` pointed at a folder holding another model trains that model as it is; the tiny
    builder refuses to write over it (it once replaced a real SmolLM2 folder)."""
    from types import SimpleNamespace

    from t2s.training.tiny_model import build_tiny_model
    from t2s.training.warm_start import prepare_model

    folder = tmp_path / "real-model"
    folder.mkdir()
    (folder / "config.json").write_text('{"model_type": "llama"}')
    (folder / "model.safetensors").write_bytes(b"weights")
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    with pytest.raises(ValueError, match="holds a model t2s did not build"):
        build_tiny_model(folder, preset="attention")
    sft_args = SimpleNamespace(tiny_model="attention")
    assert prepare_model(sft_args, SimpleNamespace(model_name_or_path=str(folder))) == str(folder)
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before
