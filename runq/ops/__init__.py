"""The operator's side: reading the queue and steering it without submitting work.

``operations.Operations`` is what the HTTP API (``/queue``, the reads of ``/runs``), the
console and the CLI call; ``views.RunView`` is the one view of a run they all answer with
(fields chosen by the reader's role). The rest are the pieces it assembles: ``fleet``
(settings the live workers disagree on), ``limits_use`` (the limits page's sums),
``schedules`` (a schedule beside its fleet-wide state) and ``run_ids`` (a run id or a
unique prefix of one).

This package face imports nothing, so ``runq.ops.views`` stays importable by the HTTP
client without the store.
"""
