"""Statements about the server rather than the queue: which server a connection is on,
whether it takes writes, and how it replicates. They name no schema."""

from __future__ import annotations

#: Which server this connection is on and whether it takes writes: its address (NULL over
#: a Unix socket), whether it is a standby (in recovery), and whether it refuses writes
#: anyway (``default_transaction_read_only``, how a demoted or fenced primary says no).
WHOAMI = """
    SELECT host(inet_server_addr()) AS host, inet_server_port() AS port,
           pg_is_in_recovery() AS in_recovery,
           current_setting('transaction_read_only') = 'on' AS read_only
"""

#: What an acknowledged commit of this session survives: the standbys commits wait for,
#: this session's synchronous_commit, and the standbys streaming now (their state is
#: empty where the role may not see it: pg_stat_replication needs pg_monitor for that).
REPLICATION = """
    SELECT host(inet_server_addr()) AS host, inet_server_port() AS port,
           current_setting('synchronous_standby_names') AS standby_names,
           current_setting('synchronous_commit') AS synchronous_commit,
           coalesce((
               SELECT json_agg(json_build_object(
                   'name', application_name,
                   'state', coalesce(state, ''),
                   'sync_state', coalesce(sync_state, '')
               ) ORDER BY application_name)
               FROM pg_stat_replication
           ), '[]')::text AS standbys
"""
