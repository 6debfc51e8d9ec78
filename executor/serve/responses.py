"""A submitted request's answer: streamed as server-sent events, or collected whole. Either
way a client that goes away aborts its request."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse

from executor.serve.api_error import ApiError
from executor.serve.events import Event
from executor.serve.openai_format import DONE, ResponseFormat, sse
from executor.serve.streams import RequestStream

DISCONNECT_POLL_S = 0.25


def streamed(
    stream: RequestStream, fmt: ResponseFormat, abort: Callable[[], None]
) -> StreamingResponse:
    """The request's chunks as they come, then the usage chunk (if asked for) and
    ``[DONE]``. Closing the connection aborts the request (the generator is closed). A traced
    stream's first token is stamped written at the moment its chunk is handed to Starlette's
    ``send`` (taken before the send, recorded once it returned: no client can have read the
    chunk before that moment, and uvicorn's own write falls in the client's read)."""

    async def body() -> AsyncIterator[str]:
        n = 0
        tracing = stream.first is not None
        try:
            if fmt.chat:
                yield sse(fmt.chunk("", role=True))
            async for batch in stream.batches():
                parts, n, failed, text = _chunks(batch, fmt, n)
                handed = time.perf_counter()  # before the send: a client reads it later
                yield parts
                if tracing and n:
                    tracing = stream.wrote(handed, text)
                if failed:
                    break
            if fmt.include_usage:
                yield sse(fmt.usage_chunk(stream.num_prompt_tokens, n))
            yield DONE
        finally:
            if not stream.done:
                abort()

    headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    return StreamingResponse(body(), media_type="text/event-stream", headers=headers)


def _chunks(events: list[Event], fmt: ResponseFormat, n: int) -> tuple[str, int, bool, bool]:
    """The events' chunks (one per token, text or not) in one string, the tokens so far,
    whether the engine failed (an error chunk, last), and whether any chunk has text."""
    parts = []
    text = False
    for e in events:
        n = e.num_output_tokens
        if e.finish_reason == "error":
            parts.append(sse(fmt.error_chunk(e.error)))
            return "".join(parts), n, True, text
        text = text or bool(e.text)
        parts.append(fmt.chunk_sse(e.text, e.finish_reason))
    return "".join(parts), n, False, text


async def collected(
    stream: RequestStream, fmt: ResponseFormat, abort: Callable[[], None], request: Request
) -> JSONResponse:
    """The whole response once the request has finished; a client that disconnects before
    aborts it (looked for every ``DISCONNECT_POLL_S``)."""
    task = asyncio.ensure_future(_collect(stream))
    try:
        while not task.done():
            await asyncio.wait({task}, timeout=DISCONNECT_POLL_S)
            if not task.done() and await request.is_disconnected():
                abort()
                await task
        text, n, finish, error = task.result()
    finally:
        if not stream.done:
            abort()
            task.cancel()
    if finish == "error":
        raise ApiError(f"the engine failed: {error}", 500, type="server_error")
    return JSONResponse(fmt.full(text, finish, stream.num_prompt_tokens, n))


async def _collect(stream: RequestStream) -> tuple[str, int, str, str]:
    parts: list[str] = []
    n, finish, error = 0, "error", ""
    async for e in stream:
        parts.append(e.text)
        n, finish, error = e.num_output_tokens, e.finish_reason or finish, e.error
    return "".join(parts), n, finish, error
