"""The held-out tokens eval scores: exactly the arrays training reads, never a re-tokenization.

Eval reads the tokenized dataset cache (:mod:`trnqwen.dataset.cache`) through ``open_split``:
the same input ids, the same already-shifted labels (-100 = not trained, so assistant-only for
chat data) and the same per-document positions (packing -> block-causal attention) the ranks
trained on.  A run's validation split is the default; ``--dataset`` goes through the same
pipeline the launcher uses, so its masks and packing are the training ones too.

Generation prompts come from the same rows: a document's last trained span is its last answer;
the tokens before it are the conversation up to its last user turn, already rendered with the
chat template and ending in the assistant header.  numpy only.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from trnqwen.errors import UsageError

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
    """Up to ``limit`` documents with a prompt and an answer, in row order (deterministic)."""
    import numpy as np

    found: list[Conversation] = []
    for row in range(len(data)):
        ids = np.asarray(data.input_ids[row])
        labels = np.asarray(data.labels[row])
        for start, end in documents(data.positions[row]):
            trained = np.flatnonzero(labels[start:end] != IGNORE_INDEX) + start
            if trained.size == 0:
                continue  # padding, or a conversation truncated before its first answer
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
