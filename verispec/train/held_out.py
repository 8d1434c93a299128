"""The held-out scoring set: dev-like prompts that no training source overlaps.

Four prompts for each of Spec-Bench's thirteen categories (writing, roleplay, reasoning,
math, coding, extraction, stem, humanities, translation, summarization, qa, math_reasoning,
rag), for judging a drafter by its acceptance on text it was not trained on. They are built
from the same kinds of material as the training sources (``verispec.train.sources``) but
disjoint from them: topics that no training source uses (``EVAL_TOPICS``), the reserved
standard-library modules (``verispec.train.stdlib_texts.is_reserved``), and task wording of
their own. Nothing is taken from Spec-Bench; the multi-turn categories are single turns here.
"""

from __future__ import annotations

import re

from verispec.train.prompts import Messages, user
from verispec.train.stdlib_texts import first_paragraph, stdlib_index

# Held-out scoring set: topics no training source uses, wording of its own, reserved modules.
EVAL_TOPICS = (
    "the Silk Road", "sourdough starters", "solar eclipses", "electric scooters", "the printing press",
    "octopuses", "blood donation", "rock climbing", "hydroponics", "Roman aqueducts", "earthquakes",
    "noise-cancelling headphones", "the Renaissance", "meditation", "migratory birds", "sign language",
    "black holes", "jet lag", "the Olympic Games", "wildfires",
)  # fmt: skip
EVAL_WRITING = (
    "Compose a warm welcome speech for a club devoted to {topic}.",
    "Draft a blog post of about two hundred words on {topic}, with a catchy headline.",
    "Pen a short fable in which {topic} teaches someone a lesson.",
    "Create an advertisement script, thirty seconds long, for a festival of {topic}.",
)
EVAL_ROLEPLAY = (
    "Take the part of a museum curator who has spent forty years studying {topic}. A visitor asks you what "
    "first drew you to the subject.",
    "From now on speak as a cheerful radio presenter hosting a call-in show on {topic}. Open today's show.",
    "Play a grandmother who once witnessed something remarkable involving {topic}. Tell your grandchild about it.",
    "Be a sceptical newspaper editor. A junior writer pitches a feature on {topic}; respond to the pitch.",
)
EVAL_REASONING = (
    "Five runners finished a race. Mia beat Theo, Theo beat Sana, Luca finished right after Mia, and Sana was "
    "not last. In what order did they finish? Explain how you know.",
    "A drawer holds socks of three colours. In the dark, how many socks must you take out to be sure of "
    "having two of the same colour? Give your reasoning.",
    "If every glorp is a snib and some snibs are blue, must some glorps be blue? Justify the answer.",
    "A clock gains four minutes each hour. It was set right at noon. What time does it show when the real "
    "time is six in the evening? Reason it through.",
)
EVAL_MATH = (
    "Find the value of 3/8 plus 5/12, written as a simplified fraction.",
    "A cylinder has radius 7 cm and height 10 cm. Calculate its volume, taking pi as 3.14.",
    "What is the greatest common divisor of 252 and 198? Show the method you use.",
    "Evaluate 2 to the power 10, minus 17 squared, and explain the order of operations.",
)
EVAL_STEM = (
    "Why do {topic} happen, scientifically speaking? Keep the explanation under two hundred words.",
    "Describe the physics or biology behind {topic} for a high-school class.",
    "Which measurements would a scientist take to study {topic}, and with which instruments?",
    "Outline the main open research questions about {topic}.",
)
EVAL_HUMANITIES = (
    "How did {topic} shape the societies that encountered it? Discuss two examples.",
    "Discuss the cultural meaning of {topic} across different countries.",
    "What ethical debates surround {topic} today? Present both sides fairly.",
    "Trace how public attitudes towards {topic} have changed over the last century.",
)
EVAL_QA = (
    "In one or two sentences: what is the most common misconception about {topic}?",
    "Quick question: who is usually credited with popularising {topic}, if anyone?",
    "Briefly, what equipment do beginners need for {topic}?",
    "Name three facts about {topic} that surprise most people.",
)
EVAL_MATH_REASONING = (
    "A bakery makes 240 rolls each morning. It sells two thirds of them before noon and half of the rest in "
    "the afternoon; the remainder is donated. How many rolls are donated each week of six working days?",
    "Priya cycles to her office 14 km away at 21 km per hour and rides home at 12 km per hour. What is her "
    "average speed for the round trip?",
    "A water tank loses 3% of its contents each day to evaporation. Starting from 5000 litres, about how "
    "much remains after four days?",
    "Tickets cost 12 euros for adults and 7 for children. A group paid 149 euros for 17 tickets. How many "
    "children were in the group?",
)
EVAL_CODING = (
    "Implement a Python generator that yields the running median of a stream of numbers, and describe its "
    "time complexity.",
    "Write a small command-line Python program that reports the five most frequent words in a text file.",
)
EVAL_CODE_TASKS = (
    "Describe in plain English what the following snippet accomplishes and point out one risky input."
    "\n\n```python\n{code}\n```",
    "Port the snippet below to TypeScript, keeping its behaviour identical.\n\n```python\n{code}\n```",
)
EVAL_PASSAGE_TASKS = {
    "extraction": "Pick out each identifier and each configuration value mentioned below and present them as a "
    "YAML mapping.\n\n{passage}",
    "translation": "Render this paragraph in {language}, leaving identifiers as they are.\n\n{first}",
    "summarization": "Condense the reference text that follows into a brief abstract of about fifty words."
    "\n\n{passage}",
    "rag": "Using only the reference text, answer the question at the end.\n\nReference:\n{passage}\n\n"
    "Question: what situation is {name} designed for, and what does the text warn about?",
}
EVAL_LANGUAGES = ("Italian", "Portuguese", "Dutch", "French")


def held_out_prompts() -> list[tuple[str, Messages]]:
    """The fixed held-out scoring set: (category, messages), four for each of the thirteen
    categories, from EVAL_TOPICS, the reserved standard-library modules and wording that no
    training source uses."""
    topics = EVAL_TOPICS
    out: list[tuple[str, Messages]] = []

    def add(category: str, texts: list[str]) -> None:
        out.extend((category, user(text[0].upper() + text[1:])) for text in texts)

    add("writing", [t.format(topic=topics[i]) for i, t in enumerate(EVAL_WRITING)])
    add("roleplay", [t.format(topic=topics[4 + i]) for i, t in enumerate(EVAL_ROLEPLAY)])
    add("reasoning", list(EVAL_REASONING))
    add("math", list(EVAL_MATH))
    index = stdlib_index()
    snippets = index.reserved_snippets[:: max(1, len(index.reserved_snippets) // 2)][:2]
    add("coding", [*EVAL_CODING, *(t.format(code=s.text) for t, s in zip(EVAL_CODE_TASKS, snippets, strict=True))])
    add("stem", [t.format(topic=topics[(10, 14, 16, 19)[i]]) for i, t in enumerate(EVAL_STEM)])
    add("humanities", [t.format(topic=topics[(0, 2, 6, 15)[i]]) for i, t in enumerate(EVAL_HUMANITIES)])
    # Passages whose opening is a sentence of prose (not a command synopsis), evenly spread.
    prose = [p for p in index.reserved_passages if re.match(r"[A-Z][^.]{20,}\.\s", p.text)]
    passages = prose[:: max(1, len(prose) // 16)]
    for c, (category, task) in enumerate(EVAL_PASSAGE_TASKS.items()):
        texts = []
        for i, item in enumerate(passages[4 * c : 4 * c + 4]):
            name = f"{item.module}.{item.name}" if item.name else item.module
            first = first_paragraph(item.text)
            texts.append(task.format(passage=item.text, first=first, name=name, language=EVAL_LANGUAGES[i]))
        add(category, texts)
    add("qa", [t.format(topic=topics[(3, 8, 13, 17)[i]]) for i, t in enumerate(EVAL_QA)])
    add("math_reasoning", list(EVAL_MATH_REASONING))
    if len(out) != 4 * 13:  # a standard library too small for the reserved slice
        raise ValueError(f"the held-out set has {len(out)} prompts, not 52: too few reserved stdlib texts")
    return out
