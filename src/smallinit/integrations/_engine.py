"""What every integration does alike: import its engine, or say which extra installs it."""

from __future__ import annotations

import importlib
from types import ModuleType

from smallinit.errors import SmallinitError


class MissingExtra(SmallinitError, ImportError):
    """An integration's engine is not installed."""


def engine(module: str, extra: str, what: str) -> ModuleType:
    try:
        return importlib.import_module(module)
    except ImportError:
        raise MissingExtra(
            f"{what} needs {module.split('.')[0]}, which is not installed: pip install 'smallinit[{extra}]'"
        ) from None
