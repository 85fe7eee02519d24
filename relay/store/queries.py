"""The store's SQL, read from the .sql files beside this module (relay/store/sql/), as named blocks.

A file is a list of blocks, each a header line naming it, then its comments, then its SQL:

    -- has_ready --
    -- Whether a resource has a message a probe could take (the reason, for the reader).
    SELECT EXISTS (
        SELECT 1 FROM outbox_message WHERE ... AND {{resource}} = :only
    )

A block runs from its header to the next header. A line that begins with `--` in its first column
is for the reader and never reaches the database; a comment indented or after SQL on its line
stays in the statement. What comes before a file's first header is about the file. Block names
are unique across common.sql (what every dialect shares) and a dialect's file together: a name
means one text.

`{{name}}` is the one placeholder. It is filled, in this order, with:

1. a value of the statement's own (`fill`: literal SQL, such as a head's place among the runs'
   followers),
2. a value of the store's configuration (`config`: literal SQL too: the list of blocking states
   of the dead-key mode, the resource expression of the circuit scope; see Dialect.__init__),
3. a block of the dialect's file or of common.sql: a fragment, filled in the same way.

A value is SQL, never another placeholder: what a statement says can be read from its blocks, and
`outbox-relay sql` prints it whole. Braces never appear doubled in SQL, and `:name` stays what it
is everywhere else: a bound value. A block defined twice is an error when the files are read; a
placeholder nothing fills, a value that holds a placeholder, a `fill` value no placeholder takes,
and a configuration value no statement takes (statements.build), when the statements are built:
once per store configuration, never per call.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib.resources import files

PLACEHOLDER = re.compile(r"\{\{(\w+)\}\}")
_HEADER = re.compile(r"-- (\w+) --")
SQL = files("relay.store") / "sql"


class QueryError(Exception):
    """A .sql file, or a statement built from one, is not what its code expects."""


@dataclass(frozen=True, slots=True)
class Block:
    name: str
    file: str
    comment: str  # for the reader
    text: str  # the SQL, placeholders unfilled


def parse(source: str, file: str) -> dict[str, Block]:
    """The blocks of one file's text, by name."""
    blocks: dict[str, Block] = {}
    name: str | None = None
    comment: list[str] = []
    body: list[str] = []

    def close() -> None:
        if name is None:
            return
        text = "\n".join(body).strip("\n")
        if not text.strip():
            raise QueryError(f"{file}: block {name!r} has no SQL")
        blocks[name] = Block(name, file, "\n".join(comment), text)

    for line in source.splitlines():
        header = _HEADER.fullmatch(line.rstrip())
        if header:
            close()
            name, comment, body = header[1], [], []
            if name in blocks:
                raise QueryError(f"{file}: block {name!r} is defined twice")
        elif line.startswith("--"):
            comment.append(line[2:].strip())
        elif name is not None:
            body.append(line.rstrip())
    close()
    return blocks


@dataclass
class Queries:
    """The blocks of common.sql and of one dialect's file: what its statements are built from."""

    blocks: Mapping[str, Block]
    used: set[str] = field(default_factory=set)  # the blocks any statement took so far

    def text(self, name: str, fill: Mapping[str, str] | None = None) -> str:
        """Block `name` with its placeholders filled (see the module's docstring)."""
        return self.expand(name, fill or {}, {})[0]

    def expand(
        self, name: str, fill: Mapping[str, str], config: Mapping[str, str]
    ) -> tuple[str, set[str]]:
        """Block `name` with its placeholders filled, and the configuration's names it took."""
        for values in (fill, config):
            clash = sorted(set(values) & set(self.blocks))
            if clash:
                raise QueryError(f"{name}: {clash} name blocks, not values")
            nested = sorted(k for k, v in values.items() if PLACEHOLDER.search(v))
            if nested:
                raise QueryError(f"{name}: the values of {nested} hold placeholders, not SQL")
        taken: set[str] = set()
        text = self._fill(self._block(name).text, fill, config, taken, (name,))
        unused = sorted(set(fill) - taken)
        if unused:
            raise QueryError(f"{name}: nothing in it takes {unused}")
        return text, taken & set(config)

    def _block(self, name: str) -> Block:
        try:
            found = self.blocks[name]
        except KeyError:
            raise QueryError(f"no block named {name!r}") from None
        self.used.add(name)
        return found

    def _fill(
        self,
        text: str,
        fill: Mapping[str, str],
        config: Mapping[str, str],
        taken: set[str],
        path: tuple[str, ...],
    ) -> str:
        def one(match: re.Match[str]) -> str:
            name = match[1]
            if name in path:
                raise QueryError(f"{' -> '.join(path)} -> {name}: a fragment that holds itself")
            if name in fill:
                taken.add(name)
                value = fill[name]
            elif name in config:
                taken.add(name)
                value = config[name]
            elif name in self.blocks:
                value = self._block(name).text
                value = self._fill(value, fill, config, taken, (*path, name))
            else:
                raise QueryError(f"{' -> '.join(path)}: nothing fills {{{{{name}}}}}")
            # A fragment of several lines takes its placeholder's indentation, for the logs.
            line = match.string[match.string.rfind("\n", 0, match.start()) + 1 :]
            indent = line[: len(line) - len(line.lstrip(" "))]
            return value.replace("\n", "\n" + indent)

        return PLACEHOLDER.sub(one, text)


@functools.cache
def read(file: str) -> Mapping[str, Block]:
    """One .sql file's blocks (relay/store/sql/<file>.sql, package data), read once."""
    return parse((SQL / f"{file}.sql").read_text(encoding="utf-8"), f"{file}.sql")


def load(*names: str) -> Queries:
    """The blocks of these files together (common.sql first, then a dialect's)."""
    blocks: dict[str, Block] = {}
    for file in names:
        for name, block in read(file).items():
            if name in blocks:
                raise QueryError(f"block {name!r} is in {blocks[name].file} and {block.file}")
            blocks[name] = block
    return Queries(blocks)
