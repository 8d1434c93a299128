"""A training-data directory that grows: shards of the target's own answers, written by
batched generation on the native target, resumable across runs and sessions.

Terms:

- a prompt id names one prompt for good: ``SOURCE:INDEX`` for a source's ``index``-th prompt
  (``verispec.train.sources``), ``DERIVED<PARENT_ID`` for a prompt built on the answer to
  ``PARENT_ID`` (a follow-up, or a question the target wrote turned into a request);
- a sequence is the prompt's token ids (``data.encode_conversation``: the chat template) then the answer's, up to and
  including the end-of-sequence token when the target wrote one;
- generation settings (temperature, max new tokens, seed) are part of what a shard holds:
  a source answered greedily and at T = 1 are two bodies of data, grown separately;
- a shard is ``shards/NNNNNN.safetensors`` (a ``data.Corpus``'s tensors) with
  ``NNNNNN.json`` (source, licence, settings, prompt ids, tokens, generation seconds, machine)
  and ``NNNNNN.prompts.jsonl`` (each sequence's prompt id and chat messages, read by derived
  sources and by anyone auditing the data).

A shard is written whole, its JSON last (files staged, then renamed): a shard without its JSON
does not exist, so a run killed at any moment loses at most the answers not yet in a shard,
and a rerun skips every prompt id a shard of the same source and settings already holds.
Each request's seed comes from (settings seed, prompt id), and the native target's rows do not
depend on their neighbours, so an answer is the same whichever batch it was generated in.
"""

from __future__ import annotations

import functools
import hashlib
import json
import platform
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from verispec.errors import UserError
from verispec.train.data import Corpus, encode_conversation, hidden_states, native_hidden_states
from verispec.train.prompts import FOLLOW_UPS, PASSAGE_TASKS, id_number
from verispec.train.states import ShardStates

Messages = list[dict[str, str]]
Progress = Callable[[int, int, float], None]  # (response tokens held, tokens wanted, seconds)

TARGET_FILE = "target.json"
DEFAULT_SHARD_SEQUENCES = 256
DEFAULT_RUNNING = 64  # requests generated together: ~300 tok/s on 2 cores for the embedded model


class ShardError(UserError, ValueError):
    """A data directory that cannot be used as asked (another target's, a bad setting)."""


class PromptSource(Protocol):
    """What ``grow`` needs of a source (``verispec.train.sources.Source`` is one)."""

    @property
    def name(self) -> str: ...
    @property
    def licence(self) -> str: ...
    @property
    def size(self) -> int | None: ...
    def prompt(self, index: int) -> Messages: ...


@dataclass(frozen=True)
class GenerationSettings:
    """How the target answers: temperature 0 is greedy (what a greedy request verifies);
    others sample the plain softmax at that temperature (no top-p, top-k or penalties)."""

    temperature: float = 0.0
    max_new_tokens: int = 256
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.temperature >= 0 or self.max_new_tokens < 1:
            raise ShardError(f"temperature must be >= 0 and max new tokens >= 1, got {self}")

    def key(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    def request_seed(self, prompt_id: str) -> int:
        digest = hashlib.sha256(f"{self.seed}:{prompt_id}".encode()).digest()
        return int.from_bytes(digest[:8], "little") >> 1


@dataclass(frozen=True)
class Derived:
    """A source whose prompts are built on the target's answers to its ``parents``' prompts.
    ``make(parent id, parent messages, answer text)``: the new prompt, or None to skip it."""

    name: str
    licence: str
    parents: tuple[str, ...]
    make: Callable[[str, Messages, str], Messages | None]


@dataclass
class ShardInfo:
    number: int
    source: str
    licence: str
    settings: dict[str, Any]
    ids: list[str]
    skipped: dict[str, str]  # prompt id -> why (over the context, ...): not retried
    response_tokens: int
    seconds: float
    machine: dict[str, Any] = field(default_factory=dict)

    @property
    def settings_key(self) -> str:
        return GenerationSettings(**self.settings).key()


class DataDir:
    """The shards under ``root``, all of one target (``target.json`` names its weights' hash)."""

    def __init__(self, root: Path, fingerprint: str | None = None) -> None:
        self.root = Path(root)
        self.shard_dir = self.root / "shards"
        marker = self.root / TARGET_FILE
        if marker.is_file():
            stored = json.loads(marker.read_text())["weights_sha256"]
            if fingerprint is not None and stored != fingerprint:
                raise ShardError(
                    f"{self.root} holds data of another target (weights {stored[:12]}, this one {fingerprint[:12]}); "
                    "use another directory"
                )
            self.fingerprint: str | None = stored
        else:
            self.fingerprint = fingerprint
            if fingerprint is not None:
                self.root.mkdir(parents=True, exist_ok=True)
                marker.write_text(json.dumps({"weights_sha256": fingerprint}) + "\n")

    def shards(self) -> list[ShardInfo]:
        """Every complete shard, in the order written."""
        if not self.shard_dir.is_dir():
            return []
        return [ShardInfo(**json.loads(path.read_text())) for path in sorted(self.shard_dir.glob("[0-9]*[0-9].json"))]

    def covered(self, source: str, settings: GenerationSettings) -> set[str]:
        """Prompt ids of ``source`` already answered (or skipped) with ``settings``."""
        done: set[str] = set()
        for info in self.shards():
            if info.source == source and info.settings_key == settings.key():
                done.update(info.ids)
                done.update(info.skipped)
        return done

    def write(
        self,
        source: PromptSource | Derived,
        settings: GenerationSettings,
        answered: list[tuple[str, Messages, list[int], list[int]]],
        skipped: dict[str, str],
        seconds: float,
    ) -> ShardInfo:
        """A new shard of ``answered`` (prompt id, messages, prompt ids, response ids)."""
        from safetensors.torch import save_file

        self.shard_dir.mkdir(parents=True, exist_ok=True)
        number = max((info.number for info in self.shards()), default=-1) + 1
        stem = self.shard_dir / f"{number:06d}"
        corpus = Corpus.from_sequences([(p, r) for _, _, p, r in answered])
        tensors = {"tokens": corpus.tokens, "starts": corpus.starts, "lengths": corpus.lengths}
        tensors["prompt_lengths"] = corpus.prompt_lengths
        staged = stem.with_suffix(".safetensors.partial")
        save_file(tensors, str(staged))
        staged.replace(stem.with_suffix(".safetensors"))
        lines = "".join(json.dumps({"id": i, "messages": m}) + "\n" for i, m, _, _ in answered)
        _write_text(stem.with_suffix(".prompts.jsonl"), lines)
        info = ShardInfo(
            number=number,
            source=source.name,
            licence=source.licence,
            settings=asdict(settings),
            ids=[i for i, _, _, _ in answered],
            skipped=skipped,
            response_tokens=corpus.response_tokens,
            seconds=round(seconds, 2),
            machine={"python": platform.python_version(), "machine": platform.machine(), "written": time.time()},
        )
        _write_text(stem.with_suffix(".json"), json.dumps(asdict(info)) + "\n")  # last: the shard now exists
        return info

    def load(self, info: ShardInfo) -> Corpus:
        from safetensors.torch import load_file

        tensors = load_file(str(self.shard_dir / f"{info.number:06d}.safetensors"))
        return Corpus(tensors["tokens"], tensors["starts"], tensors["lengths"], tensors["prompt_lengths"])

    def messages(self, info: ShardInfo) -> list[Messages]:
        path = self.shard_dir / f"{info.number:06d}.prompts.jsonl"
        return [json.loads(line)["messages"] for line in path.read_text().splitlines()]

    def select(self, sources: Iterable[str] | None = None) -> list[ShardInfo]:
        """The shards of ``sources`` (None: every source), in the order written."""
        wanted = None if sources is None else set(sources)
        chosen = [info for info in self.shards() if wanted is None or info.source in wanted]
        if wanted is not None and (missing := wanted - {info.source for info in chosen}):
            raise ShardError(f"{self.root} has no shards of {', '.join(sorted(missing))}")
        if not chosen:
            raise ShardError(f"{self.root} has no shards: grow it first (verispec train-data grow)")
        return chosen

    def corpus(self, chosen: list[ShardInfo] | None = None) -> tuple[Corpus, str]:
        """The sequences of ``chosen`` shards (None: all) as one corpus, and a key naming exactly
        those shards (for caches of what is computed from them)."""
        chosen = self.select() if chosen is None else chosen
        return Corpus.from_sequences(self.sequences(chosen)), self.key(chosen)

    def sequences(self, chosen: list[ShardInfo]) -> list[tuple[list[int], list[int]]]:
        """(prompt ids, response ids) of every sequence of ``chosen``, in order."""
        sequences: list[tuple[list[int], list[int]]] = []
        for info in chosen:
            part = self.load(info)
            for start, length, prompt in zip(part.starts, part.lengths, part.prompt_lengths, strict=True):
                ids = part.tokens[int(start) : int(start) + int(length)].tolist()
                sequences.append((ids[: int(prompt)], ids[int(prompt) :]))
        return sequences

    def key(self, chosen: list[ShardInfo]) -> str:
        # The settings too: a greedy and a sampled directory number their shards alike.
        names = json.dumps([[info.number, len(info.ids), info.settings_key] for info in chosen])
        return hashlib.sha256(f"{self.fingerprint}:{names}".encode()).hexdigest()[:16]

    def answers(self, source: str, decode: Callable[[list[int]], str]) -> Iterator[tuple[str, Messages, str]]:
        """(prompt id, messages, answer text) of every answered prompt of ``source``, any settings."""
        for info in self.shards():
            if info.source != source:
                continue
            part = self.load(info)
            for prompt_id, messages, start, length, prompt in zip(
                info.ids, self.messages(info), part.starts, part.lengths, part.prompt_lengths, strict=True
            ):
                response = part.tokens[int(start) + int(prompt) : int(start) + int(length)].tolist()
                yield prompt_id, messages, decode(response)


def _write_text(path: Path, text: str) -> None:
    staged = path.with_name(path.name + ".partial")
    staged.write_text(text)
    staged.replace(path)


Selection = list[tuple[DataDir, list[ShardInfo]]]  # chosen shards, per data directory


def select_across(roots: Sequence[Path], fingerprint: str, sources: Iterable[str] | None = None) -> Selection:
    """The shards of ``sources`` (None: all) in each of the data directories ``roots``, all of
    the target ``fingerprint``: a greedy and a sampled directory trained on together. A source
    must be in at least one directory, and every directory must give something."""
    if not roots:
        raise ShardError("no data directory given")
    if len({Path(root).resolve() for root in roots}) < len(roots):
        raise ShardError(f"a data directory is named twice in {[str(root) for root in roots]}")
    wanted = None if sources is None else set(sources)
    chosen: Selection = []
    for root in roots:
        if not Path(root).is_dir():
            raise ShardError(f"no data directory at {root}: grow one first (verispec train-data grow)")
        data = DataDir(Path(root), fingerprint)
        if not data.shards():
            raise ShardError(f"{data.root} has no shards: grow it first (verispec train-data grow)")
        infos = [info for info in data.shards() if wanted is None or info.source in wanted]
        if not infos:
            raise ShardError(f"{data.root} has no shards of {', '.join(sorted(wanted or ()))}")
        chosen.append((data, infos))
    found = {info.source for _, infos in chosen for info in infos}
    if wanted is not None and (missing := wanted - found):
        raise ShardError(f"no directory of {[str(root) for root in roots]} has shards of {', '.join(sorted(missing))}")
    return chosen


def selection_corpus(chosen: Selection) -> tuple[Corpus, str]:
    """The sequences of every chosen shard, directory after directory, as one corpus, and a key
    naming exactly those shards (one directory's: ``DataDir.corpus``'s key)."""
    sequences = [sequence for data, infos in chosen for sequence in data.sequences(infos)]
    keys = [data.key(infos) for data, infos in chosen]
    key = keys[0] if len(keys) == 1 else hashlib.sha256(":".join(keys).encode()).hexdigest()[:16]
    return Corpus.from_sequences(sequences), key


def corpus_hidden_states(
    chosen: Selection,
    model: Any,
    layers: tuple[int, ...],
    progress: Callable[[int, int], None] | None = None,
    native: Any = None,
) -> ShardStates:
    """(P, len(layers) * D) bf16, read from the files: the target's hidden states at ``layers``
    over the corpus of ``chosen`` (in that order, as ``selection_corpus`` concatenates them),
    from the transformers ``model`` or, given one, from the ``native`` target
    (``data.native_hidden_states``).

    Each shard's states are computed once (``hidden/NNNNNN-LAYERS.npy`` in its directory, or
    ``NNNNNN-native-LAYERS.npy``; a file of more layers serves fewer, a file of the other
    target none), so a grown directory only computes its new shards; the corpus reads its rows
    from those files in place (``states.ShardStates``). Copies of whole corpora that earlier
    versions assembled beside them (``hidden/corpus-*.npy``) are deleted: nothing reads them."""
    tag = "native" if native is not None else ""
    parts: list[tuple[Path, list[int]]] = []  # (file, columns of ``layers`` in it)
    total = sum(len(infos) for _, infos in chosen)
    width = int(model.config.hidden_size)
    for data, infos in chosen:
        own = data.root / "hidden"
        own.mkdir(parents=True, exist_ok=True)
        for old in own.glob("corpus-*.npy"):
            old.unlink()
        for info in infos:
            found = _shard_states(own, info.number, layers, tag)
            if found is None:
                corpus = data.load(info)
                states = (
                    hidden_states(model, corpus, layers)
                    if native is None
                    else native_hidden_states(native, corpus, layers)
                )
                path = own / ("-".join([f"{info.number:06d}", *([tag] if tag else []), *map(str, layers)]) + ".npy")
                staged = path.with_name(path.name + ".partial")
                with staged.open("wb") as handle:
                    np.save(handle, states.view(torch.int16).numpy())
                staged.replace(path)
                found = (path, layers)
            path, stored = found
            parts.append((path, [stored.index(layer) * width + c for layer in layers for c in range(width)]))
            if progress is not None:
                progress(len(parts), total)
    return ShardStates(parts)


def _shard_states(
    folder: Path, number: int, layers: tuple[int, ...], tag: str = ""
) -> tuple[Path, tuple[int, ...]] | None:
    """A cached states file of shard ``number`` from the target ``tag`` names ('': the
    transformers model) holding every one of ``layers``: (its path, the layers it holds)."""
    for path in sorted(folder.glob(f"{number:06d}-*.npy")):
        fields = path.stem.split("-")[1:]
        made_by = fields[0] if fields and not fields[0].isdigit() else ""
        if made_by != tag:
            continue
        stored = tuple(int(i) for i in fields[1 if made_by else 0 :])
        if set(layers) <= set(stored):
            return path, stored
    return None


# --- derived sources -------------------------------------------------------------------------


def _pick(prompt_id: str, options: tuple[str, ...], salt: str) -> str:
    return options[id_number(prompt_id, salt) % len(options)]


def follow_up(prompt_id: str, messages: Messages, answer: str) -> Messages | None:
    """A second turn on the target's answer, chosen by the parent's id: a follow-up in the same
    conversation (half), or a new request quoting the answer as a passage (half)."""
    answer = answer.strip()
    if len(answer.split()) < 12:  # too short to summarise, translate or follow up on
        return None
    if _pick(prompt_id, ("follow", "passage"), "kind") == "follow":
        return [
            *messages,
            {"role": "assistant", "content": answer},
            {"role": "user", "content": _pick(prompt_id, FOLLOW_UPS, "follow")},
        ]
    return [{"role": "user", "content": _pick(prompt_id, PASSAGE_TASKS, "task").format(passage=answer)}]


# Requests on a report the target wrote (``reports``), shaped like Spec-Bench's summarization
# (a bare "Summarize:" before the article), rag (the passage, then a question on its last line,
# with no instruction) and extraction prompts; the wording is our own.
REPORT_DISTINCT = 0.5  # share of a report's word trigrams that must be distinct (the target loops at times)
REPORT_SUMMARIES = (
    "Summarize: {report}",
    "Summarize this article in a few sentences.\n\n{report}",
    "{report}\n\nSummarize the article above.",
    "Write a short summary of the following news story:\n{report}",
)
REPORT_QUESTIONS = (
    "What happened?",
    "Who is quoted in the article?",
    "Where did this take place?",
    "When did it happen?",
    "What numbers are given, and what do they measure?",
    "Why did it happen?",
    "What happens next?",
    "Who was involved?",
    "How did people react?",
    "What is the main point of the article?",
)
REPORT_EXTRACTIONS = (
    "List the people named in the text below with their roles, one per line.\n{report}",
    "From the article below, extract every date, number and place as a JSON object.\n\n{report}",
    "Read the text and fill in: Event: ... Place: ... Date: ... People: ...\n\n{report}",
)


def report_task(prompt_id: str, messages: Messages, answer: str) -> Messages | None:
    """A request on the target's report, chosen by the parent's id: a summary (two in five), a
    question after the passage (two in five) or an extraction (one in five); None for a report
    too short or one that loops."""
    report = answer.strip()
    words = report.split()
    if len(words) < 40:  # too short to be a passage
        return None
    trigrams = list(zip(words, words[1:], words[2:], strict=False))
    if len(set(trigrams)) < REPORT_DISTINCT * len(trigrams):  # a loop, not an article to summarise
        return None
    kind = _pick(prompt_id, ("summary", "summary", "question", "question", "extract"), "report-kind")
    if kind == "summary":
        return [{"role": "user", "content": _pick(prompt_id, REPORT_SUMMARIES, "report").format(report=report)}]
    if kind == "question":
        return [{"role": "user", "content": f"{report}\n{_pick(prompt_id, REPORT_QUESTIONS, 'report')}"}]
    return [{"role": "user", "content": _pick(prompt_id, REPORT_EXTRACTIONS, "report").format(report=report)}]


def derived_sources() -> dict[str, Derived]:
    """The sources built on answers: ``follow-ups`` (on every first-turn source's answers),
    ``self-instruct`` (the questions the target wrote, asked of it), ``report-tasks``
    (summaries of, questions on and extractions from the reports it wrote), and ``german`` and
    ``de-en`` (its sentences into German and back: ``verispec.train.german``)."""
    from verispec.train import german, sources

    firsts = tuple(name for name in sources.SOURCES if name != "questions")
    written = "built here on the target's own answers (see the parent sources' licences)"

    def instruct(prompt_id: str, messages: Messages, answer: str) -> Messages | None:
        made = sources.self_instruct([answer])
        return made[0] if made else None

    return {
        "follow-ups": Derived("follow-ups", written, (*firsts, "self-instruct"), follow_up),
        "self-instruct": Derived("self-instruct", sources.SOURCES["questions"].licence, ("questions",), instruct),
        "report-tasks": Derived(
            "report-tasks",
            f"{sources.REPORTS_LICENCE}; passages: reports written by {sources.TARGET_MODEL}",
            ("reports",),
            report_task,
        ),
        "german": Derived(
            "german",
            f"built here on {sources.TARGET_MODEL}'s English answers (see the parent sources' licences)",
            ("reports", "report-tasks", "self-instruct", "templates"),
            german.german_task,
        ),
        "de-en": Derived(
            "de-en",
            f"German written by {sources.TARGET_MODEL} (the answers of ``german``), asked back into English",
            ("german",),
            german.de_en_task,
        ),
    }


def resolve(name: str) -> PromptSource | Derived:
    """The source called ``name``: a prompt source, or a derived one."""
    from verispec.train import sources

    derived = derived_sources()
    if name in derived:
        return derived[name]
    try:
        return sources.get_source(name)
    except ValueError:
        known = sorted([*sources.SOURCES, *derived])
        raise ShardError(f"unknown source {name!r}; known: {', '.join(known)}") from None


def candidates(
    source: PromptSource | Derived, data: DataDir, decode: Callable[[list[int]], str]
) -> Iterator[tuple[str, Messages | None]]:
    """(prompt id, messages or None when it makes no prompt) in the source's order."""
    if isinstance(source, Derived):
        for parent in source.parents:
            for parent_id, messages, answer in data.answers(parent, decode):
                yield f"{source.name}<{parent_id}", source.make(parent_id, messages, answer)
        return
    index = 0
    while source.size is None or index < source.size:
        yield f"{source.name}:{index}", source.prompt(index)
        index += 1


# --- growing ---------------------------------------------------------------------------------


@dataclass
class GrowReport:
    source: str
    held_before: int  # response tokens of this source and settings before the run
    held: int  # ... after it
    sequences: int  # answered in this run
    shards: int  # written in this run
    seconds: float  # generation time of this run
    exhausted: bool  # the source had no more prompts

    @property
    def tokens_per_second(self) -> float:
        return (self.held - self.held_before) / self.seconds if self.seconds else 0.0


def held_tokens(data: DataDir, source: str, settings: GenerationSettings) -> int:
    return sum(
        info.response_tokens for info in data.shards() if info.source == source and info.settings_key == settings.key()
    )


def grow(
    data: DataDir,
    engine: Any,
    source: PromptSource | Derived,
    settings: GenerationSettings,
    tokens: int,
    shard_sequences: int = DEFAULT_SHARD_SEQUENCES,
    progress: Progress | None = None,
) -> GrowReport:
    """Answer ``source``'s prompts not yet in ``data`` (same settings) until it holds
    ``tokens`` response tokens of them, ``engine``'s slots at a time in shared passes.
    Ctrl+C (KeyboardInterrupt) writes the answers finished so far as a shard, then re-raises."""
    from verispec.engine import PromptError
    from verispec.scheduler import Scheduler

    if tokens < 1 or shard_sequences < 1:
        raise ShardError(f"tokens and shard sequences must be >= 1, got {tokens}, {shard_sequences}")
    slots = int(getattr(engine.target, "slots", 1))
    scheduler = Scheduler(engine, max_running=slots, max_rows=max(256, 4 * slots))
    # Answers are quoted without their end-of-turn token's text, which a quoting prompt would
    # otherwise carry into its own turn (the chat template reads it as a special token).
    decode = functools.partial(engine.tokenizer.decode, skip_special_tokens=True)
    before = held = held_tokens(data, source.name, settings)
    done = data.covered(source.name, settings)
    todo = ((i, m) for i, m in candidates(source, data, decode) if i not in done)
    answered: list[tuple[str, Messages, list[int], list[int]]] = []
    skipped: dict[str, str] = {}
    running: dict[Any, tuple[str, Messages]] = {}
    sequences = shards = 0
    seconds = shard_seconds = 0.0
    exhausted = False

    def flush() -> None:
        nonlocal answered, skipped, shard_seconds, shards
        if answered or skipped:
            data.write(source, settings, answered, skipped, shard_seconds)
            shards += 1
        answered, skipped, shard_seconds = [], {}, 0.0

    pending: tuple[str, Messages, Any] | None = None
    try:
        while True:
            while held + _expected(running, held - before, sequences, settings) < tokens and len(running) < slots:
                if pending is None:
                    item = next(todo, None)
                    if item is None:
                        exhausted = True
                        break
                    prompt_id, messages = item
                    if messages is None:
                        skipped[prompt_id] = "no prompt made"
                        continue
                    try:
                        request = engine.request(
                            encode_conversation(engine.tokenizer, messages),
                            drafter="none",
                            k=0,
                            max_tokens=settings.max_new_tokens,
                            temperature=settings.temperature,
                            seed=settings.request_seed(prompt_id),
                        )
                    except PromptError as error:
                        skipped[prompt_id] = str(error)
                        continue
                    pending = (prompt_id, messages, request)
                if not scheduler.can_start(pending[2]):
                    break
                running[scheduler.start(pending[2])] = pending[:2]
                pending = None
            if not scheduler.running:
                break
            report = scheduler.step()
            seconds += report.seconds
            shard_seconds += report.seconds
            for job in running:
                job.take()  # text pieces: only the token ids are kept
            for job in [j for j in running if j.finished]:
                prompt_id, messages = running.pop(job)
                if job.error is not None:
                    skipped[prompt_id] = f"{type(job.error).__name__}: {job.error}"
                    continue
                context = job.request.context
                prompt_length = len(job.request.prompt_ids)
                answered.append((prompt_id, messages, context[:prompt_length], context[prompt_length:]))
                held += len(context) - prompt_length
                sequences += 1
                if progress is not None:
                    progress(held, tokens, seconds)
                if len(answered) >= shard_sequences:
                    flush()
    except KeyboardInterrupt:
        for job in list(running):
            scheduler.cancel(job)
        flush()
        raise
    flush()
    return GrowReport(source.name, before, held, sequences, shards, round(seconds, 2), exhausted)


def answer_prompts(
    engine: Any, prompts: list[list[int]], max_new_tokens: int, temperature: float = 0.0, seed: int = 0
) -> list[list[int]]:
    """The target's answers (ids, the end-of-sequence token included when written) to ``prompts``
    (token ids), in their order, ``engine``'s slots at a time in shared passes: greedy, or
    sampled at ``temperature`` with the i-th prompt's seed made from (``seed``, i), so the
    same answers come back whatever the batch."""
    from verispec.scheduler import Scheduler

    slots = int(getattr(engine.target, "slots", 1))
    scheduler = Scheduler(engine, max_running=slots, max_rows=max(256, 4 * slots))
    answers: list[list[int]] = [[] for _ in prompts]
    waiting = list(enumerate(prompts))
    running: dict[Any, int] = {}
    settings = GenerationSettings(temperature, max_new_tokens, seed)
    while waiting or running:
        while waiting:
            index, ids = waiting[0]
            request = engine.request(
                ids,
                drafter="none",
                k=0,
                max_tokens=max_new_tokens,
                temperature=temperature,
                seed=None if temperature == 0 else settings.request_seed(str(index)),
            )
            if not scheduler.can_start(request):
                break
            running[scheduler.start(request)] = index
            waiting.pop(0)
        scheduler.step()
        for job in [j for j in running if j.finished]:
            index = running.pop(job)
            if job.error is not None:
                raise job.error
            answers[index] = job.request.context[len(job.request.prompt_ids) :]
        for job in running:
            job.take()
    return answers


def _expected(running: dict[Any, Any], written: int, answers: int, settings: GenerationSettings) -> int:
    """Tokens the running requests are expected to add: each at least what it has written, and
    the mean answer so far (half the longest before any), so that a run admits no more prompts
    than its tokens need."""
    mean = written // answers if answers else settings.max_new_tokens // 2
    return sum(max(mean, len(job.request.context) - len(job.request.prompt_ids)) for job in running)


def summary(data: DataDir) -> list[dict[str, Any]]:
    """Per (source, settings): shards, sequences, response tokens, generation seconds, licence."""
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    for info in data.shards():
        row = rows.setdefault(
            (info.source, info.settings_key),
            {"source": info.source, **info.settings, "shards": 0, "sequences": 0, "tokens": 0, "seconds": 0.0},
        )
        row["licence"] = info.licence
        row["shards"] += 1
        row["sequences"] += len(info.ids)
        row["tokens"] += info.response_tokens
        row["seconds"] += info.seconds
    return list(rows.values())
