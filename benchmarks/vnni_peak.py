"""The CPU's AVX-512 VNNI peak: the roofline of verify rows and prompt chunks.

    .venv/bin/python benchmarks/vnni_peak.py [--seconds 1.0]

A verify pass of several rows, and a prompt chunk, are bound by the native kernels' integer
products (``wide_rows`` in ``verispec/native/csrc/decoder.cpp``: 8 ``vpdpbusd`` per row and
32-weight block, then the block's float steps). This compiles a loop of independent
``vpdpbusd`` (12 chains in registers, so neither latency nor loads bound it) with the system's
C++ compiler and ``-O2 -march=native``, and prints multiply-adds per second on 1 thread and on
``--threads`` threads at once (the pass's thread pool).

Compare with a pass's rate: (model multiply-adds per row) x (rows) / (seconds beyond a 1-row
pass), from ``verify_cost.py``. Needs a C++ compiler and a CPU with AVX-512 VNNI.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

SOURCE = r"""
#include <immintrin.h>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

// P dpbusd chains a step, for about `seconds`; returns multiply-adds per second.
template <int P>
static double loop(double seconds) {
  __m512i a[P];
  for (int i = 0; i < P; i++) a[i] = _mm512_set1_epi32(i);
  __m512i w = _mm512_set1_epi8(3), x = _mm512_set1_epi8(5);
  long steps = 0;
  auto start = std::chrono::steady_clock::now();
  double elapsed = 0.0;
  while (elapsed < seconds) {
    for (int n = 0; n < 1000000; n++) {
#pragma GCC unroll 16
      for (int i = 0; i < P; i++) a[i] = _mm512_dpbusd_epi32(a[i], w, x);
      asm volatile("" : "+v"(w));  // the loop is not folded away
    }
    steps += 1000000;
    elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  __m512i sum = a[0];
  for (int i = 1; i < P; i++) sum = _mm512_add_epi32(sum, a[i]);
  volatile int sink = _mm512_reduce_add_epi32(sum);
  (void)sink;
  return P * 64.0 * steps / elapsed;
}

int main(int argc, char** argv) {
  const double seconds = std::atof(argv[1]);
  const int threads = std::atoi(argv[2]);
  std::printf("dpbusd, 1 thread: %.0f GMAC/s\n", loop<12>(seconds) / 1e9);
  std::vector<double> rates(threads);
  std::vector<std::thread> pool;
  for (int i = 0; i < threads; i++) pool.emplace_back([&, i] { rates[i] = loop<12>(seconds); });
  double total = 0.0;
  for (int i = 0; i < threads; i++) pool[i].join(), total += rates[i];
  std::printf("dpbusd, %d threads: %.0f GMAC/s\n", threads, total / 1e9);
}
"""


def has_vnni() -> bool:
    """Whether the CPU reports AVX-512 VNNI (Linux's /proc/cpuinfo)."""
    try:
        return "avx512_vnni" in Path("/proc/cpuinfo").read_text().split()
    except OSError:
        return False


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=1.0, help="per measurement (default 1)")
    parser.add_argument("--threads", type=int, default=2, help="threads at once (default 2)")
    args = parser.parse_args()
    if args.seconds <= 0 or args.threads < 1:
        parser.error("need --seconds > 0 and --threads >= 1")
    compiler = shutil.which("c++") or shutil.which("g++")
    if compiler is None or not has_vnni():
        sys.exit("vnni_peak needs a C++ compiler and a CPU with AVX-512 VNNI")
    with tempfile.TemporaryDirectory() as folder:
        source, binary = Path(folder) / "peak.cpp", Path(folder) / "peak"
        source.write_text(SOURCE)
        subprocess.run([compiler, "-O2", "-march=native", "-pthread", str(source), "-o", str(binary)], check=True)
        subprocess.run([str(binary), str(args.seconds), str(args.threads)], check=True)


if __name__ == "__main__":
    main()
