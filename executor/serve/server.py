"""The pieces of a server wired together: engine, event hub, app; and uvicorn on a thread.

``build_server``: the engine on a thread of this process (``LiveEngine``; a policy object
may be passed). ``start_process_server``: the engine in a process of its own
(``EngineProcess``), so that HTTP handling and the engine's steps do not share one
interpreter lock; started and warmed up when it returns.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from fastapi import FastAPI

from executor.engine import EngineConfig
from executor.model import CausalLM
from executor.serve.app import build_app
from executor.serve.engine_child import EngineSpec
from executor.serve.engine_process import EngineProcess
from executor.serve.live_engine import LiveEngine
from executor.serve.metrics import ServingMetrics
from executor.serve.protocol import EngineHandle, TokenizerLike
from executor.serve.streams import StreamHub
from horizon.policies.base import Policy


@dataclass
class Server:
    """``live``, ``hub`` and ``app`` of one served model."""

    live: EngineHandle
    hub: StreamHub
    app: FastAPI
    model_name: str

    def start(self) -> None:
        """Start the engine (if it is not running) and warm it up."""
        if not self.live.alive:
            self.live.start()
        self.live.warmup()


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


def start_process_server(spec: EngineSpec, model_name: str, max_waiting: int = 1024) -> Server:
    """The engine of ``spec`` in its own process, started and warmed up, behind an app.

    Raises:
        RuntimeError: the engine process could not build its engine (its error).
    """
    hub = StreamHub(ServingMetrics(model_name))
    proc = EngineProcess(spec, hub.post, max_waiting)
    proc.start()
    server = Server(proc, hub, build_app(proc, hub, proc.tokenizer, model_name), model_name)
    server.start()
    return server


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
