"""The drafter registry's table of options: what each drafter reads, and refusing the rest."""

import inspect
import re

import pytest

from verispec.drafters import trained
from verispec.drafters.base import DrafterError
from verispec.drafters.registry import DRAFTER_OPTIONS, _factories, drafter_names

READ = re.compile(r"""\.option\(\s*["']([a-z_]+)["']""")
BUILDS = re.compile(r"\b([a-z]+)\._build\(context\)")  # a drafter built of others (``hybrid``)


def options_read(name: str) -> set[str]:
    """The option keys drafter ``name``'s module reads, its base class's for the trained ones,
    and those of the drafters it builds from the same context."""
    module = inspect.getmodule(_factories()[name])
    sources = [inspect.getsource(module)]
    if "from_context(context)" in sources[0]:  # a trained drafter: the shared loader reads its own
        sources.append(inspect.getsource(trained.TrainedDrafter.from_context))
    keys = {key for source in sources for key in READ.findall(source)}
    return keys.union(*(options_read(part) for part in BUILDS.findall(sources[0])))


@pytest.mark.parametrize("name", drafter_names())
def test_the_table_holds_exactly_the_options_a_drafter_reads(name):
    # scope is read by the engine (it keys a learning drafter's instance), not by the drafter
    assert options_read(name) == DRAFTER_OPTIONS[name] - {"scope"}


@pytest.mark.parametrize(
    ("name", "options", "unknown"),
    [
        ("suffix", {"cache": 0}, "cache"),  # the bench's spelling, not the drafter's
        ("lookup", {"suffix_cache_tokens": 0}, "suffix_cache_tokens"),  # another drafter's option
        ("lookup", {"max_ngram": 4, "scope": "key-a"}, "scope"),  # only learning drafters are scoped
        ("none", {"min_confidence": 0.5}, "min_confidence"),
    ],
)
def test_an_option_the_drafter_does_not_read_is_refused(tiny_engine, name, options, unknown):
    before = dict(tiny_engine._drafters)
    with pytest.raises(DrafterError, match=f"drafter '{name}' takes no option {unknown};"):
        tiny_engine.drafter(name, **options)
    assert tiny_engine._drafters == before  # nothing was built or kept
    assert tiny_engine.drafter(name) is tiny_engine.drafter(name)  # and the engine goes on


def test_the_options_a_drafter_reads_are_taken(tiny_engine):
    drafter = tiny_engine.drafter("lookup", max_ngram=5, min_ngram=2, fresh=True)
    assert (drafter.max_ngram, drafter.min_ngram) == (5, 2)
    assert tiny_engine.drafter("suffix", scope="key-z", suffix_cache_tokens=0).cache is not None


def test_an_unknown_name_is_reported_as_unknown_whatever_its_options(tiny_engine):
    with pytest.raises(DrafterError, match="unknown drafter 'turbo'"):
        tiny_engine.drafter("turbo", speed=11)
