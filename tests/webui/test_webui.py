"""Browser tests of the chat UI (llamaserve/webui/static), driven by Playwright + Chromium.

Against the fake API by default; ``WEBUI_SERVER=real`` runs the same tests against
``python -m llamaserve`` (see conftest.py). Screenshots go to artifacts/webui/.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from playwright.sync_api import Page, Request, Route, expect

from .conftest import UIServer, http_get, open_ui

CHAT_PATH = "/v1/chat/completions"
# The real model needs longer than the fake's canned answers.
DONE_TIMEOUT_MS = 120_000
TIMINGS_RE = re.compile(r"^prompt (\d+(\.\d)?|—) t/s · gen (\d+(\.\d)?|—) t/s · cached \d+")


# ------------------------------------------------------------------ helpers


class ChatRequests:
    """Records the chat requests a page sends."""

    def __init__(self, page: Page) -> None:
        self.requests: list[Request] = []
        page.on("request", self._on_request)

    def _on_request(self, req: Request) -> None:
        if req.method == "POST" and req.url.endswith(CHAT_PATH):
            self.requests.append(req)

    @property
    def bodies(self) -> list[dict[str, Any]]:
        return [r.post_data_json for r in self.requests]


def send(page: Page, text: str) -> None:
    box = page.get_by_test_id("message-input")
    box.fill(text)
    box.press("Enter")


def wait_done(page: Page, timeout: float = DONE_TIMEOUT_MS) -> None:
    page.wait_for_selector('[data-testid="app"][data-generating="false"]', timeout=timeout)


def assistant(page: Page, nth: int = -1) -> Any:
    loc = page.locator('[data-testid="message"][data-role="assistant"]')
    return loc.last if nth == -1 else loc.nth(nth)


def user_messages(page: Page) -> Any:
    return page.locator('[data-testid="message"][data-role="user"]')


def sse(chunks: list[dict[str, Any]]) -> str:
    return "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"


def lengthen_answers(page: Page) -> None:
    """Makes every answer long (real model: no EOS, many tokens; the fake: "long" in the prompt)."""

    def handler(route: Route) -> None:
        body = route.request.post_data_json
        body.update({"max_tokens": 1500, "ignore_eos": True})
        route.continue_(post_data=json.dumps(body))

    page.route(f"**{CHAT_PATH}", handler)


def no_slot_busy(server: UIServer, timeout: float = 10.0) -> bool:
    deadline = time.time() + timeout
    while time.time() < deadline:
        slots = server.get_json("/slots")
        if not any(s.get("is_processing") for s in slots):
            return True
        time.sleep(0.1)
    return False


# ------------------------------------------------------------------ streaming


def test_answer_streams_token_by_token(page: Page, ui_server: UIServer) -> None:
    chats = ChatRequests(page)
    expect(page.get_by_test_id("model-name")).not_to_have_text("…")
    # Record the answer's length every time the DOM changes, from inside the page.
    page.evaluate("""() => {
        window.__lengths = [];
        new MutationObserver(() => {
            const c = document.querySelector('[data-role="assistant"] [data-testid="message-content"]');
            if (c && !c.querySelector('.dots')) window.__lengths.push(c.textContent.length);
        }).observe(document.getElementById('messages'), {subtree: true, childList: true, characterData: true});
    }""")
    send(page, "Write three short sentences about llamas.")
    expect(page.get_by_test_id("stop-button")).to_be_visible()
    expect(page.get_by_test_id("send-button")).to_be_hidden()
    wait_done(page)

    lengths = [n for n in page.evaluate("window.__lengths") if n > 0]
    distinct = sorted(set(lengths))
    assert len(distinct) >= 2, f"the answer did not grow in steps: {lengths}"
    # (Markdown may shorten the text for a moment, e.g. when "**" turns into bold.)
    assert lengths[-1] > lengths[0], f"the answer did not grow: {lengths}"

    expect(user_messages(page)).to_have_count(1)
    expect(user_messages(page).first).to_contain_text("Write three short sentences about llamas.")
    final = assistant(page).get_by_test_id("message-content").inner_text()
    assert final.strip()
    expect(assistant(page).get_by_test_id("message-timings")).to_have_text(TIMINGS_RE)
    expect(page.get_by_test_id("stop-button")).to_be_hidden()
    expect(page.get_by_test_id("message-input")).to_be_focused()

    body = chats.bodies[0]
    assert body["stream"] is True
    assert body["messages"][-1] == {"role": "user", "content": "Write three short sentences about llamas."}


def test_stop_aborts_and_frees_the_slot(page: Page, ui_server: UIServer) -> None:
    lengthen_answers(page)
    send(page, "Tell me a long story about a llama who runs a server.")
    content = assistant(page).get_by_test_id("message-content")
    page.wait_for_function(
        """() => {
            const c = document.querySelector('[data-role="assistant"] [data-testid="message-content"]');
            return c && !c.querySelector('.dots') && c.textContent.length > 40;
        }""",
        timeout=60_000,
    )
    page.get_by_test_id("stop-button").click()
    wait_done(page, 10_000)
    expect(page.get_by_test_id("send-button")).to_be_visible()
    expect(assistant(page).get_by_test_id("message-timings")).to_contain_text("stopped")
    stopped_text = content.inner_text()
    assert len(stopped_text.strip()) > 20
    # The server saw the disconnect: no slot is still generating.
    assert no_slot_busy(ui_server), f"a slot is still processing: {ui_server.get_json('/slots')}"
    time.sleep(0.4)
    assert content.inner_text() == stopped_text, "text kept arriving after Stop"
    # The partial answer is kept.
    page.reload()
    page.wait_for_selector('[data-testid="app"][data-ready="true"]')
    expect(assistant(page).get_by_test_id("message-timings")).to_contain_text("stopped")
    assert content.inner_text() == stopped_text


def test_escape_stops_generation_from_the_keyboard(page: Page, ui_server: UIServer) -> None:
    lengthen_answers(page)
    box = page.get_by_test_id("message-input")
    expect(box).to_be_focused()
    page.keyboard.type("Another long story, please.")
    page.keyboard.press("Enter")
    page.wait_for_function(
        """() => (document.querySelector('[data-role="assistant"] [data-testid="message-content"]')
                  ?.textContent.length || 0) > 10""",
        timeout=60_000,
    )
    page.keyboard.press("Escape")
    wait_done(page, 10_000)
    expect(assistant(page).get_by_test_id("message-timings")).to_contain_text("stopped")
    assert no_slot_busy(ui_server)


# ------------------------------------------------------------------ conversations


def test_conversations_survive_a_reload(page: Page) -> None:
    send(page, "Remember this conversation")
    wait_done(page)
    first_answer = assistant(page).get_by_test_id("message-content").inner_text()
    expect(page.get_by_test_id("conversation-item")).to_have_count(1)

    page.get_by_test_id("new-chat").click()
    expect(page.get_by_test_id("empty-state")).to_be_visible()
    send(page, "And a second one")
    wait_done(page)
    expect(page.get_by_test_id("conversation-item")).to_have_count(2)

    page.reload()
    page.wait_for_selector('[data-testid="app"][data-ready="true"]')
    items = page.get_by_test_id("conversation-item")
    expect(items).to_have_count(2)
    # The open conversation is restored, and listed first (newest).
    expect(user_messages(page)).to_have_text(["And a second one"])
    expect(items.first.locator('[aria-current="page"]')).to_have_count(1)

    items.filter(has_text="Remember this conversation").locator("button.conv-open").click()
    expect(user_messages(page)).to_have_text(["Remember this conversation"])
    assert assistant(page).get_by_test_id("message-content").inner_text() == first_answer


def test_regenerate_and_edit(page: Page) -> None:
    chats = ChatRequests(page)
    send(page, "Hello")
    wait_done(page)
    page.get_by_test_id("regenerate").click()
    wait_done(page)
    assert len(chats.bodies) == 2
    assert chats.bodies[1]["messages"] == chats.bodies[0]["messages"]
    expect(page.get_by_test_id("message")).to_have_count(2)

    page.get_by_test_id("edit-message").click()
    edit = page.get_by_test_id("edit-input")
    expect(edit).to_be_focused()
    edit.fill("Say hello in French")
    edit.press("Enter")
    wait_done(page)
    assert len(chats.bodies) == 3
    assert chats.bodies[2]["messages"][-1] == {"role": "user", "content": "Say hello in French"}
    assert [m["role"] for m in chats.bodies[2]["messages"] if m["role"] != "system"] == ["user"]
    expect(user_messages(page)).to_have_text(["Say hello in French"])
    expect(page.get_by_test_id("message")).to_have_count(2)


def test_export_delete_and_import(page: Page, tmp_path: Path) -> None:
    send(page, "Export me")
    wait_done(page)
    with page.expect_download() as info:
        page.get_by_test_id("export-button").click()
    exported = tmp_path / "chats.json"
    info.value.save_as(exported)
    data = json.loads(exported.read_text())
    assert data["format"] == "llamaserve-webui"
    assert len(data["conversations"]) == 1
    assert [m["role"] for m in data["conversations"][0]["messages"]] == ["user", "assistant"]

    page.get_by_test_id("conversation-item").first.hover()
    page.get_by_test_id("conversation-delete").first.click()
    expect(page.get_by_test_id("conversation-item")).to_have_count(0)
    expect(page.get_by_test_id("empty-state")).to_be_visible()

    page.get_by_test_id("import-file").set_input_files(str(exported))
    expect(page.get_by_test_id("conversation-item")).to_have_count(1)
    page.get_by_test_id("conversation-item").first.locator("button.conv-open").click()
    expect(user_messages(page)).to_have_text(["Export me"])


def test_deleting_a_streaming_conversation_stops_it_for_good(page: Page, ui_server: UIServer) -> None:
    lengthen_answers(page)
    send(page, "A long answer that I will delete")
    page.wait_for_function(
        """() => (document.querySelector('[data-role="assistant"] [data-testid="message-content"]')
                  ?.textContent.length || 0) > 10""",
        timeout=60_000,
    )
    page.get_by_test_id("conversation-delete").first.click()
    wait_done(page, 10_000)
    expect(page.get_by_test_id("conversation-item")).to_have_count(0)
    assert no_slot_busy(ui_server)
    page.reload()
    page.wait_for_selector('[data-testid="app"][data-ready="true"]')
    expect(page.get_by_test_id("conversation-item")).to_have_count(0)
    expect(page.get_by_test_id("empty-state")).to_be_visible()


def test_import_rejects_a_bad_file(page: Page, tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"hello": "world"}')
    page.get_by_test_id("import-file").set_input_files(str(bad))
    expect(page.get_by_role("alert").filter(has_text="Import failed")).to_be_visible()
    expect(page.get_by_test_id("conversation-item")).to_have_count(0)


# ------------------------------------------------------------------ rendering


def test_reasoning_tool_calls_markdown_and_timings(page: Page) -> None:
    chunks = [
        {"choices": [{"index": 0, "delta": {"role": "assistant", "content": None}}]},
        {"choices": [{"index": 0, "delta": {"reasoning_content": "Let me think. "}}]},
        {"choices": [{"index": 0, "delta": {"reasoning_content": "The user wants math."}}]},
        {"choices": [{"index": 0, "delta": {"content": "The answer is $x^2$ and "}}]},
        {"choices": [{"index": 0, "delta": {"content": '<img src=x onerror="window.__pwned=1">.\n\n'}}]},
        {"choices": [{"index": 0, "delta": {"content": "```python\nprint('hi')\n```\n\n[bad](javascript:alert(1))"}}]},
        {
            "choices": [
                {
                    "index": 0,
                    "delta": {
                        "tool_calls": [
                            {
                                "index": 0,
                                "id": "c1",
                                "type": "function",
                                "function": {"name": "get_time", "arguments": '{"tz":'},
                            }
                        ]
                    },
                }
            ]
        },
        {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": '"UTC"}'}}]}}]},
        {
            "choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}],
            "timings": {
                "cache_n": 10,
                "prompt_n": 50,
                "prompt_ms": 405.2,
                "prompt_per_second": 123.4,
                "predicted_n": 20,
                "predicted_ms": 444.4,
                "predicted_per_second": 45.0,
            },
        },
    ]
    page.route(
        f"**{CHAT_PATH}",
        lambda route: route.fulfill(status=200, headers={"Content-Type": "text/event-stream"}, body=sse(chunks)),
    )
    send(page, "What time is it?")
    wait_done(page)
    msg = assistant(page)
    thinking = msg.get_by_test_id("message-reasoning")
    expect(thinking).to_be_visible()
    expect(thinking.locator("summary")).to_contain_text("Thought")
    thinking.locator("summary").click()
    expect(thinking).to_contain_text("The user wants math.")
    content = msg.get_by_test_id("message-content")
    expect(content).not_to_contain_text("The user wants math.")
    expect(content.locator(".katex")).to_have_count(1)
    expect(content.locator("code.hljs")).to_contain_text("print")
    expect(content.locator("img")).to_have_count(0)
    expect(content).to_contain_text("<img src=x")
    expect(content.locator("a")).to_have_count(0)
    assert page.evaluate("window.__pwned") is None
    tool = msg.get_by_test_id("tool-call")
    expect(tool).to_have_count(1)
    expect(tool).to_contain_text("get_time")
    expect(tool).to_contain_text('"tz": "UTC"')
    expect(msg.get_by_test_id("message-timings")).to_have_text("prompt 123 t/s · gen 45 t/s · cached 10")


def test_server_error_is_shown(page: Page) -> None:
    page.route(
        f"**{CHAT_PATH}",
        lambda route: route.fulfill(
            status=400,
            headers={"Content-Type": "application/json"},
            body=json.dumps(
                {
                    "error": {
                        "code": 400,
                        "message": "the request exceeds the available context size",
                        "type": "exceed_context_size_error",
                    }
                }
            ),
        ),
    )
    send(page, "Too long")
    wait_done(page)
    expect(assistant(page).get_by_test_id("message-error")).to_have_text(
        "the request exceeds the available context size"
    )
    expect(page.get_by_test_id("regenerate")).to_be_enabled()


# ------------------------------------------------------------------ settings


def test_settings_are_sent_and_saved(page: Page) -> None:
    chats = ChatRequests(page)
    page.get_by_test_id("settings-button").click()
    dialog = page.get_by_test_id("settings-dialog")
    expect(dialog).to_be_visible()
    expect(page.get_by_label("System prompt")).to_be_focused()
    page.get_by_test_id("settings-system-prompt").fill("Answer in one sentence.")
    page.get_by_test_id("settings-temperature").fill("-1")
    page.get_by_test_id("settings-save").click()
    expect(dialog).to_be_visible()  # rejected: temperature must be >= 0
    expect(dialog.get_by_role("alert")).to_contain_text("Temperature")
    page.get_by_test_id("settings-temperature").fill("0.3")
    page.get_by_test_id("settings-top-k").fill("7")
    page.get_by_test_id("settings-seed").fill("42")
    page.get_by_test_id("settings-max-tokens").fill("64")
    page.get_by_test_id("settings-save").click()
    expect(dialog).to_be_hidden()

    send(page, "Hi")
    wait_done(page)
    body = chats.bodies[0]
    assert body["temperature"] == 0.3
    assert body["top_k"] == 7
    assert body["seed"] == 42
    assert body["max_tokens"] == 64
    assert "top_p" not in body and "min_p" not in body  # blank: the server's default applies
    assert body["messages"][0] == {"role": "system", "content": "Answer in one sentence."}

    page.reload()
    page.wait_for_selector('[data-testid="app"][data-ready="true"]')
    page.get_by_test_id("settings-button").click()
    expect(page.get_by_test_id("settings-temperature")).to_have_value("0.3")
    expect(page.get_by_test_id("settings-top-k")).to_have_value("7")
    page.keyboard.press("Escape")
    expect(page.get_by_test_id("settings-dialog")).to_be_hidden()


def test_server_ui_settings_are_defaults(new_page: Callable[..., Page], ui_server: UIServer) -> None:
    page = new_page(ui_server, goto=False)

    def patch_props(route: Route) -> None:
        res = route.fetch()
        data = res.json()
        data["ui_settings"] = {"temperature": 0.25, "systemMessage": "From the server."}
        route.fulfill(response=res, json=data)

    page.route("**/props", patch_props)
    chats = ChatRequests(page)
    open_ui(page)
    expect(page.get_by_test_id("model-name")).not_to_have_text("…")
    send(page, "Hi")
    wait_done(page)
    assert chats.bodies[0]["temperature"] == 0.25
    assert chats.bodies[0]["messages"][0] == {"role": "system", "content": "From the server."}
    # The user's own choice beats the server's default.
    page.get_by_test_id("settings-button").click()
    expect(page.get_by_test_id("settings-temperature")).to_have_value("0.25")
    page.get_by_test_id("settings-temperature").fill("0.9")
    page.get_by_test_id("settings-save").click()
    send(page, "Again")
    wait_done(page)
    assert chats.bodies[1]["temperature"] == 0.9


def test_header_shows_model_and_context_and_picker(new_page: Callable[..., Page], ui_server: UIServer) -> None:
    props = ui_server.get_json("/props")
    alias = props["model_alias"]
    n_ctx = props["default_generation_settings"]["n_ctx"]
    page = new_page(ui_server)
    expect(page.get_by_test_id("model-name")).to_have_text(alias)
    expect(page.get_by_test_id("context-size")).to_have_text(f"ctx {n_ctx:,}")
    expect(page.get_by_test_id("model-select")).to_be_hidden()

    # Two models: the picker appears and the choice goes into the request.
    page2 = new_page(ui_server, goto=False)
    page2.route(
        "**/v1/models",
        lambda route: route.fulfill(
            json={
                "object": "list",
                "data": [{"id": alias, "object": "model"}, {"id": "other-model", "object": "model"}],
            }
        ),
    )
    page2.route(
        f"**{CHAT_PATH}",
        lambda route: route.fulfill(
            status=200,
            headers={"Content-Type": "text/event-stream"},
            body=sse([{"choices": [{"index": 0, "delta": {"content": "ok"}}]}]),
        ),
    )
    chats = ChatRequests(page2)
    open_ui(page2)
    picker = page2.get_by_test_id("model-select")
    expect(picker).to_be_visible()
    expect(picker.locator("option")).to_have_count(2)
    picker.select_option("other-model")
    send(page2, "Which model?")
    wait_done(page2)
    assert chats.bodies[0]["model"] == "other-model"


def test_router_picker_shows_each_models_state_and_a_failed_loads_reason(
    new_page: Callable[..., Page], ui_server: UIServer
) -> None:
    props = {**ui_server.get_json("/props"), "role": "router", "model_alias": "llama-server", "model_path": "none"}
    listing = {
        "object": "list",
        "data": [
            {"id": "coder", "object": "model", "status": {"value": "loaded", "args": []}},
            {
                "id": "broken",
                "object": "model",
                "status": {"value": "unloaded", "failed": True, "exit_code": 1, "log_tail": ["bad magic"]},
            },
        ],
    }
    page = new_page(ui_server, goto=False)
    asked: list[str] = []

    def on_props(route: Route) -> None:
        asked.append(route.request.url)
        if "model=broken" in route.request.url:
            error = {"code": 503, "message": "model 'broken' failed to load (exit code 1): bad magic", "type": "x"}
            route.fulfill(status=503, json={"error": error})
        else:
            route.fulfill(json=props)

    page.route("**/props*", on_props)
    page.route("**/v1/models", lambda route: route.fulfill(json=listing))
    open_ui(page)
    picker = page.get_by_test_id("model-select")
    expect(picker).to_be_visible()
    expect(picker.locator("option")).to_have_text(["coder · loaded", "broken · failed (exit code 1)"])
    picker.select_option("broken")  # selecting loads it: the router answers why it cannot
    expect(page.locator(".toast")).to_contain_text("failed to load (exit code 1): bad magic")
    assert any("model=broken" in url for url in asked)


# ------------------------------------------------------------------ API key


def test_api_key_prompt_on_401(new_page: Callable[..., Page], keyed_server: UIServer) -> None:
    status, _ = http_get(keyed_server.url + "/props")
    assert status == 401, f"the server started with --api-key answers GET /props without a key with {status}"
    page = new_page(keyed_server)
    dialog = page.get_by_test_id("api-key-dialog")
    expect(dialog).to_be_visible()
    expect(page.get_by_test_id("api-key-input")).to_be_focused()
    # A wrong key: asked again, saying so.
    page.get_by_test_id("api-key-input").fill("wrong-key")
    page.get_by_test_id("api-key-input").press("Enter")
    expect(dialog).to_be_visible()
    expect(dialog).to_contain_text("did not accept")
    page.get_by_test_id("api-key-input").fill(keyed_server.api_key)
    page.get_by_test_id("api-key-submit").click()
    expect(dialog).to_be_hidden()
    expect(page.get_by_test_id("model-name")).not_to_have_text("…")
    assert page.evaluate("localStorage.getItem('llamaserve.apiKey')") == keyed_server.api_key

    chats = ChatRequests(page)
    send(page, "Hello with a key")
    wait_done(page)
    expect(assistant(page).get_by_test_id("message-error")).to_be_hidden()
    assert chats.requests[0].all_headers()["authorization"] == f"Bearer {keyed_server.api_key}"

    # Once stored, no more prompts.
    page.reload()
    page.wait_for_selector('[data-testid="app"][data-ready="true"]')
    expect(page.get_by_test_id("model-name")).not_to_have_text("…")
    expect(dialog).to_be_hidden()


# ------------------------------------------------------------------ keyboard, themes, small screens


def test_keyboard_only_flow(page: Page) -> None:
    chats = ChatRequests(page)
    box = page.get_by_label("Message", exact=True)
    expect(box).to_be_focused()
    page.keyboard.type("line one")
    page.keyboard.press("Shift+Enter")
    page.keyboard.type("line two")
    expect(box).to_have_value("line one\nline two")
    assert chats.requests == []
    page.keyboard.press("Enter")
    wait_done(page)
    expect(user_messages(page).first.get_by_test_id("message-content")).to_have_text("line one\nline two")
    # Settings open and close from the keyboard, focus comes back.
    page.get_by_test_id("settings-button").focus()
    page.keyboard.press("Enter")
    expect(page.get_by_role("dialog", name="Settings")).to_be_visible()
    page.keyboard.press("Escape")
    expect(page.get_by_role("dialog", name="Settings")).to_be_hidden()
    expect(page.get_by_test_id("settings-button")).to_be_focused()
    # Every button has an accessible name.
    unnamed = page.evaluate("""() => [...document.querySelectorAll('button')]
        .filter(b => b.offsetParent !== null)
        .filter(b => !(b.getAttribute('aria-label') || b.textContent.trim())).map(b => b.outerHTML)""")
    assert unnamed == []


def test_theme_follows_system_and_toggle(new_page: Callable[..., Page], ui_server: UIServer) -> None:
    page = new_page(ui_server, color_scheme="dark")
    bg = "getComputedStyle(document.body).backgroundColor"
    dark_bg = page.evaluate(bg)
    assert page.evaluate("document.documentElement.dataset.effectiveTheme") == "dark"
    page.get_by_test_id("theme-toggle").click()
    assert page.evaluate("document.documentElement.dataset.theme") == "light"
    light_bg = page.evaluate(bg)
    assert dark_bg != light_bg
    assert light_bg == "rgb(255, 255, 255)"
    page.reload()
    page.wait_for_selector('[data-testid="app"][data-ready="true"]')
    assert page.evaluate(bg) == light_bg
    expect(page.get_by_test_id("theme-toggle")).to_have_attribute("aria-label", "Switch to dark theme")


def test_small_screen_drawer(new_page: Callable[..., Page], ui_server: UIServer) -> None:
    page = new_page(ui_server, width=390, height=844)
    sidebar = page.get_by_test_id("sidebar")
    toggle = page.get_by_test_id("sidebar-toggle")
    expect(sidebar).to_be_hidden()
    expect(toggle).to_have_attribute("aria-expanded", "false")
    send(page, "Show me some code")
    wait_done(page)
    assert page.evaluate("document.documentElement.scrollWidth") <= 390
    toggle.click()
    expect(sidebar).to_be_visible()
    expect(toggle).to_have_attribute("aria-expanded", "true")
    expect(page.get_by_test_id("conversation-item")).to_have_count(1)
    page.keyboard.press("Escape")
    expect(sidebar).to_be_hidden()
    expect(toggle).to_be_focused()
    # New chat from the top bar on a phone.
    page.get_by_test_id("new-chat-top").click()
    expect(page.get_by_test_id("empty-state")).to_be_visible()


def test_screenshots(new_page: Callable[..., Page], ui_server: UIServer, artifacts: Path) -> None:
    page = new_page(ui_server, color_scheme="light")
    expect(page.get_by_test_id("model-name")).not_to_have_text("…")
    page.screenshot(path=str(artifacts / "empty-light.png"))
    send(
        page,
        "Show me a small Python example and a formula."
        if not ui_server.real
        else "Explain what a hash map is, with a short Python example.",
    )
    wait_done(page)
    send(page, "Now think before you answer: what is 6 times 7?")
    wait_done(page)
    page.mouse.move(0, 0)
    page.wait_for_timeout(300)
    page.screenshot(path=str(artifacts / "main-light.png"))

    page.emulate_media(color_scheme="dark")
    page.wait_for_timeout(200)
    assert page.evaluate("document.documentElement.dataset.effectiveTheme") == "dark"
    page.screenshot(path=str(artifacts / "main-dark.png"))

    page.set_viewport_size({"width": 390, "height": 844})
    page.emulate_media(color_scheme="light")
    page.wait_for_timeout(300)
    page.screenshot(path=str(artifacts / "mobile-390x844.png"))
    page.get_by_test_id("sidebar-toggle").click()
    page.wait_for_timeout(350)
    page.screenshot(path=str(artifacts / "mobile-390x844-drawer.png"))
    page.keyboard.press("Escape")

    page.get_by_test_id("settings-button").click()
    page.wait_for_timeout(200)
    page.screenshot(path=str(artifacts / "mobile-390x844-settings.png"))
    for name in ("empty-light", "main-light", "main-dark", "mobile-390x844", "mobile-390x844-drawer"):
        assert (artifacts / f"{name}.png").stat().st_size > 5_000
