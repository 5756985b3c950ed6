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


__all__ = ["FlinkJavaOptions", "OPTIONS"]
