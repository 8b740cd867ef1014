"""The recipe that writes ``tiny_chat/calculator.jsonl``: multi-turn chats with system prompts.

A few hundred short conversations in the ``messages`` format (calculator sums and unit
conversions, with follow-up questions that refer back to the previous answer) so the quickstart
and the tests can show a real chat fine-tune: system prompts, several assistant turns per
record, answers that depend on earlier turns.  Fully determined by the seed.

Regenerate (the file is committed; a test checks it matches this recipe):

    python -m trnqwen.data.chat_recipe            # rewrites trnqwen/data/tiny_chat/
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

SEED = 20261130
N_CONVERSATIONS = 300
CHAT_DIR = Path(__file__).resolve().parent / "tiny_chat"
CHAT_NAME = "calculator.jsonl"

_SYSTEM = [
    "You are a calculator. Answer with the result in one short sentence.",
    "You are a helpful assistant who converts units and does arithmetic. Be brief.",
    "You are a precise maths tutor. Give the answer, then stop.",
]
_OPS = {
    "plus": lambda a, b: a + b,
    "minus": lambda a, b: a - b,
    "times": lambda a, b: a * b,
}
# (unit, base unit, factor to base, plural)
_UNITS = {
    "length": [("metre", 1000, "metres"), ("centimetre", 10, "centimetres"), ("millimetre", 1, "millimetres"),
               ("kilometre", 1_000_000, "kilometres")],
    "mass": [("kilogram", 1000, "kilograms"), ("gram", 1, "grams")],
    "time": [("hour", 3600, "hours"), ("minute", 60, "minutes"), ("second", 1, "seconds")],
}


def _plural(n: int, unit: tuple[str, int, str]) -> str:
    return f"{n} {unit[0] if n == 1 else unit[2]}"


def _arithmetic(rng: random.Random) -> list[dict[str, str]]:
    a, b = rng.randint(2, 99), rng.randint(2, 99)
    op = rng.choice(sorted(_OPS))
    result = _OPS[op](a, b)
    turns = [
        {"role": "user", "content": rng.choice([f"What is {a} {op} {b}?", f"Compute {a} {op} {b}.", f"{a} {op} {b}?"])},
        {"role": "assistant", "content": f"{a} {op} {b} is {result}."},
    ]
    for _ in range(rng.randint(0, 2)):  # follow-ups use the previous answer
        op2 = rng.choice(sorted(_OPS))
        c = rng.randint(2, 12)
        new = _OPS[op2](result, c)
        turns.append({"role": "user", "content": rng.choice([f"And {op2} {c}?", f"Now {op2} {c}.", f"Then {op2} {c}?"])})
        turns.append({"role": "assistant", "content": f"{result} {op2} {c} is {new}."})
        result = new
    return turns


def _conversion(rng: random.Random) -> list[dict[str, str]]:
    units = _UNITS[rng.choice(sorted(_UNITS))]
    src, dst = rng.sample(units, 2)
    if src[1] < dst[1]:  # convert from the larger unit so the answers stay whole numbers
        src, dst = dst, src
    n = rng.randint(1, 30)
    turns = [
        {"role": "user", "content": f"How many {dst[2]} are in {_plural(n, src)}?"},
        {"role": "assistant", "content": f"{_plural(n, src)} is {_plural(n * src[1] // dst[1], dst)}."},
    ]
    others = [u for u in units if u not in (src, dst) and u[1] <= src[1]]
    if others and rng.random() < 0.6:
        third = rng.choice(others)
        turns.append({"role": "user", "content": f"And in {third[2]}?"})
        turns.append({"role": "assistant", "content": f"{_plural(n, src)} is {_plural(n * src[1] // third[1], third)}."})
    return turns


def build(seed: int = SEED) -> list[list[dict[str, str]]]:
    rng = random.Random(seed)
    conversations = []
    for _ in range(N_CONVERSATIONS):
        turns = _arithmetic(rng) if rng.random() < 0.5 else _conversion(rng)
        if rng.random() < 0.85:
            turns = [{"role": "system", "content": rng.choice(_SYSTEM)}] + turns
        conversations.append(turns)
    return conversations


def render(seed: int = SEED) -> str:
    return "".join(json.dumps({"messages": m}, ensure_ascii=False) + "\n" for m in build(seed))


def chat_path() -> Path:
    return CHAT_DIR / CHAT_NAME


def write(dest: Path = CHAT_DIR, seed: int = SEED) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    path = dest / CHAT_NAME
    path.write_text(render(seed), encoding="utf-8")
    return path


if __name__ == "__main__":  # pragma: no cover
    print(write(Path(sys.argv[1]) if len(sys.argv) > 1 else CHAT_DIR))
