"""The evaluation plan: what a job computes and how, parsed once from its options and shared by
every engine (issue 39). Pure Python, no Beam; the layer between ``io`` and ``beam``.

* :mod:`streameval.plan.windows`: durations and event-time windows
  (:class:`~streameval.plan.windows.WindowSpec`);
* :mod:`streameval.plan.alerts`: the alert rules (``--alerts``), checked up front and evaluated on
  metric rows.
"""
