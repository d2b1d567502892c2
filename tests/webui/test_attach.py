"""Attaching images and audio in the chat page (Chromium), against a server whose model takes them.

The fake API says so with ``--modalities``; ``WEBUI_SERVER=real`` starts llamaserve with the
random-weight projector of tests/models/mmproj.py (a mechanics test: the answer means nothing).
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Page, expect

from tests.media_files import png, wav_tone

from .conftest import SERVER_KIND, UIServer, start_ui_server, stop_ui_server
from .test_webui import ChatRequests, assistant, user_messages, wait_done


@pytest.fixture(scope="module")
def mm_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[UIServer]:
    tmp = tmp_path_factory.mktemp("webui-mm")
    if SERVER_KIND == "real":
        from tests.models.mmproj import omni_projector

        extra = ["-mm", str(omni_projector(tmp / "mmproj-omni.gguf"))]
    else:
        extra = ["--modalities", "vision,audio"]
    srv = start_ui_server(tmp, extra)
    yield srv
    stop_ui_server(srv)


@pytest.fixture()
def mm_page(new_page: Callable[..., Any], mm_server: UIServer) -> Any:
    return new_page(mm_server)


def test_attached_image_is_sent_shown_and_kept_across_reloads(mm_page: Page, tmp_path: Path) -> None:
    image = png(24, 16, seed=4)
    path = tmp_path / "noise.png"
    path.write_bytes(image)
    chats = ChatRequests(mm_page)
    expect(mm_page.get_by_test_id("attach-button")).to_be_visible()
    mm_page.get_by_test_id("attach-file").set_input_files(str(path))
    expect(mm_page.get_by_test_id("attachment")).to_have_count(1)
    box = mm_page.get_by_test_id("message-input")
    box.fill("What is in this picture?")
    box.press("Enter")
    wait_done(mm_page)

    content = chats.bodies[-1]["messages"][-1]["content"]
    assert content[0] == {"type": "text", "text": "What is in this picture?"}
    assert content[1]["type"] == "image_url"
    assert content[1]["image_url"]["url"] == "data:image/png;base64," + base64.b64encode(image).decode()
    expect(mm_page.get_by_test_id("attachment")).to_have_count(0)  # the composer is cleared
    shown = user_messages(mm_page).last.get_by_test_id("message-attachment")
    expect(shown).to_have_count(1)
    assert shown.get_attribute("src", timeout=5000).startswith("data:image/png;base64,")
    expect(assistant(mm_page).get_by_test_id("message-content")).not_to_be_empty()

    mm_page.reload()
    mm_page.wait_for_selector('[data-testid="app"][data-ready="true"]')
    expect(user_messages(mm_page).last.get_by_test_id("message-attachment")).to_have_count(1)


def test_pasted_audio_goes_as_input_audio(mm_page: Page) -> None:
    chats = ChatRequests(mm_page)
    wav = base64.b64encode(wav_tone(0.2)).decode()
    expect(mm_page.get_by_test_id("attach-button")).to_be_visible()
    # A paste event carrying a WAV file, as a clipboard with a file in it would give.
    mm_page.evaluate(
        """(b64) => {
            const bytes = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
            const dt = new DataTransfer();
            dt.items.add(new File([bytes], "tone.wav", { type: "audio/wav" }));
            const ev = new ClipboardEvent("paste", { clipboardData: dt, bubbles: true, cancelable: true });
            document.getElementById("composer-input").dispatchEvent(ev);
        }""",
        wav,
    )
    expect(mm_page.get_by_test_id("attachment")).to_have_count(1)
    mm_page.get_by_test_id("send-button").click()  # no text: the audio alone is a message
    wait_done(mm_page)
    content = chats.bodies[-1]["messages"][-1]["content"]
    assert content == [{"type": "input_audio", "input_audio": {"data": wav, "format": "wav"}}]
    expect(user_messages(mm_page).last.locator("audio")).to_have_count(1)
