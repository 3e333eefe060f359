"""A passing run of the suite prints no traceback after its summary, even when an xdist worker takes longer to
tear down than execnet waits for it (5 s, then SIGINT) after running hypothesis, whose gc callback then caught the
KeyboardInterrupt."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

CONFTEST = Path(__file__).parents[1] / "conftest.py"

SLOW_TEARDOWN = f"""
import gc, importlib.util, os, time

spec = importlib.util.spec_from_file_location("suite_conftest", {str(CONFTEST)!r})
suite = importlib.util.module_from_spec(spec)
spec.loader.exec_module(suite)
globals().update({{k: v for k, v in vars(suite).items() if k.startswith("pytest_")}})  # the suite's hooks


def pytest_unconfigure(config):
    if os.environ.get("PYTEST_XDIST_WORKER"):  # a worker's closing gc.collect, longer than execnet's 5 s
        end = time.monotonic() + 6
        while time.monotonic() < end:
            gc.collect()
            time.sleep(0.1)
"""

HYPOTHESIS_TEST = """
from hypothesis import given, settings, strategies as st


@settings(max_examples=3, deadline=None, database=None)
@given(st.integers())
def test_hypothesis_ran_in_this_worker(x):  # it leaves its gc callback installed
    assert isinstance(x, int)
"""


def test_a_worker_slow_to_tear_down_after_hypothesis_prints_no_traceback(tmp_path):
    (tmp_path / "conftest.py").write_text(SLOW_TEARDOWN)
    (tmp_path / "test_h.py").write_text(HYPOTHESIS_TEST)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-n", "1", "-p", "no:cacheprovider", "test_h.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    out = run.stdout + run.stderr
    assert run.returncode == 0 and "1 passed" in out, out
    assert "Traceback" not in out and "KeyboardInterrupt" not in out, out
