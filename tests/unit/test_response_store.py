"""The SQLite store of /v1/responses: rows, conversation chains, input_items paging. No model."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from llamaserve.families.responses.store import (
    ResponseNotFound,
    ResponseStore,
    StoredResponse,
    UnknownCursor,
    db_path,
    default_db_path,
    normalise_input,
)


def message(role: str, text: str, item_id: str) -> dict[str, Any]:
    part = "output_text" if role == "assistant" else "input_text"
    return {"id": item_id, "type": "message", "role": role, "content": [{"type": part, "text": text}]}


def stored(
    response_id: str,
    inputs: list[dict[str, Any]],
    outputs: list[dict[str, Any]],
    previous: str | None = None,
    instructions: str | None = None,
) -> StoredResponse:
    body = {
        "id": response_id,
        "object": "response",
        "created_at": 1700000000,
        "model": "m",
        "status": "completed",
        "output": outputs,
        "previous_response_id": previous,
        "store": True,
    }
    return StoredResponse(
        id=response_id,
        created_at=1700000000,
        model="m",
        response=body,
        input_items=inputs,
        instructions=instructions,
        previous_response_id=previous,
    )


@pytest.fixture
def store(tmp_path: Path) -> Iterator[ResponseStore]:
    s = ResponseStore(tmp_path / "deep" / "dir" / "responses.sqlite3")
    yield s
    s.close()


@pytest.fixture
def three_turns(store: ResponseStore) -> ResponseStore:
    """u1 → a1, then u2 → (reasoning, call), then a function output → a3."""
    store.put(
        stored(
            "resp_1",
            [message("user", "u1", "in_1")],
            [message("assistant", "a1", "out_1")],
            instructions="first instructions",
        )
    )
    call = {"id": "fc_1", "type": "function_call", "call_id": "call_1", "name": "f", "arguments": "{}"}
    store.put(
        stored(
            "resp_2",
            [message("user", "u2", "in_2")],
            [{"id": "rs_1", "type": "reasoning", "summary": [], "content": []}, call],
            previous="resp_1",
        )
    )
    output = {"id": "fco_1", "type": "function_call_output", "call_id": "call_1", "output": "42"}
    store.put(stored("resp_3", [output], [message("assistant", "a3", "out_3")], previous="resp_2"))
    return store


def ids(items: list[dict[str, Any]]) -> list[str]:
    return [i["id"] for i in items]


# ---------------------------------------------------------------- rows
def test_file_is_created_lazily_with_parents_and_wal(tmp_path: Path) -> None:
    path = tmp_path / "a" / "b" / "r.sqlite3"
    s = ResponseStore(path)
    assert not path.exists()
    assert s.get("resp_x") is None
    assert path.exists()
    s.close()
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute("PRAGMA user_version").fetchone()[0] == 1


def test_put_get_delete_round_trip(store: ResponseStore) -> None:
    row = stored(
        "resp_1", [message("user", "héllo", "in_1")], [message("assistant", "hi", "out_1")], instructions="be brief"
    )
    store.put(row)
    assert store.get("resp_1") == row
    assert store.delete("resp_1") is True
    assert store.get("resp_1") is None and store.delete("resp_1") is False


def test_rows_survive_a_new_store_on_the_same_file(store: ResponseStore) -> None:
    store.put(stored("resp_1", [message("user", "u", "in_1")], []))
    store.close()
    again = ResponseStore(store.path)
    got = again.get("resp_1")
    again.close()
    assert got is not None and got.input_items[0]["content"][0]["text"] == "u"


def test_newer_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "r.sqlite3"
    with sqlite3.connect(path) as conn:
        conn.execute("PRAGMA user_version=99")
    with pytest.raises(sqlite3.DatabaseError, match="newer"):
        ResponseStore(path).get("x")


def test_concurrent_writers_from_threads(store: ResponseStore) -> None:
    def write(k: int) -> None:
        for j in range(20):
            store.put(stored(f"resp_{k}_{j}", [message("user", "u", f"in_{k}_{j}")], []))

    threads = [threading.Thread(target=write, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(store.get(f"resp_{k}_{j}") is not None for k in range(4) for j in range(20))


# --------------------------------------------------------------- chains
def test_context_walks_the_chain_oldest_first(three_turns: ResponseStore) -> None:
    assert ids(three_turns.context("resp_1")) == ["in_1", "out_1"]
    assert ids(three_turns.context("resp_3")) == ["in_1", "out_1", "in_2", "rs_1", "fc_1", "fco_1", "out_3"]
    responses, missing = three_turns.chain("resp_3")
    assert [r.id for r in responses] == ["resp_1", "resp_2", "resp_3"] and missing is None


def test_instructions_are_not_part_of_the_context(three_turns: ResponseStore) -> None:
    assert all("first instructions" not in str(item) for item in three_turns.context("resp_3"))


def test_unknown_and_broken_chains(three_turns: ResponseStore) -> None:
    with pytest.raises(ResponseNotFound) as info:
        three_turns.context("resp_nope")
    assert info.value.missing == "resp_nope"
    three_turns.delete("resp_1")
    with pytest.raises(ResponseNotFound) as info:
        three_turns.context("resp_3")
    assert info.value.missing == "resp_1"
    # What survives is still listed.
    assert ids(three_turns.input_items("resp_3", order="asc").data) == ["in_2", "rs_1", "fc_1", "fco_1"]


# --------------------------------------------------------------- paging
def test_input_items_are_the_items_used_to_generate(three_turns: ResponseStore) -> None:
    page = three_turns.input_items("resp_3", order="asc")
    assert ids(page.data) == ["in_1", "out_1", "in_2", "rs_1", "fc_1", "fco_1"] and not page.has_more
    assert page.to_dict() == {
        "object": "list",
        "data": page.data,
        "first_id": "in_1",
        "last_id": "fco_1",
        "has_more": False,
    }
    assert ids(three_turns.input_items("resp_3").data) == ["fco_1", "fc_1", "rs_1", "in_2", "out_1", "in_1"]
    assert ids(three_turns.input_items("resp_1").data) == ["in_1"]


@pytest.mark.parametrize("order", ["asc", "desc"])
def test_paging_with_after_visits_every_item_once(three_turns: ResponseStore, order: str) -> None:
    seen: list[str] = []
    after: str | None = None
    pages = 0
    while True:
        page = three_turns.input_items("resp_3", limit=4, order=order, after=after)  # type: ignore[arg-type]
        seen += ids(page.data)
        pages += 1
        if not page.has_more:
            break
        after = page.to_dict()["last_id"]
    everything = ids(three_turns.input_items("resp_3", limit=100, order=order).data)  # type: ignore[arg-type]
    assert seen == everything and len(everything) == 6 and pages == 2


def test_exact_page_boundary_and_empty_page(three_turns: ResponseStore) -> None:
    page = three_turns.input_items("resp_3", limit=6)
    assert len(page.data) == 6 and page.has_more is False
    last = three_turns.input_items("resp_3", after="in_1")
    assert last.data == [] and last.to_dict()["first_id"] is None and last.to_dict()["last_id"] is None
    with pytest.raises(UnknownCursor):
        three_turns.input_items("resp_3", after="nope")
    with pytest.raises(ResponseNotFound):
        three_turns.input_items("resp_nope")


# ---------------------------------------------------------- normalising
def test_normalise_input_adds_ids_and_parts_but_keeps_fields() -> None:
    [only] = normalise_input("Hi")
    assert only["id"].startswith("msg_")
    assert {k: v for k, v in only.items() if k != "id"} == {
        "type": "message",
        "role": "user",
        "content": [{"type": "input_text", "text": "Hi"}],
    }
    items = normalise_input(
        [
            {"role": "user", "content": "a"},
            {"role": "assistant", "content": "b"},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "c"}], "id": "mine"},
            {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "1"},
        ]
    )
    assert items[0]["type"] == "message" and items[0]["content"] == [{"type": "input_text", "text": "a"}]
    assert items[1]["content"] == [{"type": "output_text", "text": "b"}]
    assert items[2]["id"] == "mine"
    assert items[3]["id"].startswith("fc_") and items[3]["call_id"] == "c1"
    assert items[4]["id"].startswith("fco_") and items[4]["output"] == "1"
    assert len({i["id"] for i in items}) == 5


def test_db_path_default_and_flag(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert default_db_path() == tmp_path / "llamaserve" / "responses.sqlite3"
    assert db_path(None) == db_path("") == default_db_path()
    assert db_path(str(tmp_path / "x.db")) == tmp_path / "x.db"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert default_db_path() == tmp_path / ".cache" / "llamaserve" / "responses.sqlite3"
