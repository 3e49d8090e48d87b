"""Cron expressions and their fire times in any time zone, across DST changes.

A small, dependency-free implementation, so that the rule for times that a
DST change skips or repeats is ours to state and test:

* Fields: ``minute hour day-of-month month day-of-week``, plus an optional
  sixth field for seconds *at the end* (the croniter convention that
  pg-scheduler 0.2.x used), e.g. ``"* * * * * */10"`` is every ten seconds.
* Each field: ``*``, ``?`` (day fields), a number, ``a-b``, a list ``a,b``,
  and steps ``*/n``, ``a/n``, ``a-b/n``. Month and weekday names (``JAN``,
  ``MON-FRI``); weekday 0 and 7 are Sunday. Day of month ``L`` is the last day
  of the month; day of week ``5L`` is the last Friday, ``1#2`` the second Monday.
* Aliases: ``@yearly`` (``@annually``), ``@monthly``, ``@weekly``, ``@daily``
  (``@midnight``), ``@hourly``.
* When both day fields are restricted, a day matches if *either* does (the
  Vixie cron rule); when one is ``*`` only the other counts.

The DST rule is that of Vixie cron and cronie. A *fixed-time* job is one whose
minute and hour fields do not start with ``*``; the others are *wildcard* jobs.

* Spring forward: a fixed-time job whose local time falls in the skipped
  interval runs once, at the instant right after the jump (02:30 on the day
  New York jumps from 02:00 to 03:00 runs at 03:00 EDT). Several skipped
  times of one job collapse into that one run. A wildcard job simply has no
  run at local times that do not exist.
* Fall back: a fixed-time job whose local time happens twice runs once, on
  the first occurrence. A wildcard job runs on both occurrences, so an hourly
  job stays hourly in elapsed time.
"""

from __future__ import annotations

import calendar
from bisect import bisect_left
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, tzinfo

__all__ = ["CronError", "CronExpression", "CronSchedule"]

_ALIASES = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
_MONTHS = {
    name: index
    for index, name in enumerate(
        ["JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC"],
        start=1,
    )
}
_WEEKDAYS = {
    name: index for index, name in enumerate(["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"])
}
# How far ahead to look for the next match before calling an expression one
# that never fires: 28 years covers every weekday/leap-day combination.
_SEARCH_YEARS = 30
_SECOND = timedelta(seconds=1)


class CronError(ValueError):
    """A cron expression that cannot be parsed, or that never fires."""


@dataclass(frozen=True)
class _Field:
    name: str
    low: int
    high: int
    names: dict[str, int] | None = None


_MINUTE = _Field("minute", 0, 59)
_HOUR = _Field("hour", 0, 23)
_DOM = _Field("day of month", 1, 31)
_MONTH = _Field("month", 1, 12, _MONTHS)
_DOW = _Field("day of week", 0, 7, _WEEKDAYS)
_SECOND_FIELD = _Field("second", 0, 59)


class CronExpression:
    """A parsed cron expression, matched against naive (wall-clock) datetimes."""

    def __init__(self, expression: str) -> None:
        if not isinstance(expression, str):
            raise CronError(f"a cron expression must be a string, got {expression!r}")
        self.expression = expression
        text = expression.strip()
        if text.startswith("@"):
            alias = _ALIASES.get(text.lower())
            if alias is None:
                raise CronError(
                    f"invalid cron expression {expression!r}: unknown alias {text!r} "
                    f"(known: {', '.join(sorted(_ALIASES))})"
                )
            text = alias
        parts = text.split()
        if len(parts) not in (5, 6):
            raise CronError(
                f"invalid cron expression {expression!r}: expected 5 fields "
                "(minute hour day-of-month month day-of-week) or 6 (with seconds last), "
                f"got {len(parts)}"
            )
        minute, hour, dom, month, dow = parts[:5]
        self.minutes = self._parse(minute, _MINUTE)
        self.hours = self._parse(hour, _HOUR)
        self.days, self.last_day = self._parse_dom(dom)
        self.months = self._parse(month, _MONTH)
        self.weekdays, self.nth_weekdays, self.last_weekdays = self._parse_dow(dow)
        self.seconds = self._parse(parts[5], _SECOND_FIELD) if len(parts) == 6 else [0]
        self.has_seconds = len(parts) == 6
        self.dom_restricted = not dom.startswith(("*", "?"))
        self.dow_restricted = not dow.startswith(("*", "?"))
        #: Vixie cron's distinction for the DST rule (see the module docstring).
        self.wildcard = minute.startswith("*") or hour.startswith("*")
        if self.next_local(datetime(2000, 1, 1)) is None:
            raise CronError(f"cron expression {expression!r} never fires (no such date)")

    def __repr__(self) -> str:
        return f"CronExpression({self.expression!r})"

    # -- parsing -------------------------------------------------------------

    def _error(self, field: _Field, item: str, why: str) -> CronError:
        return CronError(
            f"invalid cron expression {self.expression!r}: {field.name} {item!r}: {why}"
        )

    def _value(self, field: _Field, item: str, token: str) -> int:
        if field.names and token.upper() in field.names:
            return field.names[token.upper()]
        if not token.isdigit():
            hint = f" or a name ({', '.join(field.names)})" if field.names else ""
            raise self._error(field, item, f"expected a number{hint}, got {token!r}")
        value = int(token)
        if not field.low <= value <= field.high:
            raise self._error(field, item, f"{value} is out of range {field.low}-{field.high}")
        return value

    def _parse(self, text: str, field: _Field) -> list[int]:
        values: set[int] = set()
        for item in text.split(","):
            if not item:
                raise self._error(field, text, "empty list item")
            base, slash, step_text = item.partition("/")
            step = 1
            if slash:
                if not step_text.isdigit() or int(step_text) == 0:
                    raise self._error(
                        field, item, f"step must be a positive number, got {step_text!r}"
                    )
                step = int(step_text)
            if base == "*" or (base == "?" and field in (_DOM, _DOW)):
                low, high = field.low, field.high
            elif "-" in base:
                first, _, last = base.partition("-")
                low, high = self._value(field, item, first), self._value(field, item, last)
                if low > high:
                    raise self._error(field, item, f"range start {low} is after its end {high}")
            else:
                low = self._value(field, item, base)
                # "a/n" means from a to the end of the range, every n (Vixie).
                high = field.high if slash else low
            values.update(range(low, high + 1, step))
        return sorted(values)

    def _parse_dom(self, text: str) -> tuple[list[int], bool]:
        items = text.split(",")
        last = any(item.upper() == "L" for item in items)
        rest = [item for item in items if item.upper() != "L"]
        return (self._parse(",".join(rest), _DOM) if rest else []), last

    def _parse_dow(self, text: str) -> tuple[list[int], set[tuple[int, int]], set[int]]:
        plain: list[str] = []
        nth: set[tuple[int, int]] = set()
        last: set[int] = set()
        for item in text.split(","):
            upper = item.upper()
            if "#" in upper:
                day, _, n = upper.partition("#")
                if not n.isdigit() or not 1 <= int(n) <= 5:
                    raise self._error(_DOW, item, "the week after # must be 1-5")
                nth.add((self._value(_DOW, item, day) % 7, int(n)))
            elif upper.endswith("L") and len(upper) > 1:
                last.add(self._value(_DOW, item, upper[:-1]) % 7)
            else:
                plain.append(item)
        days = sorted({d % 7 for d in self._parse(",".join(plain), _DOW)}) if plain else []
        return days, nth, last

    # -- matching ------------------------------------------------------------

    def _day_matches(self, year: int, month: int, day: int) -> bool:
        month_length = calendar.monthrange(year, month)[1]
        dom = day in self.days or (self.last_day and day == month_length)
        weekday = (calendar.weekday(year, month, day) + 1) % 7  # Sunday = 0
        dow = (
            weekday in self.weekdays
            or (weekday, (day - 1) // 7 + 1) in self.nth_weekdays
            or (weekday in self.last_weekdays and day + 7 > month_length)
        )
        if self.dom_restricted and self.dow_restricted:
            return dom or dow
        if self.dom_restricted:
            return dom
        if self.dow_restricted:
            return dow
        return True

    @staticmethod
    def _first_at_least(values: list[int], value: int) -> int | None:
        index = bisect_left(values, value)
        return values[index] if index < len(values) else None

    def next_local(self, start: datetime) -> datetime | None:
        """The first naive wall-clock time ``>= start`` that matches, or None if none
        within the next 30 years."""
        t = start.replace(tzinfo=None)
        if t.microsecond:
            t = t.replace(microsecond=0) + _SECOND
        limit = min(t.year + _SEARCH_YEARS, 9998)
        while t.year <= limit:
            if t.month not in self.months:
                month = self._first_at_least(self.months, t.month)
                if month is None:
                    t = datetime(t.year + 1, self.months[0], 1)
                else:
                    t = datetime(t.year, month, 1)
                continue
            if not self._day_matches(t.year, t.month, t.day):
                t = datetime(t.year, t.month, t.day) + timedelta(days=1)
                continue
            hour = self._first_at_least(self.hours, t.hour)
            if hour is None:
                t = datetime(t.year, t.month, t.day) + timedelta(days=1)
                continue
            if hour != t.hour:
                t = t.replace(hour=hour, minute=0, second=0)
            minute = self._first_at_least(self.minutes, t.minute)
            if minute is None:
                t = t.replace(minute=0, second=0) + timedelta(hours=1)
                continue
            if minute != t.minute:
                t = t.replace(minute=minute, second=0)
            second = self._first_at_least(self.seconds, t.second)
            if second is None:
                t = t.replace(second=0) + timedelta(minutes=1)
                continue
            return t.replace(second=second)
        return None


class CronSchedule:
    """A cron expression read in a time zone: the instants at which it fires."""

    def __init__(self, expression: str | CronExpression, tz: tzinfo | None = None) -> None:
        self.cron = (
            expression if isinstance(expression, CronExpression) else CronExpression(expression)
        )
        self.tz: tzinfo = tz or UTC

    def __repr__(self) -> str:
        return f"CronSchedule({self.cron.expression!r}, {self.tz})"

    def _utc(self, local: datetime, fold: int) -> datetime:
        return local.replace(tzinfo=self.tz, fold=fold).astimezone(UTC)

    def _transition(self, before: datetime, after: datetime) -> datetime:
        """The first instant in ``(before, after]`` whose UTC offset is that of ``after``."""
        target = after.astimezone(self.tz).utcoffset()
        low, high = int(before.timestamp()), int(after.timestamp())
        while high - low > 1:
            middle = (low + high) // 2
            if datetime.fromtimestamp(middle, self.tz).utcoffset() == target:
                high = middle
            else:
                low = middle
        return datetime.fromtimestamp(high, UTC)

    def _instants(self, local: datetime) -> tuple[list[datetime], datetime]:
        """The instants a matching wall-clock time fires at, and a lower bound on the
        instants of every later wall-clock time."""
        first, second = self._utc(local, 0), self._utc(local, 1)
        if first == second:
            return [first], first
        if first < second:  # the time happens twice (fall back)
            return ([first] if not self.cron.wildcard else [first, second]), first
        # The time does not exist (spring forward): fold=0 reads it with the offset
        # before the jump, fold=1 with the one after, so the jump lies between.
        jump = self._transition(second, first)
        return ([] if self.cron.wildcard else [jump]), jump

    def next_after(self, after: datetime) -> datetime | None:
        """The first fire time strictly after ``after`` (aware), in UTC; None if the
        expression does not fire within 30 years."""
        if after.tzinfo is None:
            raise ValueError("next_after needs an aware datetime")
        after = after.astimezone(UTC)
        wall = after.astimezone(self.tz).replace(tzinfo=None)
        start = wall
        early, late = self._utc(wall, 0), self._utc(wall, 1)
        if early < late:
            # ``after`` lies in a repeated interval: the second occurrences of the
            # wall times up to one fold earlier are still ahead of it.
            start = wall - (late - early)
        best: datetime | None = None
        local = self.cron.next_local(start)
        while local is not None:
            instants, bound = self._instants(local)
            for instant in instants:
                if instant > after and (best is None or instant < best):
                    best = instant
            if best is not None and bound >= best:
                return best
            local = self.cron.next_local(local + _SECOND)
        return best

    def describe(self) -> str:
        return f"cron {' '.join(self.cron.expression.split())} {self.tz}"
