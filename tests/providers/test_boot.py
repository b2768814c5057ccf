"""The boot script: what it says, and what it does when bash runs it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from providers.boot import boot_script

TOKEN = "att_1767225600.0123456789abcdef0123456789abcdef01234567"
# The agent the test API serves: it records the environment the boot script gave it.
AGENT = (
    "import json, os\n"
    "env = {k: v for k, v in os.environ.items() if k.startswith('BROKER_')}\n"
    "with open(os.path.join(os.environ['BROKER_INSTANCE_DIR'], 'env.json'), 'w') as out:\n"
    "    json.dump(env, out)\n"
    "print('agent ran')\n"
)


@pytest.fixture
def api() -> Iterator[tuple[str, list[dict[str, str]]]]:
    """A broker API stand-in serving AGENT to the right token; yields its URL and requests."""
    seen: list[dict[str, str]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            seen.append({"path": self.path, "auth": self.headers.get("Authorization", "")})
            ok = self.path == "/v1/agent?attempt=att_boot" and seen[-1]["auth"] == f"Bearer {TOKEN}"
            body = AGENT.encode() if ok else b'{"detail": "not found"}'
            self.send_response(200 if ok else 404)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}", seen
    server.shutdown()
    server.server_close()


def _tools(folder: Path, *names: str) -> Path:
    """A PATH folder with only these commands (python3 is this interpreter) and a
    ``shutdown`` that records its arguments instead of powering anything off."""
    folder.mkdir()
    for name in names:
        target = sys.executable if name == "python3" else shutil.which(name)
        assert target, name
        (folder / name).symlink_to(target)
    recorder = folder / "shutdown"
    recorder.write_text(f'#!/bin/bash\necho "$@" >> "{folder}/shutdown.calls"\n')
    recorder.chmod(0o755)
    return folder


def _boot(script: str, instance: Path, path: Path, local: bool) -> subprocess.CompletedProcess:
    env = {"PATH": str(path), "HOME": str(instance), "BROKER_INSTANCE_DIR": str(instance)}
    if local:
        env["BROKER_LOCAL_INSTANCE"] = "1"
    bash = shutil.which("bash")
    assert bash
    return subprocess.run([bash, "-c", script], env=env, timeout=60, capture_output=True)


@pytest.mark.parametrize("provider", ["aws", "gcp"])
def test_the_script_exports_the_attempt_and_fetches_its_agent_with_the_token(
    provider: str, tmp_path: Path
) -> None:
    script = boot_script("https://broker.example.com/", "att_42", TOKEN, provider)
    lines = script.splitlines()
    assert lines[0] == "#!/bin/bash"
    assert "export BROKER_API_URL=https://broker.example.com" in lines
    assert "export BROKER_ATTEMPT_ID=att_42" in lines
    assert f"export BROKER_AGENT_TOKEN={TOKEN}" in lines
    assert f"export BROKER_PROVIDER={provider}" in lines
    assert 'dir="${BROKER_INSTANCE_DIR:-/opt/broker}"' in lines
    assert 'url="$BROKER_API_URL/v1/agent?attempt=$BROKER_ATTEMPT_ID"' in lines
    assert "printf 'Authorization: Bearer %s\\n' \"$BROKER_AGENT_TOKEN\" |" in script
    assert "--retry-connrefused" in script and "urllib.request" in script
    assert '  python3 "$dir/agent.py" >>"$dir/agent.log" 2>&1' in lines
    assert 'if [ -z "${BROKER_LOCAL_INSTANCE:-}" ]; then' in lines
    assert "  shutdown -h now || poweroff" in lines
    assert "set -x" not in script and script.count(TOKEN) == 1  # only in its export
    path = tmp_path / "boot.sh"
    path.write_text(script)
    assert subprocess.run(["bash", "-n", str(path)], capture_output=True).returncode == 0


def test_values_are_shell_quoted() -> None:
    hostile = "x'; touch /tmp/pwned; echo '$(id)` \"\n"
    script = boot_script("http://h/a b", "att_1", hostile, "aws")
    exports = script.split('dir="')[0]  # the exports (a quoted newline spans lines)
    shown = subprocess.run(
        ["bash", "-c", exports + '\nprintf %s "$BROKER_AGENT_TOKEN|$BROKER_API_URL"'],
        capture_output=True,
        text=True,
        check=True,
    )
    assert shown.stdout == hostile + "|http://h/a b"


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="provider"):
        boot_script("http://h", "att_1", TOKEN, "azure")
    with pytest.raises(ValueError, match="token"):
        boot_script("http://h", "att_1", "", "gcp")


@pytest.mark.parametrize("tools", [("curl", "mkdir"), ("mkdir",)], ids=["curl", "python"])
def test_a_local_instance_fetches_and_runs_the_agent_and_stays_up(
    tools: tuple[str, ...], api: tuple[str, list[dict[str, str]]], tmp_path: Path
) -> None:
    if "curl" in tools and shutil.which("curl") is None:
        pytest.skip("no curl on this machine")
    url, seen = api
    instance = tmp_path / "instance"
    path = _tools(tmp_path / "bin", "python3", *tools)
    done = _boot(boot_script(url, "att_boot", TOKEN, "gcp"), instance, path, local=True)
    assert done.returncode == 0, done.stderr
    assert seen == [{"path": "/v1/agent?attempt=att_boot", "auth": f"Bearer {TOKEN}"}]
    assert (instance / "agent.py").read_text() == AGENT
    assert "agent ran" in (instance / "agent.log").read_text()
    env = json.loads((instance / "env.json").read_text())
    assert env["BROKER_ATTEMPT_ID"] == "att_boot"
    assert env["BROKER_AGENT_TOKEN"] == TOKEN
    assert env["BROKER_PROVIDER"] == "gcp"
    assert env["BROKER_API_URL"] == url
    assert not (path / "shutdown.calls").exists()
    assert TOKEN not in done.stdout.decode() + done.stderr.decode()


def test_a_real_instance_powers_off_even_when_its_agent_is_refused(
    api: tuple[str, list[dict[str, str]]], tmp_path: Path
) -> None:
    url, seen = api
    instance = tmp_path / "instance"
    path = _tools(tmp_path / "bin", "python3", "mkdir", *(["curl"] if shutil.which("curl") else []))
    done = _boot(boot_script(url, "att_other", TOKEN, "aws"), instance, path, local=False)
    assert done.returncode == 0, done.stderr
    assert len(seen) == 1  # a refusal (404) is not retried
    assert not (instance / "agent.py").exists()
    assert "could not fetch the agent" in (instance / "agent.log").read_text()
    assert (path / "shutdown.calls").read_text() == "-h now\n"
    assert os.stat(instance).st_mode  # the instance folder was made
