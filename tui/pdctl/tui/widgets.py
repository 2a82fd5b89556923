"""Widgets that only draw what they are given: tables synced in place, the alert
banner, the summary line and the view tabs."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from rich.text import Text
from textual._two_way_dict import TwoWayDict
from textual.geometry import Region, Size
from textual.screen import Screen
from textual.strip import Strip
from textual.widget import Widget
from textual.widgets import Footer, Static
from textual.widgets.data_table import ColumnKey, RowKey
from textual.widgets.data_table import Row as DataRow

from pdctl.sdk.metrics.monitor import Alert
from pdctl.tui.tablepaint import Cell, PaintedTable

__all__ = ["AlertBanner", "Cell", "Cells", "Column", "SteadyFooter", "SyncTable", "Tabs"]

Cells = Sequence[Cell] | Callable[[], Sequence[Cell]]
"""A row's cells, or how to draw them (drawn when the row is near the screen)."""


@dataclass(frozen=True)
class Column:
    key: str
    label: str
    width: int
    wide: int = 0
    """0: always shown; 1, 2, …: optional, added in that order while the terminal has
    room (so the table degrades to the essentials at 80 columns)."""
    grow: bool = False
    """Takes the room the shown columns leave (one column per table: free text)."""


NOT_DRAWN: tuple[Cell, ...] = ()
"""The cells of a row added far from the screen, until it is drawn."""


class SyncTable(PaintedTable):
    """A table updated in place by row key: unchanged cells are not touched, rows that
    come, go or move are put in place without rebuilding the table, and the cursor stays
    on its row."""

    def __init__(self, columns: Sequence[Column], **kw: object) -> None:
        super().__init__(cursor_type="row", zebra_stripes=False, **kw)
        self.all_columns = tuple(columns)
        self._shown: tuple[Column, ...] = ()
        self._extra = 0
        self._room_left = 0
        self._order: list[str] = []
        self._index: list[int] = []
        self._pending: dict[str, Callable[[], Sequence[Cell]]] = {}
        """Rows far from the screen whose cells were given as how to draw them: drawn
        when they come near it (:meth:`render_lines`) or are read (:meth:`get_row`)."""
        self._fallback: Mapping[str, str] = {}

    def _pick(self) -> tuple[Column, ...]:
        """The essential columns, then optional ones in order while they fit."""
        room = (self.size.width or self.app.size.width) - 2  # the scrollbar
        pad = 2 * self.cell_padding
        used = sum(c.width + pad for c in self.all_columns if not c.wide)
        keep: set[str] = set()
        for c in sorted((c for c in self.all_columns if c.wide), key=lambda c: c.wide):
            if used + c.width + pad <= room:
                keep.add(c.key)
                used += c.width + pad
        self._room_left = max(0, room - used)
        return tuple(c for c in self.all_columns if not c.wide or c.key in keep)

    def sync(
        self,
        rows: Sequence[tuple[str, Cells]],
        fallback: Mapping[str, str] | None = None,
    ) -> None:
        """Show ``rows`` (key, one cell per column of ``all_columns``, or a function that
        draws them: called only for a row within a page of the screen, else when the
        row comes near the screen or is read: a group of 500 opened, or 500 rows
        regrouped, draws a page or three, not 500 rows). The cursor stays
        on its row's key; when that row is gone, it moves to ``fallback[key]`` (a closed
        group's row) if given, else it stays at its place (clamped to the rows left)."""
        self._fallback = fallback or {}
        shown = self._pick()
        index = [i for i, c in enumerate(self.all_columns) if c in shown]
        extra = self._room_left if any(c.grow for c in shown) else 0
        selected = self.selected_key()
        if shown != self._shown or extra != self._extra:
            self.clear(columns=True)
            for c in shown:
                self.add_column(c.label, key=c.key, width=c.width + (extra if c.grow else 0))
            self._shown, self._extra = shown, extra
            self._rows, self._order, self._pending = {}, [], {}
        self._index = index
        self._apply(rows, selected)

    def _apply(self, rows: Sequence[tuple[str, Cells]], selected: str | None) -> None:
        """Bring the table's rows to ``rows`` in place: rows gone are dropped, new ones
        added, changed cells replaced, and the order set in one step, without the
        DataTable's clear-and-add (which re-adds and re-measures every row: seconds at
        500 rows). Every column has a fixed width, so new rows need no measuring; the
        DataTable's caches are keyed by its update count, which this bumps."""
        columns = [ColumnKey(c.key) for c in self._shown]
        keys = [k for k, _ in rows]
        moved = keys != self._order
        changed = moved
        if moved:
            keep = set(keys)
            for key in self._order:
                if key not in keep:
                    del self._data[RowKey(key)], self.rows[RowKey(key)], self._rows[key]
                    self._pending.pop(key, None)
        page = max(1, self.size.height)
        near = range(int(self.scroll_y) - page, int(self.scroll_y) + 2 * page)
        for n, (key, cells) in enumerate(rows):
            if callable(cells):
                if n not in near:  # drawn when it comes near the screen or is read
                    if key not in self._rows:  # in its place, its cells to come
                        row_key = RowKey(key)
                        self._data[row_key] = {}
                        self.rows[row_key] = DataRow(row_key, height=1)
                        self._rows[key] = NOT_DRAWN
                    self._pending[key] = cells
                    continue
                cells = cells()
            self._pending.pop(key, None)
            changed = self._put(key, cells, columns) or changed
        if not changed:
            return
        # what add_row, update_cell and sort do, once for all rows and cells
        self._update_count += 1
        self.refresh()
        if not moved:
            return
        self._row_locations = TwoWayDict({RowKey(k): n for n, k in enumerate(keys)})
        self._order = keys
        self._placed(keys, selected)

    def _put(self, key: str, cells: Sequence[Cell], columns: list[ColumnKey]) -> bool:
        """The row ``key``'s cells (of every column): added, or its changed cells
        replaced; whether anything changed."""
        new = tuple(cells[i] for i in self._index)
        old = self._rows.get(key)
        if old == new:
            return False
        row_key = RowKey(key)
        if old is None or old is NOT_DRAWN:
            self._data[row_key] = dict(zip(columns, new, strict=True))
            if old is None:
                self.rows[row_key] = DataRow(row_key, height=1)
        else:
            data = self._data[row_key]
            for col, a, b in zip(columns, old, new, strict=True):
                if a != b:
                    data[col] = b
        self._rows[key] = new
        return True

    def _draw_pending(self, keys: Iterable[str]) -> None:
        """Draw the rows of ``keys`` left to draw; the DataTable's caches dropped if any
        changed (before they are read: they are keyed by the update count)."""
        columns = [ColumnKey(c.key) for c in self._shown]
        changed = False
        for key in keys:
            draw = self._pending.pop(key, None)
            if draw is not None:
                changed = self._put(key, draw(), columns) or changed
        if changed:
            self._update_count += 1

    def get_row(self, row_key: RowKey | str) -> list[Cell]:
        self._draw_pending([str(row_key.value) if isinstance(row_key, RowKey) else row_key])
        return super().get_row(row_key)

    def get_cell(self, row_key: RowKey | str, column_key: ColumnKey | str) -> Cell:
        self._draw_pending([str(row_key.value) if isinstance(row_key, RowKey) else row_key])
        return super().get_cell(row_key, column_key)

    def get_column(self, column_key: ColumnKey | str) -> Iterable[Cell]:
        self._draw_pending(list(self._pending))
        return super().get_column(column_key)

    def _placed(self, keys: list[str], selected: str | None) -> None:
        """After rows moved: the table's virtual size, and the cursor on ``selected`` (or
        its fallback, or clamped to the rows left)."""
        # the virtual height now (the DataTable leaves it to when idle, and would scroll
        # to the cursor after one paint at the old place: two pages drawn, not one)
        width = sum(c.get_render_width(self) for c in self.columns.values())
        header = self.header_height if self.show_header else 0
        size = Size(width + self._row_label_column_width, self._total_row_height + header)
        if size != self.virtual_size and self.styles.auto_dimensions:
            self.virtual_size = size  # its height follows its rows: laid out again
        elif size != self.virtual_size:
            # a table of fixed height (the fleet's, 1fr) keeps its size: the screen is not
            # laid out again (what setting it does); a scrollbar that comes or goes lays
            # it out itself
            self.set_reactive(Widget.virtual_size, size)
            self._scroll_update(size)
        if selected is not None and selected not in self._rows:
            selected = self._fallback.get(selected)
        if selected is not None and selected in self._rows:
            row = keys.index(selected)
        else:  # clamped to the rows left
            row = min(self.cursor_row, len(keys) - 1)
        if row < 0:
            return
        if row != self.cursor_row:
            self.move_cursor(row=row, animate=False)
        else:  # same place, another row: what the cursor's watcher would do
            self.refresh_row(row)
            self._highlight_row(row)

    def render_lines(self, crop: Region) -> list[Strip]:
        """The rows it shows drawn first (those left to draw), then painted."""
        if self._pending:
            header = self.header_height if self.show_header else 0
            top = max(0, int(self.scroll_y) + crop.y - header)
            self._draw_pending(self._order[top : top + crop.height + 1])
        return super().render_lines(crop)

    def selected_key(self) -> str | None:
        if not self._order or self.cursor_row < 0 or self.cursor_row >= len(self._order):
            return None
        return self._order[self.cursor_row]


class SteadyFooter(Footer):
    """Textual's footer, composed again only when the keys it shows change. Textual's
    composes it again (a widget per key, mounted and styled) on every change of focus,
    though the keys shown stay the same: ~60 ms of CPU when the filter prompt opens and
    again when it closes, at any fleet size."""

    _shown: tuple[object, ...] | None = None

    def bindings_changed(self, screen: Screen[object]) -> None:
        bindings = screen.active_bindings
        palette = bindings.get(self.app.COMMAND_PALETTE_BINDING)
        shown = (
            tuple((b.key, b.action, b.description, b.group, on, tip) for _, b, on, tip in
                  bindings.values() if b.show),
            palette.enabled if palette else None,
        )  # fmt: skip
        if shown == self._shown and self._bindings_ready:
            return
        super().bindings_changed(screen)
        if screen.app.app_focus and self.is_attached and screen is self.screen:
            self._shown = shown


class AlertBanner(Static):
    """The open alerts, most severe first; hidden when there are none."""

    def show(self, alerts: Sequence[Alert], now: float, lines: int) -> None:
        self.display = bool(alerts)
        if not alerts:
            return
        ordered = sorted(alerts, key=lambda a: (a.severity != "critical", a.code, a.subject))
        t = Text()
        for n, a in enumerate(ordered[:lines]):
            if n:
                t.append("\n")
            style = "bold red" if a.severity == "critical" else "bold yellow"
            t.append(f"{a.code} ", style=style)
            t.append(f"{a.subject}: ", style="bold")
            age = max(0, int(now - a.since))
            t.append(f"{a.message} ")
            t.append(f"({age}s)", style="dim")
        if len(ordered) > lines:
            t.append(f"  +{len(ordered) - lines} more", style="dim")
        self.update(t)


class Tabs(Static):
    """k9s-style crumbs: every view with its key, the current one highlighted."""

    def show(self, views: Sequence[tuple[str, str]], current: str, extra: str = "") -> None:
        t = Text()
        for key, name in views:
            style = "reverse bold" if name == current else "dim"
            t.append(f" {key} {name} ", style=style)
        if extra:
            t.append("  " + extra, style="italic")
        self.update(t, layout=False)  # one line high (pdctl.tcss)
