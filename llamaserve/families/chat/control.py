"""`POST /v1/chat/completions/control`: act on a running chat answer, as llama-server does.

The one action is `reasoning_end`: the answer named by `id` (the `chatcmpl-…` id its stream
carries) closes its reasoning block now; the closing tokens replace the next sampled ones and
the model goes on to the final answer. The answer must have been armed with
`reasoning_control: true` (`families/chat/serving._reasoning_budget` gives it an unlimited
reasoning budget the engine can end). The reply is llama-server's: `{"success": true}`, or
`{"success": false, "message": ...}` when no running answer has the id or it was not armed;
a missing id or an unknown action is a 400.
"""

from __future__ import annotations

from typing import Any

from llamaserve.errors import APIError
from llamaserve.families.chat.protocol import ChatControlRequest
from llamaserve.serving.runtime import ModelRuntime

ACTIONS = ("reasoning_end",)
NOT_RUNNING = "no active completion for this id"


def check(req: ChatControlRequest) -> None:
    """llama-server's two refusals, with its messages."""
    if not req.id:
        raise APIError("missing completion id")
    if req.action not in ACTIONS:
        raise APIError("unknown control action")


async def control(rt: ModelRuntime, req: ChatControlRequest) -> dict[str, Any]:
    check(req)
    success, message = await rt.engine.end_reasoning(req.id)
    return {"success": True} if success else {"success": False, "message": message}


def asleep_answer(req: ChatControlRequest) -> dict[str, Any]:
    """While the model sleeps nothing runs, so no answer has the id (and asking must not wake it)."""
    check(req)
    return {"success": False, "message": NOT_RUNNING}
