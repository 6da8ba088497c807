"""Harness presets are data: every shipped preset loads and renders; malformed ones fail with a clear reason."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from contracts import PROVIDERS
from sessions.presets import TEMPLATE_VARS, PresetError, load_preset, render

from .conftest import PRESETS_DIR

REQUIRED = ["codex", "claude-code", "qwen-code", "pi", "gemini-cli", "opencode", "mini-swe-agent", "command"]


def variables(**over: str) -> dict[str, str]:
    values = {name: f"<{name}>" for name in TEMPLATE_VARS}
    values.update(over)
    return values


@pytest.mark.parametrize("name", REQUIRED)
def test_shipped_preset_renders_with_token_and_gateway(name: str) -> None:
    preset = load_preset(PRESETS_DIR, name)
    rendered = render(preset, variables(token="floe-TOKEN", gateway_url="http://127.0.0.1:18080"), {"command": "true"})
    everything = " ".join([*rendered.argv, *rendered.env.values(), *(c for c, _ in rendered.files.values())])
    assert "floe-TOKEN" in everything, f"{name} never hands the session token to the CLI"
    assert "<model>" in everything or (name == "command" and "FLOE_MODEL" in rendered.env)
    assert "${" not in everything
    for path in rendered.files:
        assert path.startswith("<home>/")


def test_shipped_presets_name_a_protocol_the_gateway_serves() -> None:
    served = {protocol.value for provider in PROVIDERS for protocol in provider.protocols}
    for file in PRESETS_DIR.glob("*.toml"):
        assert load_preset(PRESETS_DIR, file.stem).protocol in served | {"any"}, file.name


def test_every_provider_base_url_is_a_template_variable() -> None:
    assert {p.template_var for p in PROVIDERS} <= TEMPLATE_VARS


def test_prompt_is_one_argv_element_even_with_shell_metacharacters() -> None:
    preset = load_preset(PRESETS_DIR, "pi")
    prompt = 'fix it; rm -rf / $(whoami) `id` "quoted" ${token}'
    rendered = render(preset, variables(prompt=prompt))
    assert rendered.argv.count(prompt) == 1


def test_codex_config_points_at_gateway_responses() -> None:
    rendered = render(load_preset(PRESETS_DIR, "codex"), variables(openai_base_url="http://127.0.0.1:18080/v1"))
    ((content, mode),) = [v for k, v in rendered.files.items() if k.endswith("config.toml")]
    assert 'base_url = "http://127.0.0.1:18080/v1"' in content and 'wire_api = "responses"' in content
    assert mode == 0o600


def test_command_preset_needs_metadata_command() -> None:
    with pytest.raises(PresetError, match="metadata"):
        render(load_preset(PRESETS_DIR, "command"), variables(), {})


def write(tmp_path: Path, name: str, text: str) -> Path:
    (tmp_path / f"{name}.toml").write_text(text)
    return tmp_path


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("name = 'bad'\ncli = [", "not valid TOML"),
        ("name = 'bad'\nprotocol = 'x'\ncommand = ['x']", "cli"),
        ("name = 'bad'\ncli = 'x'\nprotocol = 'x'\ncommand = []", "command"),
        ("name = 'bad'\ncli = 'x'\nprotocol = 'x'\ncommand = ['x', '${nope}']", "unknown template variable"),
        ("name = 'bad'\ncli = 'x'\nprotocol = 'x'\ncommand = ['x', '$ oops']", "invalid"),
        ("name = 'bad'\ncli = 'x'\nprotocol = 'x'\ncommand = ['x']\nsurprise = 1", "surprise"),
        ("name = 'bad'\ncli = 'x'\nprotocol = 'x'\ncommand = ['x']\ndiff_exclude = ['../up']", "repo-relative"),
        ("name = 'other'\ncli = 'x'\nprotocol = 'x'\ncommand = ['x']", "declares name"),
        (
            "name = 'bad'\ncli = 'x'\nprotocol = 'x'\ncommand = ['x']\n[[files]]\npath = '/etc/passwd'\ncontent = ''",
            "home",
        ),
    ],
)
def test_malformed_preset_is_a_clear_error(tmp_path: Path, text: str, match: str) -> None:
    with pytest.raises(PresetError, match=match):
        load_preset(write(tmp_path, "bad", text), "bad")


def test_unknown_preset_lists_known_ones() -> None:
    with pytest.raises(PresetError, match=r"known: .*pi"):
        load_preset(PRESETS_DIR, "nonesuch")
    with pytest.raises(PresetError, match="invalid preset name"):
        load_preset(PRESETS_DIR, "../etc/passwd")


def test_public_surface() -> None:
    import sessions as sessions

    assert sorted(sessions.__all__) == sorted(n for n in sessions.__all__ if hasattr(sessions, n))
    assert {"SessionNode", "SessionSettings", "session_main"} <= set(sessions.__all__)


def test_runner_does_not_load_the_proxy() -> None:
    # Only sessions.gateway_node composes the runner with the proxy; the rest of the package stands alone.
    code = "import sys, sessions, sessions.node, sessions.cli; assert 'gateway' not in sys.modules, 'gateway loaded'"
    subprocess.run([sys.executable, "-c", code], check=True)
