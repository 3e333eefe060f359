"""Shared test setup: offline, and a throwaway token cache instead of ~/.cache/smallinit."""

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")


@pytest.fixture(scope="session", autouse=True)
def _smallinit_cache(tmp_path_factory):
    """Point SMALLINIT_CACHE at a temporary folder for the whole session (tests may override it)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SMALLINIT_CACHE", str(tmp_path_factory.mktemp("smallinit-cache")))
        yield
