"""One clear line and what to do, for each way talking to the Hub fails.

huggingface_hub and httpx raise a dozen exception types; :func:`hub_error` maps each to a
:class:`~trnqwen.errors.TrnqwenError` with the exit code it deserves.  Messages pass through
:func:`trnqwen.errors.redact`: a token is never printed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from trnqwen.errors import EnvironmentProblem, TrnqwenError, UsageError, redact


class HubUnreachable(EnvironmentProblem):
    """The Hub could not be reached (connection refused, DNS, timeout, dropped connection)."""




def hub_error(exc: BaseException, repo_id: str, revision: Optional[str]) -> TrnqwenError:
    """One clear line + what to do, for each way talking to the Hub fails."""
    import httpx
    from huggingface_hub import constants
    from huggingface_hub.errors import (
        GatedRepoError,
        HFValidationError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        OfflineModeIsEnabled,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    endpoint = constants.ENDPOINT
    page = f"{endpoint}/{repo_id}"
    if isinstance(exc, OfflineModeIsEnabled) or (isinstance(exc, LocalEntryNotFoundError) and constants.HF_HUB_OFFLINE):
        return offline_error(repo_id)
    if isinstance(exc, HFValidationError):
        return UsageError(f"not a valid Hub repo id or revision: {redact(str(exc)).splitlines()[0]}",
                          hint="repo ids look like Qwen/Qwen3-4B-Instruct-2507")
    if isinstance(exc, GatedRepoError):
        return EnvironmentProblem(
            f"{repo_id} is a gated repo and this account has not been granted access",
            hint=f"accept its terms at {page}, then log in (`hf auth login`) or set HF_TOKEN to a token of that account",
        )
    if isinstance(exc, RepositoryNotFoundError):
        return UsageError(
            f"repo {repo_id} not found on {endpoint} (or it is private and no valid token was sent)",
            hint="check the repo id, e.g. Qwen/Qwen3-4B-Instruct-2507; for a private repo log in "
            "(`hf auth login`) or set HF_TOKEN",
        )
    if isinstance(exc, RevisionNotFoundError):
        return UsageError(
            f"revision {revision!r} not found in {repo_id}",
            hint=f"use a branch, tag or commit that exists (see {page}/tree/main), or drop --revision",
        )
    if isinstance(exc, HfHubHTTPError) and exc.response is not None:
        code = exc.response.status_code
        if code == 401:
            return EnvironmentProblem(
                "the Hub rejected the access token (401 Unauthorized)",
                hint="the token in HF_TOKEN or from `hf auth login` is invalid or expired: make a new one at "
                "https://huggingface.co/settings/tokens, or unset HF_TOKEN for public repos",
            )
        if code == 403:
            return EnvironmentProblem(
                f"the Hub refused access to {repo_id} (403 Forbidden)",
                hint="the token lacks read access to this repo (fine-grained token?): grant it, or use another token",
            )
        if code == 429:
            return EnvironmentProblem("the Hub is rate-limiting this machine (429)", hint="wait a minute and run the same command again")
        if code >= 500:
            return EnvironmentProblem(
                f"the Hub answered {code} (server error)", hint="try again later; a rerun resumes where this one stopped"
            )
        return EnvironmentProblem(f"the Hub answered {code} for {repo_id}", hint="rerun with TRNQWEN_DEBUG=1 to see the request")
    if isinstance(exc, (httpx.TransportError, LocalEntryNotFoundError, ConnectionError, TimeoutError)):
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        if isinstance(exc, (httpx.ConnectError, httpx.ConnectTimeout, LocalEntryNotFoundError)):
            what = f"cannot reach {endpoint}"
        else:
            what = f"the connection to {endpoint} failed during the download"
        return HubUnreachable(
            f"{what}: {redact(reason)[:200]}",
            hint="check the network or proxy (HTTPS_PROXY), or set HF_ENDPOINT to a mirror; "
            "the same command again resumes where this one stopped",
        )
    if isinstance(exc, OSError) and getattr(exc, "errno", None) == 28:
        return EnvironmentProblem("the disk filled up during the download", hint="free space and run the same command again; it resumes")
    return EnvironmentProblem(
        f"download failed: {type(exc).__name__}: {redact(str(exc)).splitlines()[0] if str(exc) else ''}",
        hint="run the same command again (it resumes); TRNQWEN_DEBUG=1 shows the traceback",
    )


def offline_error(repo_id: str, local_dir: Optional[Path] = None) -> EnvironmentProblem:
    where = f" and {local_dir} holds no complete snapshot of it" if local_dir else ""
    return EnvironmentProblem(
        f"HF_HUB_OFFLINE is set, so {repo_id} cannot be downloaded{where}",
        hint="unset HF_HUB_OFFLINE (or set it to 0) to download, or copy a complete snapshot there; "
        "builtin:tiny-qwen3 works offline",
    )


def offline_mode() -> bool:
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE)

