"""Exit statuses of every ``streameval`` command, and the one-line form of an error.

Documented in docs/cli.md ("`streameval batch`") and docs/metrics.md ("Input checks and exit status"):

* 0 (:data:`EXIT_OK`): done;
* 1 (:data:`EXIT_FAILED`): the job failed (runner, environment) or its record counts do not add up;
  ``reconcile``: the tables disagree, or no row was compared;
* 2 (:data:`EXIT_USAGE`): bad options, or inputs or an output the command cannot start on (missing
  or malformed files, a bad glob, an ``--output`` that cannot be created, that overlaps an input or
  that another job holds: :mod:`streameval.io.outdir`); a filter that selects no row (``reconcile`` /
  ``report --metrics``, an alert rule whose metric, system or slice matches no row of the job's
  output: :mod:`streameval.io.selection`), named with the closest values present;
* 3 (:data:`EXIT_INPUT_CHECK`): the job ran and its outputs are complete, but its input failed a
  check (:class:`streameval.beam.accounting.InputChecks`), or a metric it was asked for produced no
  row (summary.json's ``metrics_without_rows``);
* 4 (:data:`EXIT_ALERT`): the job ran, its outputs are complete and its input passed the checks,
  and an alert rule fired (``--alerts``; :mod:`streameval.plan.alerts`);
* 130 (:data:`EXIT_INTERRUPTED`) and 143 (:data:`EXIT_TERMINATED`): stopped by Ctrl-C (SIGINT) or
  SIGTERM (128 + the signal's number, the shell's convention), with one line on stderr; a job's
  output folder keeps its previous run's outputs (nothing of the stopped run is published);
* 141 (:data:`EXIT_BROKEN_PIPE`): the reader of standard output went away (``... | head -1``): the
  command stops quietly (128 + SIGPIPE's number, what the shell reports for a program SIGPIPE ended).

Errors go to stderr as one line (:func:`one_line`), never as a traceback.
"""

from __future__ import annotations

__all__ = ["EXIT_OK", "EXIT_FAILED", "EXIT_USAGE", "EXIT_INPUT_CHECK", "EXIT_ALERT", "EXIT_INTERRUPTED",
           "EXIT_TERMINATED", "EXIT_BROKEN_PIPE", "one_line", "exit_status"]

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_INPUT_CHECK = 3
EXIT_ALERT = 4
EXIT_INTERRUPTED = 130
EXIT_TERMINATED = 143
EXIT_BROKEN_PIPE = 141


def one_line(err) -> str:
    """An exception (or text) as one line: its message with runs of white space (newlines too)
    made one space; the exception's type name when it has no message."""
    return " ".join(str(err).split()) or type(err).__name__


def exit_status(problems: list, failed_checks: list | None = None) -> int:
    """A job's exit status from the accounting's problems
    (:func:`streameval.beam.accounting.account`) and the failed input checks
    (:func:`streameval.beam.accounting.check_inputs`): :data:`EXIT_OK`; :data:`EXIT_FAILED` (1) after
    saying on stderr which identities failed; or :data:`EXIT_INPUT_CHECK` (3) after saying, on one
    line, which input checks failed."""
    import sys

    if problems:
        print("error: the record counts do not add up: " + "; ".join(problems), file=sys.stderr)
        return EXIT_FAILED
    if failed_checks:
        print("error: the input failed a check (the outputs are written, exit status 3): " + "; ".join(failed_checks),
              file=sys.stderr)
        return EXIT_INPUT_CHECK
    return EXIT_OK
