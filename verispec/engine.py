"""The engine: prefill -> rounds (draft, one verify pass, decide, commit, roll back) -> stop.

One round::

    draft  = drafter.propose(context, k)                 # up to k tokens (+ their q rows)
    logits = target.verify([last committed] + draft)     # k + 1 rows, one forward pass
    p      = final_distributions(logits, history)        # the same pipeline the drafter used
    kept, bonus = accept_chain(p, draft, q, uniforms)    # the exact rule, uniforms from the RNG
                                                         # (greedy: on p's tokens; sampled: p's rows
                                                         # computed as the rule reads them; chain_verdict)
    commit kept drafts + bonus, stopping exactly at EOS / stop string / max_tokens / context
    target.rollback(len(context) - 1)                    # the rejected tail leaves the cache

The engine owns the per-request RNG (seeded from ``seed``) and the loop; drafters propose,
targets compute, ``accept`` decides, ``stats`` counts.

A request's rounds are a coroutine (``_lifecycle``) that hands its forward passes out
(``Prefill``, ``Verify``) and gets their results back, so two drivers run the same code:
``stream`` runs one request on the target itself, and ``verispec.scheduler.Scheduler`` steps
many requests, each on a sequence of the target's cache, in shared forward passes.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Generator, Iterator, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from verispec.accept import ChainResult
from verispec.accept_tree import TreeResult, tree_depths
from verispec.detokenize import TextStream
from verispec.drafters.base import Drafter, DrafterContext
from verispec.drafters.registry import LEARNING_DRAFTERS, check_options, create_drafter
from verispec.errors import UserError
from verispec.governor import ALONE, Load
from verispec.memory import RELEASE_AFTER_TOKENS, release_free_memory
from verispec.planner import AUTO, DEFAULT_K_MAX, Planner, RequestPlanner, calibrate, chain_verdict, tree_verdict
from verispec.sampling import InvalidParameterError, SamplingParams
from verispec.stats import RequestStats
from verispec.targets.base import Target, TargetError, check_can_run, prefill_steps


class PromptError(UserError, ValueError):
    """The prompt cannot be run: empty, or too long for the context."""

    def __init__(self, message: str, prompt_tokens: int = 0, context_length: int = 0) -> None:
        super().__init__(message)
        self.prompt_tokens = prompt_tokens
        self.context_length = context_length


@dataclass
class Generation:
    """One finished request. ``finish_reason``: "stop" (EOS or stop string) or "length"."""

    text: str
    token_ids: list[int]
    prompt_tokens: int
    finish_reason: str
    stats: RequestStats
    seed: int
    drafter: str
    k: int | str


@dataclass
class Request:
    """One request as the engine runs it: what was asked, and its state so far (``context``:
    prompt then committed tokens; ``result`` once it has ended)."""

    prompt_ids: list[int]
    params: SamplingParams
    drafter: Drafter
    k: int | str
    k_max: int
    seed: int
    text: TextStream
    stats: RequestStats = field(default_factory=RequestStats)
    planner: RequestPlanner | None = None
    context: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    result: Generation | None = None
    load: Load = ALONE  # the other requests sharing its next pass (set by a scheduler)
    # Whether its driver verifies trees of drafts (``Verify.parents``); a driver that cannot
    # (a scheduler's shared passes) sets False, and a tree proposal is cut to its main chain.
    trees: bool = True
    # Who asks (a server's API key): a scheduler reuses a cached prompt prefix only from a
    # request of the same scope, so one key's prompts cannot be probed by another's timings.
    scope: str | None = None


@dataclass
class Prefill:
    """A request's prompt (all but its pending token) to cache; the driver may run it in chunks
    and adds their seconds to the request's ``stats.prefill_seconds``. Resumes with None."""

    ids: list[int]


@dataclass
class Verify:
    """The pending token and the drafts, one verify pass; resumes with (logits, seconds, rows,
    neighbours, prompt_rows): the pass's seconds and rows, how many other requests shared it,
    and how many of its rows were other requests' prompt chunks.
    ``parents``: None for a chain; for a tree of drafts, each draft's parent (-1: the pending
    token), verified with ``target.verify_tree`` (``verispec.accept_tree``)."""

    ids: list[int]
    parents: list[int] | None = None


# What a request's coroutine yields: a forward pass it needs, or a text piece for its consumer
# (one per round, empty when the round completed no character, and "" between prefill chunks).
Work = Prefill | Verify
Steps = Generator[Work | str, Any, None]


class GenerationStream:
    """Iterates over text pieces, one per round (empty when a round completed no character);
    ``result`` is set once it ends; ``stats`` counts the request so far (also when closed early).

    Closing it early (``close()`` or leaving a ``with`` block) ends the request, and the
    target's cache is reset in the engine's ``finally``.
    """

    def __init__(self) -> None:
        self._pieces: Iterator[str] = iter(())
        self.result: Generation | None = None
        self.stats = RequestStats()

    def __iter__(self) -> Iterator[str]:
        return self._pieces

    def __next__(self) -> str:
        return next(self._pieces)

    def close(self) -> None:
        close = getattr(self._pieces, "close", None)
        if close is not None:
            close()

    def __enter__(self) -> GenerationStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Engine:
    """Keeps a target (and its tokenizer) loaded and runs requests on it: ``stream`` one at a
    time, a ``verispec.scheduler.Scheduler`` many at once in shared passes."""

    def __init__(
        self,
        target: Target,
        tokenizer: Any = None,
        *,
        name: str | None = None,
        default_chat: bool | None = None,
        drafter_options: dict[str, Any] | None = None,
        load_seconds: float = 0.0,
    ) -> None:
        self.target = target
        self.tokenizer = tokenizer
        self.name = name or target.name
        has_template = getattr(tokenizer, "chat_template", None) is not None
        self.default_chat = has_template if default_chat is None else default_chat
        self.drafter_options = dict(drafter_options or {})
        self.load_seconds = load_seconds
        # Per drafter: round costs as calibrated and as refined, and recent acceptance.
        self.planner = Planner()
        self._lock = threading.Lock()
        self._drafters: dict[tuple[str, tuple[tuple[str, Any], ...]], Drafter] = {}

    # --- building blocks -----------------------------------------------------------------

    def encode(self, prompt: str | Sequence[int] | Sequence[dict[str, str]], chat: bool | None = None) -> list[int]:
        """Token ids of a prompt: a string (chat template applied when ``chat``), chat
        messages (a list of {"role", "content"}), or ids as they are."""
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise PromptError("this engine has no tokenizer: pass the prompt as token ids")
            use_chat = self.default_chat if chat is None else chat
            if use_chat:
                ids = self._apply_chat([{"role": "user", "content": prompt}])
            else:
                ids = list(self.tokenizer(prompt)["input_ids"])
        elif prompt and isinstance(prompt[0], dict):
            if self.tokenizer is None:
                raise PromptError("this engine has no tokenizer to apply a chat template with")
            ids = self._apply_chat(list(prompt))  # type: ignore[arg-type]
        else:
            ids = [int(t) for t in prompt]  # type: ignore[arg-type]
        if not ids:
            raise PromptError("the prompt is empty: at least one token is needed")
        vocab = self.target.vocab_size
        if min(ids) < 0 or max(ids) >= vocab:
            raise PromptError(f"the prompt holds a token id outside the vocabulary [0, {vocab})")
        return ids

    def _apply_chat(self, messages: list[dict[str, str]]) -> list[int]:
        if getattr(self.tokenizer, "chat_template", None) is None:
            raise PromptError(f"{self.name} has no chat template; use plain prompts (--no-chat)")
        encoded = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        ids = encoded["input_ids"] if isinstance(encoded, dict) or hasattr(encoded, "keys") else encoded
        return [int(t) for t in ids]

    def drafter(self, name: str, *, fresh: bool = False, **options: Any) -> Drafter:
        """The drafter ``name`` for this engine's target, built once per set of options, or
        with ``fresh`` a new one kept apart (a drafter that learns across requests, such as
        ``suffix``, then learns only from the requests it serves). ``options`` are that
        drafter's own (``registry.DRAFTER_OPTIONS``); any other is refused (``DrafterError``)."""
        check_options(name, options)  # before the engine-wide ones, which every drafter is handed
        merged = {**self.drafter_options, **options}
        if fresh:
            return create_drafter(name, DrafterContext(self.target, self.tokenizer, merged))
        key = (
            name,
            tuple(sorted((k, id(v) if not isinstance(v, (int, str, float)) else v) for k, v in merged.items())),
        )
        if key not in self._drafters:
            self._drafters[key] = create_drafter(name, DrafterContext(self.target, self.tokenizer, merged))
        return self._drafters[key]

    # --- requests ------------------------------------------------------------------------

    def stream(self, prompt: str | Sequence[int] | Sequence[dict[str, str]], **options: Any) -> GenerationStream:
        """Start a request (``options`` as ``request`` takes them) and run it alone on the
        target; iterate the returned stream for text pieces."""
        request = self.request(prompt, **options)
        stream = GenerationStream()
        stream.stats = request.stats
        stream._pieces = self._run(request, stream)
        return stream

    def request(
        self,
        prompt: str | Sequence[int] | Sequence[dict[str, str]],
        *,
        drafter: str | Drafter = "lookup",
        k: int | str = AUTO,
        k_max: int = DEFAULT_K_MAX,
        chat: bool | None = None,
        params: SamplingParams | None = None,
        scope: str | None = None,
        **sampling: Any,
    ) -> Request:
        """A checked request, ready to run (``stream`` runs it; so does a ``Scheduler``).

        ``k``: drafts per round, fixed, or "auto" for the economics governor, which picks
        0..``k_max`` before every round from the measured costs and acceptance; ``params``
        or the keywords of ``SamplingParams``: the sampling settings. ``scope``: who asks (a
        server's API key); a drafter that learns from earlier requests (``LEARNING_DRAFTERS``)
        then learns from and drafts with that scope's requests only.
        """
        if k != AUTO and (isinstance(k, bool) or not isinstance(k, int) or k < 0):
            raise InvalidParameterError("k", f"must be an integer >= 0 or 'auto', got {k!r}")
        if isinstance(k_max, bool) or not isinstance(k_max, int) or k_max < 0:
            raise InvalidParameterError("k_max", f"must be an integer >= 0, got {k_max!r}")
        params = params if params is not None else SamplingParams(**sampling)
        prompt_ids = self.encode(prompt, chat)
        try:
            check_can_run(self.target, len(prompt_ids))
        except TargetError as error:
            raise PromptError(str(error), len(prompt_ids), self.target.context_length) from error
        if isinstance(drafter, str):
            scoped = scope is not None and drafter in LEARNING_DRAFTERS
            the_drafter = self.drafter(drafter, scope=scope) if scoped else self.drafter(drafter)
        else:
            the_drafter = drafter
        seed = params.seed if params.seed is not None else secrets.randbits(63)
        text = TextStream(self.tokenizer, params.stop)
        return Request(prompt_ids, params, the_drafter, k, k_max, seed, text, scope=scope)

    def generate(self, prompt: str | Sequence[int] | Sequence[dict[str, str]], **options: Any) -> Generation:
        """Run a request to the end; see ``stream`` for the options."""
        stream = self.stream(prompt, **options)
        for _ in stream:
            pass
        assert stream.result is not None
        return stream.result

    def _run(self, request: Request, stream: GenerationStream) -> Iterator[str]:
        """Drive one request on the target itself: its passes run as it asks for them."""
        with self._lock:
            steps = self.lifecycle(request, self.target, request.drafter)
            try:
                result: Any = None
                while True:
                    with self.between_passes():  # never across a yield: the consumer's code is its own
                        try:
                            work = steps.send(result)
                        except StopIteration:
                            break
                        result = None
                        if isinstance(work, Verify):
                            start = time.perf_counter()
                            if work.parents is not None:
                                logits = self.target.verify_tree(work.ids, work.parents)  # type: ignore[attr-defined]
                            else:
                                logits = self.target.verify(work.ids)
                            result = (logits, time.perf_counter() - start, len(work.ids), 0, 0)
                    if isinstance(work, str):
                        yield work
                    elif isinstance(work, Prefill):
                        for seconds in prefill_steps(self.target, work.ids):
                            request.stats.prefill_seconds += seconds
                            yield ""
                        request.stats.cached_prompt_tokens = getattr(self.target, "reused_tokens", 0)
            finally:
                steps.close()
        stream.result = request.result

    def between_passes(self) -> AbstractContextManager[Any]:
        """The scope of a request's work between forward passes (drafting, sampling, the
        rule): the target's own (``between_passes``, native: torch on one thread), else none."""
        scope = getattr(self.target, "between_passes", None)
        return scope() if scope is not None else nullcontext()

    def lifecycle(self, request: Request, target: Target, drafter: Drafter) -> Steps:
        """The request's coroutine on ``target`` (the engine's target, or one sequence of its
        cache) with ``drafter`` (the request's, or one of its own for a concurrent request):
        the rounds, then the result in ``request.result``; however it ends (finished, closed,
        failed), the sequence's cache and the drafter are reset."""
        # A drafter trained on the target's hidden states says which ones it reads
        # (``hidden_capture``); the target keeps them from its own passes for this request.
        capture = drafter.hidden_capture
        try:
            if capture is not None:
                target.capture_hidden(capture)  # type: ignore[attr-defined]
            yield from self._rounds(request, target, drafter)
            if request.planner is not None:
                self.planner.finish(request.planner)
        finally:
            target.reset()
            drafter.reset()
            if capture is not None:
                target.capture_hidden(None)  # type: ignore[attr-defined]
            if len(request.context) >= RELEASE_AFTER_TOKENS:
                release_free_memory()  # a long prompt's temporaries: see verispec/memory.py
        request.result = Generation(
            text=request.text.text,
            token_ids=request.context[len(request.prompt_ids) :],
            prompt_tokens=len(request.prompt_ids),
            finish_reason=request.finish_reason or "length",
            stats=request.stats,
            seed=request.seed,
            drafter=drafter.name,
            k=request.k,
        )

    def _rounds(self, request: Request, target: Target, drafter: Drafter) -> Steps:
        params, stats = request.params, request.stats
        rng = np.random.default_rng(request.seed)
        prompt, context = request.prompt_ids, request.context
        context.extend(prompt)
        stats.prompt_tokens = len(prompt)
        yield Prefill(prompt[:-1])
        drafter.begin(prompt, params)
        planner = request.planner = self.planner.begin(
            drafter,
            stats,
            lambda k_max: calibrate(target, drafter, context, len(prompt), params, k_max),
            request.k,
            request.k_max,
            # A seeded sampled request must get the same k schedule every time.
            reproducible=params.seed is not None and not params.greedy,
        )
        while request.finish_reason is None:
            room = min(params.max_tokens - (len(context) - len(prompt)), target.context_length - len(context))
            if room <= 0:
                request.finish_reason = "length"
                break
            t0 = time.perf_counter()
            planner.trees = request.trees and hasattr(target, "verify_tree")
            draft = planner.plan(context, room, rng, request.load).draft
            if draft.is_tree and not (request.trees and hasattr(target, "verify_tree")):
                draft = draft.main_chain()
            tree = draft.parents if draft.is_tree else None
            t1 = time.perf_counter()
            logits, verify_seconds, verify_rows, neighbours, prompt_rows = yield Verify(
                [context[-1], *draft.tokens], tree
            )
            stats.observe_pass(neighbours + 1, verify_rows)
            t2 = time.perf_counter()
            output = context[len(prompt) :]
            uniforms = rng.random(2 * len(draft.tokens) + 1)
            verdict: ChainResult | TreeResult
            if tree is None:
                verdict, shadow = chain_verdict(logits, params, prompt, output, draft.tokens, draft.probs, uniforms)
                kept, offered = draft.tokens[: verdict.accepted], len(draft.tokens)
            else:
                verdict, shadow = tree_verdict(
                    logits, params, prompt, output, draft.tokens, tree, draft.probs, uniforms
                )
                path = verdict.path
                kept, offered = [draft.tokens[node] for node in path], int(max(tree_depths(tree)))
                target.keep_path(path)  # type: ignore[attr-defined]  # the cache keeps the path
                stats.tree_rounds += 1
                stats.tree_nodes += len(tree)
            # The verify's cost: its pass (shared with other requests under a scheduler) and the rule.
            verify_s = verify_seconds + time.perf_counter() - t2

            committed = self._commit(request, [*kept, verdict.token])
            accepted = min(verdict.accepted, committed)
            # A tree's offered positions are its depth: per-position acceptance reads as a
            # chain's would (its other nodes are extra rows of the pass, in ``pass_rows``).
            stats.observe(offered, accepted, int(committed == verdict.accepted + 1), t1 - t0, verify_s)
            # A pass that also read prompt chunks does not price rows: its time is mostly theirs.
            planner.observe(
                offered,
                verdict.accepted,
                t1 - t0,
                verify_s,
                shadow,
                verify_rows,
                None if tree is None else path,
                timed=prompt_rows == 0,
            )
            if request.finish_reason is None:
                target.rollback(len(context) - 1)
                drafter.observe(context, accepted)
            # One piece per round, empty when the round completed no character: a consumer
            # gets control back every round (to notice a client that left, say).
            yield request.text.take(final=request.finish_reason is not None)
        tail = request.text.take(final=True)
        if tail:
            yield tail

    def _commit(self, request: Request, tokens: list[int]) -> int:
        """Append tokens until one ends the sequence; returns how many were committed."""
        eos = self.target.eos_token_ids
        limit = len(request.prompt_ids) + request.params.max_tokens
        for count, token in enumerate(tokens, start=1):
            request.context.append(token)
            stopped = request.text.add(token)
            if token in eos or stopped:
                request.finish_reason = "stop"
            elif len(request.context) >= min(limit, self.target.context_length):
                request.finish_reason = "length"
            if request.finish_reason is not None:
                return count
        return len(tokens)
