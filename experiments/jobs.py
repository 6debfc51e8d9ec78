"""One hydra job of an entry point, the same under every launcher (basic, joblib, submitit).

``run_job`` wraps an entry point's body:

* the directory the command was launched from goes first on ``sys.path``, as ``python -m``
  puts it in the launching process: a policy of one's own (``policy.name=mylab.mod:Class``)
  resolves in a launcher's fresh worker process exactly as in a serial run;
* a single run that fails on a user error prints one line, exits 2 and leaves no run
  directory behind (what hydra wrote there is removed);
* a job of a multirun that fails writes ``error.txt`` into its directory (the one line, or the
  traceback of a bug) and returns: every other job runs and keeps its results, and
  ``FailureReport`` names the failed jobs at the end and makes the command exit non-zero.
"""

from __future__ import annotations

import logging
import shutil
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from experiments.errors import exit_with, full_errors, is_user_error, one_line

log = logging.getLogger(__name__)
ERROR_FILE = "error.txt"


def run_job(dict_cfg: DictConfig, body: Callable[[Any, Path], Any]) -> Any:
    """``body(typed config, output dir)`` as one hydra job (see the module docstring)."""
    hc = HydraConfig.get()
    launch_dir = hc.runtime.cwd
    if launch_dir not in sys.path:
        sys.path.insert(0, launch_dir)
    out_dir = Path(hc.runtime.output_dir)
    multirun = hc.mode == RunMode.MULTIRUN
    try:
        return body(OmegaConf.to_object(dict_cfg), out_dir)
    except Exception as e:
        if multirun:
            _record_failure(out_dir, e)
            return None
        if not is_user_error(e) or full_errors():
            raise
        _remove_hydra_leftovers(out_dir)
        exit_with(e)


def _record_failure(out_dir: Path, e: Exception) -> None:
    text = one_line(e) if is_user_error(e) else traceback.format_exc()
    log.error("failed: %s", one_line(e))
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / ERROR_FILE).write_text(text.rstrip() + "\n")


def _remove_hydra_leftovers(out_dir: Path) -> None:
    """Remove a failed single run's directory if it holds only what hydra wrote (its config
    copies and log), so that no directory named like a run is left without a run in it."""
    hydra_files = {".hydra", f"{HydraConfig.get().job.name}.log"}
    if out_dir.is_dir() and {p.name for p in out_dir.iterdir()} <= hydra_files:
        logging.shutdown()  # closes the job's log file before its directory goes
        shutil.rmtree(out_dir, ignore_errors=True)


def failed_jobs(sweep_dir: str | Path) -> list[tuple[str, str]]:
    """``(job directory name, first line of its error)`` for every failed job of a multirun."""
    out = []
    for f in sorted(Path(sweep_dir).glob(f"*/{ERROR_FILE}")):
        lines = f.read_text().strip().splitlines()
        out.append((f.parent.name, lines[-1] if lines else ""))
    return out


class FailureReport(Callback):
    """At the end of a multirun: name every failed job, and exit 1 if any failed."""

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        failed = failed_jobs(sweep_dir)
        if not failed:
            return
        print(f"{len(failed)} job(s) of the sweep in {sweep_dir} failed:", file=sys.stderr)
        for name, line in failed:
            print(f"  {name}: {line}", file=sys.stderr)
        print(f"(each one's {ERROR_FILE} has the details)", file=sys.stderr, flush=True)
        raise SystemExit(1)
