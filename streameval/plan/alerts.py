"""Alert rules over metric rows: a TOML file of rules, checked up front, evaluated on the rows of
one (metric, slice) at a time. Pure Python (no Beam); :class:`streameval.beam.alerts.EvaluateAlerts`
runs it in a job.

A rule fires on an interval, never on a point value alone (docs/metrics.md, "Alert rules"):

* a threshold (``below`` / ``above``): the row's interval (``ci_low`` .. ``ci_high``, whatever its
  method: t, Wilson, bootstrap, a confidence sequence) lies entirely below / above it;
* a change against a baseline (``baseline = "system:NAME"``: the same window and slice of another
  system; ``baseline = "trailing:N"``: the mean of the N preceding windows of the same series) with
  ``change_below`` / ``change_above``: the normal interval of ``value - baseline``, from the two
  standard errors (independent samples: ``sqrt(se^2 + se_b^2)``; the trailing mean's standard error
  ``sqrt(sum se_i^2) / N``), lies entirely below / above it; ``baseline = "offset:1d"`` (``Nd`` or
  ``Nh``): the same window of the same series a day (N days, N hours) earlier, a seasonal baseline,
  with the interval of two independent samples;
* ``test = "msprt"`` (``system:NAME`` baselines, one of ``change_below`` / ``change_above``, optional
  ``tau``): instead of the interval, the always-valid mSPRT p-value of ``value - baseline =
  threshold`` (:func:`streameval.metrics.stats.msprt_pvalue`), the running minimum over the panes of
  the window; fires when it is at most ``1 - level`` and the difference lies on the rule's side of
  the threshold; the record carries ``p_value`` and, as ``diff_low`` / ``diff_high``, the mSPRT
  confidence sequence of the difference at this look;
* ``test = "srm"`` (``metric = "srm"``, ``p_below``): a sample-ratio mismatch, the batch job's ``srm``
  row (``--expected-split``) whose chi-square p-value is below ``p_below`` (e.g. 0.001, the field's
  usual threshold: Fabijan et al., KDD 2019); the row's value is already a test's p-value, so the rule
  compares it, and the record carries it as ``p_value``;
* ``min_n`` (default 2): rows with fewer queries (impressions, for CTR) never fire;
* ``for_panes`` (default 1; the streaming job): the condition must hold on that many consecutive
  panes of a window before the alert fires (once per rule, window, slice and system). A batch row is
  a window's final value: one look, ``for_panes`` does not apply.

An alert record (schema ``schemas/alert.avsc``) names the rule, the window, slice, system, metric,
value, interval, baseline, the condition that held and, for mSPRT rules, the p-value.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable

from ..metrics.online_names import same_metric

__all__ = ["Rule", "load_rules", "parse_rules", "evaluate", "evaluate_row", "change_pvalue", "format_alert",
           "check_rules_match", "unknown_measure", "ALERT_FIELDS", "RULE_KEYS", "TESTS"]

#: the keys a rule may have (``name`` and ``metric`` are required, and one condition)
RULE_KEYS = ("name", "metric", "slice", "system", "min_n", "below", "above", "baseline", "change_below",
             "change_above", "level", "for_panes", "test", "tau", "p_below")
#: ``test``: the normal interval of the difference (default), the always-valid mSPRT p-value, or
#: a sample-ratio mismatch (the ``srm`` row's p-value below ``p_below``)
TESTS = ("interval", "msprt", "srm")
_UNITS = {"h": 3_600_000_000, "d": 86_400_000_000}
ALERT_FIELDS = ("rule", "window_start", "window_end", "slice", "system", "metric", "value", "num_queries",
                "ci_low", "ci_high", "baseline", "baseline_of", "diff_low", "diff_high", "condition", "pane",
                "pane_index", "p_value")


@dataclass(frozen=True)
class Rule:
    """One alert rule (see the module docstring); ``slice`` / ``system`` None match every one;
    ``baseline``: None, ``("system", name)``, ``("trailing", n)`` or ``("offset", micros, text)``;
    ``tau``: the mSPRT mixture scale (None: :data:`streameval.metrics.stats.MSPRT_TAU`)."""

    name: str
    metric: str
    slice: str | None = None
    system: str | None = None
    min_n: int = 2
    below: float | None = None
    above: float | None = None
    baseline: tuple | None = None
    change_below: float | None = None
    change_above: float | None = None
    level: float = 0.95
    for_panes: int = 1
    test: str = "interval"
    tau: float | None = None
    p_below: float | None = None


def load_rules(path: str) -> list[Rule]:
    """The rules of the TOML file ``path`` (read through Beam's FileSystems when it has a scheme).
    Raises ValueError with one line naming the file, the rule and the problem."""
    import tomllib

    from ..io.tables import read_bytes

    try:
        data = read_bytes(str(path))  # a local file, or any Beam file system's
    except ValueError as e:  # one line naming the path and why (missing file, a directory, Beam's errors)
        raise ValueError(f"alerts file {e}") from None
    try:
        doc = tomllib.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise ValueError(f"alerts file {path}: not TOML ({e})") from None
    return parse_rules(doc, str(path))


def _number(v, what) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise ValueError(f"{what} must be a finite number, got {v!r}")
    return float(v)


def parse_rules(doc: dict, where: str = "alerts") -> list[Rule]:
    """Rules from a parsed TOML document ``{"rule": [{...}, ...]}``; ValueError naming ``where``,
    the rule (its number and name) and the problem for anything else."""
    if not isinstance(doc, dict) or set(doc) - {"rule"}:
        extra = sorted(set(doc) - {"rule"}) if isinstance(doc, dict) else doc
        raise ValueError(f"alerts file {where}: only [[rule]] tables are allowed, got {extra!r}")
    items = doc.get("rule", [])
    if not isinstance(items, list) or not items:
        raise ValueError(f"alerts file {where}: no [[rule]] table")
    rules, names = [], set()
    for i, item in enumerate(items, 1):
        label = f"alerts file {where}: rule {i}" + (f" ({item.get('name')!r})" if isinstance(item, dict) and
                                                     "name" in item else "")
        try:
            rule = _rule(item)
        except ValueError as e:
            raise ValueError(f"{label}: {e}") from None
        if rule.name in names:
            raise ValueError(f"{label}: the name is used by an earlier rule")
        names.add(rule.name)
        rules.append(rule)
    return rules


def _rule(item) -> Rule:
    if not isinstance(item, dict):
        raise ValueError(f"a rule is a table, got {item!r}")
    unknown = sorted(set(item) - set(RULE_KEYS))
    if unknown:
        raise ValueError(f"unknown key {unknown[0]!r} (known: {', '.join(RULE_KEYS)})")
    for key in ("name", "metric"):
        if not isinstance(item.get(key), str) or not item[key]:
            raise ValueError(f"{key} is required (a non-empty string)")
    for key in ("slice", "system"):
        if key in item and not isinstance(item[key], str):
            raise ValueError(f"{key} must be a string, got {item[key]!r}")
    kw = {k: item[k] for k in ("name", "metric", "slice", "system") if k in item}
    for key in ("min_n", "for_panes"):
        if key in item:
            n = item[key]
            if isinstance(n, bool) or not isinstance(n, int) or n < 1:
                raise ValueError(f"{key} must be a positive integer, got {n!r}")
            kw[key] = n
    if "level" in item:
        level = _number(item["level"], "level")
        if not 0 < level < 1:
            raise ValueError(f"level must be in (0, 1), got {level}")
        kw["level"] = level
    for key in ("below", "above", "change_below", "change_above"):
        if key in item:
            kw[key] = _number(item[key], key)
    threshold = "below" in kw or "above" in kw
    change = "change_below" in kw or "change_above" in kw
    if item.get("test") == "srm" or "p_below" in item:
        if item.get("test") != "srm":
            raise ValueError("p_below is the sample-ratio mismatch rule's threshold: give it with test = 'srm'")
        if kw["metric"] != "srm":
            raise ValueError(f"test = 'srm' reads the srm rows (--expected-split): metric must be 'srm', got "
                             f"{kw['metric']!r}")
        if threshold or change or "baseline" in item or "tau" in item:
            raise ValueError("test = 'srm' takes p_below only (not below/above, a baseline or tau)")
        if "p_below" not in item:
            raise ValueError("test = 'srm' needs p_below (the p-value under which the split is broken, e.g. 0.001)")
        p = _number(item["p_below"], "p_below")
        if not 0 < p < 1:
            raise ValueError(f"p_below must be in (0, 1), got {p}")
        return Rule(**kw, test="srm", p_below=p)
    if "baseline" in item:
        kw["baseline"] = _baseline(item["baseline"])
        if not change or threshold:
            raise ValueError("a rule with a baseline takes change_below and/or change_above (not below/above)")
    elif change:
        raise ValueError("change_below / change_above need a baseline ('system:NAME', 'trailing:N' or 'offset:1d')")
    elif not threshold:
        raise ValueError("no condition: give below / above, or a baseline with change_below / change_above")
    if "test" in item:
        if item["test"] not in TESTS:
            raise ValueError(f"test must be one of {', '.join(map(repr, TESTS))}, got {item['test']!r}")
        kw["test"] = item["test"]
    if "tau" in item:
        tau = _number(item["tau"], "tau")
        if tau <= 0 or kw.get("test") != "msprt":
            raise ValueError(f"tau is the mSPRT mixture scale: a positive number with test = 'msprt', got {tau}")
        kw["tau"] = tau
    if kw.get("test") == "msprt":
        if kw.get("baseline", ("",))[0] != "system":
            raise ValueError("test = 'msprt' needs baseline = 'system:NAME' (both sides of the difference grow "
                             "pane by pane in the same window)")
        if ("change_below" in kw) == ("change_above" in kw):
            raise ValueError("test = 'msprt' takes one of change_below / change_above (the null value of the difference)")
    return Rule(**kw)


def _baseline(text) -> tuple:
    if isinstance(text, str):
        kind, _, arg = text.partition(":")
        if kind == "system" and arg:
            return ("system", arg)
        if kind == "trailing" and arg.isdigit() and int(arg) >= 1:
            return ("trailing", int(arg))
        if kind == "offset" and arg[:-1].isdigit() and int(arg[:-1]) >= 1 and arg[-1:] in _UNITS:
            return ("offset", int(arg[:-1]) * _UNITS[arg[-1]], arg)
    raise ValueError(f"baseline must be 'system:NAME', 'trailing:N' or 'offset:Nd' / 'offset:Nh' (N >= 1), got {text!r}")


def _finite(x) -> bool:
    return x is not None and isinstance(x, (int, float)) and math.isfinite(x)


def _diff_interval(value, se, base, base_se, level):
    from scipy import special

    if not (_finite(value) and _finite(se) and _finite(base) and _finite(base_se)):
        return None
    z = float(special.ndtri((1.0 + level) / 2.0))
    half = z * math.sqrt(se * se + base_se * base_se)
    d = value - base
    return d - half, d + half


def _alert(rule, row, condition, baseline=None, baseline_of=None, diff=None, p_value=None) -> dict:
    return {"rule": rule.name, "window_start": row.get("window_start"), "window_end": row.get("window_end"),
            "slice": row["slice"], "system": row["system"], "metric": row["metric"], "value": row["value"],
            "num_queries": row["num_queries"], "ci_low": row.get("ci_low"), "ci_high": row.get("ci_high"),
            "baseline": baseline, "baseline_of": baseline_of,
            "diff_low": None if diff is None else diff[0], "diff_high": None if diff is None else diff[1],
            "condition": condition, "pane": row.get("pane"), "pane_index": row.get("pane_index"),
            "p_value": p_value}


def _matches(rule, row) -> bool:
    return (same_metric(row["metric"], rule.metric) and (rule.slice is None or row["slice"] == rule.slice)
            and (rule.system is None or row["system"] == rule.system))


def _change(rule, row, base, base_se, baseline_of):
    diff = _diff_interval(row["value"], row.get("stderr"), base, base_se, rule.level)
    if diff is None:
        return None
    if rule.change_below is not None and diff[1] < rule.change_below:
        return _alert(rule, row, f"value - baseline below {rule.change_below:g} (interval {diff[0]:.6g} .. "
                                 f"{diff[1]:.6g})", base, baseline_of, diff)
    if rule.change_above is not None and diff[0] > rule.change_above:
        return _alert(rule, row, f"value - baseline above {rule.change_above:g} (interval {diff[0]:.6g} .. "
                                 f"{diff[1]:.6g})", base, baseline_of, diff)
    return None


def _window_key(r):
    return (r["window_start"] is not None, r["window_start"] or 0)


def _baseline_row(rule, row, others):
    """The (value, stderr, what) of ``row``'s baseline under ``rule``, or None (no baseline row, too
    few queries, a row that is its own baseline)."""
    kind = rule.baseline[0]
    if kind == "system":
        if row["system"] == rule.baseline[1]:
            return None
        b = next((r for r in others if r["system"] == rule.baseline[1] and r["slice"] == row["slice"]
                  and r["metric"] == row["metric"] and r["window_start"] == row["window_start"]), None)
        what = f"system {rule.baseline[1]}"
    elif kind == "offset":
        if row.get("window_start") is None:
            return None
        ws = row["window_start"] - rule.baseline[1]
        b = next((r for r in others if r["system"] == row["system"] and r["slice"] == row["slice"]
                  and r["metric"] == row["metric"] and r["window_start"] == ws), None)
        what = f"same window {rule.baseline[2]} earlier"
    else:
        n = rule.baseline[1]
        prev = sorted((r for r in others if r["system"] == row["system"] and r["slice"] == row["slice"]
                       and r["metric"] == row["metric"] and _window_key(r) < _window_key(row)),
                      key=_window_key)[-n:]
        if len(prev) < n or not all(_finite(r.get("value")) and _finite(r.get("stderr")) for r in prev):
            return None
        return (math.fsum(r["value"] for r in prev) / n, math.sqrt(math.fsum(r["stderr"] ** 2 for r in prev)) / n,
                f"trailing {n} windows")
    if b is None or not _finite(b.get("value")) or (b.get("num_queries") or 0) < rule.min_n:
        return None
    return b["value"], b.get("stderr"), what


def _eligible(rule, row) -> bool:
    return _matches(rule, row) and _finite(row.get("value")) and (row.get("num_queries") or 0) >= rule.min_n


def _msprt_look(rule, row, base):
    """(p of this look alone, difference, its variance, theta0, tau), or None without standard errors."""
    from ..metrics import stats

    value, se, (b, b_se, _) = row["value"], row.get("stderr"), base
    if not (_finite(se) and _finite(b_se)) or se * se + b_se * b_se <= 0:
        return None
    theta0 = rule.change_below if rule.change_below is not None else rule.change_above
    tau = stats.MSPRT_TAU if rule.tau is None else rule.tau
    d, var = value - b, se * se + b_se * b_se
    return stats.msprt_pvalue(d, var, tau, theta0), d, var, theta0, tau


def change_pvalue(rule: Rule, row: dict, others: Iterable[dict], p_prev: float = 1.0) -> float | None:
    """For a ``test = "msprt"`` rule: the always-valid p-value after the look at ``row``, ``min(p_prev,
    1 / Lambda)`` (``p_prev``: the running minimum of the window's earlier panes, 1 at the first);
    None when the rule does not apply to the row or there is no baseline row with standard errors
    at this look (the running minimum then stays as it was)."""
    look = change_look(rule, row, others, p_prev)
    return None if look is None else look["p_value"]


def change_look(rule: Rule, row: dict, others: Iterable[dict], p_prev: float = 1.0) -> dict | None:
    """For a ``test = "msprt"`` rule, the look at ``row`` as a record for monitoring: ``rule``,
    ``metric``, ``slice``, ``system``, ``window_start``, ``window_end``, ``pane``, ``pane_index``,
    ``p_value`` (the running minimum, :func:`change_pvalue`), ``diff`` (value - baseline),
    ``diff_low`` / ``diff_high`` (the always-valid interval of the difference at the rule's level,
    :func:`streameval.metrics.stats.msprt_cs`) and ``null`` (theta0); None as for
    :func:`change_pvalue`."""
    if rule.test != "msprt" or not _eligible(rule, row):
        return None
    base = _baseline_row(rule, row, others)
    look = None if base is None else _msprt_look(rule, row, base)
    if look is None:
        return None
    from ..metrics import stats

    p_look, d, var, theta0, tau = look
    lo, hi = stats.msprt_cs(d, var, tau, rule.level)
    return {"rule": rule.name, "metric": row["metric"], "slice": row["slice"], "system": row["system"],
            "window_start": row.get("window_start"), "window_end": row.get("window_end"), "pane": row.get("pane"),
            "pane_index": row.get("pane_index"), "p_value": min(p_prev, p_look), "diff": d, "diff_low": lo,
            "diff_high": hi, "null": theta0}


def _msprt(rule, row, base, p_prev):
    from ..metrics import stats

    look = _msprt_look(rule, row, base)
    if look is None:
        return None
    p_look, d, var, theta0, tau = look
    p = min(p_prev, p_look)
    alpha = 1.0 - rule.level
    side = "below" if rule.change_below is not None else "above"
    if p > alpha or (d >= theta0 if side == "below" else d <= theta0):
        return None
    cs = stats.msprt_cs(d, var, tau, rule.level)
    return _alert(rule, row, f"value - baseline {d:.6g} {side} {theta0:g}, always-valid p {p:.3g} <= {alpha:.3g} "
                             f"(mSPRT, tau {tau:g})", base[0], base[2], cs, p)


def evaluate_row(rule: Rule, row: dict, others: Iterable[dict], p_prev: float = 1.0) -> dict | None:
    """The alert ``rule`` raises on ``row``, or None; ``others``: rows of the same metric and slice
    (the baseline system's row of the window, the series' earlier windows), ``row`` among them or
    not. ``p_prev`` (``test = "msprt"`` rules): the running minimum of the always-valid p-value over
    the window's earlier panes (1: none, a batch row's single look)."""
    if not _eligible(rule, row):
        return None
    if rule.test == "srm":
        p = row["value"]
        if p < rule.p_below:
            return _alert(rule, row, f"sample-ratio mismatch: chi-square p = {p:.3g} below {rule.p_below:g}",
                          rule.p_below, "threshold", p_value=p)
        return None
    if rule.baseline is None:
        lo, hi = row.get("ci_low"), row.get("ci_high")
        if not (_finite(lo) and _finite(hi)):
            return None
        if rule.below is not None and hi < rule.below:
            return _alert(rule, row, f"interval {lo:.6g} .. {hi:.6g} below {rule.below:g}", rule.below, "threshold")
        if rule.above is not None and lo > rule.above:
            return _alert(rule, row, f"interval {lo:.6g} .. {hi:.6g} above {rule.above:g}", rule.above, "threshold")
        return None
    others = list(others)
    base = _baseline_row(rule, row, others)
    if base is None:
        return None
    if rule.test == "msprt":
        return _msprt(rule, row, base, p_prev)
    return _change(rule, row, base[0], base[1], base[2])


def evaluate(rules: Iterable[Rule], rows: Iterable[dict]) -> list[dict]:
    """The alerts the ``rules`` raise on metric ``rows`` (metric_result dicts of one job, one row per
    window, slice, system and metric; a rule with a baseline finds the other systems' and the
    earlier windows' rows among them), in a stable order (rule, slice, system, window)."""
    rows = [r for r in rows if r.get("value") is not None]
    by_metric_slice: dict = {}
    for r in rows:
        by_metric_slice.setdefault((r["metric"], r["slice"]), []).append(r)
    out = []
    for rule in rules:
        mine = sorted((r for r in rows if _matches(rule, r)), key=lambda r: (r["slice"], r["system"], _window_key(r)))
        for row in mine:
            alert = evaluate_row(rule, row, by_metric_slice[(row["metric"], row["slice"])])
            if alert:
                out.append(alert)
    return out


def check_rules_match(rules: Iterable[Rule], rows: Iterable[dict], where: str = "the job's metric rows") -> None:
    """Raises :class:`streameval.io.selection.NoMatchError` (a ValueError, one line) for the first
    rule that matches no row of ``rows`` (dicts with ``metric``, ``system``, ``slice``; a job's
    output): its metric (any spelling) is no row's, or, among that metric's rows, its ``system``
    is none's, or, among those, its ``slice`` is none's. The message names the rule and the three
    closest values present (issue 41: a rule on ``ndgc@10`` gave "0 fired", exit 0)."""
    from ..io.selection import check_metrics, check_selects

    rows = [r for r in rows if r.get("metric") is not None]
    for rule in rules:
        label = f"alert rule {rule.name!r}: "
        check_metrics([rule.metric], [r["metric"] for r in rows], where=f" of {where}", label=label)
        mine = [r for r in rows if same_metric(r["metric"], rule.metric)]
        if rule.system is not None:
            check_selects("system", [rule.system], [r["system"] for r in mine],
                          where=f" of metric {rule.metric} in {where}", label=label)
            mine = [r for r in mine if r["system"] == rule.system]
        if rule.slice is not None:
            check_selects("slice", [rule.slice], [r["slice"] for r in mine],
                          where=f" of metric {rule.metric}" + (f", system {rule.system}," if rule.system else "")
                                + f" in {where}", label=label)
        if rule.baseline is not None and rule.baseline[0] == "system":
            check_selects("system", [rule.baseline[1]], [r["system"] for r in rows if same_metric(r["metric"], rule.metric)],
                          where=f" of metric {rule.metric} in {where} (baseline = 'system:{rule.baseline[1]}')",
                          label=label)


#: the metric rows whose names are no measure name of :mod:`streameval.metrics`: the sample-ratio
#: test's (``--expected-split``) and the off-policy estimates' (``streameval ope``)
_OTHER_ROWS = ("srm",)
_ESTIMATES = ("ips[", "snips[", "ope[")


def unknown_measure(name: str):
    """None when ``name`` is the name of a metric row some job writes (a ranking or online measure
    in any spelling, ``srm``, an off-policy estimate ``ips[...]``, or a row derived from one:
    ``ctr:clusters``, ``auc_hist:max_error``, ``srm:chi2``); else the one-line
    :class:`~streameval.metrics.names.MetricNameError` naming the three closest measure names
    (``alerts-to-prometheus`` refuses such a rule: it could never match a series); a reliability
    diagram's ``calibration_bin[...]:observed`` rows are known too."""
    from ..metrics.online_names import is_online_metric, unknown_metric_error
    from ..metrics.names import MetricNameError, parse_metric

    def known(n: str) -> bool:
        if n in _OTHER_ROWS or (n.startswith(_ESTIMATES) and n.endswith("]")) or is_online_metric(n) \
                or (n.startswith("calibration_bin[") and n.endswith(("]:predicted", "]:observed"))):
            return True
        try:
            parse_metric(n, diversity=True)
            return True
        except MetricNameError:
            pass
        base, sep, tail = n.rpartition(":")
        return bool(sep and base and tail.replace("_", "").isalnum() and known(base))

    text = str(name).strip()
    return None if known(text) else unknown_metric_error(text, diversity=True)


def format_alert(a: dict) -> str:
    """The one-line ``ALERT`` text of an alert record, as the jobs print it."""
    from ..io.records import format_time_range

    ws = "all" if a["window_start"] is None else format_time_range([a["window_start"]])
    pane = "" if a.get("pane") is None else f" pane {a['pane']} #{a['pane_index']}"
    return (f"ALERT {a['rule']}: {a['metric']} {a['slice']} {a['system']} window {ws}{pane}: "
            f"{a['value']:.6g} (n {a['num_queries']}), {a['condition']}")
