#!/bin/sh
# Install the kvcache systemd units: sudo contrib/systemd/install.sh [--cortex PATH] [--root DIR]
#   --cortex PATH  the cortex command the units run (default: the one on PATH)
#   --root DIR     install under DIR instead of / (packaging, tests); no systemctl call then
# Then, per pool:  cp /etc/kvcache/example.conf /etc/kvcache/llama.conf  (edit it)
#                  systemctl enable --now kvcache@llama.service
set -eu
here=$(cd "$(dirname "$0")" && pwd)
cortex=$(command -v cortex || true)
root=
while [ $# -gt 0 ]; do
    case $1 in
        --cortex) cortex=$2; shift 2 ;;
        --root) root=$2; shift 2 ;;
        *) echo "install.sh: error: unknown option $1 (see the comment at the top)" >&2; exit 1 ;;
    esac
done
case $cortex in
    /*) ;;
    *) echo "install.sh: error: no cortex command found: pass --cortex /path/to/cortex" >&2; exit 1 ;;
esac
if [ ! -x "$cortex" ]; then
    echo "install.sh: error: $cortex is not an executable: pass --cortex /path/to/cortex" >&2
    exit 1
fi
units=$root/etc/systemd/system
mkdir -p "$units" "$root/etc/kvcache"
for unit in kvcache@.service kvcache-persist@.service kvcache-persist@.timer \
        kvcache-llama-server@.service; do
    sed "s|@CORTEX@|$cortex|g" "$here/$unit" > "$units/$unit.tmp"
    chmod 644 "$units/$unit.tmp"
    mv "$units/$unit.tmp" "$units/$unit"
done
cp "$here/example.conf" "$root/etc/kvcache/example.conf"
cp "$here/llama-server-example.conf" "$root/etc/kvcache/llama-server-example.conf"
echo "installed kvcache@.service, kvcache-persist@.service and .timer, kvcache-llama-server@.service in $units (running $cortex)"
if [ -z "$root" ] && command -v systemctl >/dev/null 2>&1; then
    systemctl daemon-reload || true
fi
