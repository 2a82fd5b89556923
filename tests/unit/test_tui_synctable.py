"""SyncTable: rows that come, go and move; what
the DataTable draws is the rows given, in their order, with the cursor on its key."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("textual", reason="the TUI tests need the tui extra (pip install 'pdctl[tui]')")

from textual.app import App, ComposeResult
from textual.widgets.data_table import RowKey

from pdctl.tui.widgets import Column, SyncTable

COLUMNS = (Column("a", "a", 6), Column("b", "b", 6))


class One(App[None]):
    def compose(self) -> ComposeResult:
        yield SyncTable(COLUMNS)


def drawn(t: SyncTable) -> list[tuple[str, list[Any]]]:
    return [(str(r.key.value), t.get_row(r.key)) for r in t.ordered_rows]


async def test_rows_added_dropped_moved_and_the_cursor_kept():
    app = One()
    async with app.run_test(size=(40, 20)) as pilot:
        t = app.query_one(SyncTable)
        t.sync([(k, (k, "0")) for k in "abcdef"])
        await pilot.pause()
        t.move_cursor(row=3)
        assert t.selected_key() == "d"
        rows = [("f", ("f", "1")), ("d", ("d", "0")), ("x", ("x", "9")), ("a", ("a", "0"))]
        t.sync(rows)
        await pilot.pause()
        assert drawn(t) == [(k, list(c)) for k, c in rows]
        assert t.row_count == 4
        assert t.selected_key() == "d"
        assert t.cursor_row == 1
        # the cursor's row gone: to its fallback, else clamped to the rows left
        t.sync([("a", ("a", "0")), ("x", ("x", "9"))], fallback={"d": "x"})
        await pilot.pause()
        assert t.selected_key() == "x"
        t.move_cursor(row=1)
        t.sync([("a", ("a", "2"))])
        await pilot.pause()
        assert drawn(t) == [("a", ["a", "2"])]
        assert t.selected_key() == "a"
        assert t.virtual_size.height == 1 + 1  # header + one row


async def test_a_long_table_keeps_its_scroll_when_rows_open_above_the_end():
    app = One()
    async with app.run_test(size=(40, 12)) as pilot:
        t = app.query_one(SyncTable)
        keys = [f"r{n:03}" for n in range(200)]
        t.sync([(k, (k, "")) for k in keys])
        await pilot.pause()
        t.move_cursor(row=150, animate=False)
        await pilot.pause()
        y = t.scroll_y
        assert y > 100
        more = [*keys[:150], "new-1", "new-2", *keys[150:]]
        t.sync([(k, (k, "")) for k in more])
        await pilot.pause()
        assert [str(r.key.value) for r in t.ordered_rows] == more
        assert t.selected_key() == "r150"
        assert t.scroll_y >= y
        assert t.virtual_size.height == 1 + len(more)


async def test_reordered_rows_are_moved_not_rebuilt():
    app = One()
    async with app.run_test(size=(40, 12)) as pilot:
        t = app.query_one(SyncTable)
        keys = [f"r{n:03}" for n in range(200)]
        t.sync([(k, (k, "0")) for k in keys])
        await pilot.pause()
        t.move_cursor(row=5, animate=False)
        kept = {k: t.rows[RowKey(k)] for k in keys}
        backwards = keys[::-1]
        t.sync([(k, (k, "1" if k == "r007" else "0")) for k in backwards])
        await pilot.pause()
        assert [str(r.key.value) for r in t.ordered_rows] == backwards
        assert all(t.rows[RowKey(k)] is kept[k] for k in keys)  # the same rows, moved
        assert t.get_row("r007") == ["r007", "1"]
        assert t.selected_key() == "r005"
        assert t.cursor_row == 194  # 199 - 5
        assert t.virtual_size.height == 1 + 200


async def test_cells_are_drawn_as_the_datatable_draws_them():
    """SyncTable draws one-line cells itself; each must come out as the DataTable's own
    rendering does, segment for segment, with and without the cursor or hover."""
    from rich.text import Text
    from textual.widgets import DataTable

    values: list[Any] = [
        "abc",
        "",
        "a longer text than the cell",
        "[b]markup[/b]",
        "10.0.0.7:8000",
        "an :thumbs_up: emoji code",
        "日本語のテキスト",
        Text("bold", style="bold"),
        Text.assemble(("red", "red"), " and ", ("dim", "dim")),
        Text("▸ decode (256) and more", style="bold"),
        Text("an ellipsis cut here", overflow="ellipsis"),
        Text("", style="green"),
        Text("no end", end=""),
        Text("tab\there"),
        Text("two\nlines"),
    ]
    app = One()
    async with app.run_test(size=(40, 40)) as pilot:
        t = app.query_one(SyncTable)
        t.sync([(f"r{n}", (v, v)) for n, v in enumerate(values)])
        await pilot.pause()
        t.move_cursor(row=2)
        for row in range(len(values)):
            style = t._get_row_style(row, t.rich_style)
            for column, width in ((0, 8), (1, 3)):
                for cursor, hover in ((False, False), (True, False), (False, True)):
                    t._clear_caches()
                    ours = t._render_cell(row, column, style, width, cursor, hover)
                    t._clear_caches()
                    theirs = DataTable._render_cell(t, row, column, style, width, cursor, hover)
                    assert ours == theirs, (values[row], width, cursor, hover)


async def test_lines_are_drawn_as_the_datatable_draws_them():
    """SyncTable draws one-line rows a line at a time; each line must come out as the
    DataTable's own, segment for segment: under the cursor or not, focused or not,
    scrolled sideways, after rows moved (a line kept or its cells placed anew)."""
    from rich.text import Text
    from textual.widgets import DataTable

    values: list[Any] = [
        "abc",
        "10.0.0.7:8000",
        "[b]markup[/b]",
        Text("bold", style="bold"),
        Text.assemble(("red", "red"), " and ", ("dim", "dim")),
        Text("", style="green"),
        Text("two\nlines"),
        "日本語のテキスト",
    ]
    app = One()
    async with app.run_test(size=(40, 20)) as pilot:
        t = app.query_one(SyncTable)

        def compare(x1: int, x2: int) -> None:
            style = t.rich_style
            t._pseudo_class_state = t.get_pseudo_class_state()
            t._paint = t._painting()
            try:
                for y in range(1, len(values) + 1):  # under the header
                    ours = t._render_line(y, x1, x2, style)
                    t._clear_caches()
                    theirs = DataTable._render_line(t, y, x1, x2, style)
                    assert list(ours) == list(theirs), (y, x1, x2)
                    again = t._render_line(y, x1, x2, style)  # kept: the same
                    assert list(again) == list(theirs)
            finally:
                t._paint = None

        rows = [(f"r{n}", (v, str(n))) for n, v in enumerate(values)]
        t.sync(rows)
        await pilot.pause()
        for cursor in (0, 3):
            t.move_cursor(row=cursor)
            await pilot.pause()
            for x1, x2 in ((0, 40), (2, 30)):
                compare(x1, x2)
        t.sync(rows[::-1])  # moved: the lines kept are not at their place any more
        await pilot.pause()
        compare(0, 40)
        t.blur()
        await pilot.pause()
        compare(0, 40)


async def test_cells_drawn_before_are_placed_not_drawn_again():
    """A cell whose datum is the one drawn before comes out at its new place (rows moved)
    as the DataTable draws it there, without being drawn again; a changed one is drawn."""
    from rich.text import Text
    from textual.widgets import DataTable

    app = One()
    async with app.run_test(size=(40, 20)) as pilot:
        t = app.query_one(SyncTable)
        rows = [(f"r{n}", (Text(f"x{n}", style="bold"), str(n))) for n in range(6)]
        t.sync(rows)
        await pilot.pause()

        def every_cell() -> list[tuple[Any, Any]]:
            out = []
            for row in range(6):
                style = t._get_row_style(row, t.rich_style)
                for column in (0, 1):
                    for cursor in (False, True):
                        t._clear_caches()
                        ours = t._render_cell(row, column, style, 6, cursor)
                        t._clear_caches()
                        theirs = DataTable._render_cell(t, row, column, style, 6, cursor)
                        out.append((ours, theirs))
            return out

        every_cell()
        drawn_again: list[object] = []
        draw = t._draw

        def counted(where: Any, datum: object, *rest: Any) -> Any:
            drawn_again.append(datum)
            return draw(where, datum, *rest)

        t._draw = counted  # type: ignore[method-assign,assignment]
        moved = [(k, (c[0], "new" if k == "r2" else c[1])) for k, c in rows[::-1]]
        t.sync(moved)
        await pilot.pause()
        for ours, theirs in every_cell():
            assert ours == theirs
        assert set(drawn_again) == {"new"}  # the changed cell (with and without the cursor)


async def test_rows_far_from_the_screen_are_drawn_when_they_come_near_it():
    """Rows given as how to draw them: those within a page of the screen are drawn at
    once, the others (new to the table or not) when they are scrolled to or read, and
    then show their latest cells."""
    app = One()
    async with app.run_test(size=(40, 12)) as pilot:
        t = app.query_one(SyncTable)
        keys = [f"r{n:03}" for n in range(200)]
        calls: list[str] = []

        def rows(value: str) -> list[tuple[str, Any]]:
            def draw(k: str) -> Any:
                def cells() -> tuple[str, str]:
                    calls.append(k)
                    return (k, value)

                return cells

            return [(k, draw(k)) for k in keys]

        t.sync(rows("0"))
        await pilot.pause()
        assert [str(r.key.value) for r in t.ordered_rows] == keys  # every row in its place
        assert t.virtual_size.height == 1 + 200
        assert 0 < len(calls) < 60  # new rows too: those near the screen drawn
        assert "r150" not in calls
        assert t.get_row("r150") == ["r150", "0"]  # read: drawn
        calls.clear()
        t.sync(rows("1"))
        await pilot.pause()
        assert calls  # the rows near the screen only
        assert len(calls) < 60
        assert "r150" not in calls
        assert t.get_row("r151") == ["r151", "1"]  # read: drawn
        t.move_cursor(row=150, animate=False)
        await pilot.pause()  # the page around row 150 painted: its rows drawn first
        assert "r150" in calls
        assert list(t._data[RowKey("r150")].values()) == ["r150", "1"]
        assert t.get_row("r199") == ["r199", "1"]
        assert t.get_column("b") is not None
        assert set(t.get_column("b")) == {"1"}
        assert not t._pending  # every row drawn once read


async def test_a_table_of_auto_height_grows_and_shrinks_with_its_rows():
    app = One()  # no stylesheet: the DataTable's own height, auto
    async with app.run_test(size=(40, 20)) as pilot:
        t = app.query_one(SyncTable)
        t.sync([(k, (k, "")) for k in "abc"])
        await pilot.pause()
        assert t.size.height == 1 + 3
        t.sync([(k, (k, "")) for k in "abcdefgh"])
        await pilot.pause()
        assert t.size.height == 1 + 8
        t.sync([(k, (k, "")) for k in "ab"])
        await pilot.pause()
        assert t.size.height == 1 + 2
