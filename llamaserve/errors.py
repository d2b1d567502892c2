"""One error type for the whole HTTP surface, shaped per API family.

OpenAI and native routes answer `{"error": {"code", "message", "type"}}` with
the HTTP status equal to `code` (llama-server's envelope); the Anthropic routes
answer `{"type": "error", "error": {"type", "message"}}`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pydantic loads with the app, after the model's load has begun (start-up time)
    from pydantic import ValidationError

# llama-server's error types, with the HTTP status each maps to.
ERROR_STATUS: dict[str, int] = {
    "invalid_request_error": 400,
    "exceed_context_size_error": 400,
    "authentication_error": 401,
    "permission_error": 403,
    "not_found_error": 404,
    "request_too_large": 413,
    "rate_limit_error": 429,
    "server_error": 500,
    "not_supported_error": 501,
    "unavailable_error": 503,
}

# Anthropic's names for the same situations.
ANTHROPIC_TYPES: dict[str, str] = {
    "invalid_request_error": "invalid_request_error",
    "exceed_context_size_error": "invalid_request_error",
    "authentication_error": "authentication_error",
    "permission_error": "permission_error",
    "not_found_error": "not_found_error",
    "request_too_large": "request_too_large",
    "rate_limit_error": "rate_limit_error",
    "server_error": "api_error",
    "not_supported_error": "invalid_request_error",
    "unavailable_error": "overloaded_error",
}


class APIError(Exception):
    def __init__(
        self,
        message: str,
        kind: str = "invalid_request_error",
        *,
        status: int | None = None,
        extra: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.kind = kind
        self.status = status if status is not None else ERROR_STATUS.get(kind, 500)
        self.extra = extra or {}
        self.headers = headers or {}  # e.g. Retry-After on a 429

    def openai_body(self) -> dict[str, Any]:
        return {"error": {"code": self.status, "message": self.message, "type": self.kind, **self.extra}}

    def anthropic_body(self) -> dict[str, Any]:
        return {
            "type": "error",
            "error": {"type": ANTHROPIC_TYPES.get(self.kind, "api_error"), "message": self.message},
        }


def validation_message(exc: ValidationError) -> str:
    """A short, field-naming message from pydantic's errors."""
    parts = []
    for err in exc.errors()[:5]:
        loc = ".".join(str(p) for p in err.get("loc", ()) if not str(p).startswith("function-"))
        msg = err.get("msg", "invalid value")
        parts.append(f"{loc}: {msg}" if loc else msg)
    return "; ".join(parts) or "invalid request"
