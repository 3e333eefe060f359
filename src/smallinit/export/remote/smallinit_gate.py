"""A Hugging Face causal LM with smallinit's attention output gate, saved and loaded with the gate.

A gated model's config writes ``model_type = "smallinit_gated"``, the architecture's own model type and the
gate in ``smallinit_gate``, and an ``auto_map`` to this file, which ``save_pretrained`` copies beside the
weights. Plain ``AutoModelForCausalLM.from_pretrained`` therefore stops with transformers' request for
``trust_remote_code=True`` instead of loading the architecture without its gate; with it, this file rebuilds
the architecture's own class, adds the gate to the blocks named in the config (smallinit.init.gate), and loads
every weight, W_θ included. Needs smallinit installed (transformers says so when it is not).
"""

from __future__ import annotations

import copy
import shutil
from pathlib import Path

from transformers import CONFIG_MAPPING, AutoModelForCausalLM, PretrainedConfig

from smallinit.init.gate import gate_attention_

MODEL_TYPE = "smallinit_gated"
FILE = Path(__file__).name
AUTO_MAP = {
    "AutoConfig": f"{Path(__file__).stem}.SmallinitGatedConfig",
    "AutoModelForCausalLM": f"{Path(__file__).stem}.SmallinitGatedForCausalLM",
}
_CLASSES: dict[type, type] = {}


def gated_config_class(base: type) -> type:
    """The architecture's config class, saved as a gated model's: same fields, same behaviour."""
    if base not in _CLASSES:

        def to_dict(self) -> dict:
            out = base.to_dict(self)
            if "smallinit_gate" not in vars(self):  # the class's defaults (to_diff_dict compares with them)
                return out
            out["smallinit_gate"] = {**self.smallinit_gate, "model_type": base.model_type}
            out["model_type"], out["auto_map"] = MODEL_TYPE, dict(AUTO_MAP)
            return out

        def save_pretrained(self, save_directory, **kwargs) -> None:
            base.save_pretrained(self, save_directory, **kwargs)
            shutil.copyfile(__file__, Path(save_directory) / FILE)

        _CLASSES[base] = type(
            f"Gated{base.__name__}",
            (base,),
            {"__module__": __name__, "to_dict": to_dict, "save_pretrained": save_pretrained},
        )
    return _CLASSES[base]


def mark_gated(model, gate: dict) -> None:
    """Give ``model`` a config of its own that saves as a gated model's (``gate``: kind, gamma, the gated
    blocks); the config object it was built from, which other models may share, is left as it was."""
    old = model.config
    config = copy.copy(old)
    config.__class__ = gated_config_class(type(old))
    config.smallinit_gate = dict(gate)
    config.auto_map = dict(AUTO_MAP)
    for module in model.modules():
        if vars(module).get("config") is old:
            module.config = config


def gated_model_class(config) -> type:
    """The architecture's causal-LM class whose instances carry the gate of ``config`` (a gated config)."""
    base = AutoModelForCausalLM._model_mapping[type(config).__mro__[1]]
    if base not in _CLASSES:

        def __init__(self, config, *args, **kwargs) -> None:
            base.__init__(self, config, *args, **kwargs)
            gate = config.smallinit_gate
            gate_attention_(self, gate["kind"], gate["gamma"], blocks=list(gate["blocks"]))

        _CLASSES[base] = type(base.__name__, (base,), {"__module__": __name__, "__init__": __init__})
    return _CLASSES[base]


class SmallinitGatedConfig(PretrainedConfig):
    """Reads a gated folder's config as the architecture's config class, marked gated."""

    model_type = MODEL_TYPE

    @classmethod
    def from_dict(cls, config_dict: dict, **kwargs):
        config_dict = dict(config_dict)
        gate = dict(config_dict.pop("smallinit_gate"))
        model_type = gate.pop("model_type")
        config_dict["model_type"] = model_type
        out = gated_config_class(CONFIG_MAPPING[model_type]).from_dict(config_dict, **kwargs)
        config = out[0] if isinstance(out, tuple) else out
        config.smallinit_gate = gate
        return out

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, **kwargs):
        config_dict, kwargs = cls.get_config_dict(pretrained_model_name_or_path, **kwargs)
        return cls.from_dict(config_dict, **kwargs)


class SmallinitGatedForCausalLM:
    """Builds the architecture's own causal LM with the gate, then loads every weight into it."""

    @classmethod
    def register_for_auto_class(cls, auto_class="AutoModelForCausalLM") -> None:
        pass

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *args, config, **kwargs):
        return gated_model_class(config).from_pretrained(
            pretrained_model_name_or_path, *args, config=config, **kwargs
        )

    @classmethod
    def _from_config(cls, config, **kwargs):
        return gated_model_class(config)._from_config(config, **kwargs)
