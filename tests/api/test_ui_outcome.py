"""The dashboard shows each finished job's deadline outcome and its saving (issue 22)."""

from __future__ import annotations

from datetime import timedelta

from sqlmodel import Session

from broker.db.models import Job
from broker.services import lifecycle
from broker.services.plans import job_plan
from tests.api.test_ui import login, page
from tests.helpers import LEASE, job_spec


def test_job_list_and_page_show_deadline_met_and_the_saving(client, make_team, db_engine, clock):  # type: ignore[no-untyped-def]
    _, headers = make_team(name="vision")
    job = client.post("/v1/jobs", json=job_spec(), headers=headers).json()
    assert login(client, headers["Authorization"].split()[1]).status_code == 303
    assert "<td>–</td>\n  </tr>" in page(client).text  # running: no outcome yet
    with Session(db_engine, expire_on_commit=False) as session:
        row = session.get(Job, job["id"])
        begun = lifecycle.begin_attempt(session, row.id, job_plan(row), clock.now())
        assert begun is not None
        lifecycle.launch_succeeded(session, begun[0].id, "i-1", clock.now(), lease_seconds=LEASE)
        clock.set(row.deadline + timedelta(minutes=1))
        lifecycle.program_exited(session, begun[0].id, 0, "", clock.now())
    assert "<td>missed</td>" in page(client).text
    shown = page(client, f"/ui/jobs/{job['id']}").text
    assert "(missed: work complete " in shown and ", saved $" in shown
