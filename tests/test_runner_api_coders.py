"""The batch job's pipeline as a runner receives it (Beam's runner API proto): coders every engine can
take, checked without an engine.

Prism (at the pinned Beam 2.62) executes a Flatten itself and, when an input's coder is not the
Flatten's output coder, rewrites that input's coder id into the output coder everywhere: the id of
Beam's pickled Python coder (shared by most collections) then became a key-value coder made of
itself, and building the job's first stage failed ("unknown coder urn key:
beam:coder:pickled_python:v1", the columnar engine's hot-query path and ``--complete``). A runner
builds a multimap side input itself, so its key and value coders must be standard ones. Both rules
are checked here for each kind of job the engine tier runs, on the runner API proto Beam sends.

Reference: the proto itself (``Pipeline.to_runner_api``), read with Beam's own protobuf classes.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from apache_beam.portability.api import beam_runner_api_pb2 as rp
from apache_beam.runners.runner import PipelineRunner

from streameval.jobs import batch, stream

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "data" / "sample"
IMPS = ["--impressions", str(SAMPLE / "impressions" / "letor_*.avro")]
JUDG = ["--judgments", str(SAMPLE / "judgments" / "letor_test_labels.avro")]
#: coders a runner decodes itself (Beam's standard coders that Prism 2.62 knows)
STANDARD = {"beam:coder:bytes:v1", "beam:coder:string_utf8:v1", "beam:coder:varint:v1", "beam:coder:double:v1",
            "beam:coder:bool:v1", "beam:coder:kv:v1", "beam:coder:iterable:v1", "beam:coder:length_prefix:v1"}

JOBS = {
    "ranking": [*IMPS, *JUDG, "--metrics", "ndcg@10,map,P@5"],
    "complete, hot queries, slices, window": [*IMPS, *JUDG, "--metrics", "ndcg@10,map", "--complete",
                                              "--hot-query-fraction", "0.01", "--slices", "campaign",
                                              "--slice-missing", "skip", "--window", "1d"],
    "online and ranking": [*IMPS, *JUDG, "--labels", "clicks", "--metrics", "ndcg@5,auc,gauc[user,impressions],clicks@10"],
    "bootstrap and comparisons": [*IMPS, *JUDG, "--metrics", "ndcg@10,map", "--ci", "bootstrap", "--replicates", "20",
                                  "--compare-baseline", "feature206"],
    "srm and clustered ctr": [*IMPS, *JUDG, "--metrics", "ndcg@10", "--expected-split",
                              "feature206=1,feature253=1", "--cluster", "request"],
    "records engine": [*IMPS, *JUDG, "--metrics", "ndcg@10,map", "--engine", "records"],
    "cuped": [*IMPS, *JUDG, "--metrics", "ndcg@10", "--cluster", "user", "--covariate", "attr:campaign",
              "--window", "1d"],
    "records engine, cuped": [*IMPS, *JUDG, "--metrics", "ndcg@10", "--cluster", "request", "--covariate",
                              "attr:campaign", "--engine", "records"],
}


class _Captured(Exception):
    pass


class ProtoRunner(PipelineRunner):
    """Keeps the pipeline's runner API proto and stops (nothing runs)."""

    proto = None

    def run_pipeline(self, pipeline, options):
        ProtoRunner.proto = pipeline.to_runner_api()
        raise _Captured()


def _proto(argv, tmp_path, job=batch) -> rp.Pipeline:
    ProtoRunner.proto = None
    try:
        job.main([*argv, "--output", str(tmp_path / "out"), "--quiet",
                  "--runner", f"{__name__}.ProtoRunner"])
    except _Captured:
        pass
    assert ProtoRunner.proto is not None, "the job built no pipeline"
    return ProtoRunner.proto


def _shape(coders, cid: str) -> tuple:
    c = coders[cid]
    return (c.spec.urn, tuple(_shape(coders, x) for x in c.component_coder_ids))


def _ids(coders, cid: str) -> set:
    """``cid`` and the ids of its components, recursively."""
    return {cid}.union(*(_ids(coders, x) for x in coders[cid].component_coder_ids))


def _urns(coders, cid: str) -> set:
    c = coders[cid]
    return {c.spec.urn}.union(*(_urns(coders, x) for x in c.component_coder_ids))


#: the streaming job on a runner other than the local one (the per-event engine), as on Prism
STREAM_JOBS = {
    "stream replay, window": ["--replay", *IMPS, *JUDG, "--window", "1d", "--metrics", "ndcg@10,map,P@5"],
    "stream replay, sessions": ["--replay", *IMPS, *JUDG, "--window", "session:30m", "--metrics", "ndcg@10"],
}


@pytest.mark.parametrize("name", [*JOBS, *STREAM_JOBS])
def test_flatten_inputs_have_the_output_coder_and_multimaps_standard_coders(name, tmp_path):
    comps = (_proto(JOBS[name], tmp_path) if name in JOBS else _proto(STREAM_JOBS[name], tmp_path, stream)).components
    coders, pcols = comps.coders, comps.pcollections
    flattens = multimaps = 0
    for t in comps.transforms.values():
        if t.spec.urn == "beam:transform:flatten:v1":
            flattens += 1
            out = pcols[next(iter(t.outputs.values()))].coder_id
            for pc in t.inputs.values():
                cid = pcols[pc].coder_id
                if _shape(coders, cid) == _shape(coders, out):
                    continue
                # a different coder: Prism replaces it by the output's wherever its id is used, so no
                # other collection may use that id, and the output coder may not be built on it
                others = sorted(p for p, c in pcols.items() if c.coder_id == cid and p not in t.inputs.values())
                assert not others and cid not in _ids(coders, out), \
                    f"{t.unique_name}: input {pc} is coded as {_shape(coders, cid)} (id {cid}, also used by " \
                    f"{others[:3]}), the output as {_shape(coders, out)}"
        elif t.spec.urn == "beam:transform:pardo:v1":
            payload = rp.ParDoPayload.FromString(t.spec.payload)
            for local, side in payload.side_inputs.items():
                if side.access_pattern.urn == "beam:side_input:multimap:v1":
                    multimaps += 1
                    used = _urns(coders, pcols[t.inputs[local]].coder_id)
                    assert used <= STANDARD, f"{t.unique_name}: multimap side input coded with {used - STANDARD}"
    assert flattens, "the job has no Flatten: the check matched nothing"
    if name in JOBS and not name.startswith("records engine"):
        assert multimaps, "the columnar job has no multimap side input: the check matched nothing"
