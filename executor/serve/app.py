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
from executor.serve.live_engine import EngineUnavailable, QueueFull
from executor.serve.openai_format import ResponseFormat
from executor.serve.prompting import generation_params, prompt_ids
from executor.serve.protocol import EngineHandle, TokenizerLike
from executor.serve.request_parsing import parse_chat, parse_completion, parse_json
from executor.serve.responses import collected, streamed
from executor.serve.streams import StreamHub

RETRY_AFTER_S = 1


def build_app(
    live: EngineHandle, hub: StreamHub, tokenizer: TokenizerLike, model_name: str
) -> FastAPI:
    """The app over a started (or to be started) ``live`` engine whose events go to ``hub``
    (``LiveEngine(..., publish=hub.post)`` or an ``EngineProcess``); the app binds ``hub``
    to its event loop."""

    @asynccontextmanager
    async def lifespan(app: FastAPI):  # noqa: ANN202
        hub.bind(asyncio.get_running_loop())
        yield

    app = FastAPI(title="horizon", lifespan=lifespan)
    app.add_exception_handler(ApiError, _api_error)
    app.add_exception_handler(HTTPException, _http_error)
    api = Api(live, hub, tokenizer, model_name)
    app.add_api_route("/v1/models", api.models, methods=["GET"])
    app.add_api_route("/v1/models/{model_id:path}", api.model, methods=["GET"])
    app.add_api_route("/health", api.health, methods=["GET"])
    app.add_api_route("/metrics", api.metrics, methods=["GET"])
    app.add_api_route("/v1/completions", api.completions, methods=["POST"])
    app.add_api_route("/v1/chat/completions", api.chat_completions, methods=["POST"])
    return app


class Api:
    """The endpoints of one served model (``model_name``)."""

    def __init__(
        self, live: EngineHandle, hub: StreamHub, tokenizer: TokenizerLike, model_name: str
    ) -> None:
        self.live, self.hub, self.tokenizer, self.model_name = live, hub, tokenizer, model_name
        self.created = int(time.time())
        self.vocab_size = live.vocab_size

    def _card(self) -> dict[str, Any]:
        return {
            "id": self.model_name,
            "object": "model",
            "created": self.created,
            "owned_by": "horizon",
            "max_model_len": self.live.config.max_model_len,
        }

    async def models(self) -> dict[str, Any]:
        return {"object": "list", "data": [self._card()]}

    async def model(self, model_id: str) -> dict[str, Any]:
        _check_model(model_id, self.model_name)
        return self._card()

    async def health(self) -> Response:
        if self.live.alive:
            return Response(status_code=200)
        return JSONResponse(ApiError("the engine is not running", 503).body(), status_code=503)

    async def metrics(self) -> PlainTextResponse:
        text = self.hub.metrics.render(self.live.stats, self.live.num_waiting)
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4; charset=utf-8")

    async def completions(self, request: Request) -> Response:
        return await self._generate(request, chat=False)

    async def chat_completions(self, request: Request) -> Response:
        return await self._generate(request, chat=True)

    async def _generate(self, request: Request, chat: bool) -> Response:
        """Check the body, submit the request, answer streamed or whole. Its arrival (the
        records' and the metrics') is when its body has been read: tokenizing it and waiting
        for the engine's next step boundary count in its TTFT. A streamed one is traced
        (``ttft_trace``) from the endpoint's start."""
        handler = time.perf_counter()
        body = parse_json(await request.body())
        arrival = time.perf_counter()
        req = parse_chat(body) if chat else parse_completion(body)
        if req.model is not None:
            _check_model(req.model, self.model_name)
        ids = prompt_ids(req, self.tokenizer, self.vocab_size)
        live = self.live
        params = generation_params(req, len(ids), live)
        rid = _submit(live, ids, params, arrival)
        fmt = ResponseFormat(chat, self.model_name, req.include_usage)
        stream = self.hub.open(rid, len(ids), arrival, handler if req.stream else None, fmt.id)

        def abort() -> None:
            live.abort(rid)

        if req.stream:
            return streamed(stream, fmt, abort)
        return await collected(stream, fmt, abort, request)


async def _api_error(request: Request, e: Exception) -> JSONResponse:
    assert isinstance(e, ApiError)
    return JSONResponse(e.body(), status_code=e.status, headers=e.headers)


async def _http_error(request: Request, e: Exception) -> JSONResponse:
    assert isinstance(e, HTTPException)
    err = ApiError(str(e.detail), e.status_code)
    return JSONResponse(err.body(), status_code=e.status_code, headers=e.headers)


def _check_model(name: str, served: str) -> None:
    if name != served:
        raise ApiError(
            f"The model `{name}` does not exist (this server serves `{served}`).",
            404,
            param="model",
            code="model_not_found",
        )


def _submit(live: EngineHandle, ids: list[int], params: Any, arrival: float) -> int:
    try:
        return live.submit(ids, params, arrival=arrival)
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
