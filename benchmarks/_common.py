"""Helpers the benchmarks share: when a log line was written, and how busy the machine was."""

from __future__ import annotations

import os
import re
import time
from typing import Optional

# torchtitan's logger stamp ("2026-11-29 09:08:21,431"); trnqwen's hf-trainer lines use the same
_STAMP = re.compile(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3})")


def logged_at(text: str) -> Optional[float]:
    """The wall-clock time stamped on a log line, or None.  Seconds per step come from these
    stamps (taken inside the rank), not from when a line reached the benchmark: a relaying
    process or pipe buffering must not look like slower training."""
    m = _STAMP.search(text)
    if not m:
        return None
    return time.mktime(time.strptime(m.group(1), "%Y-%m-%d %H:%M:%S")) + int(m.group(2)) / 1000


def load_note(before: float, after: float) -> dict:
    """The measured "machine shared" note: 1-minute load average before and after, against the
    CPU count."""
    cpus = os.cpu_count() or 1
    busy = max(before, after) > cpus
    return {
        "load_avg_1m_before": round(before, 2),
        "load_avg_1m_after": round(after, 2),
        "cpus": cpus,
        "shared": busy,
        "note": (f"load average {before:.2f} -> {after:.2f} on {cpus} CPUs: "
                 + ("busy (more runnable tasks than CPUs): wall times include waiting for a core; compare ratios"
                    if busy else "quiet enough for absolute numbers")),
    }


def finish(summary: dict, *, load_before: float, json_out: bool, failed: bool) -> int:
    """A comparison benchmark's ending: the load note added, the one JSON summary line printed
    (``--json``, what run_all.py reads), exit 1 when a side failed."""
    import json

    summary.update(load_note(load_before, os.getloadavg()[0]))
    if json_out:
        print(json.dumps(summary))
    return 1 if failed else 0
