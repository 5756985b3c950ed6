"""The running totals of a stream job on Flink, read from Flink's REST API while the job runs (Beam's
Flink job server reports a job's metrics only when it ends): ``streameval.beam.flink_rest``.

The REST answers are a recording of a real cluster (tests/data/flink_rest/running_watch_job.json says
which job), served here by a small HTTP server on 127.0.0.1."""

from __future__ import annotations

import copy
import json
import urllib.parse
from pathlib import Path

import pytest
from apache_beam.options.pipeline_options import PipelineOptions

from streameval.beam import accounting, flink_rest
from streameval.beam.streaming.console import running_totals_line

from .fake_rest import serve_json

RECORDED = json.loads((Path(__file__).parent / "data" / "flink_rest" / "running_watch_job.json").read_text())


class _Flink:
    """Serves a recording's answers: ``/jobs/overview``, ``/jobs/ID``, ``/jobs/ID/accumulators`` and each
    vertex's ``/subtasks/metrics`` (the list, or ``?agg=sum&get=...``: the sums of the ids asked)."""

    def __init__(self, rec: dict):
        self.rec = rec
        self.asked: list = []
        self.server = serve_json(self.answer)

    @property
    def options(self) -> PipelineOptions:
        return PipelineOptions(["--flink_master", f"127.0.0.1:{self.server.server_address[1]}",
                                "--job_endpoint", "127.0.0.1:1", "--job_name", self.rec["job"]["name"]])

    def answer(self, path: str):
        self.asked.append(path)
        jid = self.rec["job"]["jid"]
        url = urllib.parse.urlsplit(path)
        if url.path == "/jobs/overview":
            return self.rec["overview"]
        if url.path == f"/jobs/{jid}":
            return self.rec["job"]
        if url.path == f"/jobs/{jid}/accumulators":
            return self.rec["accumulators"]
        for vid, v in self.rec["vertices"].items():
            if url.path == f"/jobs/{jid}/vertices/{vid}/subtasks/metrics":
                query = urllib.parse.parse_qs(url.query)
                if not query:
                    return [{"id": m} for m in v["metrics"]]
                assert query["agg"] == ["sum"]
                return [{"id": m, "sum": v["sums"][m]} for m in query["get"][0].split(",") if m in v["sums"]]
        return None

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def flink():
    fake = _Flink(copy.deepcopy(RECORDED))
    yield fake
    fake.close()


def test_the_counters_of_a_running_job_come_from_its_vertices_and_its_finished_tasks(flink):
    """The recorded job had read 5 files of 10,000 impressions (one a copy of another, read after its
    windows had closed: 10,000 late) and, in a task that had finished, the 4,000 judgments of its
    judgment file: the running vertices' metrics (summed over subtasks, ``late:impression`` given back
    its colon) and the finished task's from the accumulators; the decoders' namespace is not ours."""
    got = flink_rest.running_counters(flink.options, RECORDED["job"]["name"])
    assert got["impressions_read"] == 50_000 and got["impressions_valid"] == 50_000
    assert got["late:impression"] == 10_000
    assert got["judgments_read"] == got["judgments_valid"] == got["judgments_accepted"] == 4_000
    assert not [k for k in got if "decoders" in k or "datafusion" in k]
    # the windows closed so far: their requests' impressions counted once each, in one fate
    assert got["impressions_ranked"] + got["impressions_unjudged"] == got["impressions_accepted"]
    assert running_totals_line(got) == ("running totals: impressions read 50000, valid 50000, late 10000, "
                                        "rejected 0; judgments read 4000, valid 4000, late 0, rejected 0")


def test_a_running_tasks_accumulators_do_not_count_twice(flink):
    """Were Flink to report a running task's accumulators too, its transforms' counters (served live
    by its vertex) are not added again; a rejection's reason comes back under its family's prefix."""
    infos = json.loads(flink.rec["accumulators"]["user-task-accumulators"][0]["value"])
    read_blocks = next(m.split("}.", 1)[1].split("_metric_")[0] for v in flink.rec["vertices"].values()
                       for m in v["metrics"] if "_ReadBlocks-" in m and "_metric_" in m)
    infos["metrics"]["attempted"].append({"urn": "beam:metric:user:sum_int64:v1", "type": "beam:metrics:sum_int64:v1",
                                          "payload": "0IYD",  # 50,000 as a varint
                                          "labels": {"NAMESPACE": "streameval", "NAME": "impressions_read",
                                                     "PTRANSFORM": read_blocks}})
    flink.rec["accumulators"]["user-task-accumulators"][0]["value"] = json.dumps(infos)
    vid = next(k for k, v in flink.rec["vertices"].items() if any("impressions_read" in m for m in v["metrics"]))
    scope = next(m for m in flink.rec["vertices"][vid]["metrics"] if m.endswith("impressions_read")).split(".")[0]
    name = f"{scope}.streameval_rejected_impression_missing_field_query_id"
    flink.rec["vertices"][vid]["metrics"].append(name)
    flink.rec["vertices"][vid]["sums"][name] = 3.0
    got = flink_rest.running_counters(flink.options, RECORDED["job"]["name"])
    assert got["impressions_read"] == 50_000
    assert got["rejected:impression:missing_field_query_id"] == 3
    assert "rejected 3" in running_totals_line(got)


def test_no_single_running_job_of_the_name_or_no_cluster_gives_none(flink):
    name = RECORDED["job"]["name"]
    assert flink_rest.running_counters(flink.options, "streameval-another") is None
    flink.rec["overview"]["jobs"].append({"jid": "x", "name": name, "state": "RUNNING"})
    assert flink_rest.running_counters(flink.options, name) is None  # two of that name: which one?
    assert flink_rest.running_counters(PipelineOptions([]), name) is None
    assert flink_rest.running_counters(PipelineOptions(["--flink_master", "[auto]"]), name) is None
    assert flink_rest.running_counters(PipelineOptions(["--flink_master", "127.0.0.1:1"]), name) is None


def test_the_launcher_takes_flinks_counters_while_the_job_service_has_none(flink, monkeypatch):
    """``accounting.running_counters``: the job service's counters when it has some (Prism reports
    them while a job runs), else Flink's."""
    monkeypatch.setattr(accounting, "job_counters", lambda result, namespace, options=None: {})
    got = accounting.running_counters(None, options=flink.options)
    assert got["impressions_read"] == 50_000
    monkeypatch.setattr(accounting, "job_counters", lambda result, namespace, options=None: {"impressions_read": 7})
    assert accounting.running_counters(None, options=flink.options) == {"impressions_read": 7}


def test_served_names_map_back_to_the_counters():
    assert flink_rest.flink_name("late:impression") == "late_impression"
    assert flink_rest.flink_name("a b,c.d:e") == "a_b_c_d_e"
    assert flink_rest._counter_name("late_impression") == "late:impression"
    assert flink_rest._counter_name("impressions_read") == "impressions_read"
    assert flink_rest._counter_name("element_impressions_clean") == "element_impressions:clean"
    assert flink_rest._counter_name("rejected_judgment_bad_grade") == "rejected:judgment:bad_grade"
    assert flink_rest._counter_name("something_else") == "something_else"


def test_a_failed_job_says_when_no_taskmanager_is_left():
    """A batch job whose TaskManagers all exited (each exits when out of memory) fails with Flink's bare
    slot-request timeout; the launcher adds that the cluster has no TaskManager left, from Flink's
    ``/overview``, and nothing when some are left, no cluster is named or none answers."""
    left = {"n": 0}
    server = serve_json(lambda path: {"taskmanagers": left["n"], "slots-total": 0} if path == "/overview" else None)
    try:
        opts = PipelineOptions(["--flink_master", f"127.0.0.1:{server.server_address[1]}"])
        hint = flink_rest.no_taskmanager_hint(opts)
        assert hint.startswith(f"; the Flink cluster at http://127.0.0.1:{server.server_address[1]} has no "
                               "TaskManager left"), hint
        assert "OutOfMemoryError" in hint
        # the jobs' failure line: the runner's reason, then the hint
        from streameval.beam.sources import failure_reason

        timeout = RuntimeError("java.util.concurrent.TimeoutException: Timeout has occurred: 60000 ms")
        assert failure_reason(timeout, opts) == f"{failure_reason(timeout)}{hint}"
        left["n"] = 2
        assert flink_rest.no_taskmanager_hint(opts) == ""
    finally:
        server.shutdown()
        server.server_close()
    assert flink_rest.no_taskmanager_hint(PipelineOptions([])) == ""
    assert flink_rest.no_taskmanager_hint(PipelineOptions(["--flink_master", "127.0.0.1:1"])) == ""
