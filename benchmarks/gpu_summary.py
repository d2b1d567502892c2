#!/usr/bin/env python3
"""The summary of benchmarks/gpu_check.sh: from serve_bench.py's JSON of each shape, one table of
ours against the C++ server, written to OUT/table.md and printed; OUT/results.json gathers the
shapes' full results and OUT/report.md serve_bench's own tables.

    gpu_summary.py --out OUT --mode gpu 1b=bench-1b/serve_bench-X.json 8b=bench-8b/serve_bench-Y.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

OURS, CPP = "ours", "cpp"


def fmt(x: float | None, digits: int = 1) -> str:
    return "n/a" if x is None else f"{x:,.{digits}f}"


def ratio(a: float | None, b: float | None) -> str:
    return "n/a" if a is None or not b else f"{a / b:.2f}"


def server(doc: dict[str, Any], name: str) -> dict[str, Any] | None:
    for s in doc.get("servers", []):
        if s.get("name") == name:
            return s if isinstance(s, dict) else None
    return None


def rows_for(shape: str, doc: dict[str, Any]) -> list[list[str]]:
    ours, cpp = server(doc, OURS), server(doc, CPP)
    rows: list[list[str]] = []

    def add(label: str, a: float | None, b: float | None, digits: int = 1, lower_better: bool = False) -> None:
        rows.append(
            [shape, label, fmt(a, digits), fmt(b, digits), ratio(a, b) + (" (lower is better)" if lower_better else "")]
        )

    for name, s in ((OURS, ours), (CPP, cpp)):
        if s is None or s.get("error"):
            rows.append([shape, f"{name}: FAILED", str((s or {}).get("error", "no result"))[:120], "", ""])

    def get(s: dict[str, Any] | None, *path: str) -> float | None:
        cur: Any = s
        for p in path:
            if not isinstance(cur, dict):
                return None
            cur = cur.get(p)
        return float(cur) if isinstance(cur, (int, float)) else None

    add(
        "single-stream decode, tok/s",
        get(ours, "decode", "summary", "decode_tps_median"),
        get(cpp, "decode", "summary", "decode_tps_median"),
    )
    add(
        "single-stream decode, tok/s (server's own timings)",
        get(ours, "decode", "summary", "server_decode_tps_median"),
        get(cpp, "decode", "summary", "server_decode_tps_median"),
    )
    n_pp = get(ours, "prompt_processing", "summary", "prompt_tokens") or get(
        cpp, "prompt_processing", "summary", "prompt_tokens"
    )
    pp_label = f"prefill of a {fmt(n_pp, 0)}-token prompt"
    add(
        f"{pp_label}: TTFT ms",
        _ms(get(ours, "prompt_processing", "summary", "ttft_median_s")),
        _ms(get(cpp, "prompt_processing", "summary", "ttft_median_s")),
        0,
        lower_better=True,
    )
    add(
        f"{pp_label}: tok/s",
        get(ours, "prompt_processing", "summary", "client_pp_tps_median"),
        get(cpp, "prompt_processing", "summary", "client_pp_tps_median"),
        0,
    )
    levels: dict[int, dict[str, dict[str, Any]]] = {}
    for name, s in ((OURS, ours), (CPP, cpp)):
        for lv in (s or {}).get("concurrency", []):
            summ = lv.get("summary", {})
            levels.setdefault(int(summ.get("concurrency", 0)), {})[name] = summ
    for c in sorted(levels):
        a, b = levels[c].get(OURS, {}), levels[c].get(CPP, {})
        add(f"{c} streaming clients: aggregate tok/s", a.get("aggregate_tps"), b.get("aggregate_tps"))
        add(
            f"{c} streaming clients: TTFT p50 ms",
            _ms(a.get("ttft_p50_s")),
            _ms(b.get("ttft_p50_s")),
            0,
            lower_better=True,
        )
    add("start-up to healthy, s", get(ours, "startup_s"), get(cpp, "startup_s"), 1, lower_better=True)
    # One Python process drives every client: near 100% of a core, it, not the server, set the pace.
    add(
        "bench client's CPU while measuring, % of one core",
        _pct(get(ours, "cpu", "client_cpu_s"), get(ours, "cpu", "wall_s")),
        _pct(get(cpp, "cpu", "client_cpu_s"), get(cpp, "cpu", "wall_s")),
        0,
        lower_better=True,
    )
    fa, fb = get(ours, "failed_requests"), get(cpp, "failed_requests")
    rows.append([shape, "failed requests", fmt(fa, 0), fmt(fb, 0), ""])
    return rows


def _pct(cpu: float | None, wall: float | None) -> float | None:
    return None if cpu is None or not wall else 100.0 * cpu / wall


def _ms(x: Any) -> float | None:
    return float(x) * 1000.0 if isinstance(x, (int, float)) else None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--mode", default="gpu")
    ap.add_argument("--server-args", default="", help="the flags both servers ran with, for the table's caption")
    ap.add_argument("results", nargs="+", metavar="SHAPE=JSON")
    args = ap.parse_args(argv)

    docs: dict[str, dict[str, Any]] = {}
    for item in args.results:
        shape, _, path = item.partition("=")
        docs[shape] = json.loads(Path(path).read_text())

    header = ["shape", "metric", "ours", "C++", "ours / C++"]
    rows = [r for shape, doc in docs.items() for r in rows_for(shape, doc)]
    lines = [
        f"# GPU check ({args.mode}): llamaserve against the C++ llama-server, one llama.cpp build",
        "",
        f"both servers: `{args.server_args}`; greedy, ignore_eos, streaming /v1/completions",
        "",
        "| " + " | ".join(header) + " |",
        "|" + "|".join("---" for _ in header) + "|",
    ]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    warnings = [
        f"- {shape} {s.get('name')}: {w}"
        for shape, doc in docs.items()
        for s in doc.get("servers", [])
        for w in s.get("warnings", [])
    ]
    if warnings:
        lines += ["", "warnings:"] + warnings
    table = "\n".join(lines) + "\n"

    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "table.md").write_text(table)
    (args.out / "results.json").write_text(json.dumps(docs, indent=1))
    report = "\n\n".join(f"# shape {shape}\n\n{doc.get('report_markdown', '')}" for shape, doc in docs.items())
    (args.out / "report.md").write_text(report)
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
