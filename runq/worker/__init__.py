"""The worker core: what executes runs, shared by ``runq serve``, ``runq work`` and the
``sync`` transport.

``executor`` (one claimed run: handler, timeout, outcome), ``inflight`` (the executions
of this worker, by run id), ``claimer`` (claims into free slots; also the bounded sweep
of ``runq work``), ``completer`` (batched completions), ``heartbeat`` (one statement
renews every lease), ``registry`` (the worker rows), ``runtime`` (the bundle of these a
process builds) and ``dispatch`` (the ``sync`` transport: claim one run by id and execute
it in the caller).
"""
