"""Typed configs (model / train / data / analysis), presets, TOML files and ``--set key=value`` overrides.

schema: the sections, their validation and ``Config``, which resolves them; presets: the named model shapes;
files: reading TOML / config.json and writing commented TOML; overrides: dotted ``--set`` keys; coerce: a
section built from a dict, each value checked against its field's type.
"""

from smallinit.config.coerce import from_dict
from smallinit.config.files import read_config_file, read_toml
from smallinit.config.overrides import flatten, parse_override, set_dotted
from smallinit.config.presets import PRESET_ALIASES, PRESETS
from smallinit.config.schema import (
    AnalysisConfig,
    Config,
    DataConfig,
    KeyDoc,
    ModelConfig,
    MoEConfig,
    TrainConfig,
    config_keys,
    emulated_eps,
)

__all__ = [
    "PRESETS",
    "PRESET_ALIASES",
    "AnalysisConfig",
    "Config",
    "DataConfig",
    "KeyDoc",
    "ModelConfig",
    "MoEConfig",
    "TrainConfig",
    "config_keys",
    "emulated_eps",
    "flatten",
    "from_dict",
    "parse_override",
    "read_config_file",
    "read_toml",
    "set_dotted",
]
