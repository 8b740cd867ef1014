"""``trnqwen config``: see the one config every command resolves.

Examples:
  trnqwen config show
  trnqwen config show --json
  TRNQWEN_STEPS=20 trnqwen config show --backend native
"""

from __future__ import annotations

from trnqwen.cli._options import BackendOpt, ConfigFileOpt, JsonOpt, ModelOpt, StepsOpt, given
from trnqwen.cli.app import keep_examples, make_app

HELP = "Show the resolved run configuration and where each value came from."
app = make_app(help=HELP)


SHOW_EPILOG = """\
Examples:

  trnqwen config show --json
  TRNQWEN_STEPS=20 trnqwen config show --backend native
"""


@app.command("show", epilog=keep_examples(SHOW_EPILOG))
def show(
    config_file: ConfigFileOpt = None,
    model: ModelOpt = None,
    backend: BackendOpt = None,
    steps: StepsOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Print every field with its value and source (default, file, env or flag)."""
    from trnqwen import output
    from trnqwen.config import resolve_config

    resolved = resolve_config(given(model=model, backend=backend, steps=steps), config_file=config_file)
    for w in resolved.warnings:
        output.warn(w)
    if json_out:
        output.print_json(
            {
                "config": resolved.as_dict(),
                "sources": {row["field"]: row["source"] for row in resolved.describe()},
                "derived": {r["field"]: r["value"] for r in resolved.describe() if r["source"] == "derived"},
                "config_file": str(resolved.config_file) if resolved.config_file else None,
                "warnings": resolved.warnings,
            }
        )
        return
    output.table(
        f"trnqwen config ({resolved.config_file or 'no trnqwen.toml'})",
        ["field", "value", "source"],
        [(r["field"], r["value"], r["source"]) for r in resolved.describe()],
    )
