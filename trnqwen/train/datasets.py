"""Where the training tokens come from: ``--dataset`` resolved to something torchtitan can load.

Accepted: a local JSONL/JSON/Parquet/text file or a folder of them (a ``text`` field; or chat
``messages`` = one user/assistant pair per record, trained with torchtitan's ``ChatDataLoader``
where the installed torchtitan has it), a dataset torchtitan registers itself (``c4``,
``c4_validation``; ``c4_test`` only where its files exist), or a Hub dataset name (streamed,
``text`` field).  Resolution runs in the launcher process and checks what it can before any
rank starts; :func:`render_dataset_code` emits the matching lines of a generated config module.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from trnqwen.errors import UsageError

FORMATS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".txt": "text", ".text": "text", ".md": "text"}
TITAN_DATASETS = ("c4", "c4_validation", "c4_test")
DATASET_KEY = "trnqwen_data"  # name the generated module registers a local/Hub text source under
_HUB_NAME = re.compile(r"[A-Za-z0-9][\w.\-]*/[\w.\-]+")


@dataclass
class DataSpec:
    """kind: ``titan`` (a torchtitan-registered name), ``text`` (local or Hub, ``text`` field),
    or ``chat`` (local ``messages``)."""

    kind: str
    source: str  # what the user named, for messages
    titan_name: Optional[str] = None
    loader: Optional[str] = None  # datasets builder: json | parquet | text; None = Hub name
    data_files: list[str] = field(default_factory=list)
    hub_name: Optional[str] = None
    notes: list[str] = field(default_factory=list)

    @property
    def is_local(self) -> bool:
        return bool(self.data_files)


def default_dataset(model_is_builtin: bool) -> str:
    """The tiny model trains on its bundled corpus; real models on torchtitan's ``c4``."""
    if model_is_builtin:
        from trnqwen.fetch.builtin import corpus_path

        return str(corpus_path())  # plain text, documents separated by blank lines
    return "c4"


def resolve_dataset(dataset: Optional[str], *, model_is_builtin: bool, assets_dir: Optional[Path] = None, api=None) -> DataSpec:
    from trnqwen.train import compat

    api = api or compat.detect()
    name = dataset if dataset else default_dataset(model_is_builtin)
    path = Path(name).expanduser()
    if path.exists():
        return _resolve_local(path.resolve(), name, api=api, assets_dir=assets_dir)
    if name in TITAN_DATASETS:
        if name == "c4_test" and not api.c4_test_in_package:
            raise UsageError(
                "dataset 'c4_test' is not part of the installed torchtitan (it lives in torchtitan's "
                "source repository, not in the pip package)",
                hint="pass --dataset FILE.jsonl/FOLDER, a Hub dataset name, or c4",
            )
        spec = DataSpec(kind="titan", source=name, titan_name=name)
        if name != "c4_test":
            spec.notes.append(f"dataset {name} streams from the Hugging Face Hub (network needed at train time)")
        return spec
    if _looks_like_path(name):
        raise UsageError(
            f"dataset {name} does not exist",
            hint="pass an existing JSONL/Parquet/text file or folder, or a Hub dataset name like org/name",
        )
    if _HUB_NAME.fullmatch(name):
        spec = DataSpec(kind="text", source=name, hub_name=name)
        spec.notes.append(f"dataset {name} streams from the Hugging Face Hub (field 'text'; network needed)")
        return spec
    raise UsageError(
        f"dataset {name!r} is neither a local file/folder nor a Hub dataset name",
        hint="pass FILE.jsonl, FILE.parquet, FILE.txt, a folder of them, org/name, or c4",
    )


def _looks_like_path(name: str) -> bool:
    return name.startswith((".", "/", "~")) or Path(name).suffix.lower() in FORMATS or name.endswith("/")


def _resolve_local(path: Path, source: str, *, api, assets_dir: Optional[Path]) -> DataSpec:
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in FORMATS)
        if not files:
            raise UsageError(
                f"dataset folder {path} has no .jsonl/.json/.parquet/.txt files",
                hint="put the training data in that folder, or pass one file",
            )
    else:
        files = [path]
        if path.suffix.lower() not in FORMATS:
            raise UsageError(
                f"dataset {path}: unknown format {path.suffix or '(no extension)'}",
                hint="use .jsonl/.json (a 'text' or 'messages' field), .parquet, or .txt",
            )
    loaders = {FORMATS[p.suffix.lower()] for p in files}
    if len(loaders) > 1:
        raise UsageError(
            f"dataset folder {path} mixes formats ({', '.join(sorted(loaders))})",
            hint="keep one format per folder",
        )
    loader = loaders.pop()
    empty = [p for p in files if p.stat().st_size == 0]
    if empty:
        raise UsageError(f"dataset file {empty[0]} is empty", hint="point --dataset at data with records in it")
    data_files = [str(p) for p in files]
    if loader == "text":
        return DataSpec(kind="text", source=source, loader="text", data_files=data_files)
    columns, first = _peek(files[0], loader)
    if "text" in columns:
        return DataSpec(kind="text", source=source, loader=loader, data_files=data_files)
    if "messages" in columns:
        _check_chat(first, files[0], api=api, assets_dir=assets_dir)
        return DataSpec(kind="chat", source=source, loader=loader, data_files=data_files)
    raise UsageError(
        f"dataset {files[0]} has no 'text' or 'messages' field (found: {', '.join(sorted(columns)) or 'none'})",
        hint="each record needs {\"text\": ...} for pre-training style data, or "
        "{\"messages\": [{\"role\": \"user\", ...}, {\"role\": \"assistant\", ...}]} for chat SFT",
    )


def _peek(path: Path, loader: str) -> tuple[set[str], Optional[dict]]:
    """Column names and the first record (JSON) without loading the file."""
    if loader == "parquet":
        try:
            import pyarrow.parquet as pq

            schema = pq.read_schema(path)
        except Exception as exc:  # pyarrow raises several types for a bad file
            raise UsageError(f"dataset {path} is not a readable Parquet file: {exc}") from None
        return set(schema.names), None
    try:
        with path.open("r", encoding="utf-8") as fh:
            if path.suffix.lower() == ".jsonl":
                line = ""
                for line in fh:
                    if line.strip():
                        break
                record = json.loads(line) if line.strip() else None
            else:
                data = json.load(fh)
                record = data[0] if isinstance(data, list) and data else data
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UsageError(f"dataset {path} is not valid JSON lines: {exc}", hint="one JSON object per line") from None
    if not isinstance(record, dict):
        raise UsageError(f"dataset {path}: records must be JSON objects", hint="one JSON object per line")
    return set(record), record


def _check_chat(first: Optional[dict], path: Path, *, api, assets_dir: Optional[Path]) -> None:
    if not api.has_chat_dataloader:
        raise UsageError(
            f"dataset {path} is chat data ('messages'), which the installed torchtitan cannot train on",
            hint="convert the records to a 'text' field, or use torchtitan >= 0.3.0",
        )
    messages = (first or {}).get("messages")
    if first is not None:
        roles = [m.get("role") for m in messages] if isinstance(messages, list) else None
        if roles != ["user", "assistant"]:
            raise UsageError(
                f"dataset {path}: torchtitan's ChatDataLoader takes one user/assistant pair per record "
                f"(first record has roles {roles})",
                hint="split multi-turn conversations into single [user, assistant] pairs",
            )
    if assets_dir is not None and assets_dir.is_dir() and not _has_chat_template(assets_dir):
        raise UsageError(
            f"chat data needs a chat template, and the tokenizer in {assets_dir} has none",
            hint="use a model whose tokenizer_config.json has a chat_template, or 'text' records",
        )


def _has_chat_template(assets_dir: Path) -> bool:
    if (assets_dir / "chat_template.jinja").is_file() or (assets_dir / "chat_template.json").is_file():
        return True
    cfg = assets_dir / "tokenizer_config.json"
    try:
        return bool(json.loads(cfg.read_text()).get("chat_template"))
    except (OSError, json.JSONDecodeError):
        return False


# --- code generation ---------------------------------------------------------------------------


def render_dataset_code(spec: DataSpec) -> tuple[list[str], list[str], str]:
    """(import lines, module-level lines, expression for ``config.dataloader``) of a config module."""
    if spec.kind == "titan":
        return (
            ["from torchtitan.hf_datasets.text_datasets import HuggingFaceTextDataLoader"],
            [],
            f"HuggingFaceTextDataLoader.Config(dataset={spec.titan_name!r})",
        )
    if spec.kind == "chat":
        imports = ["from torchtitan.hf_datasets.text_datasets import ChatDataLoader"]
        body = [
            "def _messages(sample):",
            "    return sample[\"messages\"]",
        ]
        expr = (
            f"ChatDataLoader.Config(dataset_path={spec.loader!r}, "
            f"load_dataset_kwargs={{'data_files': DATA_FILES, 'split': 'train'}}, sample_processor=_messages)"
        )
        return imports, [f"DATA_FILES = {spec.data_files!r}", "", ""] + body, expr
    imports = [
        "from datasets import load_dataset",
        "from torchtitan.hf_datasets import DatasetConfig",
        "from torchtitan.hf_datasets.text_datasets import DATASETS, HuggingFaceTextDataLoader",
    ]
    if spec.hub_name:
        body = [
            "def _load(path):",
            "    return load_dataset(path, split=\"train\", streaming=True)",
        ]
        path_expr = repr(spec.hub_name)
        head: list[str] = []
    else:
        # Plain text: one document per blank-line-separated paragraph, not per line.
        extra = ', sample_by="paragraph"' if spec.loader == "text" else ""
        body = [
            "def _load(path):",
            f"    return load_dataset({spec.loader!r}, data_files=DATA_FILES, split=\"train\"{extra})",
        ]
        path_expr = repr(spec.source)
        head = [f"DATA_FILES = {spec.data_files!r}", "", ""]
    body += [
        "",
        "",
        "def _text(sample):",
        "    return sample[\"text\"]",
        "",
        "",
        "# torchtitan's own extension point for datasets: register under a name, select it by name.",
        f"DATASETS[{DATASET_KEY!r}] = DatasetConfig(path={path_expr}, loader=_load, sample_processor=_text)",
    ]
    return imports, head + body, f"HuggingFaceTextDataLoader.Config(dataset={DATASET_KEY!r})"
