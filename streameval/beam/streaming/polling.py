"""One poll of the watched patterns, shared by the local runner's live watcher
(:class:`streameval.beam.streaming.live.FileWatcher`) and the watch source of the other runners
(:class:`streameval.beam.streaming.watch_source.WatchEvents`).

A file is ready when it is complete: its size was the same at two successive polls. Names starting
with ``.`` or ``_`` are skipped (temporary files). A file read (or seen) and since removed is
forgotten, so what a watch remembers stays bounded in a job that runs for ever. The ready files come
judgments first (they do not move the watermark, and a request scored before its query's judgments
would be rescored, or be final, without them), then impressions, then clicks, each in name order.
"""

from __future__ import annotations

import os
from typing import NamedTuple

from apache_beam.io.filesystems import FileSystems

__all__ = ["READ_ORDER", "SCHEMA_OF", "Poll", "poll"]

#: the record schema of each kind's files (clicks: none checked)
SCHEMA_OF: dict = {"impressions": "impression", "judgments": "judgment", "clicks": None}
#: the kinds of a poll's files, in reading order
READ_ORDER = {"judgments": 0, "impressions": 1, "clicks": 2}


class Poll(NamedTuple):
    """What one poll found: ``ready`` the ``(kind, path)`` of the files complete since the last poll (in
    reading order); ``sizes`` ``{path: size}`` of the matched files not read yet (new or still growing);
    ``done`` the paths read before that still match."""

    ready: list
    sizes: dict
    done: set


def poll(patterns: dict, done, sizes: dict) -> Poll:
    """Match ``patterns`` (``{kind: [pattern, ...]}``, any Beam file system) once. ``done``: the paths
    already read; ``sizes``: ``{path: size}`` at the previous poll of the files not read yet. Raises
    what Beam's ``FileSystems.match`` raises for a file system that does not answer."""
    ready, matched, pending = [], set(), {}
    for kind, pats in patterns.items():
        for res in FileSystems.match(list(pats)):
            for md in res.metadata_list:
                path = md.path
                matched.add(path)
                if path in done or os.path.basename(path).startswith((".", "_")):
                    continue
                if sizes.get(path) == md.size_in_bytes:
                    ready.append((kind, path))
                else:
                    pending[path] = md.size_in_bytes
    ready.sort(key=lambda kp: (READ_ORDER[kp[0]], kp[1]))
    return Poll(ready, pending, set(done) & matched)
