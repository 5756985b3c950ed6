"""Off-policy estimates of a target policy's CTR from another policy's logs (``streameval ope``).

    python -m streameval.jobs.ope --logs 'obd/bts/*/*.csv' --target random --target-logs 'obd/random/*/*.csv'
    python -m streameval.jobs.ope --logs 'obd/random/*/*.csv' --target bts --target-logs 'obd/bts/*/*.csv'
    python -m streameval.jobs.ope --logs 'obd/random/*/*.csv' --target logged --target-logs 'obd/bts/*/*.csv'

Reads impression logs with propensities (Avro impression files, or Open Bandit Dataset CSVs which
are converted with :func:`streameval.io.convert.obd_to_impressions`, the system being the policy
folder ``bts`` / ``random`` and the campaign the folder below it), and computes per slice (``all``
and each value of ``--slice``, default ``campaign``) and logging system the IPS and SNIPS estimates
of the target policy's CTR with standard errors (:class:`~streameval.beam.online.OffPolicyCtr`).
With ``--target-logs`` (the target policy's own logs) it prints the CTR actually measured for the
target beside the estimates (:class:`~streameval.beam.transforms.ClickMetrics`). With
``--reward-model PATH`` (per impression ``reward_hat`` and ``dm_value``, :mod:`streameval.io.reward_model`)
also the direct method, doubly robust, self-normalised DR and Switch-DR (``--switch-tau``, repeatable,
default 1) rows. With ``--slate`` also the slate estimators over requests (a request's impressions at
their positions: one slate; rows ``slate_ips``, ``iips``, ``rips``, ``pi`` [TARGET] and their ``:ess``,
:mod:`streameval.beam.online_slate`). One stderr line warns when an effective sample size is small
(:func:`small_ess_warning`), one more when a slate estimator's is (:func:`small_slate_ess_warning`).

Targets (the probability that the target shows the logged item at the logged position):

* ``random``: uniform over the slice's catalogue, 1 / n_items. n_items from ``--n-items
  campaign=80,...`` or, for Open Bandit CSVs, the rows of the campaign's ``item_context.csv``.
  The command checks it against the target logs' propensities when they are the random policy's.
* ``bts``: Bernoulli Thompson Sampling with ZOZOTOWN's production prior, the Beta parameters obp
  0.4.1 ships in ``obp/policy/conf/prior_bts.yaml`` (``--bts-prior`` or the installed obp package;
  ``pip install --no-deps obp==0.4.1`` suffices: only that file is read), action distribution by
  Monte Carlo (:func:`~streameval.metrics.online.bts_action_probabilities`, identical to
  ``obp.policy.BernoulliTS.compute_batch_action_dist``). This is BTS frozen at its parameters at the
  start of data collection; the deployed BTS updated them during the week.
* ``logged``: the target policy's own logged propensities (``--target-logs``) at the nearest
  logged time for the same (slice, item, position) (:class:`~streameval.metrics.online.LoggedPropensityTarget`):
  the time-varying deployed policy, valid for a context-free policy such as BTS.

Runs Beam's FnApiRunner (``--runner`` and Beam's own options pass to Beam). Writes
``metrics.{avro,jsonl}``, ``dead_letters.{avro,jsonl}`` and, last, ``manifest.json`` when
``--output`` is given (the folder checked against the logs, locked, and its previous outputs replaced
only when the run ends: :func:`streameval.beam.sinks.start_output`).
"""

from __future__ import annotations

import csv
import glob
import math
import os
import shutil
import sys
import tempfile
import time

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions

from streameval.beam.accounting import job_counters, stall_timeout_from_args, wait_for_job
from streameval.beam.arguments import make_pipeline, unknown_arguments_error
from streameval.beam.flink_options import reuse_workers
from streameval import interrupts
from streameval.exits import one_line
from streameval.beam.sinks import holding_outputs, publish, read_metric_rows, start_output, write_records
from streameval.beam.sources import ReadAvro
from streameval.beam.online import OffPolicyCtr, tau_label
from streameval.beam.transforms import CleanImpressions, ClickMetrics, ValidateImpressions
from streameval.io import avro, convert
from streameval.io import counters as cn
from streameval.io.outdir import OutputInUseError, OutputOverlapError
from streameval.io.reward_model import RewardModelTable, read_reward_model
from streameval.jobs.ope_args import TARGETS, build_arg_parser  # noqa: F401  (Beam-free: parsed first)
from streameval.metrics.online_slate import SLATE_ESTIMATORS
from streameval.metrics.online import (
    DEFAULT_SWITCH_TAU,
    LoggedPropensityTarget,
    TableTarget,
    UniformTarget,
    bts_action_probabilities,
)

__all__ = ["main", "build_arg_parser", "read_bts_prior", "default_bts_prior_path", "TARGETS", "ESS_WARN_MIN",
           "ESS_WARN_FRACTION", "small_ess_warning", "small_slate_ess_warning"]

#: ``streameval ope`` warns (one stderr line) when an estimate row's effective sample size (Kong's
#: (sum w)^2 / sum w^2, the ``ope[TARGET]:ess`` row) is below ESS_WARN_MIN or below ESS_WARN_FRACTION
#: of its impressions
ESS_WARN_MIN = 100
ESS_WARN_FRACTION = 0.01

# --------------------------------------------------------------------------------------------
# inputs

def _expand(patterns) -> list[str]:
    paths: list[str] = []
    for pat in patterns:
        if os.path.basename(pat) == "item_context.csv":  # Open Bandit catalogue files, read beside the logs
            continue
        matches = sorted(glob.glob(pat, recursive=True)) if glob.has_magic(pat) else [pat]
        if not matches:
            raise FileNotFoundError(f"no files match the pattern {pat!r}")
        matches = [m for m in matches if os.path.basename(m) != "item_context.csv"]
        for m in matches:
            if not os.path.isfile(m):
                raise FileNotFoundError(f"input file not found: {m}")
        paths.extend(matches)
    return paths


def _obd_names(path: str, system: str | None) -> tuple[str, str]:
    d = os.path.dirname(os.path.abspath(path))
    return system or os.path.basename(os.path.dirname(d)), os.path.basename(d)


def load_records(paths, system=None) -> tuple[list[dict], dict]:
    """Impression dicts of Avro files and Open Bandit CSVs, and {campaign: catalogue size} from
    the CSVs' item_context.csv files."""
    recs: list[dict] = []
    catalogue: dict = {}
    for path in paths:
        if path.lower().endswith(".csv"):
            sys_id, campaign = _obd_names(path, system)
            recs.extend(convert.obd_to_impressions(path, sys_id, campaign=campaign))
            ctx = os.path.join(os.path.dirname(path), "item_context.csv")
            if os.path.isfile(ctx):
                with open(ctx, newline="", encoding="utf-8") as f:
                    catalogue[campaign] = sum(1 for _ in csv.reader(f)) - 1
        else:
            recs.extend(avro.read_records(path, "impression"))
    return recs, catalogue


def default_bts_prior_path() -> str | None:
    """``obp/policy/conf/prior_bts.yaml`` of the installed obp package (found without importing
    ``obp.policy``, which needs torch), or None."""
    import importlib.util

    spec = importlib.util.find_spec("obp")
    if spec is None or not spec.submodule_search_locations:
        return None
    for loc in spec.submodule_search_locations:
        p = os.path.join(loc, "policy", "conf", "prior_bts.yaml")
        if os.path.isfile(p):
            return p
    return None


def read_bts_prior(path: str) -> dict:
    """{campaign: {"alpha": [...], "beta": [...]}} from obp's prior_bts.yaml (a two-level mapping of
    number lists; read without a YAML library)."""
    out: dict = {}
    campaign = key = None
    with open(path, encoding="utf-8") as f:
        for lineno, raw in enumerate(f, 1):
            line = raw.split("#", 1)[0].rstrip()
            if not line.strip():
                continue
            indent = len(line) - len(line.lstrip())
            text = line.strip()
            if text.startswith("- "):
                if campaign is None or key is None:
                    raise ValueError(f"{path}:{lineno}: list item outside a campaign's alpha/beta")
                out[campaign][key].append(float(text[2:]))
            elif text.endswith(":") and indent == 0:
                campaign, key = text[:-1].strip(), None
                out[campaign] = {}
            elif text.endswith(":") and campaign is not None:
                key = text[:-1].strip()
                out[campaign][key] = []
            else:
                raise ValueError(f"{path}:{lineno}: unexpected line {text!r}")
    for c, v in out.items():
        if set(v) != {"alpha", "beta"} or len(v["alpha"]) != len(v["beta"]):
            raise ValueError(f"{path}: campaign {c!r} needs alpha and beta lists of one length")
    return out


def _n_items(text, catalogue, slice_attr):
    if text is None:
        if not catalogue:
            raise ValueError("--target random needs --n-items (no item_context.csv next to the logs)")
        return UniformTarget(catalogue, attribute=slice_attr) if slice_attr else None, catalogue
    if "=" not in text:
        return UniformTarget(int(text)), {"*": int(text)}
    table = {}
    for part in text.split(","):
        k, _, v = part.partition("=")
        table[k.strip()] = int(v)
    if not slice_attr:
        raise ValueError("a per-slice --n-items needs --slice")
    return UniformTarget(table, attribute=slice_attr), table


# --------------------------------------------------------------------------------------------
# report

def _fmt(v, se=None, digits=5):
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "nan"
    s = f"{v:.{digits}f}"
    if se is not None and not (isinstance(se, float) and math.isnan(se)):
        s += f" ({se:.{digits}f})"
    return s


def format_report(rows, target_name, target_system) -> str:
    est = {}
    measured = {}
    for r in rows:
        key = (r["window_start"], r["slice"])
        if r["metric"].startswith(("ips[", "snips[", "ope[", "dm[", "dr[", "sndr[", "switch_dr[", "slate_ips[", "iips[",
                                   "rips[", "pi[")):
            est.setdefault((*key, r["system"]), {})[r["metric"]] = r
        elif r["metric"] == "ctr" and (target_system is None or r["system"] == target_system):
            measured[key] = r
    header = ["slice", "logs", "target", "impressions", "IPS (se)", "SNIPS (se)", "measured CTR (se)", "n target",
              "mean weight", "ESS"]
    lines = []
    for (ws, sl, system), m in sorted(est.items(), key=lambda kv: (kv[0][1] != "all", kv[0][1], kv[0][2])):
        ips = m.get(f"ips[{target_name}]")
        sn = m.get(f"snips[{target_name}]")
        mw = m.get(f"ope[{target_name}]:mean_weight")
        ess = m.get(f"ope[{target_name}]:ess")
        if ips is None:  # slate rows only (a slate's slice no impression row has)
            continue
        ctr = measured.get((ws, sl))
        lines.append([sl, system, target_name, str(ips["num_queries"]), _fmt(ips["value"], ips["stderr"]),
                      _fmt(sn["value"], sn["stderr"]), _fmt(ctr["value"], ctr["stderr"]) if ctr else "-",
                      str(ctr["num_queries"]) if ctr else "-", _fmt(mw["value"], digits=3), _fmt(ess["value"], digits=0)])
    out = _table(header, lines)
    order = {"dm": 0, "dr": 1, "sndr": 2, "switch_dr": 3}
    dr_names = sorted({k for m in est.values() for k in m if k.split("[")[0] in order},
                      key=lambda k: (order[k.split("[")[0]], float(k.rsplit("tau=", 1)[1][:-1]) if "tau=" in k else 0.0))
    if dr_names:
        header2 = ["slice", "logs", *(f"{k} (se)" for k in dr_names)]
        lines2 = [[sl, system, *(_fmt(m[k]["value"], m[k]["stderr"]) if k in m else "-" for k in dr_names)]
                  for (ws, sl, system), m in sorted(est.items(), key=lambda kv: (kv[0][1] != "all", kv[0][1], kv[0][2]))]
        out += "\n\n" + _table(header2, lines2)
    slate = _slate_table(est, target_name)
    return out + ("\n\n" + slate if slate else "")


def _slate_table(est, target_name) -> str | None:
    """The slate estimators' table (``--slate``): per (slice, logs) the slates, each estimate (se) and
    each one's effective sample size; None without slate rows."""
    names = [f"{e}[{target_name}]" for e in SLATE_ESTIMATORS]
    keyed = sorted(((k, m) for k, m in est.items() if names[0] in m), key=lambda kv: (kv[0][1] != "all", kv[0][1],
                                                                                      kv[0][2]))
    if not keyed:
        return None
    header = ["slice", "logs", "slates", *(f"{n} (se)" for n in names), *(f"ESS {e}" for e in SLATE_ESTIMATORS)]
    lines = [[sl, system, str(m[names[0]]["num_queries"]),
              *(_fmt(m[n]["value"], m[n]["stderr"]) if n in m else "-" for n in names),
              *(_fmt(m[n + ":ess"]["value"], digits=0) if n + ":ess" in m else "-" for n in names)]
             for (ws, sl, system), m in keyed]
    return _table(header, lines)


def _table(header, lines) -> str:
    widths = [max(len(h), *(len(l[i]) for l in lines)) if lines else len(h) for i, h in enumerate(header)]
    fmt = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()  # noqa: E731
    return "\n".join([fmt(header), fmt(["-" * w for w in widths]), *(fmt(l) for l in lines)])


def _low_ess(rows, metrics) -> tuple[list, int]:
    """``(low, total)``: of the rows whose metric is in ``metrics``, the ``(ess, n, slice, system,
    metric)`` of those below :data:`ESS_WARN_MIN` or :data:`ESS_WARN_FRACTION` of ``num_queries``."""
    low = []
    total = 0
    for r in rows:
        if r["metric"] not in metrics:
            continue
        total += 1
        ess, n = r["value"], r["num_queries"]
        if ess is not None and not math.isnan(ess) and n and (ess < ESS_WARN_MIN or ess < ESS_WARN_FRACTION * n):
            low.append((ess, n, r["slice"], r["system"], r["metric"]))
    return low, total


def small_ess_warning(rows, target_name) -> str | None:
    """One line when some ``ope[TARGET]:ess`` row is below :data:`ESS_WARN_MIN` or
    :data:`ESS_WARN_FRACTION` of its impressions (the smallest named), else None."""
    low, total = _low_ess(rows, {f"ope[{target_name}]:ess"})
    if not low:
        return None
    ess, n, sl, system, _ = min(low, key=lambda t: (t[0], str(t[2]), str(t[3])))
    return (f"warning: effective sample size below {ESS_WARN_MIN} or {ESS_WARN_FRACTION:.0%} of the impressions in "
            f"{len(low)} of {total} (slice, logs) rows, smallest {ess:.1f} of {n} impressions (slice {sl}, logs "
            f"{system}): the estimates rest on few impressions' weights and their normal intervals may be too narrow")


def small_slate_ess_warning(rows, target_name) -> str | None:
    """One line when some slate estimator's ``:ess`` row (``slate_ips[TARGET]:ess``, ``iips``,
    ``rips``, ``pi``: ``--slate``) is below :data:`ESS_WARN_MIN` or :data:`ESS_WARN_FRACTION` of its
    weights (slates for slate_ips and pi, impressions for iips and rips; the smallest named), else None."""
    low, total = _low_ess(rows, {f"{e}[{target_name}]:ess" for e in SLATE_ESTIMATORS})
    if not low:
        return None
    ess, n, sl, system, metric = min(low, key=lambda t: (t[0], str(t[2]), str(t[3]), t[4]))
    return (f"warning: slate estimators' effective sample size below {ESS_WARN_MIN} or {ESS_WARN_FRACTION:.0%} of "
            f"their weights in {len(low)} of {total} (slice, logs, estimator) rows, smallest {ess:.1f} of {n} weights "
            f"({metric.split(':')[0]}, slice {sl}, logs {system}): that estimate rests on few weights and its "
            "normal interval may be too narrow")


# --------------------------------------------------------------------------------------------
# entry point

def _target(args, logs, target_recs, catalogue, slice_attr, target_system, notes):
    """The target policy (a callable impression -> probability) of ``--target`` and its name; the
    notes printed after the report are appended to ``notes``. Raises ValueError on bad options."""
    if args.target == "random":
        target, sizes = _n_items(args.n_items, catalogue, slice_attr)
        if target is None:
            raise ValueError("--target random with a per-campaign catalogue needs --slice")
        name = "random"
        for c, n in sorted(sizes.items()):
            notes.append(f"random target: {c}: 1/{n} = {1 / n:.6g} per (item, position)")
        if target_recs:
            for c in sorted({(r.get("attributes") or {}).get(slice_attr) for r in target_recs}, key=str):
                props = [r["propensity"] for r in target_recs if (r.get("attributes") or {}).get(slice_attr) == c]
                p = target({"attributes": {slice_attr: c}, "item_id": "", "position": 1}) if slice_attr else \
                    target({})
                same = sum(1 for x in props if x is not None and p is not None and abs(x - p) <= 1e-12)
                notes.append(f"check: target logs {slice_attr}={c}: {same} of {len(props)} propensities equal "
                             f"the random target's {p!r}")
    elif args.target == "bts":
        path = args.bts_prior or default_bts_prior_path()
        if path is None:
            raise ValueError("--target bts needs obp's prior_bts.yaml: pip install --no-deps obp==0.4.1, or "
                             "pass --bts-prior PATH")
        prior = read_bts_prior(path)
        table = {}
        for c, ab in prior.items():
            probs = bts_action_probabilities(ab["alpha"], ab["beta"], args.len_list, args.n_sim, args.seed)
            for item in range(probs.shape[0]):
                for k in range(probs.shape[1]):
                    table[(c, str(item), k + 1)] = float(probs[item, k])
        target = TableTarget(table, attribute=slice_attr)
        name = "bts"
        notes.append(f"bts target: prior {path}; {args.n_sim} Monte Carlo slates (seed {args.seed}) per campaign; "
                     f"Monte Carlo se of a probability p: sqrt(p(1-p)/{args.n_sim})")
        zero = sum(1 for r in logs if target(r) == 0.0)
        if zero:
            notes.append(f"bts target: {zero} logged impressions have target probability 0 in {args.n_sim} slates")
        if target_recs:
            diffs = [abs(target(r) - r["propensity"]) for r in target_recs
                     if target(r) is not None and r.get("propensity") is not None]
            if diffs:
                notes.append(f"check: target logs' propensities vs the prior's: mean |difference| "
                             f"{sum(diffs) / len(diffs):.4f}, max {max(diffs):.4f} over {len(diffs)} impressions "
                             "(the deployed BTS updated its parameters during the logging period)")
    else:
        if not target_recs:
            raise ValueError("--target logged needs --target-logs")
        target = LoggedPropensityTarget(
            (((r.get("attributes") or {}).get(slice_attr) if slice_attr else None, r["item_id"], r["position"],
              r["timestamp"], r["propensity"]) for r in target_recs if r.get("propensity") is not None),
            attribute=slice_attr)
        name = f"{target_system or 'target'}-logged"
        notes.append(f"logged target: propensities of {len(target_recs)} target-log impressions, nearest time "
                     "per (slice, item, position)")
    return target, name


#: the outputs of --output (manifest.json lists them)
OUTPUTS = ("metrics.avro", "metrics.jsonl", "dead_letters.avro", "dead_letters.jsonl")


def main(argv=None) -> int:
    return holding_outputs(_main, argv)  # the run's hold on its --output folder, let go on every path


def _main(argv, held: list) -> int:
    parser = build_arg_parser()
    args, beam_args = parser.parse_known_args(argv)
    stray = [a for a in beam_args if not a.startswith("-") and os.path.exists(a)]
    if stray:
        print(f"error: unexpected paths {stray[:3]}: give every log file after --logs / --target-logs", file=sys.stderr)
        return 2
    unknown = unknown_arguments_error(parser, beam_args)  # Beam's options only: a typo is not dropped
    if unknown:
        print(f"error: {unknown}", file=sys.stderr)
        return 2
    slice_attr = None if args.slice.lower() == "none" else args.slice
    slices = [slice_attr] if slice_attr else []
    notes: list[str] = []
    try:
        log_paths = _expand(args.logs)
        target_paths = _expand(args.target_logs) if args.target_logs else []
        logs, catalogue = load_records(log_paths, args.system)
        target_recs, target_catalogue = load_records(target_paths) if target_paths else ([], {})
        target_system = None
        if target_recs:
            systems = sorted({r["system_id"] for r in target_recs})
            target_system = systems[0] if len(systems) == 1 else None
        target, name = _target(args, logs, target_recs, catalogue or target_catalogue, slice_attr, target_system,
                               notes)
        reward_model = None
        taus = tuple(args.switch_tau) if args.switch_tau else (DEFAULT_SWITCH_TAU,)
        if args.reward_model:
            for t in taus:
                if math.isnan(t) or t < 0:
                    raise ValueError(f"--switch-tau must be a number >= 0, got {t!r}")
            table = read_reward_model(args.reward_model)
            reward_model = RewardModelTable(table)
            logged_ids = {str(r.get("event_id")) for r in logs}
            unmatched = sum(1 for k in table if k not in logged_ids)
            notes.append(f"reward model {args.reward_model}: {len(table)} impressions"
                         + (f", {unmatched} of them not in the logs" if unmatched else "")
                         + "; switch_dr tau " + ", ".join(tau_label(t) for t in taus))
        elif args.switch_tau:
            raise ValueError("--switch-tau needs --reward-model")
        stall = stall_timeout_from_args(args)
        options = PipelineOptions(reuse_workers(["--runner", args.runner, *beam_args]))  # (Flink: workers kept)
        p = make_pipeline(options)
        run = None
        if args.output:  # the inputs are read: refuse an output that overlaps them, lock it, give the run its folder
            run = start_output(args.output, OUTPUTS, inputs=[("--logs", args.logs, log_paths),
                                                             ("--target-logs", args.target_logs or [], target_paths)],
                               command="streameval ope")
            held.append(run)
            if run.notice:
                print(run.notice, file=sys.stderr)
    except (ValueError, TypeError, FileNotFoundError, OSError, OutputOverlapError, OutputInUseError) as e:
        print(f"error: {one_line(e)}", file=sys.stderr)
        return 2

    start = time.perf_counter()
    tmp = tempfile.mkdtemp(prefix="streameval-ope-")  # the logs as Avro (and the rows without --output)
    try:
        logs_path = os.path.join(tmp, "logs.avro")
        avro.write_records(logs_path, "impression", logs)
        out_dir = run.write_dir if run is not None else tmp
        imps, dead = (p | "ReadLogs" >> ReadAvro([logs_path], "impression")  # one file converted from the logs: name them
                      | "ValidateLogs" >> ValidateImpressions(",".join(args.logs)))
        imps, clean_dead = imps | "CleanLogs" >> CleanImpressions()
        ope = OffPolicyCtr(target, name, slices=slices, reward_model=reward_model, switch_taus=taus, slates=args.slate)
        parts = [imps | "Ope" >> ope]
        deads = [dead, clean_dead, ope.rejected]
        if target_recs:
            tpath = os.path.join(tmp, "target.avro")
            avro.write_records(tpath, "impression", target_recs)
            timps, tdead = (p | "ReadTarget" >> ReadAvro([tpath], "impression")
                            | "ValidateTarget" >> ValidateImpressions(",".join(args.target_logs)))
            timps, tclean_dead = timps | "CleanTarget" >> CleanImpressions()
            deads.append(tclean_dead)
            parts.append(timps | "Measured" >> ClickMetrics(slices=slices)
                         | "OnlyCtr" >> beam.Filter(lambda r: r["metric"] == "ctr"))
            deads.append(tdead)
        rows = tuple(parts) | "Rows" >> beam.Flatten()
        write_records(rows, out_dir, "metrics", "metric_result", "Metrics")
        write_records(tuple(deads) | "Dead" >> beam.Flatten(), out_dir, "dead_letters", "dead_letter", "Dead")
        try:
            result = p.run()
            wait_for_job(result, options=options, stall_timeout=stall)  # (not wait_until_finish: its deadline, see there)
        except (Exception, KeyboardInterrupt) as e:  # noqa: BLE001 (re-raised)
            stop = interrupts.stop_for(e)  # Ctrl-C or SIGTERM (maybe wrapped by the runner): streameval.cli says so
            if stop is not None:
                raise stop from None
            raise
        wall = time.perf_counter() - start
        counters = job_counters(result, options=options)
        out_rows = read_metric_rows(os.path.join(out_dir, "metrics.jsonl"))
        if run is not None:  # the previous run's outputs are replaced now, not before
            publish(run, OUTPUTS, {"state": "DONE"})
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(format_report(out_rows, name, target_system))
    for n in notes:
        print(n)
    for warning in (small_ess_warning(out_rows, name), small_slate_ess_warning(out_rows, name)):
        if warning:
            print(warning, file=sys.stderr)
    rejected = {cn.rejected_reason(k): v for k, v in counters.items() if k.startswith(cn.REJECTED_PREFIX) and v}
    dups = counters.get(cn.DUPLICATE_IMPRESSION, 0)
    slates = f" (slates: {counters.get(cn.OPE_SLATES, 0)})" if args.slate else ""
    print(f"read {len(logs)} log and {len(target_recs)} target-log impressions; estimated from "
          f"{counters.get(cn.OPE_IMPRESSIONS, 0)}{slates}; replayed events ignored {dups}; "
          f"rejected {sum(rejected.values())}"
          + (" (" + "; ".join(f"{k}: {v}" for k, v in sorted(rejected.items())) + ")" if rejected else "")
          + f"; {wall:.1f} s ({args.runner})" + (f"; rows in {args.output}" if args.output else ""))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
