"""`llama <command>` (llamaserve/unified_cli.py): each subcommand's exit code and output.

`llama download` runs against the stand-in hub of the download tests, in this
process, with small fake GGUF files: no model is loaded here.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from llamaserve.unified_cli import COMMANDS, NOT_OURS, llama_main
from tests.server.standin_hub import StandInHub

ROOT = Path(__file__).resolve().parents[2]
REPO_ID = "fake/Tiny-GGUF"
Q4 = b"GGUF q4 weights"
Q8 = b"GGUF q8 weights, a little longer"


@pytest.fixture()
def hub() -> Iterator[StandInHub]:
    h = StandInHub(
        {
            REPO_ID: {
                "README.md": b"# tiny",
                "mmproj-Tiny-f16.gguf": b"GGUF projector",
                "Tiny-Q4_K_M.gguf": Q4,
                "Tiny-Q8_0.gguf": Q8,
            }
        },
        files={"tiny.gguf": Q8},
    )
    h.start()
    yield h
    h.stop()


@pytest.fixture()
def cache(tmp_path: Path, hub: StandInHub, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("LLAMA_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    monkeypatch.delenv("MODEL_ENDPOINT", raising=False)  # it would win over HF_ENDPOINT
    monkeypatch.delenv("HF_TOKEN", raising=False)
    return tmp_path / "cache"


def _run_python(code: str, *blocked: str) -> subprocess.CompletedProcess[str]:
    """`code` in a fresh interpreter where importing each of `blocked` fails."""
    guard = "".join(f"import sys; sys.modules[{name!r}] = None\n" for name in blocked)
    return subprocess.run(
        [sys.executable, "-c", guard + code], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
    )


# ------------------------------------------------------------------ help and dispatch
@pytest.mark.parametrize("argv", [[], ["help"], ["--help"], ["-h"]])
def test_help_lists_the_subcommands(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert llama_main(argv) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: llama <command>")
    for cmd in COMMANDS:
        assert f"  {cmd.name} " in out
    assert "bench" in out and "not part of llamaserve" in out


@pytest.mark.parametrize(
    "name", ["run", "bench", "quantize", "perplexity", "cli", "client", "embedding", "tokenize", "completion"]
)
def test_llama_cpp_tools_we_lack_exit_1_naming_what_we_offer(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert llama_main([name, "-m", "x.gguf"]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert f"`llama {name}` is not part of llamaserve" in captured.err
    assert "offers: serve, download, version, help" in captured.err


def test_every_llama_cpp_subcommand_is_either_ours_or_named() -> None:
    # app/llama.cpp's table in the llama-cpp-python 0.3.36 sdist.
    upstream = {"serve", "cli", "update", "download", "completion", "bench", "batched-bench"}
    upstream |= {"fit-params", "quantize", "perplexity", "version", "licenses", "help"}
    ours = {c.name for c in COMMANDS}
    assert upstream <= ours | set(NOT_OURS)
    assert not ours & set(NOT_OURS)


def test_an_unknown_command_exits_1(capsys: pytest.CaptureFixture[str]) -> None:
    assert llama_main(["frobnicate"]) == 1
    assert "unknown command 'frobnicate'" in capsys.readouterr().err


def test_help_needs_neither_libllama_nor_httpx() -> None:
    run = _run_python(
        "from llamaserve.unified_cli import llama_main; raise SystemExit(llama_main(['help']))", "llama_cpp", "httpx"
    )
    assert run.returncode == 0, run.stderr
    assert "download" in run.stdout


# ------------------------------------------------------------------ serve
def test_serve_help_is_the_servers(capsys: pytest.CaptureFixture[str]) -> None:
    assert llama_main(["serve", "--help"]) == 0
    assert "--ctx-size" in capsys.readouterr().out


@pytest.mark.parametrize("name", ["serve", "server"])
def test_serve_reports_a_bad_flag_and_a_missing_model_with_exit_1(
    name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert llama_main([name, "--no-such-flag"]) == 1
    assert "--no-such-flag" in capsys.readouterr().err
    assert llama_main([name, "-m", "/nonexistent.gguf"]) == 1
    assert "model file not found" in capsys.readouterr().err


# ------------------------------------------------------------------ version
@pytest.mark.parametrize("argv", [["version"], ["--version"]])
def test_version_shows_ours_the_bindings_and_llama_cpp(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    import llama_cpp

    assert llama_main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("llamaserve ") and "unknown" not in lines[0]
    assert lines[1] == f"llama-cpp-python {llama_cpp.__version__}"
    assert lines[2].startswith("llama.cpp ") and len(lines[2].split()[1]) >= 3
    assert lines[3] in ("GPU offload: yes", "GPU offload: no")
    assert lines[4].startswith("system: ") and "CPU" in lines[4]


def test_version_without_a_loadable_libllama_exits_1_after_our_version() -> None:
    run = _run_python(
        "from llamaserve.unified_cli import llama_main; raise SystemExit(llama_main(['version']))", "llama_cpp"
    )
    assert run.returncode == 1
    assert run.stdout.startswith("llamaserve ")
    assert "cannot load llama.cpp" in run.stderr


# ------------------------------------------------------------------ download
def test_download_fetches_the_default_quant_and_prints_its_path(
    cache: Path, hub: StandInHub, capsys: pytest.CaptureFixture[str]
) -> None:
    assert llama_main(["download", "-hf", REPO_ID]) == 0
    captured = capsys.readouterr()
    path = Path(captured.out.strip())
    assert path == cache / "fake_Tiny-GGUF_Tiny-Q4_K_M.gguf"
    assert path.read_bytes() == Q4
    assert "downloading" in captured.err and "100.0%" in captured.err  # the progress lines
    assert hub.requests_for("mmproj") == []


def test_download_then_offline_is_served_from_the_cache(
    cache: Path, hub: StandInHub, capsys: pytest.CaptureFixture[str]
) -> None:
    assert llama_main(["get", "-hf", f"{REPO_ID}:Q8_0"]) == 0
    first = capsys.readouterr().out.strip()
    asked = len(hub.seen)
    assert llama_main(["download", "-hf", f"{REPO_ID}:Q8_0", "--offline"]) == 0
    assert capsys.readouterr().out.strip() == first
    assert len(hub.seen) == asked  # --offline never asked the hub
    assert Path(first).read_bytes() == Q8


def test_offline_with_nothing_cached_exits_1(cache: Path, hub: StandInHub, capsys: pytest.CaptureFixture[str]) -> None:
    assert llama_main(["download", "-hf", REPO_ID, "--offline"]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "--offline" in captured.err and "not in the cache" in captured.err
    assert hub.seen == []


def test_download_a_named_file_with_a_token(
    cache: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    hub = StandInHub({REPO_ID: {"Tiny-Q8_0.gguf": Q8}}, token="secret")
    monkeypatch.setenv("HF_ENDPOINT", hub.start())
    try:
        assert llama_main(["download", "-hf", REPO_ID, "-hff", "Tiny-Q8_0.gguf"]) == 1
        assert "pass --hf-token" in capsys.readouterr().err.splitlines()[-1]
        assert llama_main(["download", "-hf", REPO_ID, "-hff", "Tiny-Q8_0.gguf", "-hft", "secret"]) == 0
        assert Path(capsys.readouterr().out.strip()).read_bytes() == Q8
        assert hub.seen[-1].headers.get("authorization") == "Bearer secret"
        # HF_TOKEN stands in for -hft, as for llama-server.
        monkeypatch.setenv("HF_TOKEN", "secret")
        assert llama_main(["download", "-hf", REPO_ID, "-hff", "Tiny-Q8_0.gguf", "-m", str(cache / "again.gguf")]) == 0
        assert (cache / "again.gguf").read_bytes() == Q8
    finally:
        hub.stop()


def test_download_by_url_into_a_chosen_path(
    tmp_path: Path, cache: Path, hub: StandInHub, capsys: pytest.CaptureFixture[str]
) -> None:
    dest = tmp_path / "models" / "tiny.gguf"
    assert llama_main(["download", "-mu", f"{hub.url}/files/tiny.gguf", "-m", str(dest)]) == 0
    assert capsys.readouterr().out.strip() == str(dest)
    assert dest.read_bytes() == Q8


def test_download_failures_are_one_line_and_exit_1(cache: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert llama_main(["download"]) == 1
    assert "no model source" in capsys.readouterr().err
    assert llama_main(["download", "-hf", "fake/no-such-repo"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err
    assert llama_main(["download", "--no-such-flag"]) == 1
    assert "--no-such-flag" in capsys.readouterr().err
