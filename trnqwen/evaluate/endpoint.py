"""``trnqwen eval --tasks T --endpoint URL``: harness tasks scored through an OpenAI-compatible server.

The model is not loaded here: lm-evaluation-harness's own ``local-chat-completions`` model sends
each request to ``URL/v1/chat/completions`` (``trnqwen serve``'s, vLLM's, any OpenAI-compatible
server's) as chat messages, the server applies the model's chat template, and generation is
greedy (temperature 0).  The RUN|FOLDER the server serves still matters: its tokenizer gives the
end-of-text string the harness adds to each request's stop strings, its chat template is checked
(a chat endpoint needs one), the served model's name is picked from ``GET /v1/models`` by it, and
the results are recorded in its run.  Only generative tasks (``generate_until``) can be scored
this way: a chat endpoint returns text, not the log-likelihoods a multiple-choice task compares.

Base against tuned: ``--endpoint`` scores the tuned model, ``--base-endpoint`` the base; only what
is given is scored (nothing is loaded in-process beside an endpoint).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Optional, Sequence

from trnqwen.errors import CheckFailed, EnvironmentProblem, UsageError

if TYPE_CHECKING:
    from lm_eval.models.openai_completions import LocalChatCompletion

    from trnqwen.evaluate.targets import EvalTarget

CHAT_PATH = "/v1/chat/completions"
MODELS_PATH = "/v1/models"
GENERATIVE = "generate_until"
API_INSTALL_HINT = "pip install 'trnqwen[eval]' (lm_eval[api]: aiohttp, tenacity, requests)"
SERVE_HINT = "start one: trnqwen serve RUN --port 8000, then --endpoint http://127.0.0.1:8000"


@dataclass(frozen=True)
class Endpoint:
    """One server: its root URL and the model name its requests carry."""

    url: str  # http://host:port (what --endpoint said, without /v1/...)
    model: str

    @property
    def chat_url(self) -> str:
        return self.url + CHAT_PATH


def root_url(url: str, flag: str = "--endpoint") -> str:
    """``http://host:port[/v1[/chat/completions]][/]`` -> ``http://host:port`` (a path prefix before
    ``/v1`` is kept: a server behind a proxy)."""
    text = url.strip()
    parts = urllib.parse.urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise UsageError(f"{flag} {url!r}: not an http(s) URL", hint="e.g. http://127.0.0.1:8000 (trnqwen serve's address)")
    path = parts.path.rstrip("/")
    for suffix in (CHAT_PATH, "/v1/completions", "/v1"):
        if path.endswith(suffix):
            path = path[: -len(suffix)]
            break
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, path, "", ""))


def served_models(url: str, *, flag: str = "--endpoint", timeout: float = 10.0) -> list[str]:
    """The model ids ``GET URL/v1/models`` lists; one line (exit 3) when nothing answers there."""
    try:
        with urllib.request.urlopen(url + MODELS_PATH, timeout=timeout) as resp:  # noqa: S310 - the user's own server
            body = json.loads(resp.read().decode("utf-8", errors="replace"))
    except urllib.error.HTTPError as exc:
        raise EnvironmentProblem(f"{flag} {url}: {MODELS_PATH} answered HTTP {exc.code}, so it is not an "
                                 "OpenAI-compatible server", hint=SERVE_HINT) from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", None) or exc
        raise EnvironmentProblem(f"{flag} {url}: no server answers there ({reason})", hint=SERVE_HINT) from None
    except ValueError:
        raise EnvironmentProblem(f"{flag} {url}: {MODELS_PATH} did not answer JSON, so it is not an "
                                 "OpenAI-compatible server", hint=SERVE_HINT) from None
    data = body.get("data") if isinstance(body, dict) else None
    return [str(m["id"]) for m in data or [] if isinstance(m, dict) and m.get("id")]


def choose_model(ids: Sequence[str], target: EvalTarget, url: str, flag: str = "--endpoint") -> str:
    """The served model that is ``target``: the only one listed, else the one named by its folder
    (``trnqwen serve`` and ``vllm serve`` name a model by its path), for an adapter its merged
    folder (transformers) or the one model beside its base (vLLM's ``--lora-modules`` name)."""
    if not ids:
        raise EnvironmentProblem(f"{flag} {url}: {MODELS_PATH} lists no model", hint=SERVE_HINT)
    if len(ids) == 1:
        return ids[0]
    names = [str(target.folder), str(Path(target.folder).absolute())]
    if target.adapter is not None:
        from trnqwen.ckpt.merge import merged_path

        names = [str(merged_path(target.adapter)), str(target.adapter)]
        others = [i for i in ids if i not in (str(target.folder), str(Path(target.folder).absolute()))]
        if len(others) == 1 and not any(n in ids for n in names):
            return others[0]
    found = next((n for n in names if n in ids), None)
    if found is None:
        raise UsageError(f"{flag} {url} serves {len(ids)} models ({', '.join(ids[:5])}) and none is {target.export}",
                         hint="give the RUN|FOLDER that endpoint serves")
    return found


def connect(url: str, target: EvalTarget, flag: str = "--endpoint") -> Endpoint:
    root = root_url(url, flag)
    return Endpoint(root, choose_model(served_models(root, flag=flag), target, root, flag))


def require_chat_template(tokenizer, target: EvalTarget, flag: str) -> None:
    if not getattr(tokenizer, "chat_template", None):
        raise UsageError(f"{flag} scores through {CHAT_PATH}, and the tokenizer in {target.tokenizer_dir} has no "
                         "chat template (the server could not render the questions)",
                         hint="score it in-process (drop the endpoint flags), or train with --chat-template chatml")


def require_generative(kinds: Sequence[tuple[str, Optional[str]]], flag: str) -> None:
    """Refuses, before any request, a task (``(name, output_type)``) known not to be ``generate_until``."""
    for name, kind in kinds:
        if kind is not None and kind != GENERATIVE:
            suggestion = f" (its generative twin: {name}_gen)" if name == "trnqwen_calculator" else ""
            raise UsageError(f"{flag}: task {name} is {kind}, scored by log-likelihoods, which a chat endpoint "
                             f"does not return{suggestion}",
                             hint="score generative tasks (output_type generate_until) through an endpoint, others in-process")


def require_api_extra() -> None:
    """The harness's API models need its ``api`` extra; checked before any request (exit 3)."""
    import importlib.util

    missing = [m for m in ("aiohttp", "tenacity", "requests", "tqdm") if importlib.util.find_spec(m) is None]
    if missing:
        raise EnvironmentProblem(f"scoring through an endpoint needs lm_eval's API extra ({', '.join(missing)} missing)",
                                 hint=API_INSTALL_HINT)


def chat_model(endpoint: Endpoint, tokenizer_dir: Path, *, trust_remote_code: bool = False) -> LocalChatCompletion:
    """The harness's own ``local-chat-completions`` model for ``endpoint``: one request at a time
    (the order the in-process model answers in), the folder's tokenizer for the end-of-text stop."""
    from lm_eval.models.openai_completions import LocalChatCompletion

    try:
        return LocalChatCompletion(
            base_url=endpoint.chat_url, model=endpoint.model, tokenizer=str(tokenizer_dir),
            tokenizer_backend="huggingface", tokenized_requests=False, num_concurrent=1, max_retries=3,
            trust_remote_code=trust_remote_code, timeout=600,
        )
    except ModuleNotFoundError as exc:  # its API extra: aiohttp, tenacity, requests
        raise EnvironmentProblem(f"scoring through an endpoint needs lm_eval's API extra ({exc})",
                                 hint=API_INSTALL_HINT) from None


def loglikelihood_refused(exc: NotImplementedError, url: str) -> CheckFailed:
    """The harness asked a chat endpoint for log-likelihoods (a task whose type trnqwen could not read)."""
    return CheckFailed(f"a task asked {url} for log-likelihoods, which a chat endpoint does not return ({exc})",
                       hint="score generative tasks (output_type generate_until) through an endpoint, others in-process")


def plan(checkpoints: Sequence[str], *, runs_dir: Path, base: Optional[bool], base_dir: Optional[Path],
         endpoint: str, base_endpoint: Optional[str],
         trust_remote_code: bool = False) -> tuple[list[EvalTarget], dict[str, Endpoint]]:
    """The models scored through servers: the tuned one (RUN|FOLDER, the last run's by default) at
    ``endpoint`` and, with ``base_endpoint``, its base there; each server asked which model it serves."""
    from transformers import AutoTokenizer

    from trnqwen.evaluate.run import plan_targets

    if len(checkpoints) > 1:
        raise UsageError(f"--endpoint scores one model, the one its server serves ({len(checkpoints)} given)",
                         hint="give the RUN|FOLDER that endpoint serves, one per command")
    if base_endpoint is not None and base is False:
        raise UsageError("--no-base and --base-endpoint contradict each other", hint="drop one of them")
    if base and base_endpoint is None:
        raise UsageError("--base with --endpoint: the base is scored through its own server",
                         hint="serve it (trnqwen serve BASE_FOLDER --port 8001) and pass --base-endpoint http://127.0.0.1:8001")
    require_api_extra()
    for url, flag in ((endpoint, "--endpoint"), (base_endpoint, "--base-endpoint")):
        if url is not None:
            root_url(url, flag)  # a malformed URL before any folder is read
    targets = plan_targets(list(checkpoints), runs_dir=runs_dir, base=base_endpoint is not None, base_dir=base_dir)
    endpoints = {}
    for target in targets:
        url, flag = (base_endpoint, "--base-endpoint") if target.is_base else (endpoint, "--endpoint")
        tokenizer = AutoTokenizer.from_pretrained(str(target.tokenizer_dir), trust_remote_code=trust_remote_code)
        require_chat_template(tokenizer, target, flag)
        endpoints[target.label] = connect(url, target, flag)
    return targets, endpoints
