"""Interactive latency while a batch runs, and how much of the spare capacity the batch uses.

One llamaserve on SmolLM2 (the embedded model unless --model), then three phases:

1. interactive alone: `--clients` clients loop over streamed chat requests for `--seconds`;
   TTFT (to the first content token) per request, and their output tokens per second;
2. capacity: the same interactive clients beside `--capacity-clients` plain clients (ordinary
   priority) sending the batch's own line shape back to back for `--seconds`: the output tokens
   per second the server gives this mix, both kinds together;
3. the batch of `--lines` lines (each `--max-tokens` tokens, ignore_eos) submitted through the
   Batch API while the interactive clients run again, until the batch completes.

Reported: interactive TTFT p50 with and without the batch (goal: with ≤ 1.2× without), and the
batch's output tokens per second in phase 3 as a share of what phase 2's capacity leaves after
phase 3's interactive tokens (goal ≥ 80%).

    PYTHONPATH=$PWD flock /tmp/heavy.lock .venv/bin/python benchmarks/batch_bench.py --lines 1000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serve_bench import ServerProcess, free_port, wait_healthy

TOPICS = ["the sea", "a robot", "winter", "a library", "the moon", "bread", "a river", "trains"]


def interactive_body(i: int, max_tokens: int, phase: str) -> dict[str, Any]:
    topic = TOPICS[i % len(TOPICS)]
    # The phase's name first: no phase reuses another's cached prompts.
    text = f"{phase} request {i}. Write a few sentences about {topic}, as a short note to a friend who likes {topic}."
    return {
        "messages": [{"role": "user", "content": text}],
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "stream": True,
    }


def line_body(i: int, max_tokens: int, phase: str) -> dict[str, Any]:
    topic = TOPICS[(i * 3) % len(TOPICS)]
    text = f"{phase} item {i}: summarise what people usually know about {topic} in one paragraph."
    return {"messages": [{"role": "user", "content": text}], "max_tokens": max_tokens, "ignore_eos": True}


@dataclass
class Interactive:
    ttft: list[float] = field(default_factory=list)
    tokens: int = 0


async def one_stream(client: httpx.AsyncClient, url: str, body: dict[str, Any], out: Interactive) -> None:
    start = time.perf_counter()
    first = None
    async with client.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=120) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            delta = (chunk.get("choices") or [{}])[0].get("delta") or {}
            if first is None and delta.get("content"):
                first = time.perf_counter() - start
            if chunk.get("usage"):
                out.tokens += chunk["usage"]["completion_tokens"]
    if first is not None:
        out.ttft.append(first)


async def interactive_load(url: str, clients: int, until: asyncio.Event, max_tokens: int, phase: str) -> Interactive:
    out = Interactive()
    async with httpx.AsyncClient() as client:

        async def loop(c: int) -> None:
            i = c
            while not until.is_set():
                body = {**interactive_body(i, max_tokens, phase), "stream_options": {"include_usage": True}}
                await one_stream(client, url, body, out)
                i += clients

        await asyncio.gather(*(loop(c) for c in range(clients)))
    return out


async def capacity(url: str, clients: int, seconds: float, max_tokens: int) -> float:
    """Output tokens per second with `clients` plain clients sending batch-shaped requests."""
    tokens = 0
    deadline = time.perf_counter() + seconds
    async with httpx.AsyncClient() as client:

        async def loop(c: int) -> None:
            nonlocal tokens
            i = c
            while time.perf_counter() < deadline:
                r = await client.post(
                    f"{url}/v1/chat/completions", json=line_body(i, max_tokens, "Capacity"), timeout=120
                )
                tokens += r.json()["usage"]["completion_tokens"]
                i += clients

        start = time.perf_counter()
        await asyncio.gather(*(loop(c) for c in range(clients)))
    return tokens / (time.perf_counter() - start)


async def timed_interactive(
    url: str, clients: int, seconds: float, max_tokens: int, phase: str
) -> tuple[Interactive, float]:
    stop = asyncio.Event()
    start = time.perf_counter()
    task = asyncio.create_task(interactive_load(url, clients, stop, max_tokens, phase))
    await asyncio.sleep(seconds)
    stop.set()
    out = await task
    return out, time.perf_counter() - start


async def with_batch(url: str, args: argparse.Namespace) -> tuple[Interactive, float, float, dict[str, Any]]:
    rows = [
        json.dumps(
            {
                "custom_id": f"b{i}",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": line_body(i, args.max_tokens, "Batch"),
            }
        )
        for i in range(args.lines)
    ]
    async with httpx.AsyncClient(timeout=60) as client:
        files = {"file": ("bench.jsonl", ("\n".join(rows) + "\n").encode())}
        upload = (await client.post(f"{url}/v1/files", files=files, data={"purpose": "batch"})).json()
        stop = asyncio.Event()
        load = asyncio.create_task(interactive_load(url, args.clients, stop, args.interactive_tokens, "Beside"))
        await asyncio.sleep(2.0)  # the interactive clients are running before the batch starts
        batch = (
            await client.post(
                f"{url}/v1/batches",
                json={"input_file_id": upload["id"], "endpoint": "/v1/chat/completions", "completion_window": "24h"},
            )
        ).json()
        start = time.perf_counter()
        while True:
            await asyncio.sleep(0.5)
            obj = (await client.get(f"{url}/v1/batches/{batch['id']}")).json()
            if obj["status"] not in ("validating", "in_progress", "finalizing"):
                break
        elapsed = time.perf_counter() - start
        stop.set()
        out = await load
    batch_tps = obj["request_counts"]["completed"] * args.max_tokens / elapsed
    return out, elapsed, batch_tps, obj


async def main_async(args: argparse.Namespace) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    folder = tempfile.mkdtemp(prefix="batch-bench-")
    argv = [sys.executable, "-m", "llamaserve", "--port", str(port), "-np", str(args.slots), "-c", str(args.ctx),
            "-t", str(args.threads), "--temp", "0", "--batch-dir", folder]  # fmt: skip
    if args.model:
        argv += ["-m", args.model]
    if args.batch_concurrency:
        argv += ["--batch-concurrency", str(args.batch_concurrency)]
    server = ServerProcess(argv, Path(folder) / "server.log")
    server.start()
    try:
        async with httpx.AsyncClient() as client:
            await wait_healthy(client, url, 180, server.alive)
        await timed_interactive(url, args.clients, 3, args.interactive_tokens, "Warm-up")
        alone, alone_s = await timed_interactive(url, args.clients, args.seconds, args.interactive_tokens, "Alone")
        # Capacity of this mix: the interactive clients streaming as in phase 3, beside plain
        # clients at the interactive priority sending the batch's line shape back to back.
        mixed = asyncio.create_task(timed_interactive(url, args.clients, args.seconds, args.interactive_tokens, "Mix"))
        plain_tps = await capacity(url, args.capacity_clients, args.seconds, args.max_tokens)
        mix, mix_s = await mixed
        cap = plain_tps + mix.tokens / mix_s
        during, batch_s, batch_tps, obj = await with_batch(url, args)
    finally:
        server.stop(20)
    p50_alone = statistics.median(alone.ttft)
    p50_during = statistics.median(during.ttft)
    inter_tps = during.tokens / batch_s
    left = max(cap - inter_tps, 1e-9)
    print(
        f"interactive alone:   {len(alone.ttft)} requests, TTFT p50 {p50_alone * 1000:.0f} ms, {alone.tokens / alone_s:.1f} tok/s"
    )
    print(
        f"capacity:            {cap:.1f} output tok/s ({args.clients} interactive clients at "
        f"{mix.tokens / mix_s:.1f} tok/s beside {args.capacity_clients} plain clients at {plain_tps:.1f})"
    )
    print(
        f"with the batch:      {len(during.ttft)} requests, TTFT p50 {p50_during * 1000:.0f} ms "
        f"({p50_during / p50_alone:.2f}x), {inter_tps:.1f} tok/s"
    )
    counts = obj["request_counts"]
    print(
        f"batch:               {obj['status']}, {counts['completed']}/{counts['total']} lines in {batch_s:.1f} s, "
        f"{batch_tps:.1f} tok/s = {batch_tps / left:.0%} of the {left:.1f} tok/s left"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="GGUF (default: the embedded SmolLM2)")
    parser.add_argument("--lines", type=int, default=1000)
    parser.add_argument("--max-tokens", type=int, default=16, help="output tokens of each batch line")
    parser.add_argument("--interactive-tokens", type=int, default=16, help="output tokens of each interactive request")
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=30.0, help="length of phases 1 and 2")
    parser.add_argument("--slots", type=int, default=16)
    parser.add_argument("--ctx", type=int, default=8192)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batch-concurrency", type=int, default=0, help="the server's --batch-concurrency (0: auto)")
    parser.add_argument(
        "--capacity-clients", type=int, default=8, help="plain clients beside the interactive ones in phase 2"
    )
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
