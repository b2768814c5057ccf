"""Workdirs: the tar.gz of a team's code that a job's instances unpack before its program runs.

A team uploads one (``POST /v1/workdirs``); it is checked to be a gzip'd tar that unpacks
inside its folder and within ``workdir_unpacked_limit_bytes``, and stored in the broker's
bucket as ``workdirs/{team_id}/{sha256 of the tar.gz}.tar.gz``. A job's ``run.workdir`` in
that bucket must name an object in the submitting team's own folder.
"""

from __future__ import annotations

import hashlib
import io
import logging
import posixpath
import tarfile
import zlib
from dataclasses import dataclass

from broker.core.errors import InvalidInput
from broker.services.job_spec import JobSpec, parse_s3_uri
from broker.settings import Settings, get_settings
from providers.storage import S3CheckpointStore

log = logging.getLogger(__name__)

FIELD = "run.workdir"
MAX_MEMBERS = 100_000
"""Files and folders one workdir may hold."""


@dataclass(frozen=True)
class StoredWorkdir:
    """An uploaded workdir: its ``s3://`` URI (a job's ``run.workdir``) and its size."""

    uri: str
    size: int


def workdir_prefix(team_id: str) -> str:
    """The folder of a team's workdirs in the broker's bucket."""
    return f"workdirs/{team_id}/"


def _escapes(name: str) -> bool:
    """Whether a path inside the archive leaves the folder it is unpacked in."""
    normal = posixpath.normpath(name)
    return name.startswith("/") or normal == ".." or normal.startswith("../")


def check_archive(data: bytes, unpacked_limit: int) -> int:
    """Check that ``data`` is a gzip'd tar whose members stay inside the folder it is
    unpacked in (no absolute or ``..`` paths, no links out, no devices) and unpack to at most
    ``unpacked_limit`` bytes; returns the bytes it unpacks to. InvalidInput otherwise."""

    def refuse(message: str) -> InvalidInput:
        return InvalidInput(f"the workdir {message}")  # the error's loc: ["body"]

    if not data.startswith(b"\x1f\x8b"):
        raise refuse("is not gzip'd (send a tar.gz)")
    total = 0
    members = 0
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as archive:
            # Member by member: the sizes are checked from each header before any data of a
            # huge member is inflated, so a gzip bomb stops at the limit.
            for member in archive:
                members += 1
                if members > MAX_MEMBERS:
                    raise refuse(f"holds more than {MAX_MEMBERS} files and folders")
                name = member.name
                if _escapes(name):
                    raise refuse(f"member {name[:200]!r} would unpack outside its folder")
                if member.issym() or member.islnk():
                    target = member.linkname
                    base = posixpath.dirname(name) if member.issym() else ""
                    if target.startswith("/") or _escapes(posixpath.join(base, target)):
                        raise refuse(f"link {name[:200]!r} points outside its folder")
                elif not (member.isfile() or member.isdir()):
                    raise refuse(f"member {name[:200]!r} is not a file, folder or link")
                total += max(member.size, 0)
                if total > unpacked_limit:
                    raise refuse(f"unpacks to more than {unpacked_limit} bytes")
    except (tarfile.TarError, EOFError, OSError, zlib.error) as error:
        raise refuse(f"is not a valid tar.gz ({error})") from None
    if members == 0:
        raise refuse("is an empty archive")
    return total


def store_workdir(
    store: S3CheckpointStore, team_id: str, data: bytes, *, settings: Settings | None = None
) -> StoredWorkdir:
    """Check a team's uploaded tar.gz (``check_archive``) and store it under the team's
    folder, named by its SHA-256 (the same upload is the same object). InvalidInput for a
    bad archive; ProviderError when the store does not answer."""
    settings = settings or get_settings()
    if len(data) > settings.workdir_limit_bytes:
        raise InvalidInput(
            f"the workdir is {len(data)} bytes, over the limit of {settings.workdir_limit_bytes}"
        )
    unpacked = check_archive(data, settings.workdir_unpacked_limit_bytes)
    key = f"{workdir_prefix(team_id)}{hashlib.sha256(data).hexdigest()}.tar.gz"
    store.put(key, data)
    log.info(
        "workdir stored",
        extra={"team_id": team_id, "key": key, "bytes": len(data), "unpacked": unpacked},
    )
    return StoredWorkdir(uri=f"s3://{store.bucket}/{key}", size=len(data))


def check_run_workdir(spec: JobSpec, team_id: str, bucket: str | None = None) -> None:
    """A ``run.workdir`` in the broker's own bucket must be one object in the submitting
    team's folder, ``s3://<bucket>/workdirs/<team_id>/<name>`` (the broker hands the
    instance a URL for it; another team's object never). InvalidInput otherwise."""
    workdir = spec.run.workdir if spec.run else None
    parsed = parse_s3_uri(workdir) if workdir else None
    if parsed is None:
        return
    own_bucket = bucket or get_settings().checkpoint_bucket
    uri_bucket, key = parsed
    if uri_bucket != own_bucket:
        return
    prefix = workdir_prefix(team_id)
    name = key.removeprefix(prefix) if key.startswith(prefix) else ""
    if not name or "/" in name or name in (".", ".."):
        raise InvalidInput(
            f"a workdir in the broker's bucket must be s3://{own_bucket}/{prefix}<name> "
            "(your team's folder; POST /v1/workdirs uploads one there)",
            field=FIELD,
        )
