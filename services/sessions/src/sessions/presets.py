"""Harness presets: data files (TOML) that say how to run one agent CLI headless against this node's gateway.

A preset names the CLI, its argv, the environment and config files that point it at the gateway with the session
token as API key, the model name to present, and the state folders to leave out of the diff. Presets live in
``services/sessions/presets/<name>.toml``; adding a harness is adding a file, not code.

Templates use ``${var}`` (``string.Template``; ``$$`` is a literal ``$``), so JSON and TOML config bodies need no
escaping. Rendering is strict: an unknown variable makes the preset malformed, never an empty string in argv.
Variables: see ``TEMPLATE_VARS``.
"""

from __future__ import annotations

import string
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from contracts import PROVIDERS

__all__ = [
    "TEMPLATE_VARS",
    "ConfigFile",
    "Preset",
    "PresetError",
    "RenderedHarness",
    "load_preset",
    "render",
]

TEMPLATE_VARS: frozenset[str] = frozenset(
    {
        "session_id",
        "task_id",
        "token",  # the per-session gateway credential, used as every provider's API key
        "model",  # the model name presented to the harness
        "gateway_url",  # http://127.0.0.1:<inner port> inside the sandbox
        # one per provider API family: openai_base_url (${gateway_url}/v1), anthropic_base_url, google_base_url
        *(p.template_var for p in PROVIDERS),
        "prompt",  # the task's problem statement
        "prompt_file",  # the same text in a file under ${home}
        "workspace",  # the repository, writable
        "home",  # the harness's private HOME, writable, outside the diff
        "harness_home",  # where deploy/harnesses/install.sh put the CLIs (read-only)
    }
)


class PresetError(ValueError):
    """A preset file that is missing, unparsable, or does not validate: the session fails with this reason."""


class ConfigFile(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    path: str = Field(description="must start with ${home}/: config lives in the private HOME, never the repo")
    content: str
    mode: int = 0o600

    @field_validator("path")
    @classmethod
    def _under_home(cls, value: str) -> str:
        if not value.startswith("${home}/") or ".." in Path(value).parts:
            raise ValueError(f"config file path must start with ${{home}}/ and not contain '..': {value!r}")
        return value


class Preset(BaseModel):
    """One harness preset, as parsed from its TOML file."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    description: str = ""
    cli: str = Field(description="executable looked up on the sandbox PATH before launch (missing -> FAILED)")
    protocol: str = Field(description="wire protocol the CLI speaks (informational; the gateway detects it)")
    command: list[str] = Field(min_length=1)
    env: dict[str, str] = Field(default_factory=dict)
    files: list[ConfigFile] = Field(default_factory=list)
    diff_exclude: list[str] = Field(default_factory=list, description="repo-relative paths left out of the diff")
    success_exit_codes: list[int] = Field(default_factory=lambda: [0])
    path: list[str] = Field(
        default_factory=lambda: ["${harness_home}/npm/bin", "${harness_home}/mini-swe-agent/bin"],
        description="prepended to PATH inside the sandbox",
    )
    version: str = Field(default="", description="CLI version the preset was checked against")
    command_from_metadata: bool = Field(
        default=False, description="generic preset: the request's metadata['command'] is run with /bin/sh -c"
    )

    @field_validator("diff_exclude")
    @classmethod
    def _relative(cls, value: list[str]) -> list[str]:
        for item in value:
            if item.startswith("/") or ".." in Path(item).parts or not item:
                raise ValueError(f"diff_exclude entries are repo-relative paths: {item!r}")
        return value

    def check_templates(self) -> None:
        """Fail early on a ``${var}`` that rendering would not know."""
        for text in [*self.command, *self.env.values(), *self.path, *(f.path for f in self.files)] + [
            f.content for f in self.files
        ]:
            for match in string.Template.pattern.finditer(text):
                name = match.group("named") or match.group("braced")
                if match.group("invalid") is not None:
                    raise PresetError(f"preset {self.name}: invalid '$' in {text[:60]!r} (use $$ for a literal $)")
                if name is not None and name not in TEMPLATE_VARS:
                    raise PresetError(f"preset {self.name}: unknown template variable ${{{name}}}")


@dataclass(frozen=True)
class RenderedHarness:
    """A preset with every variable filled in: what the sandbox launches."""

    argv: list[str]
    env: dict[str, str]
    files: dict[str, tuple[str, int]]  # sandbox path -> (content, mode)
    path_prepend: list[str]


def load_preset(presets_dir: Path, name: str) -> Preset:
    """Read ``<presets_dir>/<name>.toml``. Raises ``PresetError`` with a reason fit for a FAILED session."""
    if not name or not all(c.isalnum() or c in "-_" for c in name):
        raise PresetError(f"invalid preset name {name!r}")
    file = presets_dir / f"{name}.toml"
    if not file.is_file():
        known = sorted(p.stem for p in presets_dir.glob("*.toml")) if presets_dir.is_dir() else []
        raise PresetError(f"unknown harness preset {name!r} (known: {', '.join(known) or 'none'})")
    try:
        data = tomllib.loads(file.read_text())
        preset = Preset.model_validate(data)
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise PresetError(f"preset {name}: not valid TOML: {exc}") from exc
    except ValidationError as exc:
        raise PresetError(f"preset {name}: {exc.error_count()} invalid field(s): {_short(exc)}") from exc
    if preset.name != name:
        raise PresetError(f"preset file {file.name} declares name {preset.name!r}")
    preset.check_templates()
    return preset


def render(preset: Preset, variables: Mapping[str, str], metadata: Mapping[str, str] | None = None) -> RenderedHarness:
    """Fill in a preset. For a ``command_from_metadata`` preset, ``metadata['command']`` is the shell line (run
    with ``/bin/sh -c``, after the preset's own argv prefix); it is not templated, the environment carries the
    same values (``FLOE_*`` variables set by the preset)."""
    missing = TEMPLATE_VARS - set(variables)
    if missing:
        raise PresetError(f"render needs variables {sorted(missing)}")

    def sub(text: str) -> str:
        try:
            return string.Template(text).substitute(variables)
        except (KeyError, ValueError) as exc:
            raise PresetError(f"preset {preset.name}: cannot render {text[:60]!r}: {exc}") from exc

    argv = [sub(part) for part in preset.command]
    if preset.command_from_metadata:
        line = (metadata or {}).get("command", "")
        if not line.strip():
            raise PresetError(f"preset {preset.name} needs the request's metadata['command']")
        argv = [*argv, line]
    return RenderedHarness(
        argv=argv,
        env={key: sub(value) for key, value in preset.env.items()},
        files={sub(f.path): (sub(f.content), f.mode) for f in preset.files},
        path_prepend=[sub(p) for p in preset.path],
    )


def _short(exc: ValidationError) -> str:
    return "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()[:3])
