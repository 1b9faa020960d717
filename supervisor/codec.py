"""Core dataclasses <-> ftsup.v1 protobuf messages: the one place both worlds meet.

Mapping is by name: a core dataclass maps to the proto message of the same name and copies its
fields by name; an enum member `X` of class `FooBar` maps to the proto value `FOO_BAR_X`;
`int | None` maps to a proto3 `optional` field; tuples map to repeated fields. A property test
round-trips every event kind, so adding an event without its proto message fails the tests.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import re
import types
import typing
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, TypeVar

from google.protobuf.message import Message

from ftsup.v1 import agent_pb2, events_pb2, state_pb2
from supervisor.core import events as ev
from supervisor.core.directives import Directive
from supervisor.core.state import ClusterState

T = TypeVar("T")


class CodecError(ValueError):
    """A message could not be mapped; the text names the message and field."""


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


_EVENT_FIELD: dict[type, str] = {cls: _snake(cls.__name__) for cls in ev.EVENT_TYPES}
_EVENT_CLASS: dict[str, type] = {field: cls for cls, field in _EVENT_FIELD.items()}


def event_to_proto(event: ev.Event) -> events_pb2.Event:
    message = events_pb2.Event()
    field = _EVENT_FIELD.get(type(event))
    if field is None:
        raise CodecError(f"no proto mapping for event type {type(event).__name__}")
    to_proto(event, getattr(message, field))
    return message


def event_from_proto(message: events_pb2.Event) -> ev.Event:
    field = message.WhichOneof("kind")
    if field is None:
        raise CodecError("Event has no kind set")
    cls = _EVENT_CLASS.get(field)
    if cls is None:
        raise CodecError(f"Event kind {field!r} has no core type (a newer writer?)")
    result: ev.Event = from_proto(cls, getattr(message, field))
    return result


def record_to_proto(record: ev.Record) -> events_pb2.Record:
    return events_pb2.Record(
        seq=record.seq, term=record.term, time_unix_s=record.time_unix_s, event=event_to_proto(record.event)
    )


def record_from_proto(message: events_pb2.Record) -> ev.Record:
    return ev.Record(
        seq=message.seq, term=message.term, time_unix_s=message.time_unix_s, event=event_from_proto(message.event)
    )


def state_to_proto(state: ClusterState) -> state_pb2.ClusterState:
    message = state_pb2.ClusterState()
    to_proto(state, message)
    return message


def state_from_proto(message: state_pb2.ClusterState) -> ClusterState:
    result: ClusterState = from_proto(ClusterState, message)
    return result


def directive_to_proto(directive: Directive) -> agent_pb2.Directive:
    message = agent_pb2.Directive()
    to_proto(directive, message)
    return message


def directive_from_proto(message: agent_pb2.Directive) -> Directive:
    result: Directive = from_proto(Directive, message)
    return result


def _enum_prefix(enum_cls: type[enum.Enum]) -> str:
    return _snake(enum_cls.__name__).upper() + "_"


def to_proto(obj: Any, message: Message) -> Message:
    """Copies a dataclass into `message` field by field."""
    for field in dataclasses.fields(obj):
        value = getattr(obj, field.name)
        try:
            _set_field(message, field.name, value)
        except (AttributeError, TypeError, ValueError) as exc:
            raise CodecError(f"{type(obj).__name__}.{field.name}={value!r}: {exc}") from exc
    return message


def _set_field(message: Message, name: str, value: Any) -> None:
    if value is None:
        message.ClearField(name)
    elif isinstance(value, enum.Enum):
        enum_type = message.DESCRIPTOR.fields_by_name[name].enum_type
        setattr(message, name, enum_type.values_by_name[_enum_prefix(type(value)) + value.name].number)
    elif isinstance(value, Mapping):
        target = getattr(message, name)
        for key in sorted(value):
            to_proto(value[key], target.add())
    elif isinstance(value, tuple):
        target = getattr(message, name)
        for item in value:
            if dataclasses.is_dataclass(item):
                to_proto(item, target.add())
            else:
                target.append(item)
    elif dataclasses.is_dataclass(value):
        to_proto(value, getattr(message, name))
    else:
        setattr(message, name, value)


def from_proto(cls: type[T], message: Message) -> T:
    """Builds dataclass `cls` from `message`, converting by the dataclass's type hints."""
    kwargs = {name: _get_field(message, name, hint) for name, hint in _hints(cls).items()}
    return cls(**kwargs)


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def _get_field(message: Message, name: str, hint: Any) -> Any:
    origin = typing.get_origin(hint)
    if origin in (types.UnionType, typing.Union):
        inner = [a for a in typing.get_args(hint) if a is not type(None)]
        if not message.HasField(name):
            return None
        return _convert(getattr(message, name), inner[0], message, name)
    if origin is tuple:
        item_hint = typing.get_args(hint)[0]
        return tuple(_convert_item(item, item_hint) for item in getattr(message, name))
    if origin is Mapping:
        # Mappings are stored as repeated messages keyed by their item's first field.
        item_cls = typing.get_args(hint)[1]
        key_field = dataclasses.fields(item_cls)[0].name
        items = (from_proto(item_cls, item) for item in getattr(message, name))
        return MappingProxyType({getattr(item, key_field): item for item in items})
    return _convert(getattr(message, name), hint, message, name)


def _convert(value: Any, hint: Any, message: Message, name: str) -> Any:
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        enum_type = message.DESCRIPTOR.fields_by_name[name].enum_type
        proto_name = enum_type.values_by_number[value].name
        member = proto_name.removeprefix(_enum_prefix(hint))
        if member not in hint.__members__:
            raise CodecError(f"{message.DESCRIPTOR.name}.{name}: {proto_name} has no core value")
        return hint[member]
    if dataclasses.is_dataclass(hint):
        return from_proto(hint, value)
    return value


def _convert_item(item: Any, hint: Any) -> Any:
    if dataclasses.is_dataclass(hint):
        return from_proto(hint, item)
    return item
