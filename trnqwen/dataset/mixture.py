"""Several datasets in one run: each with its own format and mapping, mixed by weight or record count.

A run reads one dataset (``--dataset``, with the flat mapping settings) or several
(``[[datasets]]`` tables in trnqwen.toml, :class:`trnqwen.dataset.settings.DatasetEntry`).
Each is a :class:`Part`: its :class:`~trnqwen.dataset.sources.Source` (read through its own
mapping), its format, and how much of it is trained:

* ``weight``: every part has one, and the trained tokens are shared as the weights say (3:1 gives
  75% / 25% of the trained tokens).  The mix is the largest one in which no record repeats: the
  part with the fewest trained tokens per unit of weight is taken whole, the others are sampled
  down to their share (a seeded choice of records, the last one taken when it brings the share
  closer);
* ``records``: exactly that many records of the part (a seeded choice; a part with fewer
  records is repeated, each pass in a new seeded order);
* neither, on every part: every record of every part.

Validation comes from each part: its ``val_split`` (a fraction held out, seeded, before mixing;
or another split of the Hub dataset), ``--val-split`` for the parts that name none, or one
``--val-dataset`` for the whole run.  Validation records are never weighted.

The choice is seeded (``--seed``) and the parts, their mappings and weights are in the cache key,
so a resumed run reads the same mixture.  The report gives each part's records, tokens and share
of the trained tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Union

import numpy as np

from trnqwen.dataset.mapping import Mapping, mapping_from
from trnqwen.dataset.sources import Source, resolve_source
from trnqwen.dataset.template import ChatTemplate
from trnqwen.errors import UsageError

FORMAT_ALIASES = {"chat_template": "messages"}  # axolotl's type names -> trnqwen's formats


@dataclass
class Part:
    """One dataset of a run (see the module)."""

    source: Source
    format: Optional[str] = None  # forced; None = detected from its records
    weight: Optional[float] = None
    records: Optional[int] = None
    val_split: Union[float, str, None] = None  # a fraction held out, or a Hub split
    val_source: Optional[Source] = None  # that Hub split, resolved

    @property
    def name(self) -> str:
        return self.source.name


@dataclass
class Loaded:
    """Every part's units (examples or pairs) read, one list, and which part and split each is in."""

    units: list[Any]
    part_of: np.ndarray  # per unit: its part, or -1 for --val-dataset's (int16: a few bytes a unit, for large data)
    train_idx: np.ndarray
    val_idx: np.ndarray
    formats: list[str]  # per part
    records: int  # every record read (training and validation)
    read: list[int] = field(default_factory=list)  # per part: records read

    @property
    def format(self) -> str:
        distinct = list(dict.fromkeys(self.formats))
        return distinct[0] if len(distinct) == 1 else "mixed: " + ", ".join(distinct)


def resolve_parts(dataset: Optional[str], datasets: list[dict[str, Any]], *, split: str, fmt: Optional[str],
                  mapping: dict[str, Any]) -> list[Part]:
    """The run's parts: ``datasets`` (each ``[[datasets]]`` table) or the one ``dataset`` read through
    the flat ``mapping`` settings; ``split`` and ``fmt``: --dataset-split and --dataset-format."""
    entries = list(datasets or [])
    flat = dict(mapping or {})
    if not entries:
        source = resolve_source(dataset, split=split, mapping=mapping_from(flat))
        return [Part(source, format=_format(fmt))]
    if dataset:
        raise UsageError(
            f"--dataset {dataset} and [[datasets]] tables both name the data",
            hint="drop --dataset (or TRNQWEN_DATASET) to train on the [[datasets]] mixture, or remove the tables",
        )
    if flat:
        raise UsageError(
            f"{', '.join(sorted(flat))} set for the whole run, with [[datasets]] tables",
            hint="put each dataset's mapping keys in its own [[datasets]] table",
        )
    weighted = [e for e in entries if e.get("weight") is not None]
    counted = [e for e in entries if e.get("records") is not None]
    if weighted and counted:
        raise UsageError("[[datasets]] mixes weights and record counts",
                         hint="give every dataset a weight, or every dataset a record count")
    for sized in (weighted, counted):
        if sized and len(sized) < len(entries):
            missing = next(e["path"] for e in entries if e not in sized)
            what = "weight" if sized is weighted else "records"
            raise UsageError(f"[[datasets]]: {missing} has no {what}, the others do",
                             hint=f"give every dataset a {what} (or none)")
    parts = [_part(entry, split, fmt) for entry in entries]
    check_kinds([(part.name, part.format) for part in parts])  # declared types: refused before anything is read
    return parts


def check_kinds(formats: list[tuple[str, Optional[str]]]) -> None:
    """Text records (every token trained) and conversations (only the answers) are not mixed in
    one run: refused, naming one dataset of each (``formats``: (name, format or None) per dataset)."""
    text = next((name for name, fmt in formats if fmt == "text"), None)
    chat = next(((name, fmt) for name, fmt in formats if fmt not in (None, "text")), None)
    if text is None or chat is None:
        return
    raise UsageError(
        f"the datasets mix text records ({text}: every token trained) and conversations ({chat[0]}, {chat[1]}: "
        "only the answers trained), which one run does not train together",
        hint="train them in separate runs (continued pre-training first, then the chat fine-tune), "
        "or write the text as prompt/completion records",
    )


def _part(entry: dict[str, Any], split: str, fmt: Optional[str]) -> Part:
    mapping: Optional[Mapping] = mapping_from(entry)
    source = resolve_source(entry["path"], split=entry.get("split") or split, mapping=mapping)
    val = entry.get("val_split")
    val_source = None
    if isinstance(val, str):
        if not source.hub_name:
            raise UsageError(f"[[datasets]] {entry['path']}: val_split = {val!r} names a Hub split, and this is a local dataset",
                             hint="give a fraction (val_split = 0.05), or a Hub dataset")
        val_source = resolve_source(entry["path"], split=val, mapping=mapping)
    return Part(source, format=_format(entry.get("type") or fmt, entry["path"]), weight=entry.get("weight"), records=entry.get("records"), val_split=val,
                val_source=val_source)


def _format(name: Optional[str], where: str = "") -> Optional[str]:
    from trnqwen.dataset.formats import FORMATS
    from trnqwen.dataset.preference_formats import PREFERENCE_FORMATS

    if name in (None, "auto"):
        return None
    fmt = FORMAT_ALIASES.get(name, name)
    if fmt not in (*FORMATS, *PREFERENCE_FORMATS):
        known = ", ".join(("auto", *FORMATS, *PREFERENCE_FORMATS, *FORMAT_ALIASES))
        raise UsageError(f"[[datasets]] {where}: unknown type {name!r}", hint=f"one of: {known}")
    return fmt


Alloc = Callable[[type, int], np.ndarray]  # (dtype, length) -> an array to fill (bestfit.Alloc: a scratch file's map)
_STEP = 1 << 20  # indices handled a slice at a time where per-unit arrays are memory maps


def hold_out(n: int, fraction: float, seed: int, name: str = "", alloc: Optional[Alloc] = None) -> tuple[np.ndarray, np.ndarray]:
    """(training, validation) indices of ``n`` records with ``fraction`` held out (seeded, sorted).
    ``alloc``: the same indices, int32 where ``n`` allows, in its arrays, filled a slice at a time
    (bounded preparation: memory maps; the permutation is ``rng.shuffle`` of an ``arange`` of that
    dtype, as ``permutation(n)`` is of an int64 one: the same draws, the same order)."""
    if not fraction:
        return (np.arange(n), np.arange(0)) if alloc is None else (_arange(n, alloc), np.arange(0))
    n_val = max(1, round(n * fraction))
    if n_val >= n:
        raise UsageError(
            f"--val-split {fraction} leaves no training records out of {n}" + (f" in {name}" if name else ""),
            hint="use a smaller --val-split or more data",
        )
    if alloc is None:
        order = np.random.default_rng(seed).permutation(n)
        return np.sort(order[n_val:]), np.sort(order[:n_val])
    order = _arange(n, alloc)
    np.random.default_rng(seed).shuffle(np.asarray(order))  # (a plain view: shuffle's fast path, in place)
    held = alloc(bool, n)
    held[:] = False
    for lo in range(0, n_val, _STEP):
        held[order[lo:min(lo + _STEP, n_val)]] = True
    del order
    # sorted(order[n_val:]) and sorted(order[:n_val]): the units left out of, and in, the held-out set, in order
    return _where(held, False, n - n_val, alloc), _where(held, True, n_val, alloc)


def _dtype(n: int) -> type:
    return np.int32 if n < 2**31 else np.int64


def _arange(n: int, alloc: Alloc, start: int = 0) -> np.ndarray:
    out = alloc(_dtype(start + n), n)
    for lo in range(0, n, _STEP):
        out[lo:lo + _STEP] = np.arange(start + lo, start + min(n, lo + _STEP))
    return out


def _where(mask: np.ndarray, value: bool, count: int, alloc: Alloc) -> np.ndarray:
    """``np.flatnonzero(mask == value)`` (``count`` of them) into ``alloc``'s array, a slice at a time."""
    out, at = alloc(_dtype(len(mask)), count), 0
    for lo in range(0, len(mask), _STEP):
        found = np.flatnonzero(mask[lo:lo + _STEP] == value) + lo
        out[at:at + len(found)] = found
        at += len(found)
    return out


def take_kept(indices: np.ndarray, kept: np.ndarray, alloc: Optional[Alloc] = None) -> np.ndarray:
    """``indices[kept[indices]]``; with ``alloc``, into its array, a slice at a time."""
    return _filtered(indices, lambda piece: kept[piece], _dtype(len(kept)), alloc)


def _filtered(units: np.ndarray, test: Callable[[np.ndarray], np.ndarray], dtype: type,
              alloc: Optional[Alloc]) -> np.ndarray:
    """``units[test(units)]`` (``test``: a boolean mask of the units it is given); with ``alloc``,
    into its array of ``dtype``, a slice at a time (counted first, then filled)."""
    if alloc is None:
        return units[test(units)]
    count = sum(int(np.count_nonzero(test(np.asarray(units[lo:lo + _STEP])))) for lo in range(0, len(units), _STEP))
    out, at = alloc(dtype, count), 0
    for lo in range(0, len(units), _STEP):
        piece = np.asarray(units[lo:lo + _STEP])
        found = piece[test(piece)]
        out[at:at + len(found)] = found
        at += len(found)
    return out


def sum_at(values: np.ndarray, indices: np.ndarray) -> int:
    """``values[indices].sum()`` (integers), a slice of ``indices`` at a time: no whole-set temporary."""
    return sum(int(values[indices[lo:lo + _STEP]].sum()) for lo in range(0, len(indices), _STEP))


def first_of_part(part_of: np.ndarray, part: int) -> int:
    """``np.argmax(part_of == part)``: the first unit of ``part``, a slice at a time."""
    for lo in range(0, len(part_of), _STEP):
        found = np.flatnonzero(part_of[lo:lo + _STEP] == part)
        if len(found):
            return lo + int(found[0])
    return 0


# (units, format, records read); units: a list, or how many there are when the caller keeps them
# itself (bounded-memory preparation keeps its documents on disk: trnqwen.dataset.bounded)
Reader = Callable[[Source, Optional[str]], tuple[Union[list[Any], int], str, int]]


def _add(units: list[Any], got: Union[list[Any], int]) -> int:
    """Keep ``got`` (a list of units) in ``units``; how many it is (a count is only counted)."""
    if isinstance(got, int):
        return got
    units += got
    return len(got)


def load_parts(parts: list[Part], val_source: Optional[Source], read: Reader, *, forced: Optional[str],
               val_split: float, seed: int, alloc: Optional[Alloc] = None) -> Loaded:
    """Read every part with ``read`` (records -> units, format, count) and split each into training
    and validation units (the module's rule).  ``alloc``: where the per-unit arrays go (memory maps
    in bounded preparation, filled a slice at a time; the same values)."""
    units: list[Any] = []
    total = 0  # units so far (kept in ``units``, or by the caller)
    part_of: list[np.ndarray] = []
    train: list[np.ndarray] = []
    val: list[np.ndarray] = []
    formats, read_counts = [], []
    for i, part in enumerate(parts):
        got, fmt, n_read = read(part.source, part.format or forced)
        check_kinds([(p.name, f) for p, f in zip(parts, formats)] + [(part.name, fmt)])  # before the next is read
        base = total
        n_got = _add(units, got)
        total += n_got
        formats.append(fmt)
        part_of.append(_full(n_got, i, alloc))
        if part.val_source is not None:
            held, _, n_held = read(part.val_source, fmt)
            n_val = _add(units, held)
            total += n_val
            n_read += n_held
            part_of.append(_full(n_val, i, alloc))
            train.append(base + np.arange(n_got) if alloc is None else _arange(n_got, alloc, base))
            val.append(base + n_got + np.arange(n_val) if alloc is None else _arange(n_val, alloc, base + n_got))
        else:
            fraction = part.val_split if isinstance(part.val_split, float) else (0.0 if val_source else val_split)
            t, v = hold_out(n_got, fraction, seed, part.name if len(parts) > 1 else "", alloc)
            train.append(_shifted(t, base, alloc))  # (no copy of the first part's: large data is one part)
            val.append(_shifted(v, base, alloc))
        read_counts.append(n_read)
    if val_source is not None:
        held, _, n_held = read(val_source, formats[0])
        n_val = _add(units, held)
        val.append(total + np.arange(n_val) if alloc is None else _arange(n_val, alloc, total))
        part_of.append(_full(n_val, -1, alloc))
        total += n_val
        read_counts.append(n_held)
    return Loaded(units=units, part_of=_joined(part_of, alloc), train_idx=_joined(train, alloc),
                  val_idx=_joined(val, alloc), formats=formats, records=sum(read_counts), read=read_counts)


def _full(n: int, part: int, alloc: Optional[Alloc]) -> np.ndarray:
    if alloc is None:
        return np.full(n, part, dtype=np.int16)
    out = alloc(np.int16, n)
    out[:] = part
    return out


def _shifted(indices: np.ndarray, base: int, alloc: Optional[Alloc]) -> np.ndarray:
    """``base + indices`` (``indices`` itself when ``base`` is 0); with ``alloc``, a slice at a time."""
    if not base:
        return indices
    if alloc is None:
        return base + indices
    out = alloc(_dtype(base + len(indices)), len(indices))
    for lo in range(0, len(indices), _STEP):
        out[lo:lo + _STEP] = indices[lo:lo + _STEP].astype(out.dtype) + base
    return out


def _joined(arrays: list[np.ndarray], alloc: Optional[Alloc] = None) -> np.ndarray:
    """``np.concatenate(arrays)``, without its copy when there is one array (per unit: 8 bytes less);
    with ``alloc``, into its array, a slice at a time."""
    if len(arrays) == 1 or alloc is None:
        return arrays[0] if len(arrays) == 1 else np.concatenate(arrays)
    dtype = np.result_type(*arrays)
    out, at = alloc(dtype, sum(len(a) for a in arrays)), 0
    for array in arrays:
        for lo in range(0, len(array), _STEP):
            piece = array[lo:lo + _STEP]
            out[at:at + len(piece)] = piece
            at += len(piece)
    return out


def select(parts: list[Part], loaded: Loaded, kept: np.ndarray, trained: np.ndarray, seed: int,
           alloc: Optional[Alloc] = None) -> np.ndarray:
    """The training units to pack (indices into ``loaded.units``, a unit repeated where a record
    count asks for more than a part has): ``kept`` are the training units left after fitting,
    ``trained[u]`` each unit's trained tokens.  Parts in order, each part's units in their order.
    With ``alloc`` (bounded preparation) every per-unit array is one of its arrays, filled a slice
    at a time, the seeded orders shuffled in place there: the same draws, the same choice."""
    chosen = []
    for i, part in enumerate(parts):
        # one part: every training unit is its own (no whole-set mask and copy to find them)
        mine = kept if len(parts) == 1 else _filtered(kept, lambda piece: loaded.part_of[piece] == i, kept.dtype, alloc)
        if part.records is not None:
            chosen.append(_count(mine, part.records, _rng(seed, i), alloc))
        else:
            chosen.append(mine)
    if parts and parts[0].weight is not None:
        totals = [float(sum_at(trained, c)) for c in chosen]
        if not all(totals):
            empty = parts[totals.index(0.0)].name
            raise UsageError(f"dataset {empty} has no trained tokens left to mix", hint="check it with `trnqwen data`")
        scale = min(total / part.weight for total, part in zip(totals, parts))
        chosen = [_down_to(c, scale * part.weight, trained, _rng(seed, i), alloc)
                  for i, (c, part) in enumerate(zip(chosen, parts))]
    return _joined(chosen, alloc) if chosen else np.arange(0)


def _rng(seed: int, part: int) -> np.random.Generator:
    return np.random.default_rng([seed, part])


def _shuffled(units: np.ndarray, rng: np.random.Generator, alloc: Optional[Alloc]) -> np.ndarray:
    """``rng.permutation(units)``: with ``alloc``, a copy in its array shuffled in place (the same draws)."""
    return rng.permutation(units) if alloc is None else _shuffle_into(units, rng, alloc(units.dtype, len(units)))


def _shuffle_into(units: np.ndarray, rng: np.random.Generator, out: np.ndarray) -> np.ndarray:
    """``units`` copied into ``out`` a slice at a time and shuffled there: ``rng.permutation(units)``'s draws."""
    for lo in range(0, len(units), _STEP):
        out[lo:lo + _STEP] = units[lo:lo + _STEP]
    rng.shuffle(out)
    return out


def _count(units: np.ndarray, n: int, rng: np.random.Generator, alloc: Optional[Alloc] = None) -> np.ndarray:
    """``n`` of ``units``: a seeded choice, passes in new seeded orders when there are fewer."""
    if not len(units):
        return units
    passes = -(-n // len(units))
    if alloc is None:
        return np.sort(np.concatenate([rng.permutation(units) for _ in range(passes)])[:n])
    out = alloc(units.dtype, passes * len(units))  # each pass shuffled in place in its slice
    for p in range(passes):
        _shuffle_into(units, rng, out[p * len(units):(p + 1) * len(units)])
    out = out[:n]
    out.sort()
    return out


def _down_to(units: np.ndarray, target: float, trained: np.ndarray, rng: np.random.Generator,
             alloc: Optional[Alloc] = None) -> np.ndarray:
    """A seeded choice of ``units`` whose trained tokens come closest to ``target`` (all of them when short)."""
    if float(sum_at(trained, units)) <= target + 0.5:
        return units
    order = _shuffled(units, rng, alloc)
    # the first k+1 reach the target: k = searchsorted(cumsum(trained[order]), target), a slice at a time
    k, reached, before, total = len(order), 0, 0, 0
    for lo in range(0, len(order), _STEP):
        cumulative = np.cumsum(trained[order[lo:lo + _STEP]], dtype=np.int64) + total
        j = int(np.searchsorted(cumulative, target))
        if j < len(cumulative):
            k, reached, before = lo + j, int(cumulative[j]), int(cumulative[j - 1]) if j else total
            break
        total = int(cumulative[-1])
    if k < len(order) and (k == 0 or reached - target < target - before):
        k += 1
    out = order[:max(k, 1)]
    out.sort()  # (order is this function's own array)
    return out


def part_report(parts: list[Part], loaded: Loaded, chosen: np.ndarray, tokens: np.ndarray,
                trained: np.ndarray) -> list[dict[str, Any]]:
    """Per part: records read, training records, tokens, trained tokens and share of the trained tokens."""
    total = float(sum_at(trained, chosen)) or 1.0
    out = []
    for i, part in enumerate(parts):
        count, part_tokens, part_trained = 0, 0, 0
        for lo in range(0, len(chosen), _STEP):  # a slice at a time: no whole-set temporaries
            piece = np.asarray(chosen[lo:lo + _STEP])
            mine = piece if len(parts) == 1 else piece[loaded.part_of[piece] == i]  # (training units: every one is part 0's)
            count, part_tokens, part_trained = (count + len(mine), part_tokens + int(tokens[mine].sum()),
                                                part_trained + int(trained[mine].sum()))
        entry: dict[str, Any] = {
            "source": part.name,
            "format": loaded.formats[i],
            "records": int(loaded.read[i]),
            "train_records": count,
            "tokens": part_tokens,
            "trained_tokens": part_trained,
            "share": round(float(part_trained) / total, 4),
        }
        if part.weight is not None:
            entry["weight"] = part.weight
        if part.records is not None:
            entry["requested_records"] = part.records
        if part.source.mapping is not None:
            entry["mapping"] = part.source.mapping.describe()
        out.append(entry)
    return out


def report(parts: list[Part], loaded: Loaded, train_units: np.ndarray, tokens: np.ndarray, trained: np.ndarray, *,
           packing: bool, strategy: str, seq_len: int, template: Optional[ChatTemplate]) -> dict[str, Any]:
    """The data report's keys on the sources (each one's share of the trained tokens), their mappings,
    the packing (and the padding sequential packing would leave) and the chat template.
    ``tokens[u]``: a unit's tokens (a pair's: both sides)."""
    from trnqwen.dataset.bestfit import next_fit_count

    sequential = None
    if packing and strategy != "sequential":
        # bestfit.padding_fraction of the chosen units' lengths, read a slice at a time
        n_rows = next_fit_count(tokens, seq_len, train_units)
        sequential = round(1.0 - float(sum_at(tokens, train_units)) / max(1, n_rows * seq_len), 4)
    return {
        "sources": part_report(parts, loaded, train_units, tokens, trained),
        "mapping": [_mapping_sample(part.source) for part in parts if part.source.mapping is not None],
        "packing_strategy": strategy if packing else "none",
        "sequential_padding_fraction": sequential,
        "chat_template": template.name if template else None,
    }


def _mapping_sample(source: Source) -> dict[str, Any]:
    """A source's mapping, and its first record before and after it (long strings cut for the report)."""
    before = source.first_raw
    after = source.mapping.apply(before, source.name) if before is not None else None
    return {"source": source.name, "applied": source.mapping.describe(), "before": _short(before), "after": _short(after)}


def _short(value: object, limit: int = 300) -> object:
    if isinstance(value, str):
        return value if len(value) <= limit else value[:limit] + "…"
    if isinstance(value, dict):
        return {k: _short(v, limit) for k, v in value.items()}
    if isinstance(value, list):
        return [_short(v, limit) for v in value]
    return value
