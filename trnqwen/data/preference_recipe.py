"""The recipe that writes ``tiny_prefs/calculator_pairs.jsonl``: preference pairs for preference tuning.

Built from the bundled calculator chats (:mod:`trnqwen.data.chat_recipe`): the prompt is a chat up
to one of its user questions (system prompt and earlier turns included), the chosen answer is the
correct one and the rejected answer the same sentence with a wrong number, so a preference-tuned
model must learn to prefer the right result.  Half the records are TRL's
``prompt``/``chosen``/``rejected`` with message lists, half the UltraFeedback-binarized shape
(each side the whole conversation), so both readers are exercised by the quickstart.  Fully
determined by the seed.

Regenerate (the file is committed; a test checks it matches this recipe):

    python -m trnqwen.data.preference_recipe        # rewrites trnqwen/data/tiny_prefs/
"""

from __future__ import annotations

import json
import random
import re
import sys
from pathlib import Path

from trnqwen.data import chat_recipe

SEED = 20261201
PREFS_DIR = Path(__file__).resolve().parent / "tiny_prefs"
PREFS_NAME = "calculator_pairs.jsonl"
_NUMBER = re.compile(r"-?\d+")


def _wrong(answer: str, rng: random.Random) -> str:
    """The answer with its last number changed (never to itself)."""
    numbers = list(_NUMBER.finditer(answer))
    last = numbers[-1]
    value = int(last.group())
    delta = rng.choice([-1, 1]) * rng.choice([1, 2, 10, max(1, abs(value) // 2)])
    return answer[: last.start()] + str(value + delta) + answer[last.end():]


def build(seed: int = SEED) -> list[dict]:
    rng = random.Random(seed)
    records = []
    for i, messages in enumerate(chat_recipe.build()):
        answers = [k for k, m in enumerate(messages) if m["role"] == "assistant" and _NUMBER.search(m["content"])]
        k = rng.choice(answers)
        prompt, chosen = messages[:k], messages[k]["content"]
        rejected = _wrong(chosen, rng)
        if i % 2 == 0:
            records.append({"prompt": prompt, "chosen": [{"role": "assistant", "content": chosen}],
                            "rejected": [{"role": "assistant", "content": rejected}]})
        else:  # UltraFeedback-binarized: each side carries the conversation
            records.append({"prompt": prompt[-1]["content"],
                            "chosen": prompt + [{"role": "assistant", "content": chosen}],
                            "rejected": prompt + [{"role": "assistant", "content": rejected}]})
    return records


def render(seed: int = SEED) -> str:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in build(seed))


def prefs_path() -> Path:
    return PREFS_DIR / PREFS_NAME


def write(dest: Path = PREFS_DIR, seed: int = SEED) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    path = dest / PREFS_NAME
    path.write_text(render(seed), encoding="utf-8")
    return path


if __name__ == "__main__":  # pragma: no cover
    print(write(Path(sys.argv[1]) if len(sys.argv) > 1 else PREFS_DIR))
