"""Issue 42: every name users type.

Unknown names: one line naming the three closest accepted names (difflib), in the library
(ValueError) and on the command line (exit 2), not the ~900-character list of every form.
"""

from __future__ import annotations

import difflib

import pytest

import streameval as se
from streameval import cli
from streameval.metrics.names import MetricNameError, parse_metric
from streameval.metrics.online import parse_online_metric
from pipelines import batch


def _picks(message: str) -> list[str]:
    assert "\n" not in message and len(message) < 200, message
    return message.split("; closest accepted names: ")[1].split(" (every name")[0].split(", ")


@pytest.mark.parametrize("typed,expected", [
    ("ndgc@10", "ndcg@10"), ("ndgc_cut_10", "ndcg_cut_10"), ("nDGC@10", "ndcg@10"), ("mapp", "map"),
    ("precison@5", "precision@5"), ("recal@100", "recall@100"), ("iprec_at_recal.0.5", "iprec_at_recall.0.5"),
    ("bpre", "bpref"), ("RR(rell=2)", None), ("nDCGG(dcg='exp-log2')@10", "nDCG(dcg='exp-log2')@10"),
])
def test_library_unknown_name_names_three_closest(typed, expected):
    if expected is None:  # a known measure with an unknown parameter: its own one-line message
        with pytest.raises(ValueError, match="takes no parameter 'rell'"):
            se.evaluate({"q": {"a": 1}}, {"q": {"a": 1.0}}, typed)
        return
    with pytest.raises(ValueError) as e:
        se.evaluate({"q": {"a": 1}}, {"q": {"a": 1.0}}, typed)
    assert isinstance(e.value, MetricNameError)
    message = str(e.value)
    assert message.startswith(f"unknown metric {typed!r}") or f"unknown ir_measures measure" in message
    picks = _picks(message)
    assert len(picks) == 3 and expected in picks
    # the picks are accepted names, and the first is difflib's closest of them (case ignored)
    for p in picks:
        assert parse_metric(p)
    assert picks[0] == expected
    assert difflib.SequenceMatcher(None, typed.lower(), expected.lower()).ratio() >= max(
        difflib.SequenceMatcher(None, typed.lower(), p.lower()).ratio() for p in picks)


def test_online_unknown_name_names_three_closest():
    with pytest.raises(MetricNameError) as e:
        parse_online_metric("ctrr")
    picks = _picks(str(e.value))
    assert len(picks) == 3 and picks[0] == "ctr"
    assert all(parse_online_metric(p) for p in picks)


def test_cli_trec_eval_unknown_name(tmp_path, capsys):
    (tmp_path / "qrels").write_text("q1 0 d1 1\n")
    (tmp_path / "run").write_text("q1 Q0 d1 1 1.0 t\n")
    assert cli.main(["trec-eval", "-m", "ndgc_cut_10", str(tmp_path / "qrels"), str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("streameval trec-eval: unknown metric 'ndgc_cut_10'")
    assert _picks(err)[0] == "ndcg_cut_10" and len(_picks(err)) == 3


def test_cli_batch_unknown_ranking_or_online_name(tmp_path, capsys):
    """The batch job's --metrics takes ranking and online names: the closest of both kinds."""
    for typed, first in (("ndgc@10", "ndcg@10"), ("gacu[user]", "gauc[user]")):
        assert batch.main(["--impressions", "x.avro", "--metrics", f"map,{typed}", "--judgments", "y.avro",
                           "--output", str(tmp_path / "o")]) == 2
        err = capsys.readouterr().err.strip().splitlines()[-1]
        assert f"unknown metric {typed!r}" in err
        picks = _picks(err)
        assert len(picks) == 3 and picks[0] == first
