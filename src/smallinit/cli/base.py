"""What every command stands on: the parser that says a user error in one line, and :class:`Command`, one
command's name, its line in ``smallinit --help``, the function that declares its flags and the one that runs it."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass

from smallinit.cli.deprecated import OmittedOnlyByOld


class _Usage(argparse.HelpFormatter):
    """argparse's help, but a positional that only an old spelling leaves out is shown as required."""

    def _format_args(self, action: argparse.Action, default_metavar: str) -> str:
        if isinstance(action, OmittedOnlyByOld):
            return self._metavar_formatter(action, default_metavar)(1)[0]
        return super()._format_args(action, default_metavar)


class Parser(argparse.ArgumentParser):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **{"formatter_class": _Usage, **kwargs})

    def parse_args(self, args=None, namespace=None):
        """An unknown flag is refused by the command it was given to, pointing to that command's --help (argparse
        refuses it at the top, pointing to `smallinit --help`, which lists no command's flags)."""
        parsed, unknown = self.parse_known_args(args, namespace)
        if unknown:
            self._chosen(parsed).error(f"unrecognized arguments: {' '.join(unknown)}")
        return parsed

    def _chosen(self, parsed: argparse.Namespace) -> argparse.ArgumentParser:
        """The innermost command the arguments chose (``smallinit tokenizer train``: tokenizer's train)."""
        parser: argparse.ArgumentParser = self
        while True:
            sub = next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)
            name = getattr(parsed, sub.dest, None) if sub else None
            if name is None:
                return parser
            parser = sub.choices[name]

    def error(self, message: str):
        """One line and exit 2, like every other user error (argparse would print the usage first)."""
        self.exit(2, f"{self.prog}: error: {message}; see {self.prog} --help\n")

    def add_subparsers(self, **kwargs):
        """A command that holds subcommands (smallinit, smallinit tokenizer, ...) prints its help when given alone,
        rather than argparse's "the following arguments are required"."""
        self.set_defaults(func=self._print_help)
        return super().add_subparsers(**{**kwargs, "required": False})

    def _print_help(self, _args: argparse.Namespace) -> int:
        self.print_help()
        return 0


@dataclass(frozen=True)
class Command:
    """One command: ``add(parser)`` declares its flags (in its family's module, right above ``run``; None: it takes
    none), ``run(args)`` does it and returns the exit code. A command that holds others (``tokenizer``) has
    ``commands`` instead."""

    name: str
    help: str
    add: Callable[[argparse.ArgumentParser], None] | None = None
    run: Callable[[argparse.Namespace], int] | None = None
    commands: tuple[Command, ...] = ()

    def register(self, sub: argparse._SubParsersAction) -> None:
        p = sub.add_parser(self.name, help=self.help)
        if self.commands:
            inner = p.add_subparsers(dest=f"{self.name}_command")
            for command in self.commands:
                command.register(inner)
            return
        if self.add:
            self.add(p)
        p.set_defaults(func=self.run)
