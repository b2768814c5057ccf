"""The checkpoint key rule: only objects under the job's own prefix, in normal form."""

from __future__ import annotations

import posixpath

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker.core.checkpoint_keys import MAX_KEY_LENGTH, checked_checkpoint_key, checkpoint_prefix
from broker.core.errors import InvalidInput

JOB = "job_0001"
PREFIX = "jobs/job_0001/"


def refusal(key: str, job_id: str = JOB) -> str:
    with pytest.raises(InvalidInput) as refused:
        checked_checkpoint_key(job_id, key)
    assert refused.value.field == "checkpoint_key"
    assert checkpoint_prefix(job_id) in refused.value.message  # says what is allowed
    return refused.value.message


def test_the_prefix_is_the_one_the_runner_hands_out() -> None:
    assert checkpoint_prefix(JOB) == PREFIX


@pytest.mark.parametrize(
    "key",
    [
        "jobs/job_0001/ckpt-1200",
        "jobs/job_0001/att_9/work-4000.5",
        "jobs/job_0001/a/b/c/model.pt",
        "jobs/job_0001/2026-12-03T12:00:00Z",  # a colon inside a key is no URL
        "jobs/job_0001/..hidden",  # a name starting with dots is no '..' segment
    ],
)
def test_a_key_under_the_jobs_prefix_is_accepted_as_is(key: str) -> None:
    assert checked_checkpoint_key(JOB, key) == key


@pytest.mark.parametrize(
    ("key", "why"),
    [
        ("jobs/job_0002/ckpt-1", "is not a key under"),  # another job's (another team's)
        ("jobs/job_00011/ckpt-1", "is not a key under"),  # a job id that starts the same
        ("jobs/job_0001", "is not a key under"),
        ("jobs/job_0001/", "normal form"),  # the prefix itself: no object
        ("ckpt/1000", "is not a key under"),
        ("/jobs/job_0001/ckpt-1", "absolute"),
        ("jobs/job_0001/../job_0002/ckpt-1", "'..' segment"),
        ("jobs/job_0001/a/../../job_0002/x", "'..' segment"),
        ("..", "'..' segment"),
        ("jobs\\job_0001\\ckpt-1", "backslash"),
        ("jobs/job_0001/..\\..\\job_0002", "backslash"),
        ("s3://other-bucket/jobs/job_0001/ckpt-1", "URL"),
        ("gs://broker-checkpoints/jobs/job_0001/ckpt-1", "URL"),
        ("https://example.com/jobs/job_0001/ckpt-1", "URL"),
        ("file:/etc/passwd", "URL"),
        ("jobs/job_0001//ckpt-1", "normal form"),
        ("jobs/job_0001/./ckpt-1", "normal form"),
        ("jobs/job_0001/ckpt-1/", "normal form"),
        ("", "empty"),
        ("jobs/job_0001/" + "x" * MAX_KEY_LENGTH, "characters, over"),
        ("jobs/job_0001/ckpt\n1", "control characters"),
        ("jobs/job_0001/ckpt\x001", "control characters"),
    ],
)
def test_a_key_outside_the_prefix_or_not_plain_is_refused_naming_the_field(
    key: str, why: str
) -> None:
    assert why in refusal(key)


plain = st.characters(codec="utf-8", exclude_categories=("Cs", "Cc"), exclude_characters="/\\")
segment = st.text(
    alphabet=plain,
    min_size=1,
    max_size=20,
).filter(lambda s: s not in (".", ".."))


@given(st.lists(segment, min_size=1, max_size=6))
def test_any_plain_path_under_the_prefix_is_accepted_unchanged(parts: list[str]) -> None:
    key = PREFIX + "/".join(parts)
    if len(key) <= MAX_KEY_LENGTH:
        assert checked_checkpoint_key(JOB, key) == key


@given(st.text(max_size=80), st.sampled_from(["", PREFIX, "jobs/job_0002/", "/", "../"]))
def test_whatever_is_accepted_lies_under_the_prefix_and_only_that_jobs(
    tail: str, head: str
) -> None:
    key = head + tail
    try:
        accepted = checked_checkpoint_key(JOB, key)
    except InvalidInput as refused:
        assert refused.field == "checkpoint_key" and PREFIX in refused.message
        return
    assert accepted == key
    assert accepted.startswith(PREFIX) and len(accepted) > len(PREFIX)
    assert posixpath.normpath(accepted) == accepted
    assert ".." not in accepted.split("/") and "\\" not in accepted and "://" not in accepted
    # The same key is never another job's.
    with pytest.raises(InvalidInput):
        checked_checkpoint_key("job_0002", key)
