"""Answers from an OpenAI-compatible server (``trnqwen serve``: transformers serve or vLLM) over HTTP.

Each turn is one ``POST /v1/chat/completions`` with ``stream: true``; the answer arrives as
server-sent events, one JSON chunk per ``data:`` event until ``data: [DONE]``, and each chunk's
``choices[0].delta`` carries the next piece of ``content`` (and, from a server with a reasoning
parser, ``reasoning_content``: shown, not kept).  ``enable_thinking`` travels as
``chat_template_kwargs``, which vLLM and transformers serve both hand to the chat template.

The client is the standard library's urllib: trnqwen depends on no OpenAI client (``openai`` comes
only with the ``serve`` extra), and huggingface_hub's InferenceClient, given a URL and no key, sends
the Hugging Face token saved on this machine to that URL, which ``trnqwen chat`` must never do.  The
one credential sent is ``OPENAI_API_KEY`` (what vLLM's ``--api-key`` checks), as the OpenAI client does.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Iterable, Iterator, Optional

from trnqwen.chat.session import Reasoning, Sampling
from trnqwen.errors import CheckFailed, EnvironmentProblem, UsageError

API_KEY_VAR = "OPENAI_API_KEY"
CONNECT_TIMEOUT_S = 10.0
ANSWER_TIMEOUT_S = 600.0  # between two bytes of an answer (a first token on a cold Neuron server is slow)
SERVE_HINT = "start one with `trnqwen serve RUN --port 8000`, then `trnqwen chat --endpoint http://127.0.0.1:8000`"


def base_url(url: str) -> str:
    """``http://host:port`` from what a user may paste: the server, its ``/v1``, or the chat route."""
    text = url.strip().rstrip("/")
    parsed = urllib.parse.urlparse(text)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise UsageError(f"--endpoint {url!r} is not an http(s) URL", hint="pass the server's URL, e.g. http://127.0.0.1:8000")
    for tail in ("/chat/completions", "/v1"):
        if text.endswith(tail):
            text = text[: -len(tail)]
    return text


def sse_data(lines: Iterable[bytes]) -> Iterator[str]:
    """The data of each server-sent event (its ``data:`` lines joined by newlines), up to ``[DONE]``.

    Events end at a blank line; comments (``:``) and other fields (``event:``, ``id:``) are skipped."""
    data: list[str] = []
    for raw in lines:
        line = raw.decode("utf-8") if isinstance(raw, bytes) else raw
        line = line.rstrip("\r\n")
        if not line:
            if data:
                payload = "\n".join(data)
                data = []
                if payload.strip() == "[DONE]":
                    return
                yield payload
            continue
        if line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        if name == "data":
            data.append(value[1:] if value.startswith(" ") else value)
    if data and "\n".join(data).strip() != "[DONE]":
        yield "\n".join(data)  # a last event the server did not end with a blank line


def chat_pieces(payloads: Iterable[str]) -> Iterator[str]:
    """The answer's pieces from the stream's JSON chunks: ``content`` as text, ``reasoning_content``
    (or ``reasoning``) as :class:`Reasoning`; an ``error`` chunk is a :class:`CheckFailed`."""
    for payload in payloads:
        try:
            chunk = json.loads(payload)
        except ValueError:
            raise CheckFailed(f"the endpoint sent a chunk that is not JSON: {payload[:120]!r}") from None
        if not isinstance(chunk, dict):
            continue
        if chunk.get("error"):
            raise CheckFailed(f"the endpoint failed mid-answer: {_error_text(chunk)}")
        for choice in chunk.get("choices") or []:
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            thought = delta.get("reasoning_content") or delta.get("reasoning")
            if thought:
                yield Reasoning(thought)
            if delta.get("content"):
                yield delta["content"]


def _error_text(doc: object) -> str:
    """The message an OpenAI-style (``{"error": {"message"}}``) or FastAPI (``{"detail"}``) error carries."""
    if isinstance(doc, dict):
        err = doc.get("error", doc.get("detail"))
        if isinstance(err, dict):
            return str(err.get("message") or err)
        if err:
            return str(err)
    return str(doc)[:300]


def _http_error(exc: urllib.error.HTTPError) -> str:
    try:
        body = exc.read().decode("utf-8", errors="replace")
    except OSError:
        body = ""
    try:
        text = _error_text(json.loads(body))
    except ValueError:
        text = body.strip()[:300] or exc.reason
    return f"HTTP {exc.code}: {text}"


class EndpointEngine:
    """One server and the model asked for on it; :meth:`stream` answers one conversation."""

    def __init__(self, url: str, model: str, *, api_key: Optional[str] = None):
        self.url = base_url(url)
        self.model = model
        self.api_key = api_key
        self.description = f"{model} at {self.url}"

    def _request(self, route: str, body: Optional[dict[str, Any]] = None) -> urllib.request.Request:
        headers = {"Accept": "text/event-stream" if body and body.get("stream") else "application/json"}
        if body is not None:
            headers["Content-Type"] = "application/json"
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        data = json.dumps(body).encode() if body is not None else None
        return urllib.request.Request(self.url + route, data=data, headers=headers, method="POST" if data else "GET")

    def models(self) -> list[dict[str, Any]]:
        """``GET /v1/models``'s entries; EnvironmentProblem when nothing answers, UsageError on 401/403."""
        try:
            with urllib.request.urlopen(self._request("/v1/models"), timeout=CONNECT_TIMEOUT_S) as resp:
                doc = json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            if exc.code in (401, 403):
                raise UsageError(f"{self.url} refused the request ({_http_error(exc)})",
                                 hint=f"export {API_KEY_VAR}=<the server's --api-key>") from None
            raise EnvironmentProblem(f"{self.url}/v1/models answered {_http_error(exc)}",
                                     hint="is it an OpenAI-compatible server? name the model with --model") from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise EnvironmentProblem(f"nothing answers at {self.url} ({reason})", hint=SERVE_HINT) from None
        except ValueError:
            raise EnvironmentProblem(f"{self.url}/v1/models did not answer JSON",
                                     hint="is it an OpenAI-compatible server?") from None
        rows = doc.get("data") if isinstance(doc, dict) else None
        return [row for row in rows or [] if isinstance(row, dict) and row.get("id")]

    def body(self, messages: list[dict[str, str]], sampling: Sampling) -> dict[str, Any]:
        """The request for one answer (only what was chosen: the server's defaults stay otherwise)."""
        body: dict[str, Any] = {"model": self.model, "messages": messages, "stream": True,
                                "max_tokens": sampling.max_new_tokens}
        if sampling.temperature is not None:
            body["temperature"] = sampling.temperature
        if sampling.top_p is not None and not sampling.greedy:
            body["top_p"] = sampling.top_p
        if sampling.template_kwargs():
            body["chat_template_kwargs"] = sampling.template_kwargs()
        return body

    def stream(self, messages: list[dict[str, str]], sampling: Sampling) -> Iterator[str]:
        request = self._request("/v1/chat/completions", self.body(messages, sampling))
        try:
            resp = urllib.request.urlopen(request, timeout=ANSWER_TIMEOUT_S)
        except urllib.error.HTTPError as exc:
            raise CheckFailed(f"the endpoint refused the question ({_http_error(exc)})") from None
        except (urllib.error.URLError, OSError) as exc:
            raise CheckFailed(f"the endpoint {self.url} stopped answering ({getattr(exc, 'reason', exc)})",
                              hint=SERVE_HINT) from None
        with resp:
            try:
                yield from chat_pieces(sse_data(resp))
            except OSError as exc:
                raise CheckFailed(f"the answer from {self.url} broke off ({exc})") from None


def pick_model(rows: list[dict[str, Any]], url: str) -> str:
    """The model to ask when none is named: the one served; beside its base, an adapter (vLLM lists a
    LoRA module with its ``parent``, the base model)."""
    if not rows:
        raise UsageError(f"{url} lists no model at /v1/models", hint="name the model with --model NAME")
    adapters = [row for row in rows if row.get("parent")]
    return str((adapters or rows)[0]["id"])


def open_endpoint(url: str, *, model: Optional[str] = None, environ: Optional[dict[str, str]] = None) -> EndpointEngine:
    """The server checked (it answers ``/v1/models``) and the model chosen: ``model``, which it must
    list when it lists any, else :func:`pick_model`'s."""
    environ = os.environ if environ is None else environ
    engine = EndpointEngine(url, model or "", api_key=environ.get(API_KEY_VAR) or None)
    rows = engine.models()
    ids = [str(row["id"]) for row in rows]
    if model and ids and model not in ids:
        raise UsageError(f"{engine.url} does not serve {model!r}", hint=f"it serves: {', '.join(ids[:5])}")
    engine.model = model or pick_model(rows, engine.url)
    engine.description = f"{engine.model} at {engine.url}"
    return engine
