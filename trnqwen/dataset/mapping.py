"""A dataset's own column, key and role names mapped onto trnqwen's record shapes, record by record.

Real sets name things their own way (``conversations`` with ``from``/``value`` turns and
``human``/``gpt``/``bot`` roles, ``question``/``answer`` columns).  A :class:`Mapping` (declared
with axolotl's key names in :mod:`trnqwen.dataset.settings`) rewrites each record before its
format is detected, so :mod:`trnqwen.dataset.formats` and
:mod:`trnqwen.dataset.preference_formats` only ever see standard records:

1. ``remove_columns`` are dropped (a record without one is fine: nothing to drop);
2. each ``field_<name> = "column"`` moves that column to the standard field (``field_messages``
   to ``messages``, ``field_instruction`` to ``instruction``...); a record without the column is
   refused, naming the record and the columns it has;
3. with ``field_messages``, ``message_property_mappings`` or ``roles``, every message of the conversation (and of
   ``chosen``/``rejected`` lists) gets its ``role`` and ``content`` from the mapped keys and its
   role name mapped (``human`` -> ``user``); a message without a mapped key, or with a role name
   the mapping does not know, is refused with the record and the message named.  The conversation
   is then a ``messages`` record (read from ``field_messages``, ``messages`` when unset, as axolotl).

Nothing is guessed: a mapping that names what is not there stops the run before anything is
tokenized.  The mapping is part of the cache key (:meth:`Mapping.key_text`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Optional

from trnqwen.dataset.settings import FIELD_TARGETS, MAPPING_KEYS, ROLE_NAMES
from trnqwen.errors import UsageError

_MESSAGE_LISTS = ("messages", "chosen", "rejected", "prompt")  # fields that may hold a list of messages
_SHOWN = 8


@dataclass(frozen=True)
class Mapping:
    """One dataset's mapping (see the module rules); build it with :func:`mapping_from`."""

    columns: tuple[tuple[str, str], ...] = ()  # (setting name, column) of each field_<name>
    properties: tuple[tuple[str, str], ...] = ()  # (role|content, key in each message)
    roles: tuple[tuple[str, str], ...] = ()  # (name in the data, trnqwen's role)
    remove: tuple[str, ...] = ()
    rewrites_messages: bool = field(default=False)

    def describe(self) -> list[str]:
        """What the mapping does, one line each (``trnqwen data`` shows them)."""
        lines = [f"{FIELD_TARGETS[name]} <- column {column!r} ({name})" for name, column in self.columns]
        if self.rewrites_messages:
            props = dict(self.properties)
            lines.append("each message: " + ", ".join(f"{p} <- {props.get(p, p)!r}" for p in ("role", "content")))
        if self.roles:
            lines.append("roles: " + ", ".join(f"{name} -> {role}" for name, role in self.roles))
        if self.remove:
            lines.append("dropped columns: " + ", ".join(self.remove))
        return lines

    def key_text(self) -> str:
        """Canonical text of the mapping, hashed into the cache key."""
        return json.dumps({"columns": self.columns, "properties": self.properties, "roles": sorted(self.roles),
                           "remove": sorted(self.remove)}, sort_keys=True)

    def apply(self, data: object, where: str) -> object:
        """``data`` (one record) as a standard record; a UsageError naming ``where`` if it cannot be."""
        if not isinstance(data, dict):
            return data  # the format reader names a record that is not an object
        out = {k: v for k, v in data.items() if k not in self.remove}
        moved = {}
        for name, column in self.columns:
            if column not in data:
                raise UsageError(
                    f"{where}: no column {column!r}, which {name} = {column!r} names (the record has: {_names(data)})",
                    hint=f"fix {name} (flag --{name.replace('_', '-')}, or the dataset's table), or that record",
                )
            moved[FIELD_TARGETS[name]] = data[column]
        for name, column in self.columns:
            if column not in moved:
                out.pop(column, None)
        out.update(moved)
        if self.rewrites_messages:
            if "messages" not in out:
                raise UsageError(
                    f"{where}: no column 'messages' for the message mapping (the record has: {_names(data)})",
                    hint="name the conversation's column with field_messages (--field-messages conversations)",
                )
            for key in _MESSAGE_LISTS:
                if isinstance(out.get(key), list):
                    out[key] = [self._message(m, where, key, i) for i, m in enumerate(out[key], start=1)]
        return out

    def _message(self, message: object, where: str, key: str, i: int) -> object:
        if not isinstance(message, dict):
            return message  # the format reader names it
        props = dict(self.properties)
        out = {k: v for k, v in message.items() if k not in props.values()}
        for prop in ("role", "content"):
            source = props.get(prop, prop)
            if source not in message:
                raise UsageError(
                    f"{where}: {key} message {i} has no {source!r}, which message_property_mappings {prop} = "
                    f"{source!r} names (it has: {_names(message)})",
                    hint="fix message_property_mappings (--message-property-mappings role=KEY,content=KEY) or that record",
                )
            out[prop] = message[source]
        out["role"] = self._role(out["role"], where, key, i)
        return out

    def _role(self, name: object, where: str, key: str, i: int) -> object:
        roles = dict(self.roles)
        if name in roles:
            return roles[name]
        if name in ROLE_NAMES or not self.roles:
            return name
        known = ", ".join(f"{n} -> {r}" for n, r in self.roles)
        raise UsageError(
            f"{where}: {key} message {i} has role {name!r}, which the roles mapping does not name ({known})",
            hint=f"add it to roles (--roles assistant={name}, or roles = {{ assistant = [{name!r}] }} in the table)",
        )


def _names(data: dict[str, Any]) -> str:
    names = [str(k) for k in data]
    more = f", ... ({len(names)} in all)" if len(names) > _SHOWN else ""
    return ", ".join(names[:_SHOWN]) + more if names else "none"


def mapping_from(values: object) -> Optional[Mapping]:
    """The mapping an object or dict of settings describes (RunConfig, a ``[[datasets]]`` table,
    DataSettings.mapping), or None when it sets nothing."""
    get = values.get if isinstance(values, dict) else (lambda name: getattr(values, name, None))
    given = {name: get(name) for name in MAPPING_KEYS if get(name) not in (None, [], {})}
    if not given:
        return None
    properties = tuple(sorted((given.get("message_property_mappings") or {}).items()))
    roles = tuple((name, role) for role, names in (given.get("roles") or {}).items() for name in names)
    seen: dict[str, str] = {}
    for name, role in roles:
        if seen.setdefault(name, role) != role:
            raise UsageError(f"roles maps {name!r} to both {seen[name]} and {role}", hint="give each name one role")
    columns = tuple((name, given[name]) for name in FIELD_TARGETS if name in given)
    return Mapping(columns=columns, properties=properties, roles=roles, remove=tuple(given.get("remove_columns") or ()),
                   rewrites_messages=bool(properties or roles or "field_messages" in given))


def mapping_settings(values: object) -> dict[str, Any]:
    """The mapping keys that are set, as a plain dict (what DataSettings keeps and the cache records)."""
    get = values.get if isinstance(values, dict) else (lambda name: getattr(values, name, None))
    return {name: get(name) for name in MAPPING_KEYS if get(name) not in (None, [], {})}
