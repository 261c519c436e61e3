"""SASL on the Kafka listener, request by request (Kafka's SaslServerAuthenticator order), with a raw client.

The SCRAM side of the client is scramp's ``ScramClient``, not ours; real Kafka clients are in test_sasl_clients.py.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import scramp

from broker.groups.coordinator import GroupCoordinator
from broker.groups.offsets import MemoryOffsetStore
from broker.log.memory import MemoryLogStore
from broker.protocol.kafka import ApiKey
from broker.protocol.kafka_codes import ErrorCode
from broker.security import Authenticator, UserStore
from broker.server.kafka import KafkaServer, KafkaServerConfig
from tests.broker.server.raw_client import RawClient

METADATA_V8 = {"topics": None, "allow_auto_topic_creation": False, "include_cluster_authorized_operations": False,
               "include_topic_authorized_operations": False}


@asynccontextmanager
async def running(tmp_path: Path, auth: bool = True) -> AsyncIterator[tuple[KafkaServer, Authenticator]]:
    users = UserStore(tmp_path)
    users.add("alice", "alice-secret")
    authenticator = Authenticator(users)
    coordinator = GroupCoordinator(MemoryOffsetStore())
    await coordinator.start()
    srv = KafkaServer(MemoryLogStore(default_partitions=1), coordinator, KafkaServerConfig(port=0),
                      authenticator=authenticator if auth else None)
    await srv.start()
    try:
        yield srv, authenticator
    finally:
        await srv.stop()
        await coordinator.stop()


async def handshake(client: RawClient, mechanism: str) -> Any:
    versions = await client.request(ApiKey.API_VERSIONS, 3, {"client_software_name": "t",
                                                             "client_software_version": "1"})
    assert versions.error_code == 0
    served = {a.api_key: (a.min_version, a.max_version) for a in versions.api_keys}
    assert served[ApiKey.SASL_HANDSHAKE] == (0, 1) and served[ApiKey.SASL_AUTHENTICATE] == (0, 2)
    return await client.request(ApiKey.SASL_HANDSHAKE, 1, {"mechanism": mechanism})


async def test_requests_before_login_close_the_connection_without_answer(tmp_path: Path) -> None:
    async with running(tmp_path) as (srv, auth):
        client = await RawClient.connect(srv.port)
        client.send(ApiKey.METADATA, 8, METADATA_V8)
        assert await client.closed_by_server()
        assert auth.failures == {"kafka": 1}
        # After ApiVersions, still nothing but SaslHandshake.
        client = await RawClient.connect(srv.port)
        await client.request(ApiKey.API_VERSIONS, 3, {"client_software_name": "t", "client_software_version": "1"})
        client.send(ApiKey.METADATA, 8, METADATA_V8)
        assert await client.closed_by_server()


async def test_unsupported_mechanism_is_answered_then_closed(tmp_path: Path) -> None:
    async with running(tmp_path) as (srv, _auth):
        client = await RawClient.connect(srv.port)
        answer = await handshake(client, "GSSAPI")
        assert answer.error_code == ErrorCode.UNSUPPORTED_SASL_MECHANISM
        assert list(answer.mechanisms) == ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]
        assert await client.closed_by_server()


@pytest.mark.parametrize("version", [0, 1, 2])
async def test_plain_login_then_requests_are_served(tmp_path: Path, version: int) -> None:
    async with running(tmp_path) as (srv, auth):
        client = await RawClient.connect(srv.port)
        assert (await handshake(client, "PLAIN")).error_code == 0
        done = await client.request(ApiKey.SASL_AUTHENTICATE, version, {"auth_bytes": b"\0alice\0alice-secret"})
        assert done.error_code == 0
        metadata = await client.request(ApiKey.METADATA, 8, METADATA_V8)
        assert metadata.brokers[0].port == srv.port
        again = await client.request(ApiKey.SASL_HANDSHAKE, 1, {"mechanism": "PLAIN"})
        assert again.error_code == ErrorCode.ILLEGAL_SASL_STATE
        assert auth.successes == {"kafka": 1} and not auth.failures
        await client.close()


async def test_bad_password_is_answered_sasl_authentication_failed_then_closed(tmp_path: Path) -> None:
    async with running(tmp_path) as (srv, auth):
        client = await RawClient.connect(srv.port)
        await handshake(client, "PLAIN")
        failed = await client.request(ApiKey.SASL_AUTHENTICATE, 2, {"auth_bytes": b"\0alice\0guess"})
        assert failed.error_code == ErrorCode.SASL_AUTHENTICATION_FAILED
        assert failed.error_message == "Authentication failed: Invalid username or password"
        assert await client.closed_by_server()
        assert auth.failures == {"kafka": 1}
        assert srv.stats.errors.get(ErrorCode.SASL_AUTHENTICATION_FAILED) == 1


async def test_other_request_during_authentication_gets_illegal_sasl_state(tmp_path: Path) -> None:
    async with running(tmp_path) as (srv, _auth):
        client = await RawClient.connect(srv.port)
        await handshake(client, "SCRAM-SHA-256")
        answer = await client.request(ApiKey.METADATA, 8, {**METADATA_V8, "topics": [{"name": "t"}]})
        assert [t.error_code for t in answer.topics] == [ErrorCode.ILLEGAL_SASL_STATE]
        assert await client.closed_by_server()


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
@pytest.mark.parametrize("password", ["alice-secret", "wrong"])
async def test_scram_login(tmp_path: Path, mechanism: str, password: str) -> None:
    async with running(tmp_path) as (srv, auth):
        client = await RawClient.connect(srv.port)
        assert (await handshake(client, mechanism)).error_code == 0
        scram = scramp.ScramClient([mechanism], "alice", password)
        first = await client.request(ApiKey.SASL_AUTHENTICATE, 2, {"auth_bytes": scram.get_client_first().encode()})
        assert first.error_code == 0
        scram.set_server_first(first.auth_bytes.decode())
        final = await client.request(ApiKey.SASL_AUTHENTICATE, 2, {"auth_bytes": scram.get_client_final().encode()})
        if password == "wrong":
            assert final.error_code == ErrorCode.SASL_AUTHENTICATION_FAILED
            assert await client.closed_by_server()
            assert auth.failures == {"kafka": 1}
            return
        assert final.error_code == 0
        scram.set_server_final(final.auth_bytes.decode())  # the server proved it knows the credential
        assert (await client.request(ApiKey.METADATA, 8, METADATA_V8)).brokers
        await client.close()


async def test_without_authenticator_sasl_requests_get_illegal_sasl_state(tmp_path: Path) -> None:
    async with running(tmp_path, auth=False) as (srv, _auth):
        client = await RawClient.connect(srv.port)
        answer = await client.request(ApiKey.SASL_HANDSHAKE, 1, {"mechanism": "PLAIN"})
        assert answer.error_code == ErrorCode.ILLEGAL_SASL_STATE
        answer = await client.request(ApiKey.SASL_AUTHENTICATE, 1, {"auth_bytes": b"\0alice\0alice-secret"})
        assert answer.error_code == ErrorCode.ILLEGAL_SASL_STATE
        assert (await client.request(ApiKey.METADATA, 8, METADATA_V8)).brokers  # still served: auth is off
        await client.close()


async def test_handshake_v0_is_followed_by_raw_tokens(tmp_path: Path) -> None:
    async with running(tmp_path) as (srv, auth):
        client = await RawClient.connect(srv.port)
        answer = await client.request(ApiKey.SASL_HANDSHAKE, 0, {"mechanism": "SCRAM-SHA-512"})
        assert answer.error_code == 0
        scram = scramp.ScramClient(["SCRAM-SHA-512"], "alice", "alice-secret")
        first = scram.get_client_first().encode()
        client.writer.write(len(first).to_bytes(4, "big") + first)
        scram.set_server_first((await client.next_frame()).decode())
        final = scram.get_client_final().encode()
        client.writer.write(len(final).to_bytes(4, "big") + final)
        scram.set_server_final((await client.next_frame()).decode())
        assert (await client.request(ApiKey.METADATA, 8, METADATA_V8)).brokers
        await client.close()
        client = await RawClient.connect(srv.port)
        await client.request(ApiKey.SASL_HANDSHAKE, 0, {"mechanism": "PLAIN"})
        token = b"\0alice\0nope"
        client.writer.write(len(token).to_bytes(4, "big") + token)
        assert await client.closed_by_server()
        assert auth.failures == {"kafka": 1} and auth.successes == {"kafka": 1}


@pytest.mark.parametrize("request_", ["handshake", "api_versions"])
async def test_handshake_or_versions_during_authentication_get_illegal_sasl_state_then_close(
        tmp_path: Path, request_: str) -> None:
    """Kafka's handleSaslToken: after SaslHandshake v1 only SaslAuthenticate; a second SaslHandshake or an
    ApiVersions is answered ILLEGAL_SASL_STATE in its own response and the connection closed (before, the
    handshake started the exchange over and ApiVersions was served, both answered NONE: fuzz kafka-sasl)."""
    async with running(tmp_path) as (srv, auth):
        client = await RawClient.connect(srv.port)
        assert (await handshake(client, "SCRAM-SHA-256")).error_code == 0
        if request_ == "handshake":
            answer = await client.request(ApiKey.SASL_HANDSHAKE, 1, {"mechanism": "PLAIN"})
        else:
            answer = await client.request(ApiKey.API_VERSIONS, 3, {"client_software_name": "t",
                                                                   "client_software_version": "1"})
        assert answer.error_code == ErrorCode.ILLEGAL_SASL_STATE
        assert await client.closed_by_server()
        assert auth.failures == {"kafka": 1}


async def test_a_frame_over_the_pre_login_limit_closes_without_an_answer(tmp_path: Path) -> None:
    """Kafka reads a frame before the login with sasl.server.max.receive.size (512 KiB): a larger one fails the
    login and closes the connection unanswered (before, frames up to max_request_bytes, 100 MiB, were read and
    answered: fuzz kafka-sasl). After the login the limit is max_request_bytes again."""
    token = b"\0alice\0" + b"p" * (512 * 1024)
    async with running(tmp_path) as (srv, _auth):
        client = await RawClient.connect(srv.port)
        assert (await handshake(client, "PLAIN")).error_code == 0
        client.send(ApiKey.SASL_AUTHENTICATE, 2, {"auth_bytes": token})
        with pytest.raises(ConnectionResetError):  # closed, with no answer before
            await client.next_frame()
        assert srv.stats.closed_bad_input == 1
        client = await RawClient.connect(srv.port)
        await handshake(client, "PLAIN")
        done = await client.request(ApiKey.SASL_AUTHENTICATE, 2, {"auth_bytes": b"\0alice\0alice-secret"})
        assert done.error_code == 0
        served = await client.request(ApiKey.SASL_AUTHENTICATE, 2, {"auth_bytes": token})  # a large request, served
        assert served.error_code == ErrorCode.ILLEGAL_SASL_STATE
        await client.close()
