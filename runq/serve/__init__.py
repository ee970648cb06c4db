"""What only ``runq serve`` needs, on top of the worker core and the maintenance services.

``supervisor`` (task groups, signals, drain), ``http_server`` (uvicorn embedded in the
supervisor's task group), ``http_protocol`` (uvicorn's h11 protocol with a request
deadline), ``exporter`` (Prometheus text) and ``systemd`` (``NOTIFY_SOCKET``).
"""
