"""German for the translation category: which sentences are asked into German, which of the
target's answers count as German, and the requests built on them."""

from __future__ import annotations

import pytest

from verispec.train import german
from verispec.train.shards import derived_sources, resolve

REPORT = (
    "# Bridge opens in Millbrook\n"
    "Millbrook opened its new bridge on Monday, two years after the old one closed. Ana Ruiz, who led the "
    "forty workers on the site, said the steel arrived late.\n"
    "- 12 million paid by the council\n"
    "1. First bus crossed at noon\n"
    "Short line.\n"
    "Residents lined the river to watch the first bus cross, and the mayor promised a cycle lane next year.<|im_end|>"
)
PROSE = [
    "Millbrook opened its new bridge on Monday, two years after the old one closed.",
    "Ana Ruiz, who led the forty workers on the site, said the steel arrived late.",
    "Residents lined the river to watch the first bus cross, and the mayor promised a cycle lane next year.",
]
GERMAN = "Der Bürgermeister hat am Montag die neue Brücke eröffnet, sagte er."


def test_only_plain_prose_sentences_are_asked_into_german():
    assert german.english_sentences(REPORT) == PROSE  # no heading, list item, short line or end token
    made = [german.german_task(f"reports:{i}", [], REPORT) for i in range(80)]
    assert made[3] == german.german_task("reports:3", [], REPORT)  # chosen by the parent's id
    texts = [m[0]["content"] for m in made if m is not None]
    assert len(texts) == 80 and all(len(m) == 1 and m[0]["role"] == "user" for m in made if m)
    asked = set()
    for text in texts:
        (ask,) = [a for a in german.GERMAN_ASKS if text.startswith(a.split("{text}")[0])]
        quoted = text[len(ask.split("{text}")[0]) :]
        asked.add(ask)
        assert quoted in {*PROSE, f"{PROSE[0]} {PROSE[1]}", f"{PROSE[1]} {PROSE[2]}"}, quoted
    assert asked == set(german.GERMAN_ASKS)
    assert any(PROSE[1] + " " + PROSE[2] in t for t in texts) and any(t.endswith(PROSE[0]) for t in texts)
    assert german.german_task("reports:1", [], "# Title\n- a list\n- of items") is None


@pytest.mark.parametrize(
    "answer",
    [
        GERMAN,
        f'"{GERMAN}"',
        f"Hier ist die Übersetzung ins Deutsche: „{GERMAN}“",
        f"Here is the German translation:\n\n{GERMAN}\n\nI hope this helps.",
        f"{GERMAN}<|im_end|>",
    ],
)
def test_the_german_of_an_answer_is_kept_without_preamble_or_quotes(answer):
    assert german.german_text(answer) == GERMAN


def test_english_loops_and_scraps_are_not_taken_for_german():
    assert german.german_text("The mayor opened the new bridge on Monday, and it was a success.") is None
    assert german.german_text("In German, the answer would be 'Schnellwörter' (Schnellwörter).") is None
    assert german.german_text("Die Brücke.") is None  # fewer than 3 German function words
    looping = "Die Zeit der Zeit " * 40  # one sentence past the 60-word limit
    assert german.german_text(looping) is None
    assert german.german_text("Das ist ein Haus, und die Tür ist auf. " * 4) is None  # the target looping
    told = [
        GERMAN,  # 11 words
        "Die Arbeiter haben zwei Jahre lang an der Brücke über den Fluss gebaut.",  # 13
        "Der Stahl kam zu spät, aber die Mannschaft holte die Zeit im Frühling auf.",  # 14
        "Viele Einwohner standen am Ufer und sahen dem ersten Bus zu.",  # 11
        "Im nächsten Jahr soll auch ein Radweg kommen.",  # 8
        "Die Stadt hat dafür zwölf Millionen bezahlt.",  # 7 (64 words in all)
    ]
    assert german.german_text(" ".join(told)) == " ".join(told[:5])  # cut at 60 words, at a sentence's end


def test_german_is_asked_back_into_english_half_of_it_spaced_as_in_wmt():
    made = [german.de_en_task(f"german<reports:{i}", [], GERMAN) for i in range(60)]
    texts = [m[0]["content"] for m in made if m is not None]
    assert len(texts) == 60
    spaced = "Der Bürgermeister hat am Montag die neue Brücke eröffnet , sagte er ."
    assert german.spaced(GERMAN) == spaced
    with_plain = sum(GERMAN in t for t in texts)
    with_spaced = sum(spaced in t for t in texts)
    assert with_plain + with_spaced == 60 and min(with_plain, with_spaced) > 10
    assert {a for a in german.DE_EN_ASKS if any(t.startswith(a.split("{text}")[0]) for t in texts)} == set(
        german.DE_EN_ASKS
    )
    assert german.de_en_task("german<reports:1", [], "The mayor opened the bridge, and it was a success.") is None


def test_the_sources_chain_from_english_answers_to_german_and_back():
    sources = derived_sources()
    assert sources["german"].parents == ("reports", "report-tasks", "self-instruct", "templates")
    assert sources["de-en"].parents == ("german",)
    assert resolve("de-en") is not None and "SmolLM2" in sources["de-en"].licence


def test_german_wordings_share_no_phrase_with_spec_bench():
    from tests.train.overlap import shingles, spec_bench_shingles

    bench = spec_bench_shingles()
    for wording in (*german.GERMAN_ASKS, *german.DE_EN_ASKS):
        assert not shingles(wording.format(text="TEXT")) & bench, wording
