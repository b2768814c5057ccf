"""``POST /v1/workdirs`` against a real S3 server (moto's), and the rule that a job's
``run.workdir`` in the broker's bucket names an object in the submitting team's own folder."""

from __future__ import annotations

import gzip
import hashlib
import io
import tarfile

import pytest

from broker.settings import get_settings
from tests.helpers import RUN, job_spec

GZIP = {"Content-Type": "application/gzip"}


def tar_gz(files: dict[str, bytes], links: dict[str, str] | None = None) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
        for name, target in (links or {}).items():
            info = tarfile.TarInfo(name)
            info.type = tarfile.SYMTYPE
            info.linkname = target
            archive.addfile(info)
    return buffer.getvalue()


def upload(client, headers, body: bytes):  # type: ignore[no-untyped-def]
    return client.post("/v1/workdirs", content=body, headers={**headers, **GZIP})


def test_an_upload_is_stored_in_the_teams_folder_by_its_digest(client, make_team, store):
    team, headers = make_team()
    body = tar_gz({"train.py": b"print('hi')\n", "data/labels.txt": b"cat\ndog\n"})
    response = upload(client, headers, body)
    assert response.status_code == 201, response.text
    digest = hashlib.sha256(body).hexdigest()
    key = f"workdirs/{team['id']}/{digest}.tar.gz"
    assert response.json() == {"workdir": f"s3://{store.bucket}/{key}", "bytes": len(body)}
    assert store.get(key) == body
    again = upload(client, headers, body)  # the same archive is the same object
    assert again.status_code == 201 and again.json() == response.json()
    assert store.list_keys(f"workdirs/{team['id']}/") == [key]

    spec = job_spec(run={**RUN, "workdir": response.json()["workdir"]})
    job = client.post("/v1/jobs", json=spec, headers=headers)
    assert job.status_code == 201, job.text
    assert job.json()["spec"]["run"]["workdir"] == response.json()["workdir"]


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (b"", "not gzip"),
        (b"print('a plain file')\n", "not gzip"),
        (gzip.compress(b"gzip'd, but no tar inside " * 40), "not a valid tar.gz"),
        (tar_gz({"train.py": b"x"})[:-30], "not a valid tar.gz"),
        (tar_gz({}), "empty archive"),
        (tar_gz({"../escape.py": b"x"}), "outside its folder"),
        (tar_gz({"/etc/cron.d/x": b"x"}), "outside its folder"),
        (tar_gz({"a/../../x": b"x"}), "outside its folder"),
        (tar_gz({}, links={"data": "/etc"}), "points outside"),
        (tar_gz({}, links={"sub/up": "../../x"}), "points outside"),
    ],
)
def test_a_body_that_is_not_a_safe_tar_gz_is_422(client, make_team, store, body, says):
    team, headers = make_team()
    response = upload(client, headers, body)
    assert response.status_code == 422, response.text
    detail = response.json()["detail"][0]
    assert detail["loc"] == ["body"] and says in detail["msg"], detail
    assert store.list_keys(f"workdirs/{team['id']}/") == []


def test_links_inside_the_folder_are_fine(client, make_team, store):
    _, headers = make_team()
    body = tar_gz({"data/a.txt": b"a"}, links={"latest": "data/a.txt", "data/b": "../latest"})
    assert upload(client, headers, body).status_code == 201


def test_a_device_member_is_refused(client, make_team, store):
    _, headers = make_team()
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        info = tarfile.TarInfo("dev/zero")
        info.type = tarfile.CHRTYPE
        archive.addfile(info)
    response = upload(client, headers, buffer.getvalue())
    assert response.status_code == 422 and "not a file, folder or link" in response.text


def test_an_upload_over_the_limit_is_413_before_any_auth(client, store):
    limit = get_settings().workdir_limit_bytes
    response = client.post("/v1/workdirs", content=b"\0" * (limit + 1), headers=GZIP)
    assert response.status_code == 413
    assert response.json()["detail"]["code"] == "too_large"


def test_an_upload_needs_a_team_key(client, admin_headers, store):
    body = tar_gz({"train.py": b"x"})
    assert client.post("/v1/workdirs", content=body, headers=GZIP).status_code == 401
    assert upload(client, admin_headers, body).status_code == 403


def workdir_of(team_id: str, name: str = "0" * 64 + ".tar.gz") -> str:
    return f"s3://{get_settings().checkpoint_bucket}/workdirs/{team_id}/{name}"


def test_a_workdir_in_the_brokers_bucket_must_be_in_the_teams_own_folder(client, make_team):
    team, headers = make_team()
    other, _ = make_team()
    bucket = get_settings().checkpoint_bucket
    refused = [
        workdir_of(other["id"]),
        f"s3://{bucket}/jobs/job_x/checkpoints/a.tar.gz",
        f"s3://{bucket}/workdirs/{team['id']}",
        f"s3://{bucket}/workdirs/{team['id']}/",
        f"s3://{bucket}/workdirs/{team['id']}/sub/x.tar.gz",
        f"s3://{bucket}/workdirs/{team['id']}/..",
        f"s3://{bucket}/workdirs/{team['id']}x/a.tar.gz",
    ]
    for workdir in refused:
        spec = job_spec(run={**RUN, "workdir": workdir})
        response = client.post("/v1/jobs", json=spec, headers=headers)
        assert response.status_code == 422, (workdir, response.text)
        detail = response.json()["detail"][0]
        assert detail["loc"] == ["body", "run.workdir"], detail
        assert f"workdirs/{team['id']}/" in detail["msg"]
    accepted = [
        workdir_of(team["id"]),
        "s3://another-bucket/workdirs/anyone/code.tar.gz",  # the instance's own access
        "https://example.com/code.tar.gz",
    ]
    for workdir in accepted:
        spec = job_spec(run={**RUN, "workdir": workdir})
        response = client.post("/v1/jobs", json=spec, headers=headers)
        assert response.status_code == 201, (workdir, response.text)


def test_a_quote_does_not_check_the_workdirs_folder(client, make_team):
    _, headers = make_team()
    other, _ = make_team()
    spec = job_spec(run={**RUN, "workdir": workdir_of(other["id"])})
    assert client.post("/v1/quotes", json=spec, headers=headers).status_code == 200
