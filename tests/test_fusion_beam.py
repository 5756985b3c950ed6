"""Rank fusion as a Beam transform (streameval.beam.fusion): the rows of FuseRuns over TREC run files
equal streameval.fuse's on the same files (which tests/test_fusion.py checks against hand
computations and ranx), and a malformed line fails the pipeline naming it."""

from __future__ import annotations

import numpy as np
import pytest

beam = pytest.importorskip("apache_beam")
from apache_beam.testing.util import assert_that, equal_to  # noqa: E402

import streameval as se  # noqa: E402
from streameval.beam.fusion import FuseRuns, ReadTrecRunRows  # noqa: E402
from streameval.io import trec  # noqa: E402


def _write_runs(tmp_path, seed=11):
    """3 TREC runs of 10 queries (about 300 lines in all), documents differing between runs."""
    rng = np.random.default_rng(seed)
    paths = []
    for r in range(3):
        q, d, s = [], [], []
        for qi in range(10):
            docs = rng.choice(30, size=int(rng.integers(3, 15)), replace=False)
            q += [f"q{qi}"] * len(docs)
            d += [f"d{x}" for x in docs]
            s += (rng.permutation(1000)[:len(docs)] / 13.0).tolist()
        path = tmp_path / f"run{r}.txt"
        trec.write_run(path, trec.TrecRun(q, d, s, np.zeros(len(q), dtype=np.int64), f"r{r}"))
        paths.append(str(path))
    return paths


@pytest.mark.parametrize("method,norm,params", [("rrf", "min-max", {}), ("combmnz", "zmuv", {}),
                                                ("bordafuse", "borda", {}), ("wsum", "sum", {"weights": [1, 2, 3]})])
def test_fuse_runs_equals_the_library(tmp_path, method, norm, params):
    paths = _write_runs(tmp_path)
    lib = se.fuse(paths, method, norm, params=params)
    c = lib.columns
    want = list(zip(c.qid.tolist(), c.docno.tolist(), c.score.tolist(), c.rank.tolist()))
    with beam.Pipeline() as p:
        runs = [p | f"Read{i}" >> ReadTrecRunRows(path) for i, path in enumerate(paths)]
        got = tuple(runs) | FuseRuns(method, norm, params)
        assert_that(got, equal_to(want))


def test_malformed_line_fails_naming_it(tmp_path):
    paths = _write_runs(tmp_path)
    with open(paths[1], "a") as f:
        f.write("q1 Q0 dx 1 notanumber tag\n")
    with pytest.raises(Exception, match="notanumber"):
        with beam.Pipeline() as p:
            runs = [p | f"Read{i}" >> ReadTrecRunRows(path) for i, path in enumerate(paths)]
            _ = tuple(runs) | FuseRuns("rrf")


def test_names_checked_when_built():
    with pytest.raises(ValueError, match="closest: rrf"):
        FuseRuns("rfr")
    with pytest.raises(ValueError, match="2 weights for 3 runs"):
        with beam.Pipeline() as p:
            runs = [p | f"C{i}" >> beam.Create([("q", "a", 1.0)]) for i in range(3)]
            _ = tuple(runs) | FuseRuns("wsum", params={"weights": [1, 2]})
