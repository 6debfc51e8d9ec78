"""Errors answered as the OpenAI API answers them: ``{"error": {message, type, param, code}}``."""

from __future__ import annotations

from typing import Any


class ApiError(Exception):
    """An error a client caused (or a server state it should know about), with its HTTP
    status and OpenAI's error fields. ``param`` names the offending request field."""

    def __init__(
        self,
        message: str,
        status: int = 400,
        param: str | None = None,
        code: str | None = None,
        type: str = "invalid_request_error",
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message, self.status, self.param, self.code = message, status, param, code
        self.type = type
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }


def missing(param: str) -> ApiError:
    return ApiError(
        f"Missing required parameter: '{param}'.", param=param, code="missing_required_parameter"
    )


def invalid_type(param: str, expected: str, value: object) -> ApiError:
    got = _json_type(value)
    return ApiError(
        f"Invalid type for '{param}': expected {expected}, but got {got} instead.",
        param=param,
        code="invalid_type",
    )


def invalid_value(param: str, message: str) -> ApiError:
    return ApiError(f"Invalid '{param}': {message}", param=param, code="invalid_value")


def unsupported(param: str, message: str) -> ApiError:
    return ApiError(f"'{param}' {message}", param=param, code="unsupported_value")


def _json_type(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a decimal"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__
