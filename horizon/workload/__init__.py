"""Workloads: ShareGPT conversations or Azure trace rows -> requests with arrival times.

Typical use (every artifact is an explicit path)::

    corpus = load_sharegpt()                              # packaged, truncated: 17,671 convs
    tokenized = tokenize_corpus(corpus, "runs/sharegpt_qwen.npz")   # ~12 s once, then ~0.3 s
    workload = build_workload(WorkloadConfig(num_requests=500, rate=4.0, seed=1), tokenized)

Pure Python + numpy at import time; the data and tokenizer packages are imported only when a
loader needs them.
"""

from horizon.workload import arrivals, patterns
from horizon.workload.arrivals import gamma, poisson, replay
from horizon.workload.azure_trace import AzureTrace, load_azure_trace
from horizon.workload.builder import Workload, build_workload
from horizon.workload.chat_template import ChatTemplate
from horizon.workload.config import ARRIVALS, MODES, SOURCES, WorkloadConfig
from horizon.workload.filters import DROP_REASONS, LengthFilter
from horizon.workload.hash_trace import load_hash_trace
from horizon.workload.patterns import RatePattern
from horizon.workload.sessions import Session, SessionConfig, build_sessions, session_requests
from horizon.workload.shared_prefix import (
    GROUP_POPULARITIES,
    SharedPrefixConfig,
    build_shared_prefix,
)
from horizon.workload.sharegpt import ShareGPTCorpus, load_sharegpt
from horizon.workload.tokenized import (
    DEFAULT_TOKENIZER,
    TokenizedCorpus,
    encode_text,
    load_tokenizer,
    tokenize_corpus,
)

__all__ = [
    "ARRIVALS",
    "DEFAULT_TOKENIZER",
    "DROP_REASONS",
    "GROUP_POPULARITIES",
    "MODES",
    "SOURCES",
    "AzureTrace",
    "ChatTemplate",
    "LengthFilter",
    "RatePattern",
    "Session",
    "SessionConfig",
    "ShareGPTCorpus",
    "SharedPrefixConfig",
    "TokenizedCorpus",
    "Workload",
    "WorkloadConfig",
    "arrivals",
    "build_sessions",
    "build_shared_prefix",
    "build_workload",
    "encode_text",
    "gamma",
    "load_azure_trace",
    "load_hash_trace",
    "load_sharegpt",
    "load_tokenizer",
    "patterns",
    "poisson",
    "replay",
    "session_requests",
    "tokenize_corpus",
]
