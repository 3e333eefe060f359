"""Old spellings, kept for one release: each is hidden from --help, prints one line on stderr that names its
new spelling, then does what the new spelling does (docs/cli.md lists them)."""

from __future__ import annotations

import argparse
import os
import sys


def notice(old: str, new: str) -> None:
    """The notice of every old spelling: one line on stderr that names the new one (once, not per rank)."""
    if os.environ.get("RANK", "0") == "0":
        sys.stderr.write(
            f"smallinit: deprecated: '{old}' is now '{new}'; the old spelling goes in the next release\n"
        )


class Old(argparse.Action):
    """An old spelling: hidden from --help, it prints the notice, then does what its new spelling does:
    ``then(namespace, value)``. ``new`` may hold ``{}`` for the value given."""

    def __init__(self, option_strings, dest, *, new: str, then, **kwargs):
        super().__init__(option_strings, dest, default=argparse.SUPPRESS, help=argparse.SUPPRESS, **kwargs)
        self.new, self.then = new, then

    def __call__(self, parser, namespace, values, option_string=None):
        shown = " ".join(map(str, values)) if isinstance(values, list) else str(values)
        old = f"{parser.prog} {option_string or '…'} {shown}".rstrip()  # a positional: its value alone
        new = self.new.format(shown)
        notice(old, f"{parser.prog} {new}" if new.startswith("-") else new)
        self.then(namespace, values)


def old(p: argparse.ArgumentParser, *spelling: str, new: str, then, **kwargs) -> None:
    p.add_argument(*spelling, action=Old, new=new, then=then, **kwargs)


class OmittedOnlyByOld(argparse.Action):
    """A positional every new spelling gives and only an old one leaves out (``recipe`` alone for ``recipes``,
    ``sweep --status DIR``): argparse lets it be absent, and the usage shows it as required."""

    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest, nargs="?", **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, values)


def store(dest: str, value=None):
    """``then`` of a renamed flag or a positional that became a flag: what was given (or ``value``, for a
    flag that took none) goes to the new one."""
    return lambda ns, given: setattr(ns, dest, given if value is None else value)


def verb(func, dest: str | None = None):
    """``then`` of a flag that was a verb in disguise: run ``func`` instead, with what was given as ``dest``."""

    def then(ns: argparse.Namespace, given) -> None:
        ns.func = func
        if dest:
            setattr(ns, dest, given)

    return then


def to_set(key: str, value: str | None = None):
    """``then`` of an old flag that duplicated a config key: it becomes --set KEY=VALUE."""
    return lambda ns, given: setattr(
        ns, "overrides", [*ns.overrides, f"{key}={given if value is None else value}"]
    )
