"""Ctrl-C (SIGINT) and SIGTERM as one exception in the main thread, and a record of which came.

``streameval`` (:func:`streameval.cli.main`) installs :func:`install` for the command's run: either
signal raises :class:`Interrupted` (a ``KeyboardInterrupt``) where the main thread is, so every
``finally`` on the way out runs (a job's output folder loses this run's staging folder, Beam's
``beam-temp-*`` folders and its lock: :func:`streameval.beam.sinks.close_output`), and the command
ends with one line and status 128 + the signal's number. Beam's runners catch an exception raised
inside a bundle and raise their own: a job asks :func:`received` to tell a stop from a failure.

An interrupt can also leave a thread of Beam's running for ever: the in-process runner's bundle starts
a (non-daemon) state-sampling thread and marks it started a statement later
(``apache_beam/runners/worker/statesampler.py``, ``StateSampler.start``); a signal in between leaves
nobody to stop it, and the interpreter waits for it at exit (seen once in about 50 Ctrl-Cs under load).
:func:`exit_within` bounds that wait."""

from __future__ import annotations

import os
import signal
import sys
import threading

__all__ = ["Interrupted", "exit_within", "install", "received", "restore", "stop_for"]

_RECEIVED: list[int] = []


class Interrupted(KeyboardInterrupt):
    """Ctrl-C or SIGTERM: ``signum`` says which."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = int(signum)

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name


def _raise(signum, frame):
    _RECEIVED.append(signum)
    raise Interrupted(signum)


def install() -> dict:
    """Make SIGINT and SIGTERM raise :class:`Interrupted` in the main thread; returns the previous
    handlers for :func:`restore`. A signal that is ignored (``nohup``, a supervisor) stays ignored;
    off the main thread nothing is installed."""
    _RECEIVED.clear()
    previous = {}
    if threading.current_thread() is not threading.main_thread():
        return previous
    for signum in (signal.SIGINT, signal.SIGTERM):
        handler = signal.getsignal(signum)
        if handler == signal.SIG_IGN:
            continue
        previous[signum] = handler
        signal.signal(signum, _raise)
    return previous


def restore(previous: dict) -> None:
    for signum, handler in previous.items():
        signal.signal(signum, handler)


def received() -> Interrupted | None:
    """The first SIGINT or SIGTERM received since :func:`install`, as the exception to raise; None."""
    return Interrupted(_RECEIVED[0]) if _RECEIVED else None


def stop_for(error: BaseException) -> BaseException | None:
    """What to raise for ``error``, caught while a job ran: the interrupt received (a runner may have
    wrapped it in an exception of its own), with ``error``'s notes (``add_note``: what the job did on
    the way out, such as cancelling itself on its runner); ``error`` itself when it is a
    ``KeyboardInterrupt`` and no signal was recorded; None when it is no interrupt at all."""
    stop = received()
    if stop is None:
        return error if isinstance(error, KeyboardInterrupt) else None
    for note in getattr(error, "__notes__", ()):
        stop.add_note(note)
    return stop


def exit_within(status: int, seconds: float = 10.0) -> None:
    """Make sure the process ends after an interrupt: a daemon thread waits ``seconds`` for the
    interpreter's own exit (it joins the other threads, then runs ``atexit``) and, if the process is
    still there, flushes standard output and error and ends it with ``status`` (``os._exit``).
    For the command's own process only (:func:`streameval.cli.main` called without ``argv``): it
    ends whatever process calls it."""

    def _end() -> None:
        threading.Event().wait(seconds)
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(status)

    threading.Thread(target=_end, name="streameval-exit", daemon=True).start()
