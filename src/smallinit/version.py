"""The package version, in one place (pyproject.toml carries the same number for packaging)."""

__version__ = "0.1.0"
