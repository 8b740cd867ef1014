"""``trnqwen push``: an export (a whole model folder or a PEFT LoRA adapter) to a Hub model repo.

1. what to push: RUN|FOLDER resolved as ``trnqwen eval`` resolves a CHECKPOINT
   (:func:`trnqwen.evaluate.targets.resolve_target`: a run id, a run directory, a checkpoint
   folder, an export folder; none: the last run's export);
2. only what verify-ckpt passes: its checks run on the folder first (every value scanned, an
   adapter against its base and loaded by peft), and an untrained adapter (every ``lora_B`` zero:
   it would publish the base unchanged) or a model folder without its config.json is refused;
3. the repo id, the token and offline mode are checked before anything is sent (``train
   --push-to-hub`` checks them before the run starts: :func:`check_ready`);
4. huggingface_hub uploads: ``create_repo(exist_ok=True)``, ``create_branch`` for a ``--revision``
   other than main, then one ``create_commit`` with every file of the folder, its model card
   (README.md, written by the export) among them.  The endpoint is HF_ENDPOINT's and the token
   HF_TOKEN's or the saved login's, read by huggingface_hub itself: trnqwen never holds it in
   anything it prints or writes.  Progress bars are huggingface_hub's own (Xet or LFS).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional

from trnqwen.errors import CheckFailed, EnvironmentProblem, TrnqwenError, UsageError, redact

if TYPE_CHECKING:
    from trnqwen.config import RunConfig

DEFAULT_REVISION = "main"
CARD = "README.md"
SHARDS = "sharded"  # torchtitan's per-rank pieces (trnqwen.ckpt.model_folder moves them out; never pushed)
_REPO_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")
REPO_HINT = "name the repo OWNER/NAME, e.g. {flag} my-org/qwen3-4b-chat-lora"


@dataclass
class PushResult:
    """What was pushed where (never the token)."""

    repo: str
    revision: str
    commit: str
    commit_url: str
    url: str
    folder: Path
    kind: str  # "model" or "adapter"
    files: list[str] = field(default_factory=list)
    bytes: int = 0
    private: bool = False  # asked for with --private (an existing repo keeps its own visibility)

    def as_dict(self) -> dict[str, Any]:
        return {
            "ok": True, "repo": self.repo, "revision": self.revision, "commit": self.commit,
            "commit_url": self.commit_url, "url": self.url, "folder": str(self.folder), "kind": self.kind,
            "files": self.files, "bytes": self.bytes, "private": self.private,
        }


# --- before anything is sent ---------------------------------------------------------------------


def check_repo_id(repo: str, *, flag: str = "--repo") -> str:
    """OWNER/NAME as the Hub accepts it, else a UsageError (exit 2)."""
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    text = (repo or "").strip()
    if not _REPO_RE.match(text):
        raise UsageError(f"{flag} {repo!r} is not a Hub repo id OWNER/NAME", hint=REPO_HINT.format(flag=flag))
    try:
        validate_repo_id(text)
    except HFValidationError as exc:
        reason = redact(str(exc)).splitlines()[0] if str(exc) else "rejected"
        raise UsageError(f"{flag} {repo!r} is not a valid Hub repo id: {reason}", hint=REPO_HINT.format(flag=flag)) from None
    return text


def check_ready(repo: str, *, flag: str = "--repo") -> str:
    """Everything a push needs that can be checked offline: the repo id, online mode and a token
    (HF_TOKEN or `hf auth login`'s).  Returns the repo id."""
    from huggingface_hub import constants, get_token

    repo = check_repo_id(repo, flag=flag)
    if constants.HF_HUB_OFFLINE:
        raise EnvironmentProblem(f"HF_HUB_OFFLINE is set, so nothing can be pushed to {repo}",
                                 hint="unset HF_HUB_OFFLINE (or set it to 0) to push")
    if not get_token():
        raise EnvironmentProblem(
            f"pushing to {repo} needs a Hub token with write access, and none is set",
            hint="set HF_TOKEN, or log in once with `hf auth login` (https://huggingface.co/settings/tokens)",
        )
    return repo


def verified_export(arg: Optional[str], *, cfg: RunConfig, base: Optional[Path] = None) -> tuple[Path, str]:
    """RUN|FOLDER -> (the export folder, "model" or "adapter"), after verify-ckpt's checks passed;
    a CheckFailed (exit 1) with verify-ckpt's first finding, or the reason, when they did not."""
    from trnqwen.ckpt.layout import _load_config, resolve_checkpoint
    from trnqwen.ckpt.verify import verify
    from trnqwen.ckpt.verify_adapter import UNTRAINED, verify_adapter
    from trnqwen.evaluate.targets import resolve_target

    target = resolve_target(arg, Path(cfg.runs_dir), base_dir=base, base_flag="--base")
    folder = target.export
    ckpt = resolve_checkpoint(folder)
    check = f"`trnqwen verify-ckpt {ckpt.root}` shows every check"
    if target.adapter is not None:
        report = verify_adapter(ckpt, _load_config(target.folder / "config.json", "the adapter's base"),
                                trust_remote_code=cfg.trust_remote_code)
        kind = "adapter"
    else:
        if not (ckpt.root / "config.json").is_file():
            raise CheckFailed(f"{ckpt.root} has no config.json: the Hub repo would hold weights nothing can load",
                              hint="push the export a finished run wrote (it carries config, tokenizer and model card)")
        report = verify(ckpt, _load_config(ckpt.root / "config.json", "the export's config.json"))
        kind = "model"
    problems = report.problems
    if problems:
        more = f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""
        raise CheckFailed(f"{ckpt.root} failed verification, so it is not pushed: {problems[0]}{more}", hint=check)
    if kind == "adapter" and report.untrained:
        raise CheckFailed(f"{ckpt.root}: {UNTRAINED}: pushing it would publish the base model unchanged",
                          hint="train it (more steps, a higher --lr), then push that export; " + check)
    return ckpt.root, kind


def folder_files(folder: Path) -> list[Path]:
    """The files a push uploads: every file of the folder except hidden ones (locks, caches,
    temporary files) and torchtitan's ``sharded/`` pieces."""
    out = []
    for path in sorted(Path(folder).rglob("*")):
        parts = path.relative_to(folder).parts
        if any(p.startswith(".") for p in parts) or parts[0] == SHARDS or not path.is_file():
            continue
        out.append(path)
    return out


# --- the upload ----------------------------------------------------------------------------------


def upload(folder: Path, repo: str, *, kind: str, private: bool = False, revision: Optional[str] = None,
           progress: bool = True, message: Optional[str] = None) -> PushResult:
    """One commit of ``folder``'s files to ``repo`` (created when missing) at ``revision``."""
    from huggingface_hub import CommitOperationAdd, HfApi
    from huggingface_hub.utils import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars

    folder = Path(folder)
    branch = revision or DEFAULT_REVISION
    files = folder_files(folder)
    if not files:
        raise UsageError(f"{folder} holds no files to push")
    api = HfApi()  # endpoint: HF_ENDPOINT; token: HF_TOKEN or the saved login (huggingface_hub reads both)
    quiet = not progress and not are_progress_bars_disabled()  # HF_HUB_DISABLE_PROGRESS_BARS=1 wins either way
    if quiet:
        disable_progress_bars()
    try:
        url = api.create_repo(repo, private=True if private else None, exist_ok=True)
        if branch != DEFAULT_REVISION:
            api.create_branch(repo, branch=branch, exist_ok=True)
        operations = [CommitOperationAdd(path_in_repo=p.relative_to(folder).as_posix(), path_or_fileobj=str(p)) for p in files]
        info = api.create_commit(repo, operations=operations, revision=branch,
                                 commit_message=message or f"Upload {'LoRA adapter' if kind == 'adapter' else 'model'} with trnqwen push")
    except TrnqwenError:
        raise
    except Exception as exc:  # noqa: BLE001 - every Hub/transport failure becomes one line
        raise push_error(exc, repo, branch) from None
    finally:
        if quiet:
            enable_progress_bars()
    return PushResult(
        repo=repo, revision=branch, commit=info.oid, commit_url=info.commit_url, url=str(url), folder=folder, kind=kind,
        files=[p.relative_to(folder).as_posix() for p in files], bytes=sum(p.stat().st_size for p in files),
        private=bool(private),
    )


def push(arg: Optional[str], repo: str, *, cfg: RunConfig, private: bool = False, revision: Optional[str] = None,
         base: Optional[Path] = None, progress: bool = True,
         before_upload: Optional[Callable[[Path, str, list[Path]], None]] = None) -> PushResult:
    """``trnqwen push``: check the repo and the token, verify the export, upload it.
    ``before_upload(folder, kind, files)`` hears what is about to be sent."""
    repo = check_ready(repo)
    if revision is not None and not revision.strip():
        raise UsageError("--revision is empty", hint="name a branch, e.g. --revision main")
    folder, kind = verified_export(arg, cfg=cfg, base=base)
    if before_upload is not None:
        before_upload(folder, kind, folder_files(folder))
    return upload(folder, repo, kind=kind, private=private, revision=revision, progress=progress)


# --- errors --------------------------------------------------------------------------------------


def push_error(exc: BaseException, repo: str, revision: str) -> TrnqwenError:
    """One line and what to do for each way a push fails (the token never in it)."""
    import httpx
    from huggingface_hub import constants
    from huggingface_hub.errors import HFValidationError, HfHubHTTPError, RevisionNotFoundError

    from trnqwen.fetch.errors import HubUnreachable

    cause = exc.__cause__
    if isinstance(exc, RuntimeError) and cause is not None and str(exc).startswith("Error while uploading"):
        return push_error(cause, repo, revision)  # the LFS upload's wrapper: the real failure is its cause
    endpoint = constants.ENDPOINT
    token_hint = ("use a token with write access to this namespace (a fine-grained token needs 'write' on it): "
                  "set HF_TOKEN or `hf auth login`; https://huggingface.co/settings/tokens")
    if isinstance(exc, HFValidationError):
        return UsageError(f"not a valid Hub repo id or revision: {redact(str(exc)).splitlines()[0]}",
                          hint=REPO_HINT.format(flag="--repo"))
    if isinstance(exc, RevisionNotFoundError):
        return UsageError(f"branch {revision!r} does not exist in {repo} and could not be created",
                          hint="push to an existing branch, or drop --revision (main)")
    if isinstance(exc, HfHubHTTPError) and exc.response is not None:
        code = exc.response.status_code
        if code == 401:
            return EnvironmentProblem(f"the Hub rejected the access token (401 Unauthorized) pushing to {repo}", hint=token_hint)
        if code in (403, 404):
            return EnvironmentProblem(f"the Hub refused to let this token write to {repo} ({code})", hint=token_hint)
        if code == 429:
            return EnvironmentProblem("the Hub is rate-limiting this machine (429)", hint="wait a minute and push again")
        if code >= 500:
            return EnvironmentProblem(f"the Hub answered {code} (server error) pushing to {repo}",
                                      hint="push again later: files already uploaded are not sent twice")
        detail = redact(str(exc)).splitlines()[0][:200] if str(exc) else ""
        return EnvironmentProblem(f"the Hub answered {code} pushing to {repo}: {detail}",
                                  hint="rerun with TRNQWEN_DEBUG=1 to see the request")
    if isinstance(exc, (httpx.TransportError, ConnectionError, TimeoutError)):
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return HubUnreachable(f"cannot reach {endpoint} to push {repo}: {redact(reason)[:200]}",
                              hint="check the network or proxy (HTTPS_PROXY) and HF_ENDPOINT, then push again")
    if isinstance(exc, ValueError) and "README.md" in str(exc):
        return CheckFailed(f"the Hub rejected the model card's metadata: {redact(str(exc)).splitlines()[-1][:200]}",
                           hint="fix README.md's YAML header in the export, then push again")
    text = redact(str(exc)).splitlines()[0][:200] if str(exc) else ""
    return EnvironmentProblem(f"push to {repo} failed: {type(exc).__name__}: {text}",
                              hint="push again (files already uploaded are not sent twice); TRNQWEN_DEBUG=1 shows the traceback")


__all__ = ["PushResult", "check_ready", "check_repo_id", "folder_files", "push", "push_error", "upload", "verified_export"]
