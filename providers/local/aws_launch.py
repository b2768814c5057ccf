"""What a RunInstances asks of the local AWS: the instance type's GPUs, the boot script in
its user data, the instance tags."""

from __future__ import annotations

import base64
import binascii
import csv
import gzip
import re
from functools import lru_cache
from typing import Any

from pricing.traces import bundled_trace_dir

_TAG_KEY = re.compile(r"TagSpecification\.(\d+)\.Tag\.(\d+)\.Key")


@lru_cache
def _catalog_gpus() -> dict[str, tuple[str, int]]:
    path = bundled_trace_dir().parent / "aws-gpu-vms.csv"
    with path.open(newline="") as handle:
        return {
            row["InstanceType"]: (row["AcceleratorName"], int(float(row["AcceleratorCount"] or 0)))
            for row in csv.DictReader(handle)
        }


def _moto_gpus(instance_type: str) -> dict[str, Any]:
    from moto.ec2.models.instance_types import INSTANCE_TYPES

    gpus = (INSTANCE_TYPES.get(instance_type, {}).get("GpuInfo") or {}).get("Gpus") or [{}]
    return dict(gpus[0])


def gpu_of_instance_type(instance_type: str) -> str:
    """The GPU name of an EC2 instance type (``p3.2xlarge`` -> ``V100``), or "" if none."""
    if instance_type in _catalog_gpus():
        return _catalog_gpus()[instance_type][0]
    return str(_moto_gpus(instance_type).get("Name", ""))


def gpu_count_of_instance_type(instance_type: str) -> int:
    """How many GPUs an EC2 instance type has (``p3.8xlarge`` -> 4); 1 when unknown."""
    if instance_type in _catalog_gpus():
        return max(_catalog_gpus()[instance_type][1], 1)
    return max(int(_moto_gpus(instance_type).get("Count") or 1), 1)


def boot_script(user_data: str | None) -> str | None:
    """The shell script in a RunInstances ``UserData`` (base64, maybe gzipped), or None."""
    if not user_data:
        return None
    try:
        raw = base64.b64decode(user_data)
        if raw[:2] == b"\x1f\x8b":  # cloud-init takes gzipped user data too
            raw = gzip.decompress(raw)
        text = raw.decode("utf-8")
    except (binascii.Error, OSError, EOFError, UnicodeDecodeError):
        return None
    return text if text.startswith("#!") else None


def request_tags(params: dict[str, str]) -> dict[str, str]:
    """The instance tags of a RunInstances request's ``TagSpecification`` params."""
    tags = {}
    for name, key in params.items():
        match = _TAG_KEY.fullmatch(name)
        spec = match and params.get(f"TagSpecification.{match[1]}.ResourceType", "instance")
        if match and spec == "instance":
            tags[key] = params.get(f"TagSpecification.{match[1]}.Tag.{match[2]}.Value", "")
    return tags
