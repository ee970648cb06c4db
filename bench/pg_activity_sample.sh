#!/bin/bash
# A poor man's PostgreSQL profiler (pg_stat_statements needs shared_preload_libraries):
# every 0.1 s, one line per active backend of DB: wait event (CPU when none) | statement.
#   bench/pg_activity_sample.sh DB SECONDS OUT; then: sort OUT | uniq -c | sort -rn
set -eu
db=$1
n=$(($2 * 10))
out=$3
: >"$out"
for _ in $(seq "$n"); do
  psql -h 127.0.0.1 -U postgres -d "$db" -Atc "
    SELECT coalesce(wait_event_type, 'CPU') || ':' || coalesce(wait_event, '-') || ' | '
           || left(regexp_replace(query, '\s+', ' ', 'g'), 60)
    FROM pg_stat_activity
    WHERE datname = '$db' AND state = 'active' AND pid <> pg_backend_pid()" >>"$out"
  sleep 0.1
done
