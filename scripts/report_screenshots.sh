#!/usr/bin/env bash
# Screenshots of the report for docs/monitoring.md, taken with headless Chromium
# (Debian: apt-get install -y chromium; pip playwright cannot fetch browsers offline).
#
#   scripts/report_screenshots.sh RUN_A RUN_B [OUT_DIR]
#
# writes OUT_DIR (default docs/) report-curves.png (RUN_A's training dynamics),
# report-samples.png (RUN_A's sample completions) and report-overlay.png (RUN_A and
# RUN_B overlaid). The pages are written to a temporary folder, not into the runs.
# docs/monitoring.md says which runs the committed screenshots show.
set -euo pipefail
if [ $# -lt 2 ]; then
  echo "usage: $0 RUN_A RUN_B [OUT_DIR]" >&2
  exit 2
fi
run_a=$1 run_b=$2 out=${3:-docs}
root=$(cd "$(dirname "$0")/.." && pwd)
python=${PYTHON:-$root/.venv/bin/python}
chromium=$(command -v chromium || command -v chromium-browser || true)
if [ -z "$chromium" ]; then
  echo "$0: no chromium on PATH (apt-get install -y chromium)" >&2
  exit 1
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
report() { PYTHONPATH="$root/src${PYTHONPATH:+:$PYTHONPATH}" "$python" -c \
  "import sys; from posttrain.cli import main; sys.exit(main())" report "$@"; }
report "$run_a" --out "$tmp/one.html"
report "$run_a" "$run_b" --out "$tmp/overlay.html"
shot() {  # PAGE OUT.png HEIGHT: the top of the page, 1280 px wide
  # --virtual-time-budget lets the page's images decode before the capture
  "$chromium" --headless --no-sandbox --disable-gpu --hide-scrollbars --virtual-time-budget=5000 \
    --window-size=1280,"$3" --screenshot="$2" "file://$1" 2>/dev/null
  echo "wrote $2"
}
mkdir -p "$out"
# the samples section alone (title, then that section): Chromium scrolls to an #anchor
# before the plots above it are laid out, so an anchored capture comes out blank
"$python" - "$tmp/one.html" "$tmp/samples.html" <<'PY'
import sys
page = open(sys.argv[1]).read()
head, body = page.split("<body>", 1)
title = body[: body.index("</p>") + 4]
start = body.index('<h2 id="samples">')
end = body.index("<h2", start + 1)
open(sys.argv[2], "w").write(f"{head}<body>{title}{body[start:end]}</body></html>\n")
PY
shot "$tmp/one.html" "$out/report-curves.png" 1080
shot "$tmp/samples.html" "$out/report-samples.png" 640
shot "$tmp/overlay.html" "$out/report-overlay.png" 1180
