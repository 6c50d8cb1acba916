#!/usr/bin/env bash
# Screenshot a postmortem report.html in headless Chromium, offline, to check that the
# self-contained page renders (plots embedded, no network). Not a CI test: CI may lack
# chromium. Install it with `apt-get install -y chromium` (Debian).
#
#   scripts/screenshot.sh [REPORT_HTML] [OUT_PNG]
#
# Defaults: reports/20251009-091500/report.html -> reports/20251009-091500/screenshot.png
set -euo pipefail

cd "$(dirname "$0")/.."
html="${1:-reports/20251009-091500/report.html}"
out="${2:-${html%/*}/screenshot.png}"
browser="$(command -v chromium || command -v chromium-browser || command -v google-chrome || true)"
if [ -z "$browser" ]; then
    echo "screenshot.sh: no chromium found (apt-get install -y chromium)" >&2
    exit 2
fi
if [ ! -f "$html" ]; then
    echo "screenshot.sh: $html not found (run: postmortem fixtures/runs/20251009-091500 --output reports/)" >&2
    exit 2
fi
profile="$(mktemp -d)"
trap 'rm -rf "$profile"' EXIT
abs_html="$(cd "$(dirname "$html")" && pwd)/$(basename "$html")"
abs_out="$(cd "$(dirname "$out")" && pwd)/$(basename "$out")"
"$browser" --headless --no-sandbox --disable-gpu --disable-quic --no-first-run \
    --disable-background-networking --disable-component-update --disable-sync \
    --user-data-dir="$profile" --hide-scrollbars \
    --screenshot="$abs_out" --window-size=1280,2000 "file://$abs_html" >/dev/null 2>&1
test -s "$abs_out"
echo "$abs_out"
