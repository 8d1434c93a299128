"""Loopback load test of ``verispec serve``: N concurrent clients for a fixed time.

Starts a server (or targets a running one with --url, loopback only), then runs --clients
client loops, each sending chat completions back to back until --duration seconds have
passed; requests in flight then get --grace seconds to finish before they are abandoned
(counted as errors, "unfinished"). Reports requests/s, p50/p95/p99 latency of the requests
that succeeded, errors by status, generated tokens/s, and the speculative usage summed over
the requests. Bounded: --duration (at most 600 s) + --grace of wall time, --max-requests.

    .venv/bin/python benchmarks/load_test.py                          # embedded model, 32 clients, 60 s
    .venv/bin/python benchmarks/load_test.py --url http://127.0.0.1:8000 --clients 8 --duration 20
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlparse

import httpx

from verispec.prompts import load_prompts, round_robin

MAX_DURATION = 600.0
FALLBACK_PROMPTS = [
    "Correct the spelling: The quick brown fox jumpd over the lazy dog.",
    "Summarise in one sentence: speculative decoding drafts tokens cheaply and verifies them in one pass.",
    "List three colours.",
    "Repeat after me: the cat sat on the mat.",
]


@dataclass
class Results:
    latencies: list[float] = field(default_factory=list)  # successful requests, seconds
    statuses: Counter[str] = field(default_factory=Counter)
    completion_tokens: int = 0
    speculative: Counter[str] = field(default_factory=Counter)


async def client_loop(
    client: httpx.AsyncClient, body_for: Any, deadline: float, budget: list[int], results: Results
) -> None:
    while time.monotonic() < deadline and budget[0] > 0:
        budget[0] -= 1
        start = time.perf_counter()
        try:
            response = await client.post("/v1/chat/completions", json=body_for())
        except asyncio.CancelledError:  # still running when the grace period ended
            results.statuses["unfinished"] += 1
            raise
        except httpx.HTTPError as error:
            results.statuses[type(error).__name__] += 1
            continue
        elapsed = time.perf_counter() - start
        results.statuses[str(response.status_code)] += 1
        if response.status_code == 200:
            results.latencies.append(elapsed)
            usage = response.json()["usage"]
            results.completion_tokens += usage["completion_tokens"]
            for key in ("rounds", "offered", "accepted", "bonus"):
                results.speculative[key] += usage["speculative"][key]
        elif response.status_code == 429:
            await asyncio.sleep(float(response.headers.get("Retry-After", "1")))


async def run_load(url: str, model: str, args: argparse.Namespace, api_key: str | None) -> dict[str, Any]:
    prompts = _prompts(args.prompts)
    counter = [0]

    def body_for() -> dict[str, Any]:
        counter[0] += 1
        return {
            "model": model,
            "messages": [{"role": "user", "content": prompts[counter[0] % len(prompts)]}],
            "max_tokens": args.max_tokens,
            "temperature": args.temperature,
        }

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    limits = httpx.Limits(max_connections=args.clients, max_keepalive_connections=args.clients)
    timeout = httpx.Timeout(args.duration + args.grace + 30.0)
    results = Results()
    budget = [args.max_requests]
    async with httpx.AsyncClient(base_url=url, headers=headers, limits=limits, timeout=timeout) as client:
        start = time.monotonic()
        deadline = start + args.duration
        loops = [
            asyncio.ensure_future(client_loop(client, body_for, deadline, budget, results)) for _ in range(args.clients)
        ]
        _, late = await asyncio.wait(loops, timeout=args.duration + args.grace)
        for task in late:  # requests still running after the grace period: abandoned (disconnects)
            task.cancel()
        await asyncio.gather(*late, return_exceptions=True)
        wall = time.monotonic() - start
    return _report(results, wall, args)


def _report(results: Results, wall: float, args: argparse.Namespace) -> dict[str, Any]:
    ok = len(results.latencies)
    total = sum(results.statuses.values())
    latencies = sorted(results.latencies)
    spec = results.speculative
    return {
        "clients": args.clients,
        "duration_s": args.duration,
        "wall_s": round(wall, 2),
        "max_tokens": args.max_tokens,
        "requests": total,
        "ok": ok,
        "errors": total - ok,  # any status but 200, transport errors, and requests unfinished after --grace
        "statuses": dict(results.statuses),
        "requests_per_s": round(ok / wall, 3) if wall else 0.0,
        "latency_p50_s": percentile(latencies, 0.50),
        "latency_p95_s": percentile(latencies, 0.95),
        "latency_p99_s": percentile(latencies, 0.99),
        "latency_mean_s": statistics.fmean(latencies) if latencies else None,
        "generated_tokens_per_s": round(results.completion_tokens / wall, 2) if wall else 0.0,
        "acceptance_rate": spec["accepted"] / spec["offered"] if spec["offered"] else 0.0,
        "tokens_per_round": (spec["accepted"] + spec["bonus"]) / spec["rounds"] if spec["rounds"] else 0.0,
    }


def percentile(values: list[float], q: float) -> float | None:
    """The ``q`` quantile (0..1) of ``values`` by nearest rank; None when there are none."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _prompts(path: str | None) -> list[str]:
    try:
        return [p.text for p in round_robin(load_prompts(path), 64)]
    except Exception:  # no prompt file on this machine: a few built-in prompts
        if path is not None:
            raise
        return FALLBACK_PROMPTS


def _check_loopback(url: str) -> None:
    host = urlparse(url).hostname or ""
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if not loopback:
        sys.exit(f"load_test: refusing {url}: loopback addresses only")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def verispec_command(port: int, options: dict[str, Any]) -> list[str]:
    """``verispec serve`` on loopback ``port``; ``options`` maps option names to values (None: the default)."""
    command = [sys.executable, "-m", "verispec.cli", "serve", "--port", str(port)]
    for option, value in options.items():
        if value is not None:
            command += [f"--{option.replace('_', '-')}", str(value)]
    return command


def launch(
    name: str, command: list[str], ready_url: str, log_path: str | None, timeout: float = 900.0
) -> subprocess.Popen[bytes]:
    """Start server ``name`` and wait until ``ready_url`` answers 200; exits (with the end of
    its log, when one is kept) if the process ends first or is not ready within ``timeout``."""
    log = open(log_path, "wb") if log_path else subprocess.DEVNULL  # noqa: SIM115
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            sys.exit(f"{name}: the server exited with {process.returncode} before it was ready{_log_tail(log_path)}")
        try:
            if httpx.get(ready_url, timeout=2).status_code == 200:
                return process
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    process.kill()
    sys.exit(f"{name}: the server was not ready after {timeout:.0f} s{_log_tail(log_path)}")


def _log_tail(log_path: str | None) -> str:
    if not log_path:
        return " (its output was not kept)"
    with open(log_path, "rb") as handle:
        return f"; the end of {log_path}:\n" + handle.read()[-3000:].decode(errors="replace")


def stop_server(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM (the server drains), then a kill if it has not ended within two minutes."""
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(120)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def start_server(args: argparse.Namespace) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    options = {name: getattr(args, name) for name in ("model", "dtype", "drafter", "k", "max_queue")}
    url = f"http://127.0.0.1:{port}"
    return launch("load_test", verispec_command(port, options), url + "/health", args.server_log), url


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default=None, help="a running server (loopback); default: start one")
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--duration", type=float, default=60.0, help=f"seconds of sending (at most {MAX_DURATION:.0f})")
    parser.add_argument("--max-requests", type=int, default=100_000, help="stop sending after this many")
    parser.add_argument(
        "--grace", type=float, default=60.0, help="after --duration, seconds to let requests in flight finish"
    )
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--prompts", default=None, help="Spec-Bench JSONL (default: the shared dev set)")
    parser.add_argument("--json", default=None, help="also write the report here")
    started = parser.add_argument_group("the server started when --url is not given")
    started.add_argument("--model", default=None)
    started.add_argument("--dtype", default=None)
    started.add_argument("--drafter", default=None)
    started.add_argument("--k", default=None)
    started.add_argument("--max-queue", type=int, default=64)
    started.add_argument("--server-log", default=None, help="write the server's log here")
    args = parser.parse_args()
    if not 0 < args.duration <= MAX_DURATION or not 1 <= args.clients <= 256 or args.max_requests < 1:
        sys.exit(f"load_test: need 0 < --duration <= {MAX_DURATION:.0f}, 1 <= --clients <= 256, --max-requests >= 1")

    api_key = os.environ.get("VERISPEC_API_KEY")
    process = None
    if args.url is None:
        process, url = start_server(args)
    else:
        _check_loopback(args.url)
        url = args.url.rstrip("/")
    try:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        model = httpx.get(url + "/v1/models", headers=headers, timeout=30).json()["data"][0]["id"]
        report = asyncio.run(run_load(url, model, args, api_key))
    finally:
        if process is not None:
            stop_server(process)
    report["model"] = model
    print(json.dumps(report, indent=2))
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(report, handle, indent=2)


if __name__ == "__main__":
    main()
