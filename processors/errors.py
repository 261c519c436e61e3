"""Errors raised by the processors package.

One root, so a runner can catch everything a pipeline raises. A record that cannot be decoded or
processed is not an exception that stops anything: it goes to the dead-letter topic with the reason.

::

    ProcessorError
    ├── PipelineDefinitionError   the user built an invalid pipeline (our API was misused)
    ├── StateError                keyed state used outside a key, or not serializable
    ├── CheckpointError           a checkpoint cannot be written, read or decoded
    └── SourceError               the log or Kafka cluster under a source or sink failed
        │                         (raised ``from`` the broker / aiokafka error)
        └── PartitionsLostError   exactly-once: the group refused this member's offsets (it lost its
                                  partitions to others); its transaction was aborted
"""

from __future__ import annotations

__all__ = [
    "CheckpointError",
    "PartitionsLostError",
    "PipelineDefinitionError",
    "ProcessorError",
    "SourceError",
    "StateError",
]


class ProcessorError(Exception):
    """Root of every error the processors package raises."""


class PipelineDefinitionError(ProcessorError):
    """The pipeline is wired wrongly (unknown operator order, bad window sizes, missing sink…)."""


class StateError(ProcessorError):
    """Keyed state misuse: access outside a key, or a value that cannot be checkpointed."""


class CheckpointError(ProcessorError):
    """A checkpoint could not be written or restored."""


class SourceError(ProcessorError):
    """The storage or cluster under a source or sink failed."""


class PartitionsLostError(SourceError):
    """The consumer group gave this member's partitions to others while it was out of the group (a
    stall past its session timeout): its open transaction was refused and aborted. Everything
    processed since the last committed checkpoint must be dropped; the next assignment restores."""
