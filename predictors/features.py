"""What the learned predictor sees of a request: the prompt as a server has it at arrival.

A prompt is a chat-templated history (``horizon.workload.chat_template``)::

    <|im_start|>user\\n u_1 <|im_end|>\\n <|im_start|>assistant\\n a_1 <|im_end|>\\n ...
    <|im_start|>user\\n u_k <|im_end|>\\n <|im_start|>assistant\\n          <- generate here

``parse_prompt`` recovers the turns from the ids (the special ids appear only at template
positions: turn texts are tokenised with special strings as plain text). ``prompt_record`` turns
one request into a text (the last user turn, decoded) and a row of numbers: lengths of the
prompt, of the last user turn and of every earlier turn (the previous reply's length is the
strongest single cue in multi-turn chat), the turn index, task cues read from the text
(code, lists, "explain", "translate", a requested word count, the script, ...), and how the
previous reply ended (inside an unclosed code block, mid-sentence: cut off, so "continue"
asks for more of it).

Nothing here reads ``true_output_tokens``.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np

from horizon.request import Request
from horizon.workload.chat_template import ChatTemplate

_NAN = math.nan


@dataclass(frozen=True)
class PromptView:
    """A prompt's turns: the last user turn's ids and the lengths of the earlier turns.

    ``user_ids`` is the whole prompt when the prompt is not chat-templated (then
    ``templated`` is False and the history is empty).
    """

    user_ids: tuple[int, ...]
    reply_lengths: tuple[int, ...]  # earlier assistant replies, oldest first
    user_lengths: tuple[int, ...]  # earlier user turns, oldest first
    prev_reply_ids: tuple[int, ...]  # the last earlier reply (empty on a first turn)
    templated: bool


def parse_prompt(ids: tuple[int, ...], template: ChatTemplate) -> PromptView:
    """Split a templated prompt into turns (see the module docstring).

    A prompt that does not end with the assistant header, or whose blocks do not parse, is
    returned whole as the user text (``templated=False``).
    """
    ah, uh, end = template.assistant_header, template.user_header, template.turn_end[0]
    n = len(ids)
    if n <= len(ah) or tuple(ids[n - len(ah) :]) != ah:
        return PromptView(tuple(ids), (), (), (), False)
    arr = np.asarray(ids, dtype=np.int64)
    starts = np.flatnonzero(arr[: n - len(ah)] == ah[0]).tolist()
    ends = np.flatnonzero(arr == end).tolist()
    blocks: list[tuple[str, int, int]] = []  # (role, text start, text end)
    j = 0
    for s in starts:
        while j < len(ends) and ends[j] < s:
            j += 1
        if j == len(ends):
            break
        head = tuple(ids[s : s + len(uh)])
        role = "user" if head == uh else "assistant" if tuple(ids[s : s + len(ah)]) == ah else ""
        if not role:
            return PromptView(tuple(ids), (), (), (), False)
        blocks.append((role, s + (len(uh) if role == "user" else len(ah)), ends[j]))
    if not blocks or blocks[-1][0] != "user":
        return PromptView(tuple(ids), (), (), (), False)
    role, a, b = blocks[-1]
    earlier = blocks[:-1]
    replies = [(x, y) for r, x, y in earlier if r == "assistant"]
    return PromptView(
        user_ids=tuple(ids[a:b]),
        reply_lengths=tuple(y - x for x, y in replies),
        user_lengths=tuple(y - x for r, x, y in earlier if r == "user"),
        prev_reply_ids=tuple(ids[replies[-1][0] : replies[-1][1]]) if replies else (),
        templated=True,
    )


# Task cues on the lower-cased last user turn: name -> pattern.
_CUES: dict[str, re.Pattern[str]] = {
    name: re.compile(pattern)
    for name, pattern in {
        "code": r"```|\bdef |\bclass |\bfunction\b|\bcode\b|\bscript\b|\bpython\b|\bjava"
        r"|\bsql\b|\bc\+\+|\bhtml\b|\bcss\b|\breact\b|\bapi\b|\bbug\b|\berror\b|[{};]\s*$",
        "list": r"\blist\b|\bbullet|\bsteps?\b|\bideas?\b|\btips\b|\bexamples?\b|\boutline"
        r"|\btable\b|\bpoints?\b",
        "explain": r"\bexplain|\bwhy\b|\bhow (do|does|can|to)\b|\bdescribe|\bdetail",
        "translate": r"\btranslat|\bin (english|chinese|korean|japanese|spanish|french|german)",
        "summarize": r"\bsummar|\btl;?dr|\bshorten|\bcondense",
        "write": r"\bwrite\b|\bessay|\barticle|\bstory|\bblog|\bpoem|\bletter\b|\bemail"
        r"|\bscript\b|\bspeech|\bcopy\b|\bdraft",
        "rewrite": r"\brewrite|\brephrase|\bparaphrase|\bproofread|\bimprove|\bedit\b|\bfix\b",
        "continue": r"^\s*(please\s+)?(continue|go on|keep going|more|next)\b",
        "short": r"\bbrief|\bshort\b|\bone (word|sentence|line)|\byes or no|\bconcise"
        r"|\bonly (answer|reply|respond|say)|\bjust (answer|reply|say)",
        "long": r"\bdetailed\b|\bcomprehensive|\bin depth|\bin-depth|\bexhaustive|\bfull\b"
        r"|\bcomplete\b|\blong\b",
        "question": r"\?\s*$",
        "greeting": r"^\s*(hi|hello|hey|thanks?|thank you|ok|okay|great|cool|nice)\b",
        "ack": r"\b(reply|respond|answer) (with )?[\"']?(ok|yes|understood|acknowledged)",
        "roleplay": r"\bact as\b|\bpretend|\byou are (a|an)\b|\bi want you to\b",
    }.items()
}
_COUNT = re.compile(
    r"(\d{1,5})\s*(-|to)?\s*(words?|characters?|sentences?|paragraphs?|lines?|bullets?|points?"
    r"|items?|examples?|questions?|ideas?|tips|steps?|names?|titles?|slides?|pages?|字)"
)
_DIGIT = re.compile(r"\d")
_LIST_ITEM = re.compile(r"^\s*(\d{1,3}[.)]|[-*\u2022])\s", re.M)
_ENDS_COMPLETE = re.compile(r"[.!?\u3002\uff01\uff1f:)\]`\"'*]\s*$")
_CONTINUE = re.compile(r"continu|go on|keep going|\bmore\b|\bnext\b|\brest\b|\bfinish")
_LONG_REPLY = 600  # tokens: replies longer than this were often cut off by the chat service
_PUNCT = re.compile(r"[^\w\s]")
_UNIT_TOKENS = {"word": 1.3, "char": 0.3, "sent": 25, "para": 90, "line": 12, "page": 500}
_SCRIPTS = {
    "cjk": re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff]"),
    "hangul": re.compile(r"[\uac00-\ud7af\u1100-\u11ff]"),
    "cyrillic": re.compile(r"[\u0400-\u04ff]"),
    "arabic": re.compile(r"[\u0600-\u06ff]"),
    "latin_ext": re.compile(r"[\u00c0-\u024f]"),
}

NUMERIC_FEATURES: tuple[str, ...] = (
    "log_prompt",
    "log_user",
    "turn_index",
    "templated",
    "n_replies",
    "log_prev_reply",
    "log_mean_reply",
    "log_max_reply",
    "log_prev_user",
    "log_history",
    "log_chars",
    "log_lines",
    "digit_frac",
    "punct_frac",
    "log_requested",
    "prev_unclosed_code",
    "prev_ends_complete",
    "log_prev_list_items",
    "log_prev_lines",
    "n_long_replies",
    "short_continue",
    "log_questions",
    "user_code_block",
    "log_user_list_items",
    "log_words",
    "repeats_prev_user",
    *(f"cue_{name}" for name in _CUES),
    *(f"script_{name}" for name in _SCRIPTS),
)


def _log(x: float) -> float:
    return math.log1p(x) if x == x else _NAN  # NaN stays NaN (HGB: "missing")


def requested_tokens(text: str) -> float:
    """A length asked for in the text ("500 words", "10 ideas"), in rough tokens; NaN if none."""
    best = _NAN
    for m in _COUNT.finditer(text):
        num, unit = int(m.group(1)), m.group(3)
        per = next((v for k, v in _UNIT_TOKENS.items() if unit.startswith(k)), 40.0)
        if unit == "字":
            per = 1.0
        est = min(num * per, 1e5)
        best = est if math.isnan(best) or est > best else best
    return best


def numeric_row(request: Request, view: PromptView, text: str, prev: str = "") -> list[float]:
    """The ``NUMERIC_FEATURES`` of one request (NaN where a feature does not apply).

    ``text``: the last user turn (decoded); ``prev``: the whole previous reply ("" if none).
    How the previous reply ended (inside an unclosed code block, mid-sentence) says whether it
    was cut off and the user now asks to continue it."""
    low = text.lower()
    replies, users = view.reply_lengths, view.user_lengths
    head = low[:2000]
    sample = text[:2000]
    n_sample = max(len(sample), 1)
    row = [
        math.log1p(request.num_prompt_tokens),
        math.log1p(len(view.user_ids)),
        float(request.turn_index),
        float(view.templated),
        float(len(replies)),
        _log(replies[-1]) if replies else _NAN,
        math.log1p(sum(replies) / len(replies)) if replies else _NAN,
        math.log1p(max(replies)) if replies else _NAN,
        _log(users[-1]) if users else _NAN,
        math.log1p(request.num_prompt_tokens - len(view.user_ids)),
        math.log1p(len(text)),
        math.log1p(text.count("\n")),
        len(_DIGIT.findall(sample)) / n_sample,
        len(_PUNCT.findall(sample)) / n_sample,
        _log(requested_tokens(head)),
    ]
    if replies:
        row += [
            float(prev.count("```") % 2 == 1),
            float(bool(_ENDS_COMPLETE.search(prev[-200:]))),
            math.log1p(len(_LIST_ITEM.findall(prev))),
            math.log1p(prev.count("\n")),
            float(sum(1 for x in replies if x > _LONG_REPLY)),
        ]
    else:
        row += [_NAN] * 5
    row += [
        float(len(view.user_ids) < 12 and bool(_CONTINUE.search(low))),
        math.log1p(text.count("?")),
        float("```" in text),
        math.log1p(len(_LIST_ITEM.findall(text))),
        math.log1p(len(text.split())),
        float(bool(users) and users[-1] == len(view.user_ids)),
    ]
    tail = low[-300:]
    for name, pat in _CUES.items():
        where = tail if name == "question" else head
        row.append(1.0 if pat.search(where) else 0.0)
    for pat in _SCRIPTS.values():
        row.append(len(pat.findall(sample)) / n_sample)
    return row


def text_of(ids: tuple[int, ...], tokenizer, head_chars: int, tail_chars: int) -> str:
    """Decoded text, keeping its start and end when long (instructions sit at either end)."""
    text = tokenizer.decode(list(ids))
    if len(text) > head_chars + tail_chars:
        text = text[:head_chars] + ("\n" + text[-tail_chars:] if tail_chars else "")
    return text


@dataclass(frozen=True, eq=False)
class Extracted:
    """Features of a batch of requests: a numeric matrix (``NUMERIC_FEATURES`` columns) and two
    texts per request, the last user turn and the previous reply ("" on a first turn)."""

    numeric: np.ndarray
    user_text: list[str]
    prev_text: list[str]


def extract(
    requests, tokenizer, template: ChatTemplate, head_chars: int, tail_chars: int, prev_chars: int
) -> Extracted:
    """``Extracted`` features of ``requests`` (a sequence of ``Request``)."""
    rows, users, prevs = [], [], []
    for r in requests:
        ids = r.prompt_token_ids if r.prompt_token_ids is not None else ()
        view = parse_prompt(tuple(ids), template)
        text = text_of(view.user_ids, tokenizer, head_chars, tail_chars) if ids else ""
        prev = tokenizer.decode(list(view.prev_reply_ids)) if view.prev_reply_ids else ""
        rows.append(numeric_row(r, view, text, prev))
        users.append(text)
        prevs.append(prev[:prev_chars])
    numeric = np.asarray(rows, dtype=np.float64).reshape(len(rows), len(NUMERIC_FEATURES))
    return Extracted(numeric, users, prevs)
