from __future__ import annotations

import random

import pytest

from engine import Outcome, RetryPolicy, Spent


class TestRetryPolicy:
    def test_defaults(self) -> None:
        """The default policy retries 3 times, from 1 s doubling up to 60 s, with no timeout."""
        policy = RetryPolicy()
        assert (policy.max_retries, policy.delay, policy.backoff, policy.max_delay) == (
            3,
            1.0,
            2.0,
            60.0,
        )
        assert policy.timeout is None
        assert policy.retry_on == (Exception,)

    @pytest.mark.parametrize(
        ("retry", "expected"), [(1, 2.0), (2, 6.0), (3, 18.0), (4, 30.0), (9, 30.0)]
    )
    def test_backoff_is_capped_by_max_delay(self, retry: int, expected: float) -> None:
        """Each retry multiplies the delay by `backoff` until `max_delay` caps it."""
        policy = RetryPolicy(delay=2.0, backoff=3.0, max_delay=30.0)
        assert policy.delay_for(retry) == expected

    def test_a_huge_retry_number_stays_at_the_cap(self) -> None:
        """Retry 5,000 of a doubling delay is max_delay, not an OverflowError."""
        assert RetryPolicy(max_retries=10_000, max_delay=90).delay_for(5_000) == 90.0

    def test_jitter_stays_within_its_share(self) -> None:
        """Jitter moves each delay by at most its share, never below 0 nor above max_delay."""
        policy = RetryPolicy(delay=10.0, backoff=1.0, jitter=0.2, max_delay=11.0)
        delays = [policy.delay_for(1, random.Random(seed)) for seed in range(200)]
        assert min(delays) >= 8.0
        assert max(delays) <= 11.0
        assert len(set(delays)) > 50

    def test_jitter_is_reproducible_with_a_seeded_rng(self) -> None:
        """The same seed gives the same delays."""
        policy = RetryPolicy(jitter=0.5)
        assert policy.delay_for(2, random.Random(7)) == policy.delay_for(2, random.Random(7))

    def test_give_up_on_wins_over_retry_on(self) -> None:
        """An error in both lists is not retried; one outside `retry_on` is not either."""
        policy = RetryPolicy(retry_on=(OSError, ValueError), give_up_on=FileNotFoundError)
        assert policy.retryable(ConnectionError())
        assert policy.retryable(ValueError())
        assert not policy.retryable(FileNotFoundError())
        assert not policy.retryable(KeyError())

    def test_to_json_names_exception_types(self) -> None:
        """The recorded form is plain JSON, exception types by name."""
        data = RetryPolicy(timeout=5, give_up_on=(KeyError,)).to_json()
        assert data["timeout"] == 5
        assert data["retry_on"] == ["Exception"]
        assert data["give_up_on"] == ["KeyError"]

    @pytest.mark.parametrize(
        ("field", "value"),
        [
            ("max_retries", -1),
            ("max_retries", 1.5),
            ("delay", -1),
            ("delay", float("inf")),
            ("backoff", 0.5),
            ("max_delay", float("nan")),
            ("jitter", 1.5),
            ("timeout", 0),
            ("timeout", "10"),
            ("retry_on", "ValueError"),
            ("give_up_on", (KeyError, 3)),
        ],
    )
    def test_bad_settings_are_refused_by_name(self, field: str, value: object) -> None:
        """Each bad setting raises one ValueError naming the setting."""
        with pytest.raises(
            ValueError,
            match=field if field not in ("retry_on", "give_up_on") else "exception classes",
        ):
            RetryPolicy(**{field: value})  # type: ignore[arg-type]


class TestOutcomeAndSpent:
    def test_outcome_names_an_outcome(self) -> None:
        """Outcome carries the outcome and the result; an empty outcome is refused."""
        assert Outcome("needs_refactor", {"files": 2}).result == {"files": 2}
        with pytest.raises(ValueError, match="outcome"):
            Outcome("")

    def test_spent_checks_its_amount(self) -> None:
        """A negative cost is refused."""
        assert Spent({"ok": True}, 0.5).unit == "usd"
        with pytest.raises(ValueError, match="amount"):
            Spent(None, -1)


class ToolError(Exception):
    """A tool call failed."""


class TestDelayAndOutcomes:
    def test_a_delay_above_a_given_max_delay_is_refused(self) -> None:
        """RetryPolicy(delay=180, max_delay=60) is refused, naming both: nothing is cut silently."""
        with pytest.raises(ValueError, match=r"delay=180 is above max_delay=60"):
            RetryPolicy(delay=180, max_delay=60)
        assert RetryPolicy(delay=180, max_delay=600).delay_for(1) == 180.0

    def test_the_default_max_delay_grows_to_the_delay(self) -> None:
        """No max_delay given: a delay over 60 s is its own cap (delay=180, backoff=1.5: 180 s)."""
        policy = RetryPolicy(delay=180, backoff=1.5)
        assert policy.max_delay == 180.0
        assert [policy.delay_for(n) for n in (1, 2, 3)] == [180.0, 180.0, 180.0]
        assert policy.to_json()["max_delay"] == 180.0
        assert RetryPolicy(delay=5).max_delay == 60.0

    def test_failures_record_failed_unless_mapped(self) -> None:
        """outcome_for gives the first matching type's outcome, else "failed"."""
        policy = RetryPolicy(outcomes={ToolError: "error_occurred", Exception: "crashed"})
        assert policy.outcome_for(ToolError("timeout")) == "error_occurred"
        assert policy.outcome_for(ValueError("x")) == "crashed"
        assert RetryPolicy().outcome_for(ToolError("x")) == "failed"
        assert policy.to_json()["outcomes"] == {
            "ToolError": "error_occurred",
            "Exception": "crashed",
        }

    @pytest.mark.parametrize(
        ("outcomes", "problem"),
        [
            ({ToolError: ""}, "must be a non-empty str"),
            ({ToolError: 3}, "must be a non-empty str"),
            ({"ToolError": "error_occurred"}, "expected exception classes"),
            ([ToolError], "must map exception classes to outcomes"),
        ],
    )
    def test_bad_outcome_maps_are_refused(self, outcomes: object, problem: str) -> None:
        """A map that is not exception classes to outcome names raises ValueError saying so."""
        with pytest.raises(ValueError, match=problem):
            RetryPolicy(outcomes=outcomes)
