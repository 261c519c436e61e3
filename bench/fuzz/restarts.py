"""``python -m bench.fuzz.restarts --inputs N --seed S --rounds R``: MQTT fuzz inputs, then ``kill -9`` with
connections open, then ``sluice serve`` again on the same data: the durable-state restore under hostile state.

Each round sends ``--inputs`` inputs of the MQTT campaign (``bench/fuzz/mqtt.py``) on one connection, opens
40 more connections whose CONNECTs carry wills (3.1.1 and 5.0, random Will Delay Interval, session expiry,
QoS, retain flag and payload), kills the broker with SIGKILL while all of them are open, and starts it again
on the same data directory (the campaign's ``BrokerProcess.start`` would wipe it). After each restart: the
restore's log line (sessions, messages, wills), a few sweeps for the restored wills that are due, a real
client (mosquitto_pub/sub -V 5), and the broker log since the restart: any ERROR/CRITICAL record or
traceback is a finding. Exit code 1 on a finding. The campaign itself (``python -m bench.fuzz mqtt``)
never restarts a broker on its data, so this is the only fuzzing of the restore path.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from bench.fuzz.harness import BrokerProcess, Hang, restart_on_same_data
from bench.fuzz.mqtt import MqttTarget
from ingest.mqtt.codec import encode
from ingest.mqtt.packets import MQTT_5, MQTT_311, Connect, Properties, Will

__all__ = ["main"]

HELD = 40  # connections with wills open at each kill


def _status(broker: BrokerProcess) -> dict[str, Any]:
    host, port = broker.endpoints["http"]
    with urllib.request.urlopen(f"http://{host}:{port}/mqtt", timeout=30) as answer:
        status: dict[str, Any] = json.loads(answer.read())
    return status


def _hold_wills(broker: BrokerProcess, rng: random.Random, round_: int) -> list[socket.socket]:
    held = []
    for k in range(HELD):
        version = rng.choice((MQTT_311, MQTT_5))
        v5 = version == MQTT_5
        will_props = Properties(will_delay_interval=rng.choice((None, 0, 2, 30)), content_type="text/plain",
                                user_property=(("k", "\u00e9" * rng.randint(0, 3)),)) if v5 else Properties()
        will = Will(f"will/{round_}/{k}", rng.randbytes(rng.randint(0, 300)), rng.choice((0, 1, 2)),
                    rng.random() < 0.3, will_props)
        props = Properties(session_expiry_interval=rng.choice((0, 60))) if v5 else Properties()
        connect = Connect(f"held-{round_}-{k}", version, clean_start=rng.random() < 0.5, will=will, properties=props)
        sock = socket.create_connection(broker.endpoints["mqtt"])
        sock.sendall(encode(connect, version))
        sock.settimeout(10)
        sock.recv(256)  # the CONNACK
        held.append(sock)
    return held


def _real_client(broker: BrokerProcess) -> bool:
    port = str(broker.endpoints["mqtt"][1])
    sub = subprocess.Popen(["mosquitto_sub", "-p", port, "-V", "5", "-t", "restarts/check", "-C", "1", "-W", "20"],
                           stdout=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 20
        while _status(broker)["subscriptions"] < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        subprocess.run(["mosquitto_pub", "-p", port, "-V", "5", "-q", "1", "-t", "restarts/check", "-m", "ok"],
                       check=True, timeout=20)
        out, _ = sub.communicate(timeout=30)
    finally:
        if sub.poll() is None:
            sub.kill()
            sub.wait()
    return out == b"ok\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.fuzz.restarts", description=__doc__.split("\n\n")[0])
    parser.add_argument("--inputs", type=int, default=20_000, help="fuzz inputs per round")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None, help="work directory (broker log and data)")
    args = parser.parse_args(argv)
    work = args.out or Path(tempfile.mkdtemp(prefix="sluice-fuzz-restarts-"))
    work.mkdir(parents=True, exist_ok=True)
    target = MqttTarget(10.0)
    rng = random.Random(args.seed)
    broker = BrokerProcess(target.broker_env(), work)
    broker.start()
    env = {**os.environ, "SLUICE_KAFKA__PORT": "0", "SLUICE_MQTT__PORT": "0", "SLUICE_TCP__PORT": "0",
           "SLUICE_HTTP__PORT": "0", **target.broker_env()}
    findings = 0
    try:
        for round_ in range(args.rounds):
            target.attach(broker, rng)
            for _ in range(args.inputs):
                try:
                    target.step(rng)
                except (Hang, OSError):  # judged by the campaign proper; here only the restore matters
                    target.close_all()
            held = _hold_wills(broker, rng, round_)
            before = _status(broker)
            seconds = restart_on_same_data(broker, env, round_, {"http", "mqtt"})
            target.close_all()
            for sock in held:
                sock.close()
            time.sleep(3)  # three sweeps: the restored wills that are due go out
            restored = [line for line in broker.log_path.read_text(errors="replace").splitlines()
                        if "durable sessions restored" in line][-1:]
            client_ok = _real_client(broker)
            bad = broker.new_log_findings(final=True)
            findings += len(bad) + (not client_ok)
            print(f"round {round_}: before the kill sessions {before['sessions']}, wills pending "
                  f"{before['wills_pending']}, retained {before['retained_messages']}; restarted in {seconds:.1f} s; "
                  f"{restored[0].split('ingest.mqtt: ')[-1] if restored else 'no restore line'}; real client "
                  f"{'ok' if client_ok else 'FAILED'}; ERROR lines and tracebacks {len(bad)}", flush=True)
            for record in bad[:5]:
                print(record[:2000], flush=True)
    finally:
        broker.stop()
    print(f"{args.rounds} rounds of {args.inputs} inputs, seed {args.seed}: {findings} findings; broker log "
          f"{broker.log_path}")
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
