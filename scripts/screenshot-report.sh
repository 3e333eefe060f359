#!/usr/bin/env bash
# Screenshot an HTML report as a reader sees it, to check it by eye: headless Chromium at 1400 px wide,
# the whole page, the empty canvas below it trimmed away.
#
#   scripts/screenshot-report.sh runs/demo-quick/report.html            # → runs/demo-quick/report.png
#   scripts/screenshot-report.sh REPORT.html OUT.png 1000               # another width
#
# Needs Chromium (Debian: apt-get install chromium) and a Python with Pillow (installed with smallinit's
# matplotlib): $PYTHON, else the Python of the smallinit command on PATH, else python3.
set -euo pipefail

if [[ $# -lt 1 || $# -gt 3 || ! -f $1 ]]; then
    echo "usage: $0 REPORT.html [OUT.png] [WIDTH_PX]  (REPORT.html must exist)" >&2
    exit 2
fi
report=$(realpath "$1")
out=${2:-${report%.html}.png}
width=${3:-1400}
height=60000  # taller than any report; Chromium paints this much, the blank rest is trimmed below
browser=$(command -v chromium || command -v chromium-browser || command -v google-chrome || true)
if [[ -z $browser ]]; then
    echo "$0: no Chromium found; install it (Debian: apt-get install chromium)" >&2
    exit 2
fi

py=${PYTHON:-}
if [[ -z $py ]]; then
    for candidate in "$(dirname "$(command -v smallinit || echo .)")/python" python3; do
        if "$candidate" -c 'import PIL' 2>/dev/null; then py=$candidate; break; fi
    done
fi
if [[ -z $py ]] || ! "$py" -c 'import PIL' 2>/dev/null; then
    echo "$0: no Python with Pillow found; activate smallinit's environment or set PYTHON=/path/to/its/python" >&2
    exit 2
fi

"$browser" --headless --no-sandbox --disable-gpu --force-device-scale-factor=1 \
    --window-size="$width,$height" --screenshot="$out" "file://$report" 2>/dev/null
"$py" - "$out" <<'PY'
import sys

from PIL import Image, ImageChops

path = sys.argv[1]
page = Image.open(path).convert("RGB")
box = ImageChops.difference(page, Image.new("RGB", page.size, page.getpixel((page.width - 1, page.height - 1)))).getbbox()
bottom = min(page.height, (box[3] if box else page.height) + 24)
page.crop((0, 0, page.width, bottom)).save(path)
print(f"{path}: {page.width} x {bottom} px")
PY
