"""Inputs loaded once per process, and the workload of one (rate, seed).

``DataSources`` owns what is expensive to load (the tokenized ShareGPT corpus, Azure traces) and
loads each on first use; one instance serves every run of a sweep. ``make_workload`` builds the
requests of one run config. For trace arrivals, ``rate`` is honoured by replaying the trace
``rate / native`` times as fast, where ``native`` is the mean rate of the arrival times the
workload uses at scale 1 (the window of the trace it replays, not the whole file).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

from experiments.config import DataConfig, RunConfig, WorkloadSpec
from experiments.errors import ConfigError
from experiments.length_predictor import build_predictor
from experiments.policy_config import PredictorConfig
from horizon.workload import (
    AzureTrace,
    TokenizedCorpus,
    Workload,
    build_workload,
    load_azure_trace,
    load_sharegpt,
    tokenize_corpus,
)


class DataSources:
    """The inputs of one ``DataConfig``, loaded lazily and kept for the instance's lifetime."""

    def __init__(self, data: DataConfig) -> None:
        self.data = data
        self._tokenized: TokenizedCorpus | None = None
        self._traces: dict[str, AzureTrace] = {}
        self._predictors: dict[str, object] = {}

    def tokenized(self) -> TokenizedCorpus:
        """The ShareGPT corpus's tokens, from ``data.token_cache`` (tokenised on first use).

        Raises:
            ConfigError: the ShareGPT file is missing or is not ShareGPT JSON.
        """
        if self._tokenized is None:
            path = self.data.sharegpt_path
            with _field_error("data.sharegpt_path", path or "(packaged)"):
                corpus = load_sharegpt(path)
            with _field_error("data.token_cache", self.data.token_cache):
                self._tokenized = tokenize_corpus(
                    corpus, self.data.token_cache, self.data.tokenizer
                )
        return self._tokenized

    def predictor(self, cfg: PredictorConfig, workload: WorkloadSpec) -> object:
        """The predictor of ``cfg`` for ``workload``'s split, built (and trained) once."""
        key = repr(
            (cfg, workload.split_seed, workload.split_test_fraction, workload.max_output_tokens)
        )
        if key not in self._predictors:
            tokenized = self.tokenized() if workload.source == "sharegpt" else None
            self._predictors[key] = build_predictor(cfg, workload, tokenized)
        return self._predictors[key]

    def trace(self, path: str) -> AzureTrace:
        """The Azure trace at ``path`` (a workload's ``trace_path``, in ``data.trace_dir``).

        Raises:
            ConfigError: the file is missing (naming ``data.trace_dir``) or malformed.
        """
        if path not in self._traces:
            if not Path(path).exists():
                raise ConfigError(
                    "data.trace_dir",
                    self.data.trace_dir,
                    f"no {Path(path).name} there (the Azure LLM inference 2023 traces: "
                    "data/AzureLLMInferenceTrace_{conv,code}.csv of Azure/AzurePublicDataset)",
                )
            with _field_error("workload.trace_path", path):
                self._traces[path] = load_azure_trace(path)
        return self._traces[path]


@contextmanager
def _field_error(field: str, value: object) -> Iterator[None]:
    """Re-raise a missing or malformed input file as a ``ConfigError`` naming ``field``."""
    try:
        yield
    except FileNotFoundError as e:
        raise ConfigError(field, value, f"no such file: {e.filename}") from None
    except (ValueError, UnicodeDecodeError) as e:
        if isinstance(e, ConfigError):
            raise
        problem = str(e).removeprefix(f"{value}: ").removeprefix(f"{value}, ")
        raise ConfigError(field, value, problem) from None


def make_workload(cfg: RunConfig, sources: DataSources) -> Workload:
    """The requests of ``cfg`` (its workload recipe at ``cfg.rate``, ``cfg.seed``).

    ``stats`` gains ``rate`` (asked), ``arrival_rate`` (realised: (n - 1) / span) and, for trace
    arrivals, ``trace_native_rate`` and ``trace_rate_scale``.
    """
    spec = cfg.workload
    wc = spec.workload_config(
        rate=cfg.rate,
        seed=cfg.seed,
        num_requests=cfg.num_requests,
        sharegpt_path=cfg.data.sharegpt_path,
        slo=cfg.slo.slo,
    )
    tokenized = sources.tokenized() if wc.source == "sharegpt" else None
    trace = sources.trace(wc.trace_path) if wc.trace_path is not None else None
    workload = build_workload(wc, tokenized, trace)
    extra: dict = {"rate": cfg.rate}
    if wc.arrival == "trace":
        native = _arrival_rate(workload)
        if not native > 0:
            raise ValueError(
                f"workload {spec.name!r} replays a trace: num_requests must be >= 2 to have a "
                f"rate to scale, got {cfg.num_requests}"
            )
        workload = build_workload(replace(wc, trace_rate_scale=cfg.rate / native), tokenized, trace)
        extra.update(trace_native_rate=native, trace_rate_scale=cfg.rate / native)
    extra["arrival_rate"] = _arrival_rate(workload)
    return replace(workload, stats={**workload.stats, **extra})


def _arrival_rate(workload: Workload) -> float:
    times = [r.arrival_time for r in workload.requests]
    span = times[-1] - times[0]
    return (len(times) - 1) / span if span > 0 else float("nan")
