"""On a CPU without bfloat16 instructions, ``bf16`` autocast and bfloat16 engines run in float32 instead, with a note.

The processor is read from ``/proc/cpuinfo``; ``T2S_CPU_BF16`` states it, so that both answers are tested on any
machine. The real engine's side (an ``eval --policy vllm --dtype bfloat16`` built in float32) is in
tests/test_vllm_real.py.
"""

from __future__ import annotations

import pytest

from _train_script import make_config
from t2s.backends import cpu_precision
from t2s.settings import REPO_ROOT

AVX2_ONLY = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC
flags\t\t: fpu vme sse sse2 avx avx2 fma bmi2

processor\t: 1
flags\t\t: fpu vme sse sse2 avx avx2 fma bmi2
"""
SAPPHIRE_RAPIDS = "processor\t: 0\nflags\t\t: avx2 avx512f avx512_bf16 amx_bf16 amx_tile\n"
GRAVITON3 = "processor\t: 0\nFeatures\t: fp asimd sve bf16 i8mm\n"


@pytest.fixture(autouse=True)
def fresh_notes(monkeypatch):
    monkeypatch.setattr(cpu_precision, "_noted", set())
    monkeypatch.delenv("T2S_CPU_BF16", raising=False)


@pytest.mark.parametrize("text, flags_expected, native", [
    (AVX2_ONLY, {"avx2", "fma"}, False),
    (SAPPHIRE_RAPIDS, {"avx512_bf16", "amx_bf16"}, True),
    (GRAVITON3, {"sve", "bf16"}, True),
    ("processor\t: 0\n", set(), None),  # no flag line: nothing tells
])
def test_the_processor_is_read_from_its_cpuinfo(tmp_path, monkeypatch, text, flags_expected, native):
    assert flags_expected <= cpu_precision.cpu_flags(text)
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(text)
    monkeypatch.setattr(cpu_precision, "CPUINFO", cpuinfo)
    assert cpu_precision.native_bf16() is native
    monkeypatch.setenv("T2S_CPU_BF16", "1")  # stated: the file is not read
    assert cpu_precision.native_bf16() is True


def test_no_cpuinfo_keeps_bfloat16_as_asked(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(cpu_precision, "CPUINFO", tmp_path / "absent")
    assert cpu_precision.native_bf16() is None
    assert cpu_precision.cpu_engine_dtype("bfloat16") == "bfloat16"
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("stated, expected", [("0", False), ("1", True)])
@pytest.mark.parametrize("bf16", [True, None])  # None: unset in the recipe, which TRL turns into True
def test_a_cpu_grpo_config_autocasts_in_bf16_only_where_the_cpu_has_it(tmp_path, monkeypatch, capsys, stated,
                                                                       expected, bf16):
    monkeypatch.setenv("T2S_CPU_BF16", stated)
    config = make_config(tmp_path, bf16=bf16)
    assert config.bf16 is expected
    assert config.mixed_precision == ("bf16" if expected else "no")  # what the trainer's accelerator is built with
    note = capsys.readouterr().err
    assert ("no bfloat16 instructions" in note) is not expected
    make_config(tmp_path, bf16=bf16)
    assert "no bfloat16 instructions" not in capsys.readouterr().err  # one note a process


@pytest.mark.parametrize("stated, expected", [("0", "no"), ("1", "bf16")])
def test_accelerate_launchs_bf16_is_turned_off_where_the_cpu_has_none(tmp_path, monkeypatch, stated, expected):
    """``accelerate launch`` with any of accelerate_configs/ exports ``ACCELERATE_MIXED_PRECISION=bf16``, which
    transformers takes as the run's mixed precision even where the recipe says ``bf16: false``."""
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "bf16")
    monkeypatch.setenv("T2S_CPU_BF16", stated)
    config = make_config(tmp_path, bf16=False)
    assert config.mixed_precision == expected and config.bf16 is False


@pytest.mark.parametrize("stated, expected", [("true", True), ("OFF", False), (" 1 ", True)])
def test_the_stated_answer_takes_the_usual_booleans(monkeypatch, stated, expected):
    monkeypatch.setenv("T2S_CPU_BF16", stated)
    assert cpu_precision.native_bf16() is expected


def test_a_stated_answer_that_is_no_boolean_is_said_and_the_processor_read(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("T2S_CPU_BF16", "maybe")
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(AVX2_ONLY)
    monkeypatch.setattr(cpu_precision, "CPUINFO", cpuinfo)
    assert cpu_precision.native_bf16() is False
    assert "T2S_CPU_BF16='maybe' is neither 0 nor 1" in capsys.readouterr().err


def test_cached_artefacts_are_keyed_on_the_cpus_bfloat16(monkeypatch):
    """The benches' caches (the demo's and learn-real's warm starts, learn-real's zero-shot evaluation): a bf16 recipe
    trained in float32 on one CPU is not the one another CPU would train."""
    from t2s.bench.learn import content_key

    keys = {}
    for stated in ("0", "1", "0"):
        monkeypatch.setenv("T2S_CPU_BF16", stated)
        keys.setdefault(stated, set()).add(content_key([], extra=("recipe",)))
    assert len(keys["0"]) == 1 and keys["0"] != keys["1"]


def test_a_float32_recipe_is_left_alone(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("T2S_CPU_BF16", "0")
    config = make_config(tmp_path, bf16=False)
    assert config.bf16 is False and config.mixed_precision == "no"
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("stated, expected", [("0", False), ("1", True)])
def test_the_warm_start_recipe_autocasts_in_bf16_only_where_the_cpu_has_it(tmp_path, monkeypatch, stated, expected):
    from t2s.training.warm_start import parse_sft_recipe

    monkeypatch.setenv("T2S_CPU_BF16", stated)
    recipe = REPO_ROOT / "recipes" / "learn_real_sft.yaml"  # bf16: true, use_cpu: true
    _, config, _ = parse_sft_recipe(["--config", str(recipe), "--output_dir", str(tmp_path)])
    assert config.bf16 is expected and config.mixed_precision == ("bf16" if expected else "no")


@pytest.mark.parametrize("stated", ["0", "1"])
def test_a_colocated_cpu_engine_asked_for_bfloat16_is_built_where_the_cpu_computes_it(monkeypatch, stated):
    """TRL's ``LLM(...)`` call as ``engine_settings`` completes it: on a CPU without bfloat16 instructions in
    float32; on a GPU, or a CPU with them, as asked. Other dtypes pass unchanged."""
    pytest.importorskip("vllm", reason="vLLM is not installed (make install-vllm)")
    from trl.generation import vllm_generation

    from t2s.backends import vllm_engine
    from t2s.training.vllm_sync import engine_settings

    monkeypatch.setenv("T2S_CPU_BF16", stated)
    built = []
    monkeypatch.setattr(vllm_generation, "LLM", lambda *args, **kwargs: built.append(kwargs["dtype"]))
    for cuda in (False, True):
        monkeypatch.setattr(vllm_engine, "has_cuda", lambda: cuda)
        for dtype in ("bfloat16", "float32", "auto"):
            with engine_settings(dtype):
                vllm_generation.LLM(model="m", max_model_len=2048)
    cpu = ["bfloat16", "float32", "auto"] if stated == "1" else ["float32", "float32", "float32"]
    assert built == [*cpu, "bfloat16", "float32", "auto"]  # auto: vLLM's CPU build would pick bfloat16


@pytest.mark.parametrize("stated, expected", [("0", "float32"), ("1", "bfloat16")])
def test_make_serve_builds_its_server_in_the_dtype_every_engine_of_t2s_takes(tmp_path, stated, expected):
    """``make serve``'s ``--dtype``: the checkpoint's, through the same function as the offline and colocated
    engines (``make -n`` prints the command without starting it)."""
    import json
    import os
    import subprocess
    import sys

    from t2s.backends.vllm_engine import has_cuda

    if has_cuda():
        pytest.skip("a GPU machine: its engines keep the checkpoint's bfloat16")
    (tmp_path / "config.json").write_text(json.dumps({"dtype": "bfloat16"}))
    done = subprocess.run(["make", "-n", "serve", f"MODEL={tmp_path}", f"PY={sys.executable}"], cwd=REPO_ROOT,
                          capture_output=True, text=True, env=os.environ | {"T2S_CPU_BF16": stated}, timeout=120)
    assert done.returncode == 0, done.stderr
    assert f"--dtype {expected} " in done.stdout
    assert ("no bfloat16 instructions" in done.stderr) is (stated == "0")


def test_the_cpuinfo_reading_agrees_with_torchs_own_probe(monkeypatch):
    """vLLM's CPU build asks torch whether the processor has AVX-512 BF16; on x86 t2s's reading of /proc/cpuinfo and
    torch's CPUID probe must give one answer for this machine."""
    import platform

    import torch

    if platform.machine() not in ("x86_64", "AMD64") or not cpu_precision.CPUINFO.is_file():
        pytest.skip("torch's bfloat16 probe is x86's; this machine is not x86 Linux")
    torch_says = torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()
    assert cpu_precision.native_bf16() is bool(torch_says)
