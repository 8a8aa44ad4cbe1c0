"""Shared fixtures: offline environment, a guard against non-loopback sockets, the tiny model, data folders."""

from __future__ import annotations

import ipaddress
import os
import socket

import pytest

from t2s.settings import DEMO_DIR, offline_environment, shared_data_dir

offline_environment()
os.environ["HF_HUB_OFFLINE"] = "1"

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
