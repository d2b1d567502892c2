"""The web UI's agent loop in Chromium, against a real llamaserve with --tools.

- On Qwen2.5-Coder: the user asks to read a file, the model calls read_file, the UI shows the
  call and its result, and the final answer quotes the file.
- With the model's turns scripted (Playwright answers the chat requests, the real server runs
  the tools): a tool that executes waits for the user's approval, "Allow for this chat"
  covers the next call, the command's output streams into the call's box, the next turn is
  sent the result, a denial is told to the model, and Stop ends the loop.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Page, Route, expect

from tests.models.packaged import qwen_coder

from .conftest import REPO, UIServer, free_port, http_get

SECRET = "The launch code is PURPLE-FALCON-42."


def start_tools_server(tmp: Path, model: Path, tools: str, root: Path) -> UIServer:
    port = free_port()
    log_path = tmp / f"server-{port}.log"
    log_file = open(log_path, "wb")  # noqa: SIM115 - handed to the child process
    cmd = [sys.executable, "-m", "llamaserve", "--port", str(port), "-m", str(model)]
    cmd += ["-c", "4096", "-np", "1", "--tools", tools]
    env = {**os.environ, "LLAMASERVE_TOOLS_ROOT": str(root)}
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=log_file, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 180
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}:\n{log_path.read_text()}")
        try:
            if http_get(url + "/health", timeout=2)[0] == 200:
                return UIServer(url, "real", proc, log_path, "", True)
        except OSError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError(f"server did not become ready:\n{log_path.read_text()}")


def stop(server: UIServer) -> None:
    server.process.terminate()
    try:
        server.process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        server.process.kill()


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("agent-root")
    (folder / "notes.txt").write_text(SECRET + "\n")
    return folder


def chat_bodies(page: Page) -> list[dict[str, Any]]:
    bodies: list[dict[str, Any]] = []
    page.on(
        "request",
        lambda r: (
            bodies.append(r.post_data_json) if r.method == "POST" and r.url.endswith("/v1/chat/completions") else None
        ),
    )
    return bodies


def ask(page: Page, text: str) -> None:
    page.get_by_test_id("message-input").fill(text)
    page.get_by_test_id("send-button").click()


# ------------------------------------------------------------------ a real model


@pytest.fixture(scope="module")
def qwen_server(tmp_path_factory: pytest.TempPathFactory, root: Path) -> Iterator[UIServer]:
    srv = start_tools_server(tmp_path_factory.mktemp("qwen-agent"), qwen_coder(), "read_file", root)
    yield srv
    stop(srv)


def greedy(route: Route) -> None:
    """Temperature 0 and a short budget: the run is reproducible and bounded."""
    body = route.request.post_data_json
    body.update(temperature=0, max_tokens=96)
    route.continue_(post_data=json.dumps(body))


def test_the_model_reads_a_file_and_answers_from_it(new_page: Callable[..., Page], qwen_server: UIServer) -> None:
    page = new_page(qwen_server, goto=False)
    page.context.route("**/v1/chat/completions", greedy)
    bodies = chat_bodies(page)
    page.goto("/")
    page.wait_for_selector('[data-testid="app"][data-ready="true"][data-tools="1"]')
    ask(page, "Read the file notes.txt and tell me what it says.")

    call = page.get_by_test_id("tool-call").filter(has_text="read_file").first
    expect(call).to_have_attribute("data-status", "done", timeout=300_000)
    expect(call.get_by_test_id("tool-result-text")).to_contain_text("PURPLE-FALCON-42")
    # read_file only reads: it ran without asking
    expect(page.get_by_test_id("tool-allow")).to_have_count(0)
    expect(page.locator('[data-testid="app"][data-generating="false"]')).to_have_count(1, timeout=300_000)

    answers = page.locator('[data-testid="message"][data-role="assistant"]')
    final = answers.last.get_by_test_id("message-content")
    expect(final).to_contain_text("PURPLE-FALCON-42")
    assert bodies[0]["tools"][0]["function"]["name"] == "read_file"
    # the turn after the call was sent the file's content as the tool's answer
    tool_messages = [m for m in bodies[1]["messages"] if m["role"] == "tool"]
    assert SECRET in tool_messages[0]["content"]


# ------------------------------------------------------------------ scripted turns, real tools


@pytest.fixture(scope="module")
def tools_server(tmp_path_factory: pytest.TempPathFactory, root: Path, model_path: str) -> Iterator[UIServer]:
    srv = start_tools_server(tmp_path_factory.mktemp("ui-tools"), Path(model_path), "all", root)
    yield srv
    stop(srv)


@pytest.fixture(scope="module")
def model_path() -> str:
    from llamaserve.config import embedded_default_model

    path = embedded_default_model()
    assert path, "the embedded SmolLM2 model is not installed"
    return path


def sse(*chunks: dict[str, Any]) -> str:
    return "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"


def tool_turn(call_id: str, name: str, args: dict[str, Any]) -> str:
    delta = {
        "tool_calls": [
            {"index": 0, "id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}
        ]
    }
    return sse(
        {"choices": [{"index": 0, "delta": delta, "finish_reason": None}]},
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
    )


def text_turn(text: str) -> str:
    return sse({"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": "stop"}]})


class Script:
    """Answers each chat request with the next scripted turn, keeping the bodies sent."""

    def __init__(self, page: Page, turns: list[str]) -> None:
        self.turns = list(turns)
        self.bodies: list[dict[str, Any]] = []
        page.context.route("**/v1/chat/completions", self.answer)

    def answer(self, route: Route) -> None:
        self.bodies.append(route.request.post_data_json)
        body = self.turns.pop(0) if self.turns else text_turn("(no more turns)")
        route.fulfill(status=200, body=body, headers={"Content-Type": "text/event-stream"})


def test_exec_asks_first_streams_and_allow_for_this_chat_covers_the_next(
    new_page: Callable[..., Page], tools_server: UIServer, root: Path
) -> None:
    page = new_page(tools_server, goto=False)
    command = "echo first; sleep 1; echo second"
    script = Script(
        page,
        [
            tool_turn("c1", "exec_shell_command", {"command": command}),
            tool_turn("c2", "write_file", {"path": "made.txt", "content": "by the agent"}),
            tool_turn("c3", "exec_shell_command", {"command": "cat made.txt"}),
            text_turn("All done."),
        ],
    )
    page.goto("/")
    page.wait_for_selector('[data-testid="app"][data-ready="true"][data-tools="7"]')
    ask(page, "run it")

    first = page.get_by_test_id("tool-call").nth(0)
    expect(first).to_have_attribute("data-status", "pending")
    page.get_by_test_id("tool-allow-chat").click()
    # the output shows while the command still runs
    expect(first.get_by_test_id("tool-result-text")).to_contain_text("first")
    expect(first).to_have_attribute("data-status", "running")
    expect(first).to_have_attribute("data-status", "done", timeout=15_000)
    expect(first.get_by_test_id("tool-result-text")).to_have_text("first\nsecond\n\n[exit code: 0]")

    # write_file is another tool: asked again; exec_shell_command is allowed for this chat now
    second = page.get_by_test_id("tool-call").nth(1)
    expect(second).to_have_attribute("data-status", "pending")
    second.get_by_test_id("tool-allow").click()
    third = page.get_by_test_id("tool-call").nth(2)
    expect(third).to_have_attribute("data-status", "done")
    expect(third.get_by_test_id("tool-result-text")).to_contain_text("by the agent")
    expect(page.locator('[data-testid="message"][data-role="assistant"]').last).to_contain_text("All done.")
    assert (root / "made.txt").read_text() == "by the agent"

    # each turn after a call carries the call and its result
    sent = script.bodies[1]["messages"]
    assert sent[-2]["tool_calls"][0]["function"]["name"] == "exec_shell_command"
    assert sent[-1] == {"role": "tool", "tool_call_id": "c1", "content": "first\nsecond\n\n[exit code: 0]"}
    assert {t["function"]["name"] for t in script.bodies[0]["tools"]} >= {"read_file", "exec_shell_command"}


def test_a_denied_call_is_told_to_the_model_and_stop_ends_the_loop(
    new_page: Callable[..., Page], tools_server: UIServer, root: Path
) -> None:
    page = new_page(tools_server, goto=False)
    script = Script(
        page,
        [
            tool_turn("d1", "write_file", {"path": "denied.txt", "content": "no"}),
            tool_turn("d2", "exec_shell_command", {"command": "sleep 30"}),
        ],
    )
    page.goto("/")
    page.wait_for_selector('[data-testid="app"][data-ready="true"][data-tools="7"]')
    ask(page, "try things")
    page.get_by_test_id("tool-deny").click()
    expect(page.get_by_test_id("tool-call").nth(0)).to_have_attribute("data-status", "denied")
    second = page.get_by_test_id("tool-call").nth(1)
    expect(second).to_have_attribute("data-status", "pending")
    assert script.bodies[1]["messages"][-1] == {
        "role": "tool",
        "tool_call_id": "d1",
        "content": "The user denied this tool call.",
    }
    page.get_by_test_id("stop-button").click()
    expect(second).to_have_attribute("data-status", "stopped")
    expect(page.locator('[data-testid="app"][data-generating="false"]')).to_have_count(1)
    assert len(script.bodies) == 2  # no turn after the stop
    assert not (root / "denied.txt").exists()


def test_tools_switched_off_in_settings_are_not_offered_or_run(
    new_page: Callable[..., Page], tools_server: UIServer
) -> None:
    page = new_page(tools_server, goto=False)
    script = Script(page, [tool_turn("s1", "exec_shell_command", {"command": "echo hi"}), text_turn("ok")])
    page.goto("/")
    page.wait_for_selector('[data-testid="app"][data-ready="true"][data-tools="7"]')
    page.get_by_test_id("settings-button").click()
    page.get_by_test_id("tool-toggle-exec_shell_command").uncheck()
    page.get_by_test_id("settings-save").click()
    ask(page, "run echo")
    call = page.get_by_test_id("tool-call").first
    expect(call).to_have_attribute("data-status", "error")
    expect(call.get_by_test_id("tool-result-text")).to_have_text(
        'Error: the user has switched the tool "exec_shell_command" off.'
    )
    expect(page.get_by_test_id("tool-allow")).to_have_count(0)
    offered = {t["function"]["name"] for t in script.bodies[0]["tools"]}
    assert "exec_shell_command" not in offered and "read_file" in offered and len(offered) == 6


def test_a_page_without_animation_frames_still_shows_output_and_the_finished_call(
    new_page: Callable[..., Page], tools_server: UIServer
) -> None:
    """A background tab gets no animation frames: the streamed output and the call's end must
    still reach the page (rendering falls back to a timer)."""
    page = new_page(tools_server, goto=False)
    page.add_init_script("window.requestAnimationFrame = () => 1; window.cancelAnimationFrame = () => {};")
    Script(page, [tool_turn("f1", "exec_shell_command", {"command": "echo framed"}), text_turn("Finished.")])
    page.goto("/")
    page.wait_for_selector('[data-testid="app"][data-ready="true"][data-tools="7"]')
    ask(page, "run it")
    page.get_by_test_id("tool-allow").click()
    call = page.get_by_test_id("tool-call").first
    expect(call).to_have_attribute("data-status", "done")
    expect(call.get_by_test_id("tool-result-text")).to_have_text("framed\n\n[exit code: 0]")
    expect(page.locator('[data-testid="message"][data-role="assistant"]').last).to_contain_text("Finished.")
