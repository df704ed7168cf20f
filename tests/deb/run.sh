#!/bin/bash
# tests/deb/run.sh SOURCE_ROOT - the `deb` meson suite (TAP): moonlet's Debian
# packages as an operator gets them.
#  1. dpkg-buildpackage -us -uc -b on a copy of the tree (its files git
#     knows, in a temporary directory: the source tree gets no build output);
#  2. lintian on the .changes: no error (E:) tags;
#  3. the four packages unpacked (dpkg -x) into a fresh root: the daemons,
#     systemd units, /etc/moonlet, the library and the Python package there;
#  4. a master and a store node started from the unpacked units' ExecStart
#     lines with the unpacked /etc/moonlet/*.conf arguments (ports made
#     ephemeral, the store's segment small), then a put and a get through the
#     unpacked Python package (moonlet and mooncake.store).
# Unpacked, not installed: the machine's /usr stays as it is (and the
# packages' maintainer scripts do not run; the postinst is checked by lintian
# only).  Reports "1..0 # SKIP <reason>" without debhelper, dh-python or
# lintian (scripts/setup.sh installs them).  About 2-3 minutes.
set -u
S=$(readlink -f "$1")
skip() { echo "1..0 # SKIP $*"; exit 0; }
for t in dpkg-buildpackage dh lintian dh_python3; do
    command -v $t >/dev/null || skip "$t missing (run scripts/setup.sh)"
done
T=$(mktemp -d "${TMPDIR:-/tmp}/moonlet-deb.XXXXXX")
pids=()
cleanup() {
    local p
    for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
    rm -rf "$T"
}
trap cleanup EXIT
echo "1..4"
log() { sed 's/^/# /' "$1" | tail -${2:-60}; }

mkdir -p "$T/src/moonlet"
(cd "$S" && git ls-files -z --cached --others --exclude-standard | tar --null -T - -cf -) |
    tar -xf - -C "$T/src/moonlet"
if (cd "$T/src/moonlet" && timeout 1800 dpkg-buildpackage -us -uc -b) > "$T/build.log" 2>&1; then
    echo "ok 1 - dpkg-buildpackage -us -uc -b: $(cd "$T/src" && echo *.deb)"
else
    log "$T/build.log"; echo "not ok 1 - dpkg-buildpackage"; exit 1
fi

timeout 600 lintian --no-tag-display-limit "$T"/src/*.changes > "$T/lintian.log" 2>&1
if ! grep -q '^E:' "$T/lintian.log"; then
    echo "ok 2 - lintian: no errors ($(grep -c '^W:' "$T/lintian.log") warnings)"
    grep '^W:' "$T/lintian.log" | sed 's/^/# /'
else
    log "$T/lintian.log"; echo "not ok 2 - lintian errors"; exit 1
fi

R=$T/root
for d in "$T"/src/*.deb; do dpkg -x "$d" "$R"; done
want="usr/bin/moonlet-master usr/bin/moonlet-store usr/bin/moonlet-inspect usr/bin/moonlet-bench
      etc/moonlet/moonlet-master.conf etc/moonlet/moonlet-store.conf
      lib/systemd/system/moonlet-master.service lib/systemd/system/moonlet-store.service
      usr/include/moonlet/client.h usr/lib/python3/dist-packages/moonlet/__init__.py
      usr/lib/python3/dist-packages/mooncake/store.py"
missing=""
for f in $want; do [ -e "$R/$f" ] || missing="$missing $f"; done
ls "$R"/usr/lib/*/libmoonlet.so.0 >/dev/null 2>&1 || missing="$missing libmoonlet.so.0"
ls "$R"/usr/lib/python3/dist-packages/moonlet/_moonlet*.so >/dev/null 2>&1 || missing="$missing _moonlet.so"
if [ -z "$missing" ]; then
    echo "ok 3 - the packages hold the daemons, units, /etc/moonlet, the library and the Python package"
else
    (cd "$R" && find . -type f) | sed 's/^/# /'; echo "not ok 3 - missing:$missing"; exit 1
fi

# ExecStart of an unpacked unit, its $VAR replaced by the unpacked conf's
# value, the binary under $R; extra flags after (a later flag wins).
cmdline() { # unit conf var extra...
    local unit=$1 conf=$2 var=$3; shift 3
    local exec args
    exec=$(sed -n 's/^ExecStart=\([^ ]*\).*/\1/p' "$R/lib/systemd/system/$unit")
    grep -q "^EnvironmentFile=-/etc/moonlet/$conf\$" "$R/lib/systemd/system/$unit" || return 1
    args=$(. "$R/etc/moonlet/$conf" && eval echo "\$$var")
    echo "$R$exec $args $*"
}
wait_line() { # file regex pid -> the first group of the first matching line
    local i m
    for i in $(seq 1 200); do
        m=$(sed -n "s/$2/\\1/p" "$1" | head -1)
        [ -n "$m" ] && { echo "$m"; return 0; }
        kill -0 "$3" 2>/dev/null || return 1
        sleep 0.05
    done
    return 1
}
{
    m=$(cmdline moonlet-master.service moonlet-master.conf MOONLET_MASTER_ARGS --rpc-port 0) &&
    echo "master: $m" && { $m > "$T/master.out" 2> "$T/master.err" & pids+=($!); } &&
    maddr=$(wait_line "$T/master.out" '^listening on \(.*\)$' "${pids[0]}") &&
    s=$(cmdline moonlet-store.service moonlet-store.conf MOONLET_STORE_ARGS \
        --master "$maddr" --protocol tcp --listen 127.0.0.1:0 --segment-size 64MiB) &&
    echo "store: $s" && { $s > "$T/store.out" 2> "$T/store.err" & pids+=($!); } &&
    wait_line "$T/store.out" '^listening on \(.*\)$' "${pids[1]}" &&
    (cd "$T" && PYTHONPATH="$R/usr/lib/python3/dist-packages" PYTHONDONTWRITEBYTECODE=1 \
        timeout 120 /usr/bin/python3 - "$maddr" "$R" <<'PYEOF'
import sys
import moonlet
from mooncake.store import MooncakeDistributedStore
root = sys.argv[2]
assert moonlet.__file__.startswith(root), moonlet.__file__
s = moonlet.Store.connect(sys.argv[1], protocol="tcp")
s.put("deb/k", b"from the .deb")
assert s.get("deb/k") == b"from the .deb"
s.close()
m = MooncakeDistributedStore()
assert m.setup("127.0.0.1", "", 0, 16 << 20, "tcp", "", sys.argv[1]) == 0
assert m.put("deb/m", b"mooncake.store") == 0 and m.get("deb/m") == b"mooncake.store"
m.close()
print("put and get through", moonlet.__file__)
PYEOF
    )
} > "$T/run.log" 2>&1
if [ $? -eq 0 ]; then
    sed 's/^/# /' "$T/run.log"
    echo "ok 4 - master and store from the units' command lines; put and get through python3-moonlet"
else
    log "$T/run.log"; log "$T/master.err" 20; log "$T/store.err" 20
    echo "not ok 4 - the unpacked packages at work"; exit 1
fi
