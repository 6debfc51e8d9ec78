"""A served tiny model for the HTTP tests: random weights on the CPU (torch attention), the
byte tokenizer, uvicorn on an ephemeral localhost port in a thread."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from executor.engine import EngineConfig
from executor.model import CausalLM
from executor.model.testing import tiny_config
from executor.serve.byte_tokenizer import ByteTokenizer
from executor.serve.protocol import TokenizerLike
from executor.serve.server import Server, ServerThread, build_server
from executor.weights import random_weights

MODEL = "tiny"
MAX_MODEL_LEN = 256


def tiny_model() -> CausalLM:
    model = CausalLM(tiny_config())
    random_weights(model, 7, std=0.2)  # peaked logits: greedy tokens far from ties
    return model


def tiny_config_for_serving(**kw) -> EngineConfig:
    cfg = {
        "num_blocks": 512,
        "block_size": 4,
        "max_num_batched_tokens": 64,
        "max_num_seqs": 8,
        "max_model_len": MAX_MODEL_LEN,
        "stop": "eos",
    }
    cfg.update(kw)
    return EngineConfig(**cfg)


@contextmanager
def served(
    model: CausalLM | None = None,
    policy: str = "fcfs",
    max_waiting: int = 64,
    tokenizer: TokenizerLike | None = None,
    model_name: str = MODEL,
    **kw,
) -> Iterator[tuple[Server, ServerThread]]:
    """A started server (engine thread and HTTP thread) of ``model`` (default: the tiny one
    with the byte tokenizer); closed at the end, its integrity checked. ``kw``: engine
    options."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matmuls on shared cores: one thread is fastest
    model = model or tiny_model()
    config = tiny_config_for_serving(**kw)
    tokenizer = tokenizer or ByteTokenizer()
    server = build_server(model, tokenizer, config, model_name, policy, max_waiting)
    server.live.start()
    try:
        with over_http(server) as http:
            yield server, http
    finally:
        torch.set_num_threads(threads)
    assert server.live.error is None
    server.live.check_integrity()


@contextmanager
def over_http(server: Server) -> Iterator[ServerThread]:
    """``server``'s app on uvicorn (a thread, an ephemeral port) while the block runs; then
    the HTTP thread stopped and the engine closed."""
    http = ServerThread(server.app)
    http.start()
    try:
        yield http
    finally:
        http.stop()
        server.live.close()


def settle(server: Server, timeout: float = 30.0) -> None:
    """After a test: nothing runs or waits, every stream is closed, and the scheduler, runner
    and backend pass their integrity checks."""
    server.live.wait_idle(timeout)
    deadline = time.monotonic() + timeout
    while server.hub.num_open:  # the last events may still be on their way to the loop
        assert time.monotonic() < deadline, "streams left open"
        time.sleep(0.01)
    server.live.check_integrity()


def stall(server: Server, seconds: float) -> None:
    """Hold the engine thread at its next step boundary for ``seconds`` (returns at once)."""
    server.live.call(lambda: time.sleep(seconds))
