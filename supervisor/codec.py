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
import operator
import re
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Any, TypeVar

from google.protobuf import message_factory
from google.protobuf.message import Message

from ftsup.supervisor.core import events as ev
from ftsup.supervisor.core.directives import Directive
from ftsup.supervisor.core.grow_only import GrowOnly
from ftsup.supervisor.core.state import ClusterState, NodeRecord
from ftsup.v1 import agent_pb2, events_pb2, state_pb2

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
    decode = _EVENT_DECODERS.get(field)
    if decode is None:
        raise CodecError(f"Event kind {field!r} has no core type (a newer writer?)")
    result: ev.Event = decode(getattr(message, field))
    return result


_EVENT_DECODERS: dict[str, Callable[[Message], Any]] = {}  # filled below, once _decoder exists


# -- upcasters: values written before a field existed, given what that field would have held ------

# The words the failure detector's death verdicts begin with (policies/failure.py), which a
# death's quarantine repeated after "declared dead: " before causes were logged. Read only to
# upcast values written before the `cause` fields existed.
_DEATH_QUARANTINE_PREFIX = "declared dead: "
_LEGACY_DEATH_WORDS = (
    ("stream closed and not reopened", ev.QuarantineCause.DEAD_STREAM_LOSS),
    ("not heard from within", ev.QuarantineCause.DEAD_NEVER_HEARD),
    ("no heartbeat", ev.QuarantineCause.DEAD_SILENT),
)


def legacy_death_cause(reason: str) -> ev.QuarantineCause:
    """The kind of a death recorded without one, from the detector's fixed wording."""
    for words, cause in _LEGACY_DEATH_WORDS:
        if reason.startswith(words):
            return cause
    return ev.QuarantineCause.UNSPECIFIED


def legacy_quarantine_cause(reason: str) -> ev.QuarantineCause:
    """The cause of a quarantine recorded without one: the death kinds from their fixed wording,
    anything else stays UNSPECIFIED (nothing branches on the other causes)."""
    if reason.startswith(_DEATH_QUARANTINE_PREFIX):
        return legacy_death_cause(reason.removeprefix(_DEATH_QUARANTINE_PREFIX))
    return ev.QuarantineCause.UNSPECIFIED


def _upcast_quarantined(event: ev.NodeQuarantined) -> ev.NodeQuarantined:
    if event.cause is not ev.QuarantineCause.UNSPECIFIED:
        return event
    return dataclasses.replace(event, cause=legacy_quarantine_cause(event.reason))


def _upcast_declared_dead(event: ev.NodeDeclaredDead) -> ev.NodeDeclaredDead:
    if event.cause is not ev.QuarantineCause.UNSPECIFIED:
        return event
    return dataclasses.replace(event, cause=legacy_death_cause(event.reason))


def _upcast_node(node: NodeRecord) -> NodeRecord:
    if not node.is_quarantined or node.quarantine_cause is not ev.QuarantineCause.UNSPECIFIED:
        return node
    return dataclasses.replace(node, quarantine_cause=legacy_quarantine_cause(node.quarantine_reason))


_UPCASTS: dict[type, Callable[[Any], Any]] = {
    ev.NodeQuarantined: _upcast_quarantined, ev.NodeDeclaredDead: _upcast_declared_dead, NodeRecord: _upcast_node,
}


def record_to_proto(record: ev.Record) -> events_pb2.Record:
    return events_pb2.Record(
        seq=record.seq, term=record.term, time_unix_s=record.time_unix_s, event=event_to_proto(record.event)
    )


def record_from_proto(message: events_pb2.Record) -> ev.Record:
    return ev.Record(message.seq, message.term, message.time_unix_s, event_from_proto(message.event))


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


class DirectiveEncoder:
    """Encodes the directives of one push, each against the last one encoded of its action.

    Directives of one generation differ in a few fields (ranks, restores, buddy, grants); the
    rest (argv, env, the generation's figures) is the same object in each (core/directives.py
    builds it once per push). A directive is encoded as a copy of its template's message with
    only the fields that are not the template's own value set again: ~2x less of the leader's
    loop per directive at a 12,500-node generation start (issue 14). The result equals
    `directive_to_proto` field for field (property-tested).
    """

    __slots__ = ("_templates",)

    def __init__(self) -> None:
        self._templates: dict[object, tuple[Directive, agent_pb2.Directive]] = {}

    def encode(self, directive: Directive) -> agent_pb2.Directive:
        held = self._templates.get(directive.action)
        if held is None:
            message = directive_to_proto(directive)
            self._templates[directive.action] = (directive, message)
            return message
        template, template_message = held
        built = agent_pb2.Directive()
        built.CopyFrom(template_message)
        target = typing.cast(Message, built)  # (fields named by the dataclass, as str)
        for name in _field_names(Directive):
            value, was = getattr(directive, name), getattr(template, name)
            if value is was or (type(value) in _SCALARS and type(value) is type(was) and value == was):
                continue
            target.ClearField(name)
            try:
                _set_field(target, name, value)
            except (AttributeError, TypeError, ValueError) as exc:
                raise CodecError(f"Directive.{name}={value!r}: {exc}") from exc
        return built


def directive_from_proto(message: agent_pb2.Directive) -> Directive:
    result: Directive = from_proto(Directive, message)
    return result


def _enum_prefix(enum_cls: type[enum.Enum]) -> str:
    return _snake(enum_cls.__name__).upper() + "_"


def to_proto(obj: Any, message: Message) -> Message:
    """Copies a dataclass into `message` field by field."""
    cls: type = type(obj)  # (as `type`, not type[Any]: mypy takes only the former as Hashable for the caches)
    for name in _field_names(cls):
        value = getattr(obj, name)
        try:
            _set_field(message, name, value)
        except (AttributeError, TypeError, ValueError) as exc:
            raise CodecError(f"{type(obj).__name__}.{name}={value!r}: {exc}") from exc
    return message


# Encoding is on the hot paths too: every appended record, and every directive (12,500 of them
# when a 100k-GPU generation starts, where reflecting on each field of each nested dataclass
# stalled the loop for seconds). What reflection finds is cached per class and per enum value.
@functools.cache
def _field_names(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls) if f.init)  # init=False: derived, never stored


@functools.cache
def _is_dataclass_type(cls: type) -> bool:
    return dataclasses.is_dataclass(cls)


@functools.cache
def _enum_number(descriptor: Any, name: str, value: enum.Enum) -> int:
    enum_type = descriptor.fields_by_name[name].enum_type
    number: int = enum_type.values_by_name[_enum_prefix(type(value)) + value.name].number
    return number


def _set_field(message: Message, name: str, value: Any) -> None:
    kind: type = type(value)
    if value is None:
        message.ClearField(name)
    elif kind in _SCALARS:
        setattr(message, name, value)
    elif isinstance(value, enum.Enum):
        setattr(message, name, _enum_number(message.DESCRIPTOR, name, value))
    elif isinstance(value, Mapping):
        target = getattr(message, name)
        if value:
            _add_items(message, name, [value[key] for key in sorted(value)])
    elif isinstance(value, tuple | GrowOnly):
        target = getattr(message, name)
        first: type = type(value[0]) if value else type(None)
        if value and _is_dataclass_type(first):
            _add_items(message, name, value)
        else:
            target.extend(value)
    elif _is_dataclass_type(kind):
        to_proto(value, getattr(message, name))
    else:
        setattr(message, name, value)


_SCALARS = frozenset({str, int, float, bool, bytes})


def _add_items(message: Message, name: str, items: Sequence[Any]) -> None:
    """Appends one message per dataclass in `items` to the repeated field `name` of `message`.

    The big events are long lists of small flat items (a 12,500-node GenerationStarted holds
    12,500 RankAssignments and 100,000 RankRestores). Setting each item's fields one attribute
    at a time cost ~8 us per item, ~0.9 s per such event on the leader's loop; a flat item
    class gets an adder compiled once that builds each item in one `add(**fields)` call inside
    the protobuf runtime. Items with nested messages take the field-by-field path.
    """
    target = getattr(message, name)
    item_type = message.DESCRIPTOR.fields_by_name[name].message_type
    assert item_type is not None, f"{name} is not a repeated message field"
    item_class: type = type(items[0])
    add = _flat_adder(item_class, item_type)
    if add is None:
        for item in items:
            to_proto(item, target.add())
        return
    append = target.add
    try:
        for item in items:
            add(append, item)
    except (AttributeError, TypeError, ValueError, KeyError) as exc:
        # Name the item and field, as the field-by-field path does (it raises CodecError).
        index = len(target)
        item_descriptor: Any = item_type  # (the stubs' two Descriptor classes are one at runtime)
        to_proto(items[index], message_factory.GetMessageClass(item_descriptor)())
        raise CodecError(f"{type(items[index]).__name__} #{index} of {name}: {exc!r}") from exc


@functools.cache
def _flat_adder(cls: type, descriptor: Any) -> Callable[[Any, Any], Any] | None:
    """`(add, item) -> message` for a dataclass whose fields are all scalars, enums, optionals
    of those or tuples of scalars; None when a field needs a nested message."""
    hints = typing.get_type_hints(cls)
    arguments = []
    tables: dict[str, dict[Any, int | None]] = {}
    for field in dataclasses.fields(cls):
        hint = hints[field.name]
        is_optional = False
        if typing.get_origin(hint) in (types.UnionType, typing.Union):
            inner = [a for a in typing.get_args(hint) if a is not type(None)]
            if len(inner) != 1:
                return None
            hint, is_optional = inner[0], True
        if isinstance(hint, type) and issubclass(hint, enum.Enum):
            # Every member's number up front, keyed by name (an Enum's own __hash__ is a Python
            # call: a sixth of the time); None stays None, an unset optional.
            enum_type = descriptor.fields_by_name[field.name].enum_type
            table: dict[Any, int | None] = {}
            for member in hint:
                value = enum_type.values_by_name.get(_enum_prefix(hint) + member.name)
                if value is not None:
                    table[member.name] = value.number
            tables[f"t_{field.name}"] = table
            lookup = f"t_{field.name}[item.{field.name}._name_]"
            if is_optional:
                lookup = f"(None if item.{field.name} is None else {lookup})"
            arguments.append(f"{field.name}={lookup}")
        elif hint in _SCALARS or (typing.get_origin(hint) is tuple and typing.get_args(hint)[0] in _SCALARS):
            # A None handed to add() leaves an optional field unset, as ClearField does.
            arguments.append(f"{field.name}=item.{field.name}")
        else:
            return None
    source = f"lambda add, item: add({', '.join(arguments)})"
    adder: Callable[[Any, Any], Any] = eval(source, tables)
    return adder


def from_proto(cls: type[T], message: Message) -> T:
    """Builds dataclass `cls` from `message`, converting by the dataclass's type hints."""
    key: type = cls
    result: T = _decoder(key)(message)
    return result


# Decoding is on the replay path (a million records at start-up), so each dataclass gets a
# decoder compiled once from its type hints: a list of per-field getters, no reflection per call.
FieldDecoder = Callable[[Message], Any]


@functools.cache
def _decoder(cls: type) -> Callable[[Message], Any]:
    hints = typing.get_type_hints(cls)
    getters = [_field_decoder(cls, f.name, hints[f.name]) for f in dataclasses.fields(cls) if f.init]
    # One straight-line call per class (as dataclasses itself generates __init__): no loop or
    # temporary list per decoded message.
    names = [f"get{i}" for i in range(len(getters))]
    source = f"lambda message: cls({', '.join(f'{n}(message)' for n in names)})"
    decode: Callable[[Message], Any] = eval(source, {"cls": cls, **dict(zip(names, getters))})
    upcast = _UPCASTS.get(cls)
    if upcast is not None:
        plain = decode
        return lambda message: upcast(plain(message))
    return decode


def _field_decoder(cls: type, name: str, hint: Any) -> FieldDecoder:
    origin = typing.get_origin(hint)
    if origin in (types.UnionType, typing.Union):
        inner = _value_decoder(cls, name, next(a for a in typing.get_args(hint) if a is not type(None)))
        return lambda message: inner(getattr(message, name)) if message.HasField(name) else None
    if origin is tuple:
        item = _value_decoder(cls, name, typing.get_args(hint)[0])
        if item is _identity:
            return lambda message: tuple(getattr(message, name))
        return lambda message: tuple(map(item, getattr(message, name)))
    if origin is GrowOnly:  # a repeated field, as a tuple's
        item = _value_decoder(cls, name, typing.get_args(hint)[0])
        return lambda message: GrowOnly(map(item, getattr(message, name)))
    if origin is Mapping:
        # Mappings are stored as repeated messages keyed by their item's first field.
        item_cls = typing.get_args(hint)[1]
        key = operator.attrgetter(dataclasses.fields(item_cls)[0].name)
        decode_item = _decoder(item_cls)
        return lambda message: MappingProxyType(
            {key(item): item for item in map(decode_item, getattr(message, name))}
        )
    value = _value_decoder(cls, name, hint)
    get = operator.attrgetter(name)
    return get if value is _identity else lambda message: value(get(message))


def _identity(value: Any) -> Any:
    return value


def _value_decoder(cls: type, name: str, hint: Any) -> Callable[[Any], Any]:
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return _enum_decoder(cls, name, hint)
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):  # a class, not an instance
        return _decoder(hint)
    return _identity


def _enum_decoder(cls: type, name: str, enum_cls: type[enum.Enum]) -> Callable[[int], enum.Enum]:
    """Maps proto enum numbers to members; the table is built from the first message seen."""
    table: dict[int, enum.Enum] = {}
    prefix = _enum_prefix(enum_cls)

    def decode(number: int) -> enum.Enum:
        member = table.get(number)
        if member is None:
            raise CodecError(f"{cls.__name__}.{name}: enum value {number} has no core {enum_cls.__name__}")
        return member

    for descriptor in _enum_descriptors(enum_cls):
        for value in descriptor.values:
            member_name = value.name.removeprefix(prefix)
            if value.name.startswith(prefix) and member_name in enum_cls.__members__:
                table[value.number] = enum_cls[member_name]
    return decode


@functools.cache
def _enum_descriptors(enum_cls: type[enum.Enum]) -> list[Any]:
    """The proto enums whose values carry this core enum's prefix, across the ftsup.v1 files."""
    prefix = _enum_prefix(enum_cls)
    found = []
    for module in (events_pb2, state_pb2, agent_pb2):
        for descriptor in module.DESCRIPTOR.enum_types_by_name.values():
            if descriptor.values and descriptor.values[0].name.startswith(prefix):
                found.append(descriptor)
    if not found:
        raise CodecError(f"no proto enum for core enum {enum_cls.__name__} (prefix {prefix})")
    return found


_EVENT_DECODERS.update({field: _decoder(cls) for field, cls in _EVENT_CLASS.items()})
