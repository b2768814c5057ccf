"""Agent tokens: derived from the attempt, its expiry and the secret; the expiry readable."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import given
from hypothesis import strategies as st

from broker.core.agent_tokens import EXPIRY_MARGIN, expires_at, mint, token_expiry

DEADLINE = datetime(2026, 12, 5, 12, 0, 0, 250_000, tzinfo=UTC)


def test_a_token_is_derived_again_the_same_for_the_same_attempt_and_expiry() -> None:
    expiry = token_expiry(DEADLINE)
    assert mint("s", "att_1", expiry) == mint("s", "att_1", expiry)
    assert mint("s", "att_1", expiry).startswith("att_")


def test_a_token_belongs_to_one_attempt_one_expiry_and_one_secret() -> None:
    expiry = token_expiry(DEADLINE)
    token = mint("s", "att_1", expiry)
    assert mint("s", "att_2", expiry) != token
    assert mint("other", "att_1", expiry) != token
    assert mint("s", "att_1", expiry + timedelta(seconds=1)) != token


def test_tokens_expire_a_margin_after_the_deadline_on_a_whole_second() -> None:
    expiry = token_expiry(DEADLINE)
    assert expiry >= DEADLINE + EXPIRY_MARGIN
    assert expiry - (DEADLINE + EXPIRY_MARGIN) < timedelta(seconds=1)
    assert expires_at(mint("s", "att_1", expiry)) == expiry


def test_tokens_without_an_expiry_read_as_none() -> None:
    assert expires_at("att_" + "ab" * 20) is None  # the old derived form
    assert expires_at("att_Zx_-9") is None  # a random one
    assert expires_at("att_12.nothex") is None


@given(
    st.text(max_size=60),
    st.datetimes(datetime(1970, 1, 2), datetime(5000, 1, 1), timezones=st.just(UTC)),
)
def test_the_expiry_read_back_is_the_one_minted(attempt_id: str, when: datetime) -> None:
    read = expires_at(mint("secret", attempt_id, when))
    assert read is not None and timedelta(0) <= read - when < timedelta(seconds=1)


def test_an_expiry_past_any_date_reads_as_none_rather_than_failing() -> None:
    assert expires_at("att_999999999999." + "ab" * 20) is None
    assert expires_at("att_99999999999." + "ab" * 20) is not None  # year 5138
