"""A field added to the content types, for test_ray_serve.py's tagged deployment; a Ray replica or front door
imports it by name when its application names these types (``content_type_names`` where it was built). Each
content made or received writes a line to the file that ``TAGGED_CONTENT_LOG`` names: which content, its ``tag``
(made once per content: "pid of its maker:serial"), and the process that holds it."""
from __future__ import annotations

import itertools
import os
from dataclasses import dataclass, field

from triton_serve.worker import RequestContent, ResponseContent

_serials = itertools.count(1)


def _new_tag() -> str:
    return f"{os.getpid()}:{next(_serials)}"


def _note(kind: str, tag: str) -> None:
    path = os.environ.get("TAGGED_CONTENT_LOG")
    if path:
        with open(path, "a") as notes:
            notes.write(f"{kind} {tag} {os.getpid()}\n")


@dataclass(frozen=True, slots=True)
class TaggedRequest(RequestContent):
    tag: str = field(default_factory=_new_tag)

    def __post_init__(self) -> None:
        _note("request", self.tag)


@dataclass(frozen=True, slots=True)
class TaggedResponse(ResponseContent):
    tag: str = field(default_factory=_new_tag)

    def __post_init__(self) -> None:
        _note("response", self.tag)
