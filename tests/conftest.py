"""Shared test setup: offline, and a throwaway token cache instead of ~/.cache/smallinit."""

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

if os.environ.get("PYTEST_XDIST_WORKER"):
    # One thread per xdist worker (and per process a test starts): small models use two single-threaded
    # processes better than one two-threaded one, and workers must not fight over the cores.
    import torch

    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)


@pytest.fixture(scope="session", autouse=True)
def _smallinit_cache(tmp_path_factory):
    """Point SMALLINIT_CACHE at a temporary folder for the whole session (tests may override it)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SMALLINIT_CACHE", str(tmp_path_factory.mktemp("smallinit-cache")))
        yield
