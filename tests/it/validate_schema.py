"""Validates JSON bodies against schemas of an OpenAPI 3.1 document.

Reads one JSON object on standard input:
    {"document": <the OpenAPI document>,
     "instances": [{"schema": "TaskView", "instance": <a body>}, ...]}
and checks each instance against `#/components/schemas/<schema>` with a JSON
Schema 2020-12 validator (OpenAPI 3.1's dialect), which enforces `oneOf`
strictly: a value matching two branches is invalid, as a strict generated
client would find. Prints every error and exits 1 when there is one.
"""

import json
import sys

from jsonschema import Draft202012Validator


def main() -> int:
    given = json.load(sys.stdin)
    document = given["document"]
    errors = []
    for item in given["instances"]:
        name = item["schema"]
        # The whole document is the root, so that its $refs resolve.
        schema = dict(document, **{"$ref": f"#/components/schemas/{name}"})
        validator = Draft202012Validator(schema)
        for error in validator.iter_errors(item["instance"]):
            path = "/".join(str(p) for p in error.absolute_path)
            errors.append(f"{name} at /{path}: {error.message}")
    for error in errors:
        print(error)
    print(f"{len(given['instances'])} bodies checked, {len(errors)} errors")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
