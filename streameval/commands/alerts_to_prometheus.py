"""``streameval alerts-to-prometheus RULES.toml [-o rules.yml]``: the alert rules of a TOML file
(``streameval.plan.alerts``, docs/metrics.md "Alert rules") as a Prometheus alerting rules file over the
gauges that ``stream --prometheus-port`` serves and ``batch --prometheus-textfile`` writes
(:func:`streameval.beam.prometheus.alerting_rules`). Check it with ``promtool check rules``.

Threshold rules and ``baseline = "system:NAME"`` rules translate; a ``trailing:N`` or ``offset:``
baseline, ``test = "msprt"``, ``for_panes`` > 1 or a metric that is no measure name (a typo such as
``ndgc@10``, named with the three closest measures) is refused with one line (exit status 2): the gauges hold the latest window only,
and Prometheus' ``for`` counts time, not panes (``--for`` gives one to every rule). Does not import
Beam.
"""

from __future__ import annotations

import argparse
import os
import sys

from ..exits import EXIT_USAGE, one_line

__all__ = ["main", "build_arg_parser"]


def build_arg_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="streameval alerts-to-prometheus",
        description="Write TOML alert rules as Prometheus alerting rules (YAML) over streameval's exported gauges.")
    p.add_argument("rules", metavar="RULES.toml", help="alert rules (docs/metrics.md, 'Alert rules')")
    p.add_argument("-o", "--output", default="-", metavar="PATH", help="the rules file to write (default: stdout)")
    p.add_argument("--pane", choices=("latest", "final"), default="latest",
                   help="the gauges' pane the rules watch: latest (every pane, early ones included, as stream "
                        "--alerts evaluates them; default) or final (final panes only)")
    p.add_argument("--for", dest="for_", default=None, metavar="DURATION",
                   help="Prometheus' 'for' of every rule: the condition must hold this long (30s, 5m)")
    p.add_argument("--group", default="streameval", help="the rule group's name (default streameval)")
    return p


def main(argv=None) -> int:
    from ..plan.alerts import load_rules, unknown_measure
    from ..beam.prometheus import alerting_rules

    args = build_arg_parser().parse_args(argv)
    try:
        rules = load_rules(args.rules)  # its errors name the file
        for rule in rules:  # a metric no job writes rows of gives a rule that can never fire (issue 41)
            err = unknown_measure(rule.metric)
            if err is not None:
                raise ValueError(f"alerts file {args.rules}: rule {rule.name!r}: {err}")
        try:
            text = alerting_rules(rules, pane=args.pane, for_=args.for_, group=args.group)
        except ValueError as e:
            raise ValueError(f"alerts file {args.rules}: {e}") from None
    except ValueError as e:
        print(f"error: {one_line(e)}", file=sys.stderr)
        return EXIT_USAGE
    if args.output == "-":
        sys.stdout.write(text)
        return 0
    tmp = f"{args.output}.tmp{os.getpid()}"
    try:
        with open(tmp, "w", encoding="utf-8") as fo:
            fo.write(text)
        os.replace(tmp, args.output)
    except OSError as e:
        print(f"error: cannot write {args.output}: {one_line(e)}", file=sys.stderr)
        try:
            os.unlink(tmp)
        except OSError:
            pass
        return 1
    print(f"wrote {text.count('- alert:')} Prometheus alerting rules to {args.output}")
    return 0
