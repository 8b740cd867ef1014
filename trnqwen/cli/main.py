"""``trnqwen`` root: registration and the error edge, nothing else.

Examples:
  trnqwen check-env
  trnqwen fetch Qwen/Qwen3-4B-Instruct-2507
  trnqwen train --backend hf-v5 --finetune
  trnqwen verify-ckpt ./checkpoint_qwen3_4b_ft
  trnqwen eval --generate 3
  trnqwen inspect-logs --plot loss.png

Start-up is kept instant: this module imports neither typer nor any command module at load.
``trnqwen`` / ``trnqwen --help`` / ``trnqwen --version`` are answered from the registry below
(each command's one-line ``HELP`` is read from its module's source, not imported); anything
else builds the Typer app (:func:`build_app`, also reachable as ``trnqwen.cli.main.app``).

To add a command: append it to ``COMMANDS`` (or ``GROUPS`` for a sub-app) below.
"""

from __future__ import annotations

import os
import sys
from typing import Any, Callable, Optional

from trnqwen import __version__

ROOT_HELP = (
    "Fine-tune Qwen3 with torchtitan on AWS Trainium: fetch weights, check the environment, "
    "train over torchrun, verify the exported checkpoint, judge the logs.\n\n"
    "Every run setting comes from one config: defaults < ./trnqwen.toml < TRNQWEN_* env < flags "
    "(see `trnqwen config show`). Set TRNQWEN_DEBUG=1 to see tracebacks."
)

# name -> (module, attribute).  Commands are functions; each module has HELP and EPILOG.
COMMANDS: dict[str, tuple[str, str]] = {
    "fetch": ("trnqwen.cli.fetch", "fetch"),
    "check-env": ("trnqwen.cli.check_env", "check_env"),
    "data": ("trnqwen.cli.data", "data"),
    "train": ("trnqwen.cli.train", "train"),
    "verify-ckpt": ("trnqwen.cli.verify_ckpt", "verify_ckpt"),
    "eval": ("trnqwen.cli.eval", "eval_cmd"),
    "inspect-logs": ("trnqwen.cli.inspect_logs", "inspect_logs"),
    "quickstart": ("trnqwen.cli.quickstart", "quickstart"),
}
# name -> (module, attribute).  Groups are Typer sub-apps; each module has HELP.
GROUPS: dict[str, tuple[str, str]] = {
    "config": ("trnqwen.cli.config_cmd", "app"),
}
# Root options as (flags, help); the callback in build_app defines the same ones.
ROOT_OPTIONS: tuple[tuple[str, str], ...] = (
    ("--version", "Print the version."),
    ("-h, --help", "Show this message and exit."),
)

_APP: Any = None


def build_app(only: Optional[str] = None):
    """The Typer app (imports typer and the command modules).

    ``only`` registers just that command or group: ``trnqwen check-env ...`` then neither imports
    nor builds the others (Typer builds every parameter's validator up front).
    """
    global _APP
    if only is None and _APP is not None:
        return _APP
    import importlib

    import typer

    from trnqwen.cli.app import make_app

    app = make_app(name="trnqwen", help=ROOT_HELP)

    def _version(value: bool) -> None:
        if value:
            typer.echo(f"trnqwen {__version__}")
            raise typer.Exit()

    @app.callback()
    def _root(
        version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version."),
    ) -> None:
        """Root options."""

    for name, (module, attr) in COMMANDS.items():
        if only is None or name == only:
            mod = importlib.import_module(module)
            app.command(name, help=mod.HELP, epilog=getattr(mod, "EPILOG", None))(getattr(mod, attr))
    for name, (module, attr) in GROUPS.items():
        if only is None or name == only:
            app.add_typer(getattr(importlib.import_module(module), attr), name=name)
    if only is None:
        _APP = app
    return app


def __getattr__(name: str) -> Any:  # ``from trnqwen.cli.main import app`` still works, lazily
    if name == "app":
        return build_app()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# --- the fast path: root help without typer --------------------------------------------------


def _module_help(module: str) -> Optional[str]:
    """A module's ``HELP = "..."`` literal, read from its source without importing it."""
    import ast
    import importlib.util

    try:
        spec = importlib.util.find_spec(module)
        if spec is None or not spec.origin or not spec.origin.endswith(".py"):
            return None
        with open(spec.origin, encoding="utf-8") as fh:
            tree = ast.parse(fh.read(), filename=spec.origin)
    except (ImportError, OSError, SyntaxError, ValueError):
        return None
    for node in tree.body:
        target = None
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            target, value = node.target, node.value
        if isinstance(target, ast.Name) and target.id == "HELP":
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                return value.value
            return None
    return None


def command_summaries() -> Optional[list[tuple[str, str]]]:
    """(name, one-line help) of every command and group, or None if one cannot be read statically."""
    rows = []
    for name, (module, _attr) in {**COMMANDS, **GROUPS}.items():
        text = _module_help(module)
        if text is None:
            return None
        rows.append((name, " ".join(text.strip().splitlines()[0].split()) if text.strip() else ""))
    return rows


def _width() -> int:
    try:
        cols = int(os.environ.get("COLUMNS", "")) or os.get_terminal_size(sys.stdout.fileno()).columns
    except (ValueError, OSError, AttributeError):
        cols = 80
    return max(40, min(cols, 100))


def render_root_help() -> Optional[str]:
    """The root ``--help`` text (same content as Typer's), or None to fall back to Typer."""
    summaries = command_summaries()
    if summaries is None:
        return None
    import textwrap

    width = _width()
    out = ["Usage: trnqwen [OPTIONS] COMMAND [ARGS]...", ""]
    for para in ROOT_HELP.split("\n\n"):
        out += textwrap.wrap(
            para, width - 2, initial_indent="  ", subsequent_indent="  ", break_on_hyphens=False, break_long_words=False
        ) + [""]

    def section(title: str, rows: list[tuple[str, str]]) -> None:
        out.append(f"{title}:")
        col = max(len(k) for k, _ in rows) + 4
        for key, text in rows:
            lines = textwrap.wrap(text, max(20, width - col), break_on_hyphens=False, break_long_words=False) or [""]
            out.append(f"  {key.ljust(col - 2)}{lines[0]}")
            out.extend(" " * col + line for line in lines[1:])
        out.append("")

    section("Options", list(ROOT_OPTIONS))
    section("Commands", summaries)
    return "\n".join(out).rstrip() + "\n"


# --- the error edge ---------------------------------------------------------------------------


DEBUG_ON = ("1", "true", "yes")


def _debug() -> bool:
    """TRNQWEN_DEBUG=1/true/yes (any case) shows tracebacks; anything else (off, 0, no) does not."""
    return os.environ.get("TRNQWEN_DEBUG", "").strip().lower() in DEBUG_ON


def _print_traceback(exc: BaseException) -> None:
    """The traceback for TRNQWEN_DEBUG, redacted; the exit code stays the one without debugging."""
    import traceback

    from trnqwen.errors import redact

    sys.stderr.write(redact("".join(traceback.format_exception(exc))))
    sys.stderr.flush()


def report_error(message: str, hint: str | None, problems: list[str] | None = None) -> None:
    """One line per problem saying what is wrong, one saying what to do; secrets redacted."""
    from trnqwen.errors import redact

    for line in problems or [message]:
        sys.stderr.write(f"Error: {redact(line)}\n")
    if hint:
        sys.stderr.write(f"  -> {redact(hint)}\n")
    sys.stderr.flush()


def _os_error(exc: OSError) -> tuple[int, str, str]:
    """(exit code, message, hint) for an OSError that reached the edge."""
    import errno

    where = exc.filename if exc.filename is not None else ""
    if getattr(exc, "filename2", None):
        where = f"{where} -> {exc.filename2}"
    what = exc.strerror or str(exc)
    if exc.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", -1)):
        return 3, f"disk full: {what}" + (f": {where}" if where else ""), "free space there (df -h) and run again"
    if exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        return 3, f"cannot write {where or 'a file'}: {what}", "pick a writable folder (or fix its permissions/mount)"
    if exc.errno == errno.ELOOP:
        return 2, f"symlink loop: {where}", "fix or remove the symbolic link"
    return 2, f"{what}" + (f": {where}" if where else ""), "check the path"


def _exit_past_blocked_threads(code: int) -> None:
    """Ctrl-C must end the command now: worker threads still blocked in a network read (a
    stalled download's thread pool) would make a normal exit wait for them, possibly for ever.
    Downloads resume from their .incomplete files and every result file is written atomically."""
    import threading

    # (daemon or not: concurrent.futures joins its pool workers at exit either way)
    if any(t.is_alive() for t in threading.enumerate() if t is not threading.main_thread()):
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _trnqwen_error(exc) -> int:
    report_error(exc.message, exc.hint, getattr(exc, "problems", None))
    return exc.exit_code


def _interrupted(exc: BaseException) -> int:
    from trnqwen.errors import EXIT_SIGINT

    _ignore_further_interrupts()
    sys.stderr.write("Interrupted.\n")
    _exit_past_blocked_threads(EXIT_SIGINT)
    return EXIT_SIGINT


def _ignore_further_interrupts() -> None:
    """We are already exiting with 130: a second (or late-delivered) SIGINT during the exit must
    not raise a KeyboardInterrupt over the SystemExit, which makes Python kill itself with SIGINT
    (exit -2 to the parent) instead of exiting 130."""
    import signal
    import threading

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.SIG_IGN)


def _broken_pipe(exc: BaseException) -> int:
    return 1  # the reader went away (| head): nothing left to say


def _filesystem_error(exc: OSError) -> int:
    """A filesystem refusal nobody caught (read-only, full, a symlink loop): the path and the
    problem in one line instead of calling it a trnqwen bug."""
    code, message, hint = _os_error(exc)
    report_error(message, hint)
    return code


def _click_error(exc) -> int:
    """typer's vendored click errors (bad flag, missing argument, no args) print themselves."""
    if not hasattr(exc, "show"):
        return _internal_error(exc)
    exc.show()
    return getattr(exc, "exit_code", 2)


def _internal_error(exc: BaseException) -> int:
    report_error(
        f"internal error: {type(exc).__name__}: {exc}",
        "this is a trnqwen bug; rerun with TRNQWEN_DEBUG=1 for the traceback and report it",
    )
    return 70


def _error_table() -> list[tuple[type, Callable[[Any], int], bool]]:
    """The one map from error type to output and exit code: (type, handler, traceback shown under
    TRNQWEN_DEBUG=1).  The first matching row wins, so subclasses come before their bases."""
    from trnqwen.errors import TrnqwenError

    rows: list[tuple[type, Callable[[Any], int], bool]] = [
        (TrnqwenError, _trnqwen_error, True),
        (KeyboardInterrupt, _interrupted, False),
        (BrokenPipeError, _broken_pipe, False),
        (OSError, _filesystem_error, True),
    ]
    if "typer" in sys.modules:  # only when a command was built
        import typer

        rows += [(typer.Abort, _interrupted, False), (typer.TyperException, _click_error, False)]
    rows.append((Exception, _internal_error, True))
    return rows


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point: runs the app and maps errors to exit codes."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args in ([], ["--help"], ["-h"]):
        try:
            text = render_root_help()
        except Exception as exc:  # never let the fast path break help: Typer renders it instead
            if _debug():
                _print_traceback(exc)
            text = None
        if text is not None:
            sys.stdout.write(text)
            sys.stdout.flush()
            sys.exit(0 if args else 2)  # no arguments is a usage error, like a bare group in click
    if args == ["--version"]:
        sys.stdout.write(f"trnqwen {__version__}\n")
        sys.exit(0)

    from trnqwen.errors import EXIT_SIGINT

    try:
        # A known command first: build only that one; anything else (typos, root flags) gets all.
        app = build_app(args[0] if args and (args[0] in COMMANDS or args[0] in GROUPS) else None)
        rv = app(args=args, prog_name="trnqwen", standalone_mode=False)
    except (KeyboardInterrupt, Exception) as exc:
        handler, debug_shows = next((h, d) for kind, h, d in _error_table() if isinstance(exc, kind))
        if debug_shows and _debug():
            _print_traceback(exc)
        code = handler(exc)
        if code == EXIT_SIGINT:  # a run stopped by Ctrl-C (TrnqwenError 130) exits 130 too
            _ignore_further_interrupts()
        sys.exit(code)
    if rv == EXIT_SIGINT:  # typer turns Ctrl-C inside a command into a return value of 130
        _interrupted(KeyboardInterrupt())
    sys.exit(rv if isinstance(rv, int) else 0)


if __name__ == "__main__":
    main()
