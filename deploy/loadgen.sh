#!/bin/sh
# Load generator of the compose stack (compose.yaml): one heavy client that spreads its
# calls over every data center's enforcer, and a few well-behaved clients. Every 10 s it
# prints what each enforcer admitted and denied, and the heavy client's admitted total over
# the last minute across all data centers, which the global limit (deploy/rules/api.yaml:
# 120 a minute) should hold near 120, not 120 per data center.
#
# Environment (compose.yaml sets it):
#   ENFORCERS   space-separated base URLs of the enforcers' check API
#   DOMAIN      rules domain (api)
#   KEY         descriptor entry key that names a client (client)
#   HEAVY       the heavy client's name (heavy)
#   LIGHT       space-separated names of well-behaved clients
#   TICK        seconds between two rounds (one heavy call to each enforcer per round)
set -u
: "${ENFORCERS:=http://enforcer-eu:8081 http://enforcer-us:8081}"
: "${DOMAIN:=api}"
: "${KEY:=client}"
: "${HEAVY:=heavy}"
: "${LIGHT:=alice bob carol}"
: "${TICK:=0.1}"

# check URL CLIENT: prints ok, denied or error.
check() {
  body=$(curl -s --max-time 2 -X POST -H 'Content-Type: application/json' \
    -d "{\"domain\":\"$DOMAIN\",\"descriptors\":[{\"entries\":[{\"key\":\"$KEY\",\"value\":\"$2\"}]}]}" \
    "$1/v1/check") || { echo error; return; }
  case $body in
  *'"overall_code":"OVER_LIMIT"'*) echo denied ;;
  *'"overall_code":"OK"'*) echo ok ;;
  *) echo error ;;
  esac
}

for u in $ENFORCERS; do
  until curl -sf --max-time 2 "$u/readyz" >/dev/null; do
    echo "waiting for $u/readyz"
    sleep 2
  done
done
echo "load: $HEAVY on every enforcer each ${TICK}s; $LIGHT once a second each"

# Counters are kept per enforcer index i as variables ok_i, den_i, err_i, lden_i.
i=0
for u in $ENFORCERS; do
  i=$((i + 1))
  eval "ok_$i=0 den_$i=0 err_$i=0 lden_$i=0"
done
n=$i
last6="0 0 0 0 0 0" # heavy admitted per 10 s, last minute
round=0
start=$(date +%s)
while :; do
  i=0
  for u in $ENFORCERS; do
    i=$((i + 1))
    case $(check "$u" "$HEAVY") in
    ok) eval "ok_$i=\$((ok_$i + 1))" ;;
    denied) eval "den_$i=\$((den_$i + 1))" ;;
    *) eval "err_$i=\$((err_$i + 1))" ;;
    esac
  done
  round=$((round + 1))
  # Well-behaved clients: once a second each, round-robin over the enforcers.
  if [ $((round % 10)) -eq 0 ]; then
    i=0
    for u in $ENFORCERS; do
      i=$((i + 1))
      [ $(((round / 10 + i) % n)) -eq 0 ] || continue
      for c in $LIGHT; do
        [ "$(check "$u" "$c")" = ok ] || eval "lden_$i=\$((lden_$i + 1))"
      done
    done
  fi
  now=$(date +%s)
  if [ $((now - start)) -ge 10 ]; then
    line="$(date -u +%H:%M:%S) $HEAVY:"
    sum=0
    i=0
    for u in $ENFORCERS; do
      i=$((i + 1))
      eval "o=\$ok_$i d=\$den_$i e=\$err_$i l=\$lden_$i"
      host=${u#*://}
      host=${host%%:*}
      line="$line $host admitted $o denied $d errors $e;"
      sum=$((sum + o))
      [ "$l" -eq 0 ] || line="$line (well-behaved clients denied there: $l)"
      eval "ok_$i=0 den_$i=0 err_$i=0 lden_$i=0"
    done
    last6="${last6#* } $sum"
    minute=0
    for v in $last6; do minute=$((minute + v)); done
    echo "$line admitted in all DCs over the last minute: $minute"
    start=$now
  fi
  sleep "$TICK"
done
