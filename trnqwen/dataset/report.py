"""``trnqwen data``'s human output: the numbers, the problems, one sample with its trained text.

On a terminal the trained spans are highlighted; piped (or with NO_COLOR) they are wrapped in
``[[ ]]`` so the mask stays visible in plain text.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

TRAINED_STYLE = "bold black on green"
OPEN, CLOSE = "[[", "]]"


def sample_text(sample: dict[str, Any], *, markers: bool):
    """A rich Text of the sample; trained spans styled (and wrapped in markers if asked)."""
    from rich.text import Text

    text, out, cursor = sample["text"], Text(), 0
    for start, end in sample["trained_spans"]:
        out.append(text[cursor:start], style="dim")
        out.append((OPEN + text[start:end] + CLOSE) if markers else text[start:end], style=TRAINED_STYLE)
        cursor = end
    out.append(text[cursor:], style="dim")
    return out


KEY_SHOWN = 12  # the cache key's leading hex digits in the table (the whole key is in --json)


def _count(n: int, noun: str) -> str:
    """``1 record``, ``2 records``."""
    return f"{n:,} {noun}{'' if n == 1 else 's'}"


def _split_rows(stats: dict[str, Any], seq_len: Any, layout: str, sequential: Optional[float] = None) -> list[tuple[str, str]]:
    share = stats["trained_tokens"] / max(1, stats["tokens"])
    before = f" (sequential packing: {sequential:.1%})" if sequential is not None else ""
    return [
        ("  tokens", f"{stats['tokens']:,}"),
        ("  trained tokens", f"{stats['trained_tokens']:,} ({share:.1%} of tokens)"),
        ("  sequences", f"{stats['sequences']:,} x {seq_len} tokens, {layout}"),
        ("  padding", f"{stats['padding_fraction']:.1%}{before}"),
    ]


LAYOUTS = {"best-fit": "packed best-fit", "sequential": "packed in file order", "none": "one conversation per row"}


def source_rows(report: dict[str, Any]) -> list[tuple[str, str]]:
    """One row per dataset of a mixture: its training records, trained tokens and their share."""
    sources = report.get("sources") or []
    if len(sources) < 2:
        return []
    rows = [("sources", f"{len(sources)} datasets, share of the trained tokens")]
    for src in sources:
        asked = (f", weight {src['weight']:g}" if "weight" in src else
                 f", {src['requested_records']:,} records asked" if "requested_records" in src else "")
        rows.append((f"  {src['source']}", f"{src['share']:.1%}: {src['train_records']:,} records, "
                     f"{src['trained_tokens']:,} trained tokens ({src['format']}{asked})"))
    return rows


def summary_groups(report: dict[str, Any]) -> list[list[tuple[str, str]]]:
    """The table's rows in groups, each group one scope: every record read (both datasets),
    then the training split, then the validation split."""
    reasons = report.get("dropped_reasons") or {}
    dropped = f"{report['dropped']:,}" + (f" ({'; '.join(f'{n} {r}' for r, n in reasons.items())})" if reasons else "")
    layout = LAYOUTS.get(report.get("packing_strategy") or "", "packed") if report.get("packing", True) else LAYOUTS["none"]
    seq_len = report.get("seq_len", "?")
    n_val = int(report.get("val_records") or 0)
    n_train = int(report.get("train_records", report["kept"] - n_val))
    records = [
        ("format", report["format"] + (f", chat template {report['chat_template']}" if report.get("chat_template") else "")),
        ("records", f"{report['records']:,} read (all splits)"),
        ("kept", f"{report['kept']:,}: {n_train:,} training, {n_val:,} validation"
                 + (" (training: the mixture's choice)" if len(report.get("sources") or []) > 1 else "")),
        ("dropped", dropped),
        ("truncated", f"{report['truncated']:,}"),
    ]
    train = {k: report[k] for k in ("tokens", "trained_tokens", "sequences", "padding_fraction")}
    training = [("training split", _count(n_train, "record")),
                *_split_rows(train, seq_len, layout, report.get("sequential_padding_fraction"))]
    groups = [records, *([source_rows(report)] if source_rows(report) else []), training]
    if not n_val:
        groups.append([("validation split", "none")])
    elif "val_tokens" in report:
        val = {k: report[f"val_{k}"] for k in ("tokens", "trained_tokens", "sequences", "padding_fraction")}
        groups.append([("validation split", _count(n_val, "record")), *_split_rows(val, seq_len, layout)])
    else:  # a report written before the validation split's counts were kept
        groups.append([("validation split", f"{_count(n_val, 'record')}, {_count(report.get('val_sequences', 0), 'sequence')}")])
    return groups


def summary_rows(report: dict[str, Any]) -> list[tuple[str, str]]:
    return [row for group in summary_groups(report) for row in group]


def short_cache_dir(cache_dir: Path) -> str:
    """``~/.cache/trnqwen/datasets/256e157d1a2b…``: the folder with the key cut to KEY_SHOWN digits."""
    cache_dir = Path(cache_dir)
    parent = str(cache_dir.parent)
    home = str(Path.home())
    if parent == home or parent.startswith(home + "/"):
        parent = "~" + parent[len(home):]
    name = cache_dir.name
    return f"{parent}/{name[:KEY_SHOWN]}…" if len(name) > KEY_SHOWN + 4 else f"{parent}/{name}"


def print_report(prepared, *, dataset: Optional[str] = None) -> None:
    from rich.markup import escape
    from rich.table import Table

    from trnqwen.output import console

    report = prepared.report
    out = console(stderr=False)
    table = Table(title=f"Dataset {report.get('source') or dataset or ''}".strip(), title_justify="left", show_header=False)
    table.add_column("", style="bold")
    table.add_column("", overflow="fold")
    for group in summary_groups(report):
        for name, value in group:
            table.add_row(name, value)
        table.add_section()
    table.add_row("cache", f"{short_cache_dir(prepared.cache_dir)} ({'reused' if prepared.reused else 'written'})")
    out.print(table)
    for note in [*report.get("warnings", []), *report.get("problems", [])]:
        out.print(f"[yellow]note:[/yellow] {escape(note)}", markup=True, highlight=False)
    markers = not out.is_terminal or out.no_color
    legend = f"trained text in {OPEN} {CLOSE}" if markers else "trained text highlighted"
    for mapped in report.get("mapping") or []:
        print_mapping(out, mapped)
    out.print(f"\nSample (first training record; {legend}):")
    out.print(sample_text(report["sample"], markers=markers), markup=False, highlight=False, soft_wrap=True)


def print_mapping(out, mapped: dict[str, Any]) -> None:
    """A source's mapping and its first record before and after it."""
    import json

    out.print(f"\nMapping of {mapped['source']}:", markup=False, highlight=False)
    for line in mapped["applied"]:
        out.print(f"  {line}", markup=False, highlight=False)
    for when in ("before", "after"):
        text = json.dumps(mapped[when], ensure_ascii=False)
        out.print(f"  {when}: {text}", markup=False, highlight=False, soft_wrap=True)
