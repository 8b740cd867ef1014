"""verify-ckpt's core: is an exported checkpoint a standard, loadable, finite HF checkpoint?

Order of work, cheapest first, each step only reading what it needs:
  1. resolve the files (:mod:`trnqwen.ckpt.layout`) and the config.json to build from;
  2. parse every safetensors header (no tensor data) and cross-check the index file;
  3. compare names/shapes/dtypes with the model's state dict (:mod:`trnqwen.ckpt.spec`);
     ``round_trip=True`` also runs the recipe's meta-device ``load_state_dict`` (a Qwen3-MoE:
     ``from_pretrained`` of the folder on meta, which fuses the experts, + an expert/router check);
  4. unless ``quick``, stream every byte once counting NaN/Inf (:mod:`trnqwen.ckpt.scan`);
  5. opt-in: relative change against a reference checkpoint, and a greedy generation.
Files are only ever opened read-only.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

from trnqwen.ckpt.layout import INDEX_NAME, CheckpointFiles, ModelConfig
from trnqwen.safetensors_format import SafetensorsFormatError, SafetensorsHeader, TensorInfo, read_header
from trnqwen.fsutil import broken_link
from trnqwen.ckpt.spec import ModelSpec, expected_tensors

DEFAULT_MAX_REL_CHANGE = 1.0


@dataclass
class Mismatch:
    key: str
    kind: str  # "shape" | "dtype"
    expected: Any
    found: Any
    fatal: bool

    def line(self) -> str:
        note = "" if self.fatal else " (loads fine: cast on load)"
        return f"{self.key}: {self.kind} {self.found} in the checkpoint, the model expects {self.expected}{note}"


@dataclass
class VerifyReport:
    checkpoint: str
    step: Optional[int]
    config_path: str
    config_source: str
    model: str
    config_dtype: Optional[str] = None
    files: list[dict[str, Any]] = field(default_factory=list)
    file_errors: dict[str, str] = field(default_factory=dict)
    index: Optional[str] = None
    index_problems: list[str] = field(default_factory=list)
    num_tensors: int = 0
    num_parameters: int = 0
    total_bytes: int = 0
    missing_keys: list[str] = field(default_factory=list)
    unexpected_keys: list[str] = field(default_factory=list)
    expected_missing: list[str] = field(default_factory=list)
    mismatched: list[Mismatch] = field(default_factory=list)
    diagnosis: Optional[str] = None
    scanned: bool = False
    nonfinite: dict[str, int] = field(default_factory=dict)
    nonfinite_detail: dict[str, dict[str, int]] = field(default_factory=dict)
    round_trip: Optional[dict[str, Any]] = None
    compare: Optional[dict[str, Any]] = None
    generate: Optional[dict[str, Any]] = None
    kind: str = "model"  # a whole model; "adapter" is trnqwen.ckpt.verify_adapter.AdapterReport

    @property
    def fatal_mismatches(self) -> list[Mismatch]:
        return [m for m in self.mismatched if m.fatal]

    @property
    def problems(self) -> list[str]:
        """One line per failed check (empty = ok)."""
        out = [f"{name}: {err}" for name, err in self.file_errors.items()]
        out += [f"index: {p}" for p in self.index_problems]
        if self.diagnosis:
            out.append(self.diagnosis)
        if self.missing_keys:
            out.append(f"{len(self.missing_keys)} missing key(s): {_few(self.missing_keys)}")
        if self.unexpected_keys:
            out.append(f"{len(self.unexpected_keys)} unexpected key(s): {_few(self.unexpected_keys)}")
        fatal = self.fatal_mismatches
        if fatal:
            out.append(f"{len(fatal)} shape/dtype mismatch(es): {fatal[0].line()}" + (" ..." if len(fatal) > 1 else ""))
        if self.nonfinite:
            worst = max(self.nonfinite, key=self.nonfinite.get)
            out.append(
                f"{len(self.nonfinite)} tensor(s) hold NaN/Inf values ({sum(self.nonfinite.values()):,} in all; "
                f"worst {worst}: {self.nonfinite[worst]:,})"
            )
        if self.round_trip and self.round_trip.get("disagrees"):
            out.append(f"round trip disagrees with the header check: {self.round_trip['disagrees']}")
        if self.compare:
            out += self.compare.get("problems", [])
        if self.generate and self.generate.get("error"):
            out.append(f"generate: {self.generate['error']}")
        return out

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["mismatched"] = [asdict(m) for m in self.mismatched]
        return {"ok": self.ok, "problems": self.problems, **data}


def _few(items: list[str], n: int = 3) -> str:
    return ", ".join(items[:n]) + (f", ... (+{len(items) - n})" if len(items) > n else "")


# --- headers and index ----------------------------------------------------------------------


def read_headers(files: list[Path]) -> tuple[dict[Path, SafetensorsHeader], dict[str, str]]:
    headers: dict[Path, SafetensorsHeader] = {}
    errors: dict[str, str] = {}
    for path in files:
        try:
            headers[path] = read_header(path)
        except SafetensorsFormatError as exc:
            errors[path.name] = str(exc)
    return headers, errors


def check_index(index_path: Path, root: Path, headers: dict[Path, SafetensorsHeader]) -> list[str]:
    """The index's weight_map against the shards: every tensor where it says, no strays, sizes add up."""
    try:
        doc = json.loads(index_path.read_text(encoding="utf-8"))
        weight_map = doc["weight_map"]
        if not isinstance(weight_map, dict):
            raise TypeError("weight_map is not an object")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return [f"{index_path.name} is unreadable or has no weight_map ({exc})"]
    problems: list[str] = []
    by_name = {p.name: h for p, h in headers.items()}
    listed_files = sorted(set(weight_map.values()))
    for fname in listed_files:
        if not (root / fname).is_file():
            n = sum(1 for f in weight_map.values() if f == fname)
            link = broken_link(root / fname)  # a self-link or a dangling one is there, just unreadable
            what = f"it is {link}" if link else ("it is not a file" if (root / fname).exists() else "the file is absent")
            problems.append(f"lists {fname} ({n} tensors) but {what}")
    for name, fname in sorted(weight_map.items()):
        header = by_name.get(fname)
        if header is not None and name not in header.tensors:
            where = [h.path.name for h in headers.values() if name in h.tensors]
            problems.append(f"says {name} is in {fname} but it is " + (f"in {where[0]}" if where else "in no shard"))
    for path, header in sorted(headers.items()):
        strays = sorted(n for n in header.tensors if n not in weight_map)
        if strays:
            problems.append(f"{path.name} holds {len(strays)} tensor(s) the index does not list: {_few(strays)}")
    unlisted = sorted(p.name for p in headers if p.name not in listed_files)
    if unlisted:
        problems.append(f"shard file(s) not referenced by the index: {', '.join(unlisted)}")
    total = (doc.get("metadata") or {}).get("total_size")
    if total is not None and all((root / f).name in by_name for f in listed_files):
        actual = sum(t.nbytes for h in headers.values() for t in h.tensors.values())
        if int(total) != actual:
            problems.append(f"metadata.total_size is {int(total):,} bytes but the shards hold {actual:,}")
    return problems


# --- keys, shapes, dtypes --------------------------------------------------------------------


def compare_keys(spec: ModelSpec, tensors: dict[str, TensorInfo]) -> tuple[list[str], list[str], list[str], list[Mismatch]]:
    """(missing, unexpected, expected_missing, mismatched), as load_state_dict(strict=False) sees it."""
    absent = sorted(k for k in spec.tensors if k not in tensors)
    expected_missing = [k for k in absent if k in spec.expected_missing]
    missing = [k for k in absent if k not in spec.expected_missing]
    unexpected = sorted(k for k in tensors if k not in spec.tensors)
    mismatched: list[Mismatch] = []
    from trnqwen.safetensors_format import DTYPES

    for name in sorted(set(spec.tensors) & set(tensors)):
        want, have = spec.tensors[name], tensors[name]
        if tuple(want.shape) != tuple(have.shape):
            mismatched.append(Mismatch(name, "shape", list(want.shape), list(have.shape), True))
        elif want.dtype and want.dtype != have.dtype:
            # float <-> float loads (load_state_dict copies with a cast); float <-> int does not.
            fatal = DTYPES[want.dtype].is_float != DTYPES[have.dtype].is_float
            mismatched.append(Mismatch(name, "dtype", want.dtype, have.dtype, fatal))
    return missing, unexpected, expected_missing, mismatched


def diagnose_size(spec: ModelSpec, tensors: dict[str, TensorInfo]) -> Optional[str]:
    """One line when the checkpoint is plainly another model size than the config."""
    import re

    layers = {int(m.group(1)) for k in tensors if (m := re.match(r"model\.layers\.(\d+)\.", k))}
    emb = tensors.get("model.embed_tokens.weight")
    found = {
        "layers": (max(layers) + 1) if layers else None,
        "hidden": emb.shape[1] if emb is not None and len(emb.shape) == 2 else None,
        "vocab": emb.shape[0] if emb is not None and len(emb.shape) == 2 else None,
    }
    want = {"layers": spec.num_layers, "hidden": spec.hidden_size, "vocab": spec.vocab_size}
    differs = [k for k in want if found[k] is not None and found[k] != want[k]]
    if not differs:
        return None
    have = ", ".join(f"{k} {found[k]}" for k in want if found[k] is not None)
    need = ", ".join(f"{k} {want[k]}" for k in want)
    return f"the checkpoint is another model size than config.json (checkpoint: {have}; config: {need})"


# --- the whole check -------------------------------------------------------------------------


def verify(
    ckpt: CheckpointFiles,
    model_config: ModelConfig,
    *,
    quick: bool = False,
    round_trip: bool = False,
    compare_to: Optional[CheckpointFiles] = None,
    max_rel_change: float = DEFAULT_MAX_REL_CHANGE,
    generate_prompt: Optional[str] = None,
    generate_options: Optional[dict[str, Any]] = None,
    trust_remote_code: bool = False,
    progress: Optional[Callable[[str, int], Callable[[int], None]]] = None,
) -> VerifyReport:
    """Run every check that applies; problems are collected in the report, not raised.

    ``progress(label, total_bytes)`` may return a callback taking bytes done (for a progress bar).
    """
    spec = expected_tensors(model_config.data, str(model_config.path))
    report = VerifyReport(
        checkpoint=str(ckpt.root),
        step=ckpt.step,
        config_path=str(model_config.path),
        config_source=model_config.source,
        model=spec.describe(),
        config_dtype=spec.dtype,
        index=str(ckpt.index) if ckpt.index else None,
    )
    headers, report.file_errors = read_headers(ckpt.files)
    report.files = [
        {"name": p.name, "bytes": p.stat().st_size, "tensors": len(headers[p].tensors)} if p in headers
        else {"name": p.name, "bytes": p.stat().st_size, "error": report.file_errors[p.name]}
        for p in ckpt.files
    ]
    if ckpt.index is not None:
        report.index_problems = check_index(ckpt.index, ckpt.root, headers)
    elif len(ckpt.files) > 1:
        report.index_problems = [f"{len(ckpt.files)} shard files but no {INDEX_NAME} to say which tensor is where"]
    elif not ckpt.files:
        report.index_problems = ["no shard files at all"]

    tensors: dict[str, TensorInfo] = {}
    where: dict[str, SafetensorsHeader] = {}
    for path, header in headers.items():
        for name, info in header.tensors.items():
            if name in tensors:
                report.index_problems.append(f"{name} is stored twice ({where[name].path.name} and {path.name})")
            tensors[name] = info
            where[name] = header
    report.num_tensors = len(tensors)
    report.num_parameters = sum(t.numel for t in tensors.values())
    report.total_bytes = sum(t.nbytes for t in tensors.values())
    if report.file_errors:
        return report  # keys from an unreadable shard would only add noise

    missing, unexpected, expected_missing, mismatched = compare_keys(spec, tensors)
    report.missing_keys, report.unexpected_keys = missing, unexpected
    report.expected_missing, report.mismatched = expected_missing, mismatched
    if missing or unexpected or any(m.fatal for m in mismatched):
        report.diagnosis = diagnose_size(spec, tensors)

    if round_trip:
        report.round_trip = _round_trip(model_config, tensors, report, trust_remote_code, ckpt=ckpt)

    if not quick:
        ordered = list(headers.values())
        cb = progress("scanning values", report.total_bytes) if progress else None
        from trnqwen.ckpt.scan import scan_nonfinite

        try:
            found = scan_nonfinite(ordered, cb)
        except (OSError, EOFError) as exc:
            report.file_errors["scan"] = f"reading failed: {exc}"
            return report
        record_scan(report, found)

    if compare_to is not None:
        report.compare = _compare(tensors, where, compare_to, max_rel_change, progress)

    if generate_prompt is not None:
        from trnqwen.ckpt.generate import generate

        report.generate = generate(ckpt, model_config, generate_prompt, trust_remote_code=trust_remote_code, **(generate_options or {}))
    return report


def _round_trip(model_config: ModelConfig, tensors: dict[str, TensorInfo], report: VerifyReport, trust_remote_code: bool,
                *, ckpt: CheckpointFiles) -> dict[str, Any]:
    from trnqwen.ckpt.spec import round_trip

    if model_config.data.get("model_type") == "qwen3_moe":
        return _round_trip_moe(model_config, report, trust_remote_code, ckpt)
    try:
        result = round_trip(
            str(model_config.path.parent),
            {k: (t.shape, t.dtype) for k, t in tensors.items()},
            trust_remote_code=trust_remote_code,
        )
    except (ValueError, KeyError, ImportError, OSError) as exc:  # e.g. a config class no AutoModel knows
        from trnqwen.errors import CheckFailed

        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise CheckFailed(
            f"--round-trip: transformers cannot build a model from {model_config.path}: {first[:300]}",
            hint="check config.json (model_type, architectures, auto_map) against the snapshot it was trained from",
        ) from None
    shape_bad = {m.key for m in report.mismatched if m.kind == "shape"}
    ours_missing = sorted(set(report.missing_keys) | set(report.expected_missing) | shape_bad)
    disagrees = []
    if sorted(result.missing_keys) != ours_missing:
        disagrees.append(f"missing {result.missing_keys} vs {ours_missing}")
    if sorted(result.unexpected_keys) != report.unexpected_keys:
        disagrees.append(f"unexpected {result.unexpected_keys} vs {report.unexpected_keys}")
    return {
        "model_class": result.model_class,
        "missing_keys": result.missing_keys,
        "unexpected_keys": result.unexpected_keys,
        "tied": result.tied,
        "disagrees": "; ".join(disagrees) or None,
    }


def _round_trip_moe(model_config: ModelConfig, report: VerifyReport, trust_remote_code: bool, ckpt: CheckpointFiles) -> dict[str, Any]:
    """Qwen3-MoE: transformers fuses the Hub's per-expert tensors on load, so the round trip is
    ``from_pretrained`` of the folder itself (meta device) plus the expert/router check; it agrees
    with the header check when both find the export clean or both find it broken.  A config.json
    from elsewhere (--assets) is put next to links to the checkpoint's files in a temp folder."""
    import tempfile

    from trnqwen.ckpt.spec import round_trip_pretrained

    folder = Path(model_config.path).parent
    with tempfile.TemporaryDirectory(prefix="trnqwen-roundtrip-") as tmp:
        if folder.resolve() != Path(ckpt.root).resolve():
            folder = Path(tmp)
            for f in [*ckpt.files, *([ckpt.index] if ckpt.index else []), Path(model_config.path)]:
                (folder / Path(f).name).symlink_to(Path(f).resolve())
        rt = round_trip_pretrained(str(folder), model_config.data, trust_remote_code=trust_remote_code)
    loaded_bad = [f"transformers refused it: {rt['error']}"] if rt["error"] else []
    for kind in ("missing_keys", "unexpected_keys", "mismatched_keys"):
        if rt[kind]:
            loaded_bad.append(f"{kind.replace('_', ' ')} {rt[kind][:3]}")
    loaded_bad += rt["problems"]
    headers_bad = bool(report.missing_keys or report.unexpected_keys or report.fatal_mismatches)
    rt["disagrees"] = None
    if loaded_bad and not headers_bad:
        rt["disagrees"] = "; ".join(loaded_bad)
    elif headers_bad and not loaded_bad:
        rt["disagrees"] = "from_pretrained loads it although the header check fails it"
    rt["loaded_problems"] = loaded_bad
    return rt


def record_scan(report: Any, found: dict) -> None:
    """A finished bit scan on a report (whole model or adapter): per-tensor non-finite counts."""
    report.scanned = True
    report.nonfinite = {k: v.total for k, v in sorted(found.items())}
    report.nonfinite_detail = {k: {"nan": v.nan, "inf": v.inf} for k, v in sorted(found.items())}


def _compare(
    tensors: dict[str, TensorInfo],
    where: dict[str, SafetensorsHeader],
    reference: CheckpointFiles,
    max_rel_change: float,
    progress,
) -> dict[str, Any]:
    from trnqwen.ckpt.scan import compare_tensors

    ref_headers, ref_errors = read_headers(reference.files)
    out: dict[str, Any] = {"reference": str(reference.root), "problems": []}
    if ref_errors:
        out["problems"] = [f"reference {n}: {e}" for n, e in ref_errors.items()]
        return out
    ref: dict[str, tuple[TensorInfo, SafetensorsHeader]] = {}
    for h in ref_headers.values():
        for name, info in h.tensors.items():
            ref[name] = (info, h)
    pairs, shape_mismatch = [], []
    for name in sorted(tensors, key=lambda n: (str(where[n].path), tensors[n].begin)):
        if name not in ref:
            continue
        a, (b, hb) = tensors[name], ref[name]
        if a.shape != b.shape:
            shape_mismatch.append(name)
            continue
        pairs.append((a, where[name], b, hb))
    cb = progress("comparing", sum(p[0].nbytes for p in pairs)) if progress else None
    changes = compare_tensors(pairs, cb)
    rel = {k: c.rel for k, c in changes.items()}
    finite = [v for v in rel.values() if v is not None]
    unchanged = sorted(k for k, c in changes.items() if not c.changed)
    exploded = sorted(k for k, v in rel.items() if v is None or v > max_rel_change)
    out.update(
        only_in_checkpoint=sorted(set(tensors) - set(ref)),
        only_in_reference=sorted(set(ref) - set(tensors)),
        shape_mismatch=shape_mismatch,
        rel_change=rel,
        compared=len(changes),
        unchanged=unchanged,
        exploded=exploded,
        max_rel_change=max(finite) if finite else None,
        median_rel_change=sorted(finite)[len(finite) // 2] if finite else None,
        threshold=max_rel_change,
    )
    if changes and len(unchanged) == len(changes):
        out["problems"].append(f"no tensor changed against {reference.root}: fine-tuning did not move the weights")
    if exploded:
        out["problems"].append(
            f"{len(exploded)} tensor(s) changed by more than {max_rel_change:g}x their reference norm (or became non-finite): {_few(exploded)}"
        )
    if shape_mismatch:
        out["problems"].append(f"{len(shape_mismatch)} tensor(s) have another shape than in the reference: {_few(shape_mismatch)}")
    return out
