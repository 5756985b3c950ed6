"""Options of Beam's Flink runner that its Python SDK does not declare, so that ``streameval batch``
and ``streameval stream`` accept them and send them to the Flink job server.

Beam's Python SDK declares only a few of the Flink runner's options (``FlinkRunnerOptions``:
``--flink_master``, ``--parallelism``, ...); the Java runner reads many more
(``org.apache.beam.runners.flink.FlinkPipelineOptions``). The portable runner sends every option a
registered ``PipelineOptions`` class declares to the job server as ``beam:option:<name>:v1``, which
the Java side reads into the option of the same name in camel case (``max_bundle_size`` ->
``maxBundleSize``). Declaring them here (Beam's public ``PipelineOptions`` API) lets the jobs check
them like Beam's own (a typo gets the closest names, exit 2) instead of refusing them.
Importing this module registers the class; each option's default (None) leaves the Java default."""

from __future__ import annotations

from apache_beam.options.pipeline_options import PipelineOptions


def _bool(text) -> bool:
    """``true`` / ``false`` (also 1/0, yes/no) as a bool; ValueError otherwise (argparse's message)."""
    t = str(text).strip().lower()
    if t in ("1", "true", "yes"):
        return True
    if t in ("0", "false", "no"):
        return False
    raise ValueError(text)


#: (option, type, help) of the Java Flink runner's options declared here
OPTIONS = (
    ("max_bundle_size", int, "Flink: the most elements in a bundle (Beam's default 1000)"),
    ("max_bundle_time_mills", int, "Flink: the longest a bundle stays open, in milliseconds (Beam's default "
     "1000; the name is Beam's)"),
    ("checkpointing_interval", int, "Flink: milliseconds between checkpoints (off unless given)"),
    ("finish_bundle_before_checkpointing", _bool,
     "Flink: finish the open bundles before a checkpoint is taken (true/false; Beam's default false: a "
     "bundle's outputs are held back until the checkpoint is taken)"),
    ("checkpointing_mode", str, "Flink: EXACTLY_ONCE (default) or AT_LEAST_ONCE"),
    ("externalized_checkpoints_enabled", _bool,
     "Flink: keep the checkpoints when the job stops (true/false)"),
    ("retain_externalized_checkpoints_on_cancellation", _bool,
     "Flink: keep the externalized checkpoints when the job is cancelled (true/false)"),
    ("savepoint_path", str, "Flink: start the job from this savepoint or checkpoint"),
    ("allow_non_restored_state", _bool, "Flink: start from a savepoint with state no step takes (true/false)"),
    ("state_backend", str, "Flink: the state backend (hashmap or rocksdb)"),
    ("state_backend_storage_path", str, "Flink: where the state backend writes its checkpoints (a URI)"),
    ("number_of_execution_retries", int, "Flink: restarts of a failed job (-1: Flink's default)"),
    ("execution_retry_delay", int, "Flink: milliseconds between restarts"),
    ("auto_watermark_interval", int, "Flink: milliseconds between watermarks of the sources"),
)


class FlinkJavaOptions(PipelineOptions):
    """Beam's Java Flink runner's options that its Python SDK does not declare (see the module)."""

    @classmethod
    def _add_argparse_args(cls, parser):
        for name, kind, text in OPTIONS:
            parser.add_argument(f"--{name}", type=kind, default=None, help=text)


#: milliseconds Beam's Flink runner keeps a job's SDK workers after the last stage using them ends
#: (``--environment_cache_millis``, which :func:`reuse_workers` sets on Flink): the gap between two
#: stages of a batch job is the Flink-side sort of a grouping, seconds even at 30 M impressions
ENVIRONMENT_CACHE_MS = 30_000


def _given(args, name: str) -> bool:
    return any(a == f"--{name}" or a.startswith(f"--{name}=") for a in args)


def reuse_workers(args: list) -> list:
    """``args`` (a job's Beam options, ``--runner`` among them) with ``--environment_cache_millis``
    :data:`ENVIRONMENT_CACHE_MS` added when the job runs on Flink (``--runner FlinkRunner``, or a
    ``--flink_master``) and the option is not given.

    Beam's default (0) makes each task of a Flink batch job let its SDK worker go when it ends, so the
    next stage starts a new worker process, which imports Beam, numpy and streameval again: 7 worker
    processes for the batch job at 10 M impressions (``--parallelism 2``), 7 s of the 45 s of CPU
    the workers took, and the job 45.0 s; kept within the job, one worker per TaskManager runs every
    stage and the job took 34.3 s (docs/benchmarks.md, 2026-12-07). The workers are kept for the
    job only (Beam's cache is per job): the last one ends this long after the job. Beam honours the
    option only where its runner is on the Flink processes' classpath (``cluster up flink
    --runner-on-classpath``); with the runner's jars staged with each job it releases each task's
    worker at once (docs/deploy.md, "One SDK worker per TaskManager for a whole job")."""
    if not _given(args, "environment_cache_millis") and on_flink(PipelineOptions(list(args))):
        return [*args, "--environment_cache_millis", str(ENVIRONMENT_CACHE_MS)]
    return list(args)


def on_flink(options: PipelineOptions) -> bool:
    """Whether a job of these options runs on Flink: ``--runner FlinkRunner``, or a ``--flink_master``
    naming a cluster (``cluster up flink``'s runner_args: a ``PortableRunner`` to Beam's Flink job
    server; not Beam's ``[auto]`` / ``[local]``)."""
    given = options.get_all_options(retain_unknown_options=True)
    master = str(given.get("flink_master") or "")
    return given.get("runner") == "FlinkRunner" or (bool(master) and not master.startswith("["))


__all__ = ["FlinkJavaOptions", "OPTIONS", "ENVIRONMENT_CACHE_MS", "on_flink", "reuse_workers"]
