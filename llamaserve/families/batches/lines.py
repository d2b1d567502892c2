"""A batch's input lines and the records of its output and error files, in OpenAI's shapes.

Input, one JSON object per line: `{"custom_id", "method": "POST", "url", "body"}`.
Output and error files, one record per line:
`{"id": "batch_req_…", "custom_id", "response": {"status_code", "request_id", "body"}, "error"}`.
A line the server answered (any status) has a `response`; a 2xx goes to the output file,
anything else to the error file with the route's own error body. A line that never reached a
route (not JSON, no custom_id, an unknown url, a duplicate custom_id) has `response: null` and
an `error` `{"code", "message"}` naming what is wrong with it. Bad lines never stop the batch.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

from llamaserve.families.batches.protocol import BATCH_URLS

MAX_LINES = 50_000  # OpenAI's bound on one batch


@dataclass(frozen=True)
class Line:
    """A line ready to run: its position in the input file, id, route and body."""

    index: int
    custom_id: str
    url: str
    body: dict[str, Any]


@dataclass(frozen=True)
class Outcome:
    """One line's record for the output file (`ok`) or the error file."""

    index: int
    ok: bool
    record: dict[str, Any]


def _new_id(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex}"


def refused(index: int, custom_id: str | None, code: str, message: str) -> Outcome:
    """A line that never reached a route."""
    record = {
        "id": _new_id("batch_req_"),
        "custom_id": custom_id,
        "response": None,
        "error": {"code": code, "message": f"line {index + 1}: {message}"},
    }
    return Outcome(index, False, record)


def answered(index: int, custom_id: str, status: int, body: Any) -> Outcome:
    """A line a route answered with `status` and `body`."""
    record = {
        "id": _new_id("batch_req_"),
        "custom_id": custom_id,
        "response": {"status_code": status, "request_id": _new_id("req_"), "body": body},
        "error": None,
    }
    return Outcome(index, 200 <= status < 300, record)


def _check(index: int, raw: str, seen: set[str]) -> Line | Outcome:
    try:
        data = json.loads(raw)
    except ValueError as exc:
        return refused(index, None, "invalid_json_line", f"not valid JSON ({exc})")
    if not isinstance(data, dict):
        return refused(index, None, "invalid_json_line", "a line must be a JSON object")
    custom_id = data.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        return refused(index, None, "missing_custom_id", "custom_id must be a non-empty string")
    if custom_id in seen:
        return refused(index, custom_id, "duplicate_custom_id", f"custom_id '{custom_id}' appears more than once")
    seen.add(custom_id)
    if data.get("method") != "POST":
        return refused(index, custom_id, "invalid_method", "method must be POST")
    url = data.get("url")
    if url not in BATCH_URLS:
        return refused(index, custom_id, "invalid_url", f"url {url!r} is not one of {', '.join(BATCH_URLS)}")
    body = data.get("body")
    if not isinstance(body, dict):
        return refused(index, custom_id, "invalid_body", "body must be a JSON object")
    if body.get("stream"):
        return refused(index, custom_id, "invalid_body", "stream: a batch line is answered whole, never streamed")
    return Line(index, custom_id, str(url), body)


def parse_input(text: str) -> tuple[list[Line], list[Outcome]]:
    """The file's lines: those to run, and the records of those refused. Blank lines are skipped."""
    lines: list[Line] = []
    bad: list[Outcome] = []
    seen: set[str] = set()
    for index, raw in enumerate(text.splitlines()):
        if not raw.strip():
            continue
        checked = _check(index, raw, seen)
        if isinstance(checked, Line):
            lines.append(checked)
        else:
            bad.append(checked)
    return lines, bad


def batch_usage(records: list[dict[str, Any]]) -> dict[str, Any]:
    """The Batch object's `usage`: the answered lines' token counts summed (OpenAI's shape)."""
    prompt = cached = completion = reasoning = 0
    for record in records:
        usage = ((record.get("response") or {}).get("body") or {}).get("usage")
        if not isinstance(usage, dict):
            continue
        prompt += int(usage.get("prompt_tokens") or 0)
        completion += int(usage.get("completion_tokens") or 0)
        cached += int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
        reasoning += int((usage.get("completion_tokens_details") or {}).get("reasoning_tokens") or 0)
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": cached},
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": reasoning},
        "total_tokens": prompt + completion,
    }
