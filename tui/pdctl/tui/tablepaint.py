"""How the TUI's tables paint: one-line cells drawn straight into their segments, and
each row's line kept while the row, its place and its look stay the same, so a key or an
update redraws only the rows that changed or moved (the DataTable's caches are dropped
whenever any cell of the table changes, and redraw the whole page)."""

from __future__ import annotations

from dataclasses import dataclass, field

from rich._emoji_replace import _emoji_replace
from rich.cells import cell_len
from rich.console import Console
from rich.segment import Segment
from rich.style import Style
from rich.text import Span, Text
from textual._segment_tools import line_crop
from textual._types import SegmentLines
from textual.geometry import Region
from textual.strip import Strip
from textual.widgets import DataTable
from textual.widgets._data_table import CellCacheKey
from textual.widgets.data_table import ColumnKey, RowKey

Cell = str | Text
EMPTY = Text(no_wrap=True, end="")
"""What the DataTable draws for an empty text."""


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
    columns: tuple[tuple[ColumnKey, int], ...] = ()
    """Each column's key and width on screen, in order."""
    lines: bool = False
    """Rows are drawn a line at a time by :meth:`PaintedTable._line` (a row cursor, no
    fixed cells or row labels)."""


class PaintedTable(DataTable[Cell]):
    """A DataTable that paints its one-line rows itself (see the module's docstring); what
    it paints is what the DataTable paints (unit tests compare cells and lines)."""

    def __init__(self, **kw: object) -> None:
        super().__init__(**kw)  # type: ignore[arg-type]
        self._rows: dict[str, tuple[Cell, ...]] = {}
        """Each row's cells as last put (a tuple replaced, never changed, when they
        change: a row's line is drawn again when its tuple is another)."""
        self._paint: Paint | None = None
        self._drawn: dict[tuple[object, ...], tuple[object, list[Segment]]] = {}
        """A cell's segments without its place (the meta style naming its row and
        column), by row, column and look, with the datum drawn: still good while the
        cell's datum is the same, whatever else changed in the table (see
        :meth:`_render_cell`)."""
        self._lines: dict[RowKey, tuple[tuple[Cell, ...], tuple[object, ...], Strip]] = {}
        """Each row's line as last painted: its cells, its place and look, the strip."""
        self._bare_rows: dict[
            RowKey, tuple[tuple[Cell, ...], tuple[object, ...], list[list[Segment] | None]]
        ] = {}
        """Each row's cells without their place, as last drawn: its cells, look, segments."""
        self._styles_at: dict[tuple[Style | None, int, int], Style] = {}
        """A cell's style with its place added (the meta style naming its row and column),
        by style, row and column: the same few styles at the same places, page after
        page."""

    def render_lines(self, crop: Region) -> list[Strip]:
        """The DataTable's, with the table's settings read once for the paint, not once
        per cell or line (each a reactive attribute)."""
        self._paint = self._painting()
        try:
            return super().render_lines(crop)
        finally:
            self._paint = None

    def _clear_caches(self) -> None:
        super()._clear_caches()
        self._lines.clear()
        self._bare_rows.clear()

    def notify_style_update(self) -> None:
        """CSS or the theme changed: every cell and line is drawn again."""
        super().notify_style_update()
        self._lines.clear()
        self._bare_rows.clear()
        self._drawn.clear()

    def _render_line(self, y: int, x1: int, x2: int, base_style: Style) -> Strip:
        """A line of the table: a one-line data row's as painted before when its cells,
        place and look are the same (a cursor that moves repaints its two rows, an update
        the rows that changed), else drawn by :meth:`_line`; the header and any other
        row the DataTable's way."""
        paint = self._paint
        if paint is None or not paint.lines:
            return super()._render_line(y, x1, x2, base_style)
        try:
            row_key, line_no = self._get_offsets(y)
        except LookupError:
            return super()._render_line(y, x1, x2, base_style)
        cells = self._rows.get(row_key.value)  # type: ignore[arg-type]
        row = self.rows.get(row_key)
        row_index = self._row_locations.get(row_key)
        if not cells or row is None or row.height != 1 or line_no or row_index is None:
            return super()._render_line(y, x1, x2, base_style)
        cursor = self.cursor_coordinate.row == row_index
        hover = self.hover_coordinate.row == row_index
        width = self.size.width
        look = (
            row_index,
            cursor,
            hover,
            x1,
            x2,
            width,
            base_style,
            self._pseudo_class_state,
            paint.flags,
            paint.padding,
            paint.columns,
            self._row_label_column_width,
        )
        kept = self._lines.get(row_key)
        if kept is not None and kept[0] is cells and kept[1] == look:
            return kept[2]
        strip = self._line(paint, row_key, row_index, base_style, (cursor, hover), (x1, x2))
        if len(self._lines) > 2 * len(self._rows) + 256:
            self._lines.clear()  # of rows gone
        self._lines[row_key] = (cells, look, strip)
        return strip

    def _line(
        self,
        paint: Paint,
        row_key: RowKey,
        row_index: int,
        base_style: Style,
        lit: tuple[bool, bool],
        crop: tuple[int, int],
    ) -> Strip:
        """A one-line data row's line, cropped to ``crop`` (cells from, to): what the
        DataTable's ``_render_line`` makes of it with a row cursor, no fixed cells and no
        row labels, without its per-cell caches and look-ups."""
        cursor, hover = lit
        row_style = self._get_row_style(row_index, base_style)
        bare = self._bare_row(paint, row_key, row_index, row_style, lit)
        segments: list[Segment] = []
        for column_index, cell in enumerate(bare):
            if cell is None:  # the DataTable's way (one line: the row is one high)
                width = paint.columns[column_index][1]
                segments.extend(
                    DataTable._render_cell(
                        self, row_index, column_index, row_style, width, cursor, hover
                    )[0]
                )
            else:
                segments.extend(self._place(cell, row_index, column_index))
        # the row's style to the right of the last column, as the DataTable extends it
        table_width = sum(w for _, w in paint.columns) + self._row_label_column_width
        extend, _ = self._get_styles_to_render_cell(
            False, False, False, hover, cursor, paint.flags[0], paint.flags[1], False, False
        )
        extend = (
            row_style
            + extend
            + Style.from_meta({"row": row_index, "column": 0, "out_of_bounds": True})
        )
        width = self.size.width
        segments.append(Segment(" " * max(0, width - table_width), extend))
        x1, x2 = crop
        # one strip, not three: simplified (what the DataTable does after adjusting the
        # length; the same here, as the padding's style is never the line's last one)
        strip = Strip(Segment.simplify(line_crop(segments, x1, x2, width)))
        return strip.adjust_cell_length(width, base_style)

    def _bare_row(
        self,
        paint: Paint,
        row_key: RowKey,
        row_index: int,
        row_style: Style,
        lit: tuple[bool, bool],
    ) -> list[list[Segment] | None]:
        """Each cell of a row without its place (None: one the DataTable draws), as
        before while the row's cells and look are the same (a row that moved: a sort, a
        group opened above it)."""
        cells = self._rows.get(row_key.value)  # type: ignore[arg-type]
        look = (lit, row_style, self._pseudo_class_state, paint.flags, paint.padding,
                paint.columns)  # fmt: skip
        kept = self._bare_rows.get(row_key)
        if kept is not None and kept[0] is cells and kept[1] == look:
            return kept[2]
        bare = [
            self._bare(paint, (row_key, column_key, row_index, n), row_style, width, lit)
            for n, (column_key, width) in enumerate(paint.columns)
        ]
        if cells is not None:
            if len(self._bare_rows) > 2 * len(self._rows) + 256:
                self._bare_rows.clear()  # of rows gone
            self._bare_rows[row_key] = (cells, look, bare)
        return bare

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
        fixed = bool(self.fixed_rows or self.fixed_columns)
        return Paint(
            console=self.app.console,
            padding=self.cell_padding,
            fixed=fixed,
            flags=(
                self.show_cursor,
                self._show_hover_cursor,
                self.cursor_foreground_priority == "css",
                self.cursor_background_priority == "css",
            ),
            columns=tuple((c.key, c.get_render_width(self)) for c in self.ordered_columns),
            lines=self.cursor_type == "row"
            and not fixed
            and not (self._labelled_row_exists and self.show_row_labels),
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
        at = (row_key, column_key, row_index, column_index)
        # drawn again only when its datum or look changed; placed at its row and column
        bare = self._bare(paint, at, base_style, width, (cursor, hover))
        if bare is None:
            return super()._render_cell(row_index, column_index, base_style, width, cursor, hover)
        line = self._place(bare, row_index, column_index)
        self._cell_render_cache[key] = [line]
        return [line]

    def _bare(
        self,
        paint: Paint,
        at: tuple[RowKey, ColumnKey, int, int],
        base_style: Style,
        width: int,
        lit: tuple[bool, bool],
    ) -> list[Segment] | None:
        """A data cell's segments without its place, as drawn before when its datum and
        look are the same; None where the DataTable's own way must draw it."""
        row_key, column_key, row_index, column_index = at
        cursor, hover = lit
        datum = self._data.get(row_key, {}).get(column_key)
        lit = (cursor, hover and paint.flags[1])  # the mouse's row, lit only when shown
        look = (row_key, column_key, width, base_style, *lit, self._pseudo_class_state,
                paint.flags, paint.padding)  # fmt: skip
        drawn = self._drawn.get(look)
        if drawn is not None and (drawn[0] is datum or drawn[0] == datum):
            return drawn[1]
        bare = self._draw((row_key, row_index, column_index), datum, base_style, width, lit)
        if bare is None:
            return None
        if len(self._drawn) >= DRAWN_CELLS:
            self._drawn.clear()  # of rows gone and looks not drawn since
        self._drawn[look] = (datum, bare)
        return bare

    def _place(self, bare: list[Segment], row_index: int, column_index: int) -> list[Segment]:
        """A cell's segments at its place: the meta style naming its row and column added
        last (see :func:`cell_line`), each style at each place made once."""
        placed = self._styles_at
        out = []
        for text, style, _ in bare:
            at_style = placed.get((style, row_index, column_index))
            if at_style is None:
                if len(placed) >= DRAWN_CELLS:
                    placed.clear()
                meta = Style.from_meta({"row": row_index, "column": column_index})
                at_style = meta if style is None else style + meta
                placed[style, row_index, column_index] = at_style
            out.append(Segment(text, at_style))
        return out

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
        if isinstance(datum, str) and "[" not in datum:  # what markup without tags gives
            cell = Text(_emoji_replace(datum) if ":" in datum else datum, end="", no_wrap=True)
        elif isinstance(datum, Text):  # the DataTable's cell formatter's, without the row's
            cell = datum or EMPTY
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
