"""The command palette (Ctrl+P): the fleet's actions and the views, fuzzy-searched."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from textual.command import DiscoveryHit, Hit, Hits, Provider

from pdctl.tui.actions import Action


def entries_for(
    actions: list[Action],
    views: list[str],
    act: Callable[[Action], None],
    go: Callable[[str], None],
) -> list[tuple[str, str, Callable[[], None]]]:
    out: list[tuple[str, str, Callable[[], None]]] = [
        (a.label, a.help, partial(act, a)) for a in actions
    ]
    out.extend((f"View {v}", f"show the {v} view", partial(go, v)) for v in views)
    return out


class FleetCommands(Provider):
    """Asks the screen it was opened on for its entries (none on screens without)."""

    def _entries(self) -> list[tuple[str, str, Callable[[], None]]]:
        screen = self.screen
        get = getattr(screen, "palette_entries", None)
        return list(get()) if callable(get) else []

    async def discover(self) -> Hits:
        for label, help_, cb in self._entries():
            yield DiscoveryHit(label, cb, help=help_)

    async def search(self, query: str) -> Hits:
        matcher = self.matcher(query)
        for label, help_, cb in self._entries():
            score = matcher.match(label)
            if score > 0:
                yield Hit(score, matcher.highlight(label), cb, text=label, help=help_)
