"""DescribeUserScramCredentials / AlterUserScramCredentials with confluent-kafka's AdminClient and kcat logins:
a super user creates and deletes users over the Kafka protocol, the users log in (or no longer can), others
are refused CLUSTER_AUTHORIZATION_FAILED, and each refusal carries Kafka's error code."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import (
    AdminClient,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialDeletion,
    UserScramCredentialUpsertion,
)

from broker.protocol.kafka import ApiKey
from broker.protocol.kafka_codes import ErrorCode
from broker.security import (
    AclBinding,
    AclStore,
    Operation,
    PatternType,
    Permission,
    ResourceType,
    UserStore,
)
from tests.broker.server.conftest import SluiceProcess
from tests.broker.server.raw_client import RawClient

SHA256, SHA512 = ScramMechanism.SCRAM_SHA_256, ScramMechanism.SCRAM_SHA_512
ADMIN_PASSWORD = "admin secret"


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SluiceProcess]:
    data = tmp_path_factory.mktemp("scram-admin") / "data"
    store = UserStore(data)
    store.add("admin", ADMIN_PASSWORD)
    store.add("eve", "eve secret")
    store.add("ops", "ops secret")
    # ops may describe and alter the cluster through an ACL (not a super user)
    AclStore(data).add([AclBinding(ResourceType.CLUSTER, "kafka-cluster", PatternType.LITERAL, "User:ops", "*",
                                   Operation.ALTER, Permission.ALLOW)])
    proc = SluiceProcess(data, env={"SLUICE_SECURITY__AUTH": "required",
                                    "SLUICE_SECURITY__SUPER_USERS": '["admin"]'})
    proc.start()
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def open_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SluiceProcess]:
    proc = SluiceProcess(tmp_path_factory.mktemp("scram-open") / "data")
    proc.start()
    yield proc
    proc.stop()


def admin_client(server: SluiceProcess, user: str, password: str) -> AdminClient:
    return AdminClient({"bootstrap.servers": server.bootstrap, "security.protocol": "SASL_PLAINTEXT",
                        "sasl.mechanism": "SCRAM-SHA-256", "sasl.username": user, "sasl.password": password})


def outcomes(futures: dict[str, Any]) -> dict[str, Any]:
    """{user: None | description | KafkaError code}"""
    found: dict[str, Any] = {}
    for user, future in futures.items():
        try:
            found[user] = future.result(timeout=30)
        except KafkaException as exc:
            found[user] = exc.args[0].code()
    return found


def kcat_login(server: SluiceProcess, mechanism: str, user: str, password: str, wait_s: int = 10) -> bool:
    """Whether kcat lists metadata after logging in (a refused login is retried until ``wait_s``)."""
    assert shutil.which("kcat"), "kcat is installed by scripts/install-system-deps.sh"
    done = subprocess.run(
        ["kcat", "-b", server.bootstrap, "-L", "-m", str(wait_s), "-X", "security.protocol=SASL_PLAINTEXT",
         "-X", f"sasl.mechanisms={mechanism}", "-X", f"sasl.username={user}", "-X", f"sasl.password={password}"],
        capture_output=True, text=True, timeout=60, check=False)
    return done.returncode == 0 and "1 brokers:" in done.stdout


def test_a_super_user_creates_and_deletes_users_who_log_in_with_them(secured: SluiceProcess) -> None:
    admin = admin_client(secured, "admin", ADMIN_PASSWORD)
    created = outcomes(admin.alter_user_scram_credentials([
        UserScramCredentialUpsertion("carol", ScramCredentialInfo(SHA512, 8192), b"carol secret"),
        UserScramCredentialUpsertion("dan", ScramCredentialInfo(SHA256, 4096), b"dan secret"),
    ]))
    assert created == {"carol": None, "dan": None}
    described = outcomes(admin.describe_user_scram_credentials(["carol", "dan"]))
    assert [(c.mechanism, c.iterations) for c in described["carol"].scram_credential_infos] == [(SHA512, 8192)]
    assert [(c.mechanism, c.iterations) for c in described["dan"].scram_credential_infos] == [(SHA256, 4096)]
    everyone = admin.describe_user_scram_credentials().result(timeout=30)
    assert {"admin", "eve", "carol", "dan"} <= set(everyone)

    assert kcat_login(secured, "SCRAM-SHA-512", "carol", "carol secret")
    assert kcat_login(secured, "PLAIN", "carol", "carol secret")  # PLAIN checks the SHA-512 credential she has
    assert not kcat_login(secured, "SCRAM-SHA-256", "carol", "carol secret", 2)  # no SHA-256 credential
    assert not kcat_login(secured, "SCRAM-SHA-512", "carol", "wrong", 2)

    assert outcomes(admin.alter_user_scram_credentials([UserScramCredentialDeletion("carol", SHA512)])) == {
        "carol": None}
    assert outcomes(admin.describe_user_scram_credentials(["carol"])) == {"carol": KafkaError.RESOURCE_NOT_FOUND}
    assert not kcat_login(secured, "SCRAM-SHA-512", "carol", "carol secret", 2)
    assert "carol" not in UserStore(secured.data_dir).names()  # the same store `sluice users` manages


def test_who_is_not_a_super_user_is_refused_cluster_authorization(secured: SluiceProcess) -> None:
    eve = admin_client(secured, "eve", "eve secret")
    assert outcomes(eve.alter_user_scram_credentials([
        UserScramCredentialUpsertion("eve", ScramCredentialInfo(SHA256, 4096), b"new")])) == {
        "eve": KafkaError.CLUSTER_AUTHORIZATION_FAILED}
    assert kcat_login(secured, "SCRAM-SHA-256", "eve", "eve secret")  # her password is unchanged
    assert "kafka: denied alter on cluster" in secured.log_text()  # audited by the authorizer
    # Describe over a raw connection: librdkafka 2.12 crashes (SIGSEGV) parsing the top-level error Kafka sends.
    described = asyncio.run(_raw(secured.port, ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS,
                                 {"users": [{"name": "admin"}]}, login=("eve", "eve secret")))
    assert int(described.error_code) == ErrorCode.CLUSTER_AUTHORIZATION_FAILED
    assert [(r.user, int(r.error_code)) for r in described.results] == [
        ("admin", ErrorCode.CLUSTER_AUTHORIZATION_FAILED)]
    allowed = asyncio.run(_raw(secured.port, ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS,
                               {"users": [{"name": "admin"}]}, login=("admin", ADMIN_PASSWORD)))
    assert int(allowed.error_code) == ErrorCode.NONE
    assert [(r.user, int(r.error_code), len(r.credential_infos)) for r in allowed.results] == [
        ("admin", ErrorCode.NONE, 2)]


def test_an_acl_granting_alter_on_the_cluster_allows_the_scram_apis(secured: SluiceProcess) -> None:
    ops = admin_client(secured, "ops", "ops secret")
    assert outcomes(ops.alter_user_scram_credentials([
        UserScramCredentialUpsertion("gina", ScramCredentialInfo(SHA256, 4096), b"gina secret")])) == {"gina": None}
    described = outcomes(ops.describe_user_scram_credentials(["gina"]))  # ALTER implies DESCRIBE (Kafka's rule)
    assert [c.mechanism for c in described["gina"].scram_credential_infos] == [SHA256]
    assert kcat_login(secured, "SCRAM-SHA-256", "gina", "gina secret")


def test_refusals_carry_kafkas_error_codes(open_broker: SluiceProcess) -> None:
    admin = AdminClient({"bootstrap.servers": open_broker.bootstrap})
    assert outcomes(admin.alter_user_scram_credentials([
        UserScramCredentialUpsertion("few", ScramCredentialInfo(SHA256, 4095), b"pw"),
        UserScramCredentialUpsertion("many", ScramCredentialInfo(SHA512, 16385), b"pw"),
        UserScramCredentialDeletion("nobody", SHA256),
        UserScramCredentialUpsertion("ok", ScramCredentialInfo(SHA256, 16384), b"pw"),
    ])) == {"few": KafkaError.UNACCEPTABLE_CREDENTIAL, "many": KafkaError.UNACCEPTABLE_CREDENTIAL,
            "nobody": KafkaError.RESOURCE_NOT_FOUND, "ok": None}
    assert UserStore(open_broker.data_dir).check_password("ok", "pw")


async def _raw(port: int, api_key: int, body: dict[str, Any], login: tuple[str, str] | None = None) -> Any:
    client = await RawClient.connect(port)
    try:
        if login is not None:
            handshake = await client.request(ApiKey.SASL_HANDSHAKE, 1, {"mechanism": "PLAIN"})
            assert int(handshake.error_code) == ErrorCode.NONE
            token = f"\0{login[0]}\0{login[1]}".encode()
            answer = await client.request(ApiKey.SASL_AUTHENTICATE, 2, {"auth_bytes": token})
            assert int(answer.error_code) == ErrorCode.NONE
        return await client.request(api_key, 0, body)
    finally:
        await client.close()


def test_raw_requests_duplicates_unknown_mechanisms_and_empty_names(open_broker: SluiceProcess) -> None:
    upsert = {"mechanism": 1, "iterations": 4096, "salt": b"salt", "salted_password": b"x" * 32}
    answer = asyncio.run(_raw(open_broker.port, ApiKey.ALTER_USER_SCRAM_CREDENTIALS, {
        "deletions": [{"name": "twice", "mechanism": 1}],
        "upsertions": [{**upsert, "name": "twice"}, {**upsert, "name": "odd", "mechanism": 3},
                       {**upsert, "name": ""}, {**upsert, "name": "fine"}],
    }))
    codes = {r.user: (int(r.error_code), r.error_message) for r in answer.results}
    assert codes == {
        "twice": (ErrorCode.DUPLICATE_RESOURCE, "A user credential cannot be altered twice in the same request"),
        "odd": (ErrorCode.UNSUPPORTED_SASL_MECHANISM, "Unknown SCRAM mechanism"),
        "": (ErrorCode.UNACCEPTABLE_CREDENTIAL, "Username must not be empty"),
        "fine": (ErrorCode.NONE, None),
    }
    assert [r.user for r in answer.results][0] == "fine"  # applied changes first, then errors (Kafka's order)
    described = asyncio.run(_raw(open_broker.port, ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS,
                                 {"users": [{"name": "fine"}, {"name": "fine"}, {"name": "twice"}]}))
    assert int(described.error_code) == ErrorCode.NONE
    assert {r.user: int(r.error_code) for r in described.results} == {
        "fine": ErrorCode.DUPLICATE_RESOURCE, "twice": ErrorCode.RESOURCE_NOT_FOUND}


def test_the_store_file_never_holds_a_password(open_broker: SluiceProcess) -> None:
    admin = AdminClient({"bootstrap.servers": open_broker.bootstrap})
    assert outcomes(admin.alter_user_scram_credentials([
        UserScramCredentialUpsertion("frank", ScramCredentialInfo(SHA512, 4096), b"Plaintext-Marker")])) == {
        "frank": None}
    raw = (Path(open_broker.data_dir) / "security" / "users.json").read_bytes()
    assert b"Plaintext-Marker" not in raw
    assert UserStore(open_broker.data_dir).check_password("frank", "Plaintext-Marker")
