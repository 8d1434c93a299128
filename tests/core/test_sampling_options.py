"""The one table of sampling options: it covers SamplingParams, and the command line and
request bodies read the same parameters through it."""

import argparse
import dataclasses

from verispec.sampling import SamplingParams
from verispec.sampling_options import (
    SAMPLING_OPTIONS,
    add_sampling_options,
    sampling_from_args,
    sampling_from_request,
)
from verispec.server import schemas


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_sampling_options(parser)
    return parser.parse_args(argv)


def test_the_table_is_samplingparams_field_for_field_with_its_defaults():
    fields = dataclasses.fields(SamplingParams)
    assert [option.name for option in SAMPLING_OPTIONS] == [f.name for f in fields]
    for option, field in zip(SAMPLING_OPTIONS, fields, strict=True):
        default = field.default_factory() if field.default is dataclasses.MISSING else field.default  # type: ignore[misc]
        assert option.default == default, option.name


def test_every_option_is_a_request_field():
    missing = [o.name for o in SAMPLING_OPTIONS if o.name not in schemas.SamplingFields.model_fields]
    assert not missing


def test_command_line_defaults_decode_greedily_and_otherwise_as_samplingparams():
    params = SamplingParams(**sampling_from_args(parse()))
    assert params == dataclasses.replace(SamplingParams(), temperature=0.0)


def test_flags_reach_the_parameters():
    args = parse("--temperature", "0.7", "--top-k", "5", "--min-p", "0.1", "--seed", "3", "--stop", "a", "--stop", "b")
    params = SamplingParams(**sampling_from_args(args))
    assert (params.temperature, params.top_k, params.min_p, params.seed, params.stop) == (0.7, 5, 0.1, 3, ("a", "b"))


def test_a_request_that_sets_nothing_gets_the_defaults():
    body = schemas.CompletionRequest.model_validate({"model": "m", "prompt": "x"})
    assert SamplingParams(**sampling_from_request(body)) == SamplingParams()


def test_request_values_are_converted_where_the_request_range_differs():
    body = schemas.CompletionRequest.model_validate(
        {"model": "m", "prompt": "x", "top_k": -1, "stop": "END", "temperature": 0.5, "seed": 9, "max_tokens": 7}
    )
    kwargs = sampling_from_request(body)
    assert "max_tokens" not in kwargs  # the server sets it from the prompt's length
    assert (kwargs["top_k"], kwargs["stop"], kwargs["temperature"], kwargs["seed"]) == (0, ("END",), 0.5, 9)
