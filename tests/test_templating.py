import pytest

from cobalt_app.templating import TemplateError, render, template_context


def test_it_renders_item_fields_dotted_paths_and_the_reserved_names():
    item = {"input": "capital of France?", "expected_output": "Paris", "ctx": {"lang": "fr"}}
    context = template_context(item, "Paris!", {"model": "gpt-4o", "tokens": 12})
    text = render(
        "Q={{input}} A={{ output }} E={{expected_output}} L={{ctx.lang}} M={{metadata.model}}",
        context,
    )
    assert text == "Q=capital of France? A=Paris! E=Paris L=fr M=gpt-4o"


def test_an_item_field_named_output_never_overrides_the_agent_output():
    context = template_context({"input": "q", "output": "FROM DATASET"}, "FROM AGENT", {})
    assert render("{{output}} / {{item.output}}", context) == "FROM AGENT / FROM DATASET"


def test_non_string_values_are_rendered_as_json():
    context = template_context({"input": {"q": 1}}, ["a", "b"], {})
    assert render("{{input}} {{output}}", context) == '{"q": 1} ["a", "b"]'


def test_an_unknown_placeholder_is_an_error_naming_it():
    with pytest.raises(TemplateError, match=r"\{\{expected\}\}"):
        render("{{expected}}", template_context({"input": "q"}, "a", {}))


def test_bracket_indexes_and_mixed_paths_are_rendered():
    item = {"tags": ["a", "b"], "items": [{"name": "N"}], "m": {"a key": {"k": [0, 7]}}}
    context = template_context(item, "o", {"x": [1, {"y": 2}]})
    text = render(
        "{{tags[0]}} {{items[0].name}} {{ metadata.x[1].y }} {{m['a key'].k[1]}} {{tags.1}}",
        context,
    )
    assert text == "a N 2 7 b"


@pytest.mark.parametrize("placeholder", ["{{tags[x]}}", "{{ a b }}", "{{}}", "{{tags[-1]}}"])
def test_a_placeholder_that_is_not_a_path_is_an_error_naming_it(placeholder):
    with pytest.raises(TemplateError, match="is not a field path") as error:
        render(f"{{{{output}}}} {placeholder}", template_context({"tags": ["a"]}, "o", {}))
    assert "{{" + placeholder[2:-2].strip() + "}}" in str(error.value)
