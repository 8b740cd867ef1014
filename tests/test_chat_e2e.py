"""``trnqwen chat`` in a real terminal: tmux runs it, keys are typed, the pane is read.

One tiny Qwen3 export (untied, a character tokenizer, ChatML: its greedy answers change with the whole
conversation, so a lost turn or system prompt changes them).  In this process's place and through a
real ``trnqwen serve`` (transformers serve on loopback, started once): two questions, ``/reset``, the
first question again, then ``/exit`` (Ctrl-C at the prompt through the endpoint).  At temperature 0
each answer on the pane is transformers' own greedy generation on the chat-templated conversation,
the question after ``/reset`` answers as the first did, and the chat exits 0.  Piped questions (no
terminal) print the answers alone.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from tests.helpers import REPO_ROOT, TRNQWEN

SYSTEM = "Add."
QUESTIONS = ("2 plus 3?", "And 4?")
MAX_NEW = 10


@pytest.fixture(scope="module")
def chat_model(tmp_path_factory) -> dict:
    """The export and the greedy answers transformers gives: to Q1, and to Q2 after Q1 and its answer."""
    from transformers import AutoTokenizer

    from tests.ckpt_fixtures import char_tokenizer, make_case
    from trnqwen.ckpt.generate import generate
    from trnqwen.ckpt.layout import find_config, resolve_checkpoint
    from trnqwen.ckpt.model_folder import CardInfo, complete_export
    from trnqwen.dataset.template import BUILTIN, export_template

    root = tmp_path_factory.mktemp("chat")
    ckpt, assets, _ = make_case(root / "m", tied=False, architectures=["Qwen3ForCausalLM"], seed=2,
                                max_position_embeddings=512)
    char_tokenizer(assets)
    export_template(assets, BUILTIN["chatml"])
    model = ckpt / "step-3"
    complete_export(model, assets, CardInfo(base_model="Qwen/Qwen3-0.6B", backend="native", steps=3))

    tokenizer = AutoTokenizer.from_pretrained(str(model))
    found = resolve_checkpoint(model)

    def greedy(messages: list[dict]) -> str:
        prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        out = generate(found, find_config(found), prompt, max_new_tokens=MAX_NEW, device="cpu")
        assert out["error"] is None, out
        return out["completion"]

    conversation = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTIONS[0]}]
    first = greedy(conversation)
    second = greedy([*conversation, {"role": "assistant", "content": first}, {"role": "user", "content": QUESTIONS[1]}])
    alone = greedy([{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTIONS[1]}])
    assert first.strip() and second.strip()
    assert second != alone, "the model must answer Q2 differently without Q1, or the test cannot see a lost turn"
    return {"model": model, "answers": (first, second)}


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO_ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
            "HF_HUB_OFFLINE": "1", "PYTHONIOENCODING": "utf-8", "LANG": "C.UTF-8", "TERM": "xterm"}


class Tmux:
    """One tmux server of this test's own (its socket in tmp_path), one session running ``argv``; the
    pane's text stays after the command ends, with its exit code."""

    def __init__(self, tmp_path: Path, argv: list[str]):
        self.base = ["tmux", "-S", str(tmp_path / "tmux.sock")]
        shell = f"{shlex.join(argv)}; echo \"[chat exited $?]\"; sleep 600"
        subprocess.run([*self.base, "-u", "new-session", "-d", "-s", "chat", "-x", "220", "-y", "60", shell],
                       check=True, env=_env(), cwd=tmp_path)

    def pane(self) -> str:
        return subprocess.run([*self.base, "capture-pane", "-p", "-J", "-t", "chat", "-S", "-2000"], check=True,
                              capture_output=True, text=True).stdout

    def type(self, text: str) -> None:
        subprocess.run([*self.base, "send-keys", "-t", "chat", "-l", text], check=True)
        self.key("Enter")

    def key(self, name: str) -> None:
        subprocess.run([*self.base, "send-keys", "-t", "chat", name], check=True)

    def wait_for(self, done, what: str, timeout: float = 180) -> str:
        deadline = time.monotonic() + timeout
        while True:
            text = self.pane()
            if done(text):
                return text
            if time.monotonic() > deadline or "[chat exited" in text:
                raise AssertionError(f"no {what} on the pane:\n{text}")
            time.sleep(0.2)

    def close(self) -> None:
        subprocess.run([*self.base, "kill-server"], capture_output=True)


def _prompts(text: str) -> int:
    return sum(1 for line in text.splitlines() if line.startswith(">>>"))


def _at_prompt(count: int):
    return lambda text: _prompts(text) >= count and text.rstrip().endswith(">>>")


def _answers(text: str) -> dict[int, str]:
    """Each question's answer: the lines between its ``>>> question`` line and the next ``>>>``."""
    segments = text.split("\n>>> ")
    out = {}
    for i, segment in enumerate(segments[1:], 1):
        question, _, answer = segment.partition("\n")
        if question and not question.startswith("/"):
            out[i] = answer
    return out


def _shown(answer: str) -> str:
    """How the pane shows an answer: the chat ends it with a newline unless it ended with one."""
    return answer[:-1] if answer.endswith("\n") else answer


def _converse(tmux: Tmux, answers: tuple[str, str], leave: str) -> str:
    """Q1, Q2, /reset, Q1, then ``leave``: ``/exit`` typed, or a key (C-c, C-d) at the prompt."""
    tmux.wait_for(_at_prompt(1), "first prompt")
    tmux.type(QUESTIONS[0])
    tmux.wait_for(_at_prompt(2), "answer to the first question")
    tmux.type(QUESTIONS[1])
    tmux.wait_for(_at_prompt(3), "answer to the second question")
    tmux.type("/reset")
    tmux.wait_for(lambda t: _at_prompt(4)(t) and "the conversation starts over" in t, "reset")
    tmux.type(QUESTIONS[0])
    tmux.wait_for(_at_prompt(5), "answer after /reset")
    if leave.startswith("/"):
        tmux.type(leave)
    else:
        tmux.key(leave)
    text = tmux.wait_for(lambda t: "[chat exited" in t, "exit")
    assert "[chat exited 0]" in text and "Traceback" not in text, text
    got = _answers(text)
    first, second = (_shown(a) for a in answers)
    # the questions as typed, each answer the greedy one; after /reset the first question answers as before
    assert [line for line in text.splitlines() if line.startswith(">>> ")][:4] == [
        f">>> {QUESTIONS[0]}", f">>> {QUESTIONS[1]}", ">>> /reset", f">>> {QUESTIONS[0]}"], text
    assert got == {1: first, 2: second, 4: first}, (got, answers, text)
    return text


def _tmux() -> None:
    if shutil.which("tmux") is None:
        pytest.skip("tmux is not installed (apt-get install tmux; .ci/run installs it)")


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_chat_in_a_terminal_answers_as_greedy_generation(chat_model, tmp_path):
    _tmux()
    tmux = Tmux(tmp_path, [*TRNQWEN, "chat", str(chat_model["model"]), "--temperature", "0", "--max-new-tokens",
                           str(MAX_NEW), "--system", SYSTEM, "--device", "cpu"])
    try:
        text = _converse(tmux, chat_model["answers"], "/exit")
        assert f"chatting with {chat_model['model']} (in this process, cpu)" in text
    finally:
        tmux.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
@pytest.mark.timeout(360)
def test_chat_through_trnqwen_serve_answers_as_greedy_generation(chat_model, tmp_path):
    """The same conversation through a real `trnqwen serve` (transformers serve): streamed answers over SSE."""
    _tmux()
    model = chat_model["model"]
    port = _free_port()
    server = subprocess.Popen([*TRNQWEN, "serve", str(model), "--port", str(port), "--engine", "transformers"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env())
    tmux = None
    try:
        assert server.stdout is not None
        for line in server.stdout:
            if line.startswith("try: curl"):
                break
        assert server.poll() is None, server.stderr.read()
        tmux = Tmux(tmp_path, [*TRNQWEN, "chat", "--endpoint", f"http://127.0.0.1:{port}", "--temperature", "0",
                               "--max-new-tokens", str(MAX_NEW), "--system", SYSTEM])
        text = _converse(tmux, chat_model["answers"], "C-c")  # Ctrl-C at the prompt leaves, exit 0
        assert f"chatting with {model} at http://127.0.0.1:{port}" in text
    finally:
        if tmux is not None:
            tmux.close()
        if server.poll() is None:
            server.send_signal(signal.SIGINT)
            try:
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_piped_questions_print_the_answers_alone(chat_model, tmp_path):
    """No terminal: stdin's lines are the questions, stdout the answers only (no prompt, no notes); the
    end of the input (Ctrl-D's) leaves, exit 0."""
    proc = subprocess.run([*TRNQWEN, "chat", str(chat_model["model"]), "--temperature", "0", "--max-new-tokens",
                           str(MAX_NEW), "--system", SYSTEM], input="\n".join(QUESTIONS) + "\n", capture_output=True,
                          text=True, env=_env(), timeout=280, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "".join(_shown(a) + "\n" for a in chat_model["answers"])
    assert "chatting with" in proc.stderr and "Traceback" not in proc.stderr



@pytest.mark.slow
@pytest.mark.timeout(300)
def test_an_adapter_answers_on_its_base_as_peft_does(chat_model, tmp_path):
    """A LoRA adapter export (no tokenizer of its own) is loaded on its base, as eval loads it: the
    greedy answer is peft's own generation on the base + adapter, and not the base's answer."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tests.lora_fixtures import make_adapter
    from trnqwen.chat.engines import open_engine
    from trnqwen.chat.session import Sampling, assemble

    model = chat_model["model"]
    adapter = make_adapter(tmp_path / "lora" / "hf" / "step-2", model, rank=8, seed=1)
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTIONS[0]}]
    engine = open_engine(str(adapter), runs_dir=tmp_path / "runs", device="cpu")
    assert engine.description.startswith(f"{adapter} (LoRA adapter)")
    answer = assemble(engine.stream(messages, Sampling(temperature=0, max_new_tokens=MAX_NEW)))

    tokenizer = AutoTokenizer.from_pretrained(str(model))
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    peft = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(str(model), dtype=torch.bfloat16), str(adapter))
    with torch.no_grad():
        out = peft.generate(**ids, max_new_tokens=MAX_NEW, do_sample=False, pad_token_id=tokenizer.eos_token_id)
    expected = tokenizer.decode(out[0, ids["input_ids"].shape[1]:], skip_special_tokens=True)
    assert answer == expected and answer.strip(), (answer, expected)
    assert answer != chat_model["answers"][0], "the adapter changed nothing: was it loaded?"

