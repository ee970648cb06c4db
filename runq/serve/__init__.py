"""What only ``runq serve`` needs, on top of the worker core and the maintenance services.

``supervisor`` (task groups, signals, drain, the embedded HTTP server), ``exporter``
(Prometheus text), ``systemd`` (``NOTIFY_SOCKET``) and ``http_protocol`` (uvicorn's h11
protocol with a request deadline).
"""
