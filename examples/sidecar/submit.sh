#!/bin/sh
# Submit runs to runq with curl and wait for their outcome, the way any application can.
#
#   ./submit.sh render  DOC              render a document through the app's callback
#   ./submit.sh approve DOC              the same, paused for approval; continues it (approved)
#   ./submit.sh slow    DOC              the app answers 202 + Location; runq polls it
#   ./submit.sh summarize "some text"    one chat completion through agent/summarize
#
# RUNQ_URL defaults to http://127.0.0.1:7777, APP_URL (app.js) to http://127.0.0.1:8080.
# Both may still be starting: it waits up to 30 s for them to answer before submitting.
# Needs curl; jq is optional (prettier output).
set -eu
RUNQ_URL=${RUNQ_URL:-http://127.0.0.1:7777}
APP_URL=${APP_URL:-http://127.0.0.1:8080}

json_field() { # json_field NAME: the first string field NAME of the JSON on stdin
  grep -o "\"$1\":\"[^\"]*\"" | head -n 1 | cut -d '"' -f 4
}

submit() { # submit TYPE ID PAYLOAD_JSON -> prints the run id
  curl -fsS -X POST "$RUNQ_URL/runs" -H 'content-type: application/json' \
    -d "{\"component_type\":\"$1\",\"component_id\":\"$2\",\"payload\":$3}" | json_field run_id
}

wait_for() { # wait_for RUN_ID STATUS... -> prints the run once its status is one of STATUS
  run_id=$1; shift
  for _ in $(seq 1 120); do
    run=$(curl -fsS "$RUNQ_URL/runs/$run_id")
    status=$(printf '%s' "$run" | json_field status)
    for want in "$@"; do
      if [ "$status" = "$want" ]; then printf '%s\n' "$run"; return 0; fi
    done
    sleep 0.5
  done
  echo "run $run_id did not become $* (last: $status)" >&2
  return 1
}

wait_ready() { # wait_ready URL: until it answers 2xx, for up to 30 s
  for _ in $(seq 1 60); do
    if curl -fs -o /dev/null "$1"; then return 0; fi
    sleep 0.5
  done
  echo "$1 did not answer within 30 s" >&2
  return 1
}

show() { if command -v jq >/dev/null 2>&1; then jq .; else cat; fi; }

case "${1:-}" in
  render|slow|approve|summarize)
    wait_ready "$RUNQ_URL/readyz"
    wait_ready "$APP_URL/healthz" ;;
esac

case "${1:-}" in
  render)
    run_id=$(submit task render "{\"doc\":\"${2:-hello}\"}")
    wait_for "$run_id" completed failed | show ;;
  slow)
    run_id=$(submit task render "{\"doc\":\"${2:-hello}\",\"slow\":true}")
    wait_for "$run_id" completed failed | show ;;
  approve)
    run_id=$(submit task render "{\"doc\":\"${2:-hello}\",\"approval\":true}")
    wait_for "$run_id" paused failed | show
    curl -fsS -X POST "$RUNQ_URL/runs/$run_id/continue" -H 'content-type: application/json' \
      -d '{"decision":{"approved":true}}' >/dev/null
    wait_for "$run_id" completed failed | show ;;
  summarize)
    text=$(printf '%s' "${2:-runq runs background work beside any application}" | sed 's/"/\\"/g')
    run_id=$(submit agent summarize "{\"prompt\":\"$text\"}")
    wait_for "$run_id" completed failed | show ;;
  *)
    sed -n '2,11p' "$0"; exit 2 ;;
esac
