"""``streameval.compare``: paired significance tests of several runs on the same qrels, in the spirit
of ranx's ``compare`` (all pairs, or each run against a baseline), with a correction for multiple
comparisons, win/tie/loss counts per query and a table to Markdown, LaTeX and HTML.

The kernels are the CLI's (``streameval compare``), one definition each: the paired t-test and the
sign-flip (Fisher) randomization test come from
:class:`~streameval.accumulators.paired.PairedComparison` (the state the Beam jobs merge: the
exact mean and standard error of the differences, :func:`~streameval.metrics.stats.t_test`,
:func:`~streameval.metrics.stats.sign_flip_pvalue_exact` up to ``exact_max`` queries, else
``n_permutations`` hash-seeded sign patterns), the corrections from
:func:`~streameval.metrics.multiple.adjust_pvalues` and Tukey's HSD from
:func:`~streameval.metrics.multiple.tukey_hsd`. Per-query scores are :func:`streameval.api.score_queries`'
(trec_eval 10's conventions). No Beam, no pandas unless :meth:`Comparison.to_dataframe` is called.
"""

from __future__ import annotations

import difflib
import html
import math
import warnings
from dataclasses import dataclass, field

import numpy as np

__all__ = ["compare", "Comparison", "scores_by_query", "TESTS", "CORRECTIONS", "TIE_TOLERANCE"]

#: the tests :func:`compare` runs, with the aliases ranx users write
TESTS = {"t": "t", "student": "t", "paired_t": "t", "fisher": "fisher", "randomization": "fisher",
         "permutation": "fisher", "tukey": "tukey", "tukey_hsd": "tukey"}
#: the corrections for multiple comparisons (``None``: none; ``"auto"``: Holm for t and Fisher, none
#: for Tukey, whose p-values are family-wise already)
CORRECTIONS = ("holm", "bh", "bonferroni", None, "auto")
#: two per-query scores closer than this are a tie in the win/tie/loss counts
TIE_TOLERANCE = 1e-12

_LETTERS = "abcdefghijklmnopqrstuvwxyz"
_SUPER = dict(zip(_LETTERS, "ᵃᵇᶜᵈᵉᶠᵍʰⁱʲᵏˡᵐⁿᵒᵖ\U000107a5ʳˢᵗᵘᵛʷˣʸᶻ"))


def _letter(i: int) -> str:
    """a, b, ..., z, aa, ab, ... (the run's label in the table)."""
    out = ""
    i += 1
    while i:
        i, r = divmod(i - 1, 26)
        out = _LETTERS[r] + out
    return out


def _closest(word, choices) -> str:
    near = difflib.get_close_matches(str(word), [str(c) for c in choices], n=3, cutoff=0.0)
    return ", ".join(repr(n) for n in near)


def _run_names(runs) -> tuple[list, list]:
    """(names, runs) from a dict name -> run, or a sequence of runs (a run's ``name`` attribute, as
    ranx's ``Run`` has, else ``run_1``, ``run_2``, ...)."""
    if isinstance(runs, dict):
        names, objs = [str(k) for k in runs], list(runs.values())
    elif isinstance(runs, (list, tuple)):
        objs = list(runs)
        names = [getattr(r, "name", None) if isinstance(getattr(r, "name", None), str) else f"run_{i + 1}"
                 for i, r in enumerate(objs)]
    else:
        raise TypeError(f"runs must be a dict of name -> run (or a list of runs), got {type(runs).__name__}")
    if len(objs) < 2:
        raise ValueError(f"compare needs two runs or more, got {len(objs)}")
    if len(set(names)) < len(names):
        dup = next(n for n in names if names.count(n) > 1)
        raise ValueError(f"two runs are named {dup!r}: pass a dict of distinct names")
    return names, objs


@dataclass
class Comparison:
    """What :func:`compare` returns.

    ``rows``: one dict per (metric, pair) with ``metric, system_a, system_b, test, num_queries,
    mean_a, mean_b, diff`` (``mean_b - mean_a`` on the pair's queries), ``statistic`` (t, or
    Tukey's q; NaN for Fisher), ``p_value``, ``correction``, ``p_corrected``, ``significant``
    (``p_corrected <= alpha``), ``wins, ties, losses`` (queries where B scores more than A, within
    :data:`TIE_TOLERANCE` of it, less), ``ci_low, ci_high`` (the t interval of the difference at
    ``1 - alpha``; Tukey's simultaneous interval), ``perm_method`` (``"exact"``, ``"sampled"`` or
    None) and ``permutations`` (sign patterns behind a Fisher p-value). ``runs``: the names in the
    order given (letters a, b, c, ... in the table); ``metrics``: canonical metric names; ``means``:
    ``{run: {metric: mean over the run's scored queries}}`` (what :func:`streameval.evaluate` gives);
    ``test``, ``correction``, ``alpha``, ``baseline``.

    ``str(result)`` is :meth:`to_markdown`; :meth:`to_latex`, :meth:`to_html` give the same table;
    :meth:`to_dataframe` the rows (pandas)."""

    rows: list
    runs: list
    metrics: list
    means: dict
    test: str
    correction: str | None
    alpha: float
    baseline: str | None = None
    num_queries: dict = field(default_factory=dict)

    # ------------------------------------------------------------------------------------------
    def to_dataframe(self):
        """The rows as a pandas DataFrame (one row per metric and pair). ImportError without pandas."""
        try:
            import pandas as pd
        except ImportError:
            raise ImportError("Comparison.to_dataframe() needs pandas; Comparison.rows is the same as dicts") from None
        return pd.DataFrame(self.rows)

    def beats(self, run: str, metric: str) -> list:
        """The runs ``run`` beats significantly on ``metric``: the pairs with ``run`` in them that are
        significant and whose mean difference favours ``run``, in the order of :attr:`runs`."""
        out = set()
        for r in self.rows:
            if r["metric"] != metric or not r["significant"]:
                continue
            if r["system_b"] == run and r["diff"] > 0:
                out.add(r["system_a"])
            elif r["system_a"] == run and r["diff"] < 0:
                out.add(r["system_b"])
        return [n for n in self.runs if n in out]

    def _cells(self, digits: int):
        """(letter, run, [(value text, [letters beaten]) per metric]) per run."""
        letters = {n: _letter(i) for i, n in enumerate(self.runs)}
        out = []
        for n in self.runs:
            cells = []
            for m in self.metrics:
                v = self.means[n][m]
                text = "-" if v is None or not math.isfinite(v) else f"{v:.{digits}f}"
                cells.append((text, [letters[b] for b in self.beats(n, m)]))
            out.append((letters[n], n, cells))
        return out

    def _legend(self) -> str:
        if self.test == "tukey":
            how = f"Tukey's HSD over all {len(self.runs)} runs (p-values family-wise over all their pairs)"
        else:
            what = {"t": "a two-sided paired t-test", "fisher": "a two-sided paired randomization (sign-flip) test"}
            corr = {None: "no correction for multiple comparisons", "holm": "Holm's correction",
                    "bh": "the Benjamini-Hochberg correction", "bonferroni": "Bonferroni's correction"}
            how = f"{what[self.test]}, {corr[self.correction]} per metric"
        pairs = f"each run against {self.baseline}" if self.baseline is not None else "all pairs of runs"
        return f"Superscripts: the runs (#) a run beats with p <= {self.alpha:g}; {how}; compared: {pairs}."

    def to_markdown(self, digits: int = 4) -> str:
        """A Markdown table: runs as rows (``#`` their letter), metrics as columns, each mean with
        the letters (Unicode superscripts) of the runs it beats significantly; a legend line under it."""
        head = ["#", "run", *self.metrics]
        lines = [[letter, name.replace("|", "\\|")] + [t + "".join(_SUPER.get(c, c) for c in "".join(b))
                                                       for t, b in cells]
                 for letter, name, cells in self._cells(digits)]
        widths = [max(len(h), *(len(l[i]) for l in lines)) for i, h in enumerate(head)]

        def row(cells):
            return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths)) + " |"

        sep = "| " + " | ".join(("-" * w if i < 2 else "-" * (w - 1) + ":") for i, w in enumerate(widths)) + " |"
        return "\n".join([row(head), sep] + [row(l) for l in lines] + ["", self._legend()])

    def to_latex(self, digits: int = 4) -> str:
        """A LaTeX ``tabular`` (booktabs rules) in a ``table``: each mean with ``$^{letters}$`` of
        the runs it beats significantly, the best mean per metric in bold, the legend as caption."""
        def tex(s: str) -> str:
            for a, b in (("\\", r"\textbackslash{}"), ("&", r"\&"), ("%", r"\%"), ("$", r"\$"), ("#", r"\#"),
                         ("_", r"\_"), ("{", r"\{"), ("}", r"\}"), ("~", r"\textasciitilde{}"),
                         ("^", r"\textasciicircum{}")):
                s = s.replace(a, b) if a != "\\" else s.replace(a, "\0")
            return s.replace("\0", r"\textbackslash{}")

        best = {}
        for m in self.metrics:
            vals = [(round(self.means[n][m], digits), n) for n in self.runs if math.isfinite(self.means[n][m])]
            best[m] = {n for v, n in vals if vals and v == max(v for v, _ in vals)}
        out = [r"\begin{table}[ht]", r"\centering", "\\caption{" + tex(self._legend()) + "}",
               r"\begin{tabular}{cl" + "r" * len(self.metrics) + "}", r"\toprule",
               " & ".join([r"\#", "Run", *(tex(m) for m in self.metrics)]) + r" \\", r"\midrule"]
        for letter, name, cells in self._cells(digits):
            parts = [letter, tex(name)]
            for m, (t, b) in zip(self.metrics, cells):
                v = r"\textbf{" + t + "}" if name in best[m] else t
                parts.append(v + ("$^{" + "".join(b) + "}$" if b else ""))
            out.append(" & ".join(parts) + r" \\")
        out += [r"\bottomrule", r"\end{tabular}", r"\end{table}"]
        return "\n".join(out)

    def to_html(self, digits: int = 4) -> str:
        """An HTML ``<table>``: each mean with ``<sup>letters</sup>`` of the runs it beats
        significantly; the legend as ``<caption>``. Names are escaped."""
        e = html.escape
        out = ["<table>", f"<caption>{e(self._legend())}</caption>",
               "<thead><tr><th>#</th><th>run</th>" + "".join(f"<th>{e(m)}</th>" for m in self.metrics)
               + "</tr></thead>", "<tbody>"]
        for letter, name, cells in self._cells(digits):
            tds = "".join(f"<td>{e(t)}" + (f"<sup>{''.join(b)}</sup>" if b else "") + "</td>" for t, b in cells)
            out.append(f"<tr><td>{letter}</td><td>{e(name)}</td>{tds}</tr>")
        out += ["</tbody>", "</table>"]
        return "\n".join(out)

    def __str__(self) -> str:
        return self.to_markdown()

    def _repr_html_(self) -> str:  # notebooks
        return self.to_html()


def compare(qrels, runs, metrics, *, test: str = "t", correction: str | None = "auto", baseline: str | None = None,
            alpha: float = 0.05, n_permutations: int | None = None, seed: int = 0, exact_max: int | None = None,
            **options) -> Comparison:
    """Paired significance tests of ``runs`` on ``qrels`` for each of ``metrics``.

    ``runs``: a dict name -> run (any run :func:`streameval.evaluate` takes: dicts, TREC paths, ranx
    ``Run``, DataFrames, ...), or a list of runs (names from a ``name`` attribute, else ``run_1``,
    ...). ``baseline``: None compares all pairs ``(i, j)``, ``i < j`` in the order given; a run's
    name compares every other run with it. The difference is always ``system_b - system_a``
    (``system_a`` the earlier run, or the baseline).

    ``test``: ``"t"`` (the two-sided paired t-test, as ``scipy.stats.ttest_rel``; ranx's
    ``"student"``), ``"fisher"`` (the two-sided paired randomization test of the mean difference:
    exact over all ``2**n`` sign flips when the pair has at most ``exact_max`` queries, default 20,
    else ``n_permutations`` sign patterns, default 10,000, hash-seeded by query id and ``seed``:
    ``p = (1 + hits) / (1 + n_permutations)``), or ``"tukey"`` (Tukey's HSD, one way, every run a
    group of per-query scores on the queries all runs scored, as ranx and ``scipy.stats.tukey_hsd``;
    its p-values hold for all pairs at once). The t and Fisher tests use the queries both runs of
    a pair scored (trec_eval's: judged queries with results; ``complete=True`` scores judged queries
    without results 0).

    ``correction``: ``"holm"``, ``"bh"`` (Benjamini-Hochberg), ``"bonferroni"`` or None, applied per
    metric over the pairs compared; ``"auto"`` (the default) is Holm for t and Fisher and none for
    Tukey (already family-wise: another correction with Tukey is a ValueError). ``alpha``: a pair is
    significant when its corrected p-value is at most ``alpha``; ``1 - alpha`` is also the level of
    the intervals. ``options`` go to :func:`~streameval.api.score_queries` (``relevance_level``,
    ``complete``, ``depth``, ``gain``, ``columns``, ...).

    Returns a :class:`Comparison`. Raises ValueError (one line) for an unknown test, correction or
    baseline (naming the closest accepted values), fewer than two runs, or with Tukey fewer than two
    queries every run scored; MetricNameError for unknown metric names."""
    from .accumulators import bootstrap, paired
    from .metrics import multiple
    from .metrics.names import parse_metrics
    from .metrics.stats import check_level

    if not isinstance(test, str) or test.lower() not in TESTS:
        raise ValueError(f"test must be one of 't', 'fisher', 'tukey' (or ranx's 'student'), got {test!r}; "
                         f"closest: {_closest(test, TESTS)}")
    kind = TESTS[test.lower()]
    if correction not in CORRECTIONS:
        raise ValueError(f"correction must be one of 'holm', 'bh', 'bonferroni', None or 'auto', got {correction!r}; "
                         f"closest: {_closest(correction, [c for c in CORRECTIONS if c])}")
    if kind == "tukey" and correction not in ("auto", None):
        raise ValueError(f"Tukey's HSD p-values are adjusted for all pairs already: correction={correction!r} does "
                         "not apply (leave it out or pass None)")
    corr = ("holm" if kind != "tukey" else None) if correction == "auto" else correction
    level = check_level(1.0 - float(alpha))
    names, objs = _run_names(runs)
    if baseline is not None and baseline not in names:
        raise ValueError(f"baseline {baseline!r} is not one of the runs; closest: {_closest(baseline, names)}")
    for what, v in (("n_permutations", n_permutations), ("exact_max", exact_max)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0):
            raise ValueError(f"{what} must be an int >= 0, got {v!r}")
    flips = bootstrap.DEFAULT_FLIPS if n_permutations is None else int(n_permutations)
    exact = bootstrap.DEFAULT_EXACT_MAX if exact_max is None else int(exact_max)
    specs = parse_metrics(metrics, arithmetic="compare's paired tests")
    mnames = [s.name for s in specs]

    scored, means, counts = [], {}, {}
    for name, run in zip(names, objs):
        per, values = scores_by_query(qrels, run, specs, **options)
        scored.append(per)
        counts[name] = len(per)
        means[name] = {m: (math.fsum(values[i][np.isfinite(values[i])].tolist()) / int(np.isfinite(values[i]).sum())
                           if np.isfinite(values[i]).any() else math.nan) for i, m in enumerate(mnames)}

    index = {n: i for i, n in enumerate(names)}
    if baseline is None:
        pairs = [(i, j) for i in range(len(names)) for j in range(i + 1, len(names))]
    else:
        b = index[baseline]
        pairs = [(b, j) for j in range(len(names)) if j != b]

    rows = []
    if kind == "tukey":
        rows = _tukey(specs, names, scored, pairs, level)
    else:
        pc = paired.PairedComparison(len(specs), replicates=0, flips=flips if kind == "fisher" else 0,
                                        exact_max=exact if kind == "fisher" else 0, seed=seed)
        for i, j in pairs:
            a, b = scored[i], scored[j]
            shared = sorted(set(a) & set(b))
            state = pc.create()
            for q in shared:
                pc.add(state, q, a[q], b[q])
            for m, (spec, res) in enumerate(zip(specs, pc.extract(state, level))):
                row = _base_row(spec.name, names[i], names[j], kind, a, b, shared, m)
                row.update(num_queries=res["num_queries"], mean_a=res["mean_a"], mean_b=res["mean_b"],
                           diff=res["diff"], ci_low=res["t_low"], ci_high=res["t_high"])
                if kind == "t":
                    row.update(statistic=res["t"], p_value=res["p_t"], perm_method=None, permutations=0)
                else:
                    method = {"exact": "exact", "monte-carlo": "sampled"}.get(res["perm_method"])
                    row.update(statistic=math.nan, p_value=res["p_perm"], perm_method=method,
                               permutations=res["perm_samples"])
                rows.append(row)
    for spec in specs:
        family = [r for r in rows if r["metric"] == spec.name]
        if kind == "tukey":
            adj = [r["p_value"] for r in family]
        else:
            adj = multiple.adjust_pvalues([r["p_value"] for r in family], corr or "none").tolist()
        for r, v in zip(family, adj):
            r["correction"] = "tukey" if kind == "tukey" else corr
            r["p_corrected"] = v
            r["significant"] = bool(math.isfinite(v) and v <= alpha)
    order = {m: k for k, m in enumerate(mnames)}
    rows.sort(key=lambda r: order[r["metric"]])  # metric by metric, pairs in order (stable)
    return Comparison(rows=rows, runs=names, metrics=mnames, means=means, test=kind,
                      correction="tukey" if kind == "tukey" else corr, alpha=float(alpha), baseline=baseline,
                      num_queries=counts)


def scores_by_query(qrels, run, specs, **options) -> tuple[dict, np.ndarray]:
    """``({query id: scores of specs}, scores (len(specs), n_queries))``: one run's per-query scores
    (:func:`~streameval.api.score_queries`, its warnings silenced: the pairs report their queries),
    what :func:`compare` and ``streameval compare`` test."""
    from .api import score_queries

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _, prep, values = score_queries(qrels, run, specs, **options)
    return {str(q): values[:, j] for j, q in enumerate(prep.qids)}, values


def _base_row(metric, name_a, name_b, kind, a, b, shared, m) -> dict:
    """A row's names and win/tie/loss counts (B against A) on the queries ``shared`` where both
    scores of metric ``m`` are finite."""
    x = np.array([a[q][m] for q in shared], dtype=np.float64)
    y = np.array([b[q][m] for q in shared], dtype=np.float64)
    ok = np.isfinite(x) & np.isfinite(y)
    d = y[ok] - x[ok]
    ties = int(np.count_nonzero(np.abs(d) <= TIE_TOLERANCE))
    wins = int(np.count_nonzero(d > TIE_TOLERANCE))
    return {"metric": metric, "system_a": name_a, "system_b": name_b, "test": kind, "wins": wins, "ties": ties,
            "losses": int(d.size) - wins - ties}


def _tukey(specs, names, scored, pairs, level) -> list:
    """Tukey's HSD per metric over every run, on the queries all runs scored with finite scores;
    the rows of ``pairs``."""
    from .metrics import multiple

    common = sorted(set.intersection(*(set(s) for s in scored)))
    out = []
    for m, spec in enumerate(specs):
        table = np.array([[s[q][m] for s in scored] for q in common], dtype=np.float64).reshape(len(common), len(names))
        keep = np.isfinite(table).all(axis=1)
        table = table[keep]
        if table.shape[0] < 2:
            raise ValueError(f"Tukey's HSD for {spec.name}: fewer than two queries scored by every run "
                             f"({table.shape[0]})")
        res = multiple.tukey_hsd(table.T, level)
        at = {tuple(p): k for k, p in enumerate(res.pairs.tolist())}
        qs = [q for q, k in zip(common, keep) if k]
        for i, j in pairs:
            k = at[(min(i, j), max(i, j))]
            sign = 1.0 if i < j else -1.0  # res.diff is mean[j] - mean[i] for i < j
            row = _base_row(spec.name, names[i], names[j], "tukey", scored[i], scored[j], qs, m)
            lo, hi = float(res.low[k]), float(res.high[k])
            row.update(num_queries=int(table.shape[0]), mean_a=float(res.means[i]), mean_b=float(res.means[j]),
                       diff=sign * float(res.diff[k]), ci_low=lo if sign > 0 else -hi,
                       ci_high=hi if sign > 0 else -lo, statistic=float(res.q[k]), p_value=float(res.pvalue[k]),
                       perm_method=None, permutations=0)
            out.append(row)
    return out
