"""The boundary to aiokafka: bootstrap parsing and error translation (``raise … from exc``)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from aiokafka.errors import (
    GroupIdNotFound,
    KafkaConnectionError,
    KafkaError,
    KafkaTimeoutError,
    NodeNotReadyError,
    RequestTimedOutError,
    TopicAlreadyExistsError,
    UnknownTopicOrPartitionError,
)

from clients.errors import (
    BrokerUnreachableError,
    ClientError,
    RequestFailedError,
    TopicExistsError,
    UnknownGroupError,
    UnknownTopicError,
)

__all__ = ["DEFAULT_BOOTSTRAP", "partitions_for", "translate_errors", "unreachable"]

DEFAULT_BOOTSTRAP = "127.0.0.1:9092"


def unreachable(bootstrap: str, exc: BaseException | None = None) -> BrokerUnreachableError:
    return BrokerUnreachableError(
        f"cannot reach Sluice at {bootstrap}: is `sluice serve` running? pass --bootstrap"
        + (f" ({exc})" if exc and str(exc) else "")
    )


@contextlib.contextmanager
def translate_errors(bootstrap: str, what: str = "") -> Iterator[None]:
    try:
        yield
    except ClientError:
        raise
    except (KafkaConnectionError, NodeNotReadyError, ConnectionError) as exc:
        raise unreachable(bootstrap, exc) from exc
    except (KafkaTimeoutError, RequestTimedOutError, TimeoutError) as exc:
        raise unreachable(bootstrap, exc) from exc
    except UnknownTopicOrPartitionError as exc:
        raise UnknownTopicError(f"unknown topic{' ' + what if what else ''}: {exc}") from exc
    except TopicAlreadyExistsError as exc:
        raise TopicExistsError(f"topic {what} already exists") from exc
    except GroupIdNotFound as exc:
        raise UnknownGroupError(f"unknown group {what}") from exc
    except KafkaError as exc:
        raise RequestFailedError(f"{what}: {type(exc).__name__}: {exc}" if what else str(exc)) from exc


async def partitions_for(consumer: Any, topic: str) -> list[int]:
    """Partitions of ``topic`` from fresh metadata. aiokafka's ``topics()`` fetches metadata but leaves the
    consumer's cached cluster view (which ``partitions_for_topic`` reads) as it was, so read the fresh one."""
    cluster = await consumer._client.fetch_all_metadata()
    return sorted(cluster.partitions_for_topic(topic) or ())
