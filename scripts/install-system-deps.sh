#!/usr/bin/env bash
# Debian packages the test suite and benchmarks run against: real peers nobody here wrote.
# Idempotent: installs only what is missing. Needs root (CI runs as root) or sudo.
set -euo pipefail
# `install-system-deps.sh venv` installs only what `python3 -m venv` needs on a bare Debian (make run);
# `install-system-deps.sh bench` adds what the benchmarks build their C load generator with (make bench).
# `install-system-deps.sh build` installs what setup.py compiles native-modules.txt with (mypyc's C: a
# compiler, libc headers, Python's headers); the tests need it (the compiled and pure builds are compared).
# `install-system-deps.sh client-suites` adds what bench/client_suites builds librdkafka's own test suite with
# (its source comes from `apt-get source`, dpkg-dev; rapidjson-dev lets the stats tests 0053/0110 build in).
# chromium: the web console's browser tests (tests/sluice/console) drive it headless through Playwright.
build_packages=(gcc libc6-dev python3-dev)
test_packages=("${build_packages[@]}" python3-venv kcat mosquitto mosquitto-clients redis-server nats-server docker-compose netcat-openbsd curl
  chromium)
case "${1:-}" in
  venv) packages=(python3-venv) ;;
  build) packages=("${build_packages[@]}") ;;
  bench) packages=("${test_packages[@]}" librdkafka-dev) ;;
  client-suites) packages=("${build_packages[@]}" g++ make dpkg-dev librdkafka-dev rapidjson-dev libssl-dev zlib1g-dev) ;;
  *) packages=("${test_packages[@]}") ;;
esac
missing=()
for pkg in "${packages[@]}"; do
  dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null; then SUDO="sudo"; else
    echo "install-system-deps: need root to apt-get install ${missing[*]}" >&2; exit 1
  fi
fi
echo "install-system-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
