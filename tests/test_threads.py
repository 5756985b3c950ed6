"""ThreadedDoFn: work on a pool of threads, outputs and counters handed to Beam on the runner's thread."""

import threading

import apache_beam as beam
import pytest
from apache_beam import pvalue
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.util import assert_that, equal_to

from streameval.beam.threads import ThreadedDoFn, counter

NS = "test_threads"


class _Work(ThreadedDoFn):
    def __init__(self, threads, fail_on=None):
        self.threads = threads
        self.fail_on = fail_on
        self.summed = counter(NS, "summed")
        self.elements = counter(NS, "elements")

    def work(self, x):
        if x == self.fail_on:
            raise ValueError(f"element {x}")
        self.summed.inc(x)
        self.elements.inc()
        yield (x, threading.current_thread().name.startswith("streameval-work"))
        if x % 3 == 0:
            yield pvalue.TaggedOutput("threes", x)


def _run(threads, n=60, fail_on=None):
    """Counters of a job of ``n`` elements; its outputs are asserted in the job."""
    p = beam.Pipeline(options=PipelineOptions(["--runner", "apache_beam.runners.portability.fn_api_runner.FnApiRunner"]))
    outs = (p | beam.Create(list(range(n))) | beam.Reshuffle()
            | beam.ParDo(_Work(threads, fail_on)).with_outputs("threes", main="main"))
    # every output arrives, once, and the work ran on pool threads exactly when threads > 1
    assert_that(outs.main, equal_to([(x, threads > 1) for x in range(n)]), label="main")
    assert_that(outs.threes, equal_to(list(range(0, n, 3))), label="threes")
    result = p.run()
    result.wait_until_finish()
    return {c.key.metric.name: c.committed for c in result.metrics().query(MetricsFilter().with_namespace(NS))["counters"]}


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_every_output_and_count_arrives(threads):
    # counted on pool threads, applied on the runner's: none lost (0 + 1 + ... + 59 = 1770)
    assert _run(threads) == {"summed": 1770, "elements": 60}


def test_an_error_in_the_work_fails_the_job():
    with pytest.raises(Exception, match="element 17"):
        _run(2, fail_on=17)
