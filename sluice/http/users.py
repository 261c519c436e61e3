"""``/users``: the user store (salted SCRAM credentials) of a running broker, for ``sluice users`` without
``--data-dir``. The same store as Kafka's AlterUserScramCredentials and the offline commands.

- ``GET /users`` lists names and their mechanisms and iteration counts (never salts or keys): describe
  on the cluster.
- ``PUT /users/{name}`` with ``{"password": ...}`` creates the user or sets a new password (SCRAM-SHA-256
  and -512 credentials, 4096 iterations): 201 when created, 200 when changed; alter on the cluster.
- ``DELETE /users/{name}``: 204, 404 when there is no such user; alter on the cluster. Open connections of
  the user stay open; new logins are refused.

A name or password the store refuses (empty, control characters, longer than 256) is 400.
"""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Depends, Response
from pydantic import BaseModel, Field

from broker.security import (
    InvalidUserError,
    Operation,
    ResourceType,
    UnknownUserError,
    UserStore,
    UserStoreError,
)
from sluice.http.auth import allow
from sluice.http.context import Ctx
from sluice.http.problems import PROBLEM_RESPONSES, ProblemError

__all__ = ["router"]

router = APIRouter(prefix="/users", tags=["security"], responses={500: PROBLEM_RESPONSES[500]})


class Credential(BaseModel):
    mechanism: str
    iterations: int


class UserInfo(BaseModel):
    name: str
    credentials: list[Credential]


class UserList(BaseModel):
    users: list[UserInfo]


class NewPassword(BaseModel):
    password: str = Field(min_length=1, description="The new password (only salted SCRAM keys are kept).")


class UserChanged(BaseModel):
    user: str
    created: bool


def _store(ctx: Ctx) -> UserStore:
    if ctx.authenticator is not None:
        return ctx.authenticator.users  # the instance logins read: no second cache of the file
    return UserStore(ctx.runtime.settings.data_dir)


def _failed(exc: UserStoreError) -> ProblemError:
    return ProblemError(500, "user-store", "User store unavailable", str(exc))


@router.get("", response_model=UserList, summary="List users and their SCRAM mechanisms",
            dependencies=[Depends(allow(Operation.DESCRIBE, ResourceType.CLUSTER))])
async def list_users(ctx: Ctx) -> UserList:
    store = _store(ctx)
    try:
        return UserList(users=[
            UserInfo(name=name, credentials=[Credential(mechanism=m, iterations=c.iterations)
                                             for m, c in sorted(store.credentials(name).items())])
            for name in store.names()])
    except UserStoreError as exc:
        raise _failed(exc) from None


@router.put("/{name}", response_model=UserChanged, summary="Create a user or set its password",
            responses={201: {"model": UserChanged}, 400: PROBLEM_RESPONSES[400]},
            dependencies=[Depends(allow(Operation.ALTER, ResourceType.CLUSTER))])
async def put_user(name: str, body: NewPassword, ctx: Ctx, response: Response) -> UserChanged:
    store = _store(ctx)
    try:
        created = await asyncio.to_thread(store.add, name, body.password)  # PBKDF2: off the event loop
    except InvalidUserError as exc:
        raise ProblemError(400, "invalid-user", "Invalid user", str(exc)) from None
    except UserStoreError as exc:
        raise _failed(exc) from None
    response.status_code = 201 if created else 200
    return UserChanged(user=name, created=created)


@router.delete("/{name}", status_code=204, summary="Delete a user", responses={404: PROBLEM_RESPONSES[404]},
               dependencies=[Depends(allow(Operation.ALTER, ResourceType.CLUSTER))])
async def delete_user(name: str, ctx: Ctx) -> Response:
    try:
        _store(ctx).delete(name)
    except UnknownUserError:
        raise ProblemError(404, "unknown-user", "Unknown user", f"no user {name!r}") from None
    except UserStoreError as exc:
        raise _failed(exc) from None
    return Response(status_code=204)
