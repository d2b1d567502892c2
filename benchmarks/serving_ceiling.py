"""The serving path alone: how close our server streams to what a GPU-like step allows.

    .venv/bin/python benchmarks/serving_ceiling.py [--levels 1:1.5,64:5,256:10] [--seconds 3]

Each level is STREAMS:STEP_MS. For each, `sleeping_server.py` starts our whole server
(HTTP, SSE, scheduler) over a runner that sleeps STEP_MS per step with the GIL released and
samples a fixed token, with `-np STREAMS`; a client in another process opens STREAMS
streaming chat requests at once (greedy, `ignore_eos`, T tokens each, T sized so a level
lasts about --seconds). An ideal server takes one step per micro-batch of the prompts
(STREAMS * ~40 tokens in micro-batches of 512, llama.cpp's default -ub) and T - 1 more, one
token per stream per step, so

    ideal tok/s = STREAMS * T / ((prompt steps + T - 1) * STEP_MS)

and the table gives the measured rate as a share of it, TTFT p50, and the CPU time per
streamed token of each of the server's threads (from /proc, named by the server's map of
native ids) and of the client process, so the client is seen not to be the bottleneck.
The goals of this benchmark: >= 95% of ideal at 1 stream / 1.5 ms, 64 / 5 ms, 256 / 10 ms.
Two more columns say where the rest went, per step: how late the runner's sleep returned (its
wakeup, then its wait for the GIL) and how long the scheduler took from one step's end to the
next one's start; a level's share is about STEP_MS / (STEP_MS + late + between).

A step costs STEP_MS per micro-batch because llama.cpp computes a decode's micro-batches one
after another, on a GPU as on a CPU: a server that puts 2,048 prompt tokens in one call pays
four micro-batches for them. Ours never plans more than one micro-batch a step, so the
sleeping runner's fixed STEP_MS per step charges it exactly that. (Until 2026-12-06 the ideal
counted prompt steps of 2,048 tokens: 5 instead of 20 at 256 streams, about 5% of that
level's ideal time.)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import re
import resource
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
CLOCK_TICK = os.sysconf("SC_CLK_TCK")
PROMPT_TOKENS = 40  # about what the chat template makes of the short question below
N_UBATCH = 512  # llama.cpp's default -ub, which the servers here run with
FIRST_TEXT = re.compile(rb'"content": ?"')


@dataclass
class ClientResult:
    tokens: int
    seconds: float
    ttft_ms: list[float]
    cpu_s: float
    failures: int


@dataclass
class Level:
    streams: int
    step_ms: float
    tokens: int  # per stream

    @property
    def ideal_tok_s(self) -> float:
        prompt_steps = max(1, -(-self.streams * PROMPT_TOKENS // N_UBATCH))
        return self.streams * self.tokens / ((prompt_steps + self.tokens - 1) * self.step_ms / 1000)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _one_stream(port: int, body: bytes, started: float) -> tuple[int, float]:
    """One streamed request over a raw socket: the count of SSE data lines and the TTFT.

    Counting `data: ` in the raw bytes keeps the client's cost per token small; the last
    chunk's `usage` gives the exact number of tokens.
    """
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode()
    writer.write(head + body)
    await writer.drain()
    ttft = -1.0
    tail = b""
    while True:
        data = await reader.read(65536)
        if not data:
            break
        # The first token is the first content string: the opening chunk's `"content": null`
        # (which our server sends before the prompt is decoded) is no token.
        if ttft < 0 and FIRST_TEXT.search(tail[-32:] + data):
            ttft = (time.perf_counter() - started) * 1000
        tail = (tail + data)[-4096:]
    writer.close()
    usage = tail.rfind(b'"completion_tokens":')
    if usage < 0:
        return 0, ttft
    digits = tail[usage + 20 :].lstrip().split(b",", 1)[0].split(b"}", 1)[0]
    return int(digits), ttft


async def _client(port: int, streams: int, tokens: int) -> ClientResult:
    body = json.dumps(
        {
            "messages": [{"role": "user", "content": "Write about rivers."}],
            "max_tokens": tokens,
            "temperature": 0,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
    ).encode()
    cpu0 = resource.getrusage(resource.RUSAGE_SELF)
    started = time.perf_counter()
    results = await asyncio.gather(*(_one_stream(port, body, started) for _ in range(streams)), return_exceptions=True)
    seconds = time.perf_counter() - started
    cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    done = [r for r in results if isinstance(r, tuple)]
    return ClientResult(
        tokens=sum(n for n, _ in done),
        seconds=seconds,
        ttft_ms=[t for _, t in done if t >= 0],
        cpu_s=(cpu1.ru_utime + cpu1.ru_stime) - (cpu0.ru_utime + cpu0.ru_stime),
        failures=sum(1 for r in results if not isinstance(r, tuple) or r[0] < tokens),
    )


def _client_process(port: int, streams: int, tokens: int, out: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    out.put(asyncio.run(_client(port, streams, tokens)))


def thread_cpu(pid: int, names: dict[str, str]) -> dict[str, float]:
    """CPU seconds of each thread of `pid`, summed by name (native threads as one group)."""
    totals: dict[str, float] = defaultdict(float)
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        seconds = (int(fields[11]) + int(fields[12])) / CLOCK_TICK
        totals[names.get(task.name, "native (llama.cpp, uvloop's own)")] += seconds
    return dict(totals)


def _wait_healthy(url: str, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.time() + 180
    while time.time() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the server exited: {log.read_text()[-2000:]}")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"the server never became healthy: {log}")


def run_level(level: Level, extra: list[str], workdir: Path) -> dict[str, object]:
    port = _free_port()
    names_file = workdir / f"threads-{port}.json"
    steps_file = workdir / f"threads-{port}-steps.json"  # sleeping_server.steps_file
    log = workdir / f"server-{port}.log"
    ctx = level.streams * (PROMPT_TOKENS + level.tokens + 64)
    cmd = [sys.executable, str(ROOT / "benchmarks" / "sleeping_server.py"), str(level.step_ms), str(names_file)]
    cmd += ["--port", str(port), "-np", str(level.streams), "-c", str(ctx), "-kvu", "-t", "2", *extra]
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        _wait_healthy(f"http://127.0.0.1:{port}", proc, log)
        time.sleep(0.6)  # the thread-name map is written every half second
        names = json.loads(names_file.read_text())
        steps_before = json.loads(steps_file.read_text())
        before = thread_cpu(proc.pid, names)
        queue: multiprocessing.Queue = multiprocessing.Queue()  # type: ignore[type-arg]
        client = multiprocessing.Process(target=_client_process, args=(port, level.streams, level.tokens, queue))
        client.start()
        result: ClientResult = queue.get(timeout=600)
        client.join()
        names = json.loads(names_file.read_text())
        after = thread_cpu(proc.pid, names)
        time.sleep(0.6)  # the step figures of the last steps
        steps_after = json.loads(steps_file.read_text())
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
    rate = result.tokens / result.seconds
    n_steps = max(steps_after["steps"] - steps_before["steps"], 1)
    per_thread = {name: (after.get(name, 0.0) - before.get(name, 0.0)) / max(result.tokens, 1) * 1e6 for name in after}
    return {
        "streams": level.streams,
        "step_ms": level.step_ms,
        "tokens_per_stream": level.tokens,
        "tok_s": round(rate, 1),
        "ideal_tok_s": round(level.ideal_tok_s, 1),
        "share_of_ideal": round(rate / level.ideal_tok_s, 3),
        "ttft_p50_ms": round(statistics.median(result.ttft_ms), 1) if result.ttft_ms else None,
        "failed_streams": result.failures,
        "server_cpu_us_per_token": round(sum(per_thread.values()), 1),
        "server_cpu_us_per_token_by_thread": {k: round(v, 1) for k, v in sorted(per_thread.items()) if v > 0.05},
        "client_cpu_us_per_token": round(result.cpu_s / max(result.tokens, 1) * 1e6, 1),
        # Where the share went, per step: the sleep's late return (wakeup, GIL), the scheduler's
        # own path from one step to the next.
        "step_late_us": round((steps_after["late_s"] - steps_before["late_s"]) / n_steps * 1e6, 1),
        "between_steps_us": round((steps_after["between_s"] - steps_before["between_s"]) / n_steps * 1e6, 1),
    }


def _by_thread(row: dict[str, object]) -> str:
    shares = row["server_cpu_us_per_token_by_thread"]
    assert isinstance(shares, dict)
    return ", ".join(f"{name} {us}" for name, us in shares.items())


def parse_levels(text: str, seconds: float) -> list[Level]:
    levels = []
    for part in text.split(","):
        streams, step_ms = part.split(":")
        step = float(step_ms)
        tokens = int(min(2048, max(64, seconds * 1000 / step)))
        levels.append(Level(int(streams), step, tokens))
    return levels


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--levels", default="1:1.5,64:5,256:10", help="STREAMS:STEP_MS, comma-separated")
    parser.add_argument("--seconds", type=float, default=3.0, help="about how long each level streams")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    parser.add_argument("extra", nargs="*", help="more flags for the server (after --)")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for level in parse_levels(args.levels, args.seconds):
            row = run_level(level, args.extra, Path(tmp))
            rows.append(row)
            print(json.dumps(row), flush=True)
    print()
    print(
        "| streams | step ms | tok/s | ideal | share | TTFT p50 ms | server µs/token (by thread) "
        "| client µs/token | step late µs | between steps µs |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['streams']} | {r['step_ms']} | {r['tok_s']} | {r['ideal_tok_s']} | {r['share_of_ideal']} "
            f"| {r['ttft_p50_ms']} | {r['server_cpu_us_per_token']} ({_by_thread(r)}) "
            f"| {r['client_cpu_us_per_token']} | {r['step_late_us']} | {r['between_steps_us']} |"
        )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
