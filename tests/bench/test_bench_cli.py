"""``verispec bench`` end to end on a tiny model: JSON, PNGs, table, --plot; bad input."""

import json
import subprocess
import sys

import pytest

CLI = [sys.executable, "-m", "verispec.cli", "bench"]


def write_prompts(path, lines):
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture
def prompt_file(tmp_path):
    records = [
        {"question_id": 1, "category": "summarization", "turns": ["the cat sat on the mat. the cat sat on the"]},
        {"question_id": 2, "category": "qa", "turns": ["abc abc abc abc"]},
    ]
    return write_prompts(tmp_path / "prompts.jsonl", [json.dumps(r) for r in records])


def run(*args):
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=600)


def test_bench_writes_json_plots_and_table_and_redraws(tiny_dir, prompt_file, tmp_path):
    out = tmp_path / "out"
    done = run(
        "--model",
        str(tiny_dir),
        "--dtype",
        "float32",
        "--prompts",
        str(prompt_file),
        "--per-category",
        "1",
        "--max-tokens",
        "12",
        "--configs",
        "none",
        "lookup:k=3",
        "--out",
        str(out),
    )
    assert done.returncode == 0, done.stderr
    document = json.loads((out / "results.json").read_text())
    assert {r["config"] for r in document["records"]} == {"none", "lookup:k=3"}
    assert len(document["records"]) == 4
    assert {"cpu", "versions", "load_average_before", "load_average_after"} <= set(document["environment"])
    pngs = ["speedup_by_category.png", "acceptance_by_position.png", "measured_vs_predicted.png"]
    for name in pngs:
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for column in ("speed-up", "tok/round", "identical", "overall"):
        assert column in done.stdout
    for name in pngs:
        (out / name).unlink()
    redraw = run("--plot", str(out / "results.json"))
    assert redraw.returncode == 0, redraw.stderr
    assert all((out / name).is_file() for name in pngs)
    assert "lookup:k=3" in redraw.stdout
    # Redrawn against another configuration: its own files, the baseline named in the plot.
    versus = run("--plot", str(out / "results.json"), "--baseline", "lookup:k=3")
    assert versus.returncode == 0, versus.stderr
    assert (out / "table_vs_lookup_k_3.md").read_text().count("\n") == len((out / "table.md").read_text().splitlines())
    assert (out / "speedup_by_category_vs_lookup_k_3.png").is_file()
    unknown = run("--plot", str(out / "results.json"), "--baseline", "turbo")
    assert unknown.returncode == 2 and "--baseline 'turbo' is not a configuration of this run" in unknown.stderr


def test_two_trainings_of_a_drafter_compare_in_one_run(tiny_dir, tiny_drafters, prompt_file, tmp_path):
    # The tiny drafters' directory holds head/ and block/: the same kind with two weights.
    both, head = str(tiny_drafters["head"].parent), str(tiny_drafters["head"])
    # Fixed k: under the governor, a drafter this dear next to the tiny model's step may not
    # draft at all in 16 tokens, and the test is about which weights were loaded.
    configs = [f"head:weights={both},k=3", f"head:weights={head},confidence=0.2,k=2", f"block:weights={both},k=3"]
    args = ["--model", str(tiny_dir), "--dtype", "float32", "--prompts", str(prompt_file), "--max-tokens", "16"]
    done = run(*args, "--per-category", "1", "--configs", *configs, "--out", str(tmp_path / "out"))
    assert done.returncode == 0, done.stderr
    records = json.loads((tmp_path / "out" / "results.json").read_text())["records"]
    plain = {r["prompt_index"]: r["token_ids"] for r in records if r["config"] == "none"}
    for config in configs:
        ran = [r for r in records if r["config"] == config]
        assert len(ran) == 2 and all(r["token_ids"] == plain[r["prompt_index"]] for r in ran)
        assert sum(r["stats"]["offered"] for r in ran) > 0  # the trained weights were loaded and drafted


@pytest.mark.parametrize(
    ("setup", "args", "message"),
    [
        (None, ["--prompts", "/no/such.jsonl"], "not found"),
        ("good", ["--categories", "poetry"], "unknown categories"),
        ("good", ["--categories"], "no categories selected"),
        ("bad-line", [], ":2: not a Spec-Bench record"),
        ("good", ["--configs", "turbo"], "unknown configuration 'turbo'"),
        ("good", ["--configs", "head:confidence=1.5"], "min_confidence must be a number in [0, 1], got '1.5'"),
        ("good", ["--configs", "head:weights=/no/such/dir"], "weights '/no/such/dir' is not a directory"),
        ("good", ["--configs", "suffix:branches=0"], "suffix needs branches >= 1"),
        ("good", ["--configs", "head:branches=0"], "draft_branches is an integer >= 1 (1: chains), got 0"),
        (
            "good",
            ["--configs", "head:kernels=fast"],
            "head_kernels is one of auto, off, q8_0, q4, bf16, f32, got 'fast'",
        ),
        ("good", ["--configs", "suffix:cache=lots"], "cache must be an integer"),
        ("good", ["--configs", "suffix:spec_factor=wide"], "spec_factor must be a number, got 'wide'"),
        ("good", ["--configs", "suffix:min_score=2"], "suffix needs min_score in [0, 1], got 2.0"),
        ("good", ["--configs", "lookup:cache=0"], "option cache does not apply to lookup"),
        ("good", ["--configs", "block:kernels=f32"], "option kernels does not apply to block"),
        ("good", ["--workload", "multi-turn"], "needs records with two turns"),
        ("empty", [], "holds no prompts"),
    ],
)
def test_bad_input(tmp_path, tiny_dir, setup, args, message):
    good = json.dumps({"question_id": 1, "category": "qa", "turns": ["abc"]})
    files = {"good": [good], "bad-line": [good, "{not json"], "empty": [""]}
    extra = []
    if setup:
        extra = ["--prompts", str(write_prompts(tmp_path / "p.jsonl", files[setup]))]
    done = run("--model", str(tiny_dir), *extra, *args)
    assert done.returncode == 2, done.stdout + done.stderr
    assert message in done.stderr and "Traceback" not in done.stderr
