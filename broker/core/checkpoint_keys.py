"""Where a job's checkpoints may lie: object keys under the job's own prefix, ``jobs/{job_id}/``.

The agent names the object it wrote; the broker hands the latest one to the job's next
attempt. A key outside the prefix would hand that attempt another team's data (or make the
broker vouch for an object it never asked for), so one rule decides every key, here.
"""

from __future__ import annotations

import posixpath
import re

from broker.core.errors import InvalidInput

MAX_KEY_LENGTH = 500  # the checkpoint table's column; S3 allows 1024 bytes
_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")  # s3://, gs://, https:, file:, ...
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def checkpoint_prefix(job_id: str) -> str:
    """The prefix every checkpoint key of ``job_id`` starts with (the runner hands it out)."""
    return f"jobs/{job_id}/"


def checked_checkpoint_key(job_id: str, key: str) -> str:
    """``key`` if it names an object under ``job_id``'s prefix, in normal form; else
    InvalidInput naming ``checkpoint_key`` and the prefix.

    Refused: empty or over-long keys, control characters, backslashes, URLs (another bucket
    or store), absolute keys, ``..`` segments, and keys that ``posixpath.normpath`` would
    change (``a//b``, ``./``, a trailing ``/``): object stores take keys literally, so such
    a key names another object than its normal form does.
    """
    prefix = checkpoint_prefix(job_id)
    allowed = f"a key under {prefix}"
    if not key:
        raise _refused(f"checkpoint_key is empty: give {allowed}")
    if len(key) > MAX_KEY_LENGTH:
        raise _refused(
            f"checkpoint_key is {len(key)} characters, over {MAX_KEY_LENGTH}: give {allowed}"
        )
    if _CONTROL.search(key):
        raise _refused(f"checkpoint_key holds control characters: give {allowed}")
    if "\\" in key:
        raise _refused(f"checkpoint_key holds a backslash: give {allowed}")
    if _URL.match(key):
        raise _refused(
            f"checkpoint_key is a URL ({key.split(':', 1)[0]}:): give {allowed} in the "
            "broker's checkpoint bucket"
        )
    if key.startswith("/"):
        raise _refused(f"checkpoint_key is absolute: give {allowed}")
    if ".." in key.split("/"):
        raise _refused(f"checkpoint_key has a '..' segment: give {allowed}")
    normal = posixpath.normpath(key)
    if normal != key:
        raise _refused(
            f"checkpoint_key is not in normal form (it would be {normal!r}): give {allowed}"
        )
    if not key.startswith(prefix):
        raise _refused(f"checkpoint_key {key!r} is not {allowed}")
    return key


def _refused(message: str) -> InvalidInput:
    return InvalidInput(message, "checkpoint_key")
