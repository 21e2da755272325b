"""Regenerate the documentation's pictures (``make docs-pictures``): docs/img/finding.png and html-report.png.

finding.png: ``gradguard run train.py`` (the README's quick start) on an 80-column pseudo-terminal, its colours
kept, exported by rich as SVG and rasterised by headless Chromium. html-report.png: ``gradguard run --html`` on
examples/integrations/html_report_demo.py, as Chromium draws it. Needs the `chromium` binary.
"""

from __future__ import annotations

import fcntl
import os
import pty
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import termios
from pathlib import Path

from PIL import Image, ImageChops

ROOT = Path(__file__).resolve().parents[2]
IMG = ROOT / "docs" / "img"


def quickstart_source() -> str:
    """The README's quick-start script (the python block after the ``<!-- quickstart -->`` marker)."""
    readme = (ROOT / "README.md").read_text()
    return re.search(r"<!-- quickstart -->\n```python\n(.*?)```", readme, re.S).group(1)


def _in_pty(argv: list[str], cwd: Path, columns: int) -> str:
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "NO_COLOR", "GRADGUARD_PROGRESS")}
    env.update(TERM="xterm-256color", PYTHONPATH=str(ROOT / "src"))
    process = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, cwd=cwd, env=env)
    os.close(slave)
    chunks = []
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(master)
    process.wait()
    return b"".join(chunks).decode().replace("\r\n", "\n")


def _chromium_png(url: str, png: Path, width: int, height: int, profile: Path) -> None:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--hide-scrollbars",
                    f"--user-data-dir={profile}", f"--screenshot={png}", f"--window-size={width},{height}", url],
                   capture_output=True, timeout=120, check=True)


def _crop(png: Path, margin: int = 12) -> None:
    """Cut the page's empty background around what was drawn."""
    image = Image.open(png).convert("RGB")
    background = Image.new("RGB", image.size, image.getpixel((image.width - 1, image.height - 1)))
    box = ImageChops.difference(image, background).getbbox()
    if box:
        left, top, right, bottom = box
        image.crop((max(left - margin, 0), max(top - margin, 0), min(right + margin, image.width),
                    min(bottom + margin, image.height))).save(png, optimize=True)


def finding_picture(tmp: Path) -> None:
    from rich.console import Console
    from rich.text import Text

    project = Path(tempfile.gettempdir()) / "quickstart"  # a stable path for the traceback line
    project.mkdir(exist_ok=True)
    try:
        (project / "train.py").write_text(quickstart_source())
        output = _in_pty([sys.executable, "-m", "gradguard", "run", "train.py"], project, columns=80)
    finally:
        shutil.rmtree(project, ignore_errors=True)
    console = Console(record=True, width=80, force_terminal=True, color_system="truecolor", file=open(os.devnull, "w"))
    console.print("$ gradguard run train.py")
    console.print(Text.from_ansi(output.rstrip("\n")))
    svg = tmp / "finding.svg"
    svg.write_text(console.export_svg(title="gradguard run train.py"))
    _chromium_png(svg.as_uri(), IMG / "finding.png", 1300, 1100, tmp / "profile-svg")
    _crop(IMG / "finding.png")


def html_picture(tmp: Path) -> None:
    html = tmp / "report.html"
    subprocess.run([sys.executable, "-m", "gradguard", "run", "--html", str(html),
                    "examples/integrations/html_report_demo.py"], cwd=ROOT, capture_output=True,
                   env={**os.environ, "PYTHONPATH": str(ROOT / "src")}, timeout=300)
    _chromium_png(html.as_uri(), IMG / "html-report.png", 1100, 1150, tmp / "profile-html")
    _crop(IMG / "html-report.png")


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        finding_picture(Path(tmp))
        html_picture(Path(tmp))
    for name in ("finding.png", "html-report.png"):
        print(IMG / name, Image.open(IMG / name).size, (IMG / name).stat().st_size, "bytes")
