"""Files brim reads from installed packages: its own default `proxy.toml`, and what it takes
from litellm — without importing litellm.

litellm ships its model map and tiktoken's encoding files; brim reads both from the package
folder, so it needs no network and never pays litellm's import (seconds, hundreds of MB).
"""

from __future__ import annotations

import importlib.resources
import importlib.util
import os
from functools import cache
from pathlib import Path

from brim.policies.model_map import ModelMap

DEFAULT_CONFIG_FILE = "proxy.toml"  # package data: a copy of the repository's proxy.toml
MODEL_MAP_FILE = "model_prices_and_context_window_backup.json"
TOKENIZER_DIR = Path("litellm_core_utils") / "tokenizers"


@cache
def litellm_dir() -> Path | None:
    spec = importlib.util.find_spec("litellm")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def use_bundled_tiktoken_files() -> Path | None:
    """Point tiktoken at litellm's copies of its encodings, unless the user chose a folder."""
    if "TIKTOKEN_CACHE_DIR" in os.environ:
        return Path(os.environ["TIKTOKEN_CACHE_DIR"])
    package = litellm_dir()
    if package is None:
        return None
    folder = package / TOKENIZER_DIR
    os.environ["TIKTOKEN_CACHE_DIR"] = str(folder)
    return folder


@cache
def litellm_model_map() -> ModelMap:
    package = litellm_dir()
    if package is None or not (package / MODEL_MAP_FILE).is_file():
        return ModelMap.empty()
    return ModelMap.from_json((package / MODEL_MAP_FILE).read_bytes())


def default_config_text() -> str:
    """The commented default `proxy.toml` that `brim init` writes, from the installed package
    (the repository's proxy.toml; a test keeps the two identical)."""
    return importlib.resources.files("brim.proxy").joinpath(DEFAULT_CONFIG_FILE).read_text("utf-8")
