"""verify-ckpt for a PEFT LoRA adapter folder: does it fit its base, is it finite, does peft load it?

An adapter is checked against the base model it adapts (:func:`find_base_config`: ``--base``,
``--assets``, the run that wrote it, adapter_config.json's ``base_model_name_or_path`` resolved
like ``--model``, the configured assets dir), cheapest first:

  1. adapter_config.json: readable, ``peft_type`` LORA, a positive ``r``, ``target_modules``;
  2. the safetensors header: every key is ``base_model.model.<module>.lora_A|lora_B.weight``, the
     module is a Linear the base has (its expected tensors from config.json, :mod:`trnqwen.ckpt.spec`)
     and one adapter_config targets, A is ``[r, in]`` and B ``[out, r]`` for the base weight
     ``[out, in]``; every targeted module of the base has its pair (peft would leave it at init);
  3. unless ``quick``: every value finite (:mod:`trnqwen.ckpt.scan`'s bit scan) and whether any
     ``lora_B`` is non-zero ("the adapter is untrained" when none is: it changes nothing);
  4. unless ``quick``: the round trip for real, as peft loads it: the base built on the meta device,
     the LoRA layers injected from adapter_config.json, ``set_peft_model_state_dict`` with meta
     tensors shaped like the file's; zero missing and zero unexpected adapter keys (peft loads with
     ``strict=False``, so a wrong name would only warn).

Nothing here imports torch before step 4; files are opened read-only.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional

from trnqwen.assets import ADAPTER_CONFIG, ADAPTER_WEIGHTS
from trnqwen.ckpt.adapter_rules import is_targeted, rank_of, refusals
from trnqwen.ckpt.layout import CheckpointFiles, ModelConfig, _load_config
from trnqwen.contract.peft_adapter import PEFT_KEY, PEFT_PREFIX
from trnqwen.ckpt.spec import ModelSpec, expected_tensors
from trnqwen.errors import UsageError
from trnqwen.safetensors_format import DTYPES, SafetensorsFormatError, SafetensorsHeader, TensorInfo, read_header

UNTRAINED = "the adapter is untrained (every lora_B is zero)"
# Modules peft's LoRA reaches with lora_A/lora_B Linear names (embeddings use lora_embedding_A/B).
_NOT_LINEAR = ("model.embed_tokens",)


def is_adapter(ckpt: CheckpointFiles) -> bool:
    """A PEFT adapter folder: its config or its weights file is there (either alone is a broken one)."""
    return (ckpt.root / ADAPTER_CONFIG).is_file() or any(p.name == ADAPTER_WEIGHTS for p in ckpt.files)


def resolve_base_ref(name: str, cwd: Optional[Path] = None) -> Path:
    """``base_model_name_or_path`` as ``--model`` resolves it: a local folder with config.json, else
    ``assets/hf/<name>`` (where ``trnqwen fetch <name>`` puts it)."""
    from trnqwen.config import model_name

    cwd = Path(cwd or Path.cwd())
    local = Path(name).expanduser()
    local = local if local.is_absolute() else cwd / local
    if (local / "config.json").is_file():
        return local
    return cwd / "assets" / "hf" / model_name(name)


def find_base_config(
    ckpt: CheckpointFiles,
    *,
    base: Optional[Path] = None,
    assets: Optional[Path] = None,
    run_assets: Optional[Path] = None,
    config_assets: Optional[Path] = None,
    base_flag: str = "--base",
) -> ModelConfig:
    """The base model's config.json; ``ModelConfig.source`` says how it was found (``base_flag``:
    what the command calls its option naming the base folder, for the messages)."""
    for given, flag in ((base, base_flag), (assets, "--assets")):
        if given is not None:
            given = Path(given).expanduser()
            if not (given / "config.json").is_file():
                raise UsageError(
                    f"{flag} {given}: no config.json there",
                    hint=f"{flag} must be the base model's HF snapshot the adapter was trained on (trnqwen fetch <model>)",
                )
            return _load_config(given / "config.json", flag)
    named = _base_name(ckpt.root)
    candidates: list[tuple[Optional[Path], str]] = [(run_assets, "the run record's assets")]
    if named:
        candidates.append((resolve_base_ref(named), f"adapter_config.json's base_model_name_or_path {named!r}"))
    candidates.append((config_assets, "the configured assets dir"))
    for where, source in candidates:
        if where is not None and (Path(where) / "config.json").is_file():
            return _load_config(Path(where) / "config.json", source)
    tried = ", ".join(str(p) for p, _ in candidates if p is not None) or "nowhere"
    raise UsageError(
        f"no base model for the adapter {ckpt.root}: no config.json in {tried}",
        hint=f"pass {base_flag} DIR, the snapshot the adapter was trained on (trnqwen fetch <model> downloads it)",
    )


def _base_name(folder: Path) -> Optional[str]:
    try:
        value = json.loads((folder / ADAPTER_CONFIG).read_text(encoding="utf-8")).get("base_model_name_or_path")
    except (OSError, ValueError, AttributeError):
        return None
    return value if isinstance(value, str) and value else None


@dataclass
class AdapterReport:
    checkpoint: str
    step: Optional[int]
    base: str  # the base model folder
    base_source: str
    model: str
    kind: str = "adapter"
    adapter_config: dict[str, Any] = field(default_factory=dict)  # peft_type, r, lora_alpha, ...
    config_problems: list[str] = field(default_factory=list)
    file_errors: dict[str, str] = field(default_factory=dict)
    num_tensors: int = 0
    num_parameters: int = 0
    total_bytes: int = 0
    modules: int = 0  # adapted modules (A and B pairs)
    targets: list[str] = field(default_factory=list)  # module names found (q_proj, ...)
    invalid_keys: list[str] = field(default_factory=list)  # not base_model.model.<module>.lora_A/B.weight
    unknown_modules: list[str] = field(default_factory=list)  # no such Linear in the base
    not_targeted: list[str] = field(default_factory=list)  # in the file, not in target_modules
    unpaired: list[str] = field(default_factory=list)  # lora_A without lora_B or the reverse
    missing_modules: list[str] = field(default_factory=list)  # targeted base modules without a pair
    shape_mismatches: list[dict[str, Any]] = field(default_factory=list)  # {key, expected, found}
    dtype_problems: list[str] = field(default_factory=list)
    scanned: bool = False
    nonfinite: dict[str, int] = field(default_factory=dict)
    nonfinite_detail: dict[str, dict[str, int]] = field(default_factory=dict)
    nonzero_b: Optional[int] = None  # lora_B tensors with a non-zero value
    untrained: Optional[bool] = None
    round_trip: Optional[dict[str, Any]] = None

    @property
    def problems(self) -> list[str]:
        out = [f"adapter_config.json: {p}" for p in self.config_problems]
        out += [f"{name}: {err}" for name, err in self.file_errors.items()]
        for items, what in (
            (self.invalid_keys, "key(s) that are not PEFT LoRA keys (base_model.model.<module>.lora_A/lora_B.weight)"),
            (self.unknown_modules, "adapter module(s) the base model does not have"),
            (self.not_targeted, "adapter module(s) adapter_config.json does not target (target_modules, exclude_modules, "
                                "layers_to_transform: peft would skip them)"),
            (self.unpaired, "module(s) with lora_A or lora_B alone"),
            (self.missing_modules, "targeted base module(s) without an adapter (peft would leave them at init)"),
            (self.dtype_problems, "tensor(s) that are not floating point"),
        ):
            if items:
                out.append(f"{len(items)} {what}: {_few(items)}")
        if self.shape_mismatches:
            m = self.shape_mismatches[0]
            out.append(
                f"{len(self.shape_mismatches)} shape mismatch(es) with the base: {m['key']} is {m['found']}, "
                f"the base needs {m['expected']}" + (" ..." if len(self.shape_mismatches) > 1 else "")
            )
        if self.nonfinite:
            worst = max(self.nonfinite, key=self.nonfinite.get)
            out.append(f"{len(self.nonfinite)} tensor(s) hold NaN/Inf values ({sum(self.nonfinite.values()):,} in all; "
                       f"worst {worst}: {self.nonfinite[worst]:,})")
        rt = self.round_trip or {}
        if rt.get("error"):
            out.append(f"peft round trip: {rt['error']}")
        elif rt.get("missing_adapter_keys") or rt.get("unexpected_keys"):
            out.append(f"peft round trip: {len(rt['missing_adapter_keys'])} missing, {len(rt['unexpected_keys'])} unexpected "
                       f"adapter key(s): {_few(rt['missing_adapter_keys'] + rt['unexpected_keys'])}")
        return out

    @property
    def warnings(self) -> list[str]:
        out = [UNTRAINED] if self.untrained else []
        r = self.adapter_config.get("r")
        if isinstance(r, int) and r > 0:
            from trnqwen.contract.lora import vllm_rank_warning

            note = vllm_rank_warning(r)
            if note:
                out.append(note)
        return out

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "problems": self.problems, "warnings": self.warnings, **asdict(self)}


def _few(items: list[str], n: int = 3) -> str:
    return ", ".join(items[:n]) + (f", ... (+{len(items) - n})" if len(items) > n else "")


def base_linears(spec: ModelSpec) -> dict[str, tuple[int, int]]:
    """HF module path -> (out, in) for every Linear of the base that LoRA can adapt."""
    out = {}
    for key, tensor in spec.tensors.items():
        if key.endswith(".weight") and len(tensor.shape) == 2:
            module = key[: -len(".weight")]
            if module not in _NOT_LINEAR:
                out[module] = (int(tensor.shape[0]), int(tensor.shape[1]))
    return out


def _check_config(folder: Path, report: AdapterReport) -> dict[str, Any]:
    path = folder / ADAPTER_CONFIG
    if not path.is_file():
        report.config_problems.append("missing: peft needs it to load the adapter (peft_type, r, lora_alpha, target_modules)")
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        report.config_problems.append(f"unreadable ({exc})")
        return {}
    if not isinstance(data, dict):
        report.config_problems.append("not a JSON object")
        return {}
    report.adapter_config = {k: data.get(k) for k in (
        "peft_type", "r", "lora_alpha", "lora_dropout", "target_modules", "base_model_name_or_path", "task_type")}
    if data.get("peft_type") != "LORA":
        report.config_problems.append(f"peft_type is {data.get('peft_type')!r}, not 'LORA'")
    r = data.get("r")
    if not isinstance(r, int) or isinstance(r, bool) or r < 1:
        report.config_problems.append(f"r is {r!r}, not a positive integer")
    if not isinstance(data.get("lora_alpha"), (int, float)) or isinstance(data.get("lora_alpha"), bool):
        report.config_problems.append(f"lora_alpha is {data.get('lora_alpha')!r}, not a number")
    targets = data.get("target_modules")
    if not (isinstance(targets, str) or (isinstance(targets, list) and targets and all(isinstance(t, str) for t in targets))):
        report.config_problems.append(f"target_modules is {targets!r}, not a list of module names")
    report.config_problems += refusals(data)
    return data


def _read_weights(folder: Path, report: AdapterReport) -> Optional[SafetensorsHeader]:
    weights = folder / ADAPTER_WEIGHTS
    if not weights.is_file():
        report.file_errors[ADAPTER_WEIGHTS] = "missing: the adapter has no weights"
        return None
    try:
        return read_header(weights)
    except SafetensorsFormatError as exc:
        report.file_errors[ADAPTER_WEIGHTS] = str(exc)
        return None


def own_problems(folder: Path) -> list[str]:
    """What is wrong with the adapter folder itself, before any base is known: its
    adapter_config.json and its weights file's header (verify-ckpt's words)."""
    report = AdapterReport(checkpoint=str(folder), step=None, base="", base_source="", model="")
    _check_config(Path(folder), report)
    _read_weights(Path(folder), report)
    return report.problems


def verify_adapter(
    ckpt: CheckpointFiles, model_config: ModelConfig, *, quick: bool = False, trust_remote_code: bool = False
) -> AdapterReport:
    """Every check that applies; problems are collected in the report, not raised."""
    spec = expected_tensors(model_config.data, str(model_config.path))
    report = AdapterReport(
        checkpoint=str(ckpt.root), step=ckpt.step, base=str(model_config.path.parent),
        base_source=model_config.source, model=spec.describe(),
    )
    config = _check_config(ckpt.root, report)
    header = _read_weights(ckpt.root, report)
    if header is None:
        return report
    tensors = header.tensors
    report.num_tensors = len(tensors)
    report.num_parameters = sum(t.numel for t in tensors.values())
    report.total_bytes = sum(t.nbytes for t in tensors.values())

    linears = base_linears(spec)
    pairs = _check_keys(tensors, linears, config, report)
    if config and "target_modules" in config and not report.config_problems:
        report.missing_modules = sorted(m for m in linears if is_targeted(m, config) and m not in pairs)
    if quick:
        return report
    from trnqwen.ckpt.scan import nonzero_tensors, scan_nonfinite
    from trnqwen.ckpt.verify import record_scan

    try:
        found = scan_nonfinite([header])
        b_keys = [k for k in tensors if k.endswith(".lora_B.weight") and DTYPES.get(tensors[k].dtype) is not None]
        nonzero = nonzero_tensors(header, b_keys)
    except (OSError, EOFError) as exc:
        report.file_errors["scan"] = f"reading failed: {exc}"
        return report
    record_scan(report, found)
    report.nonzero_b = len(nonzero)
    report.untrained = bool(b_keys) and not nonzero
    if not report.config_problems:
        report.round_trip = peft_round_trip(
            ckpt.root, model_config.path.parent, {k: (t.shape, t.dtype) for k, t in tensors.items()},
            skip={m["key"] for m in report.shape_mismatches}, trust_remote_code=trust_remote_code,
        )
    return report


def _check_keys(tensors: dict[str, TensorInfo], linears: dict[str, tuple[int, int]], config: dict[str, Any],
                report: AdapterReport) -> dict[str, set[str]]:
    """Key names, pairs, targets and shapes from the header alone; returns module -> {"A", "B"}."""
    pairs: dict[str, set[str]] = {}
    for key in sorted(tensors):
        m = PEFT_KEY.match(key)
        if m is None:
            report.invalid_keys.append(key)
            continue
        pairs.setdefault(m.group("module"), set()).add(m.group("ab"))
    report.modules = sum(1 for ab in pairs.values() if ab == {"A", "B"})
    report.unpaired = sorted(f"{mod} (lora_{''.join(sorted(ab))} only)" for mod, ab in pairs.items() if ab != {"A", "B"})
    report.unknown_modules = sorted(mod for mod in pairs if mod not in linears)
    report.targets = sorted({mod.rsplit(".", 1)[-1] for mod in pairs})
    if config and config.get("target_modules"):
        report.not_targeted = sorted(mod for mod in pairs if mod in linears and not is_targeted(mod, config))
    for key in sorted(tensors):
        m = PEFT_KEY.match(key)
        info = tensors[key]
        dtype = DTYPES.get(info.dtype)
        if dtype is None or not dtype.is_float:
            report.dtype_problems.append(f"{key} ({info.dtype})")
        if m is None or m.group("module") not in linears:
            continue
        out_f, in_f = linears[m.group("module")]
        r = _rank(m.group("module"), config)
        found = list(info.shape)
        if len(found) != 2:
            want: list[Any] = ["r", in_f] if m.group("ab") == "A" else [out_f, "r"]
        elif m.group("ab") == "A":
            want = [r if r is not None else found[0], in_f]
        else:
            want = [out_f, r if r is not None else found[1]]
        if found != want:
            report.shape_mismatches.append({"key": key, "expected": want, "found": found})
    return pairs


def _rank(module: str, config: dict[str, Any]) -> Optional[int]:
    r = rank_of(module, config) if config else None
    return r if isinstance(r, int) and not isinstance(r, bool) and r > 0 else None


def peft_round_trip(folder: Path, base_dir: Path, header_tensors: dict[str, tuple[tuple[int, ...], str]], *,
                    skip: set[str] = frozenset(), trust_remote_code: bool = False) -> dict[str, Any]:
    """peft's own load of the adapter onto the base, every tensor on the meta device (no memory):
    ``{"library", "model_class", "loaded", "missing_adapter_keys", "unexpected_keys"}`` or ``{"error"}``."""
    import warnings

    try:
        import peft
        import torch
        from peft import LoraConfig, get_peft_model, set_peft_model_state_dict
        from transformers import AutoConfig, AutoModelForCausalLM
    except ImportError as exc:
        return {"error": f"cannot import peft/transformers ({exc}); pip install peft"}
    from trnqwen.safetensors_format import DTYPES as ST

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            config = AutoConfig.from_pretrained(str(base_dir), trust_remote_code=trust_remote_code)
            with torch.device("meta"):
                model = AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code)
            lora = LoraConfig.from_pretrained(str(folder))
            lora.base_model_name_or_path = str(base_dir)
            wrapped = get_peft_model(model, lora)
            state = {
                name: torch.empty(shape, dtype=getattr(torch, ST[dtype].torch_name), device="meta")
                for name, (shape, dtype) in header_tensors.items() if name not in skip and dtype in ST
            }
            result = set_peft_model_state_dict(wrapped, state, low_cpu_mem_usage=True)
    except (ValueError, KeyError, TypeError, RuntimeError, OSError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return {"error": f"peft could not load it onto {base_dir}: {first[:300]}"}
    missing = sorted(_file_key(k) for k in result.missing_keys if ".lora_" in k)
    return {
        "library": f"peft {peft.__version__}",
        "model_class": type(model).__name__,
        "loaded": len(state) - len(result.unexpected_keys),
        "missing_adapter_keys": missing,
        "unexpected_keys": sorted(result.unexpected_keys),
    }


def adapter_key_diff(peft_model: Any, folder: Path) -> tuple[list[str], list[str]]:
    """(missing, unexpected) adapter keys of a loaded ``PeftModel`` against the folder's file: the
    model's LoRA parameters no file key filled, and file keys the model has no parameter for."""
    header = read_header(Path(folder) / ADAPTER_WEIGHTS)
    in_file = set(header.tensors)
    in_model = {_file_key(k) for k in peft_model.state_dict() if ".lora_A." in k or ".lora_B." in k}
    return sorted(in_model - in_file), sorted(in_file - in_model)


def _file_key(key: str) -> str:
    """peft's in-model name (``...lora_A.default.weight``) as the file spells it."""
    key = re.sub(r"\.(lora_[AB])\.[^.]+\.weight$", r".\1.weight", key)
    return key if key.startswith(PEFT_PREFIX) else PEFT_PREFIX + key


__all__ = ["AdapterReport", "UNTRAINED", "is_adapter", "find_base_config", "own_problems", "resolve_base_ref", "verify_adapter",
           "peft_round_trip", "base_linears", "adapter_key_diff"]
