"""The recipe that writes ``harness/calculator_choice.jsonl``: trnqwen's own lm-evaluation-harness task.

Questions of the bundled calculator chats (``tiny_chat/calculator.jsonl``'s generator, another
seed, so none is a training question), each with its right answer and three answers whose
number is wrong, in the shape of a harness ``multiple_choice`` task: the model is scored on
whether it gives the right sentence the highest log-likelihood (``acc``).  Offline and a
minute on a CPU, so the quickstart and the tests run a real harness evaluation; a fine-tune on
the calculator chats should raise it, a damaged model lowers it.  Fully determined by the seed.

Regenerate (the file is committed; a test checks it matches this recipe):

    python -m trnqwen.data.harness_recipe            # rewrites trnqwen/data/harness/
"""

from __future__ import annotations

import json
import random
import re
import sys
from pathlib import Path

from trnqwen.data.chat_recipe import build

SEED = 20261204  # not the chat set's: held-out questions
N_QUESTIONS = 40
N_WRONG = 3
HARNESS_DIR = Path(__file__).resolve().parent / "harness"
TASK_FILE = "calculator_choice.jsonl"
_NUMBER = re.compile(r"-?\d+")


def _wrong_numbers(right: int, rng: random.Random) -> list[int]:
    wrong: set[int] = set()
    while len(wrong) < N_WRONG:
        candidate = right + rng.choice((-1, 1)) * rng.randint(1, max(3, abs(right) // 5 + 1))
        if candidate != right:
            wrong.add(candidate)
    return sorted(wrong)


def records(seed: int = SEED) -> list[dict]:
    """``{"question", "choices", "gold"}``: the first question of a conversation, its answer among
    ``N_WRONG`` others that differ only in the final number, at a seeded place."""
    rng = random.Random(seed)
    out = []
    for turns in build(seed)[:N_QUESTIONS]:
        question = next(t["content"] for t in turns if t["role"] == "user")
        answer = next(t["content"] for t in turns if t["role"] == "assistant")
        last = list(_NUMBER.finditer(answer))[-1]
        choices = [answer] + [answer[:last.start()] + str(n) + answer[last.end():]
                              for n in _wrong_numbers(int(last.group()), rng)]
        rng.shuffle(choices)
        out.append({"question": question, "choices": choices, "gold": choices.index(answer)})
    return out


def render(seed: int = SEED) -> str:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records(seed))


def task_path() -> Path:
    return HARNESS_DIR / TASK_FILE


def write(dest: Path = HARNESS_DIR, seed: int = SEED) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    path = dest / TASK_FILE
    path.write_text(render(seed), encoding="utf-8")
    return path


if __name__ == "__main__":  # pragma: no cover
    print(write(Path(sys.argv[1]) if len(sys.argv) > 1 else HARNESS_DIR))
