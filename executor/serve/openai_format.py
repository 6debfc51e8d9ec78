"""Response bodies in OpenAI's formats: completions and chat completions, whole or as
server-sent-event chunks (``data: {json}``, the last one ``data: [DONE]``)."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

DONE = "data: [DONE]\n\n"


_encode = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode


def sse(obj: dict[str, Any]) -> str:
    return f"data: {_encode(obj)}\n\n"


def usage(num_prompt: int, num_output: int) -> dict[str, int]:
    return {
        "prompt_tokens": num_prompt,
        "completion_tokens": num_output,
        "total_tokens": num_prompt + num_output,
    }


class ResponseFormat:
    """One response's id, creation time and model; builds its bodies.

    ``chat``: chat completion (``message`` / ``delta``), else text completion (``text``).
    ``include_usage``: streamed chunks carry ``"usage": null`` and a last chunk the usage.
    """

    def __init__(self, chat: bool, model: str, include_usage: bool = False) -> None:
        self.chat = chat
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        self.created = int(time.time())
        self.model = model
        self.include_usage = include_usage
        self._chunk_sse = self._chunk_template()

    def _head(self, chunk: bool) -> dict[str, Any]:
        if self.chat:
            obj = "chat.completion.chunk" if chunk else "chat.completion"
        else:
            obj = "text_completion"
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def full(self, text: str, finish_reason: str, num_prompt: int, num_output: int) -> dict:
        """The whole (non-streamed) response."""
        choice: dict[str, Any] = {"index": 0}
        if self.chat:
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        choice.update(logprobs=None, finish_reason=finish_reason)
        return {**self._head(False), "choices": [choice], "usage": usage(num_prompt, num_output)}

    def chunk(self, text: str, finish_reason: str | None = None, role: bool = False) -> dict:
        """A streamed chunk of ``text`` (``role``: the chat's first chunk, naming the role)."""
        choice: dict[str, Any] = {"index": 0}
        if self.chat:
            delta: dict[str, Any] = {"role": "assistant"} if role else {}
            delta["content"] = text
            choice["delta"] = delta
        else:
            choice["text"] = text
        choice.update(logprobs=None, finish_reason=finish_reason)
        out = {**self._head(True), "choices": [choice]}
        if self.include_usage:
            out["usage"] = None
        return out

    def chunk_sse(self, text: str, finish_reason: str | None = None) -> str:
        """``sse(self.chunk(text, finish_reason))``, the same characters, from a template
        made once per response (the per-token path of a stream)."""
        head, mid, tail = self._chunk_sse
        return f"{head}{_encode(text)}{mid}{_encode(finish_reason)}{tail}"

    def _chunk_template(self) -> tuple[str, str, str]:
        mark = "\x00text\x00"
        whole = sse(self.chunk(mark, mark))
        head, mid, tail = whole.split(_encode(mark))
        return head, mid, tail

    def usage_chunk(self, num_prompt: int, num_output: int) -> dict:
        """The last chunk of a stream with ``include_usage``: no choices, the usage."""
        return {**self._head(True), "choices": [], "usage": usage(num_prompt, num_output)}

    def error_chunk(self, message: str) -> dict:
        return {"error": {"message": message, "type": "server_error", "param": None, "code": None}}
