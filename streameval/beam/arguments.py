"""Command-line values shared by the batch and streaming jobs: metric lists, slice specifications,
grade ranges, the pipeline and its output directory. Layer 3: the jobs (``pipelines/``) import these instead of each other's helpers."""

from __future__ import annotations

import math

__all__ = ["DEFAULT_METRICS", "split_metrics", "split_names", "parse_slice_args", "parse_grades", "make_pipeline", "make_output_dir"]

DEFAULT_METRICS = "ndcg@10,map,mrr@10,P@10,recall@100"


def split_names(text: str) -> list[str]:
    """Split a comma list of names at the commas outside brackets and parentheses (``gauc[user,clicks]``,
    ``SetF(rel=2, beta=0.5)`` stay whole): the metric filters of report and reconcile."""
    from ..metrics.online import _split_names

    return _split_names(text)


def split_metrics(text: str) -> list[str]:
    """Split a comma list of metric names, keeping trec_eval parameter lists together:
    ``"P.5,10,map"`` -> ``["P.5,10", "map"]``, and commas inside brackets or parentheses with their
    name (``gauc[user,clicks]``, ``SetF(rel=2, beta=0.5)``)."""
    from ..metrics.online import _split_names

    out: list[str] = []
    for part in _split_names(text):
        part = part.strip()
        if not part:
            continue
        if out and part.replace(".", "", 1).isdigit() and out[-1][-1:].isdigit():
            out[-1] += "," + part
        else:
            out.append(part)
    return out


def parse_slice_args(values) -> list[str]:
    """``--slices`` values (repeatable, comma-separated, ``a+b`` for a combination) -> slice
    specifications ``["campaign", "campaign,device"]``, each once. Raises ``ValueError`` for an empty
    name in a combination."""
    out: list[str] = []
    for v in values or []:
        for part in v.split(","):
            part = part.strip()
            if not part:
                continue
            names = [n.strip() for n in part.split("+")]
            if any(not n for n in names):
                raise ValueError(f"bad --slices value {v!r}")
            spec = ",".join(names)
            if spec not in out:
                out.append(spec)
    return out


def parse_grades(text):
    """``"0:4"`` -> ``(0, 4)``; None stays None. Raises ``ValueError`` for anything else."""
    if text is None:
        return None
    try:
        lo, hi = (int(x) for x in text.split(":"))
    except ValueError:
        raise ValueError(f"--grades wants LO:HI (integers), got {text!r}") from None
    if lo > hi:
        raise ValueError(f"--grades: {lo} > {hi}")
    return lo, hi


def make_pipeline(options):
    """``beam.Pipeline(options=options)``; a runner Beam does not know (a wrong name, a module path
    that does not import) raises ``ValueError`` with one line, which the jobs report with exit 2.
    Installs :mod:`streameval.beam.s3_clients` in this process and adds it to the options'
    ``--beam_plugins``: the launcher and every worker process then share one boto3 client per set of
    S3 options (Beam 2.77 makes one per file-system call)."""
    import apache_beam as beam

    from . import s3_clients

    s3_clients.install()
    s3_clients.add_to_options(options)
    try:
        return beam.Pipeline(options=options)
    except ImportError as e:  # Beam imports a runner given as a dotted path
        raise ValueError(f"--runner: cannot import the runner ({e})") from None


def make_output_dir(path: str) -> None:
    """Create the output directory ``path`` (local, or on a Beam file system when it has a scheme);
    raises ``ValueError`` naming it when it cannot be made (a file of that name, no permission, a NUL
    in the name)."""
    import os

    from apache_beam.io.filesystems import FileSystems

    try:
        if "://" in path:
            FileSystems.mkdirs(path)
        else:
            os.makedirs(path, exist_ok=True)
    except Exception as e:  # noqa: BLE001 (any file-system error: permission, credentials, a file in the way)
        if "://" in path and FileSystems.exists(path):
            return  # an object store "directory" that exists already
        raise ValueError(f"cannot make the output directory {path!r}: {type(e).__name__}: {e}") from None


#: ERR's g_max when the judgments are not known up front (the library's and trec-eval's default:
#: gdeval's MAX_JUDGMENT)
GDEVAL_ERR_MAX_GRADE = 4.0


def parse_err_max_grade(text) -> float | None:
    """``--err-max-grade``: a positive number, or ``"auto"`` -> None (resolve with
    :func:`auto_err_max_grade`). Raises ``ValueError`` for anything else."""
    if text is None or str(text).strip().lower() == "auto":
        return None
    try:
        value = float(text)
    except (TypeError, ValueError):
        value = float("nan")
    if not value > 0 or not math.isfinite(value):
        raise ValueError(f"--err-max-grade wants a positive number or auto, got {text!r}")
    return value


def max_judgment_grade(paths, declared=None) -> int:
    """The largest grade of the judgment Avro files ``paths`` (read through Beam's file systems, local
    or remote), among the grades inside the ``declared`` range ``(lo, hi)`` (``--grades``: the others
    are dead letters), at least 1. A file that cannot be read to its end gives the grades read before
    the damage (the job's reader reports the file)."""
    import fastavro
    from apache_beam.io.filesystems import FileSystems

    top = 1
    for path in paths:
        try:
            with FileSystems.open(path) as f:
                for rec in fastavro.reader(f):
                    g = rec.get("grade")
                    if isinstance(g, int) and g > top and (declared is None or declared[0] <= g <= declared[1]):
                        top = g
        except Exception:  # noqa: BLE001 (damaged or unreadable: the job's reader reports it)
            continue
    return top


def auto_err_max_grade(specs, judgment_paths, declared=None) -> float:
    """``--err-max-grade auto`` of the jobs: with ERR among the metric ``specs`` and judgment files,
    the largest grade they hold (:func:`max_judgment_grade`, at least 1), so that binary judgments
    give a perfect ranking ERR 0.5 at its first item, not (2**1 - 1) / 2**4; otherwise (no ERR, or
    judgments arriving on a stream) :data:`GDEVAL_ERR_MAX_GRADE`. docs/metrics.md, "ERR's g_max"."""
    if judgment_paths and any(getattr(s, "family", None) == "err" for s in specs):
        return float(max_judgment_grade(judgment_paths, declared))
    return GDEVAL_ERR_MAX_GRADE

