"""The boot script every broker instance starts with (EC2 user data, GCE ``startup-script``).

It exports where and who the attempt is, fetches the agent from the broker's API, runs it,
and then powers the machine off: EC2 instances terminate on shutdown, and a GCE instance
stops billing for its machine, so a lost or finished agent never leaves an instance running.
On the local clouds (``BROKER_LOCAL_INSTANCE`` set) the machine is a process group that the
fake cloud kills, so the power-off is skipped. The token is only ever expanded, never echoed.
"""

from __future__ import annotations

import re
import shlex

PROVIDERS = ("aws", "gcp")

_FETCH = r"""
fetch() {
  if command -v curl >/dev/null 2>&1; then
    printf 'Authorization: Bearer %s\n' "$BROKER_AGENT_TOKEN" |
      curl -fsS --retry 20 --retry-delay 3 --retry-connrefused --connect-timeout 10 \
        --max-time 120 -H @- -o "$dir/agent.py" "$url"
  else
    python3 - "$url" "$dir/agent.py" <<'PY'
import os, sys, time, urllib.error, urllib.request
token = os.environ["BROKER_AGENT_TOKEN"]
request = urllib.request.Request(sys.argv[1], headers={"Authorization": "Bearer " + token})
for _ in range(20):
    try:
        with urllib.request.urlopen(request, timeout=60) as reply:
            body = reply.read()
        break
    except urllib.error.HTTPError as error:
        if error.code < 500 and error.code != 429:
            sys.exit("broker: agent fetch refused: HTTP %d" % error.code)
    except OSError:
        pass
    time.sleep(3)
else:
    sys.exit("broker: could not reach the broker API")
with open(sys.argv[2], "wb") as out:
    out.write(body)
PY
  fi
}
"""

_RUN = """
mkdir -p "$dir"
if fetch >>"$dir/agent.log" 2>&1; then
  python3 "$dir/agent.py" >>"$dir/agent.log" 2>&1
else
  echo "broker: could not fetch the agent from $url" >>"$dir/agent.log"
fi

# The backstop: whatever happened above, the machine stops costing money.
if [ -z "${BROKER_LOCAL_INSTANCE:-}" ]; then
  shutdown -h now || poweroff
fi
"""


def boot_script(
    api_url: str, attempt_id: str, token: str, provider: str, node_rank: int = 0
) -> str:
    """The bash script an instance of ``attempt_id`` boots with (protocol section 4);
    ``node_rank`` is the instance's rank in a gang (0: the only node, or the master)."""
    if provider not in PROVIDERS:
        raise ValueError(f"provider must be one of {PROVIDERS}, not {provider!r}")
    if not (api_url and attempt_id and token):
        raise ValueError("boot_script needs an API URL, an attempt id and a token")
    exports = {
        "BROKER_API_URL": api_url.rstrip("/"),
        "BROKER_ATTEMPT_ID": attempt_id,
        "BROKER_AGENT_TOKEN": token,
        "BROKER_PROVIDER": provider,
        "BROKER_NODE_RANK": str(int(node_rank)),
    }
    lines = [
        "#!/bin/bash",
        "# GPU broker instance: fetch this attempt's agent, run it, power off.",
        *(f"export {name}={shlex.quote(value)}" for name, value in exports.items()),
        'dir="${BROKER_INSTANCE_DIR:-/opt/broker}"',
        'url="$BROKER_API_URL/v1/agent?attempt=$BROKER_ATTEMPT_ID"',
    ]
    return "\n".join(lines) + "\n" + _FETCH + _RUN


_EXPORT = re.compile(r"^[ \t]*(?:export[ \t]+)?(BROKER_[A-Z0-9_]+)=(.*)$", re.MULTILINE)


def script_exports(script: str) -> dict[str, str]:
    """The ``BROKER_*`` variables a boot script sets to literal values."""
    found: dict[str, str] = {}
    for match in _EXPORT.finditer(script):
        try:
            words = shlex.split(match[2], comments=True)
        except ValueError:
            continue
        if words and "$" not in match[2]:
            found[match[1]] = words[0]
    return found
