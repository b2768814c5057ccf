"""Job files: YAML read as the API's JSON body; a relative deadline goes as written."""

from __future__ import annotations

from tests.cli.support import failed, job_file


def test_relative_deadline_and_numeric_money_as_sent(tmp_path):
    from broker.cli.specfile import load_spec

    spec = load_spec(job_file(tmp_path, max_cost="80.5", deadline="+1d12h"))
    assert spec["deadline"] == "+1d12h" and spec["max_cost"] == "80.5"
    absolute = load_spec(job_file(tmp_path, deadline="2026-12-05T12:00:00Z"))
    assert absolute["deadline"] == "2026-12-05T12:00:00+00:00"  # YAML read it as a time


def test_invalid_spec_names_the_field(broker_cli, team_key, tmp_path):
    _, token = team_key
    bad = job_file(tmp_path, resources="{gpus: 0}")
    out = failed(broker_cli("jobs", "submit", str(bad), token=token))
    assert "resources.gpus" in out and "HTTP 422" in out
    out = failed(
        broker_cli("quote", str(job_file(tmp_path, deadline="2026-12-05T12:00:00")), token=token)
    )
    assert "deadline" in out and "HTTP 422" in out
    out = failed(broker_cli("quote", str(job_file(tmp_path, deadline="+8 parsecs")), token=token))
    assert "+8 parsecs" in out and "+8h" in out
    out = failed(broker_cli("jobs", "submit", str(job_file(tmp_path, deadline="+0s")), token=token))
    assert "deadline" in out and "in the past" in out and "HTTP 422" in out
    (tmp_path / "broken.yaml").write_text("name: [unclosed\n")
    out = failed(broker_cli("quote", str(tmp_path / "broken.yaml"), token=token))
    assert "not valid YAML" in out
