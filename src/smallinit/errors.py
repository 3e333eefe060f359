"""User-facing errors: one line that says what is wrong and what to do. The CLI exits 2 on them."""

import difflib
from collections.abc import Iterable


def did_you_mean(word: str, choices: Iterable[str], prefix: str = "") -> str:
    """ " (did you mean PREFIX+CHOICE?)" for the choice closest to a misspelled ``word``, or "" if none is close."""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" (did you mean {prefix}{close[0]}?)" if close else ""


class SmallinitError(Exception):
    """A problem with the user's input (config, file, checkpoint, corpus), not a bug in smallinit."""

    exit_code = 2


class ConfigError(SmallinitError):
    """A config value, preset or override is invalid."""


class DataError(SmallinitError):
    """A corpus, tokenizer or data file cannot be used."""


class CheckpointError(SmallinitError):
    """A checkpoint or run folder is missing, incomplete, tampered with or does not match."""


class ModelError(SmallinitError):
    """A model cannot be measured: no adapter for its class, a norm whose ε cannot be read, an attention
    call whose probabilities cannot be rebuilt, or a folder that holds no model smallinit can load."""


class StorageError(SmallinitError):
    """A file could not be written (disk full, read-only or missing folder); what was written before is kept.
    ``why`` is the system's reason (e.g. "No space left on device")."""

    def __init__(self, message: str, why: str = ""):
        super().__init__(message)
        self.why = why


class TrainingError(SmallinitError):
    """Training cannot go on (for example a non-finite loss)."""


class ExperimentError(SmallinitError):
    """A sweep file, sweep folder or recipe cannot be used (bad grid, folder of another sweep, busy folder)."""


class Preempted(SmallinitError):
    """Training stopped on SIGTERM/SIGINT after writing a checkpoint; ``--resume`` continues it."""

    exit_code = 75  # EX_TEMPFAIL: try again later
