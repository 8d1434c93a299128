"""The one-call ``verispec.generate``: options as an object or as keywords, one engine kept."""

from __future__ import annotations

import pytest

import verispec
from tests import tiny
from verispec import api, models
from verispec.sampling import InvalidParameterError, SamplingParams

LOAD = {"backend": "torch", "dtype": "float32", "device": "cpu"}


def test_keywords_and_an_options_object_run_the_same_request(tiny_dir):
    by_keywords = verispec.generate("abc abc", str(tiny_dir), **LOAD, k=3, temperature=0, max_tokens=12)
    options = verispec.GenerateOptions(**LOAD, k=3, sampling=SamplingParams(temperature=0, max_tokens=12))
    by_object = verispec.generate("abc abc", str(tiny_dir), options=options)
    assert by_object.token_ids == by_keywords.token_ids and len(by_object.token_ids) == 12
    assert (by_object.k, by_object.drafter) == (3, "lookup")
    assert len([key for key in api._ENGINES if key[0] == str(tiny_dir)]) == 1  # loaded once


def test_keywords_replace_fields_of_the_options():
    base = api.GenerateOptions(drafter="none", sampling=SamplingParams(temperature=0.5, seed=7))
    options = base.with_keywords(k="auto", max_tokens=5)
    assert (options.drafter, options.k, options.sampling) == ("none", "auto", SamplingParams(0.5, seed=7, max_tokens=5))
    assert options.load_options() == {name: getattr(base, name) for name in api.GenerateOptions.LOAD_FIELDS}


def test_unknown_and_bad_options_are_named():
    with pytest.raises(TypeError, match="temprature"):
        api.GenerateOptions().with_keywords(temprature=0)
    with pytest.raises(InvalidParameterError, match="temperature"):
        api.GenerateOptions().with_keywords(temperature=-1)


def test_a_loaded_model_knows_its_end_of_sequence_ids(tiny_dir):
    assert models.load(str(tiny_dir), device="cpu").eos_ids == [tiny.EOS]
