"""Tests for cobalt.dataset: loading, validation errors, immutable transformations, keys."""

from __future__ import annotations

import ast
import csv
import io
import pickle
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import cobalt.dataset
from cobalt.dataset import Dataset, DatasetError, item_key


def write(path: Path, text: str, encoding: str = "utf-8") -> Path:
    """Write text exactly as given (no newline translation)."""
    path.write_bytes(text.encode(encoding))
    return path


# ---------------------------------------------------------------------- inline datasets


def test_inline_items_are_kept_in_order_with_default_source_inline():
    ds = Dataset([{"input": "a"}, {"input": "b"}], name="tiny")

    assert ds.items == [{"input": "a"}, {"input": "b"}]
    assert len(ds) == 2
    assert list(ds) == [{"input": "a"}, {"input": "b"}]
    assert ds[0] == {"input": "a"}
    assert ds[-1] == {"input": "b"}
    assert ds.name == "tiny"
    assert ds.source == "inline"
    assert ds.sample_seed is None
    assert repr(ds) == "Dataset(name='tiny', source='inline', len=2)"


def test_empty_dataset_has_no_items_and_no_name():
    ds = Dataset()

    assert len(ds) == 0
    assert ds.items == []
    assert ds.name is None
    assert ds.keys() == []


def test_inline_items_accept_any_iterable_such_as_a_generator():
    ds = Dataset({"n": i} for i in range(3))

    assert ds.items == [{"n": 0}, {"n": 1}, {"n": 2}]


def test_non_dict_inline_item_is_rejected_naming_its_index():
    with pytest.raises(DatasetError) as info:
        Dataset([{"input": "ok"}, {"input": "ok"}, "not a dict"])

    assert "item at index 2 is a string, expected a dict" in str(info.value)
    assert info.value.path is None
    assert info.value.line is None


def test_passing_a_single_dict_instead_of_a_list_explains_how_to_wrap_it():
    with pytest.raises(DatasetError, match=r"Wrap a single item in a list"):
        Dataset({"input": "a"})


def test_index_out_of_range_raises_index_error_and_non_int_index_raises_type_error():
    ds = Dataset([{"a": 1}])

    with pytest.raises(IndexError, match="dataset has 1 items"):
        ds[1]
    with pytest.raises(TypeError, match=r"dataset\.slice"):
        ds["a"]  # type: ignore[index]


def test_dataset_attributes_cannot_be_reassigned():
    ds = Dataset([{"a": 1}])

    with pytest.raises(AttributeError, match="immutable"):
        ds.name = "other"  # type: ignore[misc]
    with pytest.raises(AttributeError, match="immutable"):
        ds._items = ()  # type: ignore[misc]
    assert ds.items == [{"a": 1}]


def test_changing_the_input_dicts_after_construction_does_not_change_the_dataset():
    source = [{"input": "a"}]
    ds = Dataset(source)

    source[0]["input"] = "changed"
    source.append({"input": "b"})

    assert ds.items == [{"input": "a"}]


# ---------------------------------------------------------------------- from_file dispatch


def test_from_file_dispatches_on_extension_and_names_dataset_after_the_file(tmp_path):
    json_ds = Dataset.from_file(write(tmp_path / "qa.json", '[{"q": "1"}]'))
    jsonl_ds = Dataset.from_file(write(tmp_path / "qa.jsonl", '{"q": "2"}\n'))
    ndjson_ds = Dataset.from_file(write(tmp_path / "qa.ndjson", '{"q": "3"}\n'))
    csv_ds = Dataset.from_file(write(tmp_path / "qa.csv", "q\n4\n"))
    upper_ds = Dataset.from_file(write(tmp_path / "QA.JSON", '[{"q": "5"}]'))

    assert json_ds.items == [{"q": "1"}]
    assert jsonl_ds.items == [{"q": "2"}]
    assert ndjson_ds.items == [{"q": "3"}]
    assert csv_ds.items == [{"q": "4"}]
    assert upper_ds.items == [{"q": "5"}]
    assert json_ds.name == "qa"
    assert json_ds.source == str(tmp_path / "qa.json")
    assert upper_ds.name == "QA"


def test_from_file_accepts_a_string_path_and_an_explicit_name(tmp_path):
    path = write(tmp_path / "qa.jsonl", '{"q": 1}\n')

    ds = Dataset.from_file(str(path), name="questions")

    assert ds.name == "questions"
    assert ds.source == str(path)
    assert repr(ds) == f"Dataset(name='questions', source={str(path)!r}, len=1)"


def test_from_file_rejects_unknown_extension_naming_the_supported_ones(tmp_path):
    path = write(tmp_path / "qa.txt", "hello")

    with pytest.raises(DatasetError) as info:
        Dataset.from_file(path)

    message = str(info.value)
    assert message.startswith(f"{path}: unsupported dataset file type ('.txt')")
    assert ".json, .jsonl, .ndjson, .csv" in message
    assert info.value.path == str(path)


def test_from_file_reports_a_missing_file_by_path(tmp_path):
    path = tmp_path / "datasets" / "missing.jsonl"

    with pytest.raises(DatasetError) as info:
        Dataset.from_file(path)

    assert str(info.value).startswith(f"{path}: file not found.")
    assert info.value.path == str(path)
    assert info.value.line is None


def test_direct_loaders_also_report_a_missing_file(tmp_path):
    for loader in (Dataset.from_json, Dataset.from_jsonl, Dataset.from_csv):
        with pytest.raises(DatasetError, match="file not found"):
            loader(tmp_path / "nope")


def test_a_directory_is_reported_as_not_a_dataset_file(tmp_path):
    folder = tmp_path / "data.json"
    folder.mkdir()

    with pytest.raises(DatasetError, match="is a directory"):
        Dataset.from_file(folder)


def test_non_utf8_file_is_reported_with_the_line_and_column_of_the_bad_byte(tmp_path):
    path = tmp_path / "qa.csv"
    path.write_bytes(b"input\nok\ncaf\xe9\n")

    with pytest.raises(DatasetError) as info:
        Dataset.from_file(path)

    assert str(info.value).startswith(f"{path}, line 3, column 4: the file is not valid UTF-8")
    assert "Re-save the file with UTF-8" in str(info.value)


# ---------------------------------------------------------------------- JSON


def test_json_top_level_array_of_objects_is_loaded(tmp_path):
    path = write(tmp_path / "qa.json", '[{"input": "2+2", "expected": 4}, {"input": "hi"}]')

    ds = Dataset.from_json(path)

    assert ds.items == [{"input": "2+2", "expected": 4}, {"input": "hi"}]


def test_json_object_with_items_array_is_loaded(tmp_path):
    path = write(tmp_path / "qa.json", '{"description": "x", "items": [{"id": 1}, {"id": 2}]}')

    ds = Dataset.from_json(path)

    assert ds.items == [{"id": 1}, {"id": 2}]
    assert ds.keys() == ["1", "2"]


def test_json_with_a_byte_order_mark_is_loaded(tmp_path):
    path = tmp_path / "qa.json"
    path.write_bytes(b'\xef\xbb\xbf[{"a": "b"}]')

    assert Dataset.from_json(path).items == [{"a": "b"}]


def test_invalid_json_names_file_line_and_column(tmp_path):
    path = write(tmp_path / "qa.json", '[\n  {"input": "a"},\n  {"input": "b" "x": 1}\n]\n')

    with pytest.raises(DatasetError) as info:
        Dataset.from_json(path)

    err = info.value
    assert (err.path, err.line, err.column) == (str(path), 3, 17)
    assert str(err).startswith(f"{path}, line 3, column 17: invalid JSON (Expecting ',' delimiter)")


def test_json_element_that_is_not_an_object_is_reported_by_index(tmp_path):
    path = write(tmp_path / "qa.json", '[{"a": 1}, {"a": 2}, [1, 2]]')

    with pytest.raises(DatasetError) as info:
        Dataset.from_json(path)

    assert str(info.value).startswith(
        f"{path}: item at index 2 of the top-level array is an array, expected an object."
    )


def test_json_items_element_that_is_not_an_object_is_reported_by_index(tmp_path):
    path = write(tmp_path / "qa.json", '{"items": [{"a": 1}, "oops"]}')

    with pytest.raises(DatasetError, match=r'item at index 1 of the "items" array is a string'):
        Dataset.from_json(path)


def test_json_object_without_items_array_explains_the_expected_shapes(tmp_path):
    no_items = write(tmp_path / "a.json", '{"rows": []}')
    bad_items = write(tmp_path / "b.json", '{"items": {"a": 1}}')
    scalar = write(tmp_path / "c.json", "42")

    with pytest.raises(DatasetError, match=r'found an object without an "items" array'):
        Dataset.from_json(no_items)
    with pytest.raises(DatasetError, match=r'found an object whose "items" is an object'):
        Dataset.from_json(bad_items)
    with pytest.raises(DatasetError, match=r"found a number\. Use \["):
        Dataset.from_json(scalar)


def test_empty_json_file_is_invalid_json_on_line_1(tmp_path):
    path = write(tmp_path / "qa.json", "")

    with pytest.raises(DatasetError) as info:
        Dataset.from_json(path)

    assert (info.value.line, info.value.column) == (1, 1)
    assert "invalid JSON (Expecting value)" in str(info.value)


# ---------------------------------------------------------------------- JSON Lines


def test_jsonl_skips_blank_lines_and_handles_crlf(tmp_path):
    path = write(tmp_path / "qa.jsonl", '{"n": 1}\r\n\r\n   \n{"n": 2}\n\n{"n": 3}')

    ds = Dataset.from_jsonl(path)

    assert ds.items == [{"n": 1}, {"n": 2}, {"n": 3}]


def test_jsonl_keeps_unicode_line_separators_inside_strings(tmp_path):
    path = write(tmp_path / "qa.jsonl", '{"text": "a\u2028b\u0085c"}\n{"text": "d"}\n')

    ds = Dataset.from_jsonl(path)

    assert ds.items == [{"text": "a\u2028b\u0085c"}, {"text": "d"}]


def test_invalid_jsonl_line_is_reported_with_line_column_and_advice(tmp_path):
    path = write(tmp_path / "qa.jsonl", '{"input": "a"}\n\n{"input": "b" "x": 1}\n{"input": "c"}\n')

    with pytest.raises(DatasetError) as info:
        Dataset.from_jsonl(path)

    assert str(info.value) == (
        f"{path}, line 3, column 15: invalid JSON (Expecting ',' delimiter). "
        "Fix that line or remove it."
    )
    assert (info.value.line, info.value.column) == (3, 15)


def test_jsonl_line_that_is_not_an_object_is_reported_by_line(tmp_path):
    path = write(tmp_path / "qa.jsonl", '{"a": 1}\n{"a": 2}\n\n["a", 1]\n')

    with pytest.raises(DatasetError) as info:
        Dataset.from_jsonl(path)

    assert str(info.value).startswith(f"{path}, line 4: expected a JSON object, found an array.")
    assert info.value.column is None


# ---------------------------------------------------------------------- CSV


def test_csv_reads_header_and_keeps_values_as_strings(tmp_path):
    path = write(tmp_path / "qa.csv", "input,expected,score\nwhat is 2+2?,4,1.0\nhello,,0\n")

    ds = Dataset.from_csv(path)

    assert ds.items == [
        {"input": "what is 2+2?", "expected": "4", "score": "1.0"},
        {"input": "hello", "expected": "", "score": "0"},
    ]


def test_csv_handles_quoted_commas_doubled_quotes_and_newlines_inside_quotes(tmp_path):
    text = (
        "input,expected\r\n"
        '"Paris, France","capital"\r\n'
        '"She said ""hi""","a ""quoted"" word"\r\n'
        '"line one\r\nline two\nline three",multi\r\n'
    )
    path = write(tmp_path / "qa.csv", text)

    ds = Dataset.from_csv(path)

    assert ds.items == [
        {"input": "Paris, France", "expected": "capital"},
        {"input": 'She said "hi"', "expected": 'a "quoted" word'},
        {"input": "line one\r\nline two\nline three", "expected": "multi"},
    ]


def test_csv_with_utf8_bom_has_a_clean_first_header_name(tmp_path):
    path = tmp_path / "qa.csv"
    path.write_bytes("\ufeffinput,expected\nçà,ü\n".encode())

    ds = Dataset.from_csv(path)

    assert ds.items == [{"input": "çà", "expected": "ü"}]


def test_csv_skips_blank_lines_and_accepts_a_custom_delimiter(tmp_path):
    path = write(tmp_path / "qa.csv", "\ninput;expected\n\na,b;c\n\n")

    ds = Dataset.from_csv(path, delimiter=";")

    assert ds.items == [{"input": "a,b", "expected": "c"}]


def test_csv_with_only_a_header_is_an_empty_dataset(tmp_path):
    path = write(tmp_path / "qa.csv", "input,expected\n")

    ds = Dataset.from_csv(path)

    assert len(ds) == 0
    assert ds.name == "qa"


def test_empty_csv_file_asks_for_a_header_row(tmp_path):
    path = write(tmp_path / "qa.csv", "")

    with pytest.raises(DatasetError) as info:
        Dataset.from_csv(path)

    assert str(info.value).startswith(f"{path}: the file is empty; expected a header row")


def test_csv_duplicate_header_name_is_reported_on_line_1(tmp_path):
    path = write(tmp_path / "qa.csv", "input,expected,input\na,b,c\n")

    with pytest.raises(DatasetError) as info:
        Dataset.from_csv(path)

    assert str(info.value).startswith(
        f"{path}, line 1, column 16: header name 'input' appears more than once (fields 1 and 3)."
    )


def test_csv_empty_header_name_is_reported_with_its_position(tmp_path):
    path = write(tmp_path / "qa.csv", "\ninput,,expected\na,b,c\n")

    with pytest.raises(DatasetError) as info:
        Dataset.from_csv(path)

    assert (info.value.line, info.value.column) == (2, 7)
    assert str(info.value).startswith(f"{path}, line 2, column 7: header field 2 is empty.")


def test_csv_row_with_too_many_fields_names_the_line_where_the_record_starts(tmp_path):
    text = 'input,expected\n"multi\nline",ok\n\nPar,is,France\n'
    path = write(tmp_path / "qa.csv", text)

    with pytest.raises(DatasetError) as info:
        Dataset.from_csv(path)

    assert (info.value.line, info.value.column) == (5, 8)
    assert str(info.value).startswith(
        f"{path}, line 5, column 8: expected 2 fields (input, expected), found 3: "
        "field 3 has no column in the header."
    )
    assert "Quote values that contain the delimiter" in str(info.value)


def test_csv_multiline_record_with_too_many_fields_names_its_first_line(tmp_path):
    text = 'input,expected\na,b\n"starts here\nand continues",x,extra\n'
    path = write(tmp_path / "qa.csv", text)

    with pytest.raises(DatasetError) as info:
        Dataset.from_csv(path)

    assert (info.value.line, info.value.column) == (3, None)
    assert "field 3 has no column in the header (at line 4, column 18)." in str(info.value)


def test_csv_row_with_too_few_fields_is_an_error_naming_the_line(tmp_path):
    path = write(tmp_path / "qa.csv", "input,expected,tag\na,b,c\nonly,two\n")

    with pytest.raises(DatasetError) as info:
        Dataset.from_csv(path)

    assert str(info.value).startswith(
        f"{path}, line 3, column 9: expected 3 fields (input, expected, tag), found 2: "
        "no value for 'tag'."
    )
    assert "Add the missing values" in str(info.value)


def test_csv_unterminated_quote_names_the_line_where_the_quote_opens(tmp_path):
    path = write(tmp_path / "qa.csv", 'input,expected\na,b\n"never closed,c\nd,e\nf,g\n')

    with pytest.raises(DatasetError) as info:
        Dataset.from_csv(path)

    assert (info.value.line, info.value.column) == (3, 1)
    assert str(info.value).startswith(
        f"{path}, line 3, column 1: unterminated quoted field: the quote that opens "
        "field 1 ('input') is never closed."
    )
    assert 'write any " inside a quoted value as ""' in str(info.value)


def test_csv_text_after_a_closing_quote_is_reported_as_malformed_on_its_line(tmp_path):
    path = write(tmp_path / "qa.csv", 'input,expected\na,b\n"quoted"trailing,c\n')

    with pytest.raises(DatasetError) as info:
        Dataset.from_csv(path)

    assert (info.value.line, info.value.column) == (3, 9)
    assert str(info.value).startswith(f"{path}, line 3, column 9: malformed CSV (")
    assert "in field 1 ('input'): text follows its closing quote." in str(info.value)


def test_csv_errors_name_the_field_of_a_later_column(tmp_path):
    path = write(tmp_path / "qa.csv", 'input,expected\na,b\nc,"x"y\n')

    with pytest.raises(DatasetError) as info:
        Dataset.from_csv(path)

    assert (info.value.line, info.value.column) == (3, 6)
    assert "in field 2 ('expected')" in str(info.value)


text_values = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=20)
header_names = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\ufeff"),
    min_size=1,
    max_size=10,
).filter(lambda name: name.strip() != "" and name != "id")  # equal ids are refused


@st.composite
def csv_tables(draw):
    fieldnames = draw(st.lists(header_names, min_size=1, max_size=5, unique=True))
    rows = draw(
        st.lists(st.fixed_dictionaries({name: text_values for name in fieldnames}), max_size=8)
    )
    return fieldnames, rows


@settings(max_examples=200, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(table=csv_tables())
def test_any_table_of_text_written_with_dictwriter_reads_back_identically(tmp_path, table):
    fieldnames, rows = table
    buffer = io.StringIO(newline="")
    writer = csv.DictWriter(buffer, fieldnames=fieldnames)
    writer.writeheader()
    writer.writerows(rows)
    path = tmp_path / "table.csv"
    path.write_bytes(buffer.getvalue().encode("utf-8"))

    ds = Dataset.from_csv(path)

    assert ds.items == rows


# ---------------------------------------------------------------------- transformations


def test_map_returns_a_new_dataset_and_leaves_the_original_unchanged():
    original = Dataset([{"q": "a"}, {"q": "b"}], name="qa")

    upper = original.map(lambda item: {**item, "q": item["q"].upper()})

    assert upper.items == [{"q": "A"}, {"q": "B"}]
    assert upper is not original
    assert original.items == [{"q": "a"}, {"q": "b"}]
    assert (upper.name, upper.source) == ("qa", "inline")


def test_map_function_that_mutates_its_argument_does_not_change_the_original():
    original = Dataset([{"q": "a"}])

    def mutate(item):
        item["q"] = "changed"
        item["extra"] = True
        return item

    mapped = original.map(mutate)

    assert mapped.items == [{"q": "changed", "extra": True}]
    assert original.items == [{"q": "a"}]


def test_map_function_that_does_not_return_a_dict_is_reported_by_item_index():
    ds = Dataset([{"q": "a"}, {"q": "b"}, {"q": "c"}])

    with pytest.raises(DatasetError) as info:
        ds.map(lambda item: item["q"] if item["q"] == "b" else item)

    assert str(info.value).startswith(
        "map function returned a string for item at index 1, expected a dict."
    )


def test_map_function_exception_gets_a_note_naming_the_item():
    ds = Dataset([{"q": "a"}, {"x": "b"}], name="qa")

    with pytest.raises(KeyError) as info:
        ds.map(lambda item: {"q": item["q"]})

    assert "(while mapping item at index 1 of dataset 'qa')" in info.value.__notes__


def test_filter_returns_a_new_dataset_and_leaves_the_original_unchanged():
    original = Dataset([{"n": i} for i in range(5)])

    evens = original.filter(lambda item: item["n"] % 2 == 0)

    assert evens.items == [{"n": 0}, {"n": 2}, {"n": 4}]
    assert len(original) == 5


def test_slice_follows_python_slicing_and_leaves_the_original_unchanged():
    original = Dataset([{"n": i} for i in range(5)])

    assert original.slice(1, 3).items == [{"n": 1}, {"n": 2}]
    assert original.slice(3).items == [{"n": 3}, {"n": 4}]
    assert original.slice(-2).items == [{"n": 3}, {"n": 4}]
    assert original.slice(4, 100).items == [{"n": 4}]
    assert original.slice(10).items == []
    assert len(original) == 5


def test_mutating_items_or_iterated_or_indexed_items_does_not_change_the_dataset():
    ds = Dataset([{"q": "a"}])

    items = ds.items
    items[0]["q"] = "changed"
    items.append({"q": "new"})
    for item in ds:
        item["q"] = "changed again"
    ds[0]["q"] = "and again"

    assert ds.items == [{"q": "a"}]
    assert len(ds) == 1


# ---------------------------------------------------------------------- sampling


def test_seeded_sample_is_reproducible_and_differs_across_seeds():
    ds = Dataset([{"n": i} for i in range(100)])

    first = ds.sample(10, seed=42)
    again = ds.sample(10, seed=42)
    other = ds.sample(10, seed=43)

    assert len(first) == 10
    assert first.items == again.items
    assert first.items != other.items
    assert first.sample_seed == 42
    assert all(item in ds.items for item in first.items)
    assert len({item["n"] for item in first}) == 10
    assert len(ds) == 100


def test_sample_without_seed_records_a_seed_that_reproduces_it():
    ds = Dataset([{"n": i} for i in range(1000)])

    sampled = ds.sample(20)

    assert isinstance(sampled.sample_seed, int)
    assert 0 <= sampled.sample_seed < 2**32
    assert ds.sample(20, seed=sampled.sample_seed).items == sampled.items
    assert f"sample_seed={sampled.sample_seed}" in repr(sampled)
    assert ds.sample_seed is None


def test_sample_larger_than_the_dataset_returns_all_items_in_original_order():
    ds = Dataset([{"n": i} for i in range(5)])

    assert ds.sample(5, seed=1).items == ds.items
    assert ds.sample(50).items == ds.items
    assert ds.sample(0, seed=1).items == []


def test_sample_seed_is_kept_through_later_transformations():
    ds = Dataset([{"n": i} for i in range(50)])

    narrowed = ds.sample(10, seed=7).filter(lambda item: item["n"] > 10).slice(0, 3)

    assert narrowed.sample_seed == 7


def test_negative_sample_size_is_rejected():
    with pytest.raises(DatasetError, match="non-negative integer, got -1"):
        Dataset([{"n": 1}]).sample(-1)


# ---------------------------------------------------------------------- item keys


def test_item_key_uses_the_id_field_as_a_string():
    assert item_key({"id": 17, "input": "x"}) == "17"
    assert item_key({"id": "q-1"}) == "q-1"


def test_item_key_without_id_is_a_short_content_hash_stable_across_key_order():
    key = item_key({"input": "2+2", "expected": "4"})

    assert key.startswith("sha256:")
    assert len(key) == len("sha256:") + 16
    assert key == item_key({"expected": "4", "input": "2+2"})
    assert key != item_key({"input": "2+2", "expected": "5"})
    assert item_key({"id": None, "input": "a"}) == item_key({"id": None, "input": "a"})
    assert item_key({"id": None, "input": "a"}).startswith("sha256:")


def test_item_key_hash_matches_the_documented_canonical_json():
    import hashlib

    canonical = '{"a":"é","b":[1,2]}'
    expected = "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()[:16]

    assert item_key({"b": [1, 2], "a": "é"}) == expected


def test_item_key_handles_values_that_are_not_json_serializable():
    from datetime import date

    assert item_key({"when": date(2024, 1, 2)}) == item_key({"when": "2024-01-02"})


def test_dataset_keys_lists_one_key_per_item_in_order():
    ds = Dataset([{"id": 1}, {"input": "x"}, {"id": "b"}])

    assert ds.keys() == ["1", item_key({"input": "x"}), "b"]


# ---------------------------------------------------------------------- unique ids


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            '{"id": "same", "input": 1}\n\n{"id": "x"}\n{"id": "same", "input": 2}\n',
            "line 4: item at index 2 has the id 'same', already used by the item at index 0 "
            "(line 1). Ids must be unique within a dataset",
        ),
        (
            '{"id": 1}\n{"id": "1"}\n',
            "line 2: item at index 1 has the id '1', already used by the item at index 0 "
            "(line 1), as 1: ids compare as text.",
        ),
    ],
)
def test_a_duplicate_id_in_a_jsonl_file_names_both_items_and_lines(tmp_path, text, message):
    path = write(tmp_path / "qa.jsonl", text)

    with pytest.raises(DatasetError) as info:
        Dataset.from_file(path)

    assert str(info.value).startswith(f"{path}, {message}")
    assert "Give each item its own id, or remove the duplicate." in str(info.value)


def test_a_duplicate_id_in_a_csv_file_names_the_lines_of_both_records(tmp_path):
    path = write(tmp_path / "qa.csv", 'id,input\n1,a\n"2",b\n1,c\n')

    with pytest.raises(DatasetError) as info:
        Dataset.from_file(path)

    assert info.value.line == 4
    assert "item at index 2 has the id '1', already used by the item at index 0 (line 2)" in (
        str(info.value)
    )


@pytest.mark.parametrize(
    "text",
    [
        '[\n  {"id": "a"},\n  {"id": "b", "x": [1, 2]}, {"id": "c"},\n  {"id": "a"}\n]',
        '{"description": "x", "n": {"a": [1]},\n "items": [{"id": "a"},\n{"id": "b"}, '
        '{"id": "c"}, \n\n {"id": "a"}]}',
    ],
)
def test_a_duplicate_id_in_a_json_file_names_both_items_and_lines(tmp_path, text):
    path = write(tmp_path / "qa.json", text)

    with pytest.raises(DatasetError) as info:
        Dataset.from_file(path)

    second = 4 if text.startswith("[") else 5
    assert str(info.value).startswith(
        f"{path}, line {second}: item at index 3 has the id 'a', already used by the item at "
        "index 0 (line 2)."
    )


def test_a_duplicate_id_inline_or_after_map_names_both_indexes():
    with pytest.raises(DatasetError, match="^item at index 1 has the id '7', already used"):
        Dataset([{"id": 7}, {"id": "7"}])

    numbered = Dataset([{"id": 1, "n": 1}, {"id": 2, "n": 2}])
    with pytest.raises(DatasetError, match="^item at index 1 has the id 'n', already used"):
        numbered.map(lambda item: {**item, "id": "n"})


def test_identical_items_without_ids_stay_allowed_as_the_same_test_case():
    ds = Dataset([{"input": "hi"}, {"input": "hi"}, {"id": None, "input": "x"}, {"id": None}])

    assert len(ds) == 4


# ---------------------------------------------------------------------- NaN and Infinity


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        (
            "qa.jsonl",
            '{"input": "ok"}\n{"input": "x", "metadata": {"scores": [1, NaN]}}\n',
            "line 2, column 43: field 'metadata.scores[1]' is NaN",
        ),
        (
            "qa.json",
            '{"items": [\n {"input": "a"},\n {"input": "NaN", "x": -Infinity}\n]}',
            "line 3, column 24: item at index 1: field 'x' is -Infinity",
        ),
        ("qa.json", '[{"a": 1}, {"b": Infinity}]', "line 1, column 18: item at index 1: field 'b'"),
        ("qa.jsonl", "NaN\n", "line 1, column 1: the value is NaN"),
        ("qa.jsonl", '{"a": NaN, oops}\n', "line 1, column 7: a value is NaN"),
    ],
)
def test_nan_and_infinity_in_a_json_file_are_errors_naming_line_column_and_field(
    tmp_path, name, text, message
):
    path = write(tmp_path / name, text)

    with pytest.raises(DatasetError) as info:
        Dataset.from_file(path)

    assert str(info.value).startswith(f"{path}, {message}")
    assert "which a dataset cannot hold (items are stored as standard JSON)" in str(info.value)
    assert 'Write a number, null or a string such as "NaN" instead.' in str(info.value)


def test_nan_or_infinity_in_an_inline_or_mapped_dataset_is_an_error_naming_item_and_field():
    with pytest.raises(DatasetError) as info:
        Dataset([{"id": 1, "x": 1.0}, {"id": 2, "scores": {"p": [0.5, float("nan")]}}])
    assert str(info.value).startswith(
        "item at index 1: field 'scores.p[1]' is nan, which a dataset cannot hold"
    )

    with pytest.raises(DatasetError, match="^item at index 0: field 'x' is inf, which"):
        Dataset([{"x": 1.0}]).map(lambda item: {"x": item["x"] * float("inf")})


def test_nan_as_a_string_or_in_a_key_is_data_not_an_error(tmp_path):
    path = write(tmp_path / "qa.jsonl", '{"NaN": "Infinity", "input": "NaN \\" Infinity"}\n')

    assert Dataset.from_file(path).items == [{"NaN": "Infinity", "input": 'NaN " Infinity'}]


# ---------------------------------------------------------------------- the error type


def test_dataset_error_is_a_value_error_with_location_attributes():
    err = DatasetError("bad thing. Fix it.", path="datasets/qa.jsonl", line=3, column=12)

    assert isinstance(err, ValueError)
    assert str(err) == "datasets/qa.jsonl, line 3, column 12: bad thing. Fix it."
    assert (err.path, err.line, err.column, err.reason) == (
        "datasets/qa.jsonl",
        3,
        12,
        "bad thing. Fix it.",
    )
    assert str(DatasetError("no location.")) == "no location."
    assert str(DatasetError("x.", path=Path("a.csv"))) == "a.csv: x."


def test_dataset_error_survives_pickling_with_its_attributes():
    err = DatasetError("bad.", path="qa.csv", line=2)

    copy = pickle.loads(pickle.dumps(err))

    assert str(copy) == "qa.csv, line 2: bad."
    assert (copy.path, copy.line, copy.column) == ("qa.csv", 2, None)


def test_dataset_module_imports_only_the_standard_library_and_the_error_family():
    source = Path(cobalt.dataset.__file__).read_text(encoding="utf-8")
    imported = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            imported.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, "no relative imports"
            imported.add(node.module)

    assert imported
    outside = {name for name in imported if name.split(".")[0] not in sys.stdlib_module_names}
    assert outside <= {"__future__", "cobalt.errors"}


# ---------------------------------------------------------------------- before any agent call

EXPERIMENT = """
from pathlib import Path

from cobalt import Dataset, experiment


def run(ctx):
    with open(Path(__file__).parent / "agent-calls.txt", "a") as calls:
        calls.write("called\\n")
    return "ok"


experiment("qa", Dataset.from_file("datasets/qa.jsonl"), run)
"""


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        (
            '{"id": 1, "input": "a"}\n{"id": 2, "input": "b"}\n{"id": "1", "input": "c"}\n',
            "datasets/qa.jsonl, line 3: item at index 2 has the id '1', already used by the "
            "item at index 0 (line 1)",
        ),
        (
            '{"id": 1, "input": "a"}\n{"id": 2, "input": "b", "metadata": {"p": NaN}}\n',
            "datasets/qa.jsonl, line 2, column 43: field 'metadata.p' is NaN",
        ),
    ],
)
def test_cobalt_run_refuses_the_dataset_before_calling_the_agent(
    project, cobalt_cli, lines, message
):
    project.write("datasets/qa.jsonl", lines)
    project.write("experiments/qa.cobalt.py", EXPERIMENT)

    done = cobalt_cli(project, "run")

    assert done.returncode == 2, done.stdout + done.stderr
    assert message in done.stdout + done.stderr
    assert not (project.path / "experiments" / "agent-calls.txt").exists()
    assert project.results_files() == []
