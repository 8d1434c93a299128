"""Streaming load benchmark: verispec with and without speculation against llama.cpp's server.

At each concurrency point (``--concurrency 1,4,16``) that many streaming chat clients send
dev prompts back to back (greedy, ``--max-tokens`` each) for ``--duration`` seconds; requests
still running then get ``--grace`` seconds to finish before they are abandoned (counted as
errors, "unfinished"). Servers, each a subprocess on a free loopback port, started once
before the first point and stopped after the last (an idle server uses no CPU):

    verispec   verispec serve --drafter lookup --k auto   (speculation on, the governor picks k)
    plain      verispec serve --drafter none              (no speculation)
    verispec-none  the verispec server's own process, its requests asking for no drafter
               (``"speculative": {"drafter": "none"}``): plain decoding in the process that
               speculates, so the two compare without the machine's per-process spread (a plain
               step's time moved by up to ~25% from one process to the next; BENCHMARKS.md)
    suffix     verispec serve --drafter suffix --k auto --suffix-cache 0   (not run unless asked for;
               no cache of earlier requests: the prompts repeat every 64 requests, and a cache
               would draft whole answers from the first time round)
    llamacpp   llama_cpp.server on the same GGUF file (see LLAMACPP_LAUNCHER), --n_ctx 4096, with the thread
               count verispec uses, --interrupt_requests False (its default aborts a running
               completion when another request arrives) (needs llama-cpp-python[server])
    replicas1  verispec serve --replicas 1: as verispec, in one Ray Serve replica with one CPU
    replicas2  verispec serve --replicas 2: two such replicas behind Ray Serve's proxy (not run
               unless asked for: --servers replicas1,replicas2; needs the ray extra)

Within one point the servers run one after another for the same duration: they cannot be
interleaved, since each needs the machine to itself while it is measured. The order rotates
from point to point, and again each time a point repeats, so that drift of the machine (heat,
other load) spreads over all.

Reported per server and point, over the requests that finished:
    tok/s       completion tokens of finished requests / the point's wall time (send + grace)
    TTFT        time to first token: from sending a request to its first chunk with text
    ITL         inter-chunk latency: the gap between consecutive chunks with text of one request,
                per chunk (a verispec chunk holds one round's tokens, so tok/chunk is reported too)
    tok/chunk   completion tokens / chunks with text
Completion tokens come from the usage chunk (``stream_options.include_usage``); llama-cpp-python
sends none, so its streamed text is counted with the model's tokenizer after the point ends.

Below the table, the ratios the targets are stated in: each server's median tok/s at a point
over its own at 1 client, and each run over the same repeat's run of ``plain`` and of
``verispec-none`` (list a point twice, ``--concurrency 1,4,16,1,4,16``, to repeat it).

Writes ``results.json``, ``table.md`` and ``serve_load.png`` (tok/s and p95 TTFT against
concurrency) into ``--out``; ``--replot results.json`` redraws the plot and table from a file.

    .venv/bin/python benchmarks/serve_load.py                                 # 1, 4, 16 clients, 30 s each
    .venv/bin/python benchmarks/serve_load.py --servers verispec,plain --concurrency 1,2 --duration 5
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any

import httpx
from load_test import free_port, launch, percentile, stop_server, verispec_command

from verispec import models
from verispec.cpu import cpu_threads
from verispec.prompts import load_prompts, round_robin

SERVERS = ("verispec", "plain", "llamacpp", "verispec-none", "replicas1", "replicas2", "suffix")
DEFAULT_SERVERS = SERVERS[:4]
# name: (the server whose process it runs in, what its requests ask for as "speculative")
SAME_PROCESS = {"verispec-none": ("verispec", {"drafter": "none"})}
SPECULATING = {"drafter": "lookup", "k": "auto"}
VERISPEC_OPTIONS: dict[str, dict[str, Any]] = {
    "verispec": SPECULATING,
    "plain": {"drafter": "none"},
    "suffix": {"drafter": "suffix", "k": "auto", "suffix_cache": 0},
    "replicas1": {**SPECULATING, "replicas": 1},
    "replicas2": {**SPECULATING, "replicas": 2},
}
LLAMACPP_CONTEXT = 4096
MAX_DURATION = 600.0


def _auth() -> dict[str, str]:
    """The verispec servers inherit $VERISPEC_API_KEY (their default key): send it when set."""
    key = os.environ.get("VERISPEC_API_KEY")
    return {"Authorization": f"Bearer {key}"} if key else {}


@dataclass
class StreamRecord:
    """One streamed chat completion as its client saw it: the arrival time of every chunk
    with text (``perf_counter`` seconds), the text, and the usage chunk's token count."""

    sent: float
    chunk_times: list[float] = field(default_factory=list)
    text: list[str] = field(default_factory=list)
    completion_tokens: int | None = None  # None: the server sent no usage
    error: str | None = None  # an error event inside the stream
    done: bool = False  # "[DONE]" arrived

    def feed(self, line: str, now: float) -> None:
        """Take one line of the server-sent-event stream, received at ``now``."""
        if not line.startswith("data:"):
            return  # blank separators, comments, other fields
        data = line[len("data:") :].strip()
        if data == "[DONE]":
            self.done = True
            return
        try:
            chunk = json.loads(data)
        except json.JSONDecodeError:
            self.error = f"not JSON: {data[:80]!r}"
            return
        if not isinstance(chunk, dict):
            self.error = f"not a JSON object: {data[:80]!r}"
            return
        if "error" in chunk:
            error = chunk["error"]
            self.error = str(error.get("code") or error.get("message")) if isinstance(error, dict) else str(error)
            return
        usage = chunk.get("usage")
        if usage:
            self.completion_tokens = int(usage["completion_tokens"])
        for choice in chunk.get("choices") or []:
            content = (choice.get("delta") or {}).get("content")
            if content:
                self.chunk_times.append(now)
                self.text.append(content)

    @property
    def ttft(self) -> float | None:
        return self.chunk_times[0] - self.sent if self.chunk_times else None

    @property
    def gaps(self) -> list[float]:
        return [later - earlier for earlier, later in pairwise(self.chunk_times)]


@dataclass
class Point:
    """What the clients of one (server, concurrency) run saw."""

    records: list[StreamRecord] = field(default_factory=list)  # finished requests
    statuses: Counter[str] = field(default_factory=Counter)  # every request: "ok" or why not


async def stream_one(client: httpx.AsyncClient, body: dict[str, Any], point: Point) -> None:
    """Send one streaming chat request and record it; a 429 waits its Retry-After."""
    record = StreamRecord(sent=time.perf_counter())
    async with client.stream("POST", "/v1/chat/completions", json=body) as response:
        if response.status_code != 200:
            point.statuses[str(response.status_code)] += 1
            if response.status_code == 429:
                await asyncio.sleep(float(response.headers.get("Retry-After", "1")))
            return
        async for line in response.aiter_lines():
            record.feed(line, time.perf_counter())
    if record.error is not None:
        point.statuses[f"stream error: {record.error}"] += 1
    elif not record.done:
        point.statuses["stream ended without [DONE]"] += 1
    else:
        point.statuses["ok"] += 1
        point.records.append(record)


async def client_loop(client: httpx.AsyncClient, next_body: Any, deadline: float, point: Point) -> None:
    while time.monotonic() < deadline:
        try:
            await stream_one(client, next_body(), point)
        except asyncio.CancelledError:  # still running when the grace period ended
            point.statuses["unfinished"] += 1
            raise
        except httpx.HTTPError as error:
            point.statuses[type(error).__name__] += 1


async def run_point(
    url: str, bodies: list[dict[str, Any]], clients: int, args: argparse.Namespace
) -> tuple[Point, float]:
    """``clients`` loops for ``args.duration`` seconds (+ grace); the point and its wall time."""
    point = Point()
    counter = [0]

    def next_body() -> dict[str, Any]:  # the clients share one walk through the prompts
        counter[0] += 1
        return bodies[(counter[0] - 1) % len(bodies)]

    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    timeout = httpx.Timeout(args.duration + args.grace + 30.0)
    async with httpx.AsyncClient(base_url=url, headers=_auth(), limits=limits, timeout=timeout) as client:
        start = time.monotonic()
        loops = [
            asyncio.ensure_future(client_loop(client, next_body, start + args.duration, point)) for _ in range(clients)
        ]
        _, late = await asyncio.wait(loops, timeout=args.duration + args.grace)
        for task in late:
            task.cancel()
        await asyncio.gather(*late, return_exceptions=True)
        wall = time.monotonic() - start
    return point, wall


def summarize(server: str, clients: int, point: Point, wall: float) -> dict[str, Any]:
    """One row of the report; every record must have its completion tokens by now."""
    records = point.records
    tokens = sum(r.completion_tokens or 0 for r in records)
    chunks = sum(len(r.chunk_times) for r in records)
    ttfts = [t for r in records if (t := r.ttft) is not None]
    gaps = [gap for r in records for gap in r.gaps]
    return {
        "server": server,
        "concurrency": clients,
        "wall_s": round(wall, 3),
        "finished": len(records),
        "errors": sum(n for status, n in point.statuses.items() if status != "ok"),
        "statuses": dict(point.statuses),
        "completion_tokens": tokens,
        "tokens_per_s": tokens / wall if wall else 0.0,
        "ttft_p50_s": percentile(ttfts, 0.50),
        "ttft_p95_s": percentile(ttfts, 0.95),
        "itl_p50_s": percentile(gaps, 0.50),
        "itl_p95_s": percentile(gaps, 0.95),
        "itl_mean_s": statistics.fmean(gaps) if gaps else None,
        "tokens_per_chunk": tokens / chunks if chunks else None,
    }


def count_missing_tokens(records: list[StreamRecord], tokenizer: Any) -> None:
    """Fill in the completion tokens of records whose stream carried no usage, by tokenizing
    the text they received (run after the point, so it takes no CPU from the server)."""
    for record in records:
        if record.completion_tokens is None:
            record.completion_tokens = len(tokenizer("".join(record.text), add_special_tokens=False)["input_ids"])


# --- servers --------------------------------------------------------------------------------


@dataclass
class Server:
    name: str
    process: subprocess.Popen[bytes]
    url: str
    model: str  # the id its /v1/models lists, sent as the request's model
    speculative: dict[str, Any] | None = None  # what its requests ask for (None: the server's default)
    owner: bool = True  # whether it started the process (and stops it)


# ggml's AMX matmul segfaults on the embedded Q4_1 model (see verispec.targets.llamacpp), and
# llama-cpp-python's server takes no option for it: it starts through this launcher, which
# keeps the weights out of ggml's extra buffer types on such CPUs, as verispec's backend does.
LLAMACPP_LAUNCHER = """
import runpy
import llama_cpp.llama_cpp as bindings
from verispec.cpu import cpu_has_amx_int8
defaults = bindings.llama_model_default_params
def params():
    chosen = defaults()
    chosen.use_extra_bufts = not cpu_has_amx_int8()
    return chosen
bindings.llama_model_default_params = params
runpy.run_module("llama_cpp.server", run_name="__main__", alter_sys=True)
"""


def start(name: str, args: argparse.Namespace, gguf: Path, log_dir: Path) -> Server:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = str(log_dir / f"{name}.log")
    if name == "llamacpp":
        threads = str(cpu_threads())  # what verispec's backends use: the cores this process may run on
        command = [sys.executable, "-c", LLAMACPP_LAUNCHER, "--model", str(gguf), "--host", "127.0.0.1"]
        command += ["--port", str(port), "--n_ctx", str(LLAMACPP_CONTEXT)]
        command += ["--n_threads", threads, "--n_threads_batch", threads]
        # Its default aborts the running completion whenever another request arrives: with
        # several clients nothing would finish. Off, it serves requests in turn (one lock).
        command += ["--interrupt_requests", "False"]
        process = launch(name, command, url + "/v1/models", log)
    else:
        options = {"model": args.model, **VERISPEC_OPTIONS[name], "max_queue": args.max_queue}
        process = launch(name, verispec_command(port, options), url + "/health", log)
        if "replicas" in options:
            wait_for_replicas(url, options["replicas"])
    model = httpx.get(url + "/v1/models", headers=_auth(), timeout=30).json()["data"][0]["id"]
    return Server(name, process, url, model)


def start_all(names: list[str], args: argparse.Namespace, gguf: Path, log_dir: Path) -> list[Server]:
    """The servers of ``names``, in that order; one that runs in another's process
    (SAME_PROCESS) shares it where that one is started too, and starts it for itself where not."""
    started: dict[str, Server] = {}
    try:
        for name in names:
            host_name = SAME_PROCESS[name][0] if name in SAME_PROCESS else name
            if name in SAME_PROCESS and host_name in names:
                continue  # joins its host below
            print(f"starting {name} ...", flush=True)
            started[name] = start(host_name, args, gguf, log_dir)
    except BaseException:
        for server in started.values():
            stop_server(server.process)
        raise
    servers = []
    for name in names:
        if name not in SAME_PROCESS:
            servers.append(started[name])
            continue
        host_name, speculative = SAME_PROCESS[name]
        own = started.get(name)
        host = own if own is not None else started[host_name]
        servers.append(Server(name, host.process, host.url, host.model, speculative, owner=own is not None))
    return servers


def wait_for_replicas(url: str, replicas: int, timeout: float = 600.0) -> None:
    """/health answers once one replica is up; /metrics counts those that are (all, here)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = httpx.get(url + "/metrics", headers=_auth(), timeout=30).text
        if f"verispec_replicas {float(replicas)}" in text:
            return
        time.sleep(1.0)
    sys.exit(f"serve_load: {replicas} replicas not up after {timeout:.0f} s")


async def warm_up(server: Server, body: dict[str, Any]) -> None:
    """One request, untimed: a server's first request pays for loading, compiling and
    calibrating; one that fails here stops the benchmark before anything is measured."""
    point = Point()
    async with httpx.AsyncClient(base_url=server.url, headers=_auth(), timeout=600.0) as client:
        await stream_one(client, body, point)
    if not point.records:
        stop = dict(point.statuses)
        sys.exit(f"serve_load: {server.name}'s first request failed ({stop}); see its log in the output folder")


def check_llamacpp_server() -> None:
    """Exit at once, not after the verispec runs, when llama-cpp-python's server cannot start."""
    probe = subprocess.run(
        [sys.executable, "-c", "import llama_cpp.server.app"], capture_output=True, text=True, check=False
    )
    if probe.returncode != 0:
        last = (probe.stderr.strip().splitlines() or ["?"])[-1]
        sys.exit(
            f"serve_load: llamacpp needs llama-cpp-python's server ({last}): pip install 'llama-cpp-python[server]'"
        )


def request_bodies(server: Server, prompts: list[str], max_tokens: int) -> list[dict[str, Any]]:
    body: dict[str, Any] = {
        "model": server.model,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if server.name == "llamacpp":
        body["repeat_penalty"] = 1.0  # its default is 1.1: greedy must be the plain argmax, as verispec's
    if server.speculative is not None:
        body["speculative"] = server.speculative
    return [{**body, "messages": [{"role": "user", "content": prompt}]} for prompt in prompts]


# --- report ---------------------------------------------------------------------------------


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{1000 * seconds:.0f}"


def _fixed(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


COLUMNS = (  # the report table: header, cell of a row
    ("clients", lambda row: str(row["concurrency"])),
    ("server", lambda row: row["server"]),
    ("tok/s", lambda row: _fixed(row["tokens_per_s"], 1)),
    ("TTFT p50 ms", lambda row: _ms(row["ttft_p50_s"])),
    ("TTFT p95 ms", lambda row: _ms(row["ttft_p95_s"])),
    ("ITL p50 ms", lambda row: _ms(row["itl_p50_s"])),
    ("ITL p95 ms", lambda row: _ms(row["itl_p95_s"])),
    ("tok/chunk", lambda row: _fixed(row["tokens_per_chunk"], 2)),
    ("finished", lambda row: str(row["finished"])),
    ("errors", lambda row: str(row["errors"])),
)


def markdown_table(rows: list[dict[str, Any]]) -> str:
    """The rows as GitHub markdown (for BENCHMARKS.md), by concurrency, then server."""
    lines = ["| " + " | ".join(name for name, _ in COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for row in sorted(rows, key=lambda r: (r["concurrency"], SERVERS.index(r["server"]))):
        lines.append("| " + " | ".join(cell(row) for _, cell in COLUMNS) + " |")
    return "\n".join(lines)


REFERENCES = ("plain", "verispec-none")  # what speculating servers are divided by


def _ratios(values: list[float]) -> str:
    """Each run's ratio, and their median where there are several."""
    if not values:
        return "-"
    each = ", ".join(f"{v:.3f}" for v in values)
    return each if len(values) == 1 else f"{each} (median {statistics.median(values):.3f})"


def by_point(rows: list[dict[str, Any]]) -> dict[tuple[int, str], list[dict[str, Any]]]:
    """The rows of each (concurrency, server), in run order (a repeated point has several)."""
    points: dict[tuple[int, str], list[dict[str, Any]]] = {}
    for row in rows:
        points.setdefault((row["concurrency"], row["server"]), []).append(row)
    return points


def ratio_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What the issue's targets read from a run, per concurrency and server: the median tok/s
    over the point's runs (a point listed twice in ``--concurrency`` runs twice), that median
    over the same server's at 1 client, and each run's tok/s over the reference servers' run
    of the same repeat (the n-th run of a point against the n-th of the reference): runs of
    one repeat lie minutes apart, the repeats themselves further."""
    runs = {point: [r["tokens_per_s"] for r in mine] for point, mine in by_point(rows).items()}
    out: list[dict[str, Any]] = []
    for (clients, server), speeds in sorted(runs.items(), key=lambda kv: (kv[0][0], SERVERS.index(kv[0][1]))):
        alone = runs.get((1, server))
        median = statistics.median(speeds)
        entry: dict[str, Any] = {
            "concurrency": clients,
            "server": server,
            "runs": len(speeds),
            "tokens_per_s": median,
            "times_one_client": median / statistics.median(alone) if alone else None,
        }
        for reference in REFERENCES:
            theirs = runs.get((clients, reference), [])
            pairs = [] if reference == server else list(zip(speeds, theirs, strict=False))
            entry[f"over_{reference}"] = [mine / base for mine, base in pairs if base > 0]
        out.append(entry)
    return out


def ratio_table(rows: list[dict[str, Any]]) -> str:
    """``ratio_rows`` as GitHub markdown."""
    names = ("clients", "server", "runs", "tok/s (median)", "x its 1 client", "/ plain, each run")
    lines = ["| " + " | ".join((*names, "/ verispec-none, each run")) + " |", "|" + "---|" * 7]
    for entry in ratio_rows(rows):
        times = entry["times_one_client"]
        cells = [
            str(entry["concurrency"]),
            entry["server"],
            str(entry["runs"]),
            f"{entry['tokens_per_s']:.1f}",
            "-" if times is None else f"{times:.2f}",
            *(_ratios(entry[f"over_{reference}"]) for reference in REFERENCES),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(rows: list[dict[str, Any]], path: Path, title: str) -> Path:
    """Total tok/s and p95 TTFT against concurrency, one line per server (a point run more
    than once drawn at its runs' medians)."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no screen
    import matplotlib.pyplot as plt

    fig, (speed, first) = plt.subplots(1, 2, figsize=(11, 4.5))
    grouped = by_point(rows)
    for server in [s for s in SERVERS if any(r["server"] == s for r in rows)]:
        at = {c: mine for (c, name), mine in grouped.items() if name == server}
        clients = sorted(at)
        speeds = [statistics.median(r["tokens_per_s"] for r in at[c]) for c in clients]
        speed.plot(clients, speeds, marker="o", label=server)
        ttft = [(c, [r["ttft_p95_s"] for r in at[c] if r["ttft_p95_s"] is not None]) for c in clients]
        ttft = [(c, statistics.median(t)) for c, t in ttft if t]
        first.plot([c for c, _ in ttft], [t for _, t in ttft], marker="o", label=server)
    points = sorted({r["concurrency"] for r in rows})
    for ax in (speed, first):
        ax.set_xscale("log", base=2)
        ax.set_xticks(points, [str(p) for p in points])
        ax.minorticks_off()
        ax.set_xlabel("concurrent streaming clients")
        ax.legend(fontsize=8)
    speed.set_ylabel("total completion tokens/s")
    speed.set_ylim(bottom=0)
    first.set_ylabel("p95 time to first token (s)")
    first.set_ylim(bottom=0)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_outputs(document: dict[str, Any], directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    table = markdown_table(document["rows"]) + "\n\n" + ratio_table(document["rows"])
    (directory / "table.md").write_text(table + "\n")
    settings = document["settings"]
    title = f"serve load: {settings['model']}, {settings['max_tokens']} tokens, {settings['duration_s']:.0f} s a point"
    plotted = plot(document["rows"], directory / "serve_load.png", title)
    print(table)
    print(f"wrote {directory / 'table.md'} and {plotted}")


def _concurrency(text: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected client counts like 1,4,16, got {text!r}") from None
    if not values or any(not 1 <= v <= 256 for v in values):
        raise argparse.ArgumentTypeError(f"client counts must be 1..256, got {text!r}")
    return values


def _servers(text: str) -> list[str]:
    names = [part.strip() for part in text.split(",") if part.strip()]
    unknown = [n for n in names if n not in SERVERS]
    if not names or unknown:
        raise argparse.ArgumentTypeError(f"servers are {', '.join(SERVERS)}; got {text!r}")
    return list(dict.fromkeys(names))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=_concurrency, default=[1, 4, 16], help="client counts (default 1,4,16)")
    parser.add_argument(
        "--servers",
        type=_servers,
        default=list(DEFAULT_SERVERS),
        help=f"of {','.join(SERVERS)} (default {','.join(DEFAULT_SERVERS)})",
    )
    parser.add_argument("--duration", type=float, default=30.0, help="seconds of sending per server and point")
    parser.add_argument("--grace", type=float, default=60.0, help="then seconds for requests in flight to finish")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--prompts", default=None, help="Spec-Bench JSONL (default: the shared dev set)")
    parser.add_argument("--model", default=None, help="a GGUF file (default: the embedded model)")
    parser.add_argument("--max-queue", type=int, default=256, help="verispec's --max-queue")
    parser.add_argument("--out", default="bench-results/serve_load", help="output directory")
    parser.add_argument("--replot", default=None, help="redraw table and plot from this results.json, run nothing")
    args = parser.parse_args()
    if args.replot:
        document = json.loads(Path(args.replot).read_text())
        write_outputs(document, Path(args.out))
        return
    if not 0 < args.duration <= MAX_DURATION or args.grace < 0 or args.max_tokens < 1:
        sys.exit(f"serve_load: need 0 < --duration <= {MAX_DURATION:.0f}, --grace >= 0, --max-tokens >= 1")
    source = models.resolve(args.model)
    if source.kind != "gguf":
        sys.exit(f"serve_load: --model must be a GGUF file (llama.cpp serves the same file), got {source.location}")
    if "llamacpp" in args.servers:
        check_llamacpp_server()
    prompts = [p.text for p in round_robin(load_prompts(args.prompts), 64)]
    directory = Path(args.out)
    (directory / "logs").mkdir(parents=True, exist_ok=True)
    tokenizer = models.tokenizer_for(source) if "llamacpp" in args.servers else None

    document: dict[str, Any] = {
        "settings": {
            "model": source.name,
            "gguf": source.location,
            "servers": args.servers,
            "concurrency": args.concurrency,
            "duration_s": args.duration,
            "grace_s": args.grace,
            "max_tokens": args.max_tokens,
            "prompts": str(args.prompts or "default dev set"),
            "max_queue": args.max_queue,
        },
        "environment": {"cpu_threads": cpu_threads(), "load_average_before": os.getloadavg()},
        "rows": [],
    }
    servers: list[Server] = []
    try:
        servers = start_all(args.servers, args, Path(source.location), directory / "logs")
        for server in servers:
            asyncio.run(warm_up(server, request_bodies(server, prompts[:1], args.max_tokens)[0]))
        for index, clients in enumerate(args.concurrency):
            shift = rotation(args.concurrency, index, len(servers))
            for server in servers[shift:] + servers[:shift]:
                row = measure(server, clients, request_bodies(server, prompts, args.max_tokens), tokenizer, args)
                document["rows"].append(row)
                save(document, directory)  # after every point: a run cut short keeps what it measured
    finally:
        for server in servers:
            if server.owner:
                stop_server(server.process)
    document["environment"]["load_average_after"] = os.getloadavg()
    save(document, directory)
    print(f"wrote {directory / 'results.json'}")
    write_outputs(document, directory)


def rotation(points: list[int], index: int, servers: int) -> int:
    """Where the server order starts at point ``index`` of ``points``: one further on from
    point to point, and one further again each time a point repeats. Rotating by the index
    alone gave a point that repeats with the servers' period (1,4,16,1,4,16 with 3 servers)
    the same order every time, so one server always ran last at 4 clients."""
    first = list(dict.fromkeys(points)).index(points[index])
    repeat = points[:index].count(points[index])
    return (first + repeat) % servers


def measure(
    server: Server, clients: int, bodies: list[dict[str, Any]], tokenizer: Any, args: argparse.Namespace
) -> dict[str, Any]:
    """One point of one server: its report row (printed as it is done)."""
    point, wall = asyncio.run(run_point(server.url, bodies, clients, args))
    if tokenizer is not None:
        count_missing_tokens(point.records, tokenizer)
    row = summarize(server.name, clients, point, wall)
    print(
        f"{clients:>3} clients  {server.name:<13} {row['tokens_per_s']:7.1f} tok/s  "
        f"TTFT p95 {_ms(row['ttft_p95_s'])} ms  finished {row['finished']}  errors {row['errors']}",
        flush=True,
    )
    return row


def save(document: dict[str, Any], directory: Path) -> None:
    document["saved_at"] = time.strftime("%Y-%m-%dT%H:%M:%S")
    (directory / "results.json").write_text(json.dumps(document, indent=1))


if __name__ == "__main__":
    main()
