"""Request bodies of ``/v1/completions`` and ``/v1/chat/completions``, checked field by field.

Every field a client can get wrong raises ``ApiError`` (400) naming it, as OpenAI's API does.
Fields of OpenAI's API that this server does not implement are refused when set to anything
but their default (``n > 1``, logprobs, penalties, tools...); fields it does not know are
ignored (as vLLM does). vLLM's extra sampling fields are read too: ``top_k``, ``min_p``,
``min_tokens``, ``ignore_eos``, ``skip_special_tokens``.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from executor.serve.api_error import ApiError, invalid_type, invalid_value, missing, unsupported

# field -> its default: a request may give the default, nothing else
UNSUPPORTED = {
    "n": 1,
    "best_of": 1,
    "logprobs": None,
    "top_logprobs": None,
    "echo": False,
    "suffix": None,
    "presence_penalty": 0,
    "frequency_penalty": 0,
    "repetition_penalty": 1,
    "logit_bias": None,
    "tools": None,
    "functions": None,
    "use_beam_search": False,
}
ROLES = ("system", "developer", "user", "assistant", "tool")


@dataclass(frozen=True)
class ApiRequest:
    """A checked request. ``prompt`` is text, ``prompt_ids`` token ids (completions may give
    either), ``messages`` a chat's ``{"role", "content"}`` list; ``prompt_param`` names the
    field that holds the prompt (for errors)."""

    model: str | None
    prompt_param: str
    prompt: str | None = None
    prompt_ids: tuple[int, ...] | None = None
    messages: tuple[dict[str, str], ...] | None = None
    max_tokens: int | None = None
    min_tokens: int = 0
    ignore_eos: bool = False
    stop: tuple[str, ...] = ()
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    stream: bool = False
    include_usage: bool = False
    skip_special_tokens: bool = True


def parse_json(raw: bytes) -> dict[str, Any]:
    """The body as a JSON object."""
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        raise ApiError(
            "We could not parse the JSON body of your request. (HINT: This likely means you "
            "aren't using your HTTP library correctly. The OpenAI API expects a JSON payload.)"
        ) from None
    if not isinstance(body, dict):
        raise ApiError("The request body must be a JSON object.")
    return body


def parse_completion(body: dict[str, Any]) -> ApiRequest:
    prompt, ids = _prompt(body)
    return ApiRequest(
        prompt_param="prompt", prompt=prompt, prompt_ids=ids, **_common(body, "max_tokens")
    )


def parse_chat(body: dict[str, Any]) -> ApiRequest:
    if "max_completion_tokens" in body and body["max_completion_tokens"] is not None:
        cap = "max_completion_tokens"
    else:
        cap = "max_tokens"
    return ApiRequest(prompt_param="messages", messages=_messages(body), **_common(body, cap))


def _common(body: dict[str, Any], cap: str) -> dict[str, Any]:
    _refuse_unsupported(body)
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise invalid_type("model", "a string", model)
    out: dict[str, Any] = {"model": model}
    out["max_tokens"] = _int(body, cap, None, lo=1)
    out["min_tokens"] = _int(body, "min_tokens", 0, lo=0)
    if out["max_tokens"] is not None and out["min_tokens"] > out["max_tokens"]:
        raise invalid_value("min_tokens", f"must be <= {cap} ({out['max_tokens']}).")
    out["ignore_eos"] = _bool(body, "ignore_eos", False)
    out["stop"] = _stop(body)
    out["temperature"] = _num(body, "temperature", 1.0, 0.0, 2.0)
    out["top_p"] = _num(body, "top_p", 1.0, 0.0, 1.0)
    if out["top_p"] == 0:
        raise invalid_value("top_p", "must be > 0.")
    top_k = _int(body, "top_k", 0, lo=-1)
    out["top_k"] = 0 if top_k == -1 else top_k  # vLLM's -1: off
    out["min_p"] = _num(body, "min_p", 0.0, 0.0, 1.0)
    out["seed"] = _int(body, "seed", None)
    out["stream"] = _bool(body, "stream", False)
    out["include_usage"] = _stream_options(body, out["stream"])
    out["skip_special_tokens"] = _bool(body, "skip_special_tokens", True)
    return out


def _refuse_unsupported(body: dict[str, Any]) -> None:
    for name, default in UNSUPPORTED.items():
        value = body.get(name, default)
        if value is None or value == default or value == [] or value == {}:
            continue
        if name in ("n", "best_of") and not (
            isinstance(value, int) and not isinstance(value, bool)
        ):
            raise invalid_type(name, "an integer", value)
        raise unsupported(
            name,
            f"= {json.dumps(value)} is not supported by this server (only {json.dumps(default)}).",
        )
    fmt = body.get("response_format")
    if fmt is not None and not (isinstance(fmt, dict) and fmt.get("type", "text") == "text"):
        raise unsupported("response_format", "other than {'type': 'text'} is not supported.")


def _prompt(body: dict[str, Any]) -> tuple[str | None, tuple[int, ...] | None]:
    if "prompt" not in body or body["prompt"] is None:
        raise missing("prompt")
    p = body["prompt"]
    if isinstance(p, list) and p and all(isinstance(x, (str, list)) for x in p):
        if len(p) > 1:
            raise unsupported("prompt", "with more than one prompt is not supported (give one).")
        p = p[0]
    if isinstance(p, str):
        return p, None
    if isinstance(p, list) and all(isinstance(x, int) and not isinstance(x, bool) for x in p):
        if not p:
            raise invalid_value("prompt", "must not be empty.")
        return None, tuple(p)
    raise invalid_type("prompt", "a string, an array of strings or an array of token ids", p)


def _messages(body: dict[str, Any]) -> tuple[dict[str, str], ...]:
    if "messages" not in body or body["messages"] is None:
        raise missing("messages")
    msgs = body["messages"]
    if not isinstance(msgs, list):
        raise invalid_type("messages", "an array", msgs)
    if not msgs:
        raise invalid_value("messages", "must be a non-empty array.")
    return tuple(_message(m, f"messages[{i}]") for i, m in enumerate(msgs))


def _message(m: Any, where: str) -> dict[str, str]:
    if not isinstance(m, dict):
        raise invalid_type(where, "an object", m)
    role = m.get("role")
    if role is None:
        raise missing(f"{where}.role")
    if not isinstance(role, str):
        raise invalid_type(f"{where}.role", "a string", role)
    if role not in ROLES:
        raise invalid_value(f"{where}.role", f"must be one of {', '.join(ROLES)}; got '{role}'.")
    content = m.get("content", "")
    if content is None:
        content = ""
    if isinstance(content, list):  # content parts: only text
        texts = []
        for j, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "text":
                raise unsupported(
                    f"{where}.content[{j}]", "is not a text part; only text is supported."
                )
            if not isinstance(part.get("text"), str):
                raise invalid_type(f"{where}.content[{j}].text", "a string", part.get("text"))
            texts.append(part["text"])
        content = "".join(texts)
    if not isinstance(content, str):
        raise invalid_type(f"{where}.content", "a string or an array of text parts", content)
    return {"role": role, "content": content}


def _stop(body: dict[str, Any]) -> tuple[str, ...]:
    s = body.get("stop")
    if s is None:
        return ()
    if isinstance(s, str):
        s = [s]
    if not isinstance(s, list) or not all(isinstance(x, str) for x in s):
        raise invalid_type("stop", "a string or an array of strings", body.get("stop"))
    if any(not x for x in s):
        raise invalid_value("stop", "stop strings must not be empty.")
    return tuple(s)


def _stream_options(body: dict[str, Any], stream: bool) -> bool:
    opts = body.get("stream_options")
    if opts is None:
        return False
    if not stream:
        raise ApiError(
            "The 'stream_options' parameter is only allowed when 'stream' is enabled.",
            param="stream_options",
        )
    if not isinstance(opts, dict):
        raise invalid_type("stream_options", "an object", opts)
    return _bool(opts, "include_usage", False, "stream_options.include_usage")


def _int(body: dict[str, Any], name: str, default: Any, lo: int | None = None) -> Any:
    v = body.get(name)
    if v is None:
        return default
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    if not isinstance(v, int) or isinstance(v, bool):
        raise invalid_type(name, "an integer", v)
    if lo is not None and v < lo:
        raise invalid_value(
            name, f"integer below minimum value. Expected a value >= {lo}, but got {v} instead."
        )
    return v


def _num(body: dict[str, Any], name: str, default: float, lo: float, hi: float) -> float:
    v = body.get(name)
    if v is None:
        return default
    if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v):
        raise invalid_type(name, "a number", v)
    if not lo <= v <= hi:
        raise invalid_value(name, f"expected a value in [{lo:g}, {hi:g}], but got {v} instead.")
    return float(v)


def _bool(body: dict[str, Any], name: str, default: bool, param: str | None = None) -> bool:
    v = body.get(name)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise invalid_type(param or name, "a boolean", v)
    return v
