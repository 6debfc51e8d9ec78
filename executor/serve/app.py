"""The HTTP API (FastAPI): OpenAI's completions and chat completions, models, health, metrics.

Endpoints:
    POST /v1/completions          prompt: text, token ids, or a list of one of those
    POST /v1/chat/completions     messages through the tokenizer's chat template
    GET  /v1/models, /v1/models/{id}
    GET  /health                  200 while the engine runs, else 503
    GET  /metrics                 Prometheus text, vLLM's names (``executor.serve.metrics``)

Both generation endpoints take ``stream`` (server-sent events, ``data: [DONE]`` last) with
``stream_options.include_usage``, ``max_tokens`` (chat: or ``max_completion_tokens``),
``temperature``, ``top_p``, ``seed``, ``stop``, and vLLM's ``top_k``, ``min_p``, ``min_tokens``,
``ignore_eos``, ``skip_special_tokens``. Errors are OpenAI's JSON (``api_error``): 400 for a bad
body or field, 404 for an unknown model, 429 (with Retry-After) when ``max_waiting`` requests
wait, 503 when the engine is down.
"""

from __future__ import annotations

import asyncio
import time
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from starlette.exceptions import HTTPException

from executor.serve.api_error import ApiError
from executor.serve.live_engine import EngineUnavailable, LiveEngine, QueueFull
from executor.serve.openai_format import ResponseFormat
from executor.serve.prompting import generation_params, prompt_ids
from executor.serve.protocol import TokenizerLike
from executor.serve.request_parsing import parse_chat, parse_completion, parse_json
from executor.serve.responses import collected, streamed
from executor.serve.streams import StreamHub

RETRY_AFTER_S = 1


def build_app(
    live: LiveEngine, hub: StreamHub, tokenizer: TokenizerLike, model_name: str
) -> FastAPI:
    """The app over a started (or to be started) ``live`` engine whose events go to ``hub``
    (``LiveEngine(..., publish=hub.post)``); the app binds ``hub`` to its event loop."""

    @asynccontextmanager
    async def lifespan(app: FastAPI):  # noqa: ANN202
        hub.bind(asyncio.get_running_loop())
        yield

    app = FastAPI(title="horizon", lifespan=lifespan)
    created = int(time.time())
    vocab = live.engine.model.config.vocab_size

    @app.exception_handler(ApiError)
    async def api_error(request: Request, e: ApiError) -> JSONResponse:
        return JSONResponse(e.body(), status_code=e.status, headers=e.headers)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, e: HTTPException) -> JSONResponse:
        err = ApiError(str(e.detail), e.status_code, type="invalid_request_error")
        return JSONResponse(err.body(), status_code=e.status_code)

    def model_card() -> dict[str, Any]:
        return {
            "id": model_name,
            "object": "model",
            "created": created,
            "owned_by": "horizon",
            "max_model_len": live.config.max_model_len,
        }

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [model_card()]}

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str) -> dict[str, Any]:
        _check_model(model_id, model_name)
        return model_card()

    @app.get("/health")
    async def health() -> Response:
        if live.alive:
            return Response(status_code=200)
        return JSONResponse(ApiError("the engine is not running", 503).body(), status_code=503)

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        text = hub.metrics.render(live.stats, live.inbox.num_waiting)
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4; charset=utf-8")

    async def generate(request: Request, chat: bool) -> Response:
        body = parse_json(await request.body())
        req = parse_chat(body) if chat else parse_completion(body)
        if req.model is not None:
            _check_model(req.model, model_name)
        ids = prompt_ids(req, tokenizer, vocab)
        params = generation_params(req, len(ids), live)
        arrival = time.perf_counter()
        rid = _submit(live, ids, params)
        stream = hub.open(rid, len(ids), arrival)
        fmt = ResponseFormat(chat, model_name, req.include_usage)
        abort = lambda: live.abort(rid)  # noqa: E731
        if req.stream:
            return streamed(stream, fmt, abort)
        return await collected(stream, fmt, abort, request)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await generate(request, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await generate(request, chat=True)

    return app


def _check_model(name: str, served: str) -> None:
    if name != served:
        raise ApiError(
            f"The model `{name}` does not exist (this server serves `{served}`).",
            404,
            param="model",
            code="model_not_found",
        )


def _submit(live: LiveEngine, ids: list[int], params: Any) -> int:
    try:
        return live.submit(ids, params)
    except QueueFull as e:
        raise ApiError(
            f"Too many requests waiting ({e}); retry later.",
            429,
            code="rate_limit_exceeded",
            type="rate_limit_error",
            headers={"Retry-After": str(RETRY_AFTER_S)},
        ) from None
    except EngineUnavailable as e:
        raise ApiError(str(e), 503, type="server_error") from None
