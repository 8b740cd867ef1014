"""The recipe that writes ``tiny_corpus/``: plain English made from templates and a fixed seed.

The corpus is small (a few hundred KB), readable and consistent: the same invented world
(towns, rivers, people, animals) appears in stories, descriptions, letters, how-tos and
arithmetic, and the chat file asks questions whose answers are in that world.  That makes it
learnable in a few steps, which is what the tiny model needs to show a falling loss.

Regenerate (the files are committed; a test checks they match this recipe):

    python -m trnqwen.data.corpus_recipe            # rewrites trnqwen/data/tiny_corpus/
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

SEED = 20260101
N_TOWNS = 60
N_FABLES = 260
N_LETTERS = 120
N_HOWTOS = 90
N_DIARY = 140
N_SUMS = 160
N_DIALOGUES = 120
N_CHATS = 700

CORPUS_DIR = Path(__file__).resolve().parent / "tiny_corpus"
TEXT_NAME = "corpus.txt"
CHAT_NAME = "chat.jsonl"

# --- the vocabulary of the world --------------------------------------------------------

_SYLLABLES_A = ["Ash", "Bram", "Cal", "Dun", "El", "Fern", "Glen", "Hol", "Ivy", "Kel", "Lin", "Mar",
                "Nor", "Oak", "Pen", "Quen", "Ros", "Stan", "Thorn", "Wil", "Yar", "Bel", "Cor", "Dal"]
_SYLLABLES_B = ["ford", "by", "wick", "ton", "mere", "dale", "brook", "field", "holt", "stead", "wood",
                "haven", "moor", "cross", "well", "bridge", "combe", "ley"]
_RIVERS = ["Alder", "Bren", "Colne", "Derwen", "Esk", "Frome", "Greta", "Hodder", "Isla", "Kennet",
           "Lune", "Medway", "Nidd", "Ouse", "Perry", "Rother", "Swale", "Teme", "Ure", "Wyre"]
_FIRST = ["Anna", "Ben", "Clara", "Daniel", "Edith", "Frank", "Grace", "Henry", "Iris", "James",
          "Kate", "Leo", "Mary", "Nathan", "Olive", "Peter", "Rose", "Samuel", "Tom", "Una",
          "Victor", "Walter", "Alice", "Hugh", "Martha", "Oscar", "Ruth", "Simon", "Lucy", "Arthur"]
_SURNAMES = ["Baker", "Carter", "Fisher", "Hill", "Miller", "Potter", "Shaw", "Turner", "Ward", "Wood",
             "Cooper", "Fletcher", "Mason", "Parker", "Reed", "Thatcher", "Webb", "Young"]
_JOBS = ["farmers", "weavers", "millers", "fishermen", "potters", "carpenters", "bakers",
         "shepherds", "blacksmiths", "boatbuilders", "teachers", "gardeners"]
_GOODS = ["apples", "wool", "cheese", "honey", "bread", "pottery", "rope", "baskets", "cider",
          "candles", "linen", "boats"]
_LANDMARKS = ["an old stone bridge", "a tall clock tower", "a round market hall", "a windmill with white sails",
              "a narrow lane of red houses", "a library with a green door", "a chapel on the hill",
              "a harbour full of small boats", "a walled garden", "a long avenue of lime trees"]
_KINDS = ["market", "river", "hill", "harbour", "mill", "farming", "quiet", "busy"]
_SEASONS = ["spring", "summer", "autumn", "winter"]
_SEASON_SCENES = {
    "spring": ["the orchards are white with blossom", "lambs play in the low fields", "the river runs high and fast"],
    "summer": ["children swim below the weir", "the fields turn gold", "people eat supper outside their doors"],
    "autumn": ["the apples are pressed for cider", "mist lies on the water every morning", "the woods turn red and brown"],
    "winter": ["the lanes are white with frost", "smoke rises from every chimney", "the ponds freeze and the children skate"],
}
_ANIMALS = ["fox", "crow", "hare", "tortoise", "mouse", "owl", "badger", "goose", "cat", "dog",
            "lion", "wolf", "goat", "frog", "heron", "squirrel", "bear", "sparrow", "horse", "ant"]
_ADJ = ["clever", "proud", "patient", "greedy", "kind", "lazy", "brave", "foolish", "quiet", "hungry",
        "careful", "cheerful", "stubborn", "gentle", "curious", "boastful"]
_HOMES = ["under the roots of an old oak", "at the edge of a wide meadow", "beside a cold clear stream",
          "in a hollow on the side of a hill", "near the gate of a farmyard", "in the reeds by a lake",
          "on the top branch of a pine tree", "behind a mossy wall"]
_HABITS = ["gathered seeds for the winter", "sang to the rising sun", "counted its treasures",
           "watched the road for travellers", "slept in the warm grass", "practised running along the lane",
           "looked for berries in the hedges", "told stories to anyone who would listen"]
_TROUBLES = ["a long dry summer came and the stream grew thin", "a storm blew down half of the wood",
             "the farmer set a trap by the gate", "a hard frost covered the fields for many days",
             "a flood carried away the bridge", "a stranger came and claimed the meadow"]
_MORALS = [
    ("Slow and steady wins the race", "patience"),
    ("Look before you leap", "care"),
    ("A friend in need is a friend indeed", "friendship"),
    ("Pride goes before a fall", "humility"),
    ("Those who work in summer eat in winter", "work"),
    ("Kindness is never wasted", "kindness"),
    ("Many hands make light work", "sharing"),
    ("Do not count your chickens before they hatch", "hope"),
    ("It is easy to be brave from a safe distance", "courage"),
    ("Honesty is the best policy", "honesty"),
]
_MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September",
           "October", "November", "December"]
_DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
_WEATHER = ["It rained all morning and cleared in the afternoon.", "The sky was bright and the wind was cold.",
            "A thick fog hid the hills until noon.", "It was warm and still, with a few high clouds.",
            "Snow fell quietly through the night.", "A strong wind rattled the windows all day."]
_ACTIVITIES = ["walked to the market and bought {good}", "mended the fence by the lower field",
               "wrote a long letter to {friend}", "read by the fire until late",
               "helped {friend} carry {good} to the boat", "planted beans in the garden",
               "cleaned the kitchen and baked bread", "went fishing on the {river} and caught two trout",
               "visited {friend}, who was ill, and took some soup", "sorted old books in the attic"]
_TASKS = [
    ("bake a simple loaf of bread", ["mix flour, water, salt and yeast in a large bowl",
                                      "knead the dough for ten minutes until it is smooth",
                                      "leave it in a warm place for an hour to rise",
                                      "shape it into a loaf and put it in a tin",
                                      "bake it in a hot oven for thirty minutes"]),
    ("plant a tree", ["choose a sunny place with good soil", "dig a hole twice as wide as the roots",
                      "set the tree in the hole and spread the roots", "fill the hole with soil and press it down",
                      "water the tree well and keep watering it through the first summer"]),
    ("make a cup of tea", ["fill the kettle with fresh water and boil it", "warm the pot with a little hot water",
                           "put one spoon of tea in the pot for each person", "pour in the boiling water",
                           "wait four minutes and then pour"]),
    ("light a camp fire safely", ["clear a circle of ground down to bare earth", "gather dry twigs and larger sticks",
                                  "build a small cone of twigs over some dry grass", "light the grass and add sticks slowly",
                                  "keep water close and put the fire out completely before you leave"]),
    ("wash a wool jumper", ["fill a basin with cool water and a little soap", "press the jumper gently under the water",
                            "do not rub or twist the wool", "rinse it twice in clean water",
                            "lay it flat on a towel to dry"]),
    ("keep a garden diary", ["buy a notebook with strong pages", "write the date at the top of each page",
                             "note the weather and what you planted", "draw a small map of the beds",
                             "read last year's pages before you plan the next season"]),
    ("row a small boat", ["sit in the middle of the boat facing the back", "hold one oar in each hand",
                          "lean forward and dip both blades in the water", "pull the oars towards you with straight arms",
                          "lift the blades out and repeat with a steady rhythm"]),
    ("make apple jam", ["peel and chop the apples", "cook them slowly with a little water",
                        "add the same weight of sugar", "boil until a drop sets on a cold plate",
                        "pour the jam into clean warm jars"]),
    ("learn a new song", ["listen to the whole song three times", "learn the words of the first verse",
                          "hum the tune until it feels easy", "sing one line at a time with the music",
                          "sing it every day for a week"]),
]
_ONES = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven",
         "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen"]
_TENS = ["", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"]
_COLOURS = ["red", "blue", "green", "yellow", "white", "black", "brown", "grey"]


def number_words(n: int) -> str:
    """English words for 0..999."""
    if n < 20:
        return _ONES[n]
    if n < 100:
        tens, ones = divmod(n, 10)
        return _TENS[tens] + ("" if ones == 0 else "-" + _ONES[ones])
    hundreds, rest = divmod(n, 100)
    head = _ONES[hundreds] + " hundred"
    return head if rest == 0 else head + " and " + number_words(rest)


def _cap(text: str) -> str:
    return text[:1].upper() + text[1:]


def _article(word: str) -> str:
    return ("an " if word[:1] in "aeiou" else "a ") + word


class _World:
    """Towns and people, drawn once so every text about a town agrees with every other."""

    def __init__(self, rng: random.Random):
        names: list[str] = []
        while len(names) < N_TOWNS:
            name = rng.choice(_SYLLABLES_A) + rng.choice(_SYLLABLES_B)
            if name not in names:
                names.append(name)
        self.towns = []
        for name in names:
            self.towns.append(
                {
                    "name": name,
                    "river": rng.choice(_RIVERS),
                    "bank": rng.choice(["north", "south", "east", "west"]),
                    "people": rng.randrange(3, 90) * 100,
                    "jobs": rng.sample(_JOBS, 2),
                    "good": rng.choice(_GOODS),
                    "landmark": rng.choice(_LANDMARKS),
                    "kind": rng.choice(_KINDS),
                    "season": rng.choice(_SEASONS),
                    "founded": rng.randrange(1100, 1900),
                    "door": rng.choice(_COLOURS),
                }
            )
        self.people = [f"{f} {s}" for f in _FIRST for s in _SURNAMES]
        rng.shuffle(self.people)


def _town_text(t: dict, rng: random.Random) -> str:
    scene = rng.choice(_SEASON_SCENES[t["season"]])
    return (
        f"{t['name']} is a small {t['kind']} town on the {t['bank']} bank of the river {t['river']}. "
        f"About {t['people']} people live there, and most of them work as {t['jobs'][0]} or {t['jobs'][1]}. "
        f"The town was founded in {t['founded']} and is best known for its {t['good']}. "
        f"In the middle of {t['name']} there is {t['landmark']}, and most of the front doors are painted {t['door']}. "
        f"Visitors say the best time to come is {t['season']}, when {scene}."
    )


def _fable(rng: random.Random) -> str:
    a, b = rng.sample(_ANIMALS, 2)
    adj, adj2 = rng.sample(_ADJ, 2)
    moral, lesson = rng.choice(_MORALS)
    home = rng.choice(_HOMES)
    habit = rng.choice(_HABITS)
    trouble = rng.choice(_TROUBLES)
    days = number_words(rng.randrange(2, 12))
    ending = rng.choice(
        [
            f"In the end the {a} was glad it had listened, and the two of them became good friends.",
            f"The {a} would not listen, and when the hard days came it had nothing left.",
            f"So the {a} learned something about {lesson}, and it never forgot the {b}.",
            f"After {days} days the trouble passed, and the {b} and the {a} laughed about it together.",
        ]
    )
    return (
        f"Once there was {_article(adj)} {a} who lived {home}. Every morning the {a} {habit}. "
        f"One day {_article(adj2)} {b} came by and said, \"Why do you work so hard? Come and rest with me.\" "
        f"The {a} thought about it for a while. Then {trouble}. "
        f"{ending} The moral of the story is this: {moral}."
    )


def _letter(world: _World, rng: random.Random) -> str:
    sender, friend = rng.sample(world.people, 2)
    t = rng.choice(world.towns)
    month = rng.choice(_MONTHS)
    return (
        f"Dear {friend.split()[0]},\n"
        f"Thank you for your letter, which reached me in {t['name']} on the last day of {month}. "
        f"We are all well here. The {t['river']} is higher than usual and the {t['jobs'][0]} are busy. "
        f"I have bought some of the famous {t['good']} for you and will bring a share when I visit. "
        f"Please give my best wishes to your family and write again soon.\n"
        f"Yours truly,\n{sender}"
    )


def _howto(rng: random.Random) -> str:
    task, steps = rng.choice(_TASKS)
    words = ["First", "Next", "Then", "After that", "Finally"]
    body = " ".join(f"{w}, {s}." for w, s in zip(words, steps))
    tip = rng.choice(["Take your time.", "It gets easier with practice.", "Ask a friend to help the first time.",
                      "Keep your tools clean and dry.", "Write down what worked for next time."])
    return f"How to {task}. {body} {tip}"


def _diary(world: _World, rng: random.Random) -> str:
    t = rng.choice(world.towns)
    friend = rng.choice(world.people)
    day = rng.choice(_DAYS)
    date = rng.randrange(1, 29)
    month = rng.choice(_MONTHS)
    acts = rng.sample(_ACTIVITIES, 2)
    filled = [a.format(good=t["good"], friend=friend, river=t["river"]) for a in acts]
    return (
        f"{day}, {date} {month}. {rng.choice(_WEATHER)} In the morning I {filled[0]}. "
        f"In the afternoon I {filled[1]}. In the evening the bells of {t['name']} rang for an hour, "
        f"and I went to bed early."
    )


def _sums(rng: random.Random) -> str:
    lines = []
    for _ in range(rng.randrange(3, 7)):
        a, b = rng.randrange(0, 100), rng.randrange(0, 100)
        op = rng.choice(["plus", "minus", "times"])
        if op == "plus":
            c = a + b
        elif op == "minus":
            a, b = max(a, b), min(a, b)
            c = a - b
        else:
            a, b = a % 13, b % 13
            c = a * b
        lines.append(f"{_cap(number_words(a))} {op} {number_words(b)} is {number_words(c)}, or {a} {op} {b} = {c}.")
    return " ".join(lines)


def _dialogue(world: _World, rng: random.Random) -> str:
    p, q = rng.sample(world.people, 2)
    t = rng.choice(world.towns)
    pn, qn = p.split()[0], q.split()[0]
    return (
        f"{pn}: Good morning, {qn}. Are you going to {t['name']} today?\n"
        f"{qn}: Yes, I am taking the road along the {t['river']}. I want to buy some {t['good']}.\n"
        f"{pn}: Then look for {t['landmark']}. The best shop is just beside it.\n"
        f"{qn}: Thank you. Shall I bring you anything?\n"
        f"{pn}: Only a loaf of bread, if you have room in your basket."
    )


def _chat(world: _World, rng: random.Random) -> list[dict[str, str]]:
    kind = rng.randrange(6)
    t = rng.choice(world.towns)
    if kind == 0:
        q, a = f"Which river is {t['name']} on?", f"{t['name']} is on the {t['bank']} bank of the river {t['river']}."
    elif kind == 1:
        q, a = f"What is {t['name']} known for?", f"{t['name']} is best known for its {t['good']}."
    elif kind == 2:
        q = f"How many people live in {t['name']}?"
        a = f"About {t['people']} people live in {t['name']}. Most of them work as {t['jobs'][0]} or {t['jobs'][1]}."
    elif kind == 3:
        x, y = rng.randrange(0, 100), rng.randrange(0, 100)
        q, a = f"What is {x} plus {y}?", f"{x} plus {y} is {x + y}."
    elif kind == 4:
        word = rng.choice(_ANIMALS + _GOODS + _JOBS)
        q, a = f"Spell the word \"{word}\" backwards.", f"\"{word}\" backwards is \"{word[::-1]}\"."
    else:
        task, steps = rng.choice(_TASKS)
        q, a = f"How do I {task}?", f"First, {steps[0]}. Then, {steps[1]}. Finally, {steps[-1]}."
    messages = []
    if rng.random() < 0.3:
        messages.append({"role": "system", "content": "You are a helpful assistant who answers briefly."})
    messages += [{"role": "user", "content": q}, {"role": "assistant", "content": a}]
    return messages


def build(seed: int = SEED) -> tuple[list[str], list[list[dict[str, str]]]]:
    """The documents and the chat conversations, fully determined by ``seed``."""
    rng = random.Random(seed)
    world = _World(rng)
    docs: list[str] = [_town_text(t, rng) for t in world.towns]
    docs += [_fable(rng) for _ in range(N_FABLES)]
    docs += [_letter(world, rng) for _ in range(N_LETTERS)]
    docs += [_howto(rng) for _ in range(N_HOWTOS)]
    docs += [_diary(world, rng) for _ in range(N_DIARY)]
    docs += [_sums(rng) for _ in range(N_SUMS)]
    docs += [_dialogue(world, rng) for _ in range(N_DIALOGUES)]
    rng.shuffle(docs)
    chats = [_chat(world, rng) for _ in range(N_CHATS)]
    return docs, chats


def render(seed: int = SEED) -> dict[str, str]:
    """File name -> exact file text."""
    docs, chats = build(seed)
    text = "\n\n".join(docs) + "\n"
    chat = "".join(json.dumps({"messages": m}, ensure_ascii=False) + "\n" for m in chats)
    return {TEXT_NAME: text, CHAT_NAME: chat}


def write(dest: Path = CORPUS_DIR, seed: int = SEED) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    for name, text in render(seed).items():
        (dest / name).write_text(text, encoding="utf-8")


if __name__ == "__main__":  # pragma: no cover
    write(Path(sys.argv[1]) if len(sys.argv) > 1 else CORPUS_DIR)
