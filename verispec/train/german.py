"""German for the translation category: two derived sources (``verispec.train.shards``).

Spec-Bench's translation prompts ask for German news sentences in English, and no other source
has German to read: the follow-ups only ask for translations *into* German. No German prose
with a licence we could ship is at hand (PyPI packages carry word lists and interface strings,
not sentences), so the German is the target's own:

- ``german``: a sentence or two of the target's English answers (its news reports, their
  summaries, the answers to the questions it wrote and to the templates), asked into German;
- ``de-en``: the target's German from ``german``, cleaned of preambles and quotes and kept only
  when it reads as German, asked back into English. Half of these space their punctuation the
  way the WMT news test sets (which Spec-Bench quotes) are tokenised.

The target's German is often clumsy, but it is German words in German order, which is what the
drafter needs to see the target translate from. Which sentence, wording and spacing a prompt
gets is chosen by its parent's id, so a rerun builds the same prompts.
"""

from __future__ import annotations

import re

from verispec.train.prompts import Messages, id_number

# Sentences of an English answer worth translating: plain prose lines, 6 to 40 words.
SENTENCE_WORDS = (6, 40)
SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z\"“])")
NOT_PROSE = re.compile(r"^(?:[#*>|\-]|\d+[.)]\s)")
END_OF_TURN = re.compile(r"<\|[a-z_]+\|>")  # a special token's text left in a decoded answer

GERMAN_ASKS = (
    "Translate into German: {text}",
    "Translate the following sentence into German.\n\n{text}",
    "How would you say this in German?\n{text}",
    "Please give me a German version of this: {text}",
)
DE_EN_ASKS = (
    "Translate German to English: {text}",
    "Translate this from German into English:\n{text}",
    "What does this German text say in English? {text}",
    "German: {text}\nEnglish:",
)

# Function words that mark a text as German or as English (the target sometimes answers a
# request for German in English, or half and half).
GERMAN_WORDS = frozenset((
    "der", "die", "das", "den", "dem", "des", "und", "ist", "sind", "nicht", "ein", "eine", "einen", "einem",
    "einer", "mit", "von", "zu", "sich", "auf", "für", "im", "wird", "wurde", "werden", "auch", "nach", "bei",
    "aus", "über", "wie", "es", "sie", "er", "wir", "ich", "hat", "haben", "war",
))  # fmt: skip
ENGLISH_WORDS = frozenset((
    "the", "and", "is", "are", "of", "to", "with", "for", "that", "this", "was", "were", "has", "have", "it",
    "its", "on", "by", "from", "at", "be", "will",
))  # fmt: skip
GERMAN_MIN_WORDS = (3, 60)  # a de-en passage: at least 3 German function words, at most 60 words
PREAMBLE = re.compile(r"^(?:[^:\n]{0,80}(?:german|deutsch|translation|übersetzung)[^:\n]{0,40}):\s*", re.IGNORECASE)
DISTINCT = 0.6  # share of a passage's word trigrams that must be distinct
QUOTES = "\"'“”„«»‚‘’ "


def english_sentences(answer: str) -> list[str]:
    """The plain prose sentences of an answer (no headings, lists or tables), 6 to 40 words."""
    found = []
    for line in END_OF_TURN.sub("", answer).splitlines():
        line = line.strip()
        if not line or NOT_PROSE.match(line):
            continue
        for sentence in SENTENCE_END.split(line):
            words = len(sentence.split())
            if SENTENCE_WORDS[0] <= words <= SENTENCE_WORDS[1] and sentence[-1] in ".!?":
                found.append(sentence)
    return found


def german_task(prompt_id: str, messages: Messages, answer: str) -> Messages | None:
    """A request to put one sentence (two in five: two in a row) of the answer into German;
    None when the answer has no plain sentence."""
    found = english_sentences(answer)
    if not found:
        return None
    start = id_number(prompt_id, "de-sentence") % len(found)
    count = 2 if id_number(prompt_id, "de-count") % 5 < 2 else 1
    text = " ".join(found[start : start + count])
    ask = GERMAN_ASKS[id_number(prompt_id, "de-ask") % len(GERMAN_ASKS)]
    return [{"role": "user", "content": ask.format(text=text)}]


def german_text(answer: str) -> str | None:
    """The German in the target's answer to a ``german`` request: its first paragraph without a
    preamble ("Here is the translation:") or quotes, cut to whole sentences within 60 words;
    None unless German function words outnumber English ones (and there are at least 3), or
    when it loops."""
    paragraphs = [p.strip() for p in END_OF_TURN.sub("", answer).split("\n") if p.strip()]
    if not paragraphs:
        return None
    text = paragraphs[0]
    if text.endswith(":") and len(paragraphs) > 1:  # "Here is the German translation:" on its own line
        text = paragraphs[1]
    text = PREAMBLE.sub("", text).strip(QUOTES)
    kept: list[str] = []
    for sentence in SENTENCE_END.split(text):
        if len(" ".join([*kept, sentence]).split()) > GERMAN_MIN_WORDS[1]:
            break
        kept.append(sentence)
    text = " ".join(kept).strip(QUOTES)
    words = re.findall(r"[a-zäöüß]+", text.lower())
    german = sum(w in GERMAN_WORDS for w in words)
    english = sum(w in ENGLISH_WORDS for w in words)
    if german < GERMAN_MIN_WORDS[0] or german <= english:
        return None
    trigrams = list(zip(words, words[1:], words[2:], strict=False))
    if len(set(trigrams)) < DISTINCT * len(trigrams):  # the target looping, not a sentence to translate
        return None
    return text


def spaced(text: str) -> str:
    """Punctuation set apart by a space, as in the WMT test sets: "Die Tickets gelten , sagt er ."."""
    return re.sub(r"\s*([,.;:!?])(?=\s|$)", r" \1", text)


def de_en_task(prompt_id: str, messages: Messages, answer: str) -> Messages | None:
    """A request to translate the target's German back into English; None when its answer to
    the ``german`` request holds no usable German."""
    text = german_text(answer)
    if text is None:
        return None
    if id_number(prompt_id, "de-spacing") % 2:
        text = spaced(text)
    ask = DE_EN_ASKS[id_number(prompt_id, "de-en-ask") % len(DE_EN_ASKS)]
    return [{"role": "user", "content": ask.format(text=text)}]
