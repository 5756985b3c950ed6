"""The off-policy job's command line (``streameval ope``): :func:`build_arg_parser`, which imports no
Beam, so that ``--help`` and argument errors answer before Beam is imported (``streameval.cli``
parses with it first). The job itself: :mod:`streameval.jobs.ope`."""

from __future__ import annotations

import argparse

from streameval.beam.accounting import add_stall_timeout_argument

__all__ = ["build_arg_parser", "TARGETS"]

TARGETS = ("random", "bts", "logged")


def build_arg_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="streameval ope",
        description="IPS and SNIPS (with --reward-model also DM, DR, SNDR and Switch-DR; with --slate the slate "
                    "estimators slate IPS, IIPS, RIPS and pseudo-inverse) estimates of a target "
                    "policy's CTR from logs with propensities, beside the "
                    "CTR measured on the target's own logs. Other arguments go to Beam's PipelineOptions; one Beam "
                    "does not know either is refused.")
    p.add_argument("--logs", action="extend", nargs="+", required=True,
                   help="logging policy's impressions: Avro files or Open Bandit CSVs (paths or quoted globs; "
                        "item_context.csv files are skipped); repeatable")
    p.add_argument("--target", choices=TARGETS, required=True,
                   help="random (uniform), bts (Thompson sampling with obp's production prior, Monte Carlo), "
                        "logged (the target logs' own propensities at the nearest time)")
    p.add_argument("--target-logs", action="extend", nargs="+", default=None,
                   help="the target policy's own logs (paths or quoted globs; repeatable): its measured CTR is "
                        "printed beside the estimates; needed by --target logged")
    p.add_argument("--slice", default="campaign", help="attribute to slice by (default campaign; 'none': no slices)")
    p.add_argument("--n-items", default=None,
                   help="catalogue size per slice for --target random, e.g. all=80,men=34,women=46 or 80")
    p.add_argument("--bts-prior", default=None,
                   help="obp's prior_bts.yaml (default: the file of the installed obp package)")
    p.add_argument("--n-sim", type=int, default=100_000, help="Monte Carlo slates for --target bts (default 100000)")
    p.add_argument("--seed", type=int, default=12345, help="Monte Carlo seed (default 12345)")
    p.add_argument("--len-list", type=int, default=3, help="slate length for --target bts (default 3, OBD)")
    p.add_argument("--system", default=None, help="system id of CSV logs (default: the policy folder name)")
    p.add_argument("--output", default=None, help="directory for metrics.{avro,jsonl} and dead_letters.{avro,jsonl}")
    p.add_argument("--reward-model", default=None, metavar="PATH",
                   help="a reward model per logged impression: CSV (header) or JSON Lines with event_id, reward_hat "
                        "(q_hat of the logged item at its position) and dm_value (sum over items of the target's "
                        "probability times q_hat at that position); adds the rows dm, dr, sndr and switch_dr "
                        "[TARGET,tau=...]. An impression it does not cover is a dead letter")
    p.add_argument("--switch-tau", type=float, action="append", default=None, metavar="TAU",
                   help="Switch-DR's importance weight threshold (>= 0; repeatable: a row per value; default 1, "
                        "obp's SwitchDoublyRobust default)")
    p.add_argument("--slate", action="store_true",
                   help="also the slate estimators over requests (a request's impressions at their positions: "
                        "one slate): rows slate_ips, iips, rips and pi [TARGET] (expected clicks per request, "
                        "num_queries: slates) and each one's :ess; slate_ips and rips take a slate's joint "
                        "probabilities as the products of its positions' marginal ones, pi assumes a logging "
                        "policy that fills positions independently (docs/metrics.md, \"Slate estimators\")")
    p.add_argument("--runner", default="FnApiRunner", help="Beam runner (default FnApiRunner)")
    add_stall_timeout_argument(p)
    return p
