"""JSON encoding of job arguments and results, with errors that name the value."""

from __future__ import annotations

import json
from typing import Any

from .validation import text_problem

# Lists and dicts inside one argument may nest this deep: far below what the
# worker's json decoder (Python's recursion limit) and PostgreSQL's jsonb parser take.
MAX_NESTING = 256
# The JSON of one job's args and kwargs (jsonb itself stops at 255 MiB).
MAX_TASK_DATA_BYTES = 64 * 1024 * 1024

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


def _find_unstorable(args: Any, kwargs: Any) -> tuple[type[Exception], str, str] | None:
    """(exception type, where, what) for the first value PostgreSQL cannot store
    (NUL, lone surrogate), a non-string dict key or nesting beyond MAX_NESTING.

    Iterative, so a 10,000-deep value cannot raise RecursionError here; paths
    are built only for the value reported."""
    # (value, depth, parent node, step); a node is (parent node, step).
    stack: list[tuple[Any, int, Any, str]] = [(kwargs, 0, None, "kwargs"), (args, 0, None, "args")]

    def where(parent: Any, step: str) -> str:
        steps = [step]
        while parent is not None:
            parent, parent_step = parent
            steps.append(parent_step)
        path = "".join(reversed(steps))
        return path if len(path) <= 80 else f"{path[:60]}...{path[-16:]}"

    while stack:
        value, depth, parent, step = stack.pop()
        if isinstance(value, str):
            problem = text_problem(value)
            if problem is not None:
                return ValueError, where(parent, step), problem
            continue
        is_dict = isinstance(value, dict)
        if not is_dict and not isinstance(value, list | tuple):
            continue
        if depth > MAX_NESTING:
            return (
                ValueError,
                where(parent, step),
                f"nests lists and dicts more than {MAX_NESTING} deep (or contains itself)",
            )
        node = (parent, step)
        if is_dict:
            for key in reversed(list(value)):
                if not isinstance(key, str):
                    return (
                        TypeError,
                        f"{where(parent, step)} key {key!r}",
                        "is not a string: dict keys must be strings",
                    )
                problem = text_problem(key)
                if problem is not None:
                    return ValueError, f"{where(parent, step)} key {key[:40]!r}", problem
                stack.append((value[key], depth + 1, node, f"[{key!r}]"))
        else:
            for index in range(len(value) - 1, -1, -1):
                stack.append((value[index], depth + 1, node, f"[{index}]"))
    return None


_CONTAINERS = (dict, list, tuple)


def _plain(value: Any, depth: int) -> bool:
    """True if every dict key below ``value`` is a str and nothing nests past
    MAX_NESTING: the quick test, with no paths, that decides whether to walk."""
    if depth > MAX_NESTING:
        return False
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                return False
            if isinstance(item, _CONTAINERS) and not _plain(item, depth + 1):
                return False
        return True
    for item in value:
        if isinstance(item, _CONTAINERS) and not _plain(item, depth + 1):
            return False
    return True


def encode_task_data(args: tuple | list, kwargs: dict[str, Any], task: str) -> str:
    """``{"args": [...], "kwargs": {...}}`` as JSON that PostgreSQL's jsonb accepts,
    else TypeError/ValueError naming the bad value."""
    if not isinstance(args, tuple | list):
        raise TypeError(f"args must be a tuple or list, got {type(args).__name__}")
    if not isinstance(kwargs, dict):
        raise TypeError(f"kwargs must be a dict, got {type(kwargs).__name__}")
    try:
        # The text of {"args": args, "kwargs": kwargs}, joined by hand: encoding
        # that dict cost twice as much as encoding args alone.
        text = (
            '{"args":'
            + _dumps_fast(args)
            + (',"kwargs":' + _dumps_fast(kwargs) + "}" if kwargs else ',"kwargs":{}}')
        )
    except (TypeError, ValueError, RecursionError):
        found = _find_unstorable(args, kwargs)
        if found is not None:
            raise found[0](f"{found[1]} of {task} {found[2]}") from None
        first = _first_unserializable(list(args), "args") or _first_unserializable(kwargs, "kwargs")
        where, value = first or ("arguments", None)
        raise TypeError(
            f"{where} of {task} is not JSON-serializable: {value!r} "
            f"({type(value).__name__}); pass JSON types (str, int, float, bool, None, "
            "list, dict) and load richer objects inside the job"
        ) from None
    # Cheap scans of the ASCII-escaped JSON decide whether to look closer: a NUL
    # or surrogate escape, a dict below kwargs (the encoder turns int keys into
    # strings), or enough brackets to nest too deep. Only the walk decides; a
    # string that merely looks like these costs a walk, never an error.
    suspect = "\\u" in text and ("\\u0000" in text or "\\ud" in text)
    if suspect:
        pass
    elif text.count("{", 9) > 1 or (len(text) > 2 * MAX_NESTING and text.count("[") > MAX_NESTING):
        try:
            suspect = not (_plain(args, 0) and _plain(kwargs, 0))
        except RecursionError:
            suspect = True
    elif kwargs:
        try:
            "".join(kwargs)  # checks, in C, that every key is a str
        except TypeError:
            suspect = True
    if suspect:
        found = _find_unstorable(args, kwargs)
        if found is not None:
            raise found[0](f"{found[1]} of {task} {found[2]}")
    if len(text) > MAX_TASK_DATA_BYTES:
        raise ValueError(
            f"args and kwargs of {task} are {len(text)} bytes as JSON; "
            f"the limit is {MAX_TASK_DATA_BYTES} (pass a reference to large data instead)"
        )
    return text


_loads = json.JSONDecoder().decode


def decode_task_data(raw: str | None) -> tuple[list[Any], dict[str, Any]]:
    """(args, kwargs) of a stored job; freshly decoded, so the job may change them."""
    data = _loads(raw) if raw else {}
    return data.get("args") or [], data.get("kwargs") or {}


# Size limits of what a job's outcome may store (characters). A result over
# RESULT_MAX_CHARS fails the job; error text and tracebacks are cut to their
# limit with TRUNCATED_MARKER, so a failure can always be written.
RESULT_MAX_CHARS = 1_000_000
ERROR_MAX_CHARS = 10_000
TRACEBACK_MAX_CHARS = 100_000
TRUNCATED_MARKER = " ...[truncated by pg_scheduler: {} more characters]"


class UnstorableResult(ValueError):
    """A job's return value that the database cannot hold: the job fails with this message."""


def encode_result(value: Any) -> tuple[str | None, str | None]:
    """(JSON, None) for a serializable return value, else (None, a note saying why).

    Raises :class:`UnstorableResult` for a result over ``RESULT_MAX_CHARS``.
    Text PostgreSQL refuses (NUL, lone surrogates) is found only if the write
    fails, so the happy path pays nothing for it.
    """
    if value is None:
        return None, None
    try:
        text = _dumps(value)
    except (TypeError, ValueError):
        return None, f"return value not stored: {type(value).__name__} is not JSON-serializable"
    if len(text) > RESULT_MAX_CHARS:
        raise UnstorableResult(
            f"result not stored: {len(text):,} characters of JSON, over the "
            f"{RESULT_MAX_CHARS:,}-character limit (return a reference, such as a key, instead)"
        )
    return text, None


def unstorable_result_reason(text: str) -> str:
    """Why PostgreSQL refused a result's JSON (called only after it did)."""
    try:
        decoded = _loads(text)
    except ValueError:
        return "result not stored: not valid JSON"
    found: list[str] = []

    def scan(item: Any) -> None:
        if found:
            return
        if isinstance(item, str):
            if "\x00" in item:
                found.append("a NUL character (\\u0000)")
            elif not _utf8_safe(item):
                found.append("a lone surrogate (invalid Unicode)")
        elif isinstance(item, dict):
            for key, sub in item.items():
                scan(key)
                scan(sub)
        elif isinstance(item, list):
            for sub in item:
                scan(sub)

    scan(decoded)
    what = found[0] if found else "text PostgreSQL refuses"
    return f"result not stored: it contains {what}, which PostgreSQL jsonb cannot hold"


def _utf8_safe(text: str) -> bool:
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def clip_text(text: str, limit: int) -> str:
    """``text`` cut to at most ``limit`` characters, the truncation marker
    included (so cutting twice changes nothing)."""
    if len(text) <= limit:
        return text
    keep = max(0, limit - 80)  # the marker is shorter than 80 characters
    return text[:keep] + TRUNCATED_MARKER.format(len(text) - keep)


def storable_text(text: str) -> str:
    """``text`` as PostgreSQL can store it: NUL becomes the four characters
    ``\\x00``, a lone surrogate its ``\\udXXX`` escape. Used only after a
    write was refused."""
    text = text.replace("\x00", "\\x00")
    if _utf8_safe(text):
        return text
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


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
