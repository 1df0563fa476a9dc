"""CSV datasets (RFC 4180, a header row naming the fields): the items of a file and their
lines, with errors that name the line, column and field (the csv module gives lines only,
so a record is scanned again for the message)."""

from __future__ import annotations

import csv
import io
import re

from cobalt.dataset import DatasetError, Item, StrPath
from cobalt.dataset_files import read_text


def load_csv(path: StrPath, *, delimiter: str = ",") -> tuple[list[Item], list[int]]:
    """The rows of a CSV file as items (values kept as strings, blank lines skipped), and the
    line each starts on."""
    text = read_text(path)
    reader = csv.reader(io.StringIO(text, newline=""), delimiter=delimiter, strict=True)
    header: list[str] | None = None
    items: list[Item] = []
    lines: list[int] = []
    previous_line = 0
    while True:
        record_line = previous_line + 1
        try:
            row = next(reader)
        except StopIteration:
            break
        except csv.Error as exc:
            raise _csv_error(
                exc, _Record(text, record_line, delimiter, header), path, reader.line_num
            ) from None
        previous_line = reader.line_num
        if not row:
            continue  # blank line
        record = _Record(text, record_line, delimiter, header)
        if header is None:
            header = _check_header(row, record, path)
            continue
        if len(row) != len(header):
            raise _field_count_error(header, row, record, path)
        items.append(dict(zip(header, row, strict=True)))
        lines.append(record_line)
    if header is None:
        raise DatasetError(
            "the file is empty; expected a header row naming the fields (for example "
            "input,expected). Add a header row followed by one row per item.",
            path=path,
        )
    return items, lines


class _Record:
    """Where the fields of one CSV record start in the file, read again only for an error
    message (the csv module gives lines, not columns)."""

    def __init__(self, text: str, line: int, delimiter: str, header: list[str] | None) -> None:
        self.text, self.line, self.delimiter, self.header = text, line, delimiter, header

    def column_name(self, number: int) -> str:
        """`field 2 ("expected")`: by number, and by the header's name when there is one."""
        named = self.header and number <= len(self.header)
        return f"field {number}" + (f" ({self.header[number - 1]!r})" if named else "")

    def scan(self) -> tuple[list[tuple[int, int]], tuple[int, int], tuple[str, int, int] | None]:
        """(line, column) of each field's start, of the record's end, and the first problem:
        `("unterminated", ...)` at an opening quote never closed, `("after-quote", ...)` at
        text that follows a closing quote."""
        text, delimiter = self.text, self.delimiter
        pos = _line_offset(text, self.line)
        line, column = self.line, 1
        fields: list[tuple[int, int]] = []
        field_start, quoted, opened = True, False, (line, column)
        while pos < len(text):
            char = text[pos]
            if field_start:
                fields.append((line, column))
                field_start = False
                if char == '"':
                    quoted, opened = True, (line, column)
                    pos, column = pos + 1, column + 1
                    continue
            if quoted and char == '"':
                if text.startswith('""', pos):
                    pos, column = pos + 2, column + 2
                    continue
                quoted = False
                pos, column = pos + 1, column + 1
                if pos < len(text) and text[pos] not in (delimiter, "\r", "\n"):
                    return fields, (line, column), ("after-quote", line, column)
                continue
            if char in "\r\n":
                if not quoted:
                    break
                pos += 2 if text.startswith("\r\n", pos) else 1
                line, column = line + 1, 1
                continue
            if char == delimiter and not quoted:
                field_start = True
            pos, column = pos + 1, column + 1
        if quoted:
            return fields, (line, column), ("unterminated", *opened)
        if field_start:
            fields.append((line, column))
        return fields, (line, column), None


def _line_offset(text: str, line: int) -> int:
    """Where 1-based `line` starts, counting lines as the csv module does (\\n, \\r\\n, \\r)."""
    if line <= 1:
        return 0
    for number, match in enumerate(re.finditer(r"\r\n|\r|\n", text), start=2):
        if number == line:
            return match.end()
    return len(text)


def _check_header(row: list[str], record: _Record, path: StrPath) -> list[str]:
    starts, _, _ = record.scan()
    seen: dict[str, int] = {}
    for position, field in enumerate(row, start=1):
        column = starts[position - 1][1] if position <= len(starts) else None
        if not field.strip():
            raise DatasetError(
                f"header field {position} is empty. Give every column a name in the header row.",
                path=path,
                line=record.line,
                column=column,
            )
        if field in seen:
            raise DatasetError(
                f"header name {field!r} appears more than once (fields {seen[field]} and "
                f"{position}). Rename one of the columns so every name is unique.",
                path=path,
                line=record.line,
                column=column,
            )
        seen[field] = position
    return row


def _field_count_error(
    header: list[str], row: list[str], record: _Record, path: StrPath
) -> DatasetError:
    expected, found = len(header), len(row)
    starts, end, _ = record.scan()
    if found > expected:
        at = starts[expected] if len(starts) > expected else end
        what = f"field {expected + 1} has no column in the header"
        advice = (
            'Quote values that contain the delimiter (for example "a, b") or remove the '
            "extra fields."
        )
    else:
        at = end
        missing = ", ".join(repr(name) for name in header[found:])
        what = f"no value for {missing}"
        advice = "Add the missing values (an empty value is written as nothing between commas)."
    on_line = at[0] == record.line
    where = "" if on_line else f" (at line {at[0]}, column {at[1]})"
    return DatasetError(
        f"expected {expected} fields ({', '.join(header)}), found {found}: {what}{where}. {advice}",
        path=path,
        line=record.line,
        column=at[1] if on_line else None,
    )


def _csv_error(exc: csv.Error, record: _Record, path: StrPath, current_line: int) -> DatasetError:
    message = str(exc)
    starts, _, problem = record.scan()
    if problem is not None:
        kind, line, column = problem
        field = record.column_name(
            sum(1 for start in starts if start <= (line, column)) if starts else 1
        )
        if kind == "unterminated":
            return DatasetError(
                f"unterminated quoted field: the quote that opens {field} is never closed. "
                'Close the quote, and write any " inside a quoted value as "".',
                path=path,
                line=line,
                column=column,
            )
        return DatasetError(
            f"malformed CSV ({message}) in {field}: text follows its closing quote. Wrap values "
            'containing the delimiter, quotes or newlines in double quotes, and write any " '
            'inside them as "".',
            path=path,
            line=line,
            column=column,
        )
    if "unexpected end of data" in message:
        return DatasetError(
            "unterminated quoted field: a quote opened in the record starting on this line is "
            'never closed. Close the quote, and write any " inside a quoted value as "".',
            path=path,
            line=record.line,
        )
    return DatasetError(
        f"malformed CSV ({message}). Wrap values containing the delimiter, quotes or newlines "
        'in double quotes, and write any " inside them as "".',
        path=path,
        line=max(current_line, record.line),
    )
