"""The errors ``echorl serve-env`` answers: every bad request gets a 4xx naming the field, never a 500.

OpenEnv runs the same :class:`~echorl_envs.service.server.EchoRLEnvironment` behind its WebSocket session and its
plain HTTP routes. Each error here is both the exception the WebSocket client shows (a ValueError or RuntimeError
whose text names the field) and a Starlette ``HTTPException`` with the status the HTTP routes answer.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from typing import Any

import numpy as np
from pydantic import ValidationError
from starlette.exceptions import HTTPException

__all__ = ["ClientError", "InvalidActionMessage", "NoEpisodeError", "PLAY_OVER_WS", "ROUTE_HINTS",
           "explain_validation_error", "explain_bad_requests", "check_web_step"]


class ClientError(ValueError, HTTPException):
    """A request the client must change (a bad reset field, a malformed action): a ValueError whose text names
    the field (what the WebSocket client shows), answered with HTTP 422 on OpenEnv's HTTP routes, never 500."""

    status_code_default = 422

    def __init__(self, message: str) -> None:
        ValueError.__init__(self, message)
        HTTPException.__init__(self, status_code=self.status_code_default, detail=message)

    def __str__(self) -> str:
        return self.detail


class InvalidActionMessage(ClientError):
    """A step message that is not ``{"action": "<text>"}`` (HTTP 422)."""


#: Where episodes are played: OpenEnv's plain HTTP /reset and /step build a fresh env per request.
PLAY_OVER_WS = ("play episodes over the WebSocket session /ws: GenericEnvClient(base_url=URL).sync() (OpenEnv), "
                'or gym.make("EchoRL/Remote-v0", base_url=URL, task=ID)')


class NoEpisodeError(RuntimeError, HTTPException):
    """``step`` before ``reset`` in this session: a RuntimeError over the WebSocket, HTTP 409 (Conflict) on the
    stateless HTTP ``/step``, where every request gets a fresh env, so no episode carries over from ``/reset``."""

    def __init__(self, message: str) -> None:
        RuntimeError.__init__(self, message)
        HTTPException.__init__(self, status_code=409, detail=message)

    def __str__(self) -> str:
        return self.detail


def explain_validation_error(error: ValidationError, fields: Sequence[str]) -> str:
    """pydantic's errors as one sentence that names each bad field and its value (and a close match)."""
    parts = []
    for err in error.errors():
        name = ".".join(map(str, err["loc"])) or "message"
        if err["type"] == "missing":
            parts.append(f"{name} is required")
        elif err["type"] == "extra_forbidden":
            hint = difflib.get_close_matches(name, fields, n=1)
            parts.append(f"unknown field {name!r}" + (f" (did you mean {hint[0]!r}?)" if hint else ""))
        else:
            parts.append(f"{name} {err['msg'][0].lower()}{err['msg'][1:]}, got {name}={err['input']!r:.80}")
    return ("invalid action message: " + "; ".join(parts)
            + ' (send {"action": "<text>"}: an admissible command or an answer)')


#: What a request body of each plain HTTP route looks like, added to FastAPI's 422 replies.
ROUTE_HINTS = {
    "/reset": 'the body is {"seed": 0, "task": "<served id>", "options": {...}, "max_episode_steps": 50}, every '
              "field optional",
    "/step": 'the body is {"action": {"action": "<text>"}} (OpenEnv wraps the action); plain HTTP /step has no '
             f"episode (a fresh env per request): {PLAY_OVER_WS}",
}


def explain_bad_requests(app: Any) -> None:
    """FastAPI's 422 reply to a body that does not validate, plus a ``hint`` with the body the route expects
    (and non-finite numbers quoted: FastAPI's own reply to ``{"seed": NaN}`` fails to encode, a 500)."""
    from fastapi.encoders import jsonable_encoder
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse

    def finite(value: Any) -> Any:  # NaN and Infinity parse (Python's json) but cannot be sent back as JSON
        if isinstance(value, float) and not np.isfinite(value):
            return repr(value)
        if isinstance(value, dict):
            return {k: finite(v) for k, v in value.items()}
        if isinstance(value, list):
            return [finite(v) for v in value]
        return value

    async def explain(request: Any, exc: RequestValidationError) -> JSONResponse:
        content: dict[str, Any] = {"detail": finite(jsonable_encoder(exc.errors()))}
        if request.url.path in ROUTE_HINTS:
            content["hint"] = ROUTE_HINTS[request.url.path]
        return JSONResponse(status_code=422, content=content)

    app.add_exception_handler(RequestValidationError, explain)


def check_web_step(app: Any) -> None:
    """OpenEnv's ``/web/step`` (the browser page's route) reads ``body["action"]`` as a dict without checking it, so
    ``{"action": "go forward"}`` failed with an AttributeError (a 500). The route is replaced, in place, by one
    that answers 422 with the expected body first and otherwise calls OpenEnv's own handler."""
    from fastapi.routing import APIRoute

    for i, route in enumerate(app.router.routes):
        if isinstance(route, APIRoute) and route.path == "/web/step":
            app.router.routes[i] = APIRoute(route.path, _checked_web_step(route.endpoint), methods=list(route.methods),
                                            name=route.name)


def _checked_web_step(original: Any) -> Any:
    """``/web/step`` that answers 422 to a non-object action before calling OpenEnv's handler ``original``."""

    async def web_step(request: dict[str, Any]) -> Any:
        action = request.get("action", {})
        if "message" not in request and not isinstance(action, dict):
            raise ClientError(f"action must be an object, got action={action!r:.80}: "
                              + ROUTE_HINTS["/step"].split(";")[0])
        return await original(request)

    return web_step
