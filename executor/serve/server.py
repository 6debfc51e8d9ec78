"""The pieces of a server wired together: engine, event hub, app; and uvicorn on a thread."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from fastapi import FastAPI

from executor.engine import EngineConfig
from executor.model import CausalLM
from executor.serve.app import build_app
from executor.serve.live_engine import LiveEngine
from executor.serve.metrics import ServingMetrics
from executor.serve.protocol import TokenizerLike
from executor.serve.streams import StreamHub
from horizon.policies.base import Policy


@dataclass
class Server:
    """``live`` (not yet started), ``hub`` and ``app`` of one served model."""

    live: LiveEngine
    hub: StreamHub
    app: FastAPI
    model_name: str


def build_server(
    model: CausalLM,
    tokenizer: TokenizerLike,
    config: EngineConfig,
    model_name: str,
    policy: Policy | str = "fcfs",
    max_waiting: int = 1024,
) -> Server:
    hub = StreamHub(ServingMetrics(model_name))
    live = LiveEngine(model, tokenizer, config, policy, max_waiting, publish=hub.post)
    return Server(live, hub, build_app(live, hub, tokenizer, model_name), model_name)


class ServerThread:
    """uvicorn serving ``app`` on ``host``, on a daemon thread; ``port=0``: an ephemeral port
    (``port`` holds the bound one once ``start`` returns)."""

    def __init__(self, app: FastAPI, host: str = "127.0.0.1", port: int = 0) -> None:
        import uvicorn

        self.host = host
        config = uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="on")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, name="uvicorn", daemon=True)
        self.port = port

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout: float = 30.0) -> None:
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the HTTP server did not start")
            time.sleep(0.01)
        self.port = self._server.servers[0].sockets[0].getsockname()[1]

    def stop(self, timeout: float = 30.0) -> None:
        self._server.should_exit = True
        self._thread.join(timeout)
