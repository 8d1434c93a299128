"""The native backend: verispec's own decoder (``verispec/native``) as a Target.

Weights come straight from the GGUF file or safetensors directory in the format
``--weights`` asks (see ``native/checkpoint.py``); the KV cache is preallocated for the
context and written in place, so a rollback only lowers the cached length. On the CPU the
forward pass runs in the C++ kernels, whose verify rows are bit-identical to single steps
by construction; the load-time ``self_test`` checks it on the real weights, over short
contexts and past 1,024 keys, and falls back to verifying row by row (with a warning) if it
ever fails. Elsewhere (CUDA), or where the kernels cannot be built, the torch path runs.

Prefill goes through the same kernels in chunks of ``PREFILL_CHUNK`` tokens, so a long
prompt costs memory for one chunk at a time.

Sequences: the cache holds ``slots`` sequences side by side. The target itself is sequence 0
(the Target protocol); ``sequence(i)`` is a Target for sequence i, and ``run(passes)`` runs
passes of several sequences as one forward pass (continuous batching: the engine's
scheduler). Rows stay bit-identical to single steps whatever shares their pass: the
self-test checks it across two sequences too.

Prefix reuse: ``reset`` ends a request but leaves its positions in the sequence's cache, and
the next ``prefill`` keeps the longest prefix the new prompt shares with what the cache holds
(a system prompt, the earlier turns of a chat, a file the request edits again) and computes
only the rest, as llama.cpp's server and vLLM's prefix caching do. It is exact: a position's
keys and values are the same bits whatever pass computed them (a prefill chunk, a verify
pass, a single step), which the self-test checks at load (``prefix_reuse_exact``); where it
fails, every prefill starts afresh. ``drop_cache`` forgets what the cache holds (the bench
starts each run cold), and a scheduler picks, for a new request, the free sequence holding
the longest prefix of its prompt (``shared_prefix``).

Trees: ``verify_tree(ids, parents)`` verifies a token tree of one sequence in one pass (see
``native_tree``), each row bit-identical to the single step plain decoding would run along
its path; ``keep_path(path)`` then keeps the accepted path in the cache. The self-test checks
a small tree too; where that fails, each root-to-leaf path is verified on its own (exact,
slower), with a warning.
"""

from __future__ import annotations

import hashlib
import time
import warnings
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

import numpy as np
import torch

from verispec.native import checkpoint as checkpoints
from verispec.native import formats, kernels
from verispec.native import head_stack as head_stacks
from verispec.native.decoder import KernelDecoder, Segment, TorchDecoder, torch_alone_between_passes
from verispec.targets.base import HiddenCapture, Logits, Pass, TargetError
from verispec.targets.native_tree import TreeRound, checked_path, checked_tree, leaf_paths, path_ids

DEFAULT_CONTEXT = 8192  # positions, capped by the model's trained context
PREFILL_CHUNK = 256  # prompt tokens per forward pass while prefilling


class NativeTarget:
    """A Llama-family checkpoint on verispec's native decoder, as a verispec Target.

    source_kind, location: "gguf" and a file, or "dir" and a transformers directory;
    weights: auto, bf16, int8 or int4; device: "cpu" (the C++ kernels) or a torch device;
    context: positions to preallocate (default: the model's, at most ``DEFAULT_CONTEXT``);
    eos_token_ids: ids that end a sequence besides the checkpoint config's (the tokenizer's,
    a generation config's); dtype: the torch path's compute dtype (default float32 on the
    CPU, bfloat16 on CUDA); compile: the torch path's layers through ``torch.compile``
    (default: on a GPU; the CPU runs the C++ kernels, which beat the compiled torch path there,
    see BENCHMARKS.md); torch_path: run the torch path on the CPU too (for comparisons; the
    environment variable VERISPEC_NATIVE_KERNELS=0 does the same); slots: sequences the cache
    holds (see the module docstring; a slot's pages cost memory once it runs).
    """

    def __init__(
        self,
        source_kind: str,
        location: str | Path,
        name: str = "model",
        weights: str = "auto",
        device: str = "cpu",
        context: int | None = None,
        eos_token_ids: Sequence[int] = (),
        dtype: torch.dtype | None = None,
        compile: bool | None = None,
        torch_path: bool = False,
        slots: int = 1,
    ) -> None:
        from verispec.cpu import cpu_threads

        if isinstance(slots, bool) or not isinstance(slots, int) or slots < 1:
            raise TargetError(f"slots must be an integer >= 1, got {slots!r}")
        self.name = name
        self.slots = slots
        start = time.perf_counter()
        try:
            self.checkpoint = checkpoints.read(source_kind, location, weights)
        except checkpoints.CheckpointError as error:
            raise TargetError(str(error)) from error
        config = self.checkpoint.config
        trained = int(getattr(config, "max_position_embeddings", 0) or DEFAULT_CONTEXT)
        window = _sliding_window(config)
        self._context = min(context or DEFAULT_CONTEXT, trained, window or trained)
        if self._context < 2:
            raise TargetError(f"a context of {self._context} positions leaves no room to generate")
        own = config.eos_token_id if isinstance(config.eos_token_id, (list, tuple)) else [config.eos_token_id]
        self._eos = frozenset(int(t) for t in [*own, *eos_token_ids] if t is not None)
        self.device = torch.device(device)
        if self.device.type == "cpu":
            torch.set_num_threads(cpu_threads())
        wants_kernels = self.device.type == "cpu" and not (torch_path or kernels.disabled())
        module = kernels.load() if wants_kernels else None
        try:
            if module is not None:
                self.decoder: KernelDecoder | TorchDecoder = KernelDecoder(
                    self.checkpoint, self._context, module, slots
                )
            else:
                if wants_kernels:
                    warnings.warn(
                        f"{name}: the native kernels could not be built ({kernels.build_error()}); "
                        "running the native decoder's torch path (several times slower)",
                        stacklevel=2,
                    )
                use_compile = self.device.type == "cuda" if compile is None else compile
                self.decoder = TorchDecoder(self.checkpoint, self._context, str(self.device), dtype, use_compile, slots)
        except checkpoints.CheckpointError as error:
            raise TargetError(str(error)) from error
        self.load_seconds = time.perf_counter() - start
        # Per sequence: cached positions, the hidden states it captures and its last ones.
        self._lengths = [0] * slots
        # Per sequence: the tokens whose keys and values its cache holds, position by position
        # (the request's first ``_lengths``, then what a reset left for the next prefill), and
        # how many positions the last prefill kept.
        self._held: list[list[int]] = [[] for _ in range(slots)]
        self._reused = [0] * slots
        self._captures: list[HiddenCapture | None] = [None] * slots
        self._hidden: list[torch.Tensor | None] = [None] * slots
        self._trees: list[TreeRound | None] = [None] * slots  # a tree pass whose path is not yet kept
        self._sequences = [NativeSequence(self, i) for i in range(slots)]
        self._embeddings: torch.Tensor | None = None
        self._head: torch.Tensor | None = None
        self._draft_heads: dict[str, Any] = {}  # kernels matrices of draft vocabularies' LM head rows
        self._fingerprint: str | None = None
        self.tree_verify_exact = False  # set by the self-test
        self.prefix_reuse_exact = False  # set by the self-test
        self.batched_verify_exact = self.self_test()
        if not self.batched_verify_exact:
            warnings.warn(
                f"{name}: verify rows differ from single steps on the native {self.decoder.path} path; "
                "verifying row by row to stay exact (slower)",
                stacklevel=2,
            )
        elif not self.tree_verify_exact:
            warnings.warn(
                f"{name}: tree verify rows differ from single steps on the native {self.decoder.path} path; "
                "verifying each root-to-leaf path on its own to stay exact (slower)",
                stacklevel=2,
            )

    # --- the Target protocol -----------------------------------------------------------

    @property
    def path(self) -> str:
        """Which forward runs: "kernels" (C++) or "torch"."""
        return self.decoder.path

    def between_passes(self) -> AbstractContextManager[None]:
        """The scope the engine runs a request's work between passes in: torch on one thread
        where the passes run in the kernels (see ``torch_alone_between_passes``)."""
        return torch_alone_between_passes() if self.decoder.path == "kernels" else nullcontext()

    @property
    def description(self) -> str:
        """What runs, for the CLI and the bench: the path and the weights."""
        compiled = getattr(self.decoder, "compile_seconds", None)
        path = f"torch, compiled in {compiled:.0f} s" if compiled is not None else self.decoder.path
        if getattr(self.decoder, "amx", False):
            path += " (wide layout: VNNI rows, AMX tiles for passes of 9+ rows)"
        elif getattr(self.decoder, "wide", False):
            path += " (wide layout: VNNI rows)"
        return f"native {path}, {checkpoints.describe(self.checkpoint)}"

    @property
    def vocab_size(self) -> int:
        return int(self.checkpoint.head.rows)

    @property
    def context_length(self) -> int:
        return self._context

    @property
    def eos_token_ids(self) -> frozenset[int]:
        return self._eos

    @property
    def supports_rollback(self) -> bool:
        return True

    @property
    def cached_tokens(self) -> int:
        return self._lengths[0]

    def reset(self) -> None:
        self._reset(0)

    @property
    def reused_tokens(self) -> int:
        """Positions the last prefill kept from what the cache held (prefix reuse)."""
        return self._reused[0]

    def drop_cache(self) -> None:
        """Reset every sequence and forget what a later prefill could reuse: the next request
        on any of them starts cold."""
        for slot in range(self.slots):
            self._drop(slot)

    def shared_prefix(self, token_ids: Sequence[int]) -> int:
        """How many leading positions of ``token_ids`` a prefill would keep (see the module)."""
        return self._shared_prefix(0, token_ids)

    def prefill(self, token_ids: Sequence[int]) -> None:
        for _ in self.prefill_chunks(token_ids):
            pass

    def prefill_chunks(self, token_ids: Sequence[int]) -> Iterator[int]:
        """``prefill`` a chunk of ``PREFILL_CHUNK`` tokens at a time, yielding the positions
        cached after each (the engine lets its consumer stop a request there)."""
        return self._prefill_chunks(0, token_ids)

    def verify(self, token_ids: Sequence[int]) -> Logits:
        return self._verify(0, token_ids)

    def rollback(self, length: int) -> None:
        self._rollback(0, length)

    def verify_tree(self, token_ids: Sequence[int], parents: Sequence[int]) -> Logits:
        """Verify a token tree in one pass: ``token_ids`` = [root, node 0, ..., node n-1], the
        root being the pending token (as ``verify``'s first id), ``parents`` (n,) as in
        ``accept_tree`` (node j's parent < j, -1 for the root). Returns (n + 1, V) float32
        logits: row 0 the root's, row j + 1 node j's, each exactly what single steps along
        that node's path would give. Afterwards ``cached_tokens`` is the root's position + 1
        (the tree's other rows are not a sequence yet): call ``keep_path`` with the accepted
        path before the next pass, or ``rollback`` to drop the whole tree."""
        return self._verify_tree(0, token_ids, parents)

    def keep_path(self, path: Sequence[int]) -> None:
        """After ``verify_tree``: keep the accepted ``path`` (nodes root to leaf, each the
        child of the one before; may be empty) as if its tokens had been decoded one by one,
        so ``cached_tokens`` becomes the root's position + 1 + len(path). The captured hidden
        states (``last_hidden``) become the rows of the root and the path."""
        self._keep_path(0, path)

    # --- several sequences ---------------------------------------------------------------

    def sequence(self, slot: int) -> NativeSequence:
        """Sequence ``slot`` of the cache as a Target of its own (0 is this target)."""
        if not 0 <= slot < self.slots:
            raise TargetError(f"{self.name} holds sequences 0..{self.slots - 1}, not {slot}")
        return self._sequences[slot]

    def run(self, passes: Sequence[Pass]) -> list[Logits | None]:
        """Run ``passes`` (each a sequence's tokens, at most one per sequence) as one forward
        pass: each sequence's tokens are appended to its cache, and a pass that asks for
        logits gets (len(ids), V) float32, the rows ``verify`` would give it alone (a prefill
        chunk asks for none; its sequence's captured states are kept as prefill keeps them)."""
        slots = [p.sequence.slot for p in passes]
        if len(set(slots)) != len(slots):
            raise TargetError("a pass holds at most one piece of each sequence")
        for p in passes:
            if p.sequence.owner is not self or not p.ids:
                raise TargetError("each pass needs tokens of one of this target's sequences")
            self._check_room(p.sequence.slot, len(p.ids))
        for slot in slots:
            self._trees[slot] = None
        if not self.batched_verify_exact:  # rows may not be stacked: one sequence at a time, row by row
            return [self._pass_alone(p) for p in passes]
        layers = sorted({i for p in passes if (c := self._captures[p.sequence.slot]) is not None for i in c.layers})
        segments = [Segment(p.sequence.slot, self._lengths[p.sequence.slot], list(p.ids), p.logits) for p in passes]
        logits, hidden = self.decoder.forward_segments(segments, tuple(layers))
        # One NumPy view of the pass's rows, sliced per request: a torch slice and its
        # ``.numpy()`` cost ~10 us each with the caches cold after the pass.
        rows = None if logits is None else logits.numpy()
        results: list[Logits | None] = []
        row = logit_row = 0
        for p in passes:
            slot, count = p.sequence.slot, len(p.ids)
            self._wrote(slot, self._lengths[slot], p.ids)
            capture = self._captures[slot]
            if capture is not None and hidden is not None:
                width = self.hidden_size  # this sequence's layers, out of the pass's union of layers
                columns = [layers.index(i) * width + c for i in capture.layers for c in range(width)]
                with self.between_passes():  # see _keep_hidden
                    states = hidden[row : row + count][:, columns]
                self._keep_hidden(slot, states, prefill=not p.logits)
            row += count
            if p.logits:
                assert rows is not None
                results.append(rows[logit_row : logit_row + count])
                logit_row += count
            else:
                results.append(None)
        return results

    def _pass_alone(self, p: Pass) -> Logits | None:
        slot = p.sequence.slot
        if p.logits:
            return self._verify(slot, p.ids)
        _, hidden = self._forward(slot, list(p.ids), logits=False)
        if hidden is not None:
            self._keep_hidden(slot, hidden, prefill=True)
        return None

    # --- one sequence ----------------------------------------------------------------------

    def _reset(self, slot: int) -> None:
        self._lengths[slot] = 0
        self._trees[slot] = None
        capture = self._captures[slot]
        # A capturing sequence starts with no states (an empty prefill leaves it so).
        self._hidden[slot] = None if capture is None else torch.zeros(0, len(capture.layers) * self.hidden_size)

    def _drop(self, slot: int) -> None:
        self._reset(slot)
        self._held[slot] = []

    def _wrote(self, slot: int, start: int, ids: Sequence[int]) -> None:
        """Positions ``start``.. now hold ``ids`` and the sequence ends after them: later ones
        were computed after other tokens, so they are no longer anyone's prefix."""
        held = self._held[slot]
        del held[start:]
        held.extend(ids)
        self._lengths[slot] = len(held)

    def _shared_prefix(self, slot: int, token_ids: Sequence[int]) -> int:
        if not self.prefix_reuse_exact:
            return 0
        kept = 0
        for held, token in zip(self._held[slot], token_ids, strict=False):
            if held != token:
                break
            kept += 1
        capture = self._captures[slot]
        if capture is not None:  # its last prefill_rows positions are computed, for their states
            kept = min(kept, max(0, len(token_ids) - capture.prefill_rows))
        return kept

    def _reuse(self, slot: int, token_ids: Sequence[int]) -> int:
        """Start a prefill of ``token_ids``: reset, keep the prefix the cache holds, return its
        length (the positions left to compute start there)."""
        kept = self._shared_prefix(slot, token_ids)
        self._reset(slot)
        del self._held[slot][kept:]
        self._lengths[slot] = self._reused[slot] = kept
        return kept

    def _prefill_chunks(self, slot: int, token_ids: Sequence[int]) -> Iterator[int]:
        ids = list(token_ids)
        kept = self._reuse(slot, ids)
        self._check_room(slot, len(ids) - kept)
        for start in range(kept, len(ids), PREFILL_CHUNK):
            _, hidden = self._forward(slot, ids[start : start + PREFILL_CHUNK], logits=False)
            if hidden is not None:
                self._keep_hidden(slot, hidden, prefill=True)
            yield self._lengths[slot]

    def _keep_hidden(self, slot: int, hidden: torch.Tensor, prefill: bool) -> None:
        """A pass's captured states: a verify pass's replace the last ones; a prefill chunk's
        join those of earlier chunks, of which the last ``prefill_rows`` are kept."""
        capture = self._captures[slot]
        if capture is None:
            return
        if not prefill:
            self._hidden[slot] = hidden
            return
        keep = capture.prefill_rows
        if keep == 0:
            self._hidden[slot] = hidden[:0]
            return
        before = self._hidden[slot]
        # Torch on this thread alone: a copy of a prompt's states on torch's pool left its
        # OpenMP worker spinning on a core the next passes' threads needed (the three 1-row
        # steps after a 200-token prefill took 21 ms instead of 14.5, on 2 Zen 2 cores).
        with self.between_passes():
            joined = hidden[-keep:] if before is None else torch.cat([before, hidden[-keep:]])
            self._hidden[slot] = joined[-keep:].clone()  # not a view that holds the whole chunk

    def _verify(self, slot: int, token_ids: Sequence[int]) -> Logits:
        if not token_ids:
            raise TargetError("verify needs at least one token")
        self._check_room(slot, len(token_ids))
        self._trees[slot] = None
        ids = list(token_ids)
        if self.batched_verify_exact:
            logits, hidden = self._forward(slot, ids, logits=True)
        else:
            rows = [self._forward(slot, [token], logits=True) for token in ids]
            logits = torch.cat([r[0] for r in rows])  # type: ignore[misc]
            hidden = None if rows[0][1] is None else torch.cat([r[1] for r in rows])  # type: ignore[misc]
        self._hidden[slot] = hidden
        assert logits is not None
        out: Logits = logits.numpy()
        return out

    def _rollback(self, slot: int, length: int) -> None:
        if not 0 <= length <= self._lengths[slot]:
            raise TargetError(f"cannot roll back to {length}: the cache holds {self._lengths[slot]} positions")
        self._lengths[slot] = length  # the cache is written in place: the next pass overwrites the rest
        del self._held[slot][length:]
        self._trees[slot] = None

    def _verify_tree(self, slot: int, token_ids: Sequence[int], parents: Sequence[int]) -> Logits:
        ids, par = checked_tree(token_ids, parents, self.vocab_size)
        self._check_room(slot, len(ids))
        start = self._lengths[slot]
        if self.batched_verify_exact and self.tree_verify_exact:
            capture = self._captures[slot]
            layers = capture.layers if capture is not None else ()
            logits, hidden = self.decoder.forward_tree(ids, start, par.tolist(), True, layers, slot)
            assert logits is not None
            plain_path = None
        else:  # each root-to-leaf path as a verify of its own; the last one stays in the cache
            logits, hidden = torch.empty(len(ids), self.vocab_size), None
            for plain_path in leaf_paths(par):
                self._lengths[slot] = start
                rows = [0] + [node + 1 for node in plain_path]
                logits[rows] = torch.from_numpy(self._verify(slot, path_ids(ids, plain_path)))
                if (states := self._hidden[slot]) is not None:
                    hidden = states.new_empty(len(ids), states.shape[1]) if hidden is None else hidden
                    hidden[rows] = states
        self._wrote(slot, start, ids[:1])  # the tree's other rows are not a sequence yet
        self._hidden[slot] = hidden
        self._trees[slot] = TreeRound(start, par, ids, plain_path, hidden)
        out: Logits = logits.numpy()
        return out

    def _keep_path(self, slot: int, path: Sequence[int]) -> None:
        tree = self._trees[slot]
        if tree is None:
            raise TargetError("keep_path follows verify_tree (with no other pass, rollback or reset between)")
        nodes = checked_path(tree.parents, path)
        if tree.plain_path is None:
            self.decoder.keep_path(tree.start, nodes, slot)
        elif tree.plain_path[: len(nodes)] != nodes:  # the fallback cached another path: run this one
            self._lengths[slot] = tree.start
            self._verify(slot, path_ids(tree.ids, nodes))
        self._wrote(slot, tree.start, path_ids(tree.ids, nodes))
        self._hidden[slot] = None if tree.hidden is None else tree.hidden[[0] + [node + 1 for node in nodes]]
        self._trees[slot] = None

    def self_test(self, contexts: tuple[int, ...] = (24, 1030), rows: tuple[int, ...] = (2, 5, 9)) -> bool:
        """Do verify passes of ``rows`` rows give exactly the logits of single steps? Run at
        load on synthetic contexts (token ids spread over the vocabulary), short and past
        1,024 keys; with several sequences, also in one pass with another sequence's rows.
        On the same contexts it checks a tree pass and a kept path against single steps
        and sets ``tree_verify_exact``, and a context cached in passes of other shapes
        against one prefill of it, setting ``prefix_reuse_exact``."""
        exact = tree_exact = reuse_exact = True
        captures, self._captures = self._captures, [None] * self.slots
        for context in sorted({min(c, self._context - max(rows)) for c in contexts}):
            ids = [(7919 * i + 11) % self.vocab_size for i in range(context + max(rows))]
            self._reset(0)
            self._forward(0, ids[:context], logits=False)
            single = [self._forward(0, [token], logits=True)[0] for token in ids[context:]]
            for count in rows:
                self._rollback(0, context)
                block, _ = self._forward(0, ids[context : context + count], logits=True)
                assert block is not None
                exact = exact and all(torch.equal(block[i], single[i][0]) for i in range(count))  # type: ignore[index]
            tree_exact = tree_exact and self._tree_exact(context, ids[context:])
            if self.slots > 1:  # the same rows beside a prefill chunk and a verify of sequence 1
                self._rollback(0, context)
                other = [(104729 * i + 3) % self.vocab_size for i in range(context + 3)]
                segments = [
                    Segment(1, 0, other[:context], False),
                    Segment(0, context, ids[context : context + max(rows)], True),
                ]
                block, _ = self.decoder.forward_segments(segments)
                assert block is not None
                exact = exact and all(torch.equal(block[i], single[i][0]) for i in range(max(rows)))  # type: ignore[index]
                self._reset(1)
            reuse_exact = reuse_exact and self._reuse_exact(context, ids, single[0][0])  # type: ignore[index]
        self._captures = captures
        for slot in range(self.slots):
            self._drop(slot)
        self.tree_verify_exact = tree_exact
        self.prefix_reuse_exact = exact and reuse_exact
        return exact

    def _reuse_exact(self, context: int, ids: list[int], expected: torch.Tensor) -> bool:
        """Part of the self-test: the step after ``context`` positions cached in passes of
        other shapes (a prefill chunk, verify passes of several sizes, single steps, a short
        chunk) against ``expected``, the step after one prefill of them: a kept prefix is then
        what a fresh prefill would have cached."""
        self._reset(0)
        position = context // 2
        self._forward(0, ids[:position], logits=False)
        for size in (5, 1, 9, 2, 1, 3):
            if position + size > context:
                break
            self._forward(0, ids[position : position + size], logits=True)
            position += size
        if position < context:
            self._forward(0, ids[position:context], logits=False)
        step, _ = self._forward(0, [ids[context]], logits=True)
        assert step is not None
        return torch.equal(step[0], expected)

    def _tree_exact(self, context: int, ids: list[int], parents: tuple[int, ...] = (-1, -1, 0, 0, 1)) -> bool:
        """Part of the self-test: a tree pass over ``ids`` after ``context`` cached positions
        of sequence 0, each row against single steps along its path, and one step after
        keeping the last leaf's path against one after decoding that path."""
        par = np.array(parents, dtype=np.int64)
        tree_ids, after = ids[: len(parents) + 1], ids[len(parents) + 1]
        single: dict[int, torch.Tensor] = {}
        for path in leaf_paths(par):
            self._rollback(0, context)
            for node, token in zip([-1, *path], path_ids(tree_ids, path), strict=True):
                single[node + 1] = self._forward(0, [token], logits=True)[0][0]  # type: ignore[index]
        follow = self._forward(0, [after], logits=True)[0]  # after the last path, decoded step by step
        tree, _ = self.decoder.forward_tree(tree_ids, context, parents, True, (), 0)
        assert tree is not None and follow is not None
        exact = all(torch.equal(tree[row], single[row]) for row in range(len(tree_ids)))
        self.decoder.keep_path(context, path, 0)
        self._wrote(0, context, path_ids(tree_ids, path))
        kept = self._forward(0, [after], logits=True)[0]
        assert kept is not None
        return exact and torch.equal(kept, follow)

    def _check_room(self, slot: int, count: int) -> None:
        if self._lengths[slot] + count > self._context:
            raise TargetError(
                f"{self.name}: {self._lengths[slot] + count} positions exceed the context {self._context}"
            )

    def _forward(self, slot: int, ids: list[int], logits: bool) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        capture = self._captures[slot]
        layers = capture.layers if capture is not None else ()
        out, hidden = self.decoder.forward(ids, self._lengths[slot], logits, layers, slot)
        self._wrote(slot, self._lengths[slot], ids)
        return out, hidden

    # --- hidden states for trained drafters (HiddenStateTarget) --------------------------

    @property
    def hidden_size(self) -> int:
        return int(self.checkpoint.config.hidden_size)

    @property
    def num_layers(self) -> int:
        return int(self.checkpoint.config.num_hidden_layers)

    @property
    def dtype(self) -> torch.dtype:
        return torch.float32

    @property
    def last_hidden(self) -> torch.Tensor | None:
        return self._hidden[0]

    def capture_hidden(self, capture: HiddenCapture | None) -> None:
        self._capture_hidden(0, capture)

    def _capture_hidden(self, slot: int, capture: HiddenCapture | None) -> None:
        if capture is not None and max(capture.layers) > self.num_layers:
            raise TargetError(
                f"{self.name} has hidden states 0..{self.num_layers}; asked for layers {list(capture.layers)}"
            )
        self._captures[slot] = capture
        self._hidden[slot] = None

    def token_embeddings(self) -> torch.Tensor:
        if self._embeddings is None:
            self._embeddings = torch.from_numpy(self.checkpoint.embed.dequantize())
        return self._embeddings

    def lm_head_weight(self) -> torch.Tensor:
        if self.checkpoint.head is self.checkpoint.embed:
            return self.token_embeddings()
        if self._head is None:
            self._head = torch.from_numpy(self.checkpoint.head.dequantize())
        return self._head

    def draft_head(self, vocab_ids: torch.Tensor) -> Any:
        """The LM head's rows ``vocab_ids`` (N,) as the file stores them, as a product
        (M, D) float32 -> (M, N) float32 in the kernels (a trained drafter's logits; see
        ``SharedTarget``); None on the torch path."""
        if self.decoder.path != "kernels":
            return None
        module = kernels.load()
        assert module is not None  # the kernels path runs on them
        matrix = self._draft_head_matrix(vocab_ids)
        return lambda x: module.apply(matrix, x)

    def head_stack(self, net: Any, weight_format: str | None = None) -> Any:
        """A trained head's layers on the kernels (``native.head_stack.KernelHeadStack``), its
        matrices made as the decoder makes its own, in ``weight_format`` (default: 4-bit); None
        on the torch path or where the head's widths do not fit the format."""
        if self.decoder.path != "kernels":
            return None
        chosen = head_stacks.kernel_format_for(net, weight_format)
        if chosen is None:
            return None
        module = kernels.load()
        assert module is not None  # the kernels path runs on them
        make = self.decoder.matrix  # type: ignore[union-attr]
        # A 4-bit head reads its LM head rows in 4 bits too: they are half of its bytes.
        head = self._draft_head_matrix(net.vocab_ids, "q4" if chosen == "q4" else None)
        embeddings = self.token_embeddings()
        return head_stacks.KernelHeadStack(net, module, make, self.context_length, embeddings, head, chosen)

    def _draft_head_matrix(self, vocab_ids: torch.Tensor, weight_format: str | None = None) -> Any:
        """The kernels matrix of the LM head's rows ``vocab_ids``, as the file stores them or
        requantised to ``weight_format``, made once per draft vocabulary and format."""
        ids = vocab_ids.numpy().astype(np.int64)
        key = f"{hashlib.sha256(ids.tobytes()).hexdigest()}:{weight_format}"
        if key not in self._draft_heads:
            rows = self.checkpoint.head.take_rows(ids)
            if weight_format is not None:
                rows = formats.requantize(rows, weight_format)
            self._draft_heads[key] = self.decoder.matrix(rows)  # type: ignore[union-attr]
        return self._draft_heads[key]

    def weights_fingerprint(self) -> str:
        """The torch backend's fingerprint of the same checkpoint (trained drafters record it):
        SHA-256 over transformers' parameter names, shapes and values rounded to bf16."""
        if self._fingerprint is None:
            self._fingerprint = fingerprint_of(self.checkpoint)
        return self._fingerprint


class NativeSequence:
    """Sequence ``slot`` of a ``NativeTarget``'s cache, as a Target (and HiddenStateTarget) of
    its own; what belongs to the model (vocabulary, weights, embeddings) is the owner's."""

    def __init__(self, owner: NativeTarget, slot: int) -> None:
        self.owner, self.slot = owner, slot
        self.name = owner.name

    vocab_size = property(lambda self: self.owner.vocab_size)
    context_length = property(lambda self: self.owner.context_length)
    eos_token_ids = property(lambda self: self.owner.eos_token_ids)
    supports_rollback = property(lambda self: True)
    hidden_size = property(lambda self: self.owner.hidden_size)
    num_layers = property(lambda self: self.owner.num_layers)
    dtype = property(lambda self: self.owner.dtype)

    @property
    def cached_tokens(self) -> int:
        return self.owner._lengths[self.slot]

    @property
    def last_hidden(self) -> torch.Tensor | None:
        return self.owner._hidden[self.slot]

    def prefill(self, token_ids: Sequence[int]) -> None:
        for _ in self.prefill_chunks(token_ids):
            pass

    def prefill_chunks(self, token_ids: Sequence[int]) -> Iterator[int]:
        return self.owner._prefill_chunks(self.slot, token_ids)

    def verify(self, token_ids: Sequence[int]) -> Logits:
        return self.owner._verify(self.slot, token_ids)

    def rollback(self, length: int) -> None:
        self.owner._rollback(self.slot, length)

    def verify_tree(self, token_ids: Sequence[int], parents: Sequence[int]) -> Logits:
        """``NativeTarget.verify_tree`` on this sequence."""
        return self.owner._verify_tree(self.slot, token_ids, parents)

    def keep_path(self, path: Sequence[int]) -> None:
        """``NativeTarget.keep_path`` on this sequence."""
        self.owner._keep_path(self.slot, path)

    def reset(self) -> None:
        self.owner._reset(self.slot)

    @property
    def reused_tokens(self) -> int:
        """``NativeTarget.reused_tokens`` of this sequence."""
        return self.owner._reused[self.slot]

    def drop_cache(self) -> None:
        """Reset this sequence and forget what a later prefill could reuse."""
        self.owner._drop(self.slot)

    def shared_prefix(self, token_ids: Sequence[int]) -> int:
        """``NativeTarget.shared_prefix`` on this sequence."""
        return self.owner._shared_prefix(self.slot, token_ids)

    def reuse(self, token_ids: Sequence[int]) -> int:
        """Start a prefill of ``token_ids`` as ``prefill`` does: reset, keep the longest prefix
        the cache holds, return its length. The caller passes the rest (``run``)."""
        return self.owner._reuse(self.slot, token_ids)

    def capture_hidden(self, capture: HiddenCapture | None) -> None:
        self.owner._capture_hidden(self.slot, capture)

    def token_embeddings(self) -> torch.Tensor:
        return self.owner.token_embeddings()

    def lm_head_weight(self) -> torch.Tensor:
        return self.owner.lm_head_weight()

    def draft_head(self, vocab_ids: torch.Tensor) -> Any:
        return self.owner.draft_head(vocab_ids)

    def head_stack(self, net: Any, weight_format: str | None = None) -> Any:
        return self.owner.head_stack(net, weight_format)

    def weights_fingerprint(self) -> str:
        return self.owner.weights_fingerprint()


def _sliding_window(config: Any) -> int | None:
    """Positions within which attention is full, where a sliding window applies (Mistral's;
    Qwen2's when it uses one): it caps the context, since the native forward attends to
    every earlier key."""
    window = getattr(config, "sliding_window", None)
    if not window or (config.model_type == "qwen2" and not getattr(config, "use_sliding_window", False)):
        return None
    return int(window)


def fingerprint_of(checkpoint: checkpoints.Checkpoint) -> str:
    """``torch_target.weights_fingerprint`` of the transformers model this checkpoint loads
    as, computed from the file (GGUF tensors dequantised as transformers does)."""
    digest = hashlib.sha256()
    for name, values in sorted(checkpoints.transformers_parameters(checkpoint)):
        tensor = torch.from_numpy(values).to(torch.bfloat16)
        digest.update(f"{name}{tuple(tensor.shape)}".encode())
        digest.update(tensor.view(torch.int16).numpy().tobytes())
    return digest.hexdigest()
