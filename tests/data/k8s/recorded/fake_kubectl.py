#!/usr/bin/env python3
"""A stand-in for ``kubectl`` in tests: records every call, answers from files.

State lives in ``$FAKE_KUBECTL_DIR``: each call appends ``{"argv", "stdin"}`` to
``calls.jsonl``. ``config current-context`` prints ``context.txt`` (exit 1 when absent);
``api-resources`` prints ``api-resources.txt``; ``apply`` prints one ``kind/name`` per
object it was given; ``get`` prints the next ``get-N.json`` (the last one repeats);
``delete`` prints ``delete.txt`` (or each ``kind/name`` target it was given).
"""

import json
import os
import sys
from pathlib import Path

state = Path(os.environ["FAKE_KUBECTL_DIR"])
argv = sys.argv[1:]
stdin = "" if sys.stdin.isatty() else sys.stdin.read()
with (state / "calls.jsonl").open("a") as f:
    f.write(json.dumps({"argv": argv, "stdin": stdin}) + "\n")
if argv[:1] == ["--context"]:
    argv = argv[2:]


def text(name: str) -> str:
    path = state / name
    return path.read_text() if path.exists() else ""


verb = argv[0] if argv else ""
if verb == "config":
    ctx = text("context.txt")
    if not ctx:
        print("error: current-context is not set", file=sys.stderr)
        sys.exit(1)
    print(ctx.strip())
elif verb == "api-resources":
    sys.stdout.write(text("api-resources.txt"))
elif verb == "apply":
    for item in json.loads(stdin)["items"]:
        print(f"{item['kind'].lower()}/{item['metadata']['name']}")
elif verb == "get":
    n = int(text("get-count.txt") or 0)
    pages = sorted(state.glob("get-*.json"), key=lambda p: int(p.stem.split("-")[1]))
    (state / "get-count.txt").write_text(str(n + 1))
    sys.stdout.write(pages[min(n, len(pages) - 1)].read_text() if pages else '{"items": []}')
elif verb == "delete":
    out = text("delete.txt")
    targets = [] if "-l" in argv else [a for a in argv[1:] if "/" in a and a[0] != "-"]
    sys.stdout.write(out or "".join(t + "\n" for t in targets))
else:
    print(f"fake kubectl: unknown command {argv}", file=sys.stderr)
    sys.exit(2)
