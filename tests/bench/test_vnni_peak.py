"""benchmarks/vnni_peak.py: a figure where the CPU has AVX-512 VNNI and a compiler, else a clear exit."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "vnni_peak.py"


def test_prints_the_peak_or_says_what_it_needs():
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--seconds", "0.05", "--threads", "2"], capture_output=True, text=True
    )
    vnni = "avx512_vnni" in Path("/proc/cpuinfo").read_text().split() if Path("/proc/cpuinfo").exists() else False
    if vnni and (shutil.which("c++") or shutil.which("g++")):
        assert done.returncode == 0, done.stderr
        rates = [float(v) for v in re.findall(r"([0-9.]+) GMAC/s", done.stdout)]
        assert len(rates) == 2 and all(rate > 0 for rate in rates)  # 1 thread, then 2
    else:
        assert done.returncode != 0 and "needs a C++ compiler and a CPU with AVX-512 VNNI" in done.stderr


def test_bad_settings_are_refused():
    done = subprocess.run([sys.executable, str(SCRIPT), "--seconds", "0"], capture_output=True, text=True)
    assert done.returncode == 2 and "--seconds > 0" in done.stderr
