"""Widgets that only draw what they are given: tables synced in place, the alert
banner, the summary line and the view tabs."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from rich.cells import cell_len
from rich.console import Console
from rich.segment import Segment
from rich.style import Style
from rich.text import Span, Text
from textual._two_way_dict import TwoWayDict
from textual._types import SegmentLines
from textual.geometry import Region, Size
from textual.screen import Screen
from textual.strip import Strip
from textual.widget import Widget
from textual.widgets import DataTable, Footer, Static
from textual.widgets._data_table import CellCacheKey
from textual.widgets.data_table import ColumnKey, RowKey
from textual.widgets.data_table import Row as DataRow

from pdctl.sdk.metrics.monitor import Alert

Cell = str | Text
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


def cell_line(
    console: Console,
    text: Text,
    width: int,
    padding: int,
    pre: Style,
    post: Style,
    meta: Style | None = None,
) -> list[Segment] | None:
    """The segments of a one-line cell ``width`` wide: ``text`` cut to the room inside
    ``padding`` on either side and padded with spaces, ``pre`` under every segment and
    ``post`` over it, then ``meta`` (a style of only meta data: the cell's place);
    what the DataTable's ``Styled(Padding(text))`` renders to with wrapping off, without
    its layers. None where that is not this simple: a text with a newline or tab, one
    that wraps, justifies itself or ignores overflow."""
    inner = width - 2 * padding
    plain = text.plain
    if (
        inner < 1
        or "\n" in plain
        or "\t" in plain
        or text.no_wrap is False
        or text.justify not in (None, "default")
        or text.overflow == "ignore"
    ):
        return None
    if cell_len(plain) > inner:
        text = text.copy()
        text.truncate(inner, overflow=text.overflow or "fold")
    if not text.style and not text.spans:
        segments = [Segment(text.plain)]
    else:  # the text's own style as a span under its spans, as Rich's joining of lines does
        spans = [Span(0, len(text), text.style), *text.spans] if text.style else text.spans
        segments = list(Text(text.plain, spans=spans).render(console))
    used = cell_len(text.plain)
    null = Style.null()
    pad = [Segment(" " * padding, null)] if padding else []
    fill = [Segment(" " * (inner - used), null)] if used < inner else []
    styled = Segment.apply_style([*pad, *segments, *fill, *pad], pre, post)
    if meta is None:
        return list(styled)
    # added last, not with ``pre`` (the DataTable's order): the same style, and the
    # additions before it are the same for every cell, so Rich's cache of them holds
    return [Segment(t, meta if style is None else style + meta) for t, style, _ in styled]


DRAWN_CELLS = 65536
"""The most cells a table keeps drawn (:meth:`SyncTable._render_cell`): every cell of
2,000 rows of 14 columns, with and without the cursor."""


@dataclass
class Paint:
    """What drawing a cell needs of the table, read once per paint."""

    console: Console
    padding: int
    fixed: bool
    flags: tuple[bool, bool, bool, bool]
    """show_cursor, the hover cursor shown, the cursor's colours from CSS (fore, back)."""
    styles: dict[tuple[bool, bool], tuple[Style, Style]] = field(default_factory=dict)
    """(cursor, hover) → the component style under a cell and the one over it."""
    rich_style: Style | None = None
    """The table's own style (its ancestors' colours), read once, not once per line."""


class SyncTable(DataTable[Cell]):
    """A table updated in place by row key: unchanged cells are not touched, rows that
    come, go or move are put in place without rebuilding the table, and the cursor stays
    on its row."""

    def __init__(self, columns: Sequence[Column], **kw: object) -> None:
        super().__init__(cursor_type="row", zebra_stripes=False, **kw)  # type: ignore[arg-type]
        self.all_columns = tuple(columns)
        self._shown: tuple[Column, ...] = ()
        self._extra = 0
        self._room_left = 0
        self._rows: dict[str, tuple[Cell, ...]] = {}
        self._order: list[str] = []
        self._index: list[int] = []
        self._pending: dict[str, Callable[[], Sequence[Cell]]] = {}
        """Rows far from the screen whose cells were given as how to draw them: drawn
        when they come near it (:meth:`render_lines`) or are read (:meth:`get_row`)."""
        self._fallback: Mapping[str, str] = {}
        self._paint: Paint | None = None
        self._drawn: dict[tuple[object, ...], tuple[object, list[Segment]]] = {}
        """A cell's segments without its place (the meta style naming its row and
        column), by row, column and look, with the datum drawn: still good while the
        cell's datum is the same, whatever else changed in the table (see
        :meth:`_render_cell`)."""

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
        draws them: called only for a row new to the table or within a page of the
        screen, else when the row comes near the screen or is read). The cursor stays
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
                if key in self._rows and n not in near:
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
        if old is None:
            self._data[row_key] = dict(zip(columns, new, strict=True))
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
        """The DataTable's, with the rows it shows drawn first (those left to draw) and
        the table's settings read once for the paint, not once per cell (each a reactive
        attribute)."""
        if self._pending:
            header = self.header_height if self.show_header else 0
            top = max(0, int(self.scroll_y) + crop.y - header)
            self._draw_pending(self._order[top : top + crop.height + 1])
        self._paint = self._painting()
        try:
            return super().render_lines(crop)
        finally:
            self._paint = None

    @property
    def rich_style(self) -> Style:
        """The DataTable's, computed once per paint (each line of the page asks for it,
        and each time it walks the table's ancestors)."""
        paint = self._paint
        if paint is None:
            return super().rich_style
        if paint.rich_style is None:
            paint.rich_style = super().rich_style
        return paint.rich_style

    def _painting(self) -> Paint:
        return Paint(
            console=self.app.console,
            padding=self.cell_padding,
            fixed=bool(self.fixed_rows or self.fixed_columns),
            flags=(
                self.show_cursor,
                self._show_hover_cursor,
                self.cursor_foreground_priority == "css",
                self.cursor_background_priority == "css",
            ),
        )

    def _render_cell(
        self,
        row_index: int,
        column_index: int,
        base_style: Style,
        width: int,
        cursor: bool = False,
        hover: bool = False,
    ) -> SegmentLines:
        """A data cell of a one-line row drawn straight into its segments (see
        :func:`cell_line`): the DataTable's own way (padding, styling and cropping as
        nested renderables, each cell rendered and cut into lines twice) costs ~70 µs a
        cell, most of a key's time when a page of 50 rows by 14 columns is redrawn.
        Header, label and fixed cells, and any cell :func:`cell_line` does not draw, go
        the DataTable's way; the result is the same (a unit test compares them).
        A cell whose datum is the one drawn before (the same object, or an equal one:
        a row that left the table and came back), with the same look, is not drawn
        again (the DataTable's caches are dropped whenever any cell of the table
        changes): only its place is added, so an update redraws only the cells that
        changed, and a key that moves rows (a group opened, a sort) none."""
        paint = self._paint or self._painting()
        if row_index < 0 or column_index < 0 or paint.fixed:
            return super()._render_cell(row_index, column_index, base_style, width, cursor, hover)
        row_key = self._row_locations.get_key(row_index)
        column_key = self._column_locations.get_key(column_index)
        if row_key is None or column_key is None:
            return super()._render_cell(row_index, column_index, base_style, width, cursor, hover)
        key: CellCacheKey = (
            row_key,
            column_key,
            base_style,
            cursor,
            hover,
            self._show_hover_cursor,
            self._update_count,
            self._pseudo_class_state,
        )
        cached = self._cell_render_cache.get(key)
        if cached is not None:
            return cached
        datum = self._data.get(row_key, {}).get(column_key)
        lit = (cursor, hover and paint.flags[1])  # the mouse's row, lit only when shown
        look = (row_key, column_key, width, base_style, *lit, key[7], paint.flags, paint.padding)
        drawn = self._drawn.get(look)
        if drawn is not None and (drawn[0] is datum or drawn[0] == datum):
            bare = drawn[1]
        else:
            got = self._draw((row_key, row_index, column_index), datum, base_style, width, lit)
            if got is None:
                return super()._render_cell(
                    row_index, column_index, base_style, width, cursor, hover
                )
            bare = got
            if len(self._drawn) >= DRAWN_CELLS:
                self._drawn.clear()  # of rows gone and looks not drawn since
            self._drawn[look] = (datum, bare)
        # the place, added last (see cell_line): the same style, and the additions before
        # it are the same for every cell, so Rich's cache of them holds
        meta = Style.from_meta({"row": row_index, "column": column_index})
        line = [Segment(t, meta if style is None else style + meta) for t, style, _ in bare]
        self._cell_render_cache[key] = [line]
        return [line]

    def _draw(
        self,
        where: tuple[RowKey, int, int],
        datum: object,
        base_style: Style,
        width: int,
        lit: tuple[bool, bool],
    ) -> list[Segment] | None:
        """A one-line cell's segments without its place (``where``: its row key, row and
        column; ``lit``: under the cursor, under the mouse); None where the DataTable's
        own way must draw it."""
        row_key, row_index, column_index = where
        paint = self._paint or self._painting()
        row = self.rows.get(row_key)
        cell: object
        if isinstance(datum, str) and "[" not in datum and ":" not in datum:
            cell = Text(datum, end="", no_wrap=True)  # what markup without tags or emoji gives
        else:  # what the DataTable's cell formatter makes of it
            cell = self._get_row_renderables(row_index).cells[column_index]
        if row is None or row.height != 1 or not isinstance(cell, Text):
            return None
        cursor, hover = lit
        styles = paint.styles.get(lit)
        if styles is None:
            styles = paint.styles[lit] = self._get_styles_to_render_cell(
                False, False, False, hover, cursor, *paint.flags
            )
        component, post = styles
        return cell_line(paint.console, cell, width, paint.padding, base_style + component, post)

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
