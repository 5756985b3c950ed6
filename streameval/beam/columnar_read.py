"""Stage 1 of the columnar engine (:mod:`streameval.beam.columnar`): Avro blocks read, validated and
split into shards, one element per (block, shard). Parquet files (``input_format``, or their
extension) are read row group by row group and converted with ``convert table``'s rules
(:mod:`streameval.io.parquet_blocks`), then validated and split as Avro blocks are."""

from __future__ import annotations

import itertools
import os

import apache_beam as beam
import numpy as np
from apache_beam import pvalue

from ..io import avro, dwell, records
from ..io import counters as cn
from ..io.counters import DECODER_NAMESPACE, NAMESPACE
from ..io.dead_letters import dead_letter
from .columnar_columns import (_HELD, IMPRESSION_FIELDS, SHARDS, _judgment_records, _no_nul, _nonempty, _shards_of,
                               _split, _take, columns_records, impression_columns, impression_columns_arrow,
                               judgment_columns, judgment_columns_arrow)
from .counts_as_data import COUNTS, counts_tags
from .sources import UNREADABLE_PARQUET, read_avro_blocks, read_parquet_blocks, unreadable_letter
from .threads import ThreadedDoFn, _collect, _pool, counter
from .transforms import reason_key


#: decoders of local Avro files: Apache DataFusion to Arrow columns (:mod:`streameval.io.arrow_avro`;
#: fastavro for any file or rest of a file it does not take) or fastavro's dicts only
from .arguments import DECODERS  # noqa: E402  (the command line's choices, Beam-free)
# DECODER_NAMESPACE (streameval.io.counters): the counters ``<decoders>:<path>`` (1 per input file): the
# decoders that gave the file's records (apart from the records' counters: how a file was read is not what it holds)


def default_decoder() -> str:
    """``"datafusion"`` when datafusion and pyarrow import, else ``"fastavro"``."""
    from ..io import arrow_avro

    return "datafusion" if arrow_avro.available() else "fastavro"


# --------------------------------------------------------------------------------------------
# stage 1: read, validate, shard

class _ReadColumns(ThreadedDoFn):
    kind = ""
    #: string columns whose runs of equal values are encoded between stages (see freeze)
    runs: tuple = ()

    def __init__(self, shards: int, grade_range=None, decoder: str = "datafusion", hold: bool = False,
                 threads: int = 1, time_range=None, input_format: str = "auto", table_options=None):
        if decoder not in DECODERS:
            raise ValueError(f"decoder must be one of {DECODERS}")
        from ..io.parquet_blocks import is_parquet

        is_parquet("", input_format)  # checks it
        self.input_format = input_format
        self.table_options = table_options  # a parquet_blocks.TableOptions (None: no mapping)
        self.threads = int(threads)
        self.hold = hold
        self.shards = shards
        self.decoder = decoder
        self.grade_range = records.as_grade_range(grade_range)
        # the impressions' event times: the representable ones, narrowed by --event-time-range
        lo, hi = time_range if time_range is not None else (records.EVENT_TIME_MIN, records.EVENT_TIME_MAX)
        self.time_range = time_range
        self.ts_lo, self.ts_hi = max(int(lo), records.EVENT_TIME_MIN), min(int(hi), records.EVENT_TIME_MAX)
        self.read = counter(NAMESPACE, cn.read(self.kind))
        self.valid = counter(NAMESPACE, cn.valid(self.kind))
        self.unreadable = counter(NAMESPACE, cn.unreadable_files(self.kind))

    #: with :meth:`start_early`: the key prefix of this DoFn's early work in ``_HELD``
    early = None

    def start_early(self, paths, token: str) -> None:
        """Start this DoFn's work on ``paths`` now, on its pool of threads, while Beam still builds
        and starts the pipeline (about 1 s of start-up in which one core waits); ``process`` then
        takes each path's finished work (outputs and counter increments, as :meth:`work` gave
        them on the pool) instead of starting it. Only for Beam's in-process local runner with
        held values (the results stay in this process's ``_HELD``, under ``early:<token>:<path>``,
        dropped by ``release_held``) and ``threads`` > 1. A path whose early work is not there
        (another process, released, a path given twice) is worked on as usual."""
        self.early = token
        pool = _pool(self.threads)
        for path in paths:
            key = f"early:{token}:{path}"
            if key not in _HELD:
                _HELD[key] = pool.submit(_collect, self.work, (path,))

    def process(self, element, window=beam.DoFn.WindowParam, timestamp=beam.DoFn.TimestampParam):
        future = _HELD.pop(f"early:{self.early}:{element}", None) if self.early is not None else None
        if future is None:
            yield from self._submit((element,), window, timestamp)
            return
        pending = self._pending  # as ThreadedDoFn._submit, with the work already submitted
        pending.append((future, window, timestamp))
        while pending and (pending[0][0].done() or len(pending) > self.threads):
            yield from self._finished(*pending.popleft())

    def work(self, path):
        from ..io.parquet_blocks import is_parquet

        if is_parquet(path, self.input_format):
            yield from self._parquet(path)
            return
        n = 0
        used = set()  # the decoders that gave this file's records (counter decoder:<names>:<path>)
        try:
            for recs in read_avro_blocks(path, self.kind, self.decoder):
                if isinstance(recs, list):
                    used.add("fastavro")
                    self.read.inc(len(recs))
                    n += len(recs)
                    yield from self._block(recs, path)
                else:  # an Arrow table (arrow_avro.read_tables)
                    used.add("datafusion")
                    self.read.inc(recs.num_rows)
                    n += recs.num_rows
                    yield from self._table(recs, path)
        except avro.AvroInputError as e:  # damaged content: the records before it and a dead letter
            # (a file the environment does not deliver raises InputUnavailableError: the bundle fails)
            self.unreadable.inc()
            yield pvalue.TaggedOutput("dead_letters", unreadable_letter(path, f"{self.kind}s", e, n))
        counter(DECODER_NAMESPACE, cn.decoder(used, path)).inc()

    def _parquet(self, path):
        """The blocks of a Parquet file: its conversion's dead letters (counted as rejected), then
        its rows as :meth:`_table` and :meth:`_block` take Avro's; a rejected row's ``source`` is
        ``path:row N``. Damaged bytes: the rows before and one dead letter."""
        from ..io.parquet_blocks import ParquetInputError

        n = 0
        try:
            for block in read_parquet_blocks(path, f"{self.kind}s", self.table_options):
                self.read.inc(block.n)
                n += block.n
                for letter in block.dead:
                    counter(NAMESPACE, cn.rejected(self.kind, reason_key(letter['reason']))).inc()
                    yield pvalue.TaggedOutput("dead_letters", letter)
                if len(block.rows):
                    rows = block.rows
                    yield from self._table(block.table, path, block.attributes, lambda i: f"{path}:row {rows[i] + 1}")
                if block.rescued:
                    rescued = block.rescued
                    yield from self._block([r for _, r in rescued], path, lambda i: f"{path}:row {rescued[i][0] + 1}")
        except ParquetInputError as e:
            self.unreadable.inc()
            yield pvalue.TaggedOutput("dead_letters", unreadable_letter(path, f"{self.kind}s", e, n,
                                                                        UNREADABLE_PARQUET))
        counter(DECODER_NAMESPACE, cn.decoder_parquet(path)).inc()

    def _finish(self, recs, chunk, ok, bad, check, shards, path, where=None):
        """Dead letters of the ``bad`` rows the record check rejects (``source``: their file
        ``path``, or ``where(row)``), then the valid rows' columns split by shard."""
        dead = []
        if len(bad):
            passed, dead = self._reject(recs, bad, check, path, where)
            ok[passed] = True
        yield from dead
        if not ok.all():
            chunk = _take(chunk, ok)
        self.valid.inc(chunk["n"])
        self.passed(chunk)
        yield from _split(chunk, shards(chunk), self.runs, self.hold)

    def passed(self, chunk: dict) -> None:
        """Called with the columns of each block's valid rows before they are split by shard (a
        subclass's look at them, as the stream's reader takes their windows); nothing here."""

    def _reject(self, recs, rows, check, path, where=None):
        """Run the record check on ``rows`` (read from ``path``; ``where(row)`` names a row's
        place): (rows that pass, dead letters)."""
        passed, dead = [], []
        for i in rows:
            reason = check(recs[i])
            if reason is None:
                passed.append(i)
                continue
            counter(NAMESPACE, cn.rejected(self.kind, reason_key(reason))).inc()
            dead.append(pvalue.TaggedOutput("dead_letters", dead_letter(str(path) if where is None else where(i),
                                                                        recs[i], reason)))
        return passed, dead


class _ReadImpressionColumns(_ReadColumns):
    kind = "impression"
    runs = ("request_id", "query_id", "user_id", "system_id", "attributes")  # a request's records are adjacent

    def _screen(self, chunk, score_ok, prop_ok) -> np.ndarray:
        """Rows the vectorised screen clears (the others go through the record check, which decides
        and gives the reason): the ranges are :mod:`streameval.io.records`'."""
        pos = chunk["position"]
        ts = chunk["timestamp"]
        ok = (pos >= 1) & (pos <= records.AVRO_INT_MAX) & (ts >= self.ts_lo) & (ts <= self.ts_hi)
        for f in records.NONEMPTY_FIELDS["impression"]:
            ok &= _nonempty(chunk[f])
        for f in records.ID_FIELDS["impression"]:
            ok &= _no_nul(chunk[f])
        return ok & score_ok & prop_ok

    def _check(self, rec):
        return records.check_impression(rec, self.time_range)

    def _shards(self, chunk):
        return _shards_of(chunk["system_id"], chunk["request_id"], self.shards)

    def _block(self, recs, path, where=None):
        nulls: dict = {}
        chunk = impression_columns(recs, nulls)
        # NaN is null (valid) or NaN (not): when the NaNs are as many as the nulls, all are nulls
        fine = {}
        for f in ("score", "propensity"):
            v = chunk[f]
            nan = np.isnan(v)
            n_nan = int(nan.sum())
            fine[f] = np.isfinite(v) if f == "score" else (v > 0) & (v <= 1)
            if n_nan and n_nan == nulls[f]:
                fine[f] |= nan
        ok = self._screen(chunk, fine["score"], fine["propensity"]) & nulls["dwell_ok"]
        bad = np.flatnonzero(~ok)
        yield from self._finish(recs, chunk, ok, bad, self._check, self._shards, path, where)

    def events(self, values, source):
        """JSON values of an event source (Kafka's, Pub/Sub's; ``source`` names their dead letters),
        with the record check's decisions (:func:`streameval.io.records.check_impression`, as the
        per-event engine checks each value): parsed as columns at once
        (:func:`streameval.io.json_events.impression_json_table`) and screened as an Avro block is,
        the rows the screen does not clear checked on their values as sent; a block Arrow's reader
        would read otherwise than the record check goes value by value (:meth:`events_one_by_one`)."""
        import json

        from ..io.json_events import impression_json_table

        block = impression_json_table(values)
        if block is None:
            yield from self.events_one_by_one(values, source)
            return
        chunk, score_null, prop_null = impression_columns_arrow(block.table)
        chunk["attributes"] = block.attributes
        prop = chunk["propensity"]
        ok = ~block.check & self._screen(chunk, np.isfinite(chunk["score"]) | score_null,
                                         ((prop > 0) & (prop <= 1)) | prop_null)
        ok &= dwell.dwell_columns_arrow(block.table.column("dwell_ms"), chunk["clicked"])[1]
        bad = np.flatnonzero(~ok)
        recs = {i: json.loads(values[i]) for i in bad.tolist()}  # as sent: the record check decides
        yield from self._finish(recs, chunk, ok, bad, self._check, self._shards, source)

    def events_one_by_one(self, values, source):
        """:meth:`events`, each value decoded (``json.loads``) and checked alone; the valid ones
        screened and split as an Avro block is. A value that is not JSON is a dead letter (``value is
        not JSON``) with its text as ``raw``."""
        import json

        recs = []
        for value in values:
            text = value.decode("utf-8", "replace") if isinstance(value, (bytes, bytearray)) else str(value)
            try:
                rec = json.loads(text)
            except ValueError as e:
                reason = f"value is not JSON ({getattr(e, 'msg', e)}), got {text[:60]!r}"
                rec = None
            else:
                reason = self._check(rec)
            if reason is not None:
                counter(NAMESPACE, cn.rejected(self.kind, reason_key(reason))).inc()
                yield pvalue.TaggedOutput("dead_letters", dead_letter(source, text if rec is None else rec, reason))
                continue
            shaped = {f: rec.get(f) for f in IMPRESSION_FIELDS}  # the optional fields as the Avro reader's
            shaped["attributes"] = rec.get("attributes") or {}
            recs.append(shaped)
        if recs:
            yield from self._block(recs, source)

    def _table(self, table, path, attributes=None, where=None):
        chunk, score_null, prop_null = impression_columns_arrow(table)
        if attributes is not None:  # a Parquet block's: the columns kept, by key
            chunk["attributes"] = attributes
        prop = chunk["propensity"]
        ok = self._screen(chunk, np.isfinite(chunk["score"]) | score_null, ((prop > 0) & (prop <= 1)) | prop_null)
        raw_dwell = table.column("dwell_ms") if "dwell_ms" in table.column_names else None
        if raw_dwell is not None:  # a bad dwell goes to the record check, which names it
            ok &= dwell.dwell_columns_arrow(raw_dwell, chunk["clicked"])[1]
        bad = np.flatnonzero(~ok)
        recs = {}
        for i, rec in zip(bad.tolist(), columns_records(chunk, bad)):
            for f, null in (("score", score_null), ("propensity", prop_null)):
                if not null[i]:  # NaN is a value here, not a null
                    rec[f] = float(chunk[f][i])
            if raw_dwell is not None:  # the raw value (a -1 is not a null here)
                rec["dwell_ms"] = raw_dwell[i].as_py()
            recs[i] = rec
        yield from self._finish(recs, chunk, ok, bad, self._check, self._shards, path, where)


class _ReadJudgmentColumns(_ReadColumns):
    kind = "judgment"
    runs = ("query_id", "source")

    def _screen(self, chunk) -> np.ndarray:
        g = chunk["grade"]
        ok = np.ones(len(g), dtype=bool)
        for f in records.NONEMPTY_FIELDS["judgment"]:
            ok &= _nonempty(chunk[f])
        for f in records.ID_FIELDS["judgment"]:
            ok &= _no_nul(chunk[f])
        ok &= (g >= records.AVRO_INT_MIN) & (g <= records.AVRO_INT_MAX)
        ts = chunk["timestamp"]  # 0 when null
        ok &= (ts >= records.EVENT_TIME_MIN) & (ts <= records.EVENT_TIME_MAX)
        if self.grade_range is not None:
            ok &= (g >= self.grade_range[0]) & (g <= self.grade_range[1])
        return ok

    def _check(self, rec):
        return records.check_judgment(rec, self.grade_range)

    def _shards(self, chunk):
        return _shards_of(chunk["query_id"], None, self.shards)

    def _block(self, recs, path, where=None):
        chunk = judgment_columns(recs)
        ok = self._screen(chunk)
        bad = np.flatnonzero(~ok)
        yield from self._finish(recs, chunk, ok, bad, self._check, self._shards, path, where)

    def _table(self, table, path, attributes=None, where=None):
        chunk = judgment_columns_arrow(table)
        ok = self._screen(chunk)
        bad = np.flatnonzero(~ok)
        recs = dict(zip(bad.tolist(), _judgment_records(chunk, bad)))
        yield from self._finish(recs, chunk, ok, bad, self._check, self._shards, path, where)


_early_tokens = itertools.count()


class _Read(beam.PTransform):
    fn = None

    def __init__(self, paths, shards: int = SHARDS, grade_range=None, decoder: str | None = None,
                 hold: bool = False, threads: int = 1, label=None, time_range=None, input_format: str = "auto",
                 table_options=None, counts_as_data: bool = False):
        super().__init__(label)
        self.counts_as_data = bool(counts_as_data)
        #: with counts_as_data: the stage's counts (streameval.beam.counts_as_data), after application
        self.counts = None
        self.input_format = input_format
        self.table_options = table_options
        self.time_range = time_range
        self.hold = hold
        self.threads = int(threads)
        self.paths = list(paths)
        self.shards = int(shards)
        self.grade_range = grade_range
        self.decoder = decoder or default_decoder()
        self.dead_letters = None

    def expand(self, pbegin):
        fn = self.fn(self.shards, self.grade_range, self.decoder, self.hold, self.threads, self.time_range,
                     self.input_format, self.table_options)
        fn.counts_as_data = self.counts_as_data
        if self.hold and self.threads > 1:  # the in-process runner: the files' work starts now
            fn.start_early(self.paths, f"{os.getpid()}:{next(_early_tokens)}")
        read = (pbegin
                | "Paths" >> beam.Create(self.paths)
                | "Spread" >> beam.Reshuffle()
                | "Blocks" >> beam.ParDo(fn).with_outputs("dead_letters", *counts_tags(self.counts_as_data),
                                                          main="chunks"))
        #: dead letters: records failing the checks, and one per file that could not be read to its end
        self.dead_letters = read.dead_letters
        if self.counts_as_data:
            self.counts = read[COUNTS]
        return read.chunks


class ReadImpressionColumns(_Read):
    """``paths`` of impression Avro files -> ``(request shard, column dict)`` elements, one per
    (block, shard); ``.dead_letters`` after application. Parquet files (``input_format`` ``auto``
    and a ``.parquet``/``.pq`` name, or ``parquet``) are converted with ``table_options``
    (:class:`streameval.io.parquet_blocks.TableOptions`). Counters ``impressions_read``,
    ``impressions_valid``, ``rejected:impression:<reason>``, ``unreadable_files:impression``; with
    ``counts_as_data`` they are ``.counts`` after application (:mod:`streameval.beam.counts_as_data`)."""

    fn = _ReadImpressionColumns


class ReadJudgmentColumns(_Read):
    """As :class:`ReadImpressionColumns` for judgments, sharded by query (``grade_range`` as
    :class:`~streameval.beam.transforms.ValidateJudgments`)."""

    fn = _ReadJudgmentColumns
