"""Both servers side by side on a model whose decode is cheap: the serving path with llama.cpp in it.

    .venv/bin/python benchmarks/cheap_serving.py [--levels 1,16,64,128,256] [--tokens 256] [--seconds 5]

The benchmark writes, with `gguf` (gpu_models.py's "cheap" shape), a model of one transformer
block of width 64 over SmolLM2's own vocabulary, tokenizer and chat template, random Q8_0
weights. It starts our server and the C++ `llama-server` (benchmarks/.cpp-server, built from
the same llama.cpp sources) on it with the same flags, `-np MAX -c 2048*MAX -kvu -t 2` where
MAX is the largest level, and both stay up. At each level of C streaming clients, one server
and then the other (the order alternates from level to level, so the machine's drift falls
on both), a client in another process (serving_ceiling.py's raw-socket client) opens C
streaming chat requests at once (greedy, `ignore_eos`, --tokens each), waits for all, and
opens them again until --seconds have passed. The table gives tokens/s, TTFT p50 (to the first
content text), and the CPU time per streamed token of each group of threads, from /proc:

- ours: the event loop (HTTP, SSE, the API), the scheduler thread split into its time inside
  `llama_decode` (measured in the server process) and the rest (batching, sampling,
  detokenizing), and llama.cpp's OpenMP workers;
- C++: its HTTP threads (cpp-httplib's pool), its main thread (the slot loop, sampling and
  the calling thread's share of `llama_decode`, which no thread name tells apart), and
  llama.cpp's OpenMP workers;
- the client process, to show that it is not the bottleneck.

Native threads are told apart by one look at their outermost stack frames with gdb, taken
between levels (an OpenMP worker starts in libgomp, an HTTP thread in httplib's pool). The
OpenMP worker spins between steps, so its CPU does not stand for the calling thread's share of
`llama_decode`; ours measures that share, C++'s stays inside its main thread's figure.

`--tokens 1024` is the issue's length (longer: each level's KV cache is then 4x larger, which
makes this model less cheap, and a run takes well over 6 minutes); the defaults keep a run near
3 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gpu_models
from serving_ceiling import ClientResult, _client, _free_port, _wait_healthy, thread_cpu

ROOT = Path(__file__).resolve().parents[1]
CPP_SERVER = ROOT / "benchmarks" / ".cpp-server" / "llama-server"
CTX_PER_SLOT = 2048  # the issue's -c 262144 for -np 128
WORKERS = "llama.cpp OpenMP workers"
GONE = "threads that ended"

# ---------------------------------------------------------------- our server, in its process


def _serve_ours(threads_file: Path, flags: list[str]) -> int:
    """Our server, writing {"names": {native_id: thread name}, "decode_cpu_s": x} every half second.

    x is the CPU time the scheduler thread spent inside llama_decode, measured around the
    ctypes call, so the scheduler's own work can be told from llama.cpp's.
    """
    sys.path.insert(0, str(ROOT))
    import llama_cpp.llama_cpp as C

    from llamaserve.cli import main

    decode_cpu = [0.0]
    real_decode = C.llama_decode

    def timed_decode(ctx: Any, batch: Any) -> int:
        t0 = time.thread_time()
        try:
            return int(real_decode(ctx, batch))
        finally:
            decode_cpu[0] += time.thread_time() - t0

    C.llama_decode = timed_decode

    def report() -> None:
        while True:
            names = {str(t.native_id): t.name for t in threading.enumerate() if t.native_id is not None}
            tmp = threads_file.with_suffix(".tmp")
            tmp.write_text(json.dumps({"names": names, "decode_cpu_s": decode_cpu[0]}))
            tmp.replace(threads_file)
            time.sleep(0.5)

    threading.Thread(target=report, name="bench-report", daemon=True).start()
    return int(main(flags) or 0)


# ---------------------------------------------------------------- the benchmark's side


def classify_native_threads(pid: int) -> dict[str, str]:
    """{tid: group} for the threads whose outermost frames show libgomp or cpp-httplib's pool."""
    try:
        out = subprocess.run(
            ["gdb", "-nx", "-batch", "-p", str(pid), "-ex", "thread apply all bt -8"],
            capture_output=True,
            text=True,
            timeout=120,
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return {}
    groups: dict[str, str] = {}
    for block in re.split(r"\n(?=Thread \d+ )", out):
        m = re.match(r"Thread \d+ \(Thread 0x[0-9a-f]+ \(LWP (\d+)\)", block)
        if not m:
            continue
        if "libgomp" in block or "gomp_thread_start" in block:
            groups[m.group(1)] = WORKERS
        elif "httplib" in block:
            groups[m.group(1)] = "HTTP threads (cpp-httplib)"
    return groups


def tid_cpu(pid: int) -> dict[str, float]:
    """CPU seconds of each live thread of `pid`, by thread id."""
    tids = os.listdir(f"/proc/{pid}/task")
    return thread_cpu(pid, {t: t for t in tids})


def process_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class Server:
    label: str
    proc: subprocess.Popen[bytes]
    port: int
    log: Path
    threads_file: Path | None  # ours only
    groups: dict[str, str] = field(default_factory=dict)  # tid -> thread group

    def report(self) -> dict[str, Any]:
        if self.threads_file is None:
            return {"names": {}, "decode_cpu_s": 0.0}
        return dict(json.loads(self.threads_file.read_text()))

    def group_of(self, tid: str, names: dict[str, str]) -> str:
        if self.threads_file is None and tid == str(self.proc.pid):
            return "main (slot loop, sampling, llama_decode's caller)"
        if tid in names:
            return {
                "MainThread": "event loop (HTTP, SSE, API)",
                "llamaserve-scheduler": "scheduler thread",
            }.get(names[tid], f"other ({names[tid]})")
        return self.groups.get(tid, "other native")

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def start_server(label: str, model: Path, flags: list[str], workdir: Path) -> Server:
    port = _free_port()
    log = workdir / f"{label}-{port}.log"
    threads_file: Path | None = None
    if label == "ours":
        threads_file = workdir / f"threads-{port}.json"
        cmd = [sys.executable, str(Path(__file__).resolve()), "--serve-ours", str(threads_file)]
    else:
        cmd = [str(CPP_SERVER)]
    cmd += ["-m", str(model), "--host", "127.0.0.1", "--port", str(port), *flags]
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    server = Server(label, proc, port, log, threads_file)
    try:
        _wait_healthy(f"http://127.0.0.1:{port}", proc, log)
        if threads_file:
            while not threads_file.exists():
                time.sleep(0.1)
    except BaseException:
        server.stop()
        raise
    return server


async def _rounds(port: int, streams: int, tokens: int, seconds: float) -> ClientResult:
    """Rounds of `streams` streams at once, until `seconds` have passed (at least one round)."""
    total = ClientResult(tokens=0, seconds=0.0, ttft_ms=[], cpu_s=0.0, failures=0)
    while total.seconds < seconds:
        r = await _client(port, streams, tokens)
        total.tokens += r.tokens
        total.seconds += r.seconds
        total.ttft_ms += r.ttft_ms
        total.cpu_s += r.cpu_s
        total.failures += r.failures
        if r.tokens == 0:
            break
    return total


def _client_process(port: int, streams: int, tokens: int, seconds: float, out: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    out.put(asyncio.run(_rounds(port, streams, tokens, seconds)))


def run_level(server: Server, streams: int, tokens: int, seconds: float) -> dict[str, Any]:
    pid = server.proc.pid
    before, before_total, before_report = tid_cpu(pid), process_cpu(pid), server.report()
    queue: multiprocessing.Queue = multiprocessing.Queue()  # type: ignore[type-arg]
    client = multiprocessing.Process(target=_client_process, args=(server.port, streams, tokens, seconds, queue))
    client.start()
    result: ClientResult = queue.get(timeout=900)
    client.join()
    after, after_total = tid_cpu(pid), process_cpu(pid)
    time.sleep(0.6)  # the report file is written every half second
    after_report = server.report()
    if server.proc.poll() is not None:
        raise SystemExit(f"{server.label} exited: {server.log.read_text()[-2000:]}")
    unknown = [t for t in after if t != str(pid) and t not in after_report["names"] and t not in server.groups]
    if unknown:
        server.groups.update(classify_native_threads(pid))
    n = max(result.tokens, 1)
    by_group: dict[str, float] = defaultdict(float)
    for tid, cpu in after.items():
        by_group[server.group_of(tid, after_report["names"])] += cpu - before.get(tid, 0.0)
    live = sum(after.values()) - sum(v for t, v in before.items() if t in after)
    by_group[GONE] += max(0.0, (after_total - before_total) - live)
    decode = after_report["decode_cpu_s"] - before_report["decode_cpu_s"]
    if server.threads_file:
        by_group["scheduler thread"] -= decode
        by_group["scheduler: inside llama_decode"] = decode
    us = {k: round(v / n * 1e6, 1) for k, v in sorted(by_group.items()) if v / n * 1e6 >= 0.05}
    llama = us.get(WORKERS, 0.0) + us.get("scheduler: inside llama_decode", 0.0)
    return {
        "server": server.label,
        "streams": streams,
        "tokens_per_stream": tokens,
        "streams_done": len(result.ttft_ms),
        "seconds": round(result.seconds, 2),
        "tok_s": round(result.tokens / result.seconds, 1),
        "ttft_p50_ms": round(statistics.median(result.ttft_ms), 1) if result.ttft_ms else None,
        "failed_streams": result.failures,
        "cpu_us_per_token": round(sum(us.values()), 1),
        "cpu_us_per_token_by_thread": us,
        "llama_cpp_us_per_token": round(llama, 1),
        "client_cpu_us_per_token": round(result.cpu_s / n * 1e6, 1),
    }


def write_cheap_model(path: Path) -> None:
    tok = gpu_models.read_tokenizer(gpu_models.smollm2_gguf())
    gpu_models.write_model("cheap", tok, path, seed=0)


def print_tables(rows: list[dict[str, Any]]) -> None:
    by = {(r["server"], r["streams"]): r for r in rows}
    levels = sorted({r["streams"] for r in rows})
    print("\n| streaming clients | ours, tok/s | C++, tok/s | ours / C++ | TTFT p50 ours / C++, ms | failed streams |")
    print("|---|---|---|---|---|---|")
    for c in levels:
        o, p = by[("ours", c)], by[("cpp", c)]
        print(
            f"| {c} | {o['tok_s']:,.0f} | {p['tok_s']:,.0f} | {o['tok_s'] / p['tok_s']:.2f} "
            f"| {o['ttft_p50_ms']:,.0f} / {p['ttft_p50_ms']:,.0f} | {o['failed_streams']} / {p['failed_streams']} |"
        )
    print("\nCPU per streamed token, µs, by thread group (client: the client process):")
    for label in ("ours", "cpp"):
        groups = sorted({g for c in levels for g in by[(label, c)]["cpu_us_per_token_by_thread"]})
        print(f"\n{label}:\n\n| clients | " + " | ".join(groups) + " | total | client |")
        print("|---" * (len(groups) + 3) + "|")
        for c in levels:
            r = by[(label, c)]
            cells = [str(r["cpu_us_per_token_by_thread"].get(g, 0.0)) for g in groups]
            print(f"| {c} | " + " | ".join(cells) + f" | {r['cpu_us_per_token']} | {r['client_cpu_us_per_token']} |")


def main() -> int:
    if len(sys.argv) > 2 and sys.argv[1] == "--serve-ours":
        return _serve_ours(Path(sys.argv[2]), sys.argv[3:])
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--levels", default="1,16,64,128,256", help="numbers of streaming clients, comma-separated")
    parser.add_argument("--tokens", type=int, default=256, help="tokens per stream (default 256)")
    parser.add_argument("--seconds", type=float, default=5.0, help="each level repeats its round until this long")
    parser.add_argument("--np", type=int, help="-np of both servers (default: the largest level)")
    parser.add_argument("--only", choices=("ours", "cpp"), help="run one server only")
    parser.add_argument("--model", type=Path, help="use this GGUF instead of writing the cheap model")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    parser.add_argument("extra", nargs="*", help="more flags for both servers (after --)")
    args = parser.parse_args()
    levels = [int(x) for x in args.levels.split(",")]
    n_parallel = args.np or max(levels)
    flags = ["-np", str(n_parallel), "-c", str(CTX_PER_SLOT * n_parallel), "-kvu", "-t", "2", *args.extra]
    labels = [args.only] if args.only else ["ours", "cpp"]
    if "cpp" in labels and not CPP_SERVER.exists():
        raise SystemExit(f"no {CPP_SERVER}: build it with benchmarks/build_cpp_server.sh")
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        model = args.model
        if model is None:
            model = workdir / "cheap.gguf"
            write_cheap_model(model)
        print(f"flags: {' '.join(flags)}", flush=True)
        servers: list[Server] = []
        try:
            for label in labels:
                servers.append(start_server(label, model, flags, workdir))
            for i, streams in enumerate(levels):
                for server in servers if i % 2 == 0 else servers[::-1]:
                    row = run_level(server, streams, args.tokens, args.seconds)
                    rows.append(row)
                    print(json.dumps(row), flush=True)
        finally:
            for server in servers:
                server.stop()
    if len(labels) == 2:
        print_tables(rows)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
