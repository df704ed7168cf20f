"""Runs every Python example of docs/python.md and compares its output.

Each ```python block runs in a fresh namespace, in page order, against the
session's cluster: the page's master address (127.0.0.1:50051) and RealClient
socket (/tmp/moonlet-real.sock) are replaced by the test cluster's.  When a
```text block follows (after an optional "prints" line), the block's standard
output must equal it.
"""
import contextlib
import io
import os
import re

import pytest

DOC = os.path.join(os.environ.get("MOONLET_SOURCE_ROOT", ""), "docs", "python.md")
FENCE = re.compile(r"```(\w*)\n(.*?)```", re.S)


def examples():
    with open(DOC) as f:
        text = f.read()
    blocks = [(m.group(1), m.group(2), m.start(), m.end()) for m in FENCE.finditer(text)]
    out = []
    for i, (lang, body, _, end) in enumerate(blocks):
        if lang != "python":
            continue
        expected = None
        if i + 1 < len(blocks) and blocks[i + 1][0] == "text":
            between = text[end:blocks[i + 1][2]].strip()
            if between in ("", "prints"):
                expected = blocks[i + 1][1]
        line = text.count("\n", 0, end) + 1
        out.append(pytest.param(body, expected, id=f"line{line}"))
    return out


EXAMPLES = examples()


def test_the_page_has_examples():
    assert len(EXAMPLES) >= 10


@pytest.mark.parametrize("code,expected", EXAMPLES)
def test_example(cluster, code, expected):
    sock = cluster.realclient()
    code = code.replace("127.0.0.1:50051", cluster.addr).replace("/tmp/moonlet-real.sock", sock)
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        exec(compile(code, DOC, "exec"), {"__name__": "__docs__"})
    if expected is not None:
        got = buf.getvalue().replace(cluster.addr, "127.0.0.1:50051")
        assert got == expected
