#!/usr/bin/env bash
# Fetch the Eclipse Paho MQTT interoperability tests (eclipse/paho.mqtt.testing, EPL-1.0/EDL-1.0; not
# vendored here) and run client_test.py (MQTT 3.1.1) and client_test5.py (MQTT 5.0) against a fresh
# `sluice serve` and against Mosquitto, side by side (bench/client_suites/paho_interop.py does the running).
#
#   bench/client_suites/run_paho_interop.sh [paho_interop options, e.g. --brokers sluice --only test_basic]
#
# PAHO_TESTING_DIR=/path/to/paho.mqtt.testing   use a checkout you already have (no network needed)
# PAHO_TESTING_REF=<commit>                     check this commit out (default: the default branch's head)
# PAHO_TESTING_CACHE=<dir>                      where the clone is kept (default ~/.cache/sluice/)
# PYTHON=<interpreter with Sluice installed>    default: python3
# Needs git (for the fetch), mosquitto (Debian package, scripts/install-system-deps.sh) and Sluice.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
python=${PYTHON:-python3}
if [ -n "${PAHO_TESTING_DIR:-}" ]; then
  checkout=$PAHO_TESTING_DIR
else
  checkout=${PAHO_TESTING_CACHE:-$HOME/.cache/sluice}/paho.mqtt.testing
  if [ ! -d "$checkout/.git" ]; then
    git clone --quiet https://github.com/eclipse/paho.mqtt.testing "$checkout"
  fi
  git -C "$checkout" fetch --quiet origin
  git -C "$checkout" checkout --quiet --detach "${PAHO_TESTING_REF:-origin/HEAD}"
  echo "paho.mqtt.testing at $(git -C "$checkout" rev-parse HEAD)"
fi
cd "$root"
exec "$python" -m bench.client_suites.paho_interop --suite-dir "$checkout/interoperability" --markdown "$@"
