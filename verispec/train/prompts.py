"""Training prompts for self-distillation, written here: templates x topic words.

They are the prompts the target answers to make a drafter's training set; they share nothing
with the Spec-Bench prompt set (``../shared/data/spec_bench``), which is for measurement
only (tests/train checks that no eight-word run of one appears in the other). Templates
cover the kinds of request people make of a chat model (writing, explanation, advice,
reasoning, arithmetic, code, lists, rewriting, role play); the topics are everyday nouns.
``training_prompts(n, seed)`` draws n distinct combinations with a seeded generator.

Second turns (``second_turns``) build on the target's own first answers, the way chat
requests do (Spec-Bench's writing, roleplay, reasoning, math, coding, extraction, stem and
humanities prompts come in two turns, and its summarization, rag and translation prompts
quote a long text): a follow-up in the same conversation ("make it shorter", "translate it"),
or a new request that quotes the answer as a passage to summarise, translate, extract from
or answer questions on. The drafter so learns to draft where the text being written copies,
condenses or rewrites text in its context, which first turns alone never show it.
"""

from __future__ import annotations

import hashlib

import numpy as np

TOPICS = (
    "bicycles", "volcanoes", "bread baking", "honeybees", "lighthouses", "chess", "tides", "coffee",
    "glaciers", "origami", "trains", "rainforests", "libraries", "penguins", "kites", "compost",
    "the moon", "submarines", "jazz", "deserts", "umbrellas", "bridges", "owls", "pottery",
    "recycling", "thunderstorms", "gardening", "the piano", "maps", "castles", "sleep", "tea",
    "rivers", "robots", "bamboo", "whales", "museums", "snow", "candles", "hiking", "clocks",
    "mushrooms", "the violin", "farming", "satellites", "sandcastles", "dolphins", "windmills",
    "soap", "camping", "wool", "fireflies", "the alphabet", "lemonade", "caves", "puzzles",
    "postcards", "tigers", "kayaking", "olive oil", "typewriters", "rainbows", "ants", "picnics",
    "elevators", "coral reefs", "bees wax", "marathons", "cheese", "lanterns", "seashells",
    "skateboards", "radio", "forests", "spices", "airports", "magnets", "sailing", "knitting",
    "bats", "fountains", "telescopes", "pumpkins", "paper", "ice skating", "ferries", "frogs",
    "street markets", "hot air balloons", "sunflowers", "board games", "pencils", "storms at sea",
)  # fmt: skip

TEMPLATES = (
    "Write a short story about {topic}.",
    "Write a poem about {topic}.",
    "Explain how {topic} work, in simple words.",
    "Tell me three interesting facts about {topic}.",
    "What is the history of {topic}? Keep it brief.",
    "Give me some tips for someone new to {topic}.",
    "Describe {topic} to a ten-year-old.",
    "What are the advantages and disadvantages of {topic}?",
    "Write a diary entry of a person who spends a day with {topic}.",
    "Make a list of five questions a student might ask about {topic}, with answers.",
    "Write a product description for a book about {topic}.",
    "Compare {topic} and {other}. How are they alike and how do they differ?",
    "Write a dialogue between two friends talking about {topic}.",
    "Summarize in a paragraph why people care about {topic}.",
    "Invent a holiday that celebrates {topic} and describe how people celebrate it.",
    "You are a tour guide. Introduce visitors to an exhibition about {topic}.",
    "Write a short news report about a town famous for {topic}.",
    "Explain step by step how to draw a picture of {topic}.",
    "What would the world be like without {topic}?",
    "Write a letter to a friend recommending they learn about {topic}.",
    "Write a limerick about {topic} and then explain the joke.",
    "Plan a one-day school lesson about {topic}.",
    "Give an outline for an essay about {topic} and {other}.",
    "Rewrite this sentence to sound more formal: '{topic} are really cool and I like them a lot.'",
)

ARITHMETIC = (
    "A shop sells {a} apples in the morning and {b} in the afternoon. Each apple costs {c} cents. "
    "How much money did the shop make? Show your working.",
    "Tom has {a} marbles. He gives {c} to each of his {d} friends. How many marbles are left? Explain.",
    "What is {a} times {c}, plus {b}? Work it out step by step.",
    "A train travels {a} kilometres in {d} hours. What is its average speed? Explain your reasoning.",
    "A rectangle is {c} metres wide and {d} metres long. What are its area and perimeter?",
    "If a recipe needs {c} eggs for {d} people, how many eggs are needed for {b} people?",
)

CODE = (
    "Write a Python function that returns the {word} of a list of numbers, with a docstring.",
    "Write a Python function that counts the {thing} in a string, and show an example call.",
    "Explain what a {structure} is in programming and give a short Python example.",
    "Write a JavaScript function that checks whether a number is {property}.",
)
CODE_WORDS = {
    "word": ("sum", "average", "largest value", "median", "product", "second smallest value"),
    "thing": ("vowels", "words", "capital letters", "digits", "spaces", "sentences"),
    "structure": ("dictionary", "stack", "queue", "linked list", "set", "binary tree", "loop"),
    "property": ("even", "prime", "a perfect square", "a palindrome", "divisible by seven"),
}


def training_prompts(count: int, seed: int = 0) -> list[str]:
    """``count`` distinct prompts (templates filled with topics, numbers or code words), in a
    seeded order; a mix of roughly 70% topic templates, 20% arithmetic, 10% code."""
    if count < 1:
        raise ValueError(f"need at least one prompt, got {count}")
    rng = np.random.default_rng(seed)
    prompts: list[str] = []
    seen: set[str] = set()
    attempts = 0
    while len(prompts) < count:
        attempts += 1
        if attempts > 100 * count:
            raise ValueError(f"cannot make {count} distinct prompts from the templates")
        kind = rng.random()
        if kind < 0.7:
            topic, other = rng.choice(len(TOPICS), size=2, replace=False)
            template = TEMPLATES[rng.integers(len(TEMPLATES))]
            prompt = template.format(topic=TOPICS[topic], other=TOPICS[other])
            prompt = prompt[0].upper() + prompt[1:]
        elif kind < 0.9:
            a, b, c, d = (int(v) for v in rng.integers([10, 5, 2, 2], [500, 100, 13, 10]))
            prompt = ARITHMETIC[rng.integers(len(ARITHMETIC))].format(a=a, b=b, c=c, d=d)
        else:
            template = CODE[rng.integers(len(CODE))]
            fills = {key: words[rng.integers(len(words))] for key, words in CODE_WORDS.items()}
            prompt = template.format(**fills)
        if prompt not in seen:
            seen.add(prompt)
            prompts.append(prompt)
    return prompts


# A follow-up in the same conversation, after the target's own answer.
FOLLOW_UPS = (
    "Make your answer shorter, at most three sentences.",
    "Rewrite your answer as a list of bullet points.",
    "Now rewrite it for a five-year-old.",
    "Translate your answer into French.",
    "Translate your answer into Spanish.",
    "Translate your answer into German.",
    "Give your answer a title and write it again with headings.",
    "Can you add one more example to your answer?",
    "Rewrite your answer in a formal tone.",
    "Turn your answer into a short poem.",
    "What is the most important point in your answer, and why?",
    "Write your answer again, but change every number or name you used.",
    "Check your answer for mistakes and correct any you find.",
    "Summarize your answer in one sentence.",
    "Continue from where you stopped.",
    "Write three questions a reader might ask about your answer, and answer them.",
)

# A new request that quotes the answer as its passage.
PASSAGE_TASKS = (
    "Summarize the following text in two sentences.\n\n{passage}",
    "Write a one-paragraph summary of this text:\n\n{passage}",
    "Translate the following text into French:\n\n{passage}",
    "Translate the following text into Spanish:\n\n{passage}",
    "Translate this text into German:\n\n{passage}",
    "List every name, number and place mentioned in the text below.\n\n{passage}",
    "Read the text and answer: what is its main idea, and which sentence shows it best?\n\n{passage}",
    "Extract the key facts from this text as a JSON object with short keys.\n\n{passage}",
    "Here is a text:\n\n{passage}\n\nRewrite it in simpler words, keeping every fact.",
    "Here is a draft:\n\n{passage}\n\nFix the grammar and make it clearer. Return the full corrected text.",
    "Text:\n{passage}\n\nQuestion: what are the three most important details in the text? Quote them.",
    "Give this text a title, then write five keywords for it.\n\n{passage}",
)

Message = dict[str, str]
Messages = list[Message]  # a conversation ending in a user turn


def id_number(prompt_id: str, salt: str) -> int:
    """A number fixed by a prompt's id and a salt (one per choice): how a derived prompt picks
    its wording, so a rerun builds the same prompts. The first 4 bytes of sha256, little-endian."""
    return int.from_bytes(hashlib.sha256(f"{salt}:{prompt_id}".encode()).digest()[:4], "little")


def user(text: str) -> Messages:
    """A conversation of one user turn."""
    return [{"role": "user", "content": text}]


def second_turns(first: list[tuple[str, str]], count: int, seed: int = 0) -> list[list[Message]]:
    """``count`` conversations built on (request, answer) pairs the target wrote: about half a
    follow-up after the answer, half a new request quoting the answer (FOLLOW_UPS,
    PASSAGE_TASKS); pairs are drawn without replacement until they run out."""
    if count < 1:
        raise ValueError(f"need at least one second turn, got {count}")
    usable = [(request, answer.strip()) for request, answer in first if answer.strip()]
    if not usable:
        raise ValueError("no first answer to build second turns on")
    rng = np.random.default_rng([seed, 2])
    order = rng.permutation(len(usable))
    conversations: list[list[Message]] = []
    for index in range(count):
        request, answer = usable[int(order[index % len(order)])]
        if rng.random() < 0.5:
            follow = FOLLOW_UPS[rng.integers(len(FOLLOW_UPS))]
            conversations.append(
                [
                    {"role": "user", "content": request},
                    {"role": "assistant", "content": answer},
                    {"role": "user", "content": follow},
                ]
            )
        else:
            task = PASSAGE_TASKS[rng.integers(len(PASSAGE_TASKS))]
            conversations.append([{"role": "user", "content": task.format(passage=answer)}])
    return conversations
