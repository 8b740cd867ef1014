"""``trnqwen chat``'s own logic, fast: the conversation kept and reset, the system prompt, the commands,
Ctrl-C and Ctrl-D, an engine's error; the answer assembled from server-sent events (parsed from bytes,
and streamed over HTTP from a loopback server); the request sent; the refusals.  The model itself
answering (in-process and through `trnqwen serve`, read off a tmux pane) is tests/test_chat_e2e.py."""

from __future__ import annotations

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
import pytest

from tests.helpers import assert_clean_error
from trnqwen.chat.endpoint import EndpointEngine, base_url, chat_pieces, open_endpoint, pick_model, sse_data
from trnqwen.chat.session import ChatIO, ChatSession, Reasoning, Sampling, assemble, run_chat
from trnqwen.errors import CheckFailed, EnvironmentProblem, UsageError


class Scripted:
    """An engine double (the session is under test, not a model): answers ``answer-N`` in two pieces
    and records every conversation it was asked."""

    description = "scripted"

    def __init__(self, fail_on: str = "", stop_on: str = "", think: bool = False):
        self.asked: list[list[dict[str, str]]] = []
        self.fail_on, self.stop_on, self.think = fail_on, stop_on, think
        self.closed = 0

    def stream(self, messages, sampling):
        self.asked.append(messages)
        try:
            if self.think:
                yield Reasoning("hmm. ")
            yield "answer-"
            if messages[-1]["content"] == self.fail_on:
                raise CheckFailed("the server went away", hint="start it again")
            if messages[-1]["content"] == self.stop_on:
                raise KeyboardInterrupt
            yield str(len(self.asked))
        finally:
            self.closed += 1


def _chat(lines: list, engine=None, system: str | None = None):
    """run_chat over scripted lines (an exception in the list is raised by that read)."""
    engine = engine or Scripted()
    out: list[str] = []
    notes: list[str] = []
    feed = iter(lines)

    def read() -> str:
        item = next(feed, EOFError())
        if isinstance(item, BaseException):
            raise item
        return item

    session = ChatSession(system=system)
    answered = run_chat(engine, session, Sampling(temperature=0), ChatIO(read=read, write=out.append, note=notes.append))
    return engine, session, "".join(out), notes, answered


def test_each_question_goes_with_the_whole_conversation_and_the_system_prompt_first():
    engine, session, out, _, answered = _chat(["first", "", "second", "/exit", "never read"], system="Be terse.")
    assert answered == 2 and out == "answer-1\nanswer-2\n"
    assert engine.asked[1] == [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "first"},
                               {"role": "assistant", "content": "answer-1"}, {"role": "user", "content": "second"}]
    assert session.turns[-1] == {"role": "assistant", "content": "answer-2"}


def test_reset_forgets_the_turns_and_keeps_the_system_prompt():
    engine, session, _, notes, _ = _chat(["first", "/reset", "again"], system="Be terse.")
    assert engine.asked[1] == [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "again"}]
    assert notes == ["the conversation starts over (the system prompt stays)"]
    assert [m["content"] for m in session.turns] == ["again", "answer-2"]


@pytest.mark.parametrize("leave", [EOFError(), KeyboardInterrupt(), "/exit", "/QUIT", "/bye now"])
def test_ctrl_d_ctrl_c_and_exit_leave_cleanly(leave):
    engine, _, out, _, answered = _chat(["hello", leave, "never read"])
    assert answered == 1 and len(engine.asked) == 1 and out.startswith("answer-1\n")


def test_unknown_command_and_help_say_the_commands_and_ask_nothing():
    engine, _, _, notes, _ = _chat(["/nope", "/help"])
    assert engine.asked == []
    assert notes[0].startswith("unknown command /nope: /reset starts") and "/exit or Ctrl-D leaves" in notes[1]


def test_ctrl_c_during_an_answer_stops_it_and_it_is_not_kept():
    engine, session, out, notes, answered = _chat(["one", "stop me", "three"], engine=Scripted(stop_on="stop me"))
    assert answered == 2 and engine.closed == 3
    assert [m["content"] for m in engine.asked[2]] == ["one", "answer-1", "three"]  # the stopped turn is not kept
    assert out == "answer-1\nanswer-\nanswer-3\n" and "answer stopped (Ctrl-C), not kept" in notes[0]


def test_an_engine_error_is_one_line_and_the_chat_goes_on():
    engine, session, out, notes, answered = _chat(["boom", "fine"], engine=Scripted(fail_on="boom"))
    assert notes == ["error: the server went away (start it again)"]
    assert answered == 1 and [m["content"] for m in session.turns] == ["fine", "answer-2"]


def test_thinking_is_shown_but_not_kept():
    engine, session, out, _, _ = _chat(["q"], engine=Scripted(think=True))
    assert out == "hmm. answer-1\n" and session.turns[-1]["content"] == "answer-1"
    assert assemble([Reasoning("a"), "b", "c"]) == "bc"


def test_sampling_to_generate_options():
    from trnqwen.chat.local import generation_options

    greedy = generation_options(Sampling(temperature=0, top_p=0.5, max_new_tokens=7), eos_ids=[1], pad_id=1, device_type="cpu")
    assert greedy == {"max_new_tokens": 7, "pad_token_id": 1, "eos_token_id": [1], "do_sample": False,
                      "temperature": None, "top_p": None, "top_k": None}
    sampled = generation_options(Sampling(temperature=0.7, top_p=0.9), eos_ids=[1], pad_id=1, device_type="neuron")
    assert sampled["do_sample"] and sampled["temperature"] == 0.7 and sampled["top_p"] == 0.9
    assert sampled["cache_implementation"] == "static"
    default = generation_options(Sampling(), eos_ids=[1], pad_id=1, device_type="cpu")
    assert "do_sample" not in default and "temperature" not in default  # generation_config.json decides
    assert Sampling(enable_thinking=False).template_kwargs() == {"enable_thinking": False} and Sampling().template_kwargs() == {}


# --- server-sent events ------------------------------------------------------------------------

def _chunk(content=None, reasoning=None, **extra) -> str:
    delta = {k: v for k, v in (("content", content), ("reasoning_content", reasoning)) if v is not None}
    return json.dumps({"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta, **extra}]})


def test_sse_events_become_the_answer():
    raw = [b": keep-alive\n", b"\n", f"data: {_chunk(content='', role='assistant')}\n".encode(), b"\n",
           f"data: {_chunk(reasoning='let me see')}\r\n".encode(), b"\r\n",
           f"data: {_chunk(content='Hel')}\n".encode(), b"\n", b"event: message\n", b"id: 3\n",
           f"data: {_chunk(content='lo')}\n".encode(), b"\n",
           f"data: {_chunk(content=None, finish_reason='stop')}\n".encode(), b"\n",
           b"data: [DONE]\n", b"\n", f"data: {_chunk(content='after done')}\n".encode(), b"\n"]
    pieces = list(chat_pieces(sse_data(raw)))
    assert pieces == ["let me see", "Hel", "lo"] and isinstance(pieces[0], Reasoning)
    assert assemble(pieces) == "Hello"
    # one event's data over two lines is one payload joined by a newline; a last event without its blank line counts
    assert list(sse_data([b"data: {\"a\":\n", b"data: 1}\n", b"\n", b"data: tail"])) == ['{"a":\n1}', "tail"]


def test_an_error_event_is_a_check_failure():
    with pytest.raises(CheckFailed, match="failed mid-answer: out of memory"):
        list(chat_pieces(sse_data([b'data: {"error": {"message": "out of memory"}}\n', b"\n"])))
    with pytest.raises(CheckFailed, match="not JSON"):
        list(chat_pieces(["<html>"]))


def test_endpoint_url_forms_and_model_choice():
    assert {base_url(u) for u in ("http://h:8000", "http://h:8000/", "http://h:8000/v1", "http://h:8000/v1/chat/completions")} \
        == {"http://h:8000"}
    with pytest.raises(UsageError):
        base_url("h:8000")
    assert pick_model([{"id": "base"}, {"id": "ft-step-2", "parent": "base"}], "u") == "ft-step-2"  # vLLM: the adapter
    assert pick_model([{"id": "/exports/step-3"}], "u") == "/exports/step-3"
    with pytest.raises(UsageError, match="lists no model"):
        pick_model([], "u")


class _Server:
    """A loopback OpenAI-style server: /v1/models and a streamed /v1/chat/completions (canned chunks)."""

    def __init__(self, models: list[dict], chunks: list[str], status: int = 200, gate: threading.Event | None = None):
        """``gate``: after the first chunk the server waits for it (the client must have the first
        piece before the rest is sent); ``held`` says whether it was set in time."""
        self.requests: list[tuple[dict, dict]] = []
        self.held: list[bool] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _send(self, code: int, body: bytes, kind: str) -> None:
                self.send_response(code)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                self._send(200, json.dumps({"object": "list", "data": models}).encode(), "application/json")

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.requests.append((body, dict(self.headers)))
                if status != 200:
                    self._send(status, json.dumps({"detail": "model not loaded"}).encode(), "application/json")
                    return
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                for i, event in enumerate([*(f"data: {c}\n\n" for c in chunks), "data: [DONE]\n\n"]):
                    data = event.encode()
                    self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                    self.wfile.flush()
                    if i == 0 and gate is not None:
                        outer.held.append(gate.wait(30))
                self.wfile.write(b"0\r\n\r\n")

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def test_endpoint_streams_an_answer_over_http_and_sends_what_was_chosen():
    server = _Server([{"id": "base"}, {"id": "ft-step-2", "parent": "base"}],
                     [_chunk(content="", role="assistant"), _chunk(content="4"), _chunk(content="2.")])
    try:
        engine = open_endpoint(server.url + "/v1", environ={"OPENAI_API_KEY": "sk-test"})
        assert engine.model == "ft-step-2" and engine.description == f"ft-step-2 at {server.url}"
        messages = [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "6 times 7?"}]
        pieces = list(engine.stream(messages, Sampling(temperature=0, top_p=0.5, max_new_tokens=9, enable_thinking=False)))
        assert assemble(pieces) == "42."
        body, headers = server.requests[0]
        assert body == {"model": "ft-step-2", "messages": messages, "stream": True, "max_tokens": 9, "temperature": 0,
                        "chat_template_kwargs": {"enable_thinking": False}}  # greedy: no top_p
        assert headers["Authorization"] == "Bearer sk-test"
        list(engine.stream(messages, Sampling(max_new_tokens=5)))
        assert server.requests[1][0] == {"model": "ft-step-2", "messages": messages, "stream": True, "max_tokens": 5}
        with pytest.raises(UsageError, match="does not serve 'other'"):
            open_endpoint(server.url, model="other", environ={})
    finally:
        server.close()


def test_endpoint_refusal_is_a_check_failure_with_the_servers_words():
    server = _Server([{"id": "m"}], [], status=503)
    try:
        engine = EndpointEngine(server.url, "m")
        with pytest.raises(CheckFailed, match="HTTP 503: model not loaded"):
            list(engine.stream([{"role": "user", "content": "hi"}], Sampling()))
    finally:
        server.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_nothing_at_the_endpoint_is_exit_3_in_one_line(cli):
    with pytest.raises(EnvironmentProblem, match="nothing answers at"):
        open_endpoint(f"http://127.0.0.1:{_free_port()}", environ={})
    r = cli("chat", "--endpoint", f"http://127.0.0.1:{_free_port()}")
    assert_clean_error(r, code=3, contains="nothing answers at http://127.0.0.1")
    assert "trnqwen serve" in r.err


@pytest.mark.parametrize("args,words", [
    (["some-run", "--endpoint", "http://127.0.0.1:1"], "the endpoint answers with the model it serves"),
    (["--model", "m"], "--model names a model of an --endpoint"),
    (["--endpoint", "127.0.0.1:8000"], "is not an http(s) URL"),
    (["--temperature", "-1"], "-1"),
    (["no-such-run"], "no checkpoint or run named 'no-such-run'"),
    ([], "no previous run"),
])
def test_usage_errors_are_one_line_exit_2(cli, in_tmp, args, words):
    assert_clean_error(cli("chat", *args), code=2, contains=words)


def test_an_export_without_a_chat_template_is_refused_before_it_loads(cli, tmp_path):
    from tests.ckpt_fixtures import make_case
    from trnqwen.ckpt.model_folder import CardInfo, complete_export

    ckpt, assets, _ = make_case(tmp_path / "bare", tokenizer=True, architectures=["Qwen3ForCausalLM"])
    complete_export(ckpt / "step-3", assets, CardInfo(base_model="Qwen/Qwen3-0.6B", backend="native", steps=3))
    r = cli("chat", str(ckpt / "step-3"))
    assert_clean_error(r, code=2, contains="has no chat template")
    assert "loading" not in r.err


def test_an_adapters_own_tokenizer_is_its_runs_chat_template(tmp_path):
    """A run trained with --chat-template writes that template into the adapter export: chat renders with it."""
    from tests.ckpt_fixtures import char_tokenizer
    from trnqwen.chat.local import tokenizer_dir
    from trnqwen.evaluate.targets import EvalTarget

    base, adapter = tmp_path / "base", tmp_path / "adapter"
    for folder in (base, adapter):
        folder.mkdir()
    char_tokenizer(base)
    target = EvalTarget(label="a", folder=base, config_dir=base, adapter=adapter)
    assert tokenizer_dir(target) == base
    char_tokenizer(adapter)
    assert tokenizer_dir(target) == adapter


def test_a_note_is_printed_as_written_never_as_markup(capsys):
    from trnqwen.chat.session import terminal_io

    terminal_io().note("error: HTTP 404 at [/v1/models] ([bold]x[/bold])")
    assert "error: HTTP 404 at [/v1/models] ([bold]x[/bold])" in capsys.readouterr().err


def test_endpoint_pieces_arrive_before_the_answer_ends():
    """The first piece is read while the server still holds the rest back (a client that waited for
    the whole response would wait until the gate's timeout, and ``held`` would say False)."""
    gate = threading.Event()
    server = _Server([{"id": "m"}], [_chunk(content="first"), _chunk(content=" rest")], gate=gate)
    try:
        pieces = EndpointEngine(server.url, "m").stream([{"role": "user", "content": "hi"}], Sampling())
        assert next(pieces) == "first"
        gate.set()
        assert list(pieces) == [" rest"] and server.held == [True]
    finally:
        gate.set()
        server.close()
