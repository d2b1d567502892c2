"""Streaming through the router against the model's own process, in one run.

One router is started with a models folder holding one model; after a warm-up the
model's child process is asked directly and through the router in alternation, the
same streamed completion each time (`/completion`, temperature 0, `ignore_eos`, N
tokens, one stream at a time). Alternating puts both paths under the same machine load.
Per request the client measures the time to the first token (from sending to the first
chunk with text) and the decode rate (tokens after the first over the time from the first
to the last). Reported: the medians of each path, the decode ratio router/direct
(goal >= 0.95) and the added TTFT, the median of the pairwise differences (goal < 5 ms).

    .venv/bin/python benchmarks/router_bench.py --rounds 12 --tokens 64
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serve_bench import ServerProcess, free_port, wait_healthy

PROMPT = "Write a long story about a lighthouse keeper and the sea."


def default_model() -> str:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from llamaserve.config import embedded_default_model

    path = embedded_default_model()
    if not path:
        raise SystemExit("no model: pass --model")
    return path


async def one_stream(client: httpx.AsyncClient, url: str, tokens: int, model: str) -> tuple[float, float]:
    """(time to first token in s, decode tokens/s after the first)."""
    body = {"model": model, "prompt": PROMPT, "n_predict": tokens, "ignore_eos": True, "temperature": 0, "stream": True}
    start = time.perf_counter()
    first = last = 0.0
    n = 0
    async with client.stream("POST", url + "/completion", json=body) as res:
        res.raise_for_status()
        async for line in res.aiter_lines():
            if not line.startswith("data: "):
                continue
            event = json.loads(line[6:])
            if event.get("content"):
                now = time.perf_counter()
                n += 1
                if n == 1:
                    first = now
                last = now
    if n < 2:
        raise RuntimeError(f"{url}: only {n} tokens streamed")
    return first - start, (n - 1) / (last - first)


async def run(args: argparse.Namespace) -> None:
    model = args.model or default_model()
    tmp = Path(tempfile.mkdtemp(prefix="router-bench-"))
    (tmp / "models").mkdir()
    (tmp / "models" / "m.gguf").symlink_to(model)
    port = free_port()
    argv = [sys.executable, "-m", "llamaserve", "--port", str(port), "--models-dir", str(tmp / "models")]
    argv += ["-np", "1", "-c", "2048", "-t", str(args.threads)]
    server = ServerProcess(argv, tmp / "router.log")
    server.start()
    router = f"http://127.0.0.1:{port}"
    try:
        async with httpx.AsyncClient(timeout=600) as client:
            await wait_healthy(client, router, 120, server.alive)
            await one_stream(client, router, 4, "m")  # loads the model
            status = (await client.get(router + "/models")).json()["data"][0]["status"]
            child = f"http://127.0.0.1:{status['args'][status['args'].index('--port') + 1]}"
            await one_stream(client, child, 4, "m")
            direct: list[tuple[float, float]] = []
            routed: list[tuple[float, float]] = []
            for i in range(args.rounds):
                pair = [(child, direct), (router, routed)]
                for url, out in pair if i % 2 == 0 else reversed(pair):
                    out.append(await one_stream(client, url, args.tokens, "m"))
    finally:
        server.stop(20)
    d_ttft = statistics.median(t for t, _ in direct) * 1000
    r_ttft = statistics.median(t for t, _ in routed) * 1000
    added = statistics.median((r[0] - d[0]) * 1000 for d, r in zip(direct, routed, strict=True))
    d_rate = statistics.median(r for _, r in direct)
    r_rate = statistics.median(r for _, r in routed)
    print(f"model: {Path(model).name}, {args.rounds} rounds of {args.tokens} tokens, one stream at a time")
    print(f"direct to the child: TTFT {d_ttft:.1f} ms, decode {d_rate:.1f} tok/s")
    print(f"through the router:  TTFT {r_ttft:.1f} ms, decode {r_rate:.1f} tok/s")
    print(f"decode ratio router/direct: {r_rate / d_rate:.3f} (goal >= 0.95)")
    print(f"added TTFT (median of pairs): {added:.2f} ms (goal < 5 ms)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="GGUF file (default: the embedded SmolLM2-135M)")
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
