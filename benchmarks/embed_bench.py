"""Embeddings per second: llamaserve against the C++ llama-server, same model, same run.

Each server is started in turn with `--embedding`, warmed up, then asked for
the embeddings of N short sentences in batches (POST /v1/embeddings with a list
input), R times; the median rate is reported with the ratio of the first
server to the second.

    .venv/bin/python benchmarks/embed_bench.py \\
      --name ours --server "{python} -m llamaserve -m {model} --port {port} --embedding -np 8 -c 4096 -t 2 -ub 512" \\
      --name cpp  --server "benchmarks/.cpp-server/llama-server -m {model} --port {port} --embedding -np 8 -c 4096 -t 2 -ub 512 -nr"

The model defaults to all-MiniLM-L6-v2 converted by tests.models.bert (run from the repository root).
"""

from __future__ import annotations

import argparse
import asyncio
import shlex
import statistics
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serve_bench import ServerProcess, free_port, wait_healthy

SUBJECTS = [
    "The cat",
    "A pilot",
    "My neighbour",
    "The old river",
    "A tiny robot",
    "The orchestra",
    "Our team",
    "The storm",
]
VERBS = ["quietly watches", "paints", "forgets", "carries", "celebrates", "repairs", "follows", "describes"]
OBJECTS = [
    "the morning light",
    "a broken bicycle",
    "the city map",
    "an empty box",
    "the last train",
    "a red balloon",
    "the winter garden",
    "a secret letter",
]


def sentences(n: int) -> list[str]:
    out = []
    for i in range(n):
        out.append(f"{SUBJECTS[i % 8]} {VERBS[(i // 8) % 8]} {OBJECTS[(i // 64) % 8]} number {i}.")
    return out


async def measure(url: str, texts: list[str], batch: int, rounds: int) -> list[float]:
    rates = []
    async with httpx.AsyncClient(timeout=300) as client:
        await client.post(f"{url}/v1/embeddings", json={"input": texts[:batch]})  # warm-up
        for _ in range(rounds):
            t0 = time.perf_counter()
            for i in range(0, len(texts), batch):
                r = await client.post(f"{url}/v1/embeddings", json={"input": texts[i : i + batch]})
                r.raise_for_status()
                assert len(r.json()["data"]) == len(texts[i : i + batch])
            rates.append(len(texts) / (time.perf_counter() - t0))
    return rates


async def run(name: str, template: str, model: str, args: argparse.Namespace) -> float:
    port = free_port()
    argv = shlex.split(template.format(python=sys.executable, model=model, port=port))
    server = ServerProcess(argv, Path(args.results_dir) / f"embed-{name}.log")
    server.start()
    try:
        url = f"http://127.0.0.1:{port}"
        async with httpx.AsyncClient() as client:
            await wait_healthy(client, url, 120, server.alive, server.exit_status)
        rates = await measure(url, sentences(args.n), args.batch, args.rounds)
    finally:
        server.stop(10)
    rate = statistics.median(rates)
    print(f"{name}: {rate:.1f} embeddings/s (rounds: {', '.join(f'{r:.1f}' for r in rates)})")
    return rate


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--server", action="append", required=True)
    p.add_argument("--name", action="append", required=True)
    p.add_argument("--model", default=None)
    p.add_argument("--n", type=int, default=256)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--results-dir", default=str(Path(__file__).resolve().parent / "results"))
    args = p.parse_args()
    model = args.model
    if model is None:
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository root
        from tests.models.bert import cached_models

        model = str(cached_models()[0])
    rates = [asyncio.run(run(n, s, model, args)) for n, s in zip(args.name, args.server)]
    if len(rates) >= 2:
        print(f"ratio {args.name[0]} / {args.name[1]}: {rates[0] / rates[1]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
