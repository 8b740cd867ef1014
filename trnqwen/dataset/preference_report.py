"""``trnqwen data``'s human output on preference pairs: pairs kept and dropped, tokens by part, one pair."""

from __future__ import annotations

from typing import Any

from trnqwen.dataset.report import LAYOUTS, OPEN, CLOSE, print_mapping, sample_text, source_rows


def summary_rows(report: dict[str, Any]) -> list[tuple[str, str]]:
    reasons = report.get("dropped_reasons") or {}
    dropped = f"{report['dropped']:,}" + (f" ({'; '.join(f'{n} {r}' for r, n in reasons.items())})" if reasons else "")
    strategy = report.get("packing_strategy")
    layout = "one pair per row" if not report.get("packing", True) else f"pairs {LAYOUTS.get(strategy or '', 'packed')}"
    sequential = report.get("sequential_padding_fraction")
    return [
        ("format", report["format"]),
        ("records", f"{report['records']:,}"),
        ("pairs kept", f"{report['kept']:,} ({report['pairs']:,} train, {report['val_records']:,} validation)"),
        ("dropped", dropped),
        ("truncated", f"{report['truncated']:,} (prompt cut from the start)"),
        ("prompt tokens", f"{report['prompt_tokens']:,} (context, never trained)"),
        ("chosen tokens", f"{report['chosen_tokens']:,}"),
        ("rejected tokens", f"{report['rejected_tokens']:,}"),
        ("sequences", f"{report['sequences']:,} x {report.get('seq_len', '?')} tokens, {layout}"),
        ("padding", f"{report['padding_fraction']:.1%}" + (f" (sequential packing: {sequential:.1%})"
                                                            if sequential is not None else "")),
        *source_rows(report),
    ]


def print_pair_report(prepared, *, dataset: str | None = None) -> None:
    from rich.table import Table

    from trnqwen.output import console

    report = prepared.report
    out = console(stderr=False)
    table = Table(title=f"Preference pairs {report.get('source') or dataset or ''}".strip(), title_justify="left",
                  show_header=False)
    table.add_column("", style="bold")
    table.add_column("", overflow="fold")
    for name, value in summary_rows(report):
        table.add_row(name, value)
    table.add_row("cache", f"{prepared.cache_dir} ({'reused' if prepared.reused else 'written'})")
    out.print(table)
    for problem in report.get("problems", []):
        out.print(f"[yellow]note:[/yellow] {problem}", markup=True, highlight=False)
    for mapped in report.get("mapping") or []:
        print_mapping(out, mapped)
    markers = not out.is_terminal or out.no_color
    legend = f"compared text in {OPEN} {CLOSE}" if markers else "compared text highlighted"
    for side in ("chosen", "rejected"):
        out.print(f"\n{side.capitalize()} (first training pair; {legend}):")
        out.print(sample_text(report["sample"][side], markers=markers), markup=False, highlight=False, soft_wrap=True)
