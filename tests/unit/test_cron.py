"""Cron parsing, fire times across DST (fixed dates), interval windows, window planning."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from pg_scheduler.periodic.cron import CronError, CronExpression, CronSchedule
from pg_scheduler.periodic.windows import (
    CoalescePolicy,
    IntervalSchedule,
    latest_fire_at_or_before,
    plan_windows,
)

NY = ZoneInfo("America/New_York")
LONDON = ZoneInfo("Europe/London")


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


def fires(expr: str, tz, start: datetime, count: int) -> list[datetime]:
    schedule = CronSchedule(expr, tz)
    out = []
    t = start
    for _ in range(count):
        t = schedule.next_after(t)
        out.append(t)
    return out


def brute_force(expr: str, tz, start: datetime, end: datetime) -> list[datetime]:
    """Every whole minute in [start, end) whose local wall time matches."""
    cron = CronExpression(expr)
    out = []
    t = start
    while t < end:
        wall = t.astimezone(tz).replace(tzinfo=None)
        if cron.next_local(wall) == wall:
            out.append(t)
        t += timedelta(minutes=1)
    return out


# -- DST: America/New_York (2024-03-10 02:00 EST -> 03:00 EDT; 2024-11-03 02:00 EDT
#    -> 01:00 EST) ---------------------------------------------------------------


def test_new_york_spring_forward_fixed_time_in_the_gap_runs_once_right_after_the_jump():
    # 02:30 does not exist on 10 March: the run happens at 03:00 EDT = 07:00 UTC.
    assert fires("30 2 * * *", NY, utc(2024, 3, 9, 12), 3) == [
        utc(2024, 3, 10, 7, 0),
        utc(2024, 3, 11, 6, 30),  # 02:30 EDT
        utc(2024, 3, 12, 6, 30),
    ]
    # Several skipped times of one job collapse into that single run.
    assert fires("0,15,30,45 2 * * *", NY, utc(2024, 3, 9, 12), 2) == [
        utc(2024, 3, 10, 7, 0),
        utc(2024, 3, 11, 6, 0),
    ]
    # A time that exists is untouched.
    assert fires("0 3 * * *", NY, utc(2024, 3, 9, 12), 1) == [utc(2024, 3, 10, 7, 0)]
    assert fires("59 1 * * *", NY, utc(2024, 3, 9, 12), 1) == [utc(2024, 3, 10, 6, 59)]


def test_new_york_spring_forward_wildcard_jobs_skip_times_that_do_not_exist():
    # Hourly at :30 stays one hour apart in elapsed time: 01:30 EST, then 03:30 EDT.
    assert fires("30 * * * *", NY, utc(2024, 3, 10, 6, 0), 3) == [
        utc(2024, 3, 10, 6, 30),
        utc(2024, 3, 10, 7, 30),
        utc(2024, 3, 10, 8, 30),
    ]
    # Every 15 minutes during hour 2 only: no run at all on the day hour 2 is skipped.
    assert fires("*/15 2 * * *", NY, utc(2024, 3, 10, 0), 1) == [utc(2024, 3, 11, 6, 0)]


def test_new_york_fall_back_fixed_time_runs_once_on_the_first_occurrence():
    # 01:30 happens at 05:30 UTC (EDT) and again at 06:30 UTC (EST): only the first.
    assert fires("30 1 * * *", NY, utc(2024, 11, 2, 12), 3) == [
        utc(2024, 11, 3, 5, 30),
        utc(2024, 11, 4, 6, 30),
        utc(2024, 11, 5, 6, 30),
    ]
    # Asked from inside the repeated hour, the second occurrence is not offered.
    assert fires("30 1 * * *", NY, utc(2024, 11, 3, 6, 10), 1) == [utc(2024, 11, 4, 6, 30)]


def test_new_york_fall_back_wildcard_jobs_run_on_both_occurrences():
    assert fires("30 * * * *", NY, utc(2024, 11, 3, 4, 0), 4) == [
        utc(2024, 11, 3, 4, 30),  # 00:30 EDT
        utc(2024, 11, 3, 5, 30),  # 01:30 EDT
        utc(2024, 11, 3, 6, 30),  # 01:30 EST
        utc(2024, 11, 3, 7, 30),  # 02:30 EST
    ]
    # From inside the first 01:xx, the second 01:30 is next, not 02:30.
    assert fires("30 * * * *", NY, utc(2024, 11, 3, 5, 45), 1) == [utc(2024, 11, 3, 6, 30)]
    # From inside the second 01:xx.
    assert fires("30 * * * *", NY, utc(2024, 11, 3, 6, 10), 1) == [utc(2024, 11, 3, 6, 30)]


# -- DST: Europe/London (2024-03-31 01:00 GMT -> 02:00 BST; 2024-10-27 02:00 BST
#    -> 01:00 GMT) ------------------------------------------------------------------


def test_london_spring_forward_and_fall_back_fixed_times():
    # 01:30 does not exist on 31 March: the run is at 02:00 BST = 01:00 UTC.
    assert fires("30 1 * * *", LONDON, utc(2024, 3, 30, 12), 2) == [
        utc(2024, 3, 31, 1, 0),
        utc(2024, 4, 1, 0, 30),  # 01:30 BST
    ]
    # 01:30 happens twice on 27 October: only at 00:30 UTC (BST).
    assert fires("30 1 * * *", LONDON, utc(2024, 10, 26, 12), 2) == [
        utc(2024, 10, 27, 0, 30),
        utc(2024, 10, 28, 1, 30),  # 01:30 GMT
    ]
    # A weekday job at 09:00 keeps 09:00 local across the change.
    monday = fires("0 9 * * MON-FRI", LONDON, utc(2024, 10, 25, 12), 2)
    assert monday == [utc(2024, 10, 28, 9, 0), utc(2024, 10, 29, 9, 0)]
    friday_before = fires("0 9 * * MON-FRI", LONDON, utc(2024, 10, 24, 12), 1)
    assert friday_before == [utc(2024, 10, 25, 8, 0)]  # 09:00 BST


def test_london_wildcard_every_half_hour_across_fall_back():
    assert fires("*/30 * * * *", LONDON, utc(2024, 10, 26, 23, 45), 5) == [
        utc(2024, 10, 27, 0, 0),  # 01:00 BST
        utc(2024, 10, 27, 0, 30),  # 01:30 BST
        utc(2024, 10, 27, 1, 0),  # 01:00 GMT
        utc(2024, 10, 27, 1, 30),  # 01:30 GMT
        utc(2024, 10, 27, 2, 0),  # 02:00 GMT
    ]


@pytest.mark.parametrize("tz", [NY, LONDON], ids=str)
def test_wildcard_jobs_fire_exactly_when_the_wall_clock_matches(tz):
    # Around both changes of 2024, compare with a minute-by-minute brute force.
    for start in (
        utc(2024, 3, 9, 20),
        utc(2024, 3, 30, 20),
        utc(2024, 10, 26, 20),
        utc(2024, 11, 2, 20),
    ):
        end = start + timedelta(hours=16)
        for expr in ("*/20 * * * *", "30 * * * *", "15,45 * * * *", "*/7 1-2 * * *"):
            expected = brute_force(expr, tz, start, end)
            got = []
            t = start - timedelta(microseconds=1)
            while (t := CronSchedule(expr, tz).next_after(t)) < end:
                got.append(t)
            assert got == expected, (expr, start)


@pytest.mark.parametrize("tz", [NY, LONDON], ids=str)
def test_fixed_daily_jobs_fire_once_per_local_day_for_a_whole_year(tz):
    for expr in ("30 1 * * *", "30 2 * * *", "0 0 * * *"):
        times = fires(expr, tz, utc(2024, 1, 1, 12), 366)
        days = [t.astimezone(tz).date() for t in times]
        assert len(set(days)) == 366, expr
        assert days == sorted(days)


def test_every_twenty_minutes_is_twenty_minutes_of_elapsed_time_all_year():
    times = fires("*/20 * * * *", NY, utc(2024, 1, 1), 3 * 24 * 366)
    gaps = {b - a for a, b in itertools.pairwise(times)}
    assert gaps == {timedelta(minutes=20)}


def test_utc_and_seconds_field():
    assert fires("* * * * * */15", None, utc(2024, 1, 1, 0, 0, 7), 3) == [
        utc(2024, 1, 1, 0, 0, 15),
        utc(2024, 1, 1, 0, 0, 30),
        utc(2024, 1, 1, 0, 0, 45),
    ]
    # Strictly after: a fire time is not its own successor.
    assert fires("0 0 * * *", None, utc(2024, 1, 1), 1) == [utc(2024, 1, 2)]
    # Sub-second inputs round up.
    start = utc(2024, 1, 1, 0, 0, 14) + timedelta(microseconds=999_999)
    assert fires("* * * * * */15", None, start, 1) == [utc(2024, 1, 1, 0, 0, 15)]


# -- parsing ----------------------------------------------------------------------


def test_field_syntax():
    assert CronExpression("*/15 * * * *").minutes == [0, 15, 30, 45]
    assert CronExpression("5-20/5 * * * *").minutes == [5, 10, 15, 20]
    assert CronExpression("50/5 * * * *").minutes == [50, 55]
    assert CronExpression("1,2,3-4 * * * *").minutes == [1, 2, 3, 4]
    assert CronExpression("0 0 * JAN,jul *").months == [1, 7]
    assert CronExpression("0 0 * * MON-FRI").weekdays == [1, 2, 3, 4, 5]
    assert CronExpression("0 0 * * 7").weekdays == [0]  # 7 is Sunday too
    assert CronExpression("0 0 * * 5-7").weekdays == [0, 5, 6]
    assert CronExpression("@hourly").minutes == [0]
    assert CronExpression("@hourly").wildcard and not CronExpression("@daily").wildcard
    assert CronExpression("0 9 * * *").seconds == [0]
    assert CronExpression("0 9 * * * 30").seconds == [30]


def test_day_rules():
    # Both day fields restricted: either matches (Vixie cron).
    times = fires("0 0 13 * FRI", None, utc(2024, 9, 1), 4)
    assert [t.date().isoformat() for t in times] == [
        "2024-09-06",
        "2024-09-13",
        "2024-09-20",
        "2024-09-27",
    ]
    # One restricted: only it counts.
    assert fires("0 0 13 * *", None, utc(2024, 9, 1), 1) == [utc(2024, 9, 13)]
    assert fires("0 0 ? * SUN", None, utc(2024, 9, 1), 1) == [utc(2024, 9, 8)]
    # Last day of the month, last Friday, second Monday.
    assert fires("0 0 L * *", None, utc(2024, 2, 1), 2) == [utc(2024, 2, 29), utc(2024, 3, 31)]
    assert fires("0 0 * * 5L", None, utc(2024, 2, 1), 2) == [utc(2024, 2, 23), utc(2024, 3, 29)]
    assert fires("0 0 * * MON#2", None, utc(2024, 2, 1), 2) == [utc(2024, 2, 12), utc(2024, 3, 11)]
    # Leap day: the next one is four years on.
    assert fires("0 0 29 2 *", None, utc(2024, 3, 1), 1) == [utc(2028, 2, 29)]


@pytest.mark.parametrize(
    ("expr", "message"),
    [
        ("", "expected 5 fields"),
        ("* * * *", "expected 5 fields"),
        ("* * * * * * *", "expected 5 fields"),
        ("60 * * * *", "minute '60': 60 is out of range 0-59"),
        ("* 24 * * *", "hour '24': 24 is out of range 0-23"),
        ("* * 0 * *", "day of month '0': 0 is out of range 1-31"),
        ("* * * 13 *", "month '13': 13 is out of range 1-12"),
        ("* * * * 8", "day of week '8': 8 is out of range 0-7"),
        ("* * * * * 60", "second '60'"),
        ("*/0 * * * *", "step must be a positive number"),
        ("10-5 * * * *", "range start 10 is after its end 5"),
        ("a * * * *", "expected a number"),
        ("* * * FOO *", "expected a number or a name"),
        ("1,,2 * * * *", "empty list item"),
        ("0 0 30 2 *", "never fires"),
        ("0 0 * * MON#6", "the week after # must be 1-5"),
        ("@reboot", "unknown alias"),
    ],
)
def test_invalid_expressions_say_what_is_wrong(expr, message):
    with pytest.raises(CronError, match=message.replace("*", r"\*")):
        CronExpression(expr)
    assert issubclass(CronError, ValueError)


# -- intervals and window planning ----------------------------------------------------


def test_interval_windows_are_aligned_to_the_epoch():
    every = IntervalSchedule(timedelta(seconds=7))
    t = utc(2024, 5, 1, 12, 0, 0)
    first = every.next_after(t)
    assert (first - datetime(1970, 1, 1, tzinfo=UTC)).total_seconds() % 7 == 0
    assert t < first <= t + timedelta(seconds=7)
    assert every.next_after(first) == first + timedelta(seconds=7)  # strictly after
    assert IntervalSchedule(timedelta(milliseconds=250)).next_after(
        utc(2024, 1, 1) + timedelta(milliseconds=100)
    ) == utc(2024, 1, 1) + timedelta(milliseconds=250)
    assert every.describe() == "every 7s"
    assert IntervalSchedule(timedelta(milliseconds=250)).describe() == "every 0.25s"


def test_latest_fire_at_or_before():
    hourly = CronSchedule("0 * * * *")
    assert latest_fire_at_or_before(hourly, utc(2024, 1, 1, 5, 59), utc(2024, 1, 1)) == utc(
        2024, 1, 1, 5
    )
    yearly = CronSchedule("@yearly")
    assert latest_fire_at_or_before(yearly, utc(2030, 6, 1), utc(2024, 1, 1)) == utc(2030, 1, 1)
    assert latest_fire_at_or_before(yearly, utc(2024, 6, 1), utc(2024, 1, 1)) == utc(2024, 1, 1)


MINUTE = IntervalSchedule(timedelta(minutes=1))
NOW = utc(2024, 5, 1, 12, 0, 30)


def test_plan_new_job_starts_at_the_next_window_and_on_time_runs_one():
    plan = plan_windows(MINUTE, None, NOW, 300, CoalescePolicy.LATEST)
    assert plan.run == [] and plan.next_run == utc(2024, 5, 1, 12, 1)
    plan = plan_windows(MINUTE, utc(2024, 5, 1, 12, 1), NOW, 300, CoalescePolicy.LATEST)
    assert plan.run == [] and plan.next_run == utc(2024, 5, 1, 12, 1)  # not due yet
    plan = plan_windows(MINUTE, utc(2024, 5, 1, 12, 0), NOW, 300, CoalescePolicy.LATEST)
    assert plan.run == [utc(2024, 5, 1, 12, 0)] and plan.overdue is None
    assert plan.next_run == utc(2024, 5, 1, 12, 1)


def test_plan_after_an_outage_follows_coalesce_and_grace():
    down_since = utc(2024, 5, 1, 11, 50)  # ten windows missed, now 12:00:30
    latest = plan_windows(MINUTE, down_since, NOW, 300, CoalescePolicy.LATEST)
    assert latest.run == [utc(2024, 5, 1, 12, 0)]
    assert latest.overdue == (down_since, utc(2024, 5, 1, 12, 0))
    earliest = plan_windows(MINUTE, down_since, NOW, 300, CoalescePolicy.EARLIEST)
    assert earliest.run == [utc(2024, 5, 1, 11, 56)]  # oldest within 300 s of 12:00:30
    everything = plan_windows(MINUTE, down_since, NOW, 300, CoalescePolicy.ALL)
    assert everything.run == [utc(2024, 5, 1, 11, 56 + i) for i in range(4)] + [
        utc(2024, 5, 1, 12, 0)
    ]
    no_grace = plan_windows(MINUTE, down_since, NOW, None, CoalescePolicy.ALL)
    assert len(no_grace.run) == 11
    for plan in (latest, earliest, everything, no_grace):
        assert plan.next_run == utc(2024, 5, 1, 12, 1)
    capped = plan_windows(MINUTE, down_since, NOW, None, CoalescePolicy.ALL, limit=4)
    assert len(capped.run) == 4 and capped.next_run == utc(2024, 5, 1, 11, 54)


def test_plan_misses_windows_older_than_the_grace_time():
    daily = CronSchedule("0 9 * * *")
    # Down from before 09:00 until 10:00: the 09:00 run is an hour late.
    plan = plan_windows(daily, utc(2024, 5, 1, 9), utc(2024, 5, 1, 10), 300, CoalescePolicy.LATEST)
    assert plan.run == [] and plan.next_run == utc(2024, 5, 2, 9)
    assert plan.overdue == (utc(2024, 5, 1, 9), utc(2024, 5, 1, 9))
    # Without a grace time the latest missed run still happens (once).
    plan = plan_windows(daily, utc(2024, 4, 1, 9), utc(2024, 5, 1, 10), None, CoalescePolicy.LATEST)
    assert plan.run == [utc(2024, 5, 1, 9)] and plan.next_run == utc(2024, 5, 2, 9)
