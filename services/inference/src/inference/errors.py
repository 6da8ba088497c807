"""API errors in OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}``.

Role: every failure a client can cause becomes an ``APIError`` (4xx); the app turns it into JSON in exactly one place.
"""

from __future__ import annotations

__all__ = ["APIError", "bad_request", "context_length_exceeded", "model_not_found"]


class APIError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        code: str | None = None,
        param: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.code = code
        self.param = param

    def body(self) -> dict[str, dict[str, str | None]]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def bad_request(message: str, *, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param=param, code=code)


def context_length_exceeded(message: str) -> APIError:
    return APIError(400, message, param="messages", code="context_length_exceeded")


def model_not_found(name: str) -> APIError:
    return APIError(
        404, f"The model `{name}` does not exist.", type="not_found_error", param="model", code="model_not_found"
    )
