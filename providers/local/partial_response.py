"""Google's partial-response field selection (the ``fields`` system parameter, also sent as
the ``X-Goog-FieldMask`` header), applied to a JSON document.

Syntax, as Compute Engine's "Improve performance" page states it: ``a,b`` selects several
fields, ``a/b`` a field inside another (``.`` is accepted as well), ``a(b,c)`` several
fields inside one, and ``*`` every field (or map key) at its level, as in
``nextPageToken,items/*/instances(name,status)`` for an aggregated list. A list is walked
element by element: a selection under it applies to each element. A name the document lacks
selects nothing; a value, map or list element left with nothing selected is dropped.
"""

from __future__ import annotations

from typing import Any

# A parsed selection: field name (or "*") to its sub-selection, ALL for a whole value.
Selection = dict[str, Any]
ALL: Any = type("All", (), {"__repr__": lambda self: "ALL"})()
_MISSING = object()


def parse_fields(text: str) -> Selection:
    """The selection tree of a ``fields`` expression; ValueError if it is malformed."""
    parser = _Parser(text)
    selection = parser.selection_list()
    if parser.pos != len(text):
        raise ValueError(f"invalid field selection {text!r} at {parser.pos}")
    return selection


def project(document: Any, fields: str | Selection | None) -> Any:
    """``document`` reduced to the ``fields`` selection; all of it when ``fields`` is empty."""
    if fields is None or (isinstance(fields, str) and not fields.strip()):
        return document
    selection = parse_fields(fields) if isinstance(fields, str) else fields
    found = _project(document, selection)
    return {} if found is _MISSING else found


def _project(value: Any, selection: Selection) -> Any:
    if selection is ALL:
        return value
    if isinstance(value, list):
        kept = [_project(element, selection) for element in value]
        kept = [element for element in kept if element is not _MISSING]
        return kept if kept else _MISSING
    if not isinstance(value, dict):
        return _MISSING  # a scalar has no fields to select
    wildcard = selection.get("*")
    out: dict[str, Any] = {}
    for key, item in value.items():
        sub = selection.get(key)
        if wildcard is not None:
            sub = wildcard if sub is None else _merge(sub, wildcard)
        if sub is None:
            continue
        found = _project(item, sub)
        if found is not _MISSING:
            out[key] = found
    return out if out else _MISSING


def _merge(a: Selection, b: Selection) -> Selection:
    """The union of two selections (a whole value absorbs any sub-selection)."""
    if a is ALL or b is ALL:
        return ALL
    merged = dict(a)
    for key, sub in b.items():
        merged[key] = sub if key not in merged else _merge(merged[key], sub)
    return merged


class _Parser:
    """Recursive descent over ``list := item (',' item)*``, ``item := path ['(' list ')']``,
    ``path := name ('/' name)*``."""

    def __init__(self, text: str) -> None:
        self.text, self.pos = text, 0

    def selection_list(self) -> Selection:
        selection = self.item()
        while self._peek() == ",":
            self.pos += 1
            selection = _merge(selection, self.item())
        return selection

    def item(self) -> Selection:
        path = [self.name()]
        while self._peek() in ("/", "."):
            self.pos += 1
            path.append(self.name())
        leaf = ALL
        if self._peek() == "(":
            self.pos += 1
            leaf = self.selection_list()
            if self._peek() != ")":
                raise ValueError(f"invalid field selection {self.text!r}: missing ')'")
            self.pos += 1
        for name in reversed(path):
            leaf = {name: leaf}
        return leaf

    def name(self) -> str:
        start = self.pos
        while self.pos < len(self.text) and self.text[self.pos] not in ",/.()":
            self.pos += 1
        name = self.text[start : self.pos].strip()
        if not name:
            raise ValueError(f"invalid field selection {self.text!r}: empty name at {start}")
        return name

    def _peek(self) -> str:
        while self.pos < len(self.text) and self.text[self.pos].isspace():
            self.pos += 1
        return self.text[self.pos] if self.pos < len(self.text) else ""
