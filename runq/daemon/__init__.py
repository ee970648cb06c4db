"""What ``runq serve`` hosts, one module per service (DESIGN §4).

``supervisor`` (task groups, signals, drain, systemd), ``claimer`` (claims into free
slots; also the bounded sweep of ``runq work``), ``executor`` (one claimed run: handler,
timeout, outcome), ``completer`` (batched completions), ``heartbeat`` (one statement renews
every lease), ``reaper``, ``retention``, ``workers`` (the worker registry), ``exporter``
(Prometheus text) and ``systemd`` (``NOTIFY_SOCKET``). ``runtime`` bundles what executes
runs, for the daemon, ``runq work`` and the ``sync`` transport alike.
"""
