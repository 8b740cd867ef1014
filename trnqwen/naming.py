"""How a model is named on disk: its short name, its slug and its default checkpoint folder."""

from __future__ import annotations

import re
from pathlib import Path

from trnqwen.constants import BUILTIN_PREFIX, DEFAULT_MODEL


def _expand(path: str) -> Path:
    """``Path(path).expanduser()``, but ``~nosuchuser`` stays as written instead of raising."""
    try:
        return Path(path).expanduser()
    except RuntimeError:
        return Path(path)


def model_name(model: str) -> str:
    if model.startswith(BUILTIN_PREFIX):
        return model[len(BUILTIN_PREFIX):]
    return model.rstrip("/").split("/")[-1]


def default_checkpoint_dir(model: str, finetune: bool) -> Path:
    """``checkpoint_<slug>_<hash6>[_ft]``: readable, and different models never share a folder.

    The hash is of the model's identity (the Hub id as given, ``builtin:<name>``, or a local
    folder's resolved path), so ``Qwen3-4B-Instruct-2507`` and ``Qwen3-4B-Base`` (one slug) or two
    local folders both called ``model`` get different folders.  The recipe's own model keeps the
    recipe's folder name, ``checkpoint_qwen3_4b[_ft]`` (what its users type); being one fixed
    identity, it cannot collide with any other model, which always carries a hash.
    """
    import hashlib

    if model == DEFAULT_MODEL:
        return Path(f"checkpoint_{model_slug(model)}{'_ft' if finetune else ''}")
    identity = model
    local = _expand(model)
    if not model.startswith(BUILTIN_PREFIX) and local.exists():
        identity = str(local.resolve())
    digest = hashlib.sha256(identity.encode("utf-8", "surrogatepass")).hexdigest()[:6]
    return Path(f"checkpoint_{model_slug(model)}_{digest}{'_ft' if finetune else ''}")


_SLUG_DROP = re.compile(r"-(instruct|base|chat|it|fp8|awq|gptq|\d{4})$", re.IGNORECASE)


def model_slug(model: str) -> str:
    """``Qwen/Qwen3-4B-Instruct-2507`` -> ``qwen3_4b``, as in the recipe's checkpoint_qwen3_4b_ft.

    Unicode-aware (NFKC, casefolded, Unicode word characters kept) so non-ASCII names stay
    readable: ``./模型-v1`` -> ``模型_v1``.
    """
    import unicodedata

    name = unicodedata.normalize("NFKC", model_name(model))
    previous = None
    while previous != name:
        previous, name = name, _SLUG_DROP.sub("", name)
    slug = re.sub(r"[\W_]+", "_", name.casefold()).strip("_")
    return slug[:40].rstrip("_") or "model"
