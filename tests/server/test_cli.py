"""``verispec serve`` refuses what it cannot run before it listens."""

from __future__ import annotations

import pytest

from verispec.cli import build_parser, main
from verispec.server.cli import api_keys_of


def test_defaults():
    args = build_parser().parse_args(["serve"])
    assert (args.host, args.port, args.drafter, args.k, args.backend) == ("127.0.0.1", 8000, "lookup", None, "auto")
    assert args.cors_origin == [] and args.max_queue == 64
    assert args.max_prompt_tokens is None and args.default_max_tokens == 1024 and args.allowed_hosts == []


def test_allowed_hosts_comma_separated_or_repeated():
    args = build_parser().parse_args(["serve", "--allowed-hosts", "a.example, b.example", "--allowed-hosts", "*"])
    assert args.allowed_hosts == ["a.example", "b.example", "*"]


@pytest.mark.parametrize("option", ["--max-queue", "--max-prompt-tokens", "--default-max-tokens"])
def test_negative_limits_are_refused_at_start_up(option, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["serve", option, "-1"])
    assert exit_info.value.code == 2
    assert f"argument {option}: must be >= " in capsys.readouterr().err


def test_help_offers_the_registry_drafters_but_not_the_negative_control(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["serve", "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    options = out[out.index("speculation") :]
    drafter_help = " ".join(options[options.index("--drafter DRAFTER") : options.index("--k K")].split())
    assert all(name in drafter_help for name in ("lookup", "head", "block", "model", "none")), drafter_help
    assert "wrong" not in drafter_help

    from verispec.drafters.registry import drafter_names

    offered = drafter_names(controls=False)
    assert ", ".join(offered) in drafter_help and "wrong" in drafter_names()


def test_k_is_a_number_or_auto():
    assert build_parser().parse_args(["serve", "--k", "3"]).k == 3
    assert build_parser().parse_args(["serve", "--k", "auto"]).k == "auto"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--k", "-1"])


def test_api_keys_from_the_flags_or_the_environment(monkeypatch):
    monkeypatch.setenv("VERISPEC_API_KEY", "from-env")
    assert api_keys_of(build_parser().parse_args(["serve"])) == ["from-env"]
    monkeypatch.setenv("VERISPEC_API_KEY", "a, b,,a")
    assert api_keys_of(build_parser().parse_args(["serve"])) == ["a", "b"]
    flags = build_parser().parse_args(["serve", "--api-key", "x", "--api-key", "y"])
    assert api_keys_of(flags) == ["x", "y"]  # the flags win over the environment
    monkeypatch.delenv("VERISPEC_API_KEY")
    assert api_keys_of(build_parser().parse_args(["serve"])) == []


def test_unknown_backend_and_missing_model_fail_fast(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["serve", "--backend", "tensorrt"])
    assert exit_info.value.code == 2
    assert "invalid choice: 'tensorrt'" in capsys.readouterr().err
    assert main(["serve", "--model", "/no/such/model.gguf"]) == 2
    assert "not found" in capsys.readouterr().err


def test_ray_options_need_replicas(capsys):
    assert main(["serve", "--ray-address", "auto"]) == 2
    assert "need --replicas" in capsys.readouterr().err
    for bad in (["--replicas", "0"], ["--replicas", "2", "--ray-cpus-per-replica", "0"]):
        with pytest.raises(SystemExit):
            build_parser().parse_args(["serve", *bad])


def test_serve_run_builder_takes_the_serve_options():
    """``serve run verispec.server.serve_run:app KEY=VALUE ...`` (built, not run: no Ray)."""
    from verispec.server import replicas, serve_run

    options = {"replicas": "3", "max_running": "2", "max-queue": "5", "exact": "false", "ray-cpus-per-replica": "0.5"}
    deployment = serve_run.app(options)._bound_deployment
    assert deployment.num_replicas == 3 and deployment.ray_actor_options["num_cpus"] == 0.5
    assert deployment.max_ongoing_requests == 2 + 5 + replicas.HEADROOM  # slots + queue + room for /health
    settings, spec, threads = deployment.init_args
    assert (settings.max_running, settings.max_queue, spec.slots, threads) == (2, 5, 2, 1)
    assert spec.load_options["exact"] is False
    with pytest.raises(ValueError, match="serve run --address"):
        serve_run.app({"ray-address": "auto"})
    with pytest.raises(SystemExit):  # argparse's own message: an option serve does not have
        serve_run.app({"no-such-option": "1"})
