"""The poll window a daemon connection learns from its client's gaps
(``chm.daemon.connection.poll_window``): pure arithmetic on nanoseconds,
checked here exactly; tests/integration/test_daemon_poll.py runs it in a
real daemon."""

from __future__ import annotations

from chm.daemon.connection import poll_window

US = 1000
CAP = 2000 * US


def test_a_client_asking_back_to_back_gets_the_shortest_window() -> None:
    assert poll_window([5 * US, 8 * US, 3 * US], CAP) == 50 * US


def test_the_window_covers_the_longest_recent_gap_within_the_cap() -> None:
    # 1.5 x 800 us + 20 us
    assert poll_window([10 * US, 800 * US, 20 * US], CAP) == 1220 * US


def test_the_window_is_capped() -> None:
    assert poll_window([10 * US, 1900 * US], CAP) == CAP


def test_gaps_beyond_the_cap_do_not_count() -> None:
    assert poll_window([10 * US, 5000 * US, 30 * US], CAP) == 65 * US


def test_a_client_whose_gaps_all_exceed_the_cap_is_not_polled_for() -> None:
    assert poll_window([3000 * US, 10_000 * US], CAP) == 0
    assert poll_window([], CAP) == 0


def test_cap_0_never_polls() -> None:
    assert poll_window([0, 1, 2], 0) == 0
