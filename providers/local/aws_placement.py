"""EC2 placement groups for the local AWS, which moto lacks: CreatePlacementGroup,
DescribePlacementGroups, and RunInstances into a group (refused for a group that does not
exist, as EC2 refuses it). A gang's nodes launch into one cluster group."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from xml.sax.saxutils import escape

StartResponse = Callable[..., Any]
Answer = Callable[[StartResponse, str, str, str], list[bytes]]  # ec2_error's shape
_NS = "http://ec2.amazonaws.com/doc/2016-11-15/"
STRATEGIES = ("cluster", "spread", "partition")


@dataclass(frozen=True)
class PlacementGroup:
    """One placement group of one region."""

    group_id: str
    name: str
    strategy: str


class PlacementGroups:
    """The placement groups of every region of the local AWS, by (region, name)."""

    def __init__(self) -> None:
        self.groups: dict[tuple[str, str], PlacementGroup] = {}
        self._lock = threading.Lock()

    def handle(
        self,
        params: dict[str, str],
        region: str,
        start_response: StartResponse,
        error: Answer,
    ) -> list[bytes] | None:
        """Answer a placement group action; None for any other action."""
        action = params.get("Action")
        if action == "CreatePlacementGroup":
            return self._create(params, region, start_response, error)
        if action == "DescribePlacementGroups":
            names = {v for k, v in params.items() if k.startswith("GroupName.")}
            with self._lock:
                found = [
                    g
                    for (r, n), g in self.groups.items()
                    if r == region and (not names or n in names)
                ]
            items = "".join(f"<item>{_group_xml(g)}</item>" for g in found)
            return _ok(
                start_response,
                "DescribePlacementGroupsResponse",
                f"<placementGroupSet>{items}</placementGroupSet>",
            )
        return None

    def refusal(self, params: dict[str, str], region: str) -> str | None:
        """Why a RunInstances into ``Placement.GroupName`` is refused (no such group)."""
        name = params.get("Placement.GroupName")
        if not name:
            return None
        with self._lock:
            if (region, name) in self.groups:
                return None
        return f"The Placement Group '{name}' is unknown."

    def _create(
        self,
        params: dict[str, str],
        region: str,
        start_response: StartResponse,
        error: Answer,
    ) -> list[bytes]:
        name = params.get("GroupName", "")
        strategy = params.get("Strategy", "cluster")
        if not name or strategy not in STRATEGIES:
            return error(
                start_response,
                "400 Bad Request",
                "InvalidParameterValue",
                f"a placement group needs a name and a strategy of {STRATEGIES}",
            )
        with self._lock:
            if (region, name) in self.groups:
                return error(
                    start_response,
                    "400 Bad Request",
                    "InvalidPlacementGroup.Duplicate",
                    f"The Placement Group '{name}' already exists.",
                )
            group = PlacementGroup(f"pg-{uuid.uuid4().hex[:17]}", name, strategy)
            self.groups[(region, name)] = group
        return _ok(
            start_response,
            "CreatePlacementGroupResponse",
            f"<return>true</return><placementGroup>{_group_xml(group)}</placementGroup>",
        )


def _group_xml(group: PlacementGroup) -> str:
    return (
        f"<groupName>{escape(group.name)}</groupName><groupId>{group.group_id}</groupId>"
        f"<strategy>{group.strategy}</strategy><state>available</state>"
    )


def _ok(start_response: StartResponse, root: str, inner: str) -> list[bytes]:
    body = (
        f'<?xml version="1.0" encoding="UTF-8"?>\n<{root} xmlns="{_NS}">'
        f"<requestId>{uuid.uuid4()}</requestId>{inner}</{root}>"
    ).encode()
    start_response("200 OK", [("Content-Type", "text/xml"), ("Content-Length", str(len(body)))])
    return [body]
