"""JSON encoding of job arguments and results, with errors that name the value."""

from __future__ import annotations

import json
from typing import Any

# One encoder for every call: json.dumps with options builds a new one each time.
_ENCODER = json.JSONEncoder(allow_nan=False, separators=(",", ":"))
_dumps = _ENCODER.encode
# JSONEncoder.encode also rebuilds its C encoder on every call, a third of the
# cost of encoding a small argument list; bulk enqueues keep one. Its
# circular-reference markers are cleared after a failure, which can leave
# entries behind.
_markers: dict[int, Any] = {}
_c_make_encoder = getattr(json.encoder, "c_make_encoder", None)
_c_encode = (
    _c_make_encoder(
        _markers,
        _ENCODER.default,
        json.encoder.encode_basestring_ascii,
        None,
        ":",
        ",",
        False,
        False,
        False,
    )
    if _c_make_encoder is not None
    else None
)


def _dumps_fast(value: Any) -> str:
    if _c_encode is None:
        return _dumps(value)
    try:
        return "".join(_c_encode(value, 0))
    except BaseException:
        _markers.clear()
        raise


def _first_unserializable(value: Any, path: str) -> tuple[str, Any] | None:
    try:
        _dumps(value)
        return None
    except (TypeError, ValueError):
        pass
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                return f"{path} key {key!r}", key
            found = _first_unserializable(item, f"{path}[{key!r}]")
            if found:
                return found
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            found = _first_unserializable(item, f"{path}[{index}]")
            if found:
                return found
    return path, value


def encode_task_data(args: tuple | list, kwargs: dict[str, Any], task: str) -> str:
    """``{"args": [...], "kwargs": {...}}`` as JSON, or TypeError naming the bad value."""
    if not isinstance(args, tuple | list):
        raise TypeError(f"args must be a tuple or list, got {type(args).__name__}")
    if not isinstance(kwargs, dict):
        raise TypeError(f"kwargs must be a dict, got {type(kwargs).__name__}")
    try:
        return _dumps_fast({"args": args, "kwargs": kwargs})
    except (TypeError, ValueError):
        found = _first_unserializable(list(args), "args") or _first_unserializable(kwargs, "kwargs")
        where, value = found or ("arguments", None)
        raise TypeError(
            f"{where} of {task} is not JSON-serializable: {value!r} "
            f"({type(value).__name__}); pass JSON types (str, int, float, bool, None, "
            "list, dict) and load richer objects inside the job"
        ) from None


_loads = json.JSONDecoder().decode


def decode_task_data(raw: str | None) -> tuple[list[Any], dict[str, Any]]:
    """(args, kwargs) of a stored job; freshly decoded, so the job may change them."""
    data = _loads(raw) if raw else {}
    return data.get("args") or [], data.get("kwargs") or {}


def encode_result(value: Any) -> tuple[str | None, str | None]:
    """(JSON, None) for a serializable return value, else (None, a note saying why)."""
    if value is None:
        return None, None
    try:
        return _dumps(value), None
    except (TypeError, ValueError):
        return None, f"return value not stored: {type(value).__name__} is not JSON-serializable"


def encode_retry_policy(policy: Any) -> str:
    """A RetryPolicy as the JSON stored in ``scheduled_jobs.retry_policy``."""
    return _dumps(
        {
            "base_delay": policy.base_delay,
            "factor": policy.factor,
            "max_delay": policy.max_delay,
            "jitter": policy.jitter,
        }
    )


def encode_json(value: Any) -> str:
    return _dumps(value)


def decode_json(raw: str | None) -> Any:
    return None if raw is None else json.loads(raw)
