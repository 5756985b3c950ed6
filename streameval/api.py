"""``streameval.evaluate``: score a run against qrels in one call, in the spirit of ranx.

Inputs may be dicts (``{qid: {docno: score}}`` / ``{qid: {docno: grade}}``, as pytrec_eval), paths to
TREC run and qrels files, :class:`~streameval.io.trec.TrecRun` / ``TrecQrels`` objects, ranx ``Qrels`` /
``Run`` objects (read through their ``to_dict()``), iterables of records with ``query_id``, ``doc_id``
and ``relevance`` (qrels) or ``score`` (run) attributes (ir_measures ``Qrel`` / ``ScoredDoc``
namedtuples, ir_datasets' ``qrels_iter()`` / ``scoreddocs_iter()``), or pandas DataFrames (columns
``q_id``/``query_id``/``qid``, ``doc_id``/``docno``/``item_id``, and ``score`` or
``rel``/``grade``/``relevance``/``label``/``score`` for qrels: ranx's default columns are ``q_id``,
``doc_id``, ``score`` for both; pyterrier's ``qid, docno, label``; ``evaluate(columns=...)`` names any
other). Neither ranx, ir_measures nor pandas is imported here: their objects
are recognised by their attributes.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import os
import warnings
from dataclasses import dataclass

import numpy as np

from .metrics.kernel import MetricOptions, compute
from .metrics.names import MetricSpec, as_name, metric_name_list, parse_metrics
from .metrics.online_names import canonical_metric
from .metrics.prepare import DEFAULT_SCORE_PRECISION, Prepared, prepare, refuse_nul
from .metrics.prepare import judged_only as judged_only_lists
from .metrics.trec_measures import WITHOUT_RESULTS, without_results

__all__ = ["evaluate", "Evaluation", "score_queries", "aggregate", "run_columns", "qrels_columns"]

# the column names a DataFrame may use: ir_measures' (query_id, doc_id, relevance, score), ranx's
# (q_id, doc_id, score), TREC's and pyterrier's (qid, docno, rel / label, score), ours (item_id, grade)
_Q_COLS = ("q_id", "query_id", "qid")
_D_COLS = ("doc_id", "docno", "item_id", "doc")
_S_COLS = ("score",)
_G_COLS = ("rel", "grade", "relevance", "label", "score")  # score last: ranx's Qrels.from_df default
#: the keys of evaluate(columns=...): the role of a column, named as ir_measures names it
COLUMN_ROLES = ("query_id", "doc_id", "relevance", "score")


def _pick(df, names, what, kind, given=None):
    """The column of ``df`` that plays role ``what`` (a pandas Series, as the frame holds it)."""
    if given is not None:
        if given in df.columns:
            return df[given]
        raise ValueError(f"{kind} DataFrame has no column {given!r} (columns={{...: {given!r}}}); "
                         f"has {list(df.columns)}")
    for n in names:
        if n in df.columns:
            return df[n]
    raise ValueError(f"{kind} DataFrame has no {what} column (expected one of {', '.join(names)}, or name it "
                     f"with columns={{{_ROLE_OF[what]!r}: ...}}); has {list(df.columns)}")


_ROLE_OF = {"query id": "query_id", "document id": "doc_id", "grade": "relevance", "score": "score"}


def _check_columns(columns) -> dict:
    """evaluate(columns=...) checked: a dict from roles (:data:`COLUMN_ROLES`) to column names."""
    if columns is None:
        return {}
    if not isinstance(columns, dict):
        raise TypeError(f"columns is a dict from roles ({', '.join(COLUMN_ROLES)}) to column names, "
                        f"got {type(columns).__name__}")
    bad = [k for k in columns if k not in COLUMN_ROLES]
    if bad:
        raise ValueError(f"columns: unknown role {bad[0]!r}; roles: {', '.join(COLUMN_ROLES)}")
    return dict(columns)


def _is_frame(obj) -> bool:
    """A pandas (or pandas-like) DataFrame: before the TrecRun test, since a frame with qid and docno
    columns has them as attributes too."""
    return hasattr(obj, "columns") and hasattr(obj, "to_numpy") and hasattr(obj, "__getitem__")


def _is_column(x) -> bool:
    """A pandas (or pandas-like) Series."""
    return hasattr(x, "to_numpy") and hasattr(x, "dtype") and not isinstance(x, np.ndarray)


def _is_record(x) -> bool:
    return hasattr(x, "query_id") and hasattr(x, "doc_id")


def _records(items, kind: str):
    """(qid, docno, value) arrays from records with query_id, doc_id and relevance (qrels) / score (run)
    attributes: ir_measures' Qrel / ScoredDoc, ir_datasets' TrecQrel / GenericScoredDoc, any namedtuple
    or object of that shape. A qrels record's ``iteration`` is ignored, as trec_eval ignores it."""
    field = "score" if kind == "run" else "relevance"
    q, d, v = [], [], []
    for i, r in enumerate(items):
        try:
            q.append(r.query_id)
            d.append(r.doc_id)
            v.append(getattr(r, field))
        except AttributeError:
            raise TypeError(f"{kind} item {i} is a {type(r).__name__}: expected records with query_id, doc_id "
                            f"and {field} attributes (ir_measures {'ScoredDoc' if kind == 'run' else 'Qrel'})"
                            ) from None
    if not q:
        return np.asarray([], dtype=str), np.asarray([], dtype=str), np.asarray([], dtype=np.float64)
    return _ids([str(x) for x in q]), _ids([str(x) for x in d]), _values(v, kind)


def _values(v, kind):
    try:
        return np.asarray(v, dtype=np.float64)
    except (TypeError, ValueError) as e:
        what = "scores" if kind == "run" else "grades"
        raise ValueError(f"{kind} {what} must be numbers: {e}") from None


def _ids(values, as_bytes: bool = False) -> np.ndarray:
    """Query or document ids that order as their text (``str(id)``), whatever the container: ids
    order as strings (trec_eval's strcmp), so ``10`` sorts before ``2`` from a dict, a DataFrame or a
    numpy array. Integer ids stay integers (``metrics.prepare`` orders them as their decimal text
    by arithmetic keys, :class:`~streameval.metrics.prepare.TextKeys`: no row is turned into text);
    any other kind of id (floats, objects, booleans) becomes its text."""
    if _is_column(values) or (isinstance(values, np.ndarray) and values.dtype.kind == "O"):
        # text held as Arrow strings (pandas 3) or Python objects: numpy str from Arrow's bytes when
        # ASCII, with no Python object per row (pyarrow imported here: not at start-up of trec-eval)
        from .io.arrow_text import arrow_strings, text_array

        a = arrow_strings(values)
        t = text_array(a, as_bytes=as_bytes) if a is not None else None
        if t is not None:
            return t
        if _is_column(values):
            values = values.to_numpy()
    if isinstance(values, (list, tuple)) or (isinstance(values, np.ndarray) and values.dtype.kind == "O"):
        refuse_nul(values)  # before numpy drops trailing NULs
    arr = np.asarray(values)
    if arr.dtype.kind in "Uiu":
        return arr
    if isinstance(values, (list, tuple)):  # each id's own text: [2, 1e3] is "2", "1000.0" (not "2.0")
        arr = np.asarray(values, dtype=object)
    return arr.astype(str)


def _columns(obj, kind: str, columns: dict | None = None, check: bool = True, text_as_bytes: bool = False):
    """(qid, docno, value) arrays from any accepted input; kind is 'run' or 'qrels'; ``columns``: a
    DataFrame's column names by role (:data:`COLUMN_ROLES`); ``check`` False: a run file is read
    without refusing its non-finite scores and repeated documents (the caller leaves them to
    :func:`prepare` and locates its refusal: :func:`_located`); ``text_as_bytes``: a DataFrame's
    ASCII Arrow string columns as numpy ``bytes`` (:func:`_score_queries` decodes the ids it
    returns), else ``str``."""
    if _is_frame(obj):
        columns = columns or {}
        q = _ids(_pick(obj, _Q_COLS, "query id", kind, columns.get("query_id")), text_as_bytes)
        d = _ids(_pick(obj, _D_COLS, "document id", kind, columns.get("doc_id")), text_as_bytes)
        if kind == "run":
            v = _pick(obj, _S_COLS, "score", kind, columns.get("score"))
        else:
            v = _pick(obj, _G_COLS, "grade", kind, columns.get("relevance"))
        return q, d, _values(v.to_numpy(), kind)
    if isinstance(obj, (str, os.PathLike)):
        from .io import trec

        # a run is read with check=True: a NaN score or a repeated document is reported with its line
        # (qrels repeats are left to the judgment_conflicts policy)
        obj = trec.read_run(obj, check=check) if kind == "run" else trec.read_qrels(obj)
    if hasattr(obj, "qid") and hasattr(obj, "docno"):
        val = obj.score if kind == "run" else obj.grade
        qid = obj.qid if hasattr(obj.qid, "blocks") else np.asarray(obj.qid)  # runs of qids: kept so
        return qid, np.asarray(obj.docno), np.asarray(val, dtype=np.float64)
    if type(obj).__module__.split(".")[0] == "ranx" and hasattr(obj, "to_dict"):
        obj = obj.to_dict()  # ranx Qrels / Run: grades and scores as given
    if isinstance(obj, dict):
        q, d, v = [], [], []
        for qid, docs in obj.items():
            if not isinstance(docs, dict):
                raise TypeError(f"{kind} dict maps query {qid!r} to a {type(docs).__name__}: expected "
                                "{qid: {docno: value}}")
            for doc, val in docs.items():
                q.append(str(qid))
                d.append(str(doc))
                v.append(val)
        return _ids(q), _ids(d), _values(v, kind)
    if _is_record(obj):  # one ir_measures Qrel / ScoredDoc
        return _records([obj], kind)
    if isinstance(obj, tuple) and len(obj) == 3 and not any(_is_record(x) for x in obj):
        return _ids(obj[0]), _ids(obj[1]), _values(obj[2], kind)  # ids as text, as every other container
    if hasattr(obj, "__iter__") and not isinstance(obj, (str, bytes)):  # records, e.g. ir_datasets' iterators
        return _records(obj, kind)
    raise TypeError(f"cannot read a {kind} from {type(obj).__name__}: expected a dict of dicts, a TREC file "
                    "path, a TrecRun/TrecQrels, a ranx Qrels/Run, ir_measures records, a (qid, docno, value) "
                    "tuple of arrays or a pandas DataFrame")


def _same_text_kind(a: np.ndarray, b: np.ndarray):
    """``(a, b)``, a ``bytes`` one as ``str`` when the other is ``str`` (ASCII: the same text)."""
    kinds = (getattr(a, "dtype", None) is not None and a.dtype.kind, getattr(b, "dtype", None) is not None
             and b.dtype.kind)
    if kinds == ("S", "U"):
        return np.asarray(a).astype(str), b  # (a run's query ids may be runs of equal ids: laid out)
    if kinds == ("U", "S"):
        return a, np.asarray(b).astype(str)
    return a, b


def _located(err: ValueError, run) -> ValueError:
    """The error to raise for ``err``, raised by :func:`prepare`: for a run given as a file path, a
    non-finite score or a repeated document found at its line (``trec.check_run``, as ``read_run(...,
    check=True)`` reports it: the file read again, only on this path), else ``err`` itself."""
    if not isinstance(run, (str, os.PathLike)):
        return err
    from .io import trec

    try:
        trec.check_run(trec.read_run(run), run)
    except trec.InputFormatError as located:
        return located
    return err


def run_columns(run, columns: dict | None = None):
    """``run`` (any input :func:`evaluate` accepts as a run: dicts of dicts, a TREC file path, a
    ``TrecRun``, a ranx ``Run``, ir_measures / ir_datasets records, a DataFrame, a (qid, docno,
    score) tuple of arrays) as (qid, docno, score) arrays; ``columns``: a DataFrame's column names
    by role, as in :func:`evaluate`. Ids keep the types :func:`evaluate` keeps (integers stay
    integers; ``np.asarray(qid).astype(str)`` gives their text)."""
    return _columns(run, "run", _check_columns(columns))


def qrels_columns(qrels, columns: dict | None = None):
    """``qrels`` (any input :func:`evaluate` accepts as qrels) as (qid, docno, grade) arrays, as
    :func:`run_columns` reads a run; repeated judgments are kept as given."""
    return _columns(qrels, "qrels", _check_columns(columns))


#: library policies for two judgments of one (query, document): see :func:`resolve_qrels`
QRELS_CONFLICTS = ("error", "latest", "max")


def _qrels_times(qrels, n):
    """The qrels' judgment times when a DataFrame gives a ``timestamp`` column, else the row order."""
    if hasattr(qrels, "columns") and "timestamp" in getattr(qrels, "columns", ()):
        return np.asarray(qrels["timestamp"].to_numpy(), dtype=np.int64)
    return np.arange(n, dtype=np.int64)


def resolve_qrels(jq, jd, jg, times, policy: str = "error"):
    """One grade per (query, document) of flat qrels arrays under ``policy``.

    ``"error"`` (default, as trec_eval): leave the arrays as they are (:func:`prepare` refuses a pair
    judged twice with a ValueError naming it); ``"latest"``: the judgment with the largest ``times``
    value wins (equal times: the larger grade); ``"max"``: the largest grade wins. ``times``: int
    array of the same length (a ``timestamp`` column, or the row order: the later line wins).
    Returns ``(jq, jd, jg)``. Raises ValueError on an unknown policy. (The jobs' policies, with
    ``reject`` and dead letters, are in :mod:`streameval.io.cleaning`.)
    """
    if policy not in QRELS_CONFLICTS:
        raise ValueError(f"judgment_conflicts must be one of {QRELS_CONFLICTS}, got {policy!r}")
    if policy == "error" or len(jq) == 0:
        return jq, jd, jg
    first = (np.asarray(times), np.asarray(jg)) if policy == "latest" else (np.asarray(jg), np.asarray(times))
    # lexsort: last key primary; sort by (query, doc, primary, secondary) and keep each pair's last row
    order = np.lexsort((first[1], first[0], jd, jq))
    q, d = jq[order], jd[order]
    last = np.ones(len(q), dtype=bool)
    last[:-1] = (q[1:] != q[:-1]) | (d[1:] != d[:-1])
    keep = order[last]
    return jq[keep], jd[keep], jg[keep]


def score_queries(qrels, run, metrics, **options) -> tuple[list[MetricSpec], Prepared, np.ndarray]:
    """Per-query scores: (specs, prepared lists, scores of shape (len(specs), n_queries)).

    Options (keywords) are those of :func:`evaluate`, and trec_eval's: ``judged_only`` (``-J``:
    unjudged ranked documents are removed before scoring,
    :func:`~streameval.metrics.prepare.judged_only`; the returned lists are the filtered ones) and
    ``num_docs_in_coll`` (``-N``: the collection's size, used by utility's fourth coefficient); and
    ``warn`` (False: no warning of queries left out). Raises ValueError / MetricNameError on bad
    input, TypeError on an unknown option. numpy asks for no transparent huge pages during the call
    (:func:`streameval.tuning.no_numpy_hugepages`)."""
    from .tuning import no_numpy_hugepages

    with no_numpy_hugepages():
        return _score_queries(qrels, run, metrics, **options)


def _score_queries(qrels, run, metrics, *, relevance_level: float = 1, gain: str = "linear",
                   ideal: str = "judgments", err_max_grade: float = 4, complete: bool = False,
                   depth: int | None = None, tie_break: str = "docno", score_precision: str = DEFAULT_SCORE_PRECISION,
                   judgment_conflicts: str = "error", judged_only: bool = False, num_docs_in_coll: int = 0,
                   warn: bool = True, columns: dict | None = None) -> tuple[list[MetricSpec], Prepared, np.ndarray]:
    specs = parse_metrics(metrics)
    opts = MetricOptions(relevance_level=relevance_level, gain=gain, ideal=ideal, err_max_grade=err_max_grade,
                         num_docs_in_coll=num_docs_in_coll)
    columns = _check_columns(columns)
    rq, rd, rs = _columns(run, "run", columns, check=False, text_as_bytes=True)
    jq, jd, jg = _columns(qrels, "qrels", columns, text_as_bytes=True)
    # ids read as bytes (a DataFrame's ASCII Arrow strings) meet str ids of the other input as str
    rq, jq = _same_text_kind(rq, jq)
    rd, jd = _same_text_kind(rd, jd)
    if judgment_conflicts != "error":
        jq, jd, jg = resolve_qrels(jq, jd, jg, _qrels_times(qrels, len(jq)), judgment_conflicts)
    elif judgment_conflicts not in QRELS_CONFLICTS:
        raise ValueError(f"judgment_conflicts must be one of {QRELS_CONFLICTS}, got {judgment_conflicts!r}")
    try:
        prep = prepare(rq, rd, rs, jq, jd, jg, depth=depth, complete=complete, tie_break=tie_break,
                       score_precision=score_precision)
    except ValueError as e:
        raise _located(e, run) from None
    if prep.qids.dtype.kind == "S":  # the ids as str, as every other input gives them
        prep = dataclasses.replace(prep, qids=prep.qids.astype(str), unjudged_qids=prep.unjudged_qids.astype(str),
                                   missing_qids=prep.missing_qids.astype(str))
    if warn and len(prep.unjudged_qids):
        warnings.warn(f"{len(prep.unjudged_qids)} run queries have no judgments and are left out of the "
                      f"averages (first: {str(prep.unjudged_qids[0])!r})", stacklevel=4)
    if warn and len(prep.missing_qids) and not complete:
        warnings.warn(f"{len(prep.missing_qids)} judged queries have no results and are skipped "
                      "(pass complete=True to score them 0, as trec_eval -c)", stacklevel=4)
    rows = [i for i, s in enumerate(specs) if s.family in WITHOUT_RESULTS]
    if not judged_only and not (complete and rows):
        return specs, prep, compute(prep.lists, specs, opts)
    stand_in = np.diff(prep.lists.offsets) == 0  # complete's queries without results
    if judged_only:
        prep = judged_only_lists(prep)
    values = compute(prep.lists, specs, opts)
    # lists left empty: a few trec_eval measures are not the kernel's 0 there (the -c stand-in
    # ranking's values, 0 / 0 ranked under -J, utility's unranked documents)
    empty = np.diff(prep.lists.offsets) == 0
    if rows and empty.any():
        num_rel = compute(prep.lists, parse_metrics(["num_rel"]), opts)[0][empty]
        for i in rows:
            values[i, empty] = without_results(specs[i], num_rel, stand_in[empty], judged_only, num_docs_in_coll)
    return specs, prep, values


def aggregate(values: np.ndarray, spec: MetricSpec) -> float:
    """The summary of one metric over queries: the mean (exactly rounded sum / count, the rule the
    mergeable accumulators use, so batch, stream and library agree to the bit), the total for
    num_ret / num_rel / num_rel_ret / num_nonrel_judged_ret as trec_eval prints them, or for gm_map /
    gm_bpref (``spec.average == "geometric"``) trec_eval's geometric mean, exp of the mean log of the
    per-query values (floored at 0.00001). No queries: NaN."""
    if len(values) == 0:
        return math.nan
    if spec.average == "geometric":
        return math.exp(math.fsum(math.log(v) for v in values.tolist()) / len(values))
    total = math.fsum(values.tolist())
    return total if spec.is_count else total / len(values)


@dataclass
class Evaluation:
    """What :func:`evaluate` returns, whatever the number of metrics asked for.

    ``means``: {metric name: summary value} (canonical names, e.g. ``"P@5"`` for ``"P_5"``);
    ``ev[name]`` reads it under any spelling (``ev["P_5"]``); ``ev.value()``: the one metric's value
    when a single metric was asked for (the explicit path for code that expected a float).
    ``per_query``: None unless asked for; ``per_query=True`` / ``"dict"`` gives
    ``{query id: {metric name: value}}`` (queries in trec_eval's order), ``per_query="pandas"`` a
    DataFrame indexed by query id (``query_id``) with one column per metric.
    ``num_queries``: the queries averaged over."""

    means: dict
    per_query: object = None
    num_queries: int = 0

    def __getitem__(self, name):
        if isinstance(name, str) and name in self.means:
            return self.means[name]
        specs = parse_metrics(name)  # MetricNameError (a KeyError would hide a typo's suggestion)
        if len(specs) == 1:  # any spelling of an evaluated measure (ev["ndcg_cut_10"] for "nDCG@10")
            for key in self.means:
                if canonical_metric(key) == specs[0].canonical:
                    return self.means[key]
        raise KeyError(f"{as_name(name)!r} was not evaluated; have {list(self.means)}")

    def __iter__(self):
        return iter(self.means)

    def __len__(self):
        return len(self.means)

    # a one-measure result behaves as its float (issue 42): float(ev), ev > 0.5, f"{ev:.3f}", round(ev, 3);
    # with several measures each raises the ValueError of value()
    def __float__(self) -> float:
        return float(self.value())

    def __lt__(self, other):
        return self.value() < other

    def __le__(self, other):
        return self.value() <= other

    def __gt__(self, other):
        return self.value() > other

    def __ge__(self, other):
        return self.value() >= other

    def __eq__(self, other):
        if isinstance(other, Evaluation):
            return (self.means, self.num_queries) == (other.means, other.num_queries) and \
                _same_table(self.per_query, other.per_query)
        if isinstance(other, numbers.Real):
            return len(self.means) == 1 and self.value() == other
        return NotImplemented

    __hash__ = None

    def __format__(self, spec: str) -> str:
        return format(self.value(), spec) if len(self.means) == 1 else format(str(self), spec)

    def __round__(self, ndigits=None):
        return round(self.value(), ndigits)

    def value(self) -> float:
        """The summary value of the one metric evaluated; ValueError when there are several."""
        if len(self.means) != 1:
            raise ValueError(f"value() needs exactly one metric, this evaluation has {len(self.means)} "
                             f"({', '.join(self.means)}): read ev[name] or ev.means")
        return next(iter(self.means.values()))


def _same_table(a, b) -> bool:
    """Two per-query tables equal (dicts, DataFrames: ``equals``, or None)."""
    if hasattr(a, "equals") and hasattr(b, "equals"):
        return bool(a.equals(b))
    if hasattr(a, "equals") or hasattr(b, "equals"):
        return False
    return a == b


def _diversity_names(metrics) -> list:
    """The names of ``metrics`` when they are diversity measures (all of them), [] when none is;
    MetricNameError when diversity and ad hoc measures are mixed (they read different qrels)."""
    from .metrics.diversity import is_diversity_name
    from .metrics.names import MetricNameError

    names = metric_name_list(metrics)  # TypeError naming what is accepted (metrics=None)
    div = [n for n in names if is_diversity_name(n)]
    if div and len(div) != len(names):
        other = [str(n) for n in names if not is_diversity_name(n)]
        raise MetricNameError(f"diversity measures ({', '.join(div)}) and ad hoc measures ({', '.join(other)}) "
                              "read different qrels (with and without subtopics): evaluate them in separate calls")
    return div


#: accepted values of evaluate(per_query=...)
PER_QUERY = (False, True, "dict", "pandas")


def evaluate(qrels, run, metrics, *, per_query: bool | str = False, relevance_level: float = 1,
             gain: str = "linear", ideal: str = "judgments", err_max_grade: float = 4,
             complete: bool = False, depth: int | None = None, tie_break: str = "docno",
             score_precision: str = DEFAULT_SCORE_PRECISION, judgment_conflicts: str = "error",
             columns: dict | None = None) -> Evaluation:
    """Score ``run`` against ``qrels`` on ``metrics`` (names as users write them: ``"ndcg@10"``,
    ``"map"``, ``"mrr@10"``, ``"P_5"``; a single name or a list).

    ``qrels`` / ``run``: any input of the module docstring (dicts of dicts, TREC paths, ranx
    ``Qrels`` / ``Run``, ir_measures / ir_datasets records, DataFrames, arrays). Scores and grades are
    used as given; ties are ordered as trec_eval (score descending, then docno descending), which
    ranx does not do (it keeps its own order of tied documents), so a run with tied scores can
    differ from ranx's numbers.

    Options (defaults are trec_eval's; see docs/metrics.md): ``per_query`` (False; True or ``"dict"``:
    a dict of dicts in every install; ``"pandas"``: a DataFrame), ``relevance_level`` (``-l``),
    ``gain`` (``"linear"`` | ``"exponential"``), ``ideal`` (``"judgments"`` | ``"served"``),
    ``err_max_grade``, ``complete`` (``-c``: judged queries without results score 0), ``depth``
    (``-M``), ``tie_break`` (``"docno"``), ``score_precision`` (``"float64"``: scores compared as
    doubles, as trec_eval 10 does; ``"float32"``: in single precision, as trec_eval 9 and pytrec_eval
    store them), ``judgment_conflicts`` (``"error"``: a
    (query, document) judged twice raises, as in trec_eval; ``"latest"``: the later judgment by the
    DataFrame's ``timestamp`` column or by row order; ``"max"``: the larger grade; :func:`resolve_qrels`),
    ``columns`` (a DataFrame's column names by role, for both inputs: ``{"query_id": "topic", "doc_id":
    "pid", "relevance": "judgment", "score": "sim"}``, any subset; without it the columns are found by
    ir_measures' names ``query_id, doc_id, relevance, score``, ranx's ``q_id, doc_id, score``, TREC's
    and pyterrier's ``qid, docno, rel`` / ``label``, or ``item_id``, ``grade``).

    Diversity measures (``alpha_nDCG@20``, ``ERR_IA@20``, ``NRBP``, ``P_IA@10``, ``AP_IA``,
    ``S_recall@20``; :mod:`streameval.metrics.diversity`) take diversity qrels (a subtopic per
    judgment: :mod:`streameval.api_diversity` lists the shapes) and the options ``per_query``,
    ``relevance_level``, ``complete`` and ``depth``; they are computed as ndeval (scores compared as
    doubles, ties by docno descending) and cannot be mixed with ad hoc measures in one call.

    Returns an :class:`Evaluation` for one metric as for several (``ev.means``, ``ev["map"]``,
    ``ev.value()`` for a single metric). Run queries without any judgment are left out (a warning
    says how many). Raises MetricNameError (ValueError) for unknown names, ValueError for malformed
    values, TypeError for an input of a type it cannot read or ``metrics`` that is neither a name nor
    an iterable of names (``None``: the message says what is accepted), ImportError for
    ``per_query="pandas"`` without pandas.
    """
    if isinstance(per_query, str) and per_query not in PER_QUERY or not isinstance(per_query, (bool, str)):
        raise ValueError(f"per_query must be one of {PER_QUERY}, got {per_query!r}")
    pd = None
    if per_query == "pandas":
        try:
            import pandas as pd
        except ImportError:
            raise ImportError("per_query='pandas' needs pandas installed; per_query='dict' needs nothing") from None
    diversity = _diversity_names(metrics)
    if diversity:
        from .api_diversity import evaluate_diversity

        given = {"gain": (gain, "linear"), "ideal": (ideal, "judgments"), "err_max_grade": (err_max_grade, 4),
                 "tie_break": (tie_break, "docno"), "judgment_conflicts": (judgment_conflicts, "error"),
                 "columns": (columns, None)}
        bad = [k for k, (v, default) in given.items() if v != default]
        if bad:
            raise ValueError(f"{', '.join(bad)}: not options of the diversity measures ({', '.join(diversity)}); "
                             "see docs/metrics.md, Diversity")
        return evaluate_diversity(qrels, run, diversity, per_query=per_query, relevance_level=relevance_level,
                                  complete=complete, depth=depth)
    specs, prep, values = score_queries(qrels, run, metrics, relevance_level=relevance_level, gain=gain,
                                        ideal=ideal, err_max_grade=err_max_grade, complete=complete,
                                        depth=depth, tie_break=tie_break, score_precision=score_precision,
                                        judgment_conflicts=judgment_conflicts, columns=columns)
    means = {s.name: aggregate(values[i], s) for i, s in enumerate(specs)}
    table = None
    if per_query:
        qids = [str(q) for q in prep.qids]
        if pd is not None:
            table = pd.DataFrame(values.T, index=pd.Index(qids, name="query_id"), columns=[s.name for s in specs])
        else:
            table = {q: {s.name: float(values[i, j]) for i, s in enumerate(specs)} for j, q in enumerate(qids)}
    return Evaluation(means=means, per_query=table, num_queries=len(prep.qids))
