"""The install lines of docs/getting-started.md, run as written in a checkout with pip's
``--dry-run`` added, each in its own copy of the project's files (pip's build writes into the
tree): each names an extra the project has and resolves, and the suite's venv (which ``make
setup`` installs with the union of them) already holds all each line brings but js-etl itself.
The page's venv line is the one ``make setup`` runs; ``make test`` is what CI runs, and ``make
demo`` runs ``js-etl demo``, which tests/tools/test_wheel.py runs from the wheel."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PAGE = (REPO / "docs" / "getting-started.md").read_text()


def install_lines() -> list[str]:
    block = re.search(r"## Install\n\n```bash\n(.*?)```", PAGE, re.DOTALL)
    assert block, "docs/getting-started.md has no Install block"
    return [line.split("#", 1)[0].strip() for line in block.group(1).splitlines()
            if line.startswith("pip install")]


def test_every_install_line_of_the_page_resolves_as_written(tmp_path):
    lines = install_lines()
    extras = set(tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
                 ["optional-dependencies"])
    named = {m for line in lines for m in re.findall(r"\.\[([a-z,]+)\]", line)}
    assert named and named <= extras, named - extras
    runs = []
    for i, line in enumerate(lines):
        words = shlex.split(line)
        assert words[:2] == ["pip", "install"], line
        checkout = tmp_path / str(i)
        shutil.copytree(REPO / "js_etl", checkout / "js_etl",
                        ignore=shutil.ignore_patterns("__pycache__"))
        for name in ("pyproject.toml", "README.md"):
            shutil.copy(REPO / name, checkout)
        report = tmp_path / f"{i}.json"
        runs.append((line, report, subprocess.Popen(
            [sys.executable, "-m", "pip", "install", "--dry-run", "--disable-pip-version-check",
             "--report", str(report), *words[2:]],
            cwd=checkout, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)))
    for line, report, run in runs:
        output, _ = run.communicate(timeout=300)
        assert run.returncode == 0, f"{line}\n{output[-3000:]}"
        assert "does not provide the extra" not in output, output
        installs = [item["metadata"]["name"] for item in json.loads(report.read_text())["install"]]
        assert installs == ["js-etl"], (line, installs)
