"""``trnqwen data``'s human output: the numbers, the problems, one sample with its trained text.

On a terminal the trained spans are highlighted; piped (or with NO_COLOR) they are wrapped in
``[[ ]]`` so the mask stays visible in plain text.
"""

from __future__ import annotations

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


def summary_rows(report: dict[str, Any]) -> list[tuple[str, str]]:
    trained_share = report["trained_tokens"] / max(1, report["tokens"])
    reasons = report.get("dropped_reasons") or {}
    dropped = f"{report['dropped']:,}" + (f" ({'; '.join(f'{n} {r}' for r, n in reasons.items())})" if reasons else "")
    layout = "packed" if report.get("packing", True) else "one conversation per row"
    return [
        ("format", report["format"]),
        ("records", f"{report['records']:,}"),
        ("kept", f"{report['kept']:,}"),
        ("dropped", dropped),
        ("truncated", f"{report['truncated']:,}"),
        ("tokens", f"{report['tokens']:,}"),
        ("trained tokens", f"{report['trained_tokens']:,} ({trained_share:.1%} of tokens)"),
        ("sequences", f"{report['sequences']:,} x {report.get('seq_len', '?')} tokens, {layout}"),
        ("padding", f"{report['padding_fraction']:.1%}"),
        ("validation", f"{report['val_records']:,} record{'' if report['val_records'] == 1 else 's'}" if report["val_records"] else "none"),
    ]


def print_report(prepared, *, dataset: Optional[str] = None) -> None:
    from rich.table import Table

    from trnqwen.output import console

    report = prepared.report
    out = console(stderr=False)
    table = Table(title=f"Dataset {report.get('source') or dataset or ''}".strip(), title_justify="left", show_header=False)
    table.add_column("", style="bold")
    table.add_column("", overflow="fold")
    for name, value in summary_rows(report):
        table.add_row(name, value)
    table.add_row("cache", f"{prepared.cache_dir} ({'reused' if prepared.reused else 'written'})")
    out.print(table)
    for problem in report.get("problems", []):
        out.print(f"[yellow]note:[/yellow] {problem}", markup=True, highlight=False)
    markers = not out.is_terminal or out.no_color
    legend = f"trained text in {OPEN} {CLOSE}" if markers else "trained text highlighted"
    out.print(f"\nSample (first training record; {legend}):")
    out.print(sample_text(report["sample"], markers=markers), markup=False, highlight=False, soft_wrap=True)
