"""The command line as users run it: a real process on a tiny model directory."""

import subprocess
import sys


def run_cli(*args, timeout=300):
    return subprocess.run(
        [sys.executable, "-m", "verispec.cli", *args], capture_output=True, text=True, timeout=timeout
    )


def test_generate_streams_text_and_prints_the_summary(tiny_dir):
    done = run_cli("generate", "abc abc abc", "--model", str(tiny_dir), "--dtype", "float32", "--max-tokens", "24")
    assert done.returncode == 0, done.stderr
    assert len(done.stdout.strip()) > 0
    summary = done.stderr
    for field in ("tokens 24", "tok/s", "acceptance", "tokens/round", "per-position", "bonus shortfall"):
        assert field in summary, summary


def test_compare_reports_speedup_and_identity(tiny_dir):
    done = run_cli(
        "generate", "the cat sat on the mat. the cat", "--model", str(tiny_dir), "--dtype", "float32", "--compare"
    )
    assert done.returncode == 0, done.stderr
    assert "speed-up" in done.stderr and "output identical to plain decoding" in done.stderr


def test_bad_parameters_exit_2_with_a_message(tiny_dir):
    done = run_cli("generate", "abc", "--model", str(tiny_dir), "--temperature", "-1")
    assert done.returncode == 2
    assert "temperature" in done.stderr and "Traceback" not in done.stderr
    done = run_cli("generate", "abc", "--model", str(tiny_dir), "--k", "-2")
    assert done.returncode == 2 and "k must be 'auto' or an integer >= 0" in done.stderr
    done = run_cli("generate", "abc", "--model", "/no/such/dir")
    assert done.returncode == 2 and "not found" in done.stderr
