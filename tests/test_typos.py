"""Issue 41, item 1: a ``--slices`` attribute that no record has (a typo: ``campain``) put every
request in ``campain=(missing)`` and exited 0. Both jobs now exit 2 after the run with one line
naming the closest attributes the records have. The logs are built here, so which attributes they
have is known by construction."""

from __future__ import annotations

import pytest

from streameval.jobs import batch
from streameval.jobs import stream as stream_cli
from streameval.beam.keys import parse_slices, slice_part
from streameval.io import avro

HOUR = 3_600_000_000


def _log(path):
    imps = []
    for q in range(20):
        for system in ("A", "B"):
            req = f"{system}{q}"
            for pos in range(1, 4):
                imps.append({"event_id": f"{req}/{pos}", "request_id": req, "query_id": f"q{q}", "user_id": None,
                             "system_id": system, "item_id": f"d{pos}", "position": pos, "score": float(10 - pos),
                             "clicked": pos == 1 and q % 3 == 0, "timestamp": (q % 2) * HOUR + q,
                             "propensity": None, "attributes": {"campaign": "men" if q % 2 else "women",
                                                                "device": "pc"}})
    avro.write_records(path, "impression", imps)
    return path


@pytest.mark.parametrize("job,missing", [("batch", "show"), ("batch", "skip"), ("stream", None)])
def test_a_slice_attribute_no_record_has_is_exit_2(tmp_path, capsys, job, missing):
    """(--slice-missing is the batch job's: the stream refuses it as an unknown option)"""
    imps = _log(tmp_path / "imps.avro")
    common = ["--impressions", str(imps), "--metrics", "ctr", "--window", "1h", "--quiet",
              *(["--slice-missing", missing] if missing else [])]
    main = batch.main if job == "batch" else (lambda argv: stream_cli.main(["--replay", *argv]))
    capsys.readouterr()
    assert main([*common, "--slices", "campain", "--output", str(tmp_path / "typo")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    said = [line for line in err if line.startswith("error: --slices")]
    assert said == ["error: --slices: no record has the attribute 'campain' (every request is in "
                    "campain=(missing)); closest attributes the first records have: campaign, device"], err
    # the attributes the records have are no typo, alone or combined
    assert main([*common, "--slices", "campaign", "--slices", "campaign+device",
                 "--output", str(tmp_path / "ok")]) == 0


def test_attributes_without_values_reads_escaped_labels():
    """A value written ``(missing)`` (escaped ``\\(missing)``) is a present value; ``a,b``-style
    attribute names are matched escaped."""
    from streameval.beam.keys import attributes_without_values

    specs = parse_slices(["campain", "campaign,dev=ice"])
    labels = ["all", slice_part("campain", None), ",".join([slice_part("campaign", "(missing)"),
                                                            slice_part("dev=ice", None)])]
    assert attributes_without_values(specs, labels) == ["campain", "dev=ice"]
    labels.append(",".join([slice_part("campaign", "men"), slice_part("dev=ice", "pc")]))
    assert attributes_without_values(specs, labels) == ["campain"]


def test_names_without_rows_in_any_spelling_and_derived_rows():
    """A metric has rows when a row names it in any spelling (nDCG@10 for ndcg@10) or when its rows
    are derived ones (interleaving's ``interleaving:wins``); auc, of which no row is here, has none."""
    from streameval.io.selection import names_without_rows

    rows = [{"metric": "nDCG@10"}, {"metric": "interleaving:wins"}, {"metric": "ctr"}]
    assert names_without_rows(["ndcg_cut_10", "interleaving", "auc", "ctr", "AP"], rows) == ["auc", "AP"]
