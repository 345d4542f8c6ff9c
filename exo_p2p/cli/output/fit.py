"""Tables that fit the terminal (or 80 columns in a pipe) without cutting or splitting a word.

rich shrinks a table wider than the console by wrapping its cells, and when a column gets
narrower than a word it splits the word (``quanti`` / ``zation``) or cuts it with an
ellipsis; ids and model names, which people copy into commands, must never be cut. So
``fit`` gives every column at least its longest word (its longest line when the column does
not wrap) and, when the columns then do not fit side by side, shows the table as a list
instead: one block per row, its first cell as the heading and ``column: value`` lines under
it, each value wrapped at spaces in the width left (only a word longer than a whole line is
folded). Pure: the width is the caller's (``Console.width``).
"""

from __future__ import annotations

from rich.console import Console, Group, RenderableType
from rich.table import Column, Table
from rich.text import Text


def cell_text(cell: object) -> str:
    """The plain text of a cell (a ``str`` as rich would show it, a ``Text``'s plain text)."""
    if isinstance(cell, Text):
        return cell.plain
    return Text.from_markup(cell).plain if isinstance(cell, str) else str(cell)


def widest_line(column: Column) -> int:
    """The width ``column`` takes unwrapped: its longest line (header or cell)."""
    texts = [cell_text(column.header), *(cell_text(c) for c in column.cells)]
    return max((len(line) for t in texts for line in t.splitlines()), default=0)


def least_width(column: Column) -> int:
    """The narrowest ``column`` can be without splitting a word of its header or cells (its
    widest line when it does not wrap), and never under its ``min_width``."""
    if column.no_wrap:
        return max(widest_line(column), column.min_width or 0)
    texts = [cell_text(column.header), *(cell_text(c) for c in column.cells)]
    return max([len(word) for t in texts for word in t.split()] + [column.min_width or 0])


def table_overhead(table: Table) -> int:
    """Columns of a table's rules and padding: a separator and the left and right padding per
    column, and one more edge (rich's boxed tables, padding 1)."""
    return 3 * len(table.columns) + 1


def column_widths(natural: list[int], least: list[int], room: int) -> list[int] | None:
    """Widths (without padding) for columns that take ``natural`` unwrapped and ``least`` at
    the narrowest, in ``room`` characters: the widest column that can give is narrowed one
    character at a time until they fit (so short columns stay whole). None when even the
    least widths do not fit."""
    if sum(least) > room:
        return None
    widths = [max(n, m) for n, m in zip(natural, least)]
    for _ in range(max(0, sum(widths) - room)):
        give = [i for i, (w, m) in enumerate(zip(widths, least)) if w > m]
        widths[max(give, key=lambda i: widths[i])] -= 1
    return widths


def fit(table: Table, width: int) -> RenderableType:
    """``table`` with fixed column widths (``column_widths``) that fit ``width`` characters
    without splitting a word, else the same rows as a list (``as_list``)."""
    widths = column_widths([widest_line(c) for c in table.columns], [least_width(c) for c in table.columns],
                           width - table_overhead(table))
    if widths is None:
        return as_list(table)
    for column, n in zip(table.columns, widths):
        column.width = n
    return table


def as_list(table: Table) -> Group:
    """The rows of ``table`` as blocks: the title, then per row its first cell in bold and an
    indented grid of ``header: value`` (empty values left out) whose values wrap at spaces."""
    parts: list[RenderableType] = []
    if table.title:
        parts.append(Text(cell_text(table.title), style="bold"))
    first, *rest = table.columns
    for i, head in enumerate(first.cells):
        parts.append(Text(cell_text(head), style="bold"))
        grid = Table.grid(padding=(0, 1), pad_edge=False)
        grid.add_column(no_wrap=True)
        grid.add_column(overflow="fold")
        for column in rest:
            cell = list(column.cells)[i]
            if cell_text(cell).strip():
                grid.add_row(f"  {cell_text(column.header)}:", cell)
        parts.append(grid)
    return Group(*parts)


def show(console: Console, table: Table) -> None:
    """Print ``table`` on ``console`` fitted to its width (``fit``)."""
    console.print(fit(table, console.width))
