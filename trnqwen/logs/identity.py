"""Which model a log trained, from the log alone.

A log copied off a trn2 node comes without its run directory, but it names its model: the
checkpoint path (``Loading the checkpoint from .../assets/hf/Qwen3-4B-Instruct-2507``), the job
description, the model/flavor lines (``Building qwen3 4B``, the HF backend's
``Model transformers_modeling_backend Qwen3-4B-Instruct-2507 size: ...``), the parameter count,
and lines that state the vocabulary.  Every Qwen3 size shares one 151,936-token vocabulary, and
each size has a known layer count, so naming the size is enough for the random-init loss check
(ln 151936 = 11.93) and for "one override per layer".

Explicit facts win: ``--vocab-size`` / ``--expect-layers`` and the run directory's config.json
(:func:`trnqwen.logs.sources.run_context`) are kept; the log only fills what is missing.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from pathlib import PurePath
from typing import Optional

from trnqwen.logs.record import ParsedLog
from trnqwen.logs.sources import RunContext

QWEN3_VOCAB = 151936


@dataclass(frozen=True)
class KnownModel:
    size: str  # "4B", "30B-A3B"
    layers: int
    params: int  # total parameters as torchtitan / transformers count them
    loaded_step1_loss: Optional[float] = None  # a documented step-1 loss from the published weights


# Qwen3 sizes (config.json num_hidden_layers; parameter counts of the published checkpoints).
QWEN3_SIZES: dict[str, KnownModel] = {m.size.lower(): m for m in (
    KnownModel("0.6B", 28, 596_049_920),
    KnownModel("1.7B", 28, 2_031_739_904),
    KnownModel("4B", 36, 4_022_468_096, loaded_step1_loss=6.54),  # the recipe's documented run
    KnownModel("8B", 36, 8_190_735_360),
    KnownModel("14B", 40, 14_768_307_200),
    KnownModel("32B", 64, 32_762_123_264),
    KnownModel("30B-A3B", 48, 30_532_122_624),
    KnownModel("235B-A22B", 94, 235_093_634_560),
)}
_REPO_RE = re.compile(r"qwen3[-_ ]?(\d+(?:\.\d+)?b(?:-a\d+(?:\.\d+)?b)?)(?![\w.])", re.IGNORECASE)
_SIZE_RE = re.compile(r"^(\d+(?:\.\d+)?B(?:-A\d+(?:\.\d+)?B)?)$", re.IGNORECASE)


@dataclass(frozen=True)
class ModelIdentity:
    """What the log says about its model; each fact with where it came from."""

    name: Optional[str] = None  # "Qwen3-4B" (a known size) or the log's own name
    known: Optional[KnownModel] = None
    vocab_size: Optional[int] = None
    vocab_source: Optional[str] = None
    num_layers: Optional[int] = None
    layers_source: Optional[str] = None


def _size_in(evidence: list[tuple[Optional[str], str]]) -> tuple[Optional[KnownModel], Optional[str]]:
    """The first known Qwen3 size the (text, where it is) pairs name, and where."""
    for text, where in evidence:
        for m in _REPO_RE.finditer(text or ""):
            if m.group(1).lower() in QWEN3_SIZES:
                return QWEN3_SIZES[m.group(1).lower()], where
    return None, None


def _size_from_params(params: Optional[int]) -> Optional[KnownModel]:
    """The Qwen3 size within 10% of a parameter count (the log must already say "qwen3")."""
    if not params or params <= 0:
        return None
    best = min(QWEN3_SIZES.values(), key=lambda m: abs(math.log(params / m.params)))
    return best if abs(params / best.params - 1) <= 0.10 else None


def identify(log: ParsedLog) -> ModelIdentity:
    """The model named by the log (see the module docstring for the evidence, strongest first)."""
    load_paths = [e["path"] for e in log.checkpoint_events if e.get("kind") == "load" and e.get("path")]
    evidence: list[tuple[Optional[str], str]] = [
        *((PurePath(p.rstrip("/")).name, f"the checkpoint path {p}") for p in load_paths),
        (log.model_flavor, f"the model line ({log.model_name} {log.model_flavor})"),
        (log.job_description, f"the job description ({log.job_description})"),
        *((p, f"the checkpoint path {p}") for p in load_paths),
    ]
    known, source = _size_in(evidence)
    family = " ".join(x for x in (log.model_name, log.model_flavor, log.job_description, *load_paths) if x).lower()
    if known is None and "qwen3" in family and log.model_flavor and _SIZE_RE.match(log.model_flavor):
        known = QWEN3_SIZES.get(log.model_flavor.lower())
        source = f"the model line ({log.model_name} {log.model_flavor})" if known else None
    if known is None and "qwen3" in family:
        known = _size_from_params(log.model_params)
        source = f"the parameter count ({log.model_params:,})" if known else None
    name = f"Qwen3-{known.size}" if known else (log.model_flavor or log.model_name)
    vocab, vocab_src = (log.vocab_size, "a vocab line in the log") if log.vocab_size else (None, None)
    if vocab is None and known is not None:
        vocab, vocab_src = QWEN3_VOCAB, f"Qwen3-{known.size}, from {source}"
    if vocab is None:
        vocab = known_vocab(log.model_name, log.model_flavor)
        vocab_src = f"torchtitan's {log.model_name} {log.model_flavor}" if vocab else None
    layers, layers_src = (log.num_layers, "a layer-count line in the log") if log.num_layers else (None, None)
    if layers is None and known is not None:
        layers, layers_src = known.layers, f"Qwen3-{known.size}, from {source}"
    return ModelIdentity(name=name, known=known, vocab_size=vocab, vocab_source=vocab_src,
                         num_layers=layers, layers_source=layers_src)


# The vocabulary of torchtitan's own model families' sized flavors (their debugmodel* flavors: 2048).
FAMILY_VOCAB = {"qwen3": QWEN3_VOCAB, "llama3": 128256}
_SIZED_FLAVOR_RE = re.compile(r"(?:^|[-_ ])\d+(?:\.\d+)?B(?:-A\d+(?:\.\d+)?B)?(?:$|[-_ ])", re.IGNORECASE)


def known_vocab(model_name: Optional[str], flavor: Optional[str]) -> Optional[int]:
    """The vocab size of a torchtitan model flavor named in the log: ``Building qwen3 4B``
    (flavors debugmodel* -> 2048, sized flavors -> the family's vocab); the HF backend names the
    checkpoint as the flavor (``Qwen3-4B-Instruct-2507``).  None for anything else (e.g. a
    custom ``tiny-qwen3``): then the vocab must come from config.json or --vocab-size."""
    text = f"{model_name} {flavor or ''}".lower()
    family = next((f for f in FAMILY_VOCAB if f in text), None) if model_name else None
    if family is None:
        return None
    if (flavor or "").lower().startswith("debugmodel"):
        return 2048
    return FAMILY_VOCAB[family] if _SIZED_FLAVOR_RE.search(flavor or "") else None


def with_identity(log: ParsedLog, ctx: RunContext) -> RunContext:
    """``ctx`` with the vocab size and layer count the log implies, where ctx has none."""
    ident = identify(log)
    changes: dict = {"identity": ident}
    if not ctx.vocab_size and ident.vocab_size:
        changes.update(vocab_size=ident.vocab_size, vocab_source=ident.vocab_source)
    if not ctx.num_layers and ident.num_layers:
        changes.update(num_layers=ident.num_layers, layers_source=ident.layers_source)
    return replace(ctx, **changes)
