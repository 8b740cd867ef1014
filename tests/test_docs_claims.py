"""What the help and the docs say a command does is what it does (issue 34 item 10).

Each claim is checked against the code that decides it: the folder ``--merge`` writes, the
formats the data pipeline reads, what ``verify-ckpt`` runs by default, the stages the quickstart
runs.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import get_args

from trnqwen.config import BY_NAME, DatasetFormat

ROOT = Path(__file__).resolve().parents[1]


def test_merge_help_names_the_folder_merge_writes():
    from trnqwen.ckpt.merge import merged_path

    written = str(merged_path(Path("hf") / "step-N"))  # hf/step-N.merged
    assert written in BY_NAME["merge"].help
    assert written in (ROOT / "docs" / "config.md").read_text(encoding="utf-8")


def test_dataset_format_help_names_every_format_the_data_reads():
    from trnqwen.dataset.formats import FORMATS
    from trnqwen.dataset.preference_formats import PREFERENCE_FORMATS

    readable = {"auto", *FORMATS, *PREFERENCE_FORMATS}
    assert set(get_args(DatasetFormat)) == readable
    help_text = BY_NAME["dataset_format"].help
    assert all(fmt in help_text for fmt in readable), help_text


def _readme_lines(command: str) -> list[tuple[str, str]]:
    """(command line, its comment) for every README line that runs ``trnqwen <command>``."""
    out = []
    for line in (ROOT / "README.md").read_text(encoding="utf-8").splitlines():
        if line.startswith(f"trnqwen {command}"):
            cmd, _, comment = line.partition("#")
            out.append((cmd, comment))
    return out


def test_readme_says_what_verify_ckpt_runs_by_default():
    from trnqwen.cli import docgen

    cmd = next(c for name, c, _ctx in docgen.iter_commands() if name == "verify-ckpt")
    round_trip = next(p for p in cmd.params if p.name == "round_trip")
    assert round_trip.default is False  # the meta-device load is opt-in (it imports torch)
    lines = _readme_lines("verify-ckpt")
    assert lines
    for command, comment in lines:
        if "--round-trip" not in command:
            claims = re.sub(r"\(--round-trip[^)]*\)", "", comment)  # what the flag adds, said as such
            assert "round trip" not in claims, f"README: {command.strip()} does not run the round trip: {comment}"


def test_quickstart_help_and_getting_started_list_every_stage():
    from trnqwen.cli import docgen
    from trnqwen.quickstart.types import stage_groups, stage_names

    names = stage_names()
    assert len(names) == len(set(names))
    cmd = next(c for name, c, _ctx in docgen.iter_commands() if name == "quickstart")
    help_text = " ".join(cmd.epilog.split())  # what --help prints after the options (click wraps it)
    missing = [g for g in stage_groups() if g not in help_text]
    assert not missing, f"trnqwen quickstart --help does not name: {missing}"
    page = (ROOT / "docs" / "getting-started.md").read_text(encoding="utf-8")
    table = page[page.index("| stage | what happens |"):].split("\n\n")[0].splitlines()[2:]
    rows = [row.split("|")[1].strip() for row in table]
    assert rows == [g.partition(" (")[0] for g in stage_groups()]
