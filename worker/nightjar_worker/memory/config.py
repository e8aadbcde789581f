"""Where the elastic draft memory configuration comes from (its model: ``nightjar_contract.memory``).

Sources, first found wins: env ``NIGHTJAR_MEMORY`` (inline JSON, or a path to a JSON/YAML file),
then ``additional_config["nightjar_memory"]`` of the vLLM engine (``LLM(additional_config=...)`` /
``--additional-config``). Absent or ``enabled: false``: the draft stays resident, vLLM unchanged.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import yaml
from nightjar_contract.memory import ADDITIONAL_CONFIG_KEY, ENV, ElasticMemoryConfig


def load_config(additional_config: dict[str, Any] | None = None, environ: dict[str, str] | None = None) -> ElasticMemoryConfig:
    env = os.environ if environ is None else environ
    raw: Any = None
    src = env.get(ENV, "").strip()
    if src:
        if src.startswith("{"):
            raw = json.loads(src)
        else:
            p = Path(src)
            if not p.is_file():
                raise ValueError(f"{ENV}: {src!r} is neither inline JSON nor an existing file")
            raw = yaml.safe_load(p.read_text())
    elif additional_config and ADDITIONAL_CONFIG_KEY in additional_config:
        raw = additional_config[ADDITIONAL_CONFIG_KEY]
    if raw is None:
        return ElasticMemoryConfig()
    return ElasticMemoryConfig.model_validate(raw)
