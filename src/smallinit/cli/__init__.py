"""The command line: parses arguments, calls the library, maps errors to exit codes — nothing else.

One grammar (docs/cli.md says it for users, with the old spellings and what replaces them):
- a command is a verb or a noun that names what it prints: ``train``, ``plan``, ``recipes``, ``status DIR``;
  no flag turns one command into another;
- positionals are inputs; ``--out DIR`` is always a folder of outputs, never positional; a command that writes
  one file writes it into that folder under a fixed name (``tokenizer.json``, ``report.html``);
- configuration goes through ``--config`` / ``--preset`` / ``--set KEY=VALUE`` and nothing else;
- ``--num-devices N`` is a count of devices, ``--accelerator KIND`` their kind, ``--device`` where this
  command itself runs.

One module per family of commands, each a tuple of :class:`~smallinit.cli.base.Command` whose flags are declared
by ``add_<command>`` right above its ``cmd_<command>``; ``args`` holds the flags several share, ``deprecated``
the old spellings, kept for one release with one line on stderr. A command's library modules are imported when
it runs, so that every command starts quickly.
"""

from __future__ import annotations

import os
import sys

from smallinit.cli import measuring, models, study, training
from smallinit.cli.base import Parser
from smallinit.errors import Preempted, SmallinitError

COMMANDS = (*training.COMMANDS, *study.COMMANDS, *models.COMMANDS, *measuring.COMMANDS)


def _version() -> str:
    import platform

    import torch

    from smallinit.version import __version__

    return f"smallinit {__version__} (torch {torch.__version__}, Python {platform.python_version()})"


def build_parser() -> Parser:
    parser = Parser(prog="smallinit", description="Small initialization for language models.")
    parser.add_argument("--version", action="version", version=_version())
    sub = parser.add_subparsers(dest="command")
    for command in COMMANDS:
        command.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    # Process setup: PyTorch backs CPU tensors of >= 2 MB with transparent huge pages when this is set before
    # its first such allocation; a training step then takes far fewer page faults (the gain is measured in
    # benchmarks/README.md). THP_MEM_ALLOC_ENABLE=0 in the environment opts out.
    os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")
    args = build_parser().parse_args(argv)
    try:
        code = args.func(args)
        sys.stdout.flush()  # a reader that left (`smallinit info | head`) shows here, not at exit
        return code
    except BrokenPipeError:  # the reader of the output left: nothing went wrong here, nothing to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # nor at Python's flush on exit
        return 141  # as the shell reports a writer stopped by SIGPIPE
    except SmallinitError as e:
        one_line = str(e).replace("\r", "\\r").replace("\n", "\\n")  # a file name may hold a newline
        kind = "" if isinstance(e, Preempted) else "error: "  # a stop that was asked for is not an error
        # one write: lines of several ranks do not interleave
        sys.stderr.write(f"smallinit: {kind}{one_line}\n")
        return e.exit_code
    # a read or write no library call turned into a SmallinitError (disk full, read-only)
    except OSError as e:
        where = f" {e.filename}" if e.filename else ""
        sys.stderr.write(
            f"smallinit: error: cannot access{where} ({e.strerror or type(e).__name__}); "
            "check free disk space, permissions and the path\n"
        )
        return 2
    except (MemoryError, RuntimeError) as e:  # an allocation no estimate foresaw (CPU, GPU or numpy)
        if not isinstance(e, MemoryError) and not any(m in str(e) for m in _OUT_OF_MEMORY):
            raise
        sys.stderr.write(
            f"smallinit: error: out of memory ({_first_line(e)}); lower train.batch_size or "
            "data.seq_len, raise train.grad_accum, set train.activation_checkpointing=true or choose a "
            "smaller model\n"
        )
        return 2
    except KeyboardInterrupt:
        print("smallinit: interrupted", file=sys.stderr)
        return 130


_OUT_OF_MEMORY = ("out of memory", "can't allocate memory")


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return (text[0] if text else type(e).__name__)[:200]
