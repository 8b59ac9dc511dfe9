"""magika: Google's file-type classifier (one ONNX model shipped in the wheel)."""
import io
import zipfile
from pathlib import Path

CATEGORY = "bytes/text classification"
PACKAGE = "magika"

SAMPLES = {
    "python": b"import os\nimport sys\n\n\ndef main(argv):\n    for name in sorted(os.listdir(argv[1])):\n        print(name, os.path.getsize(name))\n    return 0\n\n\nif __name__ == '__main__':\n    sys.exit(main(sys.argv))\n" * 3,
    "json": b'{"name": "example", "version": "1.2.3", "dependencies": {"left-pad": "^1.3.0", "lodash": "4.17.21"}, "scripts": {"test": "jest", "build": "tsc -p ."}, "private": true, "files": ["dist", "README.md"]}\n' * 3,
    "html": b"<!DOCTYPE html>\n<html lang=\"en\">\n<head><meta charset=\"utf-8\"><title>Example page</title>\n<link rel=\"stylesheet\" href=\"style.css\"></head>\n<body><h1>Hello</h1><p>This is a <a href=\"/about\">paragraph</a> of text.</p>\n<ul><li>one</li><li>two</li></ul></body></html>\n" * 2,
    "c": b"#include <stdio.h>\n#include <stdlib.h>\n\nstatic int add(int a, int b) { return a + b; }\n\nint main(int argc, char **argv) {\n    int total = 0;\n    for (int i = 1; i < argc; i++) total = add(total, atoi(argv[i]));\n    printf(\"%d\\n\", total);\n    return 0;\n}\n" * 2,
    "shell": b"#!/bin/bash\nset -euo pipefail\nfor f in \"$@\"; do\n  if [ -f \"$f\" ]; then\n    echo \"processing $f\"\n    wc -l \"$f\" | awk '{print $1}'\n  fi\ndone\nexit 0\n" * 3,
    "csv": b"id,name,price,quantity,date\n" + b"".join(b"%d,item%d,%d.%02d,%d,2024-01-%02d\n" % (i, i, i * 3, i % 100, i % 7, 1 + i % 28) for i in range(60)),
    "markdown": b"# Title\n\nSome **bold** text and a [link](https://example.com).\n\n## Section\n\n- item one\n- item two\n\n```python\nprint('hi')\n```\n\n> a quote\n" * 3,
    "xml": b"<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<catalog>\n" + b"".join(b"  <book id=\"bk%d\"><author>Author %d</author><title>Title %d</title><price>%d.95</price></book>\n" % (i, i, i, i) for i in range(20)) + b"</catalog>\n",
    "javascript": b"'use strict';\nconst fs = require('fs');\nfunction readAll(dir) {\n  return fs.readdirSync(dir).map((name) => ({ name, size: fs.statSync(name).size }));\n}\nmodule.exports = { readAll };\nconsole.log(readAll(process.argv[2]));\n" * 3,
    "yaml": b"version: '3.8'\nservices:\n  web:\n    image: nginx:latest\n    ports:\n      - '80:80'\n    volumes:\n      - ./html:/usr/share/nginx/html\n  db:\n    image: postgres:16\n    environment:\n      POSTGRES_PASSWORD: example\n" * 2,
}


def _zip_bytes() -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for i in range(5):
            info = zipfile.ZipInfo(f"file{i}.txt", date_time=(2020, 1, 1, 0, 0, 0))
            z.writestr(info, ("line %d\n" % i) * 200)
    return buf.getvalue()


def _png_bytes() -> bytes:
    import synth
    return synth.png_bytes(synth.shapes_image((128, 96)))


def run() -> dict:
    from magika import Magika
    import magika as pkg
    m = Magika()
    samples = dict(SAMPLES)
    samples["zip"] = _zip_bytes()
    samples["png"] = _png_bytes()
    out = {}
    for name, data in samples.items():
        res = m.identify_bytes(data)
        out[name] = {"dl": str(res.prediction.dl.label), "output": str(res.output.label),
                     "score": round(float(res.score), 6)}
    # Files shipped inside the package itself.
    root = Path(pkg.__file__).parent
    files = sorted(p for p in root.rglob("*") if p.is_file() and p.suffix in {".py", ".json", ".typed"})[:8]
    for res, p in zip(m.identify_paths(files), files):
        out["pkg:" + p.relative_to(root).as_posix()] = {
            "dl": str(res.prediction.dl.label), "output": str(res.output.label),
            "score": round(float(res.score), 6)}
    return out


def summary(result: dict) -> str:
    return " ".join(f"{k}={v['output']}" for k, v in list(result.items())[:6]) + " ..."
