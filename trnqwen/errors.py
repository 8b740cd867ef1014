"""One error type for the whole core, mapped to a message and exit code at the CLI edge.

Exit codes mean something:
  0  success
  1  the thing checked is bad (a failed check, a failed run)
  2  usage error: bad flag, bad config value, missing path
  3  environment error: a dependency or device is missing
  70  internal error (a trnqwen bug; unknown exceptions at the CLI edge)
  130/143  interrupted by SIGINT/SIGTERM (the ranks were stopped)
  138  preempted (SIGTERM/SIGUSR1) after saving a resumable checkpoint: requeue / --resume
  140  preempted (SIGTERM/SIGUSR1) before the first step: nothing trained; requeue / --resume
TRNQWEN_DEBUG=1 adds the traceback and never changes the code.
"""

from __future__ import annotations

import os
import re

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_ENVIRONMENT = 3
EXIT_INTERNAL = 70  # EX_SOFTWARE: a trnqwen bug (an exception no error type claims)
EXIT_SIGINT = 130
EXIT_SIGTERM = 143
# Preempted after saving a resumable checkpoint: 128 + SIGUSR1, the code Kubeflow's ExitCode
# restart policy reserves for user-defined retryable errors (a requeue / restart resumes).
EXIT_PREEMPTED = 138
# Preempted before the first step (start-up, Neuron compilation): nothing was trained, so nothing
# was lost; a scheduler should requeue it like 138 (the generated sbatch script does).  128 + 12
# keeps it in the 128-255 range Kubeflow's ExitCode policy retries.
EXIT_PREEMPTED_BEFORE_START = 140


class TrnqwenError(Exception):
    """A problem the user can act on: ``message`` says what, ``hint`` says what to do."""

    exit_code = EXIT_FAILED

    def __init__(self, message: str, *, hint: str | None = None, exit_code: int | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint
        if exit_code is not None:
            self.exit_code = exit_code


class UsageError(TrnqwenError):
    """Bad input from the user: a flag, a path, a config value."""

    exit_code = EXIT_USAGE


class ConfigError(UsageError):
    """The resolved run configuration is invalid; ``problems`` has one line per bad field."""

    def __init__(self, problems: list[str], *, hint: str | None = None):
        self.problems = problems
        super().__init__("; ".join(problems), hint=hint)


class EnvironmentProblem(TrnqwenError):
    """A package, tool or device trnqwen needs is missing or unusable."""

    exit_code = EXIT_ENVIRONMENT


class CheckFailed(TrnqwenError):
    """A check ran and found the subject bad (a checkpoint, a run)."""

    exit_code = EXIT_FAILED


# --- secrets -------------------------------------------------------------------------

SECRET_ENV_VARS = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HUGGINGFACE_TOKEN", "HF_API_TOKEN")
_TOKEN_PATTERN = re.compile(r"\bhf_[A-Za-z0-9]{8,}\b")


def secret_values(environ: dict[str, str] | None = None) -> list[str]:
    """The secret values present in the environment (never printed; used for redaction)."""
    env = os.environ if environ is None else environ
    return [env[name] for name in SECRET_ENV_VARS if env.get(name) and len(env[name]) >= 4]


def redact(text: str, environ: dict[str, str] | None = None) -> str:
    """Replace any token value (from the environment, or anything shaped like ``hf_...``)."""
    for value in secret_values(environ):
        text = text.replace(value, "***")
    return _TOKEN_PATTERN.sub("hf_***", text) if "hf_" in text else text  # a search per byte only where one can be


# Name words that always mean a secret, and words that mean one when the value looks like one.
_ALWAYS_SECRET_WORDS = {"PASSWORD", "PASSWD", "SECRET", "CREDENTIALS", "CREDENTIAL", "PRIVATE"}
_MAYBE_SECRET_WORDS = {"TOKEN", "KEY", "APIKEY", "AUTH"}
_NOT_SECRET_VALUES = {"", "0", "1", "true", "false", "yes", "no", "on", "off", "none", "null"}


def _secret_shaped(value: str) -> bool:
    """A value that could be a credential: long enough, one word, not a flag, number or path."""
    v = value.strip()
    if v.lower() in _NOT_SECRET_VALUES or len(v) < 8 or any(c.isspace() for c in v):
        return False
    if v.startswith(("/", "~", "./", "../")) or v.replace(".", "").replace("-", "").isdigit():
        return False
    return True


def is_secret_var(name: str, value: str) -> bool:
    """Whether an environment variable holds a secret: the known token variables; any name with a
    PASSWORD/SECRET/CREDENTIALS word; a ``*_TOKEN`` / ``*_KEY`` / ``*_AUTH`` name whose value is
    shaped like a credential; any value shaped like an HF token.  ``TOKENIZERS_PARALLELISM`` is
    none of these."""
    upper = name.upper()
    if upper in SECRET_ENV_VARS or _TOKEN_PATTERN.search(value or ""):
        return True
    words = set(re.split(r"[^A-Z0-9]+", upper))
    if words & _ALWAYS_SECRET_WORDS:
        return True
    return bool(words & _MAYBE_SECRET_WORDS) and _secret_shaped(value or "")


def redact_env(env: dict[str, str]) -> dict[str, str]:
    """A copy of an environment mapping safe to write into a run record: secrets become ``***``."""
    return {k: ("***" if is_secret_var(k, str(v)) else v) for k, v in env.items()}


def redact_argv(argv: "list[str] | tuple[str, ...]", environ: dict[str, str] | None = None) -> list[str]:
    """A command line safe to record or print: :func:`redact` on every word, and the value of any
    flag named like a secret (``--metrics.wandb_api_key V``, ``--job.token=V``; :func:`is_secret_var`
    on the flag's name) becomes ``***``."""
    out: list[str] = []
    secret_flag, flag_name = False, ""
    for arg in (str(a) for a in argv):
        if secret_flag and not arg.startswith("-") and is_secret_var(flag_name, arg):
            out.append("***")
            secret_flag = False
            continue
        secret_flag = False
        if arg.startswith("--"):
            name, eq, value = arg.partition("=")
            flag_name = name.lstrip("-")
            if eq and is_secret_var(flag_name, value):
                out.append(f"{name}=***")
                continue
            secret_flag = not eq
        out.append(redact(arg, environ))
    return out
