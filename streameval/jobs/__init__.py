"""The jobs (layer 5): the batch job (:mod:`.batch`, ``streameval batch``), the streaming job
(:mod:`.stream`, ``streameval stream``) and off-policy estimates (:mod:`.ope`, ``streameval ope``),
each composed from :mod:`streameval.io` and :mod:`streameval.beam`. Their command lines
(:mod:`.batch_args`, :mod:`.stream_args`, :mod:`.ope_args`) import no Beam, so that
``streameval.cli`` answers ``--help`` and argument errors before Beam is imported. The repository's
``pipelines/`` folder holds the same jobs as runnable scripts; it is not installed."""
