"""Render a report's HTML in headless Chromium and save a PNG screenshot (to look at it).

``python -m moe_fq_parity.reports.render parity-report/report.html [--out shot.png] [--width 1400] [--height 3000]``

Uses Debian's ``chromium`` (``apt-get install -y chromium``) with a fresh profile, no network
services, no sandbox (root in containers) and no GPU.  Exit status 0 when the screenshot was written.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Optional, Sequence

BROWSERS = ("chromium", "chromium-browser", "google-chrome")
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", "--no-first-run", "--hide-scrollbars")


def find_browser() -> Optional[str]:
    """Path of a Chromium-family browser, or ``None``."""
    return next((p for p in map(shutil.which, BROWSERS) if p), None)


def screenshot(html: Path, out: Path, *, width: int = 1400, height: int = 3000, timeout_s: float = 120.0) -> Path:
    """Screenshot ``html`` into ``out``; ``RuntimeError`` with the browser's output when it fails."""
    browser = find_browser()
    if browser is None:
        raise RuntimeError("no Chromium found: apt-get install -y chromium")
    out = out.resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="render-profile-") as profile:
        cmd = [browser, *FLAGS, f"--user-data-dir={profile}", f"--window-size={width},{height}", f"--screenshot={out}",
               html.resolve().as_uri()]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    if proc.returncode != 0 or not out.exists() or out.stat().st_size == 0:
        raise RuntimeError(f"chromium failed (exit {proc.returncode}): {proc.stderr[-2000:]}")
    return out


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m moe_fq_parity.reports.render", description=__doc__.splitlines()[0])
    p.add_argument("html", type=Path)
    p.add_argument("--out", type=Path, default=None, help="PNG path (default: next to the HTML, .png)")
    p.add_argument("--width", type=int, default=1400)
    p.add_argument("--height", type=int, default=3000)
    args = p.parse_args(argv)
    try:
        out = screenshot(args.html, args.out or args.html.with_suffix(".png"), width=args.width, height=args.height)
    except (RuntimeError, subprocess.TimeoutExpired) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
