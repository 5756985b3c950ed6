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
  ``sqrt(sum se_i^2) / N``), lies entirely below / above it;
* ``min_n`` (default 2): rows with fewer queries (impressions, for CTR) never fire;
* ``for_panes`` (default 1; the streaming job): the condition must hold on that many consecutive
  panes of a window before the alert fires (once per rule, window, slice and system). A batch row is
  a window's final value: one look, ``for_panes`` does not apply.

An alert record (schema ``schemas/alert.avsc``) names the rule, the window, slice, system, metric,
value, interval, baseline and the condition that held.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable

__all__ = ["Rule", "load_rules", "parse_rules", "evaluate", "evaluate_row", "format_alert", "ALERT_FIELDS",
           "RULE_KEYS"]

#: the keys a rule may have (``name`` and ``metric`` are required, and one condition)
RULE_KEYS = ("name", "metric", "slice", "system", "min_n", "below", "above", "baseline", "change_below",
             "change_above", "level", "for_panes")
ALERT_FIELDS = ("rule", "window_start", "window_end", "slice", "system", "metric", "value", "num_queries",
                "ci_low", "ci_high", "baseline", "baseline_of", "diff_low", "diff_high", "condition", "pane",
                "pane_index")


@dataclass(frozen=True)
class Rule:
    """One alert rule (see the module docstring); ``slice`` / ``system`` None match every one;
    ``baseline``: None, ``("system", name)`` or ``("trailing", n)``."""

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


def load_rules(path: str) -> list[Rule]:
    """The rules of the TOML file ``path`` (read through Beam's FileSystems when it has a scheme).
    Raises ValueError with one line naming the file, the rule and the problem."""
    import tomllib

    try:
        if "://" in str(path):
            from apache_beam.io.filesystems import FileSystems

            with FileSystems.open(str(path)) as fo:
                data = fo.read()
        else:
            with open(path, "rb") as fo:
                data = fo.read()
    except Exception as e:  # noqa: BLE001 (missing file, a directory, Beam's wrapped errors)
        raise ValueError(f"alerts file {path}: cannot read it ({type(e).__name__}: {e})") from None
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
    if "baseline" in item:
        kw["baseline"] = _baseline(item["baseline"])
        if not change or threshold:
            raise ValueError("a rule with a baseline takes change_below and/or change_above (not below/above)")
    elif change:
        raise ValueError("change_below / change_above need a baseline ('system:NAME' or 'trailing:N')")
    elif not threshold:
        raise ValueError("no condition: give below / above, or a baseline with change_below / change_above")
    return Rule(**kw)


def _baseline(text) -> tuple:
    if isinstance(text, str):
        kind, _, arg = text.partition(":")
        if kind == "system" and arg:
            return ("system", arg)
        if kind == "trailing" and arg.isdigit() and int(arg) >= 1:
            return ("trailing", int(arg))
    raise ValueError(f"baseline must be 'system:NAME' or 'trailing:N' (N >= 1), got {text!r}")


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


def _alert(rule, row, condition, baseline=None, baseline_of=None, diff=None) -> dict:
    return {"rule": rule.name, "window_start": row.get("window_start"), "window_end": row.get("window_end"),
            "slice": row["slice"], "system": row["system"], "metric": row["metric"], "value": row["value"],
            "num_queries": row["num_queries"], "ci_low": row.get("ci_low"), "ci_high": row.get("ci_high"),
            "baseline": baseline, "baseline_of": baseline_of,
            "diff_low": None if diff is None else diff[0], "diff_high": None if diff is None else diff[1],
            "condition": condition, "pane": row.get("pane"), "pane_index": row.get("pane_index")}


def _matches(rule, row) -> bool:
    return (row["metric"] == rule.metric and (rule.slice is None or row["slice"] == rule.slice)
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


def evaluate_row(rule: Rule, row: dict, others: Iterable[dict]) -> dict | None:
    """The alert ``rule`` raises on ``row``, or None; ``others``: rows of the same metric and slice
    (the baseline system's row of the window, the series' earlier windows), ``row`` among them or
    not."""
    if not _matches(rule, row) or not _finite(row.get("value")) or (row.get("num_queries") or 0) < rule.min_n:
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
    if rule.baseline[0] == "system":
        if row["system"] == rule.baseline[1]:
            return None
        b = next((r for r in others if r["system"] == rule.baseline[1] and r["slice"] == row["slice"]
                  and r["metric"] == row["metric"] and r["window_start"] == row["window_start"]), None)
        if b is None or not _finite(b.get("value")) or (b.get("num_queries") or 0) < rule.min_n:
            return None
        return _change(rule, row, b["value"], b.get("stderr"), f"system {rule.baseline[1]}")
    n = rule.baseline[1]
    prev = sorted((r for r in others if r["system"] == row["system"] and r["slice"] == row["slice"]
                   and r["metric"] == row["metric"] and _window_key(r) < _window_key(row)), key=_window_key)[-n:]
    if len(prev) < n or not all(_finite(r.get("value")) and _finite(r.get("stderr")) for r in prev):
        return None
    base = math.fsum(r["value"] for r in prev) / n
    base_se = math.sqrt(math.fsum(r["stderr"] ** 2 for r in prev)) / n
    return _change(rule, row, base, base_se, f"trailing {n} windows")


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


def format_alert(a: dict) -> str:
    """The one-line ``ALERT`` text of an alert record, as the jobs print it."""
    from .io.records import format_time_range

    ws = "all" if a["window_start"] is None else format_time_range([a["window_start"]])
    pane = "" if a.get("pane") is None else f" pane {a['pane']} #{a['pane_index']}"
    return (f"ALERT {a['rule']}: {a['metric']} {a['slice']} {a['system']} window {ws}{pane}: "
            f"{a['value']:.6g} (n {a['num_queries']}), {a['condition']}")
