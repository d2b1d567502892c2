"""`llama <command>`: the parts of llama.cpp's unified command line that llamaserve has.

llama.cpp's `llama` tool (app/llama.cpp in its sources) hands its first argument to
a subcommand. We offer `serve`, `download`, `version` and `help`, with llama.cpp's
aliases and `--version` / `--help` spellings. Its other tools answer exit code 1
with a line saying so, rather than doing something else under their name.

Everything past the dispatch is imported when a command runs: `llama help` loads
neither libllama nor httpx, and `llama serve` loads what `llama-server` does.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import NoReturn


@dataclass(frozen=True)
class Command:
    name: str
    aliases: tuple[str, ...]
    description: str
    run: Callable[[list[str]], int]


def _exit_code(exc: SystemExit) -> int:
    code = exc.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    sys.stderr.write(f"{code}\n")  # sys.exit("message") prints the message and means 1
    return 1


def _serve(args: list[str]) -> int:
    if "--ray" in args:
        from llamaserve.ray.cli import ray_main  # deferred: the optional Ray extra only with --ray

        return ray_main(args)
    from llamaserve.cli import main  # deferred: the server's flags and config only when serving

    try:
        return main(args)
    except SystemExit as exc:  # argparse's --help exits 0; a bad flag exits 1
        return _exit_code(exc)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        # llama.cpp's tools exit with 1 on a bad flag; argparse would use 2.
        self.print_usage(sys.stderr)
        sys.stderr.write(f"error: {message}\n")
        sys.exit(1)


def _download_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="llama download",
        description="Download a model into the cache (LLAMA_CACHE) and print its path.",
        epilog=(
            "examples: llama download -hf ggml-org/gemma-3-4b-it-qat-GGUF:Q4_K_M | "
            "llama download -hf ggml-org/models -hff model.gguf | "
            "llama download -mu https://example.com/model.gguf -m model.gguf"
        ),
    )
    parser.add_argument("-hf", "-hfr", "--hf-repo", dest="hf_repo", help="<user>/<model>[:quant]")
    parser.add_argument("-hff", "--hf-file", dest="hf_file", help="the file of the repo to take (default: by quant)")
    parser.add_argument("-hft", "--hf-token", dest="hf_token", help="Hugging Face token (env: HF_TOKEN)")
    parser.add_argument("-mu", "--model-url", dest="model_url", help="any GGUF over HTTP(S)")
    parser.add_argument("-m", "--model", dest="model", default="", help="store the file here instead of the cache")
    parser.add_argument("--offline", action="store_true", help="never touch the network; fail if not cached")
    return parser


def download_main(args: list[str], environ: Mapping[str, str] | None = None) -> int:
    """`llama download`: progress on stderr, the model's path (part 1 of a split) on stdout."""
    env = os.environ if environ is None else environ
    try:
        ns = _download_parser().parse_args(args)
    except SystemExit as exc:
        return _exit_code(exc)
    if not (ns.hf_repo or ns.model_url or ns.model):
        sys.stderr.write("error: no model source specified (use --hf-repo, --model-url or --model)\n")
        return 1

    from llamaserve.hub import DownloadError, ModelSource, fetch_model  # deferred: httpx only here

    source = ModelSource(
        hf_repo=ns.hf_repo,
        hf_file=ns.hf_file,
        hf_token=ns.hf_token or env.get("HF_TOKEN") or None,
        model_url=ns.model_url,
        model=ns.model,
        offline=ns.offline,
    )
    try:
        path = fetch_model(source, env)
    except DownloadError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 1
    except KeyboardInterrupt:  # the .part file stays for the next run to resume
        sys.stderr.write("interrupted\n")
        return 130
    if not os.path.isfile(path):  # only `-m PATH` alone gets here without a download
        sys.stderr.write(f"error: model file does not exist: {path}\n")
        return 1
    sys.stdout.write(f"{path}\n")
    return 0


def _our_version() -> str:
    try:
        return importlib.metadata.version("llamaserve")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown (not installed)"


def version_main(args: list[str]) -> int:
    """`llama version`: ours, the bindings', and what llama.cpp says of its build."""
    sys.stdout.write(f"llamaserve {_our_version()}\n")
    try:
        from llamaserve.llama.buildinfo import build_info  # deferred: loads libllama

        info = build_info()
    except (ImportError, OSError) as exc:  # no llama-cpp-python, or a libllama that will not load
        sys.stdout.flush()
        sys.stderr.write(f"error: cannot load llama.cpp through llama-cpp-python: {exc}\n")
        return 1
    sys.stdout.write(
        f"llama-cpp-python {info.bindings_version}\n"
        f"llama.cpp {info.llama_version} (llama-cpp-python records no llama.cpp commit)\n"
        f"GPU offload: {'yes' if info.gpu_offload else 'no'}\n"
        f"system: {info.system_info}\n"
    )
    return 0


def help_main(args: list[str]) -> int:
    lines = ["usage: llama <command> [options]", "", "commands:"]
    for cmd in COMMANDS:
        alias = f" (alias: {', '.join(cmd.aliases)})" if cmd.aliases else ""
        lines.append(f"  {cmd.name:<10} {cmd.description}{alias}")
    lines += [
        "",
        f"llama.cpp's {', '.join(NOT_OURS)} are not part of llamaserve.",
        "Run 'llama serve --help' for the server's flags, 'llama download --help' for the download's.",
    ]
    sys.stdout.write("\n".join(lines) + "\n")
    return 0


COMMANDS: tuple[Command, ...] = (
    Command("serve", ("server",), "HTTP API server: llama-server's flags and LLAMA_ARG_* variables", _serve),
    Command("download", ("get",), "Download a model into the cache and print its path", download_main),
    Command("version", (), "Show version and build info", version_main),
    Command("help", (), "Show available commands", help_main),
)

# The rest of llama.cpp's `llama` subcommands (with their aliases), and the older standalone
# tools people type as subcommands: named, so the answer says llamaserve lacks them rather
# than that they do not exist.
NOT_OURS: tuple[str, ...] = (
    "cli",
    "update",
    "completion",
    "bench",
    "batched-bench",
    "fit-params",
    "quantize",
    "perplexity",
    "licenses",
    "run",
    "embedding",
    "tokenize",
)
_NOT_OURS_ALIASES = {"client": "cli", "complete": "completion", "credits": "licenses"}


def _find(arg: str) -> Command | None:
    # `--version` and `--help` are llama.cpp's flag spellings of those two commands; `-h` is everyone's.
    name = {"--version": "version", "--help": "help", "-h": "help"}.get(arg, arg)
    for cmd in COMMANDS:
        if name == cmd.name or name in cmd.aliases:
            return cmd
    return None


def llama_main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `llama`: dispatch the first argument to a subcommand; no argument means help."""
    args = list(sys.argv[1:] if argv is None else argv)
    first = args[0] if args else "help"
    cmd = _find(first)
    if cmd is not None:
        return cmd.run(args[1:])
    offered = ", ".join(c.name for c in COMMANDS)
    known = _NOT_OURS_ALIASES.get(first, first)
    if known in NOT_OURS:
        sys.stderr.write(f"error: `llama {first}` is not part of llamaserve; it offers: {offered}\n")
    else:
        sys.stderr.write(f"error: unknown command '{first}' (llamaserve offers: {offered})\n")
    return 1


def entry_llama() -> None:
    sys.exit(llama_main())


if __name__ == "__main__":  # python -m llamaserve.unified_cli, where the `llama` script is not installed
    entry_llama()
