"""The held-out tokens eval scores: exactly the arrays training reads, never a re-tokenization.

Eval reads the tokenized dataset cache (:mod:`trnqwen.dataset.cache`) through ``open_split``:
the same input ids, the same already-shifted labels (-100 = not trained, so assistant-only for
chat data) and the same per-document positions (packing -> block-causal attention) the ranks
trained on.  A run's validation split is the default; ``--dataset`` goes through the same
pipeline the launcher uses, so its masks and packing are the training ones too.

Generation prompts come from the same rows: a document's last trained span is its last answer;
the tokens before it are the conversation up to its last user turn, already rendered with the
chat template and ending in the assistant header.  The cache of a method that trains on
preference pairs also carries each row's ``segments``: that method's ``eval_report`` scores its pairs;
the cache of a method that trains on prompts (GRPO) holds one prompt per row, which its
``eval_report`` has each model answer.  numpy only.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from trnqwen.errors import UsageError
from trnqwen.methods import registry as methods

if TYPE_CHECKING:
    from trnqwen.evaluate.targets import EvalTarget, RunInfo

IGNORE_INDEX = -100


@dataclass
class EvalData:
    """Token rows to score: int32 [N, S] arrays (memory-mapped) plus what they came from."""

    name: str  # shown as "dataset" in the report
    input_ids: Any
    labels: Any
    positions: Any
    pad_id: int
    source: Optional[Path] = None  # the cache folder
    # preference pairs (a cache of a method with ``data="preference"``): the split itself (its
    # rows, for the method's scorer), its ``segments`` (2 * slot + side per target, -1 elsewhere)
    # and the most pairs a row holds
    method: Optional[str] = None  # the training method the cache was made for (meta.json), when not SFT's
    split: Any = None
    segments: Any = None
    pairs_per_row: int = 0
    split_name: str = ""  # the cache split the rows are ("val", "train")
    tokenizer_dir: Optional[Path] = None  # the models' tokenizer (eval sets it): a method's scorer may decode with it
    trust_remote_code: bool = False  # the run's setting, for a scorer that loads that tokenizer

    @property
    def is_preference(self) -> bool:
        return self.segments is not None

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def seq_len(self) -> int:
        return int(self.input_ids.shape[1])

    @property
    def trained_tokens(self) -> int:
        import numpy as np

        return int(np.count_nonzero(np.asarray(self.labels) != IGNORE_INDEX))


@dataclass
class Conversation:
    """One held-out conversation cut at its last answer."""

    prompt_ids: list[int]  # everything before the answer, ending with the assistant header
    reference_ids: list[int]  # the answer as trained (its end-of-turn token included)


def is_cache_dir(path: Path) -> bool:
    from trnqwen.dataset.cache import META_FILE

    return (Path(path) / META_FILE).is_file()


def from_cache(cache_dir: Path, split: str, name: str) -> EvalData:
    """One split of a tokenized dataset cache."""
    from trnqwen.dataset.cache import open_split

    try:
        tokens = open_split(Path(cache_dir), split)
    except FileNotFoundError as exc:
        raise UsageError(f"{cache_dir} has no {split!r} split ({exc})", hint="pass --dataset D to evaluate on other data") from None
    except (OSError, ValueError) as exc:
        raise UsageError(f"cannot read the dataset cache {cache_dir}: {exc}", hint="re-run trnqwen data or the training") from None
    data = EvalData(
        name=name,
        input_ids=tokens.input_ids,
        labels=tokens.labels,
        positions=tokens.positions,
        pad_id=int(tokens.meta.get("pad_id", 0)),
        source=Path(cache_dir),
    )
    method = methods.find(tokens.meta.get("method"))
    if method is not None and method.data == "preference":  # scored pair by pair (the method's eval_report)
        from trnqwen.dataset.preference import SEGMENTS

        data.method = method.name
        data.split, data.segments = tokens, tokens.extra[SEGMENTS]
        data.pairs_per_row = int((tokens.meta.get("pairs_per_row") or {}).get(split, 1))
    elif method is not None and method.data == "prompts":  # prompts the models answer (the method's eval_report)
        data.method, data.split, data.split_name = method.name, tokens, split
    return require_trained_tokens(data)


def require_trained_tokens(data: EvalData) -> EvalData:
    if len(data) == 0 or data.trained_tokens == 0:
        raise UsageError(
            f"the dataset {data.name} has no trained tokens to score (every label is masked)",
            hint="eval scores the tokens training learns (assistant answers for chat data); pass a dataset with answers",
        )
    return data


def documents(positions_row) -> list[tuple[int, int]]:
    """[start, end) of each document in one row: a position 0 starts one."""
    import numpy as np

    starts = np.flatnonzero(np.asarray(positions_row) == 0).tolist()
    if not starts or starts[0] != 0:
        starts = [0, *starts]
    ends = starts[1:] + [len(positions_row)]
    return list(zip(starts, ends))


def held_out_conversations(data: EvalData, limit: int) -> list[Conversation]:
    """Up to ``limit`` documents with a prompt and an answer, in row order (deterministic); of a
    preference pair only the chosen side (its answer is the reference)."""
    import numpy as np

    found: list[Conversation] = []
    for row in range(len(data)):
        ids = np.asarray(data.input_ids[row])
        labels = np.asarray(data.labels[row])
        segments = np.asarray(data.segments[row]) if data.is_preference else None
        for start, end in documents(data.positions[row]):
            trained = np.flatnonzero(labels[start:end] != IGNORE_INDEX) + start
            if trained.size == 0:
                continue  # padding, or a conversation truncated before its first answer
            if segments is not None and (segments[trained] % 2).any():
                continue  # a preference pair's rejected answer: the chosen one is the reference
            # the last contiguous trained span is the last answer
            breaks = np.flatnonzero(np.diff(trained) != 1)
            first = int(trained[breaks[-1] + 1]) if breaks.size else int(trained[0])
            last = int(trained[-1])
            if first == start:
                continue  # trained from its first token (plain text, --train-on-inputs): no prompt
            found.append(
                Conversation(
                    prompt_ids=ids[start:first + 1].tolist(),  # input at `first` predicts the answer's first token
                    reference_ids=labels[first:last + 1].tolist(),
                )
            )
            if len(found) >= limit:
                return found
    return found


# --- where the rows come from ------------------------------------------------------------------


def eval_data(
    dataset: Optional[str], targets: list[EvalTarget], *, seq_len: Optional[int] = None, data_cache_dir: Optional[Path] = None
) -> EvalData:
    """``--dataset`` (a prepared cache, or any dataset through the training pipeline), else the
    validation split of the run the (first tuned) checkpoint came from."""
    run = next((t.run for t in targets if not t.is_base and t.run is not None), None) or next(
        (t.run for t in targets if t.run is not None), None
    )
    if dataset is not None:
        path = Path(dataset).expanduser()
        if path.is_dir() and is_cache_dir(path):
            from trnqwen.dataset.cache import has_split

            return from_cache(path, "val" if has_split(path, "val") else "train", name=dataset)
        settings = dict(run.record.config) if run is not None else {}
        settings.update(dataset=dataset, val_split=0.0, val_dataset=None)
        if seq_len or not settings.get("seq_len"):
            settings["seq_len"] = seq_len or 2048
        method = methods.of(settings)
        if method.data == "prompts" and method.prompts:  # the run's prompts: the method's own cache of them
            from types import SimpleNamespace

            root = data_cache_dir or settings.get("data_cache_dir")
            prepared = methods.load(method.prompts).prepare(SimpleNamespace(**settings), targets[0].tokenizer_dir,
                                                           Path(root) if root else None)
            return from_cache(prepared.cache_dir, "train", name=dataset)
        cache = _prepare(settings, targets[0].tokenizer_dir, data_cache_dir or settings.get("data_cache_dir"))
        return from_cache(cache, "train", name=dataset)
    if run is None:
        raise UsageError(
            "no evaluation data: the checkpoint came from no recorded run",
            hint="pass --dataset D (a JSONL/Parquet file, a folder, a Hub dataset or a prepared dataset cache)",
        )
    method = methods.find((run.record.config or {}).get("method"))
    if method is not None and method.data == "prompts" and not method.eval_report:
        raise UsageError(
            f"run {run.run_id} is a --method {method.name} run: its data is prompts the model answers, with no answers "
            "of their own to score, and trnqwen eval has no reward report for it yet",
            hint=f"measure held-out prompts with the run's reward ({method.docs}), or pass --dataset D of chat data to "
                 "compare the base's and the tuned model's loss on it",
        )
    cache = run_cache(run)
    from trnqwen.dataset.cache import has_split

    if cache is None or not has_split(cache, "val"):
        raise UsageError(
            f"run {run.run_id} has no validation split",
            hint="pass --dataset D, or train with --val-split 0.05 (or --val-dataset PATH)",
        )
    return from_cache(cache, "val", name=f"{run.run_id} validation split")


def run_cache(run: RunInfo) -> Optional[Path]:
    """The token cache a run trained on: recorded, else found again by its key from the run's
    own data settings (the same call the launcher made, so the same rows)."""
    if run.dataset_cache is not None:
        return run.dataset_cache
    config = dict(run.record.config or {})
    dataset = config.get("dataset")
    if not dataset or run.assets is None:
        return None
    cwd = Path(run.record.extra.get("cwd") or ".")
    path = Path(dataset).expanduser()
    if not path.is_absolute() and (cwd / path).exists():
        config["dataset"] = dataset = str(cwd / path)
    if Path(dataset).is_dir() and is_cache_dir(Path(dataset)):
        return Path(dataset)
    if config.get("val_dataset") and not Path(config["val_dataset"]).is_absolute():
        config["val_dataset"] = str(cwd / config["val_dataset"])
    if not (config.get("val_split") or config.get("val_dataset")):
        return None
    root = config.get("data_cache_dir")
    rebuilt = _prepare(config, run.assets, (cwd / root) if root and not Path(root).is_absolute() else root)
    recorded = run.record.extra.get("dataset_cache")
    if recorded and Path(recorded).name != rebuilt.name:  # the cache folder's name is its content key
        raise UsageError(
            f"the run's validation data changed since training: run {run.run_id} trained on token cache "
            f"{Path(recorded).name} (gone from {Path(recorded).parent}), its data now gives {rebuilt.name}",
            hint=f"score the current data anyway with --dataset {dataset}, or put the training data back as it was",
        )
    return rebuilt


def _prepare(settings: dict[str, Any], assets: Path, cache_root: Optional[Any]) -> Path:
    """trnqwen.dataset's pipeline (template, masks, packing as in training) -> the cache folder."""
    from types import SimpleNamespace

    from trnqwen.dataset.cache import default_cache_root
    from trnqwen.dataset.prepare import DataSettings, prepare

    return prepare(
        DataSettings.from_config(SimpleNamespace(**settings, data_kind=methods.of(settings).data)), Path(assets),
        Path(cache_root or default_cache_root())
    ).cache_dir
