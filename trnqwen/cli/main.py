"""``trnqwen`` root: registration and the error edge, nothing else.

Examples:
  trnqwen check-env
  trnqwen fetch Qwen/Qwen3-4B-Instruct-2507
  trnqwen train --backend hf-v5 --finetune
  trnqwen verify-ckpt ./checkpoint_qwen3_4b_ft
  trnqwen inspect-logs --plot loss.png
"""

from __future__ import annotations

import os
import sys

import typer

from trnqwen import __version__
from trnqwen.cli import check_env, config_cmd, fetch, inspect_logs, train, verify_ckpt
from trnqwen.cli.app import make_app

app = make_app(
    name="trnqwen",
    help=(
        "Fine-tune Qwen3 with torchtitan on AWS Trainium: fetch weights, check the environment, "
        "train over torchrun, verify the exported checkpoint, judge the logs.\n\n"
        "Every run setting comes from one config: defaults < ./trnqwen.toml < TRNQWEN_* env < flags "
        "(see `trnqwen config show`). Set TRNQWEN_DEBUG=1 to see tracebacks."
    ),
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"trnqwen {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version."),
) -> None:
    """Root options."""


app.command("fetch", help=fetch.HELP, epilog=fetch.EPILOG)(fetch.fetch)
app.command("check-env", help=check_env.HELP, epilog=check_env.EPILOG)(check_env.check_env)
app.command("train", help=train.HELP, epilog=train.EPILOG)(train.train)
app.command("verify-ckpt", help=verify_ckpt.HELP, epilog=verify_ckpt.EPILOG)(verify_ckpt.verify_ckpt)
app.command("inspect-logs", help=inspect_logs.HELP, epilog=inspect_logs.EPILOG)(inspect_logs.inspect_logs)
app.add_typer(config_cmd.app, name="config")


def _debug() -> bool:
    return os.environ.get("TRNQWEN_DEBUG", "") not in ("", "0", "false", "no")


def report_error(message: str, hint: str | None, problems: list[str] | None = None) -> None:
    """One line per problem saying what is wrong, one saying what to do; secrets redacted."""
    from trnqwen.errors import redact

    for line in problems or [message]:
        sys.stderr.write(f"Error: {redact(line)}\n")
    if hint:
        sys.stderr.write(f"  -> {redact(hint)}\n")
    sys.stderr.flush()


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point: runs the app and maps errors to exit codes."""
    import click

    from trnqwen.errors import EXIT_SIGINT, TrnqwenError

    try:
        rv = app(args=argv, prog_name="trnqwen", standalone_mode=False)
    except TrnqwenError as exc:
        if _debug():
            raise
        report_error(exc.message, exc.hint, getattr(exc, "problems", None))
        sys.exit(exc.exit_code)
    except click.exceptions.Abort:
        sys.stderr.write("Interrupted.\n")
        sys.exit(EXIT_SIGINT)
    except KeyboardInterrupt:
        sys.stderr.write("Interrupted.\n")
        sys.exit(EXIT_SIGINT)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except BrokenPipeError:
        sys.exit(1)
    except Exception as exc:  # a bug: say so in one line, traceback only on request
        if _debug():
            raise
        report_error(
            f"internal error: {type(exc).__name__}: {exc}",
            "this is a trnqwen bug; rerun with TRNQWEN_DEBUG=1 for the traceback and report it",
        )
        sys.exit(70)
    sys.exit(rv if isinstance(rv, int) else 0)


if __name__ == "__main__":
    main()
