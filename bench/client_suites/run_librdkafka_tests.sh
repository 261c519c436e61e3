#!/usr/bin/env bash
# librdkafka's own integration test suite (tests/0xxx-*.c, *.cpp) against a `sluice serve` started here.
#
# Usage: bench/client_suites/run_librdkafka_tests.sh [TEST_NUMBER ...]   (default: every test number)
#   WORK=/tmp/sluice-rdkafka-suite  scratch folder (source, build, Sluice data, logs); kept between runs
#   PYTHON=.venv/bin/python         the interpreter with Sluice and confluent-kafka installed
#   PER_TEST_TIMEOUT=600            seconds one test-runner process may take
# Needs the dev venv (Sluice, confluent-kafka) and `scripts/install-system-deps.sh client-suites`.
# Takes about 25 minutes (2 to build, the rest running; 0000 is librdkafka's unit tests and 8000 a
# manual idle producer that never ends: neither checks a broker, so neither runs by default).
#
# What it does:
#  1. fetches the source of the installed librdkafka (`apt-get source`, the Debian package's version, so the
#     tests match the library they are linked against) through a scratch apt configuration under $WORK:
#     the machine's apt sources are not touched;
#  2. builds tests/test-runner against the system librdkafka (librdkafka-dev, librdkafka++1), as the
#     suite's Makefile does but without building the library itself;
#  3. adapts the fixtures only, to a one-broker cluster: test_admin_create_topic() asks for replication
#     factor 1 where a test asks for 3 (the suite's clusters have 3 brokers; Kafka with one broker refuses
#     3 with INVALID_REPLICATION_FACTOR, as Sluice does), and $KAFKA_PATH/bin/kafka-topics.sh is
#     bench/client_suites/kafka_topics_shim.py (no registry ships the Kafka distribution);
#  4. runs each test number in its own test-runner process (-Q quick mode, -L broker tests only) against
#     Sluice configured like the suite's "default" scenario (auto-create on, num.partitions=4), then the
#     "noautocreate" scenario tests against a Sluice with auto-create off, and 0081 (admin, ACLs) against a
#     Sluice with security.auth=required over SASL/PLAIN as a super user (the suite's clusters run an
#     authorizer);
#  5. reads each test's outcome from the runner's log and compares it with librdkafka_expected.txt beside
#     this script (librdkafka_results.py), printing the tests that did not simply pass and the counts.
# Exit status: 0 when every test listed PASSED there passed; 1 otherwise.
set -uo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
WORK="${WORK:-/tmp/sluice-rdkafka-suite}"
PYTHON="${PYTHON:-$REPO/.venv/bin/python}"
PER_TEST_TIMEOUT="${PER_TEST_TIMEOUT:-600}"
EXPECTED="$HERE/librdkafka_expected.txt"
mkdir -p "$WORK"
WORK="$(cd "$WORK" && pwd)"

log() { echo "[run_librdkafka_tests] $*" >&2; }

fetch_source() {
    local version codename apt_dir opts
    version="$(dpkg-query -W -f='${Version}' librdkafka-dev 2>/dev/null)" || {
        log "librdkafka-dev is not installed (scripts/install-system-deps.sh installs it)"; exit 2; }
    SRC="$WORK/librdkafka-${version%%-*}"
    [ -f "$SRC/tests/test.c" ] && return 0
    codename="$(. /etc/os-release && echo "$VERSION_CODENAME")"
    apt_dir="$WORK/apt"
    mkdir -p "$apt_dir/lists/partial" "$apt_dir/sources.list.d"
    cat > "$apt_dir/sources.list.d/src.sources" <<EOF
Types: deb-src
URIs: http://deb.debian.org/debian
Suites: $codename
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
    opts=(-o "Dir::Etc::SourceList=/dev/null" -o "Dir::Etc::SourceParts=$apt_dir/sources.list.d"
          -o "Dir::State::Lists=$apt_dir/lists")
    log "fetching librdkafka $version source"
    apt-get "${opts[@]}" update -qq || exit 2
    (cd "$WORK" && apt-get "${opts[@]}" source --download-only "librdkafka=$version" -qq) || exit 2
    rm -rf "$SRC" && dpkg-source -x "$WORK"/librdkafka_"$version".dsc "$SRC" >/dev/null || exit 2
}

build_runner() {
    local tests="$SRC/tests"
    [ -x "$tests/test-runner" ] && return 0
    log "building test-runner against the system librdkafka (about 2 minutes on 2 cores)"
    (cd "$SRC" && ./configure --prefix=/usr > "$WORK/configure.log" 2>&1) || { log "configure failed"; exit 2; }
    # The suite's Makefile lists the in-tree static libraries as prerequisites: empty archives satisfy
    # make, and LDFLAGS without -L../src makes the link take the system's shared libraries.
    ar rc "$SRC/src/librdkafka.a" && ar rc "$SRC/src-cpp/librdkafka++.a"
    # Fixture for a one-broker cluster (see the header): replication factor 3 becomes 1.
    grep -q 'sluice: one broker' "$tests/test.c" || sed -i '/^void test_admin_create_topic(/,/^}/ s|^        test_timing_t t_create;$|&\n        if (replication_factor > 1) replication_factor = 1; /* sluice: one broker */|' \
        "$tests/test.c"
    [ "$(grep -c 'sluice: one broker' "$tests/test.c")" = 1 ] || { log "test.c patch did not apply"; exit 2; }
    make -C "$tests" -j2 test-runner LDFLAGS="-rdynamic" > "$WORK/build.log" 2>&1 || {
        log "build failed: see $WORK/build.log"; exit 2; }
}

SLUICE_PID=""
fresh_dir() { rm -rf "$WORK/sluice-$1" && mkdir -p "$WORK/sluice-$1/data"; }
start_sluice() {  # start_sluice NAME [VAR=value ...]: Sluice on port 0 on $WORK/sluice-NAME; sets KAFKA_PORT
    local name="$1"; shift
    local data="$WORK/sluice-$name"
    env SLUICE_KAFKA__PORT=0 SLUICE_MQTT__ENABLED=false SLUICE_TCP__ENABLED=false SLUICE_HTTP__ENABLED=false \
        SLUICE_STORAGE__DEFAULT_PARTITIONS=4 "$@" PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}" \
        "$PYTHON" -m sluice.cli serve --data-dir "$data/data" > "$data/serve.log" 2>&1 &
    SLUICE_PID=$!
    for _ in $(seq 1 600); do
        if [ -f "$data/data/endpoints.json" ]; then
            KAFKA_PORT="$("$PYTHON" -c 'import json,sys; print(json.load(open(sys.argv[1]))["kafka"]["port"])' \
                "$data/data/endpoints.json")"
            log "sluice ($name) pid $SLUICE_PID on 127.0.0.1:$KAFKA_PORT, log $data/serve.log"
            return 0
        fi
        kill -0 "$SLUICE_PID" 2>/dev/null || { log "sluice did not start: $data/serve.log"; exit 2; }
        sleep 0.1
    done
    log "sluice did not start in 60 s"; exit 2
}
stop_sluice() {
    [ -n "$SLUICE_PID" ] || return 0
    kill "$SLUICE_PID" 2>/dev/null && wait "$SLUICE_PID" 2>/dev/null
    SLUICE_PID=""
}
trap stop_sluice EXIT

run_tests() {  # run_tests PHASE EXTRA_ARGS NUMBERS...: one test-runner per number, its log in $WORK/logs/PHASE
    local phase="$1" extra="$2"; shift 2
    local tests="$SRC/tests" n rc
    mkdir -p "$WORK/logs/$phase"
    for n in "$@"; do
        (cd "$tests" || exit 2
         if [ -n "${SUBTESTS:-}" ]; then export SUBTESTS; fi
         RDKAFKA_TEST_CONF="$WORK/test-$phase.conf" TESTS="$n" TEST_KAFKA_VERSION=3.1.0 \
            KAFKA_PATH="$WORK/kafka" BROKERS="127.0.0.1:$KAFKA_PORT" \
            timeout "$PER_TEST_TIMEOUT" ./test-runner -Q -L $extra > "$WORK/logs/$phase/$n.log" 2>&1)
        rc=$?
        log "$phase $n exit status $rc"
    done
}

write_conf() {  # write_conf PHASE [extra librdkafka properties...]
    local phase="$1"; shift
    { echo "metadata.broker.list=127.0.0.1:$KAFKA_PORT"; echo "test.timeout.multiplier=3"
      for line in "$@"; do echo "$line"; done; } > "$WORK/test-$phase.conf"
}

fetch_source
build_runner
mkdir -p "$WORK/kafka/bin"
printf '#!/bin/sh\nexec "%s" "%s" "$@"\n' "$PYTHON" "$HERE/kafka_topics_shim.py" > "$WORK/kafka/bin/kafka-topics.sh"
chmod +x "$WORK/kafka/bin/kafka-topics.sh"
rm -rf "$WORK/logs"

if [ $# -gt 0 ]; then
    NUMBERS=("$@")
else
    mapfile -t NUMBERS < <(sed -n '/^struct test tests\[\] = {/,/^};/p' "$SRC/tests/test.c" \
        | grep -o '_TEST([0-9]\{4\}' | cut -c7-10 | sort -u | grep -v -x -E '0000|8000')
fi

# Phase 1: the suite's default scenario (auto-create on, 4 partitions a topic).
fresh_dir default && start_sluice default
write_conf default
run_tests default "" $(printf '%s\n' "${NUMBERS[@]}" | grep -v -x 0081)
stop_sluice

# Phase 2: the noautocreate scenario's tests (only those whose .scenario says so run with -s).
fresh_dir noautocreate && start_sluice noautocreate SLUICE_STORAGE__AUTO_CREATE_TOPICS=false
write_conf noautocreate
run_tests noautocreate "-s noautocreate" $(printf '%s\n' "${NUMBERS[@]}" | grep -x -E '0045|0107|0109|0111')
stop_sluice

# Phase 3: the admin test with an authorizer (ACL APIs), logged in over SASL/PLAIN as a super user.
if printf '%s\n' "${NUMBERS[@]}" | grep -qx 0081; then
    fresh_dir acl
    RDKAFKA_PASSWORD=rdkafka-secret PYTHONPATH="$REPO" "$PYTHON" -m sluice.cli users add rdkafka \
        --password-env RDKAFKA_PASSWORD --data-dir "$WORK/sluice-acl/data" > /dev/null || exit 2
    start_sluice acl SLUICE_SECURITY__AUTH=required 'SLUICE_SECURITY__SUPER_USERS=["rdkafka"]'
    write_conf acl security.protocol=SASL_PLAINTEXT sasl.mechanisms=PLAIN sasl.username=rdkafka \
        sasl.password=rdkafka-secret
    run_tests acl "" 0081
    # 0081 stops at its broker AlterConfigs (see librdkafka_expected.txt): the subtests after it, one by one.
    for sub in DescribeConfigs DeleteRecords ListConsumerGroups DescribeConsumerGroups DeleteGroups \
               DeleteConsumerGroupOffsets AlterConsumerGroupOffsets ListConsumerGroupOffsets; do
        cp "$WORK/test-acl.conf" "$WORK/test-acl-$sub.conf"
        SUBTESTS="do_test_$sub" run_tests "acl-$sub" "" 0081
    done
    stop_sluice
fi

# Each test's outcome from the runner's logs, compared with the expectations.
"$PYTHON" "$HERE/librdkafka_results.py" "$WORK/logs" "$EXPECTED"
