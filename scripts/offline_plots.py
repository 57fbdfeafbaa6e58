"""Build the page `dvc plots show` fills, with vega, vega-lite and vega-embed inside it: the plots
then render with no network (DVC's own page loads them from a CDN and stays blank offline).

    .venv/bin/python scripts/offline_plots.py OUT.html     # `make plots` runs it once

Fetches the three packages' tarballs from the npm registry (pinned versions, checked against the
registry's sha512 integrity) and writes OUT.html: DVC's page layout with the scripts inlined and
no `{scripts}` placeholder, so DVC adds no CDN tags. `make plots` then points DVC at it
(`plots.html_template` in .dvc/config.local of the study, demo/ and tutorial/). Standard library
only. The page is ~0.8 MB of minified JavaScript: built, not committed.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import io
import sys
import tarfile
import urllib.request
from pathlib import Path

REGISTRY = "https://registry.npmjs.org"
# name -> (version, the registry's dist.integrity); dvc-render 1.0 expects vega 5, vega-lite 5
# and vega-embed 6 (the CDN tags it writes).
PACKAGES = {
    "vega": (
        "5.33.1",
        "sha512-1fArfVDUqVbb5z8n+/nVQb+VNBzx8svY6CrsyTK4Ujm4yrd9I1auoKxBAPXLCavY1LcrbHUskQbGUP8gXOzyQw==",
    ),
    "vega-lite": (
        "5.23.0",
        "sha512-l4J6+AWE3DIjvovEoHl2LdtCUkfm4zs8Xxx7INwZEAv+XVb6kR6vIN1gt3t2gN2gs/y4DYTs/RPoTeYAuEg6mA==",
    ),
    "vega-embed": (
        "6.29.0",
        "sha512-PmlshTLtLFLgWtF/b23T1OwX53AugJ9RZ3qPE2c01VFAbgt3/GSNI/etzA/GzdrkceXFma+FDHNXUppKuM0U6Q==",
    ),
}
PLACEHOLDERS = ("{plot_divs}", "{scripts}", "{refresh_tag}")
PAGE = """<!DOCTYPE html>
<html>
<head>
    {refresh_tag}
    <meta charset="utf-8">
    <title>DVC plots</title>
SCRIPTS
    <style>
        table {
            border-spacing: 15px;
        }
    </style>
</head>
<body>
    {plot_divs}
</body>
</html>
"""


def integrity_of(data: bytes) -> str:
    """npm's integrity string (sha512, base64) of a tarball."""
    return "sha512-" + base64.b64encode(hashlib.sha512(data).digest()).decode()


def fetch(url: str, integrity: str, timeout: float = 60) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        data = response.read()
    if integrity and integrity_of(data) != integrity:
        raise RuntimeError(f"{url}: integrity mismatch (expected {integrity}, got {integrity_of(data)})")
    return data


def minified(tarball: bytes, name: str) -> str:
    """package/build/<name>.min.js from an npm tarball."""
    with tarfile.open(fileobj=io.BytesIO(tarball), mode="r:gz") as tar:
        member = tar.extractfile(f"package/build/{name}.min.js")
        if member is None:
            raise RuntimeError(f"{name}: no build/{name}.min.js in the package")
        return member.read().decode("utf-8")


def page(scripts: dict[str, str]) -> str:
    """DVC's page with each script inline; refuses a script that would break the page."""
    tags = []
    for name, code in scripts.items():
        bad = [p for p in (*PLACEHOLDERS, "</script") if p in code]
        if bad:  # DVC replaces the placeholders anywhere in the page; </script ends the tag
            raise RuntimeError(f"{name}: contains {', '.join(bad)}; cannot inline it")
        tags.append(f"    <script>/* {name} */\n{code}\n    </script>")
    return PAGE.replace("SCRIPTS", "\n".join(tags))


def build(out: Path, registry: str = REGISTRY, packages: dict | None = None) -> Path:
    scripts = {}
    for name, (version, integrity) in (packages or PACKAGES).items():
        url = f"{registry.rstrip('/')}/{name}/-/{name}-{version}.tgz"
        scripts[f"{name} {version}"] = minified(fetch(url, integrity), name)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    tmp.write_text(page(scripts), encoding="utf-8")
    tmp.replace(out)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="where to write the page")
    parser.add_argument("--registry", default=REGISTRY, help="npm registry (a mirror)")
    args = parser.parse_args(argv)
    try:
        build(args.out, args.registry)
    except (OSError, RuntimeError) as err:
        print(f"offline plots page not built: {err}", file=sys.stderr)
        return 1
    print(f"{args.out}: vega, vega-lite and vega-embed inline ({args.out.stat().st_size // 1024} KiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
