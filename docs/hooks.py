"""MkDocs hooks: the pages written from the code, so they cannot drift from it.

`<!-- generated: settings -->` in a page becomes the table of every RECEIVER_* variable
(receiver/settings.py and the commands' options, with docs/settings.yaml's words), and
`<!-- generated: openapi -->` the reference of GET /v1/openapi.json; the document itself is
served beside the pages as openapi.json. mkdocs.yml names this file under `hooks:`.

    python docs/hooks.py settings    # print a generated part, as the build inserts it
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Any

import click
import yaml

DOCS = Path(__file__).resolve().parent
NOTES = DOCS / "settings.yaml"
log = logging.getLogger("mkdocs.hooks.receiver")
_UNSET = getattr(click.core, "UNSET", None)  # click 8.3's "no default"; None before


# --- configuration: every RECEIVER_* variable ----------------------------------------------


def _variable(field: str) -> str:
    return f"RECEIVER_{field.upper()}"


def _flag(variable: str) -> str:
    return "--" + variable.removeprefix("RECEIVER_").lower().replace("_", "-")


def _default(value: Any, note: str | None) -> str:
    """A default as the table shows it: durations as 30s, 1h; unset values in italics."""
    from receiver.durations import format_duration

    if value is None or value == "" or value is _UNSET:
        return f"*(unset: {note})*" if note else "*(unset)*"
    if isinstance(value, bool):
        shown = "on" if value else "off"
    elif isinstance(value, float):
        shown = f"`{format_duration(value)}`"
    elif isinstance(value, Path):
        shown = f"`{value if value.is_absolute() else './' + str(value)}`"
    else:
        shown = f"`{value}`"
    return f"{shown} ({note})" if note else shown


def _commands_reading() -> dict[str, list[str]]:
    """Each RECEIVER_* a command's option reads (click's envvar), with the commands."""
    from receiver.cli import cli

    found: dict[str, list[str]] = {}

    def walk(command: click.Command, path: list[str]) -> None:
        for param in command.params:
            if isinstance(param.envvar, str) and param.envvar.startswith("RECEIVER_"):
                name = " ".join(path)
                if name not in found.setdefault(param.envvar, []):
                    found[param.envvar].append(name)
        for name, sub in _subcommands(command):
            walk(sub, [*path, name])

    walk(cli, ["receiver"])
    return found


def _subcommands(command: click.Command) -> list[tuple[str, click.Command]]:
    """A group's commands, each loaded (`receiver` imports a command's module when asked)."""
    if not isinstance(command, click.Group):
        return []
    ctx = click.Context(command)
    found = ((name, command.get_command(ctx, name)) for name in command.list_commands(ctx))
    return [(name, sub) for name, sub in found if sub is not None]


def _option_default(variable: str) -> Any:
    from receiver.cli import cli

    stack: list[click.Command] = [cli]
    while stack:
        command = stack.pop()
        for param in command.params:
            if param.envvar == variable and param.default not in (None, _UNSET):
                return param.default
        stack.extend(sub for _, sub in _subcommands(command))
    return None


def configuration_markdown() -> str:
    """Two tables: `receiver serve`'s settings (one per Settings field, in its order), then
    the variables only other commands read. Raises when docs/settings.yaml and the code
    disagree on which variables exist."""
    from receiver.cli.serve import serve
    from receiver.settings import Settings

    notes: dict[str, dict[str, str]] = yaml.safe_load(NOTES.read_text(encoding="utf-8"))
    fields = {_variable(name): info for name, info in Settings.model_fields.items()}
    others = {v: cmds for v, cmds in _commands_reading().items() if v not in fields}
    missing = sorted((fields.keys() | others.keys()) - notes.keys())
    stale = sorted(notes.keys() - fields.keys() - others.keys())
    if missing or stale:
        raise ValueError(
            f"docs/settings.yaml disagrees with the code: no entry for {missing or 'none'};"
            f" entries for variables the code does not have: {stale or 'none'}"
        )
    flags = {opt for param in serve.params for opt in param.opts}
    lines = [
        "| variable | flag | default | meaning |",
        "| --- | --- | --- | --- |",
    ]
    for variable, info in fields.items():
        note = notes[variable]
        flag = f"`{_flag(variable)}`" if _flag(variable) in flags else "*(environment only)*"
        default = _default(info.default, note.get("default_note"))
        lines.append(f"| `{variable}` | {flag} | {default} | {note['meaning']} |")
    lines += [
        "",
        "Read by other commands only, never by `receiver serve`:",
        "",
        "| variable | read by | default | meaning |",
        "| --- | --- | --- | --- |",
    ]
    for variable, commands in sorted(others.items()):
        note = notes[variable]
        read_by = ", ".join(f"`{c}`" for c in commands)
        default = _default(_option_default(variable), note.get("default_note"))
        lines.append(f"| `{variable}` | {read_by} | {default} | {note['meaning']} |")
    return "\n".join(lines) + "\n"


# --- the HTTP API: GET /v1/openapi.json ----------------------------------------------------


def openapi_document() -> dict[str, Any]:
    from receiver import __version__
    from receiver.api.openapi import document

    return document(__version__)


def _schema_type(schema: dict[str, Any]) -> str:
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[1]
        return f"[{name}](#{name.lower()})"
    for either in ("anyOf", "oneOf"):
        if either in schema:
            return " or ".join(_schema_type(s) for s in schema[either])
    kind = str(schema.get("type", "object"))
    if "format" in schema:
        kind += f" ({schema['format']})"
    if kind == "array":
        kind = f"array of {_schema_type(schema.get('items', {}))}"
    if "enum" in schema:
        kind += ": " + ", ".join(f"`{v}`" for v in schema["enum"])
    if schema.get("nullable"):
        kind += " or null"
    if "minimum" in schema or "maximum" in schema:
        kind += f", {schema.get('minimum', '')}..{schema.get('maximum', '')}"
    if "default" in schema:
        kind += f", default `{schema['default']}`"
    return kind


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def openapi_markdown() -> str:
    """The operations of the document (method, path, summary, parameters, answers), then
    its schemas, field by field."""
    doc = openapi_document()
    lines = [
        f"OpenAPI {doc['openapi']}, version {doc['info']['version']}: {doc['info']['description']}",
        "",
        "| method | path | what | parameters | answers |",
        "| --- | --- | --- | --- | --- |",
    ]
    for path, operations in doc["paths"].items():
        for method, op in operations.items():
            params = (
                ", ".join(f"`{p['name']}` ({p['in']})" for p in op.get("parameters", [])) or "-"
            )
            if "requestBody" in op:
                body = op["requestBody"]["content"]["application/json"]["schema"]
                params += f"; body: {_schema_type(body)}"
            answers = []
            for code, answer in op["responses"].items():
                schema = answer.get("content", {}).get("application/json", {}).get("schema")
                answers.append(f"`{code}` {_schema_type(schema)}" if schema else f"`{code}`")
            lines.append(
                f"| {method.upper()} | `{path}` | {_cell(op['summary'])} | {params} |"
                f" {', '.join(answers)} |"
            )
    lines += ["", "Query and path parameters:", "", "| path | parameter | in | type | meaning |"]
    lines.append("| --- | --- | --- | --- | --- |")
    for path, operations in doc["paths"].items():
        for method, op in operations.items():
            for p in op.get("parameters", []):
                lines.append(
                    f"| {method.upper()} `{path}` | `{p['name']}` | {p['in']} |"
                    f" {_cell(_schema_type(p.get('schema', {})))} |"
                    f" {_cell(p.get('description', ''))} |"
                )
    lines += ["", "## Schemas", ""]
    for name, schema in doc["components"]["schemas"].items():
        lines += [f"### {name}", ""]
        properties = schema.get("properties", {})
        if not properties:
            lines += [f"{_cell(_schema_type(schema))}", ""]
            continue
        required = set(schema.get("required", []))
        lines += ["| field | type | required |", "| --- | --- | --- |"]
        for field, sub in properties.items():
            needed = "yes" if field in required else "no"
            lines.append(f"| `{field}` | {_cell(_schema_type(sub))} | {needed} |")
        lines.append("")
    return "\n".join(lines) + "\n"


# --- the hooks -----------------------------------------------------------------------------

GENERATED = {
    "<!-- generated: settings -->": configuration_markdown,
    "<!-- generated: openapi -->": openapi_markdown,
}


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    for marker, make in GENERATED.items():
        if marker in markdown:
            try:
                markdown = markdown.replace(marker, make())
            except Exception as exc:  # the build names the page and the cause, then fails
                log.error("%s: %s failed: %s", page.file.src_uri, make.__name__, exc)
                raise
    return markdown


def on_files(files: Any, config: Any) -> Any:
    from mkdocs.structure.files import File

    text = json.dumps(openapi_document(), indent=2) + "\n"
    files.append(File.generated(config, "openapi.json", content=text))
    return files


if __name__ == "__main__":
    parts = {"settings": configuration_markdown, "openapi": openapi_markdown}
    sys.stdout.write(parts[sys.argv[1] if len(sys.argv) > 1 else "settings"]())
