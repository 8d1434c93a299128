"""Exact check of the tree rule, no sampling.

Two independent computations on small vocabularies (3-4 tokens), rows with rational entries:

1. The analytic law, in exact rational arithmetic (``fractions.Fraction``): enumerate every
   draft outcome of a tree with its probability under the drafter, and at each position the
   probability of accepting each child (min(1, p_cur(x)/q(x)), p_cur the residual left by the
   earlier siblings) or of emitting y. Summed over the outcomes this must give the target
   EXACTLY: P(first token = x) = p(x), and P(first = x, round goes on, second = y) =
   P(first = x, round goes on) * p(y | x).
2. ``accept_tree`` itself, integrated over its uniforms: for a fixed draft outcome its output
   is piecewise constant in each uniform it reads (an accept test flips at one threshold, an
   inverse-CDF draw at cumulative sums), so evaluating it at the midpoint of every cell between
   those breakpoints, weighted by the cell's volume, gives the law it induces; it must equal the
   analytic one within rounding. Which uniforms a position reads comes from the layout in
   accept_tree's docstring: its children's accept uniforms and its last child's residual one,
   or the bonus uniform u[2n] at a position without children.
"""

import itertools
from fractions import Fraction

import numpy as np
import pytest

from tests.conformance import tree_mutants
from tests.conformance.tree_harness import IID, SCHEMES, TOP, WITHOUT_REPLACEMENT
from verispec.accept_tree import accept_tree, tree_children

EXACT_TOL = 1e-12
ONE, ZERO = Fraction(1), Fraction(0)


def rational_row(rng, vocab, min_support):
    while True:
        weights = rng.integers(0, 7, size=vocab)
        if np.count_nonzero(weights) >= min_support:
            return [Fraction(int(w), int(weights.sum())) for w in weights]


def point_mass(vocab, token):
    return [ONE if y == token else ZERO for y in range(vocab)]


def sibling_outcomes(q, count, scheme):
    """Every way ``count`` siblings can be drafted from row ``q``: (probability, [(token, row)])
    where row is exactly the distribution the token was drawn from."""
    vocab = len(q)
    if scheme == TOP:
        ranked = sorted(range(vocab), key=lambda y: (-q[y], y))
        yield ONE, [(x, point_mass(vocab, x)) for x in ranked[:count]]
        return
    for tokens in itertools.product(range(vocab), repeat=count):
        prob, drawn, rows = ONE, [], []
        for x in tokens:
            row = q
            if scheme == WITHOUT_REPLACEMENT:
                kept = [ZERO if y in drawn else q[y] for y in range(vocab)]
                row = [w / sum(kept) for w in kept]
            prob *= row[x]
            drawn.append(x)
            rows.append(row)
        if prob:
            yield prob, list(zip(tokens, rows, strict=True))


def position_law(p_row, children):
    """What one position does, given its drafted children [(token, q_row)] in order: the chance
    of accepting each child, of emitting each y, each child's acceptance threshold, and the
    distributions left after each rejection."""
    p_cur, reach, accept, thresholds, lefts = list(p_row), ONE, [], [], []
    for x, q in children:
        ratio = min(ONE, p_cur[x] / q[x]) if q[x] else ZERO
        accept.append(reach * ratio)
        thresholds.append(ratio)
        reach *= 1 - ratio
        rest = [max(ZERO, a - b) for a, b in zip(p_cur, q, strict=True)]
        if sum(rest):
            p_cur = [r / sum(rest) for r in rest]
        lefts.append(p_cur)
    return accept, [reach * w for w in p_cur], thresholds, lefts


class Case:
    """A tree shape, target and drafter rows (Markov, as in tree_harness), a drafting scheme."""

    def __init__(self, parents, vocab, scheme, seed):
        rng = np.random.default_rng(seed)
        self.parents, self.vocab, self.scheme = list(parents), vocab, scheme
        self.children = tree_children(np.array(parents, dtype=np.int64))
        support = max(len(kids) for kids in self.children)  # without replacement needs that many tokens
        self.target_first = rational_row(rng, vocab, 1)
        self.target_after = [rational_row(rng, vocab, 1) for _ in range(vocab)]
        self.draft_first = rational_row(rng, vocab, support)
        self.draft_after = [rational_row(rng, vocab, support) for _ in range(vocab)]

    def outcomes(self):
        """Every drafted tree: (probability, tokens, draft rows), positions drafted root first."""

        def expand(row, prob, tokens, rows):
            if row == len(self.children):
                yield prob, list(tokens), list(rows)
                return
            kids = self.children[row]
            if not kids:
                yield from expand(row + 1, prob, tokens, rows)
                return
            q = self.draft_first if row == 0 else self.draft_after[tokens[row - 1]]
            for sub_prob, drafted in sibling_outcomes(q, len(kids), self.scheme):
                for node, (x, q_row) in zip(kids, drafted, strict=True):
                    tokens[node], rows[node] = x, q_row
                yield from expand(row + 1, prob * sub_prob, tokens, rows)

        n = len(self.parents)
        yield from expand(0, ONE, [None] * n, [None] * n)

    def verify_rows(self, tokens):
        # Depth-2 Markov target: a node's row depends on its token (the tree is at most 2 deep
        # and rows after depth-2 nodes only give bonuses, which the law here does not look at).
        return [self.target_first] + [self.target_after[x] for x in tokens]


def analytic_law(case):
    """(first, goes_on, second): P(first = x), P(first = x and the round goes on), and
    P(first = x, goes on, second = y), in exact arithmetic."""
    vocab = case.vocab
    first, goes_on, second = [ZERO] * vocab, [ZERO] * vocab, np.full((vocab, vocab), ZERO, dtype=object)
    for prob, tokens, q_rows in case.outcomes():
        rows = case.verify_rows(tokens)
        kids = case.children[0]
        accept, emit, _, _ = position_law(rows[0], [(tokens[c], q_rows[c]) for c in kids])
        for y in range(vocab):
            first[y] += prob * emit[y]
        for c, a in zip(kids, accept, strict=True):
            x = tokens[c]
            first[x] += prob * a
            goes_on[x] += prob * a
            grand = case.children[c + 1]
            if not grand:  # the bonus from node c's row
                for y in range(vocab):
                    second[x, y] += prob * a * rows[c + 1][y]
                continue
            accept2, emit2, _, _ = position_law(rows[c + 1], [(tokens[g], q_rows[g]) for g in grand])
            for g, a2 in zip(grand, accept2, strict=True):
                second[x, tokens[g]] += prob * a * a2
            for y in range(vocab):
                second[x, y] += prob * a * emit2[y]
    return first, goes_on, second


def _cells(breaks):
    points = np.unique(np.clip(np.concatenate([[0.0, 1.0], [float(b) for b in breaks]]), 0.0, 1.0))
    points = points[np.concatenate([[True], np.diff(points) > 1e-15])]
    return [(b - a, (a + b) / 2) for a, b in itertools.pairwise(points)]


def _cdf_breaks(rows):
    return [sum(row[: i + 1]) for row in rows for i in range(len(row))]


def position_cells(case, row, rows, tokens, q_rows):
    """The cells of the uniforms position ``row`` reads: [(volume, {uniform index: midpoint})]."""
    kids = case.children[row]
    n = len(case.parents)
    if not kids:
        return [(width, {2 * n: mid}) for width, mid in _cells(_cdf_breaks([rows[row]]))]
    _, _, thresholds, lefts = position_law(rows[row], [(tokens[c], q_rows[c]) for c in kids])
    axes = [[(w, {2 * c: m}) for w, m in _cells([t])] for c, t in zip(kids, thresholds, strict=True)]
    axes.append([(w, {2 * kids[-1] + 1: m}) for w, m in _cells(_cdf_breaks([rows[row], *lefts]))])
    cells = []
    for combo in itertools.product(*axes):
        volume, where = 1.0, {}
        for w, assignment in combo:
            volume *= w
            where.update(assignment)
        cells.append((volume, where))
    return cells


def _run(rule, inputs, where):
    """The rule on one drafted tree, uniforms at ``where`` and 0.5 (unread) elsewhere."""
    u = np.full(2 * len(inputs[1]) + 1, 0.5)
    u[list(where)] = list(where.values())
    return rule(*inputs, u)


def induced_law(rule, case):
    """The same three quantities as analytic_law, for ``rule`` integrated over its uniforms."""
    vocab = case.vocab
    first, goes_on, second = np.zeros(vocab), np.zeros(vocab), np.zeros((vocab, vocab))
    for prob, tokens, q_rows in case.outcomes():
        prob = float(prob)
        rows = case.verify_rows(tokens)
        p = np.array(rows, dtype=np.float64)
        q = None if case.scheme == TOP else np.array(q_rows, dtype=np.float64)
        inputs = (p, np.array(case.parents), np.array(tokens), q)
        accepted_mass, representative = {}, {}
        for volume, where in position_cells(case, 0, rows, tokens, q_rows):
            result = _run(rule, inputs, where)
            if not result.path:
                first[result.token] += prob * volume
                continue
            c = result.path[0]
            accepted_mass[c] = accepted_mass.get(c, 0.0) + volume
            representative[c] = where
        for c, mass in accepted_mass.items():
            x = tokens[c]
            first[x] += prob * mass
            goes_on[x] += prob * mass
            for volume, where in position_cells(case, c + 1, rows, tokens, q_rows):
                result = _run(rule, inputs, {**representative[c], **where})
                y = tokens[result.path[1]] if len(result.path) > 1 else result.token
                second[x, y] += prob * mass * volume
    return first, goes_on, second


def cases(parents, vocab, count, seed):
    return [Case(parents, vocab, scheme, seed + i) for scheme in SCHEMES for i in range(count)]


ONE_LEVEL = [-1, -1, -1]
TWO_LEVELS = [-1, -1, 0, 0, 1]  # root: nodes 0, 1; node 0: nodes 2, 3; node 1: node 4


@pytest.mark.parametrize(("parents", "vocab"), [(ONE_LEVEL, 4), ([-1, -1], 3), (TWO_LEVELS, 3)])
def test_analytic_law_is_exactly_the_target(parents, vocab):
    checked = 0
    for case in cases(parents, vocab, count=10, seed=100):
        first, goes_on, second = analytic_law(case)
        assert first == case.target_first, case.scheme
        for x in range(vocab):
            assert list(second[x]) == [goes_on[x] * w for w in case.target_after[x]], case.scheme
        checked += 1
    print(f"\n  analytic law, {checked} cases {parents} V={vocab} (i.i.d., without replacement, top): exact")


@pytest.mark.parametrize(("parents", "vocab"), [(ONE_LEVEL, 4), (TWO_LEVELS, 3)])
def test_accept_tree_induces_the_analytic_law(parents, vocab):
    worst = 0.0
    for case in cases(parents, vocab, count=2, seed=200):
        expected = [np.array(part, dtype=np.float64) for part in analytic_law(case)]
        induced = induced_law(accept_tree, case)
        worst = max(worst, *(float(np.max(np.abs(a - b))) for a, b in zip(induced, expected, strict=True)))
    print(f"\n  accept_tree integrated over its uniforms, {parents} V={vocab}: max |induced - analytic| = {worst:.2e}")
    assert worst <= EXACT_TOL


@pytest.mark.parametrize("name", sorted(tree_mutants.TREE_MUTANTS))
def test_tree_mutants_fail_the_exact_check(name):
    rule = tree_mutants.TREE_MUTANTS[name]
    worst = 0.0
    for case in [Case(TWO_LEVELS, 3, IID, 300), Case(TWO_LEVELS, 3, TOP, 301)]:
        target = np.array(case.target_first, dtype=np.float64)
        first, goes_on, second = induced_law(rule, case)
        after = np.array(case.target_after, dtype=np.float64)
        worst = max(
            worst, float(np.max(np.abs(first - target))), float(np.max(np.abs(second - goes_on[:, None] * after)))
        )
    print(f"\n  exact integration, tree mutant {name}: max deviation from the target = {worst:.3f} -> detected")
    assert worst > 1e-3
