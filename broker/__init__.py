"""The broker: partitioned logs (``broker.log``), sans-IO codecs (``broker.protocol``),
consumer groups (``broker.groups``) and the asyncio listeners (``broker.server``)."""

from broker.errors import BrokerError

__all__ = ["BrokerError"]
