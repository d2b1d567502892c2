"""llama.cpp's extra template variables (today's date, firefunction's ``functions``) and its
string-plus-null rule, on the real templates that rely on them."""

from __future__ import annotations

import json
from datetime import date

import pytest

from llamaserve.chat.template import ChatTemplate, TemplateError
from tests.llama_cpp_files import TEMPLATES
from tests.unit.test_chat_template import WEATHER_TOOL, load

USER = [{"role": "user", "content": "What is today?"}]


def test_template_dir_has_the_date_templates() -> None:
    assert (TEMPLATES / "meta-llama-Llama-3.3-70B-Instruct.jinja").is_file()
    assert (TEMPLATES / "fireworks-ai-llama-3-firefunction-v2.jinja").is_file()


def test_llama33_tells_the_model_todays_date() -> None:
    prompt = load("meta-llama-Llama-3.3-70B-Instruct.jinja").render(USER)
    assert f"Today Date: {date.today().strftime('%d %b %Y')}\n" in prompt
    # not the date frozen into the template for when the variable is missing
    assert "26 Jul 2024" not in prompt


def test_date_kwarg_replaces_todays_date() -> None:
    prompt = load("meta-llama-Llama-3.3-70B-Instruct.jinja").render(USER, date_string="01 Jan 2030")
    assert "Today Date: 01 Jan 2030\n" in prompt


@pytest.mark.parametrize("tools", [None, []])
def test_firefunction_renders_without_tools(tools: list[dict[str, object]] | None) -> None:
    prompt = load("fireworks-ai-llama-3-firefunction-v2.jinja").render(USER, tools=tools)
    assert f"Today is {date.today().strftime('%b %d %Y')}." in prompt
    assert "Available functions as JSON spec:\n\nToday is" in prompt


def test_firefunction_lists_the_offered_tools() -> None:
    prompt = load("fireworks-ai-llama-3-firefunction-v2.jinja").render(USER, tools=[WEATHER_TOOL])
    spec = json.dumps([WEATHER_TOOL], indent=2)
    assert f"Available functions as JSON spec:\n{spec}\nToday is" in prompt


def test_functions_is_defined_only_when_tools_are_offered() -> None:
    template = ChatTemplate("{{ 'yes' if functions is defined else 'no' }}")
    assert template.render(USER, tools=[WEATHER_TOOL]) == "yes"
    assert template.render(USER, tools=[]) == "no"
    assert template.render(USER) == "no"


def test_string_plus_undefined_or_none_is_the_string() -> None:
    template = ChatTemplate("{{ 'a' + missing + 'b' }}|{{ none + 'c' }}|{{ 'd' + none }}")
    assert template.render(USER) == "ab|c|d"


@pytest.mark.parametrize("source", ["{{ 1 + missing }}", "{{ missing + none }}", "{{ 1 + none }}"])
def test_other_null_arithmetic_still_fails(source: str) -> None:
    with pytest.raises(TemplateError):
        ChatTemplate(source).render(USER)
