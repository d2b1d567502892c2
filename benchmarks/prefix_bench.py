#!/usr/bin/env python3
"""Many sessions sharing one long system prompt, at once (issue 38's workload).

N sessions start together, each with the same ~2,300-token system prompt and a short question of
its own, streamed through `POST /completion` (temperature 0, `ignore_eos`, a fixed number of
tokens, so every server does the same work). Per server it reports:

* TTFT p50 and max of the N requests (client side, first text chunk);
* prompt tokens computed: the sum of each answer's `timings.prompt_n`, and the cached ones
  (`timings.cache_n`);
* KV cells in use once all N have answered: the server's own count where it has one (ours:
  `llamaserve:kv_cells_used` on /metrics), and for every server the sum, over the slots the
  answers name (`id_slot`), of the last answer's `tokens_cached` there: what each slot holds,
  a shared cell counted once per slot holding it.

The servers run one after another (each started, warmed up with one short request, measured,
stopped); the first is compared with each of the others. Like serve_bench.py it needs only
the standard library and httpx; run it with nothing else busy on the machine.

Example (issue 38: ours, ours without sharing, the C++ server; both servers' defaults, 32k)::

    python benchmarks/prefix_bench.py \\
      --name ours   --server "{python} -m llamaserve -m {model} --port {port} -t 2 -c 32768 --metrics" \\
      --name before --server "{python} -m llamaserve -m {model} --port {port} -t 2 -c 32768 --metrics \\
                              --no-prefix-sharing" \\
      --name cpp    --server "benchmarks/.cpp-server/llama-server -m {model} --port {port} -t 2 -tb 2 \\
                              -c 32768 --metrics"
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shlex
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serve_bench import (
    DEFAULT_RESULTS_DIR,
    ServerProcess,
    default_model,
    free_port,
    long_text,
    server_command,
    wait_healthy,
)

QUESTIONS = [
    "What is the main idea of the document above, in one sentence?",
    "Which places does the text mention? List three of them.",
    "Is the tone of the text formal or informal? Explain briefly.",
    "Suggest a short title for this document.",
    "Which season does the text talk about most?",
    "Name two things a reader could check after reading this.",
    "Summarize the second paragraph in plain words.",
    "What would be a good follow-up question to ask the author?",
]


def chatml(system: str, question: str) -> str:
    """SmolLM2's chat template, written out, so both servers get the same text."""
    return f"<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n"


@dataclass
class Answer:
    ttft: float | None = None
    prompt_n: int = 0
    cache_n: int = 0
    id_slot: int = -1
    tokens_cached: int = 0
    n_tokens: int = 0
    error: str = ""
    t_done: float = 0.0
    text: str = ""


@dataclass
class Result:
    name: str
    command: str
    answers: list[Answer] = field(default_factory=list)
    cells_reported: int | None = None
    error: str = ""

    @property
    def ttfts(self) -> list[float]:
        return [a.ttft for a in self.answers if a.ttft is not None]

    def cells_by_slot(self) -> int:
        last: dict[int, Answer] = {}
        for a in sorted(self.answers, key=lambda a: a.t_done):
            last[a.id_slot] = a
        return sum(a.tokens_cached for a in last.values())

    def summary(self) -> dict[str, Any]:
        t = self.ttfts
        return {
            "ttft_p50_s": statistics.median(t) if t else None,
            "ttft_max_s": max(t) if t else None,
            "prompt_computed": sum(a.prompt_n for a in self.answers),
            "prompt_cached": sum(a.cache_n for a in self.answers),
            "kv_cells_reported": self.cells_reported,
            "kv_cells_by_slot": self.cells_by_slot(),
            "errors": sum(1 for a in self.answers if a.error),
        }


async def ask(client: httpx.AsyncClient, url: str, prompt: str, n_predict: int) -> Answer:
    ans = Answer()
    body = {"prompt": prompt, "n_predict": n_predict, "temperature": 0, "stream": True, "ignore_eos": True}
    t0 = time.perf_counter()
    async with client.stream("POST", f"{url}/completion", json=body) as resp:
        if resp.status_code != 200:
            ans.error = f"HTTP {resp.status_code}: {(await resp.aread())[:200]!r}"
            return ans
        async for line in resp.aiter_lines():
            if not line.startswith("data:"):
                continue
            chunk = json.loads(line[5:].strip())
            if chunk.get("content") and ans.ttft is None:
                ans.ttft = time.perf_counter() - t0
            ans.text += chunk.get("content", "")
            if chunk.get("stop"):
                timings = chunk.get("timings") or {}
                ans.prompt_n = int(timings.get("prompt_n", 0))
                ans.cache_n = int(timings.get("cache_n", 0))
                ans.id_slot = int(chunk.get("id_slot", -1))
                ans.tokens_cached = int(chunk.get("tokens_cached", 0))
                ans.n_tokens = int(chunk.get("tokens_predicted", 0))
    ans.t_done = time.perf_counter()
    return ans


async def cells_from_metrics(client: httpx.AsyncClient, url: str) -> int | None:
    resp = await client.get(f"{url}/metrics")
    if resp.status_code != 200:
        return None
    for line in resp.text.splitlines():
        if line.startswith("llamaserve:kv_cells_used "):
            return int(float(line.split()[1]))
    return None


async def bench_one(name: str, spec: str, args: argparse.Namespace, system: str) -> Result:
    port = free_port()
    cmd = server_command(spec, args.model, port)
    res = Result(name, cmd)
    url = f"http://127.0.0.1:{port}"
    log_path = args.results_dir / f"prefix_bench-{int(time.time())}-{name}.log"
    proc = ServerProcess(shlex.split(cmd), log_path)
    print(f"[{name}] starting: {cmd}", file=sys.stderr, flush=True)
    proc.start()
    try:
        async with httpx.AsyncClient(timeout=httpx.Timeout(args.timeout)) as client:
            await wait_healthy(client, url, args.start_timeout, proc.alive, proc.exit_status)
            await ask(client, url, "Say hello.", 4)  # warm-up, shares nothing with the workload
            prompts = [chatml(system, QUESTIONS[i % len(QUESTIONS)]) for i in range(args.sessions)]
            res.answers = list(await asyncio.gather(*(ask(client, url, p, args.n_predict) for p in prompts)))
            res.cells_reported = await cells_from_metrics(client, url)
    except Exception as exc:  # report it and go on with the next server
        res.error = str(exc)
    finally:
        proc.stop(30.0)
    print(f"[{name}] {json.dumps(res.summary())}", file=sys.stderr, flush=True)
    return res


def fmt(x: float | int | None, digits: int = 2) -> str:
    if x is None:
        return "-"
    return f"{x:.{digits}f}" if isinstance(x, float) else str(x)


def report(results: list[Result], system_tokens: int | None) -> str:
    rows = [
        ("TTFT p50 (s)", "ttft_p50_s"),
        ("TTFT max (s)", "ttft_max_s"),
        ("prompt tokens computed", "prompt_computed"),
        ("prompt tokens cached", "prompt_cached"),
        ("KV cells in use (server's count)", "kv_cells_reported"),
        ("KV cells in use (slots' tokens_cached)", "kv_cells_by_slot"),
        ("failed requests", "errors"),
    ]
    sums = [r.summary() for r in results]
    head = "| | " + " | ".join(r.name for r in results) + " |"
    lines = [head, "|---" * (len(results) + 1) + "|"]
    for label, key in rows:
        lines.append(f"| {label} | " + " | ".join(fmt(s[key]) for s in sums) + " |")
    first = sums[0]
    for other, s in zip(results[1:], sums[1:]):
        lines.append("")
        lines.append(f"{results[0].name} / {other.name}:")
        for label, key in rows[:3]:
            if first[key] and s[key]:
                lines.append(f"- {label}: {first[key] / s[key]:.3f}")
        cells_first = first["kv_cells_reported"] or first["kv_cells_by_slot"]
        cells_other = s["kv_cells_reported"] or s["kv_cells_by_slot"]
        if cells_first and cells_other:
            lines.append(f"- KV cells in use: {cells_first / cells_other:.3f}")
    if system_tokens:
        lines.append("")
        lines.append(f"system prompt: {system_tokens} tokens")
    return "\n".join(lines)


async def main_async(args: argparse.Namespace) -> int:
    system = "You are a careful assistant. Answer questions about this document.\n\n" + long_text(args.words)
    results = [await bench_one(name, spec, args, system) for name, spec in zip(args.name, args.server)]
    first_ok = next((r for r in results if r.answers), None)
    system_tokens = None
    if first_ok is not None and first_ok.answers:
        # Every prompt is the system prompt plus a question; the cached part of the later ones
        # on a sharing server is about the system prompt's length.
        system_tokens = max(a.cache_n for a in first_ok.answers) or None
    text = report(results, system_tokens)
    print(text)
    args.results_dir.mkdir(parents=True, exist_ok=True)
    out = args.results_dir / f"prefix_bench-{int(time.time())}.json"
    out.write_text(
        json.dumps(
            [
                {
                    "name": r.name,
                    "command": r.command,
                    "error": r.error,
                    **r.summary(),
                    "answers": [a.__dict__ for a in r.answers],
                }
                for r in results
            ],
            indent=1,
        )
    )
    print(f"\nresults: {out}", file=sys.stderr)
    texts = [[a.text for a in r.answers] for r in results if r.answers and not r.error]
    if len(texts) > 1 and any(t != texts[0] for t in texts[1:]):
        print("note: the servers' answers differ", file=sys.stderr)
    return 1 if any(r.error or r.summary()["errors"] for r in results) else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--name", action="append", required=True)
    ap.add_argument("--server", action="append", required=True)
    ap.add_argument("--model", type=Path, default=default_model())
    ap.add_argument("--sessions", type=int, default=8)
    ap.add_argument("--words", type=int, default=2060, help="system prompt length in words (~2,300 tokens)")
    ap.add_argument("--n-predict", type=int, default=32)
    ap.add_argument("--timeout", type=float, default=600.0)
    ap.add_argument("--start-timeout", type=float, default=180.0)
    ap.add_argument("--results-dir", type=Path, default=DEFAULT_RESULTS_DIR)
    args = ap.parse_args()
    if len(args.name) != len(args.server):
        ap.error("give one --name per --server")
    if args.model is None:
        ap.error("no model: pass --model")
    return asyncio.run(main_async(args))


if __name__ == "__main__":
    sys.exit(main())
