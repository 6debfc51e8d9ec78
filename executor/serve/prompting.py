"""From a checked API request to what the engine takes: prompt ids and generation parameters,
refusing what could never run here (OpenAI's context-length error)."""

from __future__ import annotations

from executor.sampling import SamplingParams
from executor.serve.api_error import ApiError, invalid_value
from executor.serve.params import GenerationParams
from executor.serve.protocol import EngineHandle, TokenizerLike
from executor.serve.request_parsing import ApiRequest

SEED_RANGE = 2**62  # sampling seeds are int64 on the device; 0 means "derived per request"


def prompt_ids(req: ApiRequest, tokenizer: TokenizerLike, vocab_size: int) -> list[int]:
    """The prompt's token ids: a chat through the tokenizer's template, text encoded, ids
    checked against the vocabulary."""
    if req.messages is not None:
        text = tokenizer.apply_chat_template(list(req.messages), add_generation_prompt=True)
        ids = tokenizer.encode(text, add_special=False)
    elif req.prompt is not None:
        ids = tokenizer.encode(req.prompt, add_special=True)
    else:
        ids = list(req.prompt_ids or ())
        bad = [t for t in ids if not 0 <= t < vocab_size]
        if bad:
            raise invalid_value(
                "prompt", f"token id {bad[0]} is outside the vocabulary (0..{vocab_size - 1})."
            )
    if not ids:
        raise invalid_value(req.prompt_param, "the prompt is empty (no tokens).")
    return ids


def generation_params(req: ApiRequest, num_prompt: int, live: EngineHandle) -> GenerationParams:
    """The request's parameters; ``max_tokens`` defaults to what the model length and the KV
    pool leave.

    Raises:
        ApiError: prompt plus ``max_tokens`` exceed the model length or the KV pool (code
            ``context_length_exceeded``), or ``min_tokens`` exceeds the default ``max_tokens``.
    """
    cfg = live.config
    limit = min(cfg.max_model_len, live.num_blocks * cfg.block_size)
    max_tokens = req.max_tokens if req.max_tokens is not None else limit - num_prompt
    if max_tokens < 1 or live.never_fits(num_prompt, max_tokens):
        raise _too_long(req, num_prompt, max_tokens, limit)
    if req.min_tokens > max_tokens:
        raise invalid_value("min_tokens", f"must be <= max_tokens ({max_tokens}).")
    seed = 0 if req.seed is None else req.seed % SEED_RANGE + 1
    sampling = SamplingParams(req.temperature, req.top_k, req.top_p, req.min_p, seed)
    return GenerationParams(
        max_tokens=max_tokens,
        min_tokens=req.min_tokens,
        ignore_eos=req.ignore_eos,
        stop=req.stop,
        sampling=sampling,
        skip_special_tokens=req.skip_special_tokens,
    )


def _too_long(req: ApiRequest, num_prompt: int, max_tokens: int, limit: int) -> ApiError:
    where = "messages" if req.messages is not None else "prompt"
    given = req.max_tokens is not None and num_prompt < limit
    return ApiError(
        f"This model's maximum context length is {limit} tokens. However, you requested "
        f"{num_prompt + max(max_tokens, 0)} tokens ({num_prompt} in the {where}, "
        f"{max(max_tokens, 0)} in the completion). Please reduce the length of the {where} "
        "or completion.",
        param="max_tokens" if given else req.prompt_param,
        code="context_length_exceeded",
    )
