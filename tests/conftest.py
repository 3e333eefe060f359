"""Shared test setup: offline, a throwaway token cache instead of ~/.cache/smallinit, a small real corpus."""

import json
import os
import signal
import sys
from pathlib import Path

import pytest

# the helpers test files share are one package, tests/support (from support.runs import TINY_MODEL); test files
# never import one another
sys.path.insert(0, str(Path(__file__).resolve().parent))

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

if os.environ.get("PYTEST_XDIST_WORKER"):
    # One thread per xdist worker (and per process a test starts): small models use two single-threaded
    # processes better than one two-threaded one, and workers must not fight over the cores.
    import torch

    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)


def pytest_sessionfinish(session):
    """An xdist worker whose results are in ignores SIGINT: execnet gives it 5 s from then to its end and then sends
    it one, and pytest's closing gc.collect over a whole suite's heap can take longer on a busy machine; the
    KeyboardInterrupt then lands in hypothesis' gc callback and prints a traceback after a passing run. The worker
    ends by itself once torn down (execnet ends it 10 s later otherwise)."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        signal.signal(signal.SIGINT, signal.SIG_IGN)


@pytest.fixture(scope="session", autouse=True)
def _smallinit_cache(tmp_path_factory):
    """Point SMALLINIT_CACHE at a temporary folder for the whole session (tests may override it)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SMALLINIT_CACHE", str(tmp_path_factory.mktemp("smallinit-cache")))
        yield


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """A slice of the builtin Shakespeare (60 documents of 1 kB): real text, tokenised in a blink."""
    from smallinit.data import iter_documents

    play = next(iter(iter_documents("shakespeare")))
    path = tmp_path_factory.mktemp("corpus") / "shakespeare-slice.jsonl"
    path.write_text("".join(json.dumps({"text": play[i : i + 1000]}) + "\n" for i in range(0, 60_000, 1000)))
    return path
