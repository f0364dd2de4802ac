#!/usr/bin/env bash
# Installs what vigil's tests need on a fresh machine (Debian, as root). Idempotent:
# skips anything already present. PostgreSQL, RabbitMQ and NATS are started by the
# machine itself; this script starts PostgreSQL only if it is not answering.
set -euo pipefail

need=()
command -v cargo-nextest >/dev/null 2>&1 || cargo install --locked cargo-nextest
# .ci/run checks that no crate declares a dependency it does not use.
command -v cargo-machete >/dev/null 2>&1 || cargo install --locked cargo-machete
# .ci/run checks the dependency tree's licences, bans and sources (deny.toml).
command -v cargo-deny >/dev/null 2>&1 || cargo install --locked cargo-deny
command -v chromium >/dev/null 2>&1 || need+=(chromium)
command -v chromedriver >/dev/null 2>&1 || need+=(chromium-driver)
command -v wrk >/dev/null 2>&1 || need+=(wrk)
# The agent-check interop test drives a real HAProxy.
command -v haproxy >/dev/null 2>&1 || need+=(haproxy)
# promtool (package prometheus) checks every /metrics endpoint.
command -v promtool >/dev/null 2>&1 || need+=(prometheus)
command -v python3 >/dev/null 2>&1 || need+=(python3)
if [ ${#need[@]} -gt 0 ]; then
  echo "installing: ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

# The AWS Auto Scaling tests (crates/vigil-cli/tests/controller/aws.rs) run against moto
# in server mode, a local AWS API (PyPI). Debian's own Python refuses pip installs
# outside a venv (PEP 668) unless told otherwise.
if ! command -v moto_server >/dev/null 2>&1 && ! python3 -c 'import moto.server' >/dev/null 2>&1; then
  echo "installing moto[server] (pip)"
  if ! python3 -m pip --version >/dev/null 2>&1; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends python3-pip >/dev/null
  fi
  python3 -m pip install -q 'moto[server]' 2>/dev/null \
    || python3 -m pip install -q --break-system-packages 'moto[server]'
fi

if command -v pg_isready >/dev/null 2>&1 && ! pg_isready -h 127.0.0.1 -p 5432 -q; then
  echo "PostgreSQL is not answering; starting it"
  pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql)" main start || true
fi

# The queue-worker tests run against the machine's RabbitMQ and NATS JetStream.
answers() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
if ! answers 5672 && command -v rabbitmq-server >/dev/null 2>&1; then
  echo "RabbitMQ is not answering on 5672; starting it"
  rabbitmq-server -detached || true
fi
if ! answers 4222 && [ -x /usr/sbin/nats-server ]; then
  echo "NATS is not answering on 4222; starting it with JetStream"
  start-stop-daemon --start --oknodo --background --exec /usr/sbin/nats-server -- \
    -a 127.0.0.1 -p 4222 -js -sd /var/lib/nats-server -l /var/log/nats-server.log || true
fi
for port in 5672 4222; do
  for _ in $(seq 60); do answers $port && break; sleep 1; done
  answers $port || echo "WARNING: nothing answers on 127.0.0.1:$port: the queue-worker tests (RabbitMQ 5672, NATS 4222) will fail"
done

# The HTTP/2 edge tests of vigil lb (crates/vigil-cli/tests/lb/edge.rs) drive the python
# h2 library (with hpack and hyperframe) for half header blocks and idle connections.
if ! python3 -c 'import h2, hpack, hyperframe' >/dev/null 2>&1; then
  echo "installing h2 (pip)"
  if ! python3 -m pip --version >/dev/null 2>&1; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends python3-pip >/dev/null
  fi
  python3 -m pip install -q h2 2>/dev/null \
    || python3 -m pip install -q --break-system-packages h2
fi
