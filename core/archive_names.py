"""The file name of each batch item in its archive: one rule for the server that lays out the zip
(api/batch_service.py) and the client that unzips it and checks every expected file arrived (client/cli_batch.py).

Names are unique by construction, also when compared without case (a zip unpacked on macOS or Windows):

1. An item with a custom_id is `<custom_id>.mp4`; custom_ids claim their names first, in input order, so a user's
   chosen name is never taken by an item without one.
2. An item without a custom_id is its input index zero-padded to at least 4 digits, `0002.mp4`.
3. A name already taken (a custom_id equal to another item's padded index, or two custom_ids differing only in
   case) becomes `<stem>~<index>.mp4`. `~` is outside the custom_id alphabet (letters, digits, `.`, `_`, `-`) and
   outside the padded index, so no name from rules 1-2 contains it, and two names from rule 3 differ in the index
   after their only `~` (indexes are unique). The earlier rule, `<stem>-<index>`, could land on another item's
   custom_id (`0002-2`), and the zip then held one name twice (issue 26 item 3).
"""
from __future__ import annotations

from collections.abc import Iterable

SUFFIX = ".mp4"
CLASH = "~"
"""Joins a taken stem and the item's index; never part of a custom_id or a padded index."""


def member_names(items: Iterable[tuple[int, str | None]]) -> dict[int, str]:
    """Archive member name per item index, from (input index, custom_id or None) pairs in input order."""
    items = list(items)
    width = max(4, len(str(max((index for index, _ in items), default=0))))
    names: dict[int, str] = {}
    taken: set[str] = set()
    named = [(index, custom_id) for index, custom_id in items if custom_id]
    unnamed = [(index, str(index).zfill(width)) for index, custom_id in items if not custom_id]
    for index, stem in named + unnamed:
        name = f"{stem}{SUFFIX}"
        if name.casefold() in taken:
            name = f"{stem}{CLASH}{index}{SUFFIX}"
        taken.add(name.casefold())
        names[index] = name
    return names
