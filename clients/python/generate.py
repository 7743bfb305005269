"""Writes src/settled/_schema.py from the repository's openapi.yaml.

The SDK's wire types (TypedDicts, Literal enums) and its table of operations
come from the OpenAPI document the server is built from, so a change of the
contract shows up here as a change of types. Run after the spec changes:

    python clients/python/generate.py            # rewrite the module
    python clients/python/generate.py --check    # exit 1 when it is out of date

Needs PyYAML (a development dependency, not one of the SDK's).
"""

from __future__ import annotations

import pathlib
import sys
from typing import Any

import yaml

HERE = pathlib.Path(__file__).resolve().parent
SPEC = HERE.parent.parent / "openapi.yaml"
TARGET = HERE / "src" / "settled" / "_schema.py"

SCALARS = {"integer": "int", "number": "float", "string": "str", "boolean": "bool"}


def type_of(schema: dict[str, Any]) -> str:
    if "$ref" in schema:
        return str(schema["$ref"]).rsplit("/", 1)[-1]
    for key in ("oneOf", "anyOf"):
        if key in schema:
            return " | ".join(dict.fromkeys(type_of(s) for s in schema[key]))
    if "allOf" in schema and len(schema["allOf"]) == 1:
        return type_of(schema["allOf"][0])
    if "const" in schema:
        return f"Literal[{schema['const']!r}]"
    kind = schema.get("type")
    if isinstance(kind, list):
        return " | ".join(type_of({**schema, "type": k}) for k in kind)
    if kind == "null":
        return "None"
    if kind == "array":
        return f"list[{type_of(schema.get('items', {}))}]"
    if kind == "string" and "enum" in schema:
        return "Literal[" + ", ".join(repr(v) for v in schema["enum"]) + "]"
    if kind == "object" or kind is None:
        return "dict[str, Any]"
    return SCALARS[kind]


def refs(schema: Any) -> set[str]:
    found: set[str] = set()
    if isinstance(schema, dict):
        for key, value in schema.items():
            if key == "$ref":
                found.add(str(value).rsplit("/", 1)[-1])
            else:
                found |= refs(value)
    elif isinstance(schema, list):
        for value in schema:
            found |= refs(value)
    return found


def definition(name: str, schema: dict[str, Any]) -> str:
    props = schema.get("properties")
    if schema.get("type") == "object" and props:
        required = set(schema.get("required", []))
        fields = []
        for field, sub in props.items():
            t = type_of(sub)
            fields.append(f"        {field!r}: {t if field in required else f'NotRequired[{t}]'},")
        return f"{name} = TypedDict(\n    {name!r},\n    {{\n" + "\n".join(fields) + "\n    },\n)"
    return f"{name}: TypeAlias = {type_of(schema)}"


def render(spec: dict[str, Any]) -> str:
    schemas: dict[str, Any] = spec["components"]["schemas"]
    done: list[str] = []
    seen: set[str] = set()

    def visit(name: str) -> None:
        if name in seen:
            return
        seen.add(name)
        for dep in sorted(refs(schemas[name])):
            if dep in schemas:
                visit(dep)
        done.append(name)

    for name in sorted(schemas):
        visit(name)
    out = [
        '"""The wire types of settled\'s HTTP API and its operations.',
        "",
        "Generated from openapi.yaml by clients/python/generate.py: do not edit.",
        '"""',
        "",
        "from typing import Any, Literal, TypedDict",
        "",
        "from typing_extensions import NotRequired, TypeAlias",
        "",
    ]
    for name in done:
        out += ["", definition(name, schemas[name])]
    out += ["", "", "# operation id -> (method, path template)", "OPERATIONS: dict[str, tuple[str, str]] = {"]
    for path, item in spec["paths"].items():
        for method, op in item.items():
            out.append(f"    {op['operationId']!r}: ({method.upper()!r}, {path!r}),")
    out += ["}", ""]
    return "\n".join(out)


def main() -> int:
    text = render(yaml.safe_load(SPEC.read_text()))
    if sys.argv[1:] == ["--check"]:
        if TARGET.read_text() != text:
            print(
                f"{TARGET} is out of date with {SPEC}: run python clients/python/generate.py",
                file=sys.stderr,
            )
            return 1
        return 0
    TARGET.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
