"""Screenshot of the dashboard for the README: a 2-node cluster on 127.0.0.1 (``alpha``,
``beta``), the embedded SmolLM2-135M placed across both (pipeline, 2 ranks), and one chat
answer, taken in headless chromium (Debian's package, via Playwright).

    .venv/bin/python scripts/dashboard_screenshot.py [--out docs/dashboard.png]

Every process it starts is stopped at the end (nodes in temporary data dirs, own ports).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from playwright.sync_api import sync_playwright  # noqa: E402

from tests.support.cluster import NodeProcess, converged, nodes_cleanup, wait_until  # noqa: E402
from tests.dashboard.conftest import CHROMIUM, CHROMIUM_ARGS  # noqa: E402

MODEL = "smollm2-135m-instruct"
PROMPT = "What is the capital of France? Answer in one sentence."


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="docs/dashboard.png")
    parser.add_argument("--max-tokens", type=int, default=24)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="exo-dash-") as tmp, nodes_cleanup([]) as nodes:
        name = f"shot-{time.monotonic_ns():x}"
        alpha = NodeProcess(Path(tmp) / "alpha", cluster=name, extra_args=["--name", "alpha"]).start()
        nodes.append(alpha)
        boot = [x for a in alpha.addrs() for x in ("--bootstrap", a)]
        nodes.append(NodeProcess(Path(tmp) / "beta", cluster=name, extra_args=["--name", "beta", *boot]).start())
        wait_until(lambda: converged(nodes, 2), 40, what="2-node cluster")
        alpha.place_and_wait(MODEL, min_nodes=2)
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": 1360, "height": 960}, device_scale_factor=1)
            page.goto(alpha.url + "/")
            page.wait_for_function(f"document.querySelector('#chat-model').value === '{MODEL}'", timeout=10000)
            page.fill("#chat-max-tokens", str(args.max_tokens))
            page.fill("#chat-temperature", "0")
            page.fill("#chat-input", PROMPT)
            page.click("#chat-send")
            page.wait_for_function("!document.querySelector('#chat-log .msg.assistant.streaming')", timeout=180000)
            time.sleep(1.0)
            page.screenshot(path=args.out)
            browser.close()
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
