"""``/topics``: list, create, describe, delete, and topic configuration."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Query, Request, Response

from broker.log.api import LogStore, TopicInfo
from broker.security import Operation, ResourceType
from sluice.http.auth import Caller, allow, authorize, may
from sluice.http.context import Ctx
from sluice.http.models import PartitionInfo, TopicConfigUpdate, TopicCreate, TopicDetail, TopicSummary
from sluice.http.problems import PROBLEM_RESPONSES, ProblemError

__all__ = ["router", "topic_detail"]

router = APIRouter(prefix="/topics", tags=["topics"], responses={500: PROBLEM_RESPONSES[500]})


def topic_detail(store: LogStore, info: TopicInfo) -> TopicDetail:
    parts = [
        PartitionInfo(
            partition=log.partition,
            log_start_offset=log.log_start_offset,
            high_watermark=log.high_watermark,
            size_bytes=log.size_bytes,
        )
        for log in store.partitions(info.name)
    ]
    return TopicDetail(
        name=info.name,
        internal=info.internal,
        created_ms=info.created_ms,
        partitions=parts,
        config=info.config.to_kafka_configs(),
    )


@router.get("", response_model=list[TopicSummary], summary="List topics")
async def list_topics(
    ctx: Ctx, request: Request, who: Caller,
    internal: bool = Query(False, description="Include internal topics such as __consumer_offsets."),
) -> list[TopicSummary]:
    """Only the topics the caller may describe (as Kafka's Metadata)."""
    return [
        TopicSummary(name=t.name, partitions=t.partitions, internal=t.internal)
        for t in sorted(ctx.store.list_topics(include_internal=internal), key=lambda t: t.name)
        if may(ctx, request, who, Operation.DESCRIBE, ResourceType.TOPIC, t.name)
    ]


@router.post(
    "",
    status_code=201,
    response_model=TopicDetail,
    summary="Create a topic",
    responses={k: PROBLEM_RESPONSES[k] for k in (400, 409, 422)},
)
async def create_topic(body: TopicCreate, ctx: Ctx, response: Response, request: Request, who: Caller) -> TopicDetail:
    # Kafka's CreateTopics: create on the cluster, or else on the topic
    if not may(ctx, request, who, Operation.CREATE, ResourceType.CLUSTER):
        authorize(ctx, request, who, Operation.CREATE, ResourceType.TOPIC, body.name)
    try:
        config = ctx.store.default_config.with_kafka_configs(dict(body.config))
    except ValueError as exc:
        raise ProblemError(400, "invalid-config", "Invalid topic config", str(exc)) from None
    info = ctx.store.create_topic(body.name, body.partitions, config)
    response.headers["Location"] = f"/topics/{info.name}"
    return topic_detail(ctx.store, info)


@router.get("/{topic}", response_model=TopicDetail, summary="Describe a topic", responses={404: PROBLEM_RESPONSES[404]},
            dependencies=[Depends(allow(Operation.DESCRIBE, ResourceType.TOPIC, "topic"))])
async def describe_topic(topic: str, ctx: Ctx) -> TopicDetail:
    return topic_detail(ctx.store, ctx.store.topic(topic))


@router.delete(
    "/{topic}", status_code=204, summary="Delete a topic and its data", responses={404: PROBLEM_RESPONSES[404]},
    dependencies=[Depends(allow(Operation.DELETE, ResourceType.TOPIC, "topic"))],
)
async def delete_topic(topic: str, ctx: Ctx) -> Response:
    await ctx.store.delete_topic(topic)
    return Response(status_code=204)


@router.get(
    "/{topic}/config",
    response_model=dict[str, str],
    summary="A topic's configuration (Kafka names)",
    responses={404: PROBLEM_RESPONSES[404]},
    dependencies=[Depends(allow(Operation.DESCRIBE_CONFIGS, ResourceType.TOPIC, "topic"))],
)
async def get_config(topic: str, ctx: Ctx) -> dict[str, str]:
    return ctx.store.topic(topic).config.to_kafka_configs()


@router.patch(
    "/{topic}/config",
    response_model=dict[str, str],
    summary="Change a topic's configuration",
    responses={k: PROBLEM_RESPONSES[k] for k in (400, 404, 422)},
    dependencies=[Depends(allow(Operation.ALTER_CONFIGS, ResourceType.TOPIC, "topic"))],
)
async def patch_config(topic: str, body: TopicConfigUpdate, ctx: Ctx) -> dict[str, str]:
    info = ctx.store.topic(topic)
    try:
        new = info.config.with_kafka_configs(dict(body.config))
    except ValueError as exc:
        raise ProblemError(400, "invalid-config", "Invalid topic config", str(exc)) from None
    await ctx.store.alter_topic_config(topic, new)
    return ctx.store.topic(topic).config.to_kafka_configs()
